//! The integration suite: the real server, over HTTP, against a real
//! database (a fresh one per test), on SQLite and PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod helpers;
mod smoke;
mod openapi;
