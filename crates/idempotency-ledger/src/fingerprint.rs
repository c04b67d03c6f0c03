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
        Value::Number(n) => number_into(n.as_str(), out),
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
            // By UTF-16 code units, compared as they are produced (member
            // names are distinct, so the order is total).
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            sorted.sort_unstable_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push(b'{');
            for (i, (k, v)) in sorted.into_iter().enumerate() {
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

/// Writes a number as [`number`] does. An integer literal of at most 15
/// digits is written as it is (`-0` as `0`): every such value is an exact
/// `f64`, which JCS writes as its plain digits — the general way's answer,
/// without the float round trip.
fn number_into(text: &str, out: &mut Vec<u8>) {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let plain = (1..=15).contains(&digits.len())
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    if !plain {
        out.extend_from_slice(number(text).as_bytes());
    } else if digits == "0" {
        out.push(b'0');
    } else {
        out.extend_from_slice(text.as_bytes());
    }
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

    /// Stored entries hold fingerprints computed by earlier builds: the
    /// function of the request must never change, or their retries would be
    /// refused as a reused key. The first is also SHA-256 of
    /// `POST\0/v1/orders\0json:{"item":"Widget","price":9.99,"quantity":2}`
    /// computed elsewhere; all were computed by the build before the
    /// canonical form was last optimised.
    #[test]
    fn fingerprints_stay_what_earlier_builds_stored() {
        for (method, path, body, json, pinned) in [
            (
                "POST",
                "/v1/orders",
                r#"{"item":"Widget","quantity":2,"price":9.99}"#,
                true,
                "933cbef6eba0efef446d41a439eef360b8cc387896ad841d42a0c868105bf234",
            ),
            (
                "PATCH",
                "/v1/orders/0193a8e4-8f3c-7cc2-9d6a-5b1f2e3d4c5b",
                r#"{ "quantity": 3, "price": 1e2 }"#,
                true,
                "830fc2d357a78a700a4cf19086e0d7b1392c36c3f61d7376d10b3cb91707be07",
            ),
            (
                "POST",
                "/v1/orders",
                r#"{"\u20ac":[1.50,-0,1e400,9007199254740993,0.1e-7],"\r":{"b":null,"a":true},"1":"\u0001\"/"}"#,
                true,
                "40423b3f41d6b15bd1903ea77d3d18039ecc268ee6fb1126a81e8890ed03bdd0",
            ),
            (
                "DELETE",
                "/v1/orders/x",
                "",
                false,
                "4392248eca66c6a775f5f398021e762938ed41d2c4a6b70d05495fad88ff3417",
            ),
            (
                "POST",
                "/p",
                "a=1&b=2",
                false,
                "ebff649048a88d2912a6d946d5042ff8a519ee91122c285d96eefe9f682add4b",
            ),
        ] {
            let value: Option<serde_json::Value> =
                json.then(|| serde_json::from_str(body).unwrap_or_default());
            let got = Fingerprint::of(method, path, body.as_bytes(), value.as_ref());
            assert_eq!(got.as_str(), pinned, "{method} {path} {body}");
        }
    }

    #[test]
    fn short_integers_are_written_as_the_general_way_writes_them() {
        let mut cases: Vec<String> = [
            "0",
            "-0",
            "7",
            "-7",
            "10",
            "999999999999999",
            "-999999999999999",
        ]
        .map(String::from)
        .to_vec();
        let mut n: u64 = 1;
        for _ in 0..15 {
            cases.push(n.to_string());
            cases.push(format!("-{}", n * 7 + 3));
            n = n.saturating_mul(10);
        }
        for text in cases {
            let mut out = Vec::new();
            number_into(&text, &mut out);
            assert_eq!(String::from_utf8_lossy(&out), number(&text), "{text}");
        }
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
