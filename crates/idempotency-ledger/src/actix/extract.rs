//! The extractor: a mutating request's key, media type, size and JSON,
//! checked in that order before the ledger sees it, and what its
//! fingerprint is made of.

use std::time::Duration;

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{FromRequest, HttpRequest, web};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use super::Rejected;
use crate::{Fingerprint, IdempotencyKey, Ledger, canonical_json};

/// The extractor's settings, given to the app as `app_data` (like
/// `web::JsonConfig`); without it, the defaults.
#[derive(Debug, Clone, Copy)]
pub struct IdempotentConfig {
    /// The largest body accepted, in bytes (default 64 KiB).
    pub limit: usize,
    /// How long the body may take to arrive, counted from when its head was
    /// read (default 10 s).
    pub body_timeout: Duration,
    /// Whether a body is needed; `None` (the default): optional on a
    /// `DELETE`, required on every other method. Set it on one route with
    /// `web::resource(…).app_data(…)`.
    pub body: Option<Body>,
}

/// Whether a route needs a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// A JSON body is required: without `application/json`, a `415`.
    Required,
    /// None is needed; one that is sent must be JSON.
    Optional,
}

impl IdempotentConfig {
    /// The defaults, for a route that needs no body (a `POST …/cancel`,
    /// say): `web::resource(…).app_data(IdempotentConfig::body_optional())`.
    pub fn body_optional() -> Self {
        Self {
            body: Some(Body::Optional),
            ..Self::default()
        }
    }
}

impl Default for IdempotentConfig {
    fn default() -> Self {
        Self {
            limit: 65_536,
            body_timeout: Duration::from_secs(10),
            body: None,
        }
    }
}

/// A mutating request that passed every check before the ledger: its key,
/// its body (JSON, or empty on a `DELETE`), and what its fingerprint is
/// made of.
#[derive(Debug)]
pub struct Idempotent {
    key: IdempotencyKey,
    method: String,
    path: String,
    body: web::Bytes,
    /// The body's canonical JSON; `None` for a request without a body.
    canonical: Option<Vec<u8>>,
}

/// Who is asking, with which key, for which request: what a mutation
/// (and the `found` of an insert) is handed.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The user the key belongs to.
    pub user: String,
    /// The request's key.
    pub key: IdempotencyKey,
    /// The request's fingerprint: keep it on a row the request makes, to
    /// tell this request's effect from another one's later.
    pub fingerprint: Fingerprint,
}

impl FromRequest for Idempotent {
    type Error = Rejected;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Self, Rejected>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let config = req
            .app_data::<IdempotentConfig>()
            .or_else(|| {
                req.app_data::<web::Data<IdempotentConfig>>()
                    .map(|d| d.get_ref())
            })
            .copied()
            .unwrap_or_default();
        let checked = check_head(req, config.body);
        let req = req.clone();
        let payload = payload.take();
        Box::pin(async move {
            let (key, body_optional) = checked?;
            let body = actix_web::rt::time::timeout(
                config.body_timeout,
                read_limited(&req, payload, config.limit),
            )
            .await
            .map_err(|_| Rejected::BodyTimeout(config.body_timeout))??;
            let canonical = match body.is_empty() && body_optional {
                true => None,
                false if !is_json(&req) => return Err(Rejected::UnsupportedMediaType),
                false => Some(canonical_json(&body).map_err(malformed)?),
            };
            Ok(Idempotent {
                key,
                method: req.method().as_str().to_owned(),
                path: req.path().to_owned(),
                body,
                canonical,
            })
        })
    }
}

/// The checks of the head, in order: the key, then the media type of a
/// request that must have a body. `true` when the body may be absent.
fn check_head(req: &HttpRequest, body: Option<Body>) -> Result<(IdempotencyKey, bool), Rejected> {
    let key =
        IdempotencyKey::from_values(req.headers().get_all(crate::HEADER).map(|v| v.as_bytes()))?;
    let optional = match body {
        Some(body) => body == Body::Optional,
        None => req.method() == actix_web::http::Method::DELETE,
    };
    if !optional && !is_json(req) {
        return Err(Rejected::UnsupportedMediaType);
    }
    if let Some(coding) = content_coding(req) {
        return Err(Rejected::UnsupportedContentCoding(coding));
    }
    Ok((key, optional))
}

/// Whether a request's `Content-Type` is `application/json`, as RFC 9110
/// §8.3.1 reads a media type: type and subtype in any case, parameters
/// (such as `charset=utf-8`) allowed, with optional whitespace around each
/// `;`.
pub(super) fn is_json(req: &HttpRequest) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_json_media_type)
}

/// Whether a `Content-Type` value names `application/json`, as RFC 9110
/// reads a media type (any case, parameters allowed, optional whitespace
/// around each `;`): the extractor's media type check.
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
/// (RFC 9110 §8.4): nothing is decoded, so such a body is refused `415`
/// instead of being read as it came.
pub(super) fn content_coding(req: &HttpRequest) -> Option<String> {
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

/// Reads the whole body, refusing more than `limit` bytes.
async fn read_limited(
    req: &HttpRequest,
    mut payload: Payload,
    limit: usize,
) -> Result<web::Bytes, Rejected> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(Rejected::PayloadTooLarge(limit));
    }
    let mut body = web::BytesMut::with_capacity(declared.unwrap_or(0));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| {
            Rejected::MalformedJson(format!("the request body could not be read: {e}"))
        })?;
        if body.len().saturating_add(chunk.len()) > limit {
            return Err(Rejected::PayloadTooLarge(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

fn malformed(e: serde_json::Error) -> Rejected {
    Rejected::MalformedJson(if e.is_data() {
        // Only a member named twice is a data error: the syntax is fine.
        e.to_string()
    } else {
        format!("the request body is not valid JSON: {e}")
    })
}

impl Idempotent {
    /// The request's key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The body as it arrived (empty for a `DELETE` without one).
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The body read as `T` by the application's own `serde_json` (its
    /// features, its types); `null` when there is none. The syntax was
    /// checked already: an error here is the application's to answer
    /// (typically a `422`, which is not recorded).
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        match self.body.is_empty() {
            true => serde_json::from_slice(b"null"),
            false => serde_json::from_slice(&self.body),
        }
    }

    /// The request's fingerprint: method, path and the body's canonical
    /// JSON (the raw body when there is none).
    pub fn fingerprint(&self) -> Fingerprint {
        match &self.canonical {
            Some(canonical) => Fingerprint::of_canonical(&self.method, &self.path, canonical),
            None => Fingerprint::of_raw(&self.method, &self.path, &self.body),
        }
    }

    /// Who is asking, with which key, for which request; `None` while every
    /// write slot is taken — the ledger sheds such a request on arrival
    /// anyway, and a shed request should not hash its body.
    pub(super) fn caller(self, ledger: &Ledger, user: String) -> Option<Caller> {
        if ledger.admission().is_full() {
            return None;
        }
        let fingerprint = self.fingerprint();
        Some(Caller {
            user,
            key: self.key,
            fingerprint,
        })
    }
}
