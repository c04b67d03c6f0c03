//! What makes two requests "the same request": method, path and body.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use json_number::{Exponent, Scientific};

/// SHA-256 over the method, the path and the body's canonical form, as
/// lowercase hex. A JSON body is canonicalised ([`canonical_json`]): member
/// order, insignificant whitespace and number spelling such as `9.990` do
/// not matter, and any changed value does; any other body is hashed as raw
/// bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// The fingerprint of a request: its method, its path, and its body —
    /// in its canonical form when it is JSON ([`canonical_json`] accepts
    /// it), else as raw bytes (an empty body among them).
    pub fn of(method: &str, path: &str, body: &[u8]) -> Self {
        match canonical_json(body) {
            Ok(canonical) => Self::of_canonical(method, path, &canonical),
            Err(_) => Self::of_raw(method, path, body),
        }
    }

    /// The fingerprint of a JSON body already in its canonical form (what
    /// [`canonical_json`] returned for it).
    pub fn of_canonical(method: &str, path: &str, canonical: &[u8]) -> Self {
        Self::hash(method, path, b"json:", canonical)
    }

    /// The fingerprint of a body that is not JSON, hashed as its bytes.
    pub fn of_raw(method: &str, path: &str, body: &[u8]) -> Self {
        Self::hash(method, path, b"raw:", body)
    }

    fn hash(method: &str, path: &str, kind: &[u8], body: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(method.as_bytes());
        hasher.update([0]);
        hasher.update(path.as_bytes());
        hasher.update([0]);
        hasher.update(kind);
        hasher.update(body);
        Self(hex::encode(hasher.finalize()))
    }

    /// The fingerprint as 64 lowercase hex digits, as the ledger stores it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Reads a JSON document strictly and returns its canonical form: RFC 8785
/// (JCS) with exact numbers. Refused, with `serde_json`'s error (its
/// position in the document included): anything that is not one JSON
/// value, and an object that names a member twice, at any depth (the
/// message says which).
///
/// Members are sorted by UTF-16 code units and strings escaped as JCS does.
/// A number is read from its literal text — whatever features the
/// application's `serde_json` has — and written as JCS writes it (the
/// shortest text of the nearest `f64`) when that text denotes exactly the
/// literal's value, which keeps every such document's form byte-identical
/// to `serde_json_canonicalizer`'s; any other number (beyond `f64`'s range
/// or precision, where JCS would merge distinct values or fail) is written
/// as its exact significant digits and power of ten, `digitsE±exponent`, a
/// spelling JCS never produces. Equal values give equal text, distinct
/// values distinct text (an exponent too long for `i128` is kept as
/// written).
pub fn canonical_json(body: &[u8]) -> Result<Vec<u8>, serde_json::Error> {
    let mut writer = Writer {
        out: Vec::with_capacity(body.len()),
        whole: body,
        failed: None,
        depth: 1,
    };
    let mut reader = serde_json::Deserializer::from_slice(body);
    let first = body
        .iter()
        .find(|b| !matches!(b, b' ' | b'\n' | b'\r' | b'\t'))
        .copied();
    let read = match first {
        Some(b'{') => reader.deserialize_map(Canonical(&mut writer)),
        Some(b'[') => reader.deserialize_seq(Canonical(&mut writer)),
        _ => {
            <&RawValue>::deserialize(&mut reader).and_then(|raw| scalar(raw.get(), &mut writer.out))
        }
    };
    match (read, writer.failed) {
        // Found inside a part, placed in the whole document already.
        (Err(_), Some(message)) => Err(de::Error::custom(message)),
        (Err(e), None) => Err(e),
        (Ok(()), _) => reader.end().map(|()| writer.out),
    }
}

/// The canonical form being written, and the first error found inside a
/// part of the document, placed where it is in the whole.
struct Writer<'w> {
    out: Vec<u8>,
    whole: &'w [u8],
    failed: Option<String>,
    /// How many objects and arrays enclose the part being written.
    depth: usize,
}

/// How deep objects and arrays may nest: `serde_json`'s own limit, which
/// refuses the 128th level (each part is read by a reader of its own, so
/// the depth is counted here).
const MAX_DEPTH: usize = 128;

/// Writes the canonical form of the object or array it is handed.
struct Canonical<'a, 'w>(&'a mut Writer<'w>);

/// A member name: borrowed from the document unless it has escapes.
#[derive(PartialEq, Eq)]
struct Name<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Name<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl<'de> Visitor<'de> for NameVisitor {
            type Value = Name<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Owned(s)))
            }
        }
        deserializer.deserialize_str(NameVisitor)
    }
}

/// Past this many members, a name given twice is looked for in a set
/// rather than among the members read so far.
const LINEAR_NAMES: usize = 16;

impl<'de> Visitor<'de> for Canonical<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object or array")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut members: Vec<(Name<'de>, &'de RawValue)> = Vec::new();
        let mut seen: Option<HashSet<Cow<'de, str>>> = None;
        while let Some(name) = map.next_key::<Name<'de>>()? {
            let twice = match &mut seen {
                Some(seen) => !seen.insert(name.0.clone()),
                None => members.iter().any(|(n, _)| *n == name),
            };
            if twice {
                return Err(de::Error::custom(format!(
                    "duplicate member name \"{}\"",
                    name.0
                )));
            }
            if seen.is_none() && members.len() == LINEAR_NAMES {
                let mut set: HashSet<Cow<'de, str>> =
                    members.iter().map(|(n, _)| n.0.clone()).collect();
                set.insert(name.0.clone());
                seen = Some(set);
            }
            let value = map.next_value::<&'de RawValue>()?;
            members.push((name, value));
        }
        // By UTF-16 code units, compared as they are produced (member
        // names are distinct, so the order is total).
        members.sort_unstable_by(|a, b| a.0.0.encode_utf16().cmp(b.0.0.encode_utf16()));
        let writer = self.0;
        writer.out.push(b'{');
        for (i, (name, value)) in members.into_iter().enumerate() {
            if i > 0 {
                writer.out.push(b',');
            }
            string(&name.0, &mut writer.out);
            writer.out.push(b':');
            part(value, writer)?;
        }
        writer.out.push(b'}');
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let writer = self.0;
        writer.out.push(b'[');
        let mut first = true;
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            if !first {
                writer.out.push(b',');
            }
            first = false;
            part(item, writer)?;
        }
        writer.out.push(b']');
        Ok(())
    }
}

/// Writes one value of an object or array (the parser checked its syntax
/// already). An object or array is read again on its own; a member named
/// twice inside it is kept in `writer.failed`, placed where it is in the
/// whole document — where a one-pass reading of the whole reports it.
fn part<E: de::Error>(raw: &RawValue, writer: &mut Writer<'_>) -> Result<(), E> {
    let text = raw.get();
    let nested = matches!(text.as_bytes().first(), Some(b'{' | b'['));
    if nested && writer.depth + 1 >= MAX_DEPTH {
        if writer.failed.is_none() {
            // Where serde_json reports it: just past the opening bracket.
            let at = offset_in(text, writer.whole).saturating_add(1);
            writer.failed = Some(format!(
                "recursion limit exceeded at {}",
                position(writer.whole, at)
            ));
        }
        return Err(E::custom("nested too deep"));
    }
    writer.depth += 1;
    let read = match text.as_bytes().first() {
        Some(b'{') => serde_json::Deserializer::from_str(text).deserialize_map(Canonical(writer)),
        Some(b'[') => serde_json::Deserializer::from_str(text).deserialize_seq(Canonical(writer)),
        _ => scalar(text, &mut writer.out),
    };
    writer.depth -= 1;
    read.map_err(|e| {
        if writer.failed.is_none() {
            writer.failed = Some(relocate(&e, text, writer.whole));
        }
        E::custom("an error inside a part of the document")
    })
}

/// `error`, found at a line and column of `part` (a slice of `whole`), as
/// the same message at its line and column in `whole`.
fn relocate(error: &serde_json::Error, part: &str, whole: &[u8]) -> String {
    let message = error.to_string();
    if error.line() == 0 {
        return message;
    }
    let suffix = format!(" at line {} column {}", error.line(), error.column());
    let bare = message.strip_suffix(&suffix).unwrap_or(&message);
    // The index in the part (serde_json's column counts the bytes since
    // the line's start), then in the whole.
    let line_start = match error.line() {
        0 | 1 => 0,
        n => part
            .bytes()
            .enumerate()
            .filter(|(_, b)| *b == b'\n')
            .nth(n - 2)
            .map_or(0, |(i, _)| i + 1),
    };
    let index = offset_in(part, whole)
        .saturating_add(line_start)
        .saturating_add(error.column());
    format!("{bare} at {}", position(whole, index))
}

/// Where `part` (a slice of `whole`) starts in `whole`.
fn offset_in(part: &str, whole: &[u8]) -> usize {
    (part.as_ptr() as usize).saturating_sub(whole.as_ptr() as usize)
}

/// `line L column C` of an index of `whole`, as `serde_json` counts them
/// (the column is the number of bytes since the line's start).
fn position(whole: &[u8], index: usize) -> String {
    let before = &whole[..index.min(whole.len())];
    let start_of_line = before
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i + 1);
    let line = 1 + before[..start_of_line]
        .iter()
        .filter(|b| **b == b'\n')
        .count();
    format!("line {line} column {}", before.len() - start_of_line)
}

/// A string, number or literal, from its text.
fn scalar(text: &str, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    match text.as_bytes().first() {
        // Without an escape, a JSON string's text is its JCS form already:
        // it holds no quote, backslash or control character.
        Some(b'"') if !text.contains('\\') => out.extend_from_slice(text.as_bytes()),
        Some(b'"') => string(&serde_json::from_str::<String>(text)?, out),
        Some(b't' | b'f' | b'n') => out.extend_from_slice(text.as_bytes()),
        _ => number_into(text, out),
    }
    Ok(())
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

/// The canonical form as it was computed from a parsed `serde_json::Value`
/// (with `arbitrary_precision`, whose numbers keep their text): the
/// reference [`canonical_json`] must agree with byte for byte, so that
/// fingerprints stored before stay what they were.
#[cfg(any(test, feature = "invariants"))]
pub fn canonical_value(value: &serde_json::Value) -> Vec<u8> {
    use serde_json::Value;
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
    let mut out = Vec::new();
    write(value, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_fp(method: &str, path: &str, body: &str) -> Fingerprint {
        assert!(canonical_json(body.as_bytes()).is_ok(), "{body}");
        Fingerprint::of(method, path, body.as_bytes())
    }

    fn canonical(text: &str) -> String {
        String::from_utf8(canonical_json(text.as_bytes()).unwrap()).unwrap()
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
            assert_eq!(canonical_json(body.as_bytes()).is_ok(), json, "{body}");
            let got = Fingerprint::of(method, path, body.as_bytes());
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
        let a = Fingerprint::of("POST", "/p", b"a=1&b=2");
        let b = Fingerprint::of("POST", "/p", b"b=2&a=1");
        assert_ne!(a, b);
        assert_eq!(a, Fingerprint::of_raw("POST", "/p", b"a=1&b=2"));
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
        assert_eq!(
            canonical(
                r#"[1e-400,-0,0e999999999999999999999,12.50e1,1e-99999999999999999999999999999999999999999]"#
            ),
            "[1E-400,0,0,125,1E-99999999999999999999999999999999999999999+0]"
        );
    }

    #[test]
    fn where_jcs_is_exact_the_canonical_form_is_jcs_byte_for_byte() {
        let text = r#"{"\u20ac":1,"\r":2,"1":3,"b":1.50,"a":1e2,"s":"\u0001\"\\/\u007f","n":[null,true,-0.0,1e21,5e-7]}"#;
        let value: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
        let jcs = serde_json_canonicalizer::to_vec(&value).unwrap_or_default();
        assert_eq!(canonical_json(text.as_bytes()).unwrap(), jcs);
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

    /// The strict reading's refusals, worded and placed as `serde_json`'s
    /// one pass over the whole document words and places them.
    #[test]
    fn a_member_named_twice_is_refused_where_it_is_at_any_depth() {
        let refused = |text: &str| canonical_json(text.as_bytes()).map_err(|e| e.to_string());
        assert_eq!(
            refused(r#"{"a":1,"a":2}"#),
            Err(r#"duplicate member name "a" at line 1 column 10"#.to_owned())
        );
        assert_eq!(
            refused("{\"x\": [1, {\"b\": 1,\n  \"b\": 1}]}"),
            Err(r#"duplicate member name "b" at line 2 column 5"#.to_owned())
        );
        assert!(refused(r#"[{"b":1},{"b":1}]"#).is_ok());
        let many: Vec<String> = (0..40).map(|i| format!("\"m{i}\":{i}")).collect();
        assert!(refused(&format!("{{{}}}", many.join(","))).is_ok());
        assert!(refused(&format!("{{{},\"m7\":0}}", many.join(","))).is_err());
        // Nesting: refused at the depth, and where, serde_json refuses it.
        for (depth, open, close) in [(127, "[", "]"), (128, "[", "]"), (300, "{\"a\":", "}")] {
            let text = format!("{}1{}", open.repeat(depth), close.repeat(depth));
            let value = serde_json::from_str::<serde_json::Value>(&text).map_err(|e| e.to_string());
            assert_eq!(refused(&text).map(drop), value.map(drop), "depth {depth}");
        }
        for bad in [
            "",
            "{",
            "{\"a\":}",
            "nope",
            "{} trailing",
            "[1,]",
            "\"\\x\"",
        ] {
            assert!(refused(bad).is_err(), "{bad}");
        }
    }

    /// The canonical form as it was computed: from the `Value` parsed
    /// with `arbitrary_precision` (a name given twice keeps its last value).
    fn one_pass(text: &str) -> Result<Vec<u8>, String> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        Ok(canonical_value(&value))
    }

    mod generated {
        use proptest::prelude::*;

        use super::super::*;

        /// A JSON number literal of any spelling: sign, leading digits,
        /// fraction, exponent of either case and sign, large and tiny.
        fn number() -> impl Strategy<Value = String> {
            (
                any::<bool>(),
                prop_oneof![Just("0".to_owned()), "[1-9][0-9]{0,25}"],
                proptest::option::of("[0-9]{1,25}"),
                proptest::option::of((
                    prop_oneof![Just("e"), Just("E")],
                    prop_oneof![Just(""), Just("+"), Just("-")],
                    "[0-9]{1,24}",
                )),
            )
                .prop_map(|(neg, int, frac, exp)| {
                    let mut s = String::new();
                    if neg {
                        s.push('-');
                    }
                    s.push_str(&int);
                    if let Some(f) = frac {
                        s.push('.');
                        s.push_str(&f);
                    }
                    if let Some((e, sign, digits)) = exp {
                        s.push_str(e);
                        s.push_str(sign);
                        s.push_str(&digits);
                    }
                    s
                })
        }

        /// A JSON string literal with escapes, controls and non-ASCII.
        fn string_literal() -> impl Strategy<Value = String> {
            proptest::collection::vec(
                prop_oneof![
                    "[a-zA-Z0-9 ]",
                    Just("\\\"".to_owned()),
                    Just("\\\\".to_owned()),
                    Just("\\/".to_owned()),
                    Just("\\n".to_owned()),
                    Just("\\u0001".to_owned()),
                    Just("\\u20ac".to_owned()),
                    Just("\\ud83d\\ude00".to_owned()),
                    Just("\u{e9}".to_owned()),
                    Just("\u{1f600}".to_owned()),
                    Just("\u{7f}".to_owned()),
                ],
                0..6,
            )
            .prop_map(|parts| format!("\"{}\"", parts.concat()))
        }

        /// Any JSON document's text, with whitespace between tokens.
        fn document() -> impl Strategy<Value = String> {
            let ws = prop_oneof![Just(""), Just(" "), Just("\n "), Just("\t")];
            let leaf = prop_oneof![
                number(),
                string_literal(),
                Just("true".to_owned()),
                Just("false".to_owned()),
                Just("null".to_owned()),
            ];
            leaf.prop_recursive(4, 48, 6, move |inner| {
                let ws = ws.clone();
                prop_oneof![
                    proptest::collection::vec((inner.clone(), ws.clone()), 0..6).prop_map(
                        |items| {
                            let items: Vec<String> = items
                                .into_iter()
                                .map(|(v, w)| format!("{w}{v}{w}"))
                                .collect();
                            format!("[{}]", items.join(","))
                        }
                    ),
                    proptest::collection::vec((string_literal(), inner, ws), 0..6).prop_map(
                        |members| {
                            let members: Vec<String> = members
                                .into_iter()
                                .map(|(k, v, w)| format!("{w}{k}{w}:{w}{v}{w}"))
                                .collect();
                            format!("{{{}}}", members.join(","))
                        }
                    ),
                ]
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2_000))]

            /// Stored entries hold fingerprints computed from a parsed
            /// `Value` with `arbitrary_precision`: the canonical form read
            /// from the text is that one, byte for byte, for any document
            /// (names given twice aside: both refuse those).
            #[test]
            fn the_canonical_form_from_the_text_is_the_one_from_the_parsed_value(text in document()) {
                let from_text = canonical_json(text.as_bytes()).map_err(|e| e.to_string());
                let from_value = super::one_pass(&text);
                match (&from_text, &from_value) {
                    (Ok(a), Ok(b)) => prop_assert_eq!(a, b, "{}", text),
                    // A name given twice: the value keeps the last one.
                    (Err(e), Ok(_)) => prop_assert!(e.starts_with("duplicate member name"), "{}: {}", text, e),
                    (_, Err(e)) => prop_assert!(false, "{} does not parse: {}", text, e),
                }
            }
        }
    }
}
