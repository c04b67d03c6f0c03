//! The one way a mutating route runs: every `POST`, `PATCH` and `DELETE`
//! handler builds a [`Mutation`] and hands its work to [`Mutation::execute`]
//! (or its row to [`Mutation::execute_insert`]), which runs it inside the
//! idempotency ledger. The work receives a [`LedgerTx`], which only the
//! ledger can make, and the orders domain's mutations require one, while its
//! storage functions are private to it: a route that changed an order
//! without the ledger would not compile (short of writing its own SQL
//! against the schema).
//!
//! ```compile_fail,E0451
//! // A `LedgerTx` cannot be made outside the ledger.
//! fn forge<'t, 'c>(conn: &'t mut orders_api::db::Conn<'c>) -> idempotency_ledger::LedgerTx<'t, 'c> {
//!     idempotency_ledger::LedgerTx { conn }
//! }
//! ```
//!
//! Checks run in the order of the contract (`docs/CONTRACT.md`, "The
//! checks, in order"): auth (middleware, before this), the key, media type,
//! size and JSON syntax, then the route's body validation, then the ledger.
//! The handler awaits the ledger: a request waiting for its key, or for the
//! SQLite writer, holds no thread. The request's fingerprint is computed
//! last, once the ledger would not shed the request on arrival (every write
//! slot taken): a shed request never hashes its body.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use idempotency_ledger::row::Row;
use idempotency_ledger::{
    Completion, Fingerprint, IdempotencyKey, LedgerError, LedgerRequest, LedgerTx, Outcome,
    RecordedResponse,
};
use serde::Serialize;
use serde_json::Value;

use super::AppState;
use super::auth::AuthUser;
use super::body::{content_coding, is_json, parse_json, read_limited};
use super::error::{ApiError, instance_of};
use crate::telemetry::RequestId;

/// Sent on every answer that an earlier request produced.
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";

/// What a route expects of its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRule {
    /// A JSON body is required (`POST`, `PATCH`).
    Json,
    /// No body is needed; one that is sent must be JSON (`DELETE`).
    Optional,
}

/// Who is asking, with which key, for which request.
#[derive(Debug, Clone)]
pub struct MutationCtx {
    pub user_id: String,
    pub key: IdempotencyKey,
    pub fingerprint: Fingerprint,
    /// The `instance` of a problem answering this request (`None` outside
    /// the server's middleware, which names every problem on its way out).
    pub instance: Option<String>,
}

/// A route's change: run once for a fresh key, inside the ledger's unit of
/// writing (on the SQLite writer's thread, or a blocking thread on
/// PostgreSQL).
pub trait Work:
    FnOnce(&mut LedgerTx<'_, '_>, &MutationCtx) -> Result<Completion, ApiError> + Send + 'static
{
}

impl<F> Work for F where
    F: FnOnce(&mut LedgerTx<'_, '_>, &MutationCtx) -> Result<Completion, ApiError> + Send + 'static
{
}

/// A mutating request that passed every check before the ledger.
#[derive(Debug)]
pub struct Mutation {
    user_id: String,
    key: IdempotencyKey,
    /// The request, for its method and path (the fingerprint's).
    req: HttpRequest,
    bytes: web::Bytes,
    json: Option<Value>,
}

/// What [`Mutation::json`] is without a body.
static NO_BODY: Value = Value::Null;

impl Mutation {
    pub async fn prepare(
        req: &HttpRequest,
        payload: web::Payload,
        state: &AppState,
        rule: BodyRule,
    ) -> Result<Self, ApiError> {
        let user = req
            .extensions()
            .get::<AuthUser>()
            .cloned()
            .ok_or(ApiError::Unauthorized)?;
        let key = IdempotencyKey::from_values(
            req.headers()
                .get_all(idempotency_ledger::HEADER)
                .map(|v| v.as_bytes()),
        )?;
        if rule == BodyRule::Json && !is_json(req) {
            return Err(ApiError::UnsupportedMediaType);
        }
        if let Some(coding) = content_coding(req) {
            return Err(ApiError::UnsupportedContentCoding(coding));
        }
        let bytes = read_limited(req, payload, state.max_body_bytes).await?;
        let json = match rule {
            BodyRule::Optional if bytes.is_empty() => None,
            BodyRule::Optional if !is_json(req) => return Err(ApiError::UnsupportedMediaType),
            _ => Some(parse_json(&bytes)?),
        };
        Ok(Self {
            user_id: user.0,
            key,
            req: req.clone(),
            bytes,
            json,
        })
    }

    /// The parsed body (`null` when there was none).
    pub fn json(&self) -> &Value {
        self.json.as_ref().unwrap_or(&NO_BODY)
    }

    /// Who is asking, with which key, for which request: the fingerprint
    /// computed now. `Err(Overloaded)` instead while every write slot of the
    /// process is taken — the ledger would shed the request on arrival
    /// anyway (`Ledger::execute`'s first step), and a shed request should
    /// cost as little as it can.
    fn into_ctx(self, state: &AppState) -> Result<MutationCtx, ApiError> {
        if state.ledger.admission().is_full() {
            return Err(shed());
        }
        let fingerprint = Fingerprint::of(
            self.req.method().as_str(),
            self.req.path(),
            &self.bytes,
            self.json.as_ref(),
        );
        let instance = self
            .req
            .extensions()
            .get::<RequestId>()
            .map(|id| instance_of(&id.0));
        Ok(MutationCtx {
            user_id: self.user_id,
            key: self.key,
            fingerprint,
            instance,
        })
    }

    /// Runs `work` exactly once for this key, or answers from the ledger.
    /// `work`'s errors below 500 are recorded like any other answer; a 5xx
    /// rolls back and leaves the key free.
    pub async fn execute<F>(
        self,
        state: web::Data<AppState>,
        work: F,
    ) -> Result<HttpResponse, ApiError>
    where
        F: Work,
    {
        let ctx = Arc::new(self.into_ctx(&state)?);
        let unit_ctx = Arc::clone(&ctx);
        let unit = move |tx: &mut LedgerTx<'_, '_>| recorded(work(tx, &unit_ctx), &unit_ctx);
        let outcome = state.ledger.execute(ledger_request(&ctx), unit).await;
        answer(&ctx, outcome)
    }

    /// [`Mutation::execute`] for a route whose whole change is inserting a
    /// row (see
    /// [`Ledger::execute_insert`](idempotency_ledger::Ledger::execute_insert)):
    /// `make` builds the row and the answer it is recorded with, and runs
    /// only when the key has no entry yet (a replay builds neither); the
    /// ledger writes the row itself, and on PostgreSQL a fresh key then
    /// costs one statement after the read. When the row exists already (its
    /// unique constraint), `found` says what that means.
    pub async fn execute_insert<R, M, F>(
        self,
        state: web::Data<AppState>,
        make: M,
        found: F,
    ) -> Result<HttpResponse, ApiError>
    where
        R: Row,
        M: FnOnce(&MutationCtx) -> (R, RecordedResponse) + Send,
        F: Work,
    {
        let ctx = Arc::new(self.into_ctx(&state)?);
        let (make_ctx, unit_ctx) = (Arc::clone(&ctx), Arc::clone(&ctx));
        let make = move || make(&make_ctx);
        let found = move |tx: &mut LedgerTx<'_, '_>| recorded(found(tx, &unit_ctx), &unit_ctx);
        let outcome = state
            .ledger
            .execute_insert(ledger_request(&ctx), make, found)
            .await;
        answer(&ctx, outcome)
    }
}

fn ledger_request(ctx: &MutationCtx) -> LedgerRequest<'_> {
    LedgerRequest {
        user_id: &ctx.user_id,
        key: &ctx.key,
        fingerprint: &ctx.fingerprint,
    }
}

/// A route's answer as the ledger takes it: every answer below 500 is
/// recorded like a success, a problem with its `instance` naming this
/// request (a replay is the recorded answer byte for byte); a 5xx rolls back
/// and leaves the key free.
fn recorded(
    result: Result<Completion, ApiError>,
    ctx: &MutationCtx,
) -> Result<Completion, ApiError> {
    match result {
        Err(e) if !e.status().is_server_error() => {
            Ok(Completion::Record(e.to_recorded(ctx.instance.as_deref())))
        }
        other => other,
    }
}

/// The ledger's outcome as an HTTP answer.
fn answer(
    ctx: &MutationCtx,
    outcome: Result<Outcome, LedgerError<ApiError>>,
) -> Result<HttpResponse, ApiError> {
    let outcome = outcome.map_err(|e| match e {
        LedgerError::LeaseExpired => {
            crate::telemetry::idempotency_outcome("lease_expired");
            ApiError::from(e)
        }
        LedgerError::Overloaded => shed(),
        e => ApiError::from(e),
    })?;
    crate::telemetry::idempotency_outcome(outcome.label());
    match outcome {
        Outcome::Executed(response) => to_http(ctx, response, false),
        Outcome::Replayed(response) => to_http(ctx, response, true),
        Outcome::KeyReused => Err(ApiError::KeyReused),
        Outcome::InProgress => Err(ApiError::InProgress),
    }
}

/// A request shed because every write slot is taken: `503`, counted.
fn shed() -> ApiError {
    metrics::counter!("orders_api_writes_shed_total").increment(1);
    ApiError::Overloaded
}

/// A JSON answer as the ledger records it.
pub fn json_reply(
    status: StatusCode,
    body: &impl Serialize,
    location: Option<String>,
) -> RecordedResponse {
    let mut headers = vec![(
        header::CONTENT_TYPE.to_string(),
        "application/json".to_owned(),
    )];
    if let Some(location) = location {
        headers.push((header::LOCATION.to_string(), location));
    }
    RecordedResponse {
        status: status.as_u16(),
        headers,
        body: serde_json::to_vec(body).unwrap_or_default(),
    }
}

/// A recorded response as an HTTP answer. The ledger hands over only what
/// reads back as recorded (a status in 100–599, header lines that decode);
/// a header the HTTP library still refuses is answered `500`, logged with
/// its key — never a made-up answer.
fn to_http(
    ctx: &MutationCtx,
    response: RecordedResponse,
    replayed: bool,
) -> Result<HttpResponse, ApiError> {
    let unreplayable = |cause: String| {
        tracing::error!(key = ctx.key.as_str(), user = %ctx.user_id, %cause,
            "a recorded response cannot be replayed");
        ApiError::Internal(cause)
    };
    let status = StatusCode::from_u16(response.status)
        .map_err(|_| unreplayable(format!("status {}", response.status)))?;
    // The retry created nothing: a recorded 201 comes back as 200.
    let status = if replayed && status == StatusCode::CREATED {
        StatusCode::OK
    } else {
        status
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
