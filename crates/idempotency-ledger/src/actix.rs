//! The actix-web layer (feature `actix-web`): an extractor that checks a
//! mutating request before the ledger sees it, and one rule that turns
//! every ledger answer into an HTTP response.
//!
//! [`Idempotent`] is an extractor, like `web::Json`: a handler that takes
//! it runs only for a request that passed, in this order, every check
//! before the ledger, each answered by the extractor itself as an
//! RFC 9457 problem (`application/problem+json`, a machine code in
//! `error`) — see [`Rejected`]:
//!
//! 1. the `Idempotency-Key` header ([`IdempotencyKey`]'s rules) → `400`
//!    `VALIDATION_FAILED`;
//! 2. the media type: `application/json` (as RFC 9110 reads it: any case,
//!    parameters allowed) → else `415` `UNSUPPORTED_MEDIA_TYPE`; a body
//!    sent with a `Content-Encoding` other than `identity` → `415` too
//!    (nothing is decoded); a `DELETE` may come without a body, and so
//!    may any request of a route whose [`IdempotentConfig::body`] says
//!    [`Body::Optional`];
//! 3. the size: at most [`IdempotentConfig::limit`] bytes → else `413`
//!    `PAYLOAD_TOO_LARGE`; all of it within
//!    [`IdempotentConfig::body_timeout`] of the head → else `408`
//!    `REQUEST_TIMEOUT`, the connection closed;
//! 4. the JSON: one value, no member named twice → else `400`
//!    `MALFORMED_JSON`.
//!
//! The handler then reads the body its own way ([`Idempotent::json`]),
//! answers its own validation failures (not recorded: the key stays
//! unused), and hands its mutation to [`Idempotent::execute`] with the
//! user the key belongs to (whoever the application's authentication says
//! is asking: keys are scoped by user).
//!
//! # The rule
//!
//! | the ledger says | the answer |
//! |---|---|
//! | [`Outcome::Executed`] | the mutation's response, as it was recorded |
//! | [`Outcome::Replayed`] | the recorded response with `Idempotent-Replayed: true` and the recorded headers; a recorded `201` as `200` (the retry created nothing) |
//! | [`Outcome::KeyReused`] | `409` `IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD` |
//! | [`Outcome::InProgress`] | `409` `IDEMPOTENCY_IN_PROGRESS`, `Retry-After: 1`, `X-Should-Retry: true` |
//! | [`LedgerError::Overloaded`], [`LedgerError::Unavailable`], [`LedgerError::LeaseExpired`] | `503` `SERVICE_UNAVAILABLE`, `Retry-After: 2`, `X-Should-Retry: true`: retrying the same key is safe |
//! | [`LedgerError::Database`] (a missing table, a broken query), [`LedgerError::Internal`], [`LedgerError::Unreplayable`] | `500` `INTERNAL_ERROR`: a defect, never "retry later"; the cause is logged, never sent |
//! | [`LedgerError::Operation`] (the mutation's own error) | that error's own response |
//!
//! A mutation's error whose response is below `500` is recorded and
//! replayed like any answer (a `404`, a domain conflict); a `5xx` rolls the
//! unit back and leaves the key free for a retry. `LedgerError<E>` is an
//! actix-web `ResponseError` for any `E` that is one, so a handler returns
//! `Result<HttpResponse, LedgerError<E>>` (or `actix_web::Result`, with
//! `?`).

use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::Payload;
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::{FromRequest, HttpRequest, HttpResponse, ResponseError, web};
use futures_util::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::row::Row;
use crate::{
    Completion, Fingerprint, IdempotencyKey, KeyError, Ledger, LedgerError, LedgerRequest,
    LedgerTx, Outcome, RECORDED_HEADERS, RecordedResponse, Unreplayable, canonical_json,
};

/// Sent, `true`, on every answer an earlier request produced.
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";
/// Sent, `true`, with every `503` and `409 IDEMPOTENCY_IN_PROGRESS` of this
/// layer: the hint the retry engines of generated API SDKs read (several
/// retry `5xx` and `429` by their status, but not a bare `409`).
pub const SHOULD_RETRY_HEADER: &str = "x-should-retry";
/// `Retry-After` (seconds) of a `409 IDEMPOTENCY_IN_PROGRESS`.
pub const IN_PROGRESS_RETRY_AFTER: u32 = 1;
/// `Retry-After` (seconds) of a `503`.
pub const UNAVAILABLE_RETRY_AFTER: u32 = 2;
/// The media type of every problem this layer answers.
pub const PROBLEM_JSON: &str = "application/problem+json";

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

/// Why [`Idempotent`] refused a request, answered as a problem.
#[derive(Debug, thiserror::Error)]
pub enum Rejected {
    /// `400 VALIDATION_FAILED`: the key is missing or breaks a rule.
    #[error("{0}")]
    Key(#[from] KeyError),
    /// `415 UNSUPPORTED_MEDIA_TYPE`.
    #[error("request bodies must be application/json")]
    UnsupportedMediaType,
    /// `415 UNSUPPORTED_MEDIA_TYPE`: a body sent with a content coding
    /// (`Content-Encoding`) other than `identity`, which is not decoded.
    #[error(
        "request bodies must not be content-coded: Content-Encoding {0:?} is not decoded here (identity only)"
    )]
    UnsupportedContentCoding(String),
    /// `413 PAYLOAD_TOO_LARGE`: more bytes than the limit.
    #[error("the request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// `400 MALFORMED_JSON`: not one JSON value, or a member named twice.
    #[error("{0}")]
    MalformedJson(String),
    /// `408 REQUEST_TIMEOUT`: the body had not arrived within this long.
    #[error("the request body did not arrive within {} s", .0.as_secs())]
    BodyTimeout(Duration),
}

impl Rejected {
    fn code(&self) -> &'static str {
        match self {
            Rejected::Key(_) => "VALIDATION_FAILED",
            Rejected::UnsupportedMediaType | Rejected::UnsupportedContentCoding(_) => {
                "UNSUPPORTED_MEDIA_TYPE"
            }
            Rejected::PayloadTooLarge(_) => "PAYLOAD_TOO_LARGE",
            Rejected::MalformedJson(_) => "MALFORMED_JSON",
            Rejected::BodyTimeout(_) => "REQUEST_TIMEOUT",
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Rejected::Key(_) => "Invalid Idempotency-Key",
            Rejected::UnsupportedMediaType | Rejected::UnsupportedContentCoding(_) => {
                "Unsupported media type"
            }
            Rejected::PayloadTooLarge(_) => "Payload too large",
            Rejected::MalformedJson(_) => "Malformed JSON",
            Rejected::BodyTimeout(_) => "Request timeout",
        }
    }
}

impl ResponseError for Rejected {
    fn status_code(&self) -> StatusCode {
        match self {
            Rejected::Key(_) | Rejected::MalformedJson(_) => StatusCode::BAD_REQUEST,
            Rejected::UnsupportedMediaType | Rejected::UnsupportedContentCoding(_) => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            Rejected::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Rejected::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut builder = HttpResponse::build(self.status_code());
        // The rest of a late body may still be on its way: the connection
        // cannot carry another request.
        if matches!(self, Rejected::BodyTimeout(_)) {
            builder.force_close();
        }
        render(
            builder,
            self.status_code(),
            self.code(),
            self.title(),
            &self.to_string(),
        )
    }
}

/// The problem document (RFC 9457) this layer answers with.
#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'a str,
    status: u16,
    detail: &'a str,
    error: &'a str,
}

/// A problem response: `type` is `/problems/` and the code in kebab case.
fn problem(status: StatusCode, code: &str, title: &str, detail: &str) -> HttpResponse {
    render(HttpResponse::build(status), status, code, title, detail)
}

fn render(
    mut builder: actix_web::HttpResponseBuilder,
    status: StatusCode,
    code: &str,
    title: &str,
    detail: &str,
) -> HttpResponse {
    let body = Problem {
        kind: format!("/problems/{}", code.to_ascii_lowercase().replace('_', "-")),
        title,
        status: status.as_u16(),
        detail,
        error: code,
    };
    builder
        .insert_header((header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON)))
        .body(serde_json::to_vec(&body).unwrap_or_default())
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
fn is_json(req: &HttpRequest) -> bool {
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
fn content_coding(req: &HttpRequest) -> Option<String> {
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
    fn caller(self, ledger: &Ledger, user: String) -> Option<Caller> {
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

    /// Runs `mutation` exactly once for this key and user, or answers from
    /// the ledger ([`Ledger::execute`]), and turns what happened into the
    /// response by the module's rule. The mutation's `Err` answers below
    /// `500` are recorded like its `Ok` ones.
    pub async fn execute<E, F>(
        self,
        ledger: &Ledger,
        user: impl Into<String>,
        mutation: F,
    ) -> Result<HttpResponse, LedgerError<E>>
    where
        E: ResponseError + Send + 'static,
        F: FnOnce(&mut LedgerTx<'_, '_>, &Caller) -> Result<Completion, E> + Send + 'static,
    {
        self.run(ledger, user, mutation).await.respond()
    }

    /// [`Idempotent::execute`], handing back what the ledger said before it
    /// is answered (to count outcomes, say): [`Ran::respond`] answers it.
    pub async fn run<E, F>(self, ledger: &Ledger, user: impl Into<String>, mutation: F) -> Ran<E>
    where
        E: ResponseError + Send + 'static,
        F: FnOnce(&mut LedgerTx<'_, '_>, &Caller) -> Result<Completion, E> + Send + 'static,
    {
        let Some(caller) = self.caller(ledger, user.into()) else {
            return Ran::shed();
        };
        let caller = std::sync::Arc::new(caller);
        let unit_caller = std::sync::Arc::clone(&caller);
        let unit = move |tx: &mut LedgerTx<'_, '_>| recorded(mutation(tx, &unit_caller));
        let outcome = ledger.execute(request(&caller), unit).await;
        Ran {
            outcome,
            key: Some(caller.key.clone()),
        }
    }

    /// [`Idempotent::execute`] for a mutation whose whole change is
    /// inserting one row ([`Ledger::execute_insert`]): `make` builds
    /// the row and the response it is recorded with, only for a key the
    /// ledger has no entry for; when the row's unique constraint finds one
    /// already, `found` says what it is (see [`Completion`]).
    pub async fn execute_insert<R, E, M, F>(
        self,
        ledger: &Ledger,
        user: impl Into<String>,
        make: M,
        found: F,
    ) -> Result<HttpResponse, LedgerError<E>>
    where
        R: Row,
        E: ResponseError + Send + 'static,
        M: FnOnce(&Caller) -> (R, RecordedResponse) + Send,
        F: FnOnce(&mut LedgerTx<'_, '_>, &Caller) -> Result<Completion, E> + Send + 'static,
    {
        self.run_insert(ledger, user, make, found).await.respond()
    }

    /// [`Idempotent::execute_insert`], handing back what the ledger said
    /// before it is answered.
    pub async fn run_insert<R, E, M, F>(
        self,
        ledger: &Ledger,
        user: impl Into<String>,
        make: M,
        found: F,
    ) -> Ran<E>
    where
        R: Row,
        E: ResponseError + Send + 'static,
        M: FnOnce(&Caller) -> (R, RecordedResponse) + Send,
        F: FnOnce(&mut LedgerTx<'_, '_>, &Caller) -> Result<Completion, E> + Send + 'static,
    {
        let Some(caller) = self.caller(ledger, user.into()) else {
            return Ran::shed();
        };
        let caller = std::sync::Arc::new(caller);
        let (make_caller, unit_caller) = (
            std::sync::Arc::clone(&caller),
            std::sync::Arc::clone(&caller),
        );
        let make = move || make(&make_caller);
        let found = move |tx: &mut LedgerTx<'_, '_>| recorded(found(tx, &unit_caller));
        let outcome = ledger.execute_insert(request(&caller), make, found).await;
        Ran {
            outcome,
            key: Some(caller.key.clone()),
        }
    }
}

fn request(caller: &Caller) -> LedgerRequest<'_> {
    LedgerRequest {
        user_id: &caller.user,
        key: &caller.key,
        fingerprint: &caller.fingerprint,
    }
}

/// A mutation's answer as the ledger takes it: an error answered below
/// `500` is recorded like a success; a `5xx` rolls back and frees the key.
fn recorded<E: ResponseError>(result: Result<Completion, E>) -> Result<Completion, E> {
    match result {
        Err(e) if !e.status_code().is_server_error() => match to_recorded(e.error_response()) {
            Some(response) => Ok(Completion::Record(response)),
            None => Err(e),
        },
        other => other,
    }
}

/// An HTTP response as the ledger records it (status, the allow-listed
/// headers, the body); `None` for a body that is not in memory.
pub fn to_recorded(response: HttpResponse) -> Option<RecordedResponse> {
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .filter(|(name, _)| RECORDED_HEADERS.contains(&name.as_str()))
        .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_owned())))
        .collect();
    let body = response.into_body().try_into_bytes().ok()?;
    Some(RecordedResponse {
        status,
        headers,
        body: body.to_vec(),
    })
}

/// What the ledger said about one request, before it is answered.
#[derive(Debug)]
pub struct Ran<E> {
    /// The ledger's outcome, or why it could not answer.
    pub outcome: Result<Outcome, LedgerError<E>>,
    /// The request's key (`None` for a request shed before it was read).
    key: Option<IdempotencyKey>,
}

impl<E> Ran<E> {
    fn shed() -> Self {
        Ran {
            outcome: Err(LedgerError::Overloaded),
            key: None,
        }
    }
}

impl<E: ResponseError> Ran<E> {
    /// The response, by the module's rule.
    pub fn respond(self) -> Result<HttpResponse, LedgerError<E>> {
        let key = self.key.as_ref().map_or("", |k| k.as_str());
        match self.outcome? {
            Outcome::Executed(response) => replayable(key, response, false),
            Outcome::Replayed(response) => replayable(key, response, true),
            Outcome::KeyReused => Ok(problem(
                StatusCode::CONFLICT,
                "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD",
                "Idempotency-Key reused",
                "this Idempotency-Key was already used for a different request",
            )),
            Outcome::InProgress => {
                let mut response = problem(
                    StatusCode::CONFLICT,
                    "IDEMPOTENCY_IN_PROGRESS",
                    "Request in progress",
                    "a request with this Idempotency-Key is still being processed",
                );
                retry_after(&mut response, IN_PROGRESS_RETRY_AFTER);
                Ok(response)
            }
        }
    }
}

fn retry_after(response: &mut HttpResponse, seconds: u32) {
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    headers.insert(
        HeaderName::from_static(SHOULD_RETRY_HEADER),
        HeaderValue::from_static("true"),
    );
}

/// A recorded response as an HTTP answer; a replay says so, and a
/// recorded `201` replays as `200`. What the HTTP library refuses (the
/// ledger hands over only what reads back as recorded) is a defect, never
/// a made-up answer.
fn replayable<E>(
    key: &str,
    response: RecordedResponse,
    replayed: bool,
) -> Result<HttpResponse, LedgerError<E>> {
    let unreplayable = |cause: String| LedgerError::Unreplayable {
        key: key.to_owned(),
        cause: Unreplayable(cause),
    };
    let status = StatusCode::from_u16(response.status)
        .map_err(|_| unreplayable(format!("status {}", response.status)))?;
    let status = match replayed && status == StatusCode::CREATED {
        true => StatusCode::OK,
        false => status,
    };
    let mut builder = HttpResponse::build(status);
    for (name, value) in &response.headers {
        let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::from_str(value),
        ) else {
            return Err(unreplayable(format!("header {name:?}")));
        };
        builder.append_header((name, value));
    }
    if replayed {
        builder.insert_header((REPLAYED_HEADER, "true"));
    }
    Ok(builder.body(response.body))
}

impl<E: ResponseError> ResponseError for LedgerError<E> {
    fn status_code(&self) -> StatusCode {
        match self {
            LedgerError::Overloaded | LedgerError::Unavailable(_) | LedgerError::LeaseExpired => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            LedgerError::Database(_)
            | LedgerError::Internal(_)
            | LedgerError::Unreplayable { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            LedgerError::Operation(e) => e.status_code(),
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            LedgerError::Operation(e) => e.error_response(),
            LedgerError::Overloaded => unavailable(
                "the service is handling as many writes as it admits at once; retry shortly",
            ),
            LedgerError::Unavailable(cause) => {
                tracing::warn!(cause = %crate::db::one_line(cause), "database unavailable");
                unavailable("the service is temporarily unavailable")
            }
            LedgerError::LeaseExpired => {
                tracing::warn!("a unit ran past its lease and was rolled back");
                unavailable("the service is temporarily unavailable")
            }
            LedgerError::Unreplayable { key, cause } => {
                tracing::error!(key = key.as_str(), %cause, "a recorded response cannot be replayed");
                internal()
            }
            LedgerError::Database(e) => {
                tracing::error!(cause = %crate::db::one_line(&e.to_string()), "request failed");
                internal()
            }
            LedgerError::Internal(cause) => {
                tracing::error!(cause = %crate::db::one_line(cause), "request failed");
                internal()
            }
        }
    }
}

fn unavailable(detail: &str) -> HttpResponse {
    let mut response = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "SERVICE_UNAVAILABLE",
        "Service unavailable",
        detail,
    );
    retry_after(&mut response, UNAVAILABLE_RETRY_AFTER);
    response
}

fn internal() -> HttpResponse {
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "INTERNAL_ERROR",
        "Internal server error",
        "an internal error occurred",
    )
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

    fn answered(outcome: Result<Outcome, LedgerError<Rejected>>) -> HttpResponse {
        let ran = Ran {
            outcome,
            key: IdempotencyKey::parse(b"k").ok(),
        };
        ran.respond().unwrap_or_else(|e| e.error_response())
    }

    fn header<'r>(response: &'r HttpResponse, name: &str) -> Option<&'r str> {
        response.headers().get(name).and_then(|v| v.to_str().ok())
    }

    fn code(response: HttpResponse) -> String {
        let body = response.into_body().try_into_bytes().unwrap_or_default();
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        problem["error"].as_str().unwrap_or_default().to_owned()
    }

    #[test]
    fn every_refusal_and_error_is_answered_by_the_one_rule() {
        let unreplayable = LedgerError::Unreplayable {
            key: "k".into(),
            cause: Unreplayable("status 0".into()),
        };
        for (outcome, status, retry_after, code_expected) in [
            (
                Ok(Outcome::KeyReused),
                409,
                None,
                "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD",
            ),
            (
                Ok(Outcome::InProgress),
                409,
                Some("1"),
                "IDEMPOTENCY_IN_PROGRESS",
            ),
            (
                Err(LedgerError::Overloaded),
                503,
                Some("2"),
                "SERVICE_UNAVAILABLE",
            ),
            (
                Err(LedgerError::Unavailable("gone".into())),
                503,
                Some("2"),
                "SERVICE_UNAVAILABLE",
            ),
            (
                Err(LedgerError::LeaseExpired),
                503,
                Some("2"),
                "SERVICE_UNAVAILABLE",
            ),
            (
                Err(LedgerError::Database(diesel::result::Error::NotFound)),
                500,
                None,
                "INTERNAL_ERROR",
            ),
            (
                Err(LedgerError::Internal("lost".into())),
                500,
                None,
                "INTERNAL_ERROR",
            ),
            (Err(unreplayable), 500, None, "INTERNAL_ERROR"),
            (
                Err(LedgerError::Operation(Rejected::UnsupportedMediaType)),
                415,
                None,
                "UNSUPPORTED_MEDIA_TYPE",
            ),
        ] {
            let response = answered(outcome);
            assert_eq!(response.status().as_u16(), status, "{code_expected}");
            assert_eq!(
                header(&response, "retry-after"),
                retry_after,
                "{code_expected}"
            );
            let should_retry = retry_after.map(|_| "true");
            assert_eq!(
                header(&response, SHOULD_RETRY_HEADER),
                should_retry,
                "{code_expected}"
            );
            assert_eq!(header(&response, "content-type"), Some(PROBLEM_JSON));
            assert_eq!(code(response), code_expected);
        }
    }

    #[test]
    fn a_recorded_201_replays_as_200_with_its_headers_and_body() {
        let recorded = RecordedResponse {
            status: 201,
            headers: vec![
                ("Location".into(), "/x/1".into()),
                ("Content-Type".into(), "application/json".into()),
            ],
            body: b"{}".to_vec(),
        };
        let first = answered(Ok(Outcome::Executed(recorded.clone())));
        assert_eq!(first.status(), StatusCode::CREATED);
        assert_eq!(header(&first, "idempotent-replayed"), None);
        let replay = answered(Ok(Outcome::Replayed(recorded)));
        assert_eq!(replay.status(), StatusCode::OK);
        assert_eq!(header(&replay, "idempotent-replayed"), Some("true"));
        assert_eq!(header(&replay, "location"), Some("/x/1"));
        assert_eq!(header(&replay, "content-type"), Some("application/json"));
        assert_eq!(
            replay.into_body().try_into_bytes().ok().as_deref(),
            Some(&b"{}"[..])
        );
    }

    #[test]
    fn a_mutations_answer_below_500_is_recorded_and_a_5xx_is_not() {
        let small = recorded::<Rejected>(Err(Rejected::PayloadTooLarge(1)));
        match small {
            Ok(Completion::Record(r)) => {
                assert_eq!(r.status, 413);
                assert_eq!(
                    r.headers,
                    [("content-type".to_owned(), PROBLEM_JSON.to_owned())]
                );
            }
            other => panic!("{other:?}"),
        }
        let failed = recorded::<LedgerError<Rejected>>(Err(LedgerError::Internal("x".into())));
        assert!(failed.is_err());
    }
}
