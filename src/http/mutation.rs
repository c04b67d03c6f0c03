//! The one way a mutating route runs: every `POST`, `PATCH` and `DELETE`
//! handler builds a [`Mutation`] and hands its work to [`Mutation::execute`],
//! which runs it inside the idempotency ledger. The work receives a
//! [`LedgerTx`], which only the ledger can make, and the orders domain's
//! mutations require one, while its storage functions are private to it: a
//! route that changed an order without the ledger would not compile (short
//! of writing its own SQL against the schema).
//!
//! ```compile_fail,E0451
//! // A `LedgerTx` cannot be made outside the ledger.
//! fn forge<'t, 'c>(conn: &'t mut orders_api::db::Conn<'c>) -> orders_api::idempotency::LedgerTx<'t, 'c> {
//!     orders_api::idempotency::LedgerTx { conn }
//! }
//! ```
//!
//! Checks run in the order of SPEC §4: auth (middleware, before this), the
//! key, media type, size and JSON syntax, then the route's body validation,
//! then the ledger.

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, web};
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use serde::Serialize;
use serde_json::Value;

use super::AppState;
use super::auth::AuthUser;
use super::body::{is_json, parse_json, read_limited};
use super::error::ApiError;
use crate::idempotency::{
    Completion, Fingerprint, IdempotencyKey, LedgerError, LedgerRequest, LedgerTx, Outcome,
    RecordedResponse,
};

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
}

/// A route's change: run once for a fresh key, inside the ledger's
/// transaction, on a blocking thread.
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
    ctx: MutationCtx,
    json: Value,
}

impl Mutation {
    pub async fn prepare(
        req: &HttpRequest,
        payload: web::Payload,
        state: &AppState,
        rule: BodyRule,
    ) -> Result<Self, ApiError> {
        let user = req.extensions_user()?;
        let key = IdempotencyKey::from_headers(req.headers())?;
        if rule == BodyRule::Json && !is_json(req) {
            return Err(ApiError::UnsupportedMediaType);
        }
        let bytes = read_limited(req, payload, state.max_body_bytes).await?;
        let json = match rule {
            BodyRule::Optional if bytes.is_empty() => None,
            BodyRule::Optional if !is_json(req) => return Err(ApiError::UnsupportedMediaType),
            _ => Some(parse_json(&bytes)?),
        };
        let fingerprint = Fingerprint::of(req.method().as_str(), req.path(), &bytes, json.as_ref());
        Ok(Self {
            ctx: MutationCtx {
                user_id: user.0,
                key,
                fingerprint,
            },
            json: json.unwrap_or(Value::Null),
        })
    }

    /// The parsed body (`null` when there was none).
    pub fn json(&self) -> &Value {
        &self.json
    }

    /// Who is asking, with which key, for which request.
    pub fn ctx(&self) -> &MutationCtx {
        &self.ctx
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
        self.run(state, None::<(NoInsert, RecordedResponse)>, work)
            .await
    }

    /// [`Mutation::execute`] for a route whose whole change is `change`, one
    /// `INSERT` answered `response` (see
    /// [`Ledger::execute_insert`](crate::idempotency::Ledger::execute_insert)):
    /// on PostgreSQL a fresh key then costs one statement after the read.
    /// `work` makes the same change, for whatever that statement leaves
    /// undecided, and on SQLite.
    pub async fn execute_insert<C, F>(
        self,
        state: web::Data<AppState>,
        change: C,
        response: RecordedResponse,
        work: F,
    ) -> Result<HttpResponse, ApiError>
    where
        C: QueryFragment<Pg> + QueryId + Send + 'static,
        F: Work,
    {
        self.run(state, Some((change, response)), work).await
    }

    async fn run<C, F>(
        self,
        state: web::Data<AppState>,
        insert: Option<(C, RecordedResponse)>,
        work: F,
    ) -> Result<HttpResponse, ApiError>
    where
        C: QueryFragment<Pg> + QueryId + Send + 'static,
        F: Work,
    {
        let ctx = self.ctx;
        // Admitted before any blocking thread or connection is taken; the
        // slot is held until the blocking work ends.
        let Some(admitted) = state.admission.try_admit() else {
            metrics::counter!("orders_api_writes_shed_total").increment(1);
            return Err(ApiError::Overloaded);
        };
        // One trip to the blocking pool: the ledger's pre-read and, for a
        // new key, the wait for the unit's commit.
        let outcome = web::block(move || {
            let _admitted = admitted;
            let _connection = match &state.write_connections {
                Some(share) => Some(share.acquire(state.connection_timeout).ok_or_else(|| {
                    LedgerError::Unavailable("no write connection came free".into())
                })?),
                None => None,
            };
            let request = LedgerRequest {
                user_id: &ctx.user_id,
                key: &ctx.key,
                fingerprint: &ctx.fingerprint,
            };
            let unit_ctx = ctx.clone();
            let unit = move |tx: &mut LedgerTx<'_, '_>| match work(tx, &unit_ctx) {
                Err(e) if !e.status().is_server_error() => Ok(Completion::Record(e.to_recorded())),
                other => other,
            };
            match insert {
                Some((change, response)) => {
                    state
                        .ledger
                        .execute_insert(&state.pool, request, &change, response, unit)
                }
                None => state.ledger.execute(&state.pool, request, unit),
            }
        })
        .await?
        .inspect_err(|e| {
            if matches!(e, LedgerError::LeaseExpired) {
                crate::telemetry::idempotency_outcome("lease_expired");
            }
        })?;
        crate::telemetry::idempotency_outcome(outcome.label());
        match outcome {
            Outcome::Executed(response) => Ok(to_http(response, false)),
            Outcome::Replayed(response) => Ok(to_http(response, true)),
            Outcome::KeyReused => Err(ApiError::KeyReused),
            Outcome::InProgress => Err(ApiError::InProgress),
        }
    }
}

/// The change of a route without a one-statement form.
struct NoInsert;

impl QueryId for NoInsert {
    type QueryId = Self;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl QueryFragment<Pg> for NoInsert {
    fn walk_ast<'b>(&'b self, _: AstPass<'_, 'b, Pg>) -> diesel::QueryResult<()> {
        Err(diesel::result::Error::QueryBuilderError(
            "this route has no one-statement change".into(),
        ))
    }
}

trait ExtensionsUser {
    fn extensions_user(&self) -> Result<AuthUser, ApiError>;
}

impl ExtensionsUser for HttpRequest {
    fn extensions_user(&self) -> Result<AuthUser, ApiError> {
        use actix_web::HttpMessage;
        self.extensions()
            .get::<AuthUser>()
            .cloned()
            .ok_or(ApiError::Unauthorized)
    }
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

fn to_http(response: RecordedResponse, replayed: bool) -> HttpResponse {
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::OK);
    // The retry created nothing: a recorded 201 comes back as 200.
    let status = if replayed && status == StatusCode::CREATED {
        StatusCode::OK
    } else {
        status
    };
    let mut builder = HttpResponse::build(status);
    for (name, value) in &response.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::from_str(value),
        ) {
            builder.append_header((name, value));
        }
    }
    if replayed {
        builder.insert_header((REPLAYED_HEADER, "true"));
    }
    builder.body(response.body)
}
