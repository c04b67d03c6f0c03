//! The integration suite: the real server, over HTTP, against a real
//! database (a fresh one per test), on SQLite and PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod abuse;
mod atk;
mod atk_broken;
mod atk_command;
mod auth;
mod bodies;
mod bounds;
mod chaos;
mod cli;
mod client;
mod client_retries;
mod crash;
mod database;
mod docs;
mod expect;
mod failover;
mod group_commit;
mod helpers;
mod idempotency;
mod lease;
mod multiprocess;
mod net;
mod openapi;
mod operability;
mod orders;
mod outage;
mod problems;
mod process;
mod proxy;
mod race;
mod row_paths;
mod schema_parity;
mod seams;
mod settings;
mod shutdown;
mod smoke;
mod statements;
mod web_app;
mod writer_bounds;
