//! The invariants of every parser of client input, as functions that panic
//! when one breaks. The fuzz targets in `fuzz/` call them on generated
//! bytes; this module's tests replay the committed corpus through them on
//! the stable toolchain (`cargo test --lib invariants`). Not used by the
//! server.
//!
//! Where an invariant speaks of a value (a price, a key), it is compared
//! against a reference computed here independently, by a different method
//! than the parser's: the price by moving the decimal point through the
//! literal's digits as text, the key by a byte-wise reading of the rules.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;

use crate::http::body::parse_json;
use crate::idempotency::{Fingerprint, IdempotencyKey};
use crate::orders::Cursor;
use crate::orders::input::{FieldError, parse_new_order, parse_order_patch};
use crate::orders::model::{Money, cents_to_json};

/// The reference reading of a price literal: `Some(cents)` when the value
/// is a whole number of cents in `0 ..= 100_000_000_000`, `None` otherwise
/// (and when the text is not a JSON number). Works on the text only: the
/// decimal point is moved through the digits, never computed with.
pub fn reference_cents(literal: &str) -> Option<i64> {
    let (negative, rest) = match literal.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, literal),
    };
    let (mantissa, exp) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, "0"),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digit = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let exp_digits = exp.trim_start_matches(['+', '-']);
    let exp_negative = exp.starts_with('-');
    if int.is_empty()
        || !digit(int)
        || !digit(frac)
        || (mantissa.contains('.') && frac.is_empty())
        || exp_digits.is_empty()
        || !digit(exp_digits)
        || exp.len() - exp_digits.len() > 1
        || (int.len() > 1 && int.starts_with('0'))
    {
        return None;
    }
    let digits = format!("{int}{frac}");
    if digits.bytes().all(|b| b == b'0') {
        return Some(0);
    }
    let exp_digits = exp_digits.trim_start_matches('0');
    if exp_digits.len() > 18 {
        // A nonzero value scaled by at least 10^±10^18: far beyond the
        // bound, or with a nonzero digit far below a cent.
        return None;
    }
    let e: i64 = exp_digits.parse().unwrap_or(0);
    let e = if exp_negative { -e } else { e };
    // The decimal point of the cents amount sits `point` digits into `digits`.
    let point = int.len() as i64 + e + 2;
    let cut = point.clamp(0, digits.len() as i64) as usize;
    let (whole, below) = digits.split_at(cut);
    if below.bytes().any(|b| b != b'0') {
        return None;
    }
    let whole = whole.trim_start_matches('0');
    let padding = (point - cut as i64).max(0);
    if whole.is_empty() {
        return Some(0);
    }
    if whole.len() as i64 + padding > 12 {
        return None;
    }
    let cents: i64 = format!("{whole}{}", "0".repeat(padding as usize))
        .parse()
        .ok()?;
    (!negative && cents <= Money::MAX_CENTS).then_some(cents)
}

/// A price literal in a body: accepted exactly when the reference says it
/// is whole cents within the bound, at exactly that amount, in create and
/// patch alike; otherwise refused naming `price` and nothing else.
pub fn check_price_literal(literal: &str) {
    let body = format!(r#"{{"item":"w","quantity":1,"price":{literal}}}"#);
    let Ok(value) = parse_json(body.as_bytes()) else {
        assert_eq!(
            reference_cents(literal),
            None,
            "{literal:?} is refused as JSON yet has a value"
        );
        return;
    };
    let Some(Value::Number(n)) = value.get("price") else {
        return; // e.g. `1,"x":2` spliced in: not a number literal
    };
    if n.as_str() != literal.trim_matches([' ', '\t', '\n', '\r']) {
        return;
    }
    let expected = reference_cents(n.as_str());
    let created = parse_new_order(&value).map(|o| o.price.cents());
    let patch = serde_json::json!({ "price": value["price"] });
    let patched = parse_order_patch(&patch).map(|p| p.price.map(Money::cents));
    match expected {
        Some(cents) => {
            assert_eq!(created, Ok(cents), "create {literal:?}");
            assert_eq!(patched, Ok(Some(cents)), "patch {literal:?}");
        }
        None => {
            let fields = |r: Result<_, Vec<FieldError>>| -> Vec<String> {
                r.err()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|e| e.field)
                    .collect()
            };
            assert_eq!(fields(created.map(|_| ())), ["price"], "create {literal:?}");
            assert_eq!(fields(patched.map(|_| ())), ["price"], "patch {literal:?}");
        }
    }
}

/// Whether `value` alone passes the rules of field `name` (a reference of
/// the rules, for bodies).
fn field_is_valid(name: &str, value: &Value) -> bool {
    match (name, value) {
        ("item", Value::String(s)) => {
            let t = s.trim();
            !t.is_empty() && t.chars().count() <= 200 && !t.chars().any(char::is_control)
        }
        ("quantity", Value::Number(n)) => {
            let t = n.as_str();
            let digits = t.strip_prefix('-').unwrap_or(t);
            digits.bytes().all(|b| b.is_ascii_digit())
                && t.parse::<i64>().is_ok_and(|q| (1..=1_000_000).contains(&q))
        }
        ("price", Value::Number(n)) => reference_cents(n.as_str()).is_some(),
        _ => false,
    }
}

const FIELDS: [&str; 3] = ["item", "quantity", "price"];

/// Any bytes as a create (`create`) or patch body: not JSON is `400`; JSON
/// gives the order it denotes exactly, or names exactly the failing fields,
/// once each.
pub fn check_order_body(bytes: &[u8], create: bool) {
    let Ok(value) = parse_json(bytes) else { return };
    {
        let result = if create {
            parse_new_order(&value).map(|o| (Some(o.item), Some(o.quantity), Some(o.price)))
        } else {
            parse_order_patch(&value).map(|p| (p.item, p.quantity, p.price))
        };
        let Value::Object(members) = &value else {
            assert!(result.is_err(), "{value} is not an object");
            return;
        };
        let unknown: Vec<&String> = members
            .keys()
            .filter(|k| !FIELDS.contains(&k.as_str()))
            .collect();
        let invalid: Vec<&str> = FIELDS
            .iter()
            .copied()
            .filter(|f| match members.get(*f) {
                Some(v) => !field_is_valid(f, v),
                None => create,
            })
            .collect();
        let present = FIELDS.iter().any(|f| members.contains_key(*f));
        match result {
            Ok((item, quantity, price)) => {
                assert!(unknown.is_empty() && invalid.is_empty(), "{value} accepted");
                if let Some(item) = item {
                    assert_eq!(item.as_str(), value["item"].as_str().unwrap_or("").trim());
                }
                if let Some(q) = quantity {
                    assert_eq!(value["quantity"].to_string(), q.get().to_string());
                }
                if let Some(p) = price {
                    let literal = value["price"].as_number().map(|n| n.as_str().to_owned());
                    assert_eq!(
                        literal.as_deref().and_then(reference_cents),
                        Some(p.cents())
                    );
                    let written = cents_to_json(p.cents()).to_string();
                    assert_eq!(reference_cents(&written), Some(p.cents()), "{written}");
                }
            }
            Err(errors) => {
                let named: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
                assert!(errors.iter().all(|e| !e.message.is_empty()));
                if !create && !present && unknown.is_empty() {
                    assert_eq!(named, ["body"], "{value}");
                    return;
                }
                let mut expected: Vec<&str> = unknown.iter().map(|k| k.as_str()).collect();
                expected.extend(&invalid);
                assert_eq!(named, expected, "{value} (create: {create})");
            }
        }
    }
}

/// The reference reading of an `Idempotency-Key` header value: the bare
/// value, or the RFC 8941 string's content, when it is 1–255 printable
/// ASCII characters and not only spaces; `None` otherwise.
pub fn reference_key(raw: &[u8]) -> Option<String> {
    if !raw.iter().all(|b| (0x20..=0x7e).contains(b)) {
        return None;
    }
    let start = raw.iter().position(|b| *b != b' ').unwrap_or(raw.len());
    let end = raw
        .iter()
        .rposition(|b| *b != b' ')
        .map_or(start, |i| i + 1);
    let v = &raw[start..end];
    let value: Vec<u8> = if v.len() >= 2 && v[0] == b'"' && v[v.len() - 1] == b'"' {
        let mut out = Vec::new();
        let mut escaped = false;
        for &b in &v[1..v.len() - 1] {
            match (escaped, b) {
                (false, b'\\') => escaped = true,
                (false, b'"') => return None,
                (true, b'"' | b'\\') => {
                    out.push(b);
                    escaped = false;
                }
                (true, _) => return None,
                (false, _) => out.push(b),
            }
        }
        if escaped {
            return None;
        }
        out
    } else {
        v.to_vec()
    };
    let ok = (1..=255).contains(&value.len()) && value.iter().any(|b| *b != b' ');
    ok.then(|| String::from_utf8(value).unwrap_or_default())
}

/// A key is accepted iff the reference accepts it, as the same value.
pub fn check_key(raw: &[u8]) {
    let parsed = IdempotencyKey::parse(raw).ok();
    assert_eq!(
        parsed.as_ref().map(|k| k.as_str().to_owned()),
        reference_key(raw),
        "{:?}",
        String::from_utf8_lossy(raw)
    );
}

/// `value` as JSON text with its members in reverse order, whitespace
/// everywhere JSON allows, and each number respelled (`1.5` → `1.50`,
/// `2` → `2.0`): the same value, so the same fingerprint.
pub fn respelled(value: &Value) -> String {
    match value {
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(respelled).collect();
            format!("[ {} ]", inner.join(" ,\n"))
        }
        Value::Object(members) => {
            let inner: Vec<String> = members
                .iter()
                .rev()
                .map(|(k, v)| format!("{} :\t{}", Value::String(k.clone()), respelled(v)))
                .collect();
            format!("{{\r\n{} }}", inner.join(", "))
        }
        Value::Number(n) => {
            let t = n.as_str();
            let (mantissa, exp) = match t.find(['e', 'E']) {
                Some(at) => t.split_at(at),
                None => (t, ""),
            };
            if mantissa.contains('.') {
                format!("{mantissa}0{exp}")
            } else {
                format!("{mantissa}.0{exp}")
            }
        }
        leaf => leaf.to_string(),
    }
}

/// `value` with its first leaf (depth first) changed to another value.
fn changed(value: &Value) -> Option<Value> {
    match value {
        Value::Array(items) => items.iter().enumerate().find_map(|(i, v)| {
            let mut items = items.clone();
            items[i] = changed(v)?;
            Some(Value::Array(items))
        }),
        Value::Object(members) => members.iter().find_map(|(k, v)| {
            let mut members = members.clone();
            members.insert(k.clone(), changed(v)?);
            Some(Value::Object(members))
        }),
        Value::Null => Some(Value::Bool(false)),
        Value::Bool(b) => Some(Value::Bool(!b)),
        Value::String(s) => Some(Value::String(format!("{s}x"))),
        // A leading 1 adds 10^k × 10^e ≠ 0 to the value.
        Value::Number(n) => {
            let t = n.as_str();
            let text = match t.strip_prefix('-') {
                Some(rest) => format!("-1{rest}"),
                None => format!("1{t}"),
            };
            serde_json::from_str(&text).ok()
        }
    }
}

fn fingerprint(text: &[u8]) -> Option<Fingerprint> {
    let value = parse_json(text).ok()?;
    Some(Fingerprint::of("POST", "/v1/orders", text, Some(&value)))
}

/// Any JSON document: its fingerprint is unchanged by member order,
/// whitespace and number spelling, and changes when one value changes.
pub fn check_fingerprint(bytes: &[u8]) {
    let Ok(value) = parse_json(bytes) else { return };
    let fp = fingerprint(bytes);
    assert!(fp.is_some());
    let other = respelled(&value);
    assert_eq!(fingerprint(other.as_bytes()), fp, "{value} vs {other}");
    if let Some(changed) = changed(&value) {
        let text = changed.to_string();
        if parse_json(text.as_bytes()).is_ok() {
            assert_ne!(fingerprint(text.as_bytes()), fp, "{value} vs {changed}");
        }
    }
}

/// Any text as a list cursor: only text the server issues (32 lowercase
/// hex digits of an order id) decodes, and it encodes back to itself.
pub fn check_cursor(text: &str) {
    if let Some(cursor) = Cursor::decode(text) {
        assert_eq!(cursor.encode(), text);
    }
    assert_eq!(
        Cursor::decode(text).is_some(),
        text.len() == 32 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "{text:?}"
    );
}

#[cfg(test)]
mod tests {
    use orders_client::invariants::replay;

    use super::*;

    fn text(check: fn(&str)) -> impl Fn(&[u8]) {
        move |bytes| {
            if let Ok(s) = std::str::from_utf8(bytes) {
                check(s);
            }
        }
    }

    #[test]
    fn the_money_corpus_keeps_its_invariant() {
        replay("money", text(check_price_literal));
    }

    #[test]
    fn the_create_body_corpus_keeps_its_invariant() {
        replay("create_body", |b| check_order_body(b, true));
    }

    #[test]
    fn the_patch_body_corpus_keeps_its_invariant() {
        replay("patch_body", |b| check_order_body(b, false));
    }

    #[test]
    fn the_idempotency_key_corpus_keeps_its_invariant() {
        replay("idempotency_key", check_key);
    }

    #[test]
    fn the_fingerprint_corpus_keeps_its_invariant() {
        replay("fingerprint", check_fingerprint);
    }

    #[test]
    fn the_cursor_corpus_keeps_its_invariant() {
        replay("cursor", text(check_cursor));
    }

    #[test]
    fn the_reference_reads_prices_by_moving_the_point() {
        let z = |n| "0".repeat(n);
        for (literal, cents) in [
            ("9.99", Some(999)),
            ("9.990", Some(999)),
            ("1e2", Some(10_000)),
            ("1E+2", Some(10_000)),
            ("0e99999999999999999999", Some(0)),
            ("-0.00", Some(0)),
            ("1000000000", Some(100_000_000_000)),
            (&format!("1{}e-390", z(399)), Some(100_000_000_000)),
            ("1e99999999999999999999", None),
            ("1e-99999999999999999999", None),
            ("1000000000.01", None),
            ("9.999", None),
            ("-0.01", None),
            (&format!("0.{}1", z(399)), None),
            ("01", None),
            ("1.", None),
        ] {
            assert_eq!(reference_cents(literal), cents, "{literal}");
        }
    }
}
