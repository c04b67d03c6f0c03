//! Request bodies: media type, size limit and strict JSON syntax.

use std::fmt;
use std::time::Duration;

use actix_web::http::header;
use actix_web::{HttpRequest, web};
use futures_util::StreamExt;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::error::ApiError;

/// Whether a request's `Content-Type` is `application/json`, as RFC 9110
/// §8.3.1 reads a media type: type and subtype in any case, parameters
/// (such as `charset=utf-8`) allowed, with optional whitespace around each
/// `;`.
pub fn is_json(req: &HttpRequest) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_json_media_type)
}

/// Whether a `Content-Type` value names `application/json` (see [`is_json`]).
pub fn is_json_media_type(value: &str) -> bool {
    media_type(value).is_some_and(|m| {
        m.type_() == mime::APPLICATION && m.subtype() == mime::JSON && m.suffix().is_none()
    })
}

/// `value` parsed as a media type by the `mime` crate, once the optional
/// whitespace RFC 9110 allows around each `;` (which `mime` refuses before
/// one) is taken out.
fn media_type(value: &str) -> Option<mime::Mime> {
    let parts: Vec<&str> = value.split(';').map(str::trim).collect();
    parts.join(";").parse().ok()
}

/// The request's content coding, when it names one other than `identity`
/// (RFC 9110 §8.4): the service decodes none, so such a body is refused
/// `415` instead of being read as it came.
pub fn content_coding(req: &HttpRequest) -> Option<String> {
    let mut codings = req
        .headers()
        .get_all(header::CONTENT_ENCODING)
        .flat_map(|v| v.to_str().unwrap_or("?").split(','))
        .map(str::trim)
        .filter(|c| !c.is_empty());
    codings
        .any(|c| !c.eq_ignore_ascii_case("identity"))
        .then(|| {
            req.headers()
                .get_all(header::CONTENT_ENCODING)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        })
}

/// How long a request body may take to arrive, counted from the moment its
/// head was read: a body still incomplete then is answered `408` and the
/// connection closed, before anything is recorded. With
/// `CLIENT_REQUEST_TIMEOUT` for the head, a trickling client holds a
/// connection at most their sum.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads the whole body, refusing more than `limit` bytes, or one that has
/// not fully arrived within [`BODY_TIMEOUT`].
pub async fn read_limited(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
) -> Result<web::Bytes, ApiError> {
    actix_web::rt::time::timeout(BODY_TIMEOUT, read_all(req, payload, limit))
        .await
        .map_err(|_| ApiError::BodyTimeout(BODY_TIMEOUT))?
}

async fn read_all(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<web::Bytes, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::PayloadTooLarge(limit));
    }
    let mut body = web::BytesMut::with_capacity(declared.unwrap_or(0));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::MalformedJson(format!("the request body could not be read: {e}"))
        })?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

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

    fn json(content_type: &str) -> bool {
        let req = actix_web::test::TestRequest::default()
            .insert_header((header::CONTENT_TYPE, content_type))
            .to_http_request();
        is_json(&req)
    }

    #[test]
    fn a_media_type_is_read_as_rfc_9110_reads_it() {
        for yes in [
            "application/json",
            "Application/JSON",
            "application/json;charset=utf-8",
            "application/json; charset=utf-8",
            "application/json ; charset=utf-8",
            "Application/JSON ;\tcharset=UTF-8",
            "application/json;charset=\"utf-8\"",
            " application/json ",
        ] {
            assert!(json(yes), "{yes:?} is JSON");
        }
        for no in [
            "text/json",
            "application/problem+json",
            "application/jsonx",
            "application/json; charset",
            "application/json;;",
            "application",
            "",
        ] {
            assert!(!json(no), "{no:?} is not JSON");
        }
    }

    fn coding(values: &[&str]) -> Option<String> {
        let mut req = actix_web::test::TestRequest::default();
        for value in values {
            req = req.append_header((header::CONTENT_ENCODING, *value));
        }
        content_coding(&req.to_http_request())
    }

    #[test]
    fn only_the_identity_coding_is_taken() {
        assert_eq!(coding(&[]), None);
        assert_eq!(coding(&["identity"]), None);
        assert_eq!(coding(&["Identity, identity"]), None);
        assert_eq!(coding(&["gzip"]).as_deref(), Some("gzip"));
        assert_eq!(coding(&["identity", "br"]).as_deref(), Some("identity, br"));
        assert_eq!(
            coding(&["GZIP, identity"]).as_deref(),
            Some("GZIP, identity")
        );
    }

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
