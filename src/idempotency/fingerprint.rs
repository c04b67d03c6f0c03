//! What makes two requests "the same request": method, path and body.

use sha2::{Digest, Sha256};

/// SHA-256 over the method, the path and the body's canonical form, as
/// lowercase hex. A JSON body is canonicalised per RFC 8785 (member order,
/// insignificant whitespace and number spelling such as `9.990` do not
/// matter); any other body is hashed as raw bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    pub fn of(method: &str, path: &str, body: &[u8], json: Option<&serde_json::Value>) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(method.as_bytes());
        hasher.update([0]);
        hasher.update(path.as_bytes());
        hasher.update([0]);
        match json.map(serde_json_canonicalizer::to_vec) {
            Some(Ok(canonical)) => {
                hasher.update(b"json:");
                hasher.update(&canonical);
            }
            // Not JSON, or JSON the canonicaliser cannot express (a number
            // beyond f64): the exact bytes are the only honest identity.
            _ => {
                hasher.update(b"raw:");
                hasher.update(body);
            }
        }
        Self(hex::encode(hasher.finalize()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_fp(method: &str, path: &str, body: &str) -> Fingerprint {
        let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        Fingerprint::of(method, path, body.as_bytes(), Some(&value))
    }

    #[test]
    fn member_order_and_whitespace_do_not_change_the_fingerprint() {
        let a = json_fp(
            "POST",
            "/v1/orders",
            r#"{"item":"W","quantity":2,"price":9.99}"#,
        );
        let b = json_fp(
            "POST",
            "/v1/orders",
            "{ \"price\": 9.990,\n \"quantity\": 2, \"item\": \"W\" }",
        );
        assert_eq!(a, b);
    }

    #[test]
    fn a_changed_value_method_or_path_changes_the_fingerprint() {
        let base = json_fp("POST", "/v1/orders", r#"{"quantity":2}"#);
        assert_ne!(base, json_fp("POST", "/v1/orders", r#"{"quantity":99}"#));
        assert_ne!(base, json_fp("PATCH", "/v1/orders", r#"{"quantity":2}"#));
        assert_ne!(base, json_fp("POST", "/v1/orders/x", r#"{"quantity":2}"#));
    }

    #[test]
    fn a_non_json_body_is_hashed_as_raw_bytes() {
        let a = Fingerprint::of("POST", "/p", b"a=1&b=2", None);
        let b = Fingerprint::of("POST", "/p", b"b=2&a=1", None);
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 64);
    }

    #[test]
    fn the_canonical_form_follows_rfc_8785() {
        // RFC 8785 §3.2.3 sorts members by UTF-16 code units and writes numbers as ES6 does.
        let value: serde_json::Value =
            serde_json::from_str(r#"{"\u20ac":1,"\r":2,"1":3,"b":1.50,"a":1e2}"#)
                .unwrap_or_default();
        let canonical = serde_json_canonicalizer::to_string(&value).unwrap_or_default();
        assert_eq!(canonical, "{\"\\r\":2,\"1\":3,\"a\":100,\"b\":1.5,\"€\":1}");
    }
}
