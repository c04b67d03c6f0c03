//! orders-api: a reference implementation of the `Idempotency-Key` pattern.
//!
//! - [`idempotency`]: the generic ledger (knows nothing of orders);
//! - [`orders`]: the orders domain;
//! - [`http`]: routes, authentication, bodies, errors;
//! - [`db`]: backends, pool, migrations; [`auth`]: API keys;
//! - [`client`]: the offline-first client (an outbox drained with stored keys);
//! - [`config`], [`cli`], [`startup`], [`telemetry`]: the process around them;
//! - [`atk`]: the attack scenarios, run against any deployment (`orders-api atk`).

pub mod atk;
pub mod auth;
pub mod cli;
pub mod client;
pub mod config;
pub mod db;
pub mod http;
pub mod idempotency;
#[doc(hidden)]
pub mod invariants;
pub mod orders;
#[cfg(test)]
mod properties;
pub mod startup;
pub mod telemetry;
