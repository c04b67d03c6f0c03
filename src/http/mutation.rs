//! The one way a mutating route runs: every `POST`, `PATCH` and `DELETE`
//! handler takes the ledger crate's [`Idempotent`] extractor and hands its
//! work to [`execute`] (or its row to [`execute_insert`]), which runs it
//! inside the idempotency ledger and answers by the crate's rule
//! (`idempotency_ledger::actix`). The work receives a [`LedgerTx`], which
//! only the ledger can make, and the orders domain's mutations require one,
//! while its storage functions are private to it: a route that changed an
//! order without the ledger would not compile (short of writing its own SQL
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
//! checks, in order"): auth (middleware, then the [`AuthUser`] extractor,
//! before [`Idempotent`]), the key, media type, size and JSON syntax (the
//! extractor, with this server's body limit: [`IdempotentConfig`] in
//! `startup.rs`), then the route's body validation, then the ledger. The
//! handler awaits the ledger: a request waiting for its key, or for the
//! SQLite writer, holds no thread. The request's fingerprint is computed
//! last, once the ledger would not shed the request on arrival (every
//! write slot taken): a shed request never hashes its body.

use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpMessage, HttpRequest, HttpResponse};
use idempotency_ledger::actix::{Caller, Idempotent};
use idempotency_ledger::row::Row;
use idempotency_ledger::{Completion, LedgerError, LedgerTx, Outcome, RecordedResponse};
use serde::Serialize;

pub use idempotency_ledger::actix::{IdempotentConfig, REPLAYED_HEADER};

use super::AppState;
use super::auth::AuthUser;
use super::error::{ApiError, instance_of};
use crate::telemetry::RequestId;

/// A route's change: run once for a fresh key, inside the ledger's unit of
/// writing (on the SQLite writer's thread, or a blocking thread on
/// PostgreSQL).
pub trait Work:
    FnOnce(&mut LedgerTx<'_, '_>, &Caller) -> Result<Completion, ApiError> + Send + 'static
{
}

impl<F> Work for F where
    F: FnOnce(&mut LedgerTx<'_, '_>, &Caller) -> Result<Completion, ApiError> + Send + 'static
{
}

/// Runs `work` exactly once for this key, or answers from the ledger.
/// `work`'s errors below 500 are recorded like any other answer (a problem
/// naming this request in its `instance`); a 5xx rolls back and leaves the
/// key free.
pub async fn execute<F: Work>(
    req: &HttpRequest,
    user: AuthUser,
    idem: Idempotent,
    state: &AppState,
    work: F,
) -> actix_web::Result<HttpResponse> {
    let instance = instance(req);
    let unit = move |tx: &mut LedgerTx<'_, '_>, caller: &Caller| {
        recorded(work(tx, caller), instance.as_deref())
    };
    let ran = idem.run(&state.ledger, user.0, unit).await;
    count(&ran.outcome);
    Ok(ran.respond()?)
}

/// [`execute`] for a route whose whole change is inserting a row (see
/// [`Idempotent::execute_insert`]): `make` builds the row and the answer
/// it is recorded with, and runs only when the key has no entry yet (a
/// replay builds neither); the ledger writes the row itself, and on
/// PostgreSQL a fresh key then costs one statement after the read. When
/// the row exists already (its unique constraint), `found` says what that
/// means.
pub async fn execute_insert<R, M, F>(
    req: &HttpRequest,
    user: AuthUser,
    idem: Idempotent,
    state: &AppState,
    make: M,
    found: F,
) -> actix_web::Result<HttpResponse>
where
    R: Row,
    M: FnOnce(&Caller) -> (R, RecordedResponse) + Send,
    F: Work,
{
    let instance = instance(req);
    let found = move |tx: &mut LedgerTx<'_, '_>, caller: &Caller| {
        recorded(found(tx, caller), instance.as_deref())
    };
    let ran = idem.run_insert(&state.ledger, user.0, make, found).await;
    count(&ran.outcome);
    Ok(ran.respond()?)
}

/// The `instance` of a problem answering this request (`None` outside the
/// server's middleware, which names every problem on its way out).
fn instance(req: &HttpRequest) -> Option<String> {
    req.extensions()
        .get::<RequestId>()
        .map(|id| instance_of(&id.0))
}

/// A route's answer as the ledger takes it: every answer below 500 is
/// recorded like a success, a problem with its `instance` naming this
/// request (a replay is the recorded answer byte for byte); a 5xx rolls
/// back and leaves the key free.
fn recorded(
    result: Result<Completion, ApiError>,
    instance: Option<&str>,
) -> Result<Completion, ApiError> {
    match result {
        Err(e) if !e.status().is_server_error() => Ok(Completion::Record(e.to_recorded(instance))),
        other => other,
    }
}

/// Counts what the ledger said: its outcome, a lease that ran out, a
/// request shed because every write slot was taken.
fn count(outcome: &Result<Outcome, LedgerError<ApiError>>) {
    match outcome {
        Ok(outcome) => crate::telemetry::idempotency_outcome(outcome.label()),
        Err(LedgerError::LeaseExpired) => crate::telemetry::idempotency_outcome("lease_expired"),
        Err(LedgerError::Overloaded) => {
            metrics::counter!("orders_api_writes_shed_total").increment(1);
        }
        Err(_) => {}
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

/// The request's body as this server reads it: the value `serde_json`
/// builds with its exact numbers (the extractor checked the syntax and the
/// member names already).
pub fn json(idem: &Idempotent) -> Result<serde_json::Value, ApiError> {
    super::body::parse_json(idem.body())
}
