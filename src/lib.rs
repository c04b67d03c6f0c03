//! orders-api: a reference implementation of the `Idempotency-Key` pattern.
//!
//! - [`idempotency`]: the generic ledger (knows nothing of orders);
//! - [`orders`]: the orders domain;
//! - [`http`]: routes, authentication, bodies, errors;
//! - [`db`]: backends, pool, migrations; [`auth`]: API keys;
//! - [`cli`] (the commands and their arguments), [`commands`] (what each
//!   does), [`config`] (the server's settings), [`startup`], [`telemetry`]:
//!   the process around them.
//!
//! The offline-first client (`orders-api client`) and the attack runner
//! (`orders-api atk`) are crates of their own, `orders_client` and
//! `orders_atk` (under `crates/`): they share no code with the server.

pub mod auth;
pub mod cli;
pub mod commands;
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
