//! orders-api: a reference implementation of the `Idempotency-Key` pattern.
//!
//! - [`orders`]: the orders domain, whose mutations run inside the
//!   idempotency ledger ([`idempotency_ledger`], a crate of its own under
//!   `crates/`, which knows nothing of orders);
//! - [`http`]: routes, authentication, bodies, errors, and the one way a
//!   mutating route runs ([`http::mutation`]);
//! - [`db`]: which backend, migrations, the server's tables; [`auth`]: API keys;
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
#[cfg(any(test, feature = "invariants"))]
pub mod invariants;
pub mod orders;
#[cfg(test)]
mod properties;
pub mod startup;
pub mod telemetry;
