//! A request body as the orders routes read it: the value `serde_json`
//! builds (numbers keep their exact text), strictly (a member named twice
//! is refused). Its media type, content coding, size and syntax are checked
//! before, by the ledger's extractor (`idempotency_ledger::actix::Idempotent`).

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::error::ApiError;

/// Parses JSON strictly, in one pass: syntax errors and duplicate member
/// names (at any depth) are `400 MALFORMED_JSON`. The value is the one
/// `serde_json` builds (numbers keep their exact text), so what is hashed
/// for the fingerprint is unchanged.
pub fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    let mut reader = serde_json::Deserializer::from_slice(bytes);
    let strict = StrictValue::deserialize(&mut reader).and_then(|v| reader.end().map(|()| v.0));
    strict.map_err(|e| {
        let message = if e.is_data() {
            // Only the duplicate check reports a data error: the syntax is fine.
            e.to_string()
        } else {
            format!("the request body is not valid JSON: {e}")
        };
        ApiError::MalformedJson(message)
    })
}

/// A JSON value built as `serde_json::Value` builds it, refusing an object
/// that names a member twice (`Value` would silently keep the last one).
struct StrictValue(Value);

/// The member name under which `serde_json` (with `arbitrary_precision`)
/// hands a number's exact text to a visitor; its own `Value` recognises a
/// number by the same name.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = StrictValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<StrictValue, E> {
        Ok(StrictValue(Value::Bool(b)))
    }
    fn visit_i64<E>(self, n: i64) -> Result<StrictValue, E> {
        Ok(StrictValue(Value::from(n)))
    }
    fn visit_u64<E>(self, n: u64) -> Result<StrictValue, E> {
        Ok(StrictValue(Value::from(n)))
    }
    fn visit_f64<E>(self, n: f64) -> Result<StrictValue, E> {
        Ok(StrictValue(Value::from(n)))
    }
    fn visit_str<E>(self, s: &str) -> Result<StrictValue, E> {
        Ok(StrictValue(Value::String(s.to_owned())))
    }
    fn visit_string<E>(self, s: String) -> Result<StrictValue, E> {
        Ok(StrictValue(Value::String(s)))
    }
    fn visit_unit<E>(self) -> Result<StrictValue, E> {
        Ok(StrictValue(Value::Null))
    }
    fn visit_none<E>(self) -> Result<StrictValue, E> {
        Ok(StrictValue(Value::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StrictValue, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(StrictValue(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(StrictValue(Value::Array(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StrictValue, A::Error> {
        let Some(first) = map.next_key::<String>()? else {
            return Ok(StrictValue(Value::Object(Map::new())));
        };
        if first == NUMBER_TOKEN {
            // What serde_json's own `Value` does with it: the text is parsed
            // (checked) as a number.
            let text: String = map.next_value()?;
            let number = text.parse::<Number>().map_err(de::Error::custom)?;
            return Ok(StrictValue(Value::Number(number)));
        }
        let mut members = Map::new();
        let StrictValue(value) = map.next_value()?;
        members.insert(first, value);
        while let Some(name) = map.next_key::<String>()? {
            if members.contains_key(&name) {
                return Err(de::Error::custom(format!(
                    "duplicate member name \"{name}\""
                )));
            }
            let StrictValue(value) = map.next_value()?;
            members.insert(name, value);
        }
        Ok(StrictValue(Value::Object(members)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_members_are_refused_at_any_depth() {
        assert!(parse_json(br#"{"a":1,"a":2}"#).is_err());
        assert!(parse_json(br#"{"a":{"b":1,"b":1}}"#).is_err());
        assert!(parse_json(br#"[{"b":1},{"b":1}]"#).is_ok());
    }

    #[test]
    fn numbers_keep_their_exact_text() {
        let v = parse_json(br#"{"price": 9.990, "q": 1e2}"#).unwrap();
        assert_eq!(v["price"].as_number().map(|n| n.as_str()), Some("9.990"));
        // serde_json spells the exponent's sign out; the value is unchanged.
        assert_eq!(v["q"].as_number().map(|n| n.as_str()), Some("1e+2"));
    }

    #[test]
    fn the_value_is_the_one_serde_json_builds() {
        for text in [
            r#"{"item":" Widget ","quantity":2,"price":9.990}"#,
            r#"[1, -0, 1e400, 12.50e1, "\u00e9", null, true, {"a": {"b": []}}]"#,
            r#"{"$serde_json::private::Number": "1.50"}"#,
            r#""s""#,
            "{}",
        ] {
            let plain: Value = serde_json::from_str(text).unwrap();
            assert_eq!(parse_json(text.as_bytes()).unwrap(), plain, "{text}");
        }
    }

    #[test]
    fn malformed_json_is_refused() {
        for bad in [&b""[..], b"{", b"{\"a\":}", b"nope", b"{} trailing"] {
            assert!(parse_json(bad).is_err());
        }
    }
}
