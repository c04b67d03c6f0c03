//! The offline-first client: a durable outbox in a local SQLite file, and a
//! drainer that sends what it holds, each operation with its stored
//! `Idempotency-Key` (see `docs/CLIENT.md`).
//!
//! - [`outbox`]: [`Outbox::enqueue`] stores an operation with a fresh key and
//!   fsyncs before it returns; [`Outbox::claim`] leases the next one that may
//!   be sent; [`Outbox::record`] keeps its definitive answer;
//! - [`stored`]: what the client reads back (an order id, an answer's
//!   order, an outbox row), each into a type that holds only what the client
//!   writes;
//! - [`drain`]: [`Sender`] sends one operation once, or drains the outbox,
//!   retrying with full-jitter backoff;
//! - [`command`]: `orders-api client create|update|cancel|sync|status` (the server binary offers these commands by depending on this crate).
//!
//! The client shares nothing with the server's storage: its outbox has its
//! own schema (`migrations/`) and it never opens `DATABASE_URL`.

pub mod command;
pub mod drain;
#[doc(hidden)]
pub mod invariants;
pub mod outbox;
mod schema;
pub mod stored;

pub use drain::{Drained, SendError, Sender, Server};
pub use outbox::{NewOperation, Outbox, OutboxError, Outcome};
pub use stored::{Method, Operation, OrderId, State, Target};
