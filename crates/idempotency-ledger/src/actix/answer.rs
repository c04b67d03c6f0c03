//! The rule: a mutation run through the ledger, and every answer the
//! ledger gives ([`Outcome`], [`LedgerError`]) turned into its response.

use actix_web::body::MessageBody;
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::{HttpResponse, ResponseError};

use super::problem::problem;
use super::{
    Caller, IN_PROGRESS_RETRY_AFTER, Idempotent, REPLAYED_HEADER, SHOULD_RETRY_HEADER,
    UNAVAILABLE_RETRY_AFTER,
};
use crate::row::Row;
use crate::{
    Completion, IdempotencyKey, Ledger, LedgerError, LedgerRequest, LedgerTx, Outcome,
    RECORDED_HEADERS, RecordedResponse, Unreplayable,
};

impl Idempotent {
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
pub(super) fn recorded<E: ResponseError>(result: Result<Completion, E>) -> Result<Completion, E> {
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
    pub(super) key: Option<IdempotencyKey>,
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
