//! Request bodies: media type, size limit and strict JSON syntax.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use actix_web::http::header;
use actix_web::{HttpMessage, HttpRequest, web};
use futures_util::StreamExt;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::error::ApiError;

/// Whether a request's `Content-Type` is `application/json` (parameters such
/// as `charset=utf-8` allowed).
pub fn is_json(req: &HttpRequest) -> bool {
    matches!(req.mime_type(), Ok(Some(m)) if m.type_() == mime::APPLICATION && m.subtype() == mime::JSON && m.suffix().is_none())
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

/// Parses JSON strictly: syntax errors and duplicate member names (at any
/// depth) are `400 MALFORMED_JSON`.
pub fn parse_json(bytes: &[u8]) -> Result<serde_json::Value, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::MalformedJson(format!("the request body is not valid JSON: {e}")))?;
    serde_json::from_slice::<NoDuplicateMembers>(bytes)
        .map_err(|e| ApiError::MalformedJson(e.to_string()))?;
    Ok(value)
}

/// Walks a JSON document and fails on the first object that names a member
/// twice. `serde_json::Value` would silently keep the last one.
struct NoDuplicateMembers;

impl<'de> Deserialize<'de> for NoDuplicateMembers {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NoDuplicateMembers)
    }
}

impl<'de> Visitor<'de> for NoDuplicateMembers {
    type Value = NoDuplicateMembers;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_unit<E>(self) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_none<E>(self) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<NoDuplicateMembers>()?.is_some() {}
        Ok(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self, A::Error> {
        let mut seen = HashSet::new();
        while let Some(name) = map.next_key::<String>()? {
            if !seen.insert(name.clone()) {
                return Err(de::Error::custom(format!(
                    "duplicate member name \"{name}\""
                )));
            }
            map.next_value::<NoDuplicateMembers>()?;
        }
        Ok(self)
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
    fn malformed_json_is_refused() {
        for bad in [&b""[..], b"{", b"{\"a\":}", b"nope", b"{} trailing"] {
            assert!(parse_json(bad).is_err());
        }
    }
}
