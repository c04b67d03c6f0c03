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
//!
//! # Its parts
//!
//! - `extract.rs`: [`Idempotent`], its settings ([`IdempotentConfig`],
//!   [`Body`]) and the checks it runs before the ledger, in the order above;
//!   [`Caller`], what a mutation is handed.
//! - `answer.rs`: the rule — [`Idempotent::execute`] and its kin, [`Ran`],
//!   [`to_recorded`], and `LedgerError`'s `ResponseError`.
//! - `problem.rs`: [`Rejected`], and the problem document every refusal
//!   and error of this layer is written as.
//!
//! [`IdempotencyKey`]: crate::IdempotencyKey
//! [`Outcome::Executed`]: crate::Outcome::Executed
//! [`Outcome::Replayed`]: crate::Outcome::Replayed
//! [`Outcome::KeyReused`]: crate::Outcome::KeyReused
//! [`Outcome::InProgress`]: crate::Outcome::InProgress
//! [`LedgerError::Overloaded`]: crate::LedgerError::Overloaded
//! [`LedgerError::Unavailable`]: crate::LedgerError::Unavailable
//! [`LedgerError::LeaseExpired`]: crate::LedgerError::LeaseExpired
//! [`LedgerError::Database`]: crate::LedgerError::Database
//! [`LedgerError::Internal`]: crate::LedgerError::Internal
//! [`LedgerError::Unreplayable`]: crate::LedgerError::Unreplayable
//! [`LedgerError::Operation`]: crate::LedgerError::Operation

mod answer;
mod extract;
mod problem;
#[cfg(test)]
mod tests;

pub use answer::{Ran, to_recorded};
pub use extract::{Body, Caller, Idempotent, IdempotentConfig, is_json_media_type};
pub use problem::Rejected;

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
