//! What makes two requests "the same request": method, path and body.

use serde_json::Value;
use sha2::{Digest, Sha256};

use json_number::{Exponent, Scientific};

/// SHA-256 over the method, the path and the body's canonical form, as
/// lowercase hex. A JSON body is canonicalised (`canonical_json`): member
/// order, insignificant whitespace and number spelling such as `9.990` do
/// not matter, and any changed value does; any other body is hashed as raw
/// bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// The fingerprint of a request: its method, its path, and its body —
    /// `json` when the body parsed as JSON (hashed in its canonical form),
    /// else the raw bytes.
    pub fn of(method: &str, path: &str, body: &[u8], json: Option<&Value>) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(method.as_bytes());
        hasher.update([0]);
        hasher.update(path.as_bytes());
        hasher.update([0]);
        match json {
            Some(value) => {
                hasher.update(b"json:");
                hasher.update(canonical_json(value));
            }
            None => {
                hasher.update(b"raw:");
                hasher.update(body);
            }
        }
        Self(hex::encode(hasher.finalize()))
    }

    /// The fingerprint as 64 lowercase hex digits, as the ledger stores it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// RFC 8785 (JCS) with exact numbers. Members are sorted by UTF-16 code
/// units and strings escaped as JCS does. A number is written as JCS writes
/// it (the shortest text of the nearest `f64`) when that text denotes
/// exactly the literal's value, which keeps every such document's form
/// byte-identical to `serde_json_canonicalizer`'s; any other number (beyond
/// `f64`'s range or precision, where JCS would merge distinct values or
/// fail) is written as its exact significant digits and power of ten,
/// `digitsE±exponent`, a spelling JCS never produces. Equal values give
/// equal text, distinct values distinct text (an exponent too long for
/// `i128` is kept as written).
pub fn canonical_json(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write(value, &mut out);
    out
}

fn write(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => out.extend_from_slice(number(n.as_str()).as_bytes()),
        Value::String(s) => string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out);
            }
            out.push(b']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<(Vec<u16>, &String, &Value)> = members
                .iter()
                .map(|(k, v)| (k.encode_utf16().collect(), k, v))
                .collect();
            sorted.sort_by(|a, b| a.0.cmp(&b.0));
            out.push(b'{');
            for (i, (_, k, v)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                string(k, out);
                out.push(b':');
                write(v, out);
            }
            out.push(b'}');
        }
    }
}

/// A JSON string as JCS writes it; serde_json escapes exactly the same
/// characters the same way (`\"`, `\\`, `\b\f\n\r\t`, other controls as
/// `\u00xx`).
fn string(s: &str, out: &mut Vec<u8>) {
    let _ = serde_json::to_writer(&mut *out, s);
}

fn number(text: &str) -> String {
    let Some(exact) = Scientific::read(text) else {
        // Not reachable from serde_json, which only hands over number grammar.
        return format!("raw:{text}");
    };
    let jcs = text
        .parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .map(|f| ryu_js::Buffer::new().format_finite(f).to_owned());
    if let Some(jcs) = jcs
        && Scientific::read(&jcs).is_some_and(|j| same_value(&j, &exact))
    {
        return jcs;
    }
    if exact.is_zero() {
        return "0".to_owned();
    }
    let sign = if exact.negative { "-" } else { "" };
    match exact.exponent {
        Exponent::Small(e) => format!("{sign}{}E{e:+}", exact.digits),
        Exponent::Huge {
            negative,
            written,
            shift,
        } => {
            let e_sign = if negative { '-' } else { '+' };
            format!("{sign}{}E{e_sign}{written}{shift:+}", exact.digits)
        }
    }
}

fn same_value(a: &Scientific<'_>, b: &Scientific<'_>) -> bool {
    (a.is_zero() && b.is_zero()) || a == b
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
    fn numbers_beyond_f64_are_canonical_and_exact() {
        // JCS cannot write these (the body used to be hashed raw, so
        // whitespace changed the fingerprint) or merges distinct values.
        let free = json_fp("POST", "/v1/orders", r#"{"price":1e99999999999999999999}"#);
        let spaced = json_fp(
            "POST",
            "/v1/orders",
            "{ \"price\" : 1E+99999999999999999999 }",
        );
        assert_eq!(free, spaced);
        assert_eq!(
            json_fp("POST", "/v1/orders", r#"{"price":1e400}"#),
            json_fp("POST", "/v1/orders", r#"{"price": 10e399}"#)
        );
        assert_ne!(
            json_fp("POST", "/v1/orders", r#"{"price":1e400}"#),
            json_fp("POST", "/v1/orders", r#"{"price":1e401}"#)
        );
        assert_ne!(
            json_fp("POST", "/v1/orders", r#"{"price":9.99}"#),
            json_fp("POST", "/v1/orders", r#"{"price":9.990000000000000000001}"#)
        );
        assert_ne!(
            json_fp("POST", "/v1/orders", r#"{"q":9007199254740993}"#),
            json_fp("POST", "/v1/orders", r#"{"q":9007199254740992}"#)
        );
        let v: serde_json::Value =
            serde_json::from_str(r#"[1e-400,-0,0e999999999999999999999,12.50e1,1e-99999999999999999999999999999999999999999]"#)
                .unwrap_or_default();
        assert_eq!(
            String::from_utf8_lossy(&canonical_json(&v)),
            "[1E-400,0,0,125,1E-99999999999999999999999999999999999999999+0]"
        );
    }

    #[test]
    fn where_jcs_is_exact_the_canonical_form_is_jcs_byte_for_byte() {
        let value: serde_json::Value = serde_json::from_str(
            r#"{"\u20ac":1,"\r":2,"1":3,"b":1.50,"a":1e2,"s":"\u0001\"\\/\u007f","n":[null,true,-0.0,1e21,5e-7]}"#,
        )
        .unwrap_or_default();
        let jcs = serde_json_canonicalizer::to_vec(&value).unwrap_or_default();
        assert_eq!(canonical_json(&value), jcs);
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
