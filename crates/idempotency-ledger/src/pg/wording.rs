//! PostgreSQL's wording of the two failures that decide an answer and have
//! no SQLSTATE in diesel: `55P03` (our `lock_timeout`) and `57014` (our
//! `statement_timeout`), learned from the server in its own language when
//! a pool is built (see `failure.rs`).

use std::sync::RwLock;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::sql_types::BigInt;

/// Which of the two a message words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wording {
    /// `lock_timeout` fired.
    LockTimeout,
    /// `statement_timeout` fired.
    StatementTimeout,
}

/// Primary messages of PostgreSQL failures, as servers this process talks
/// to word them (one entry per language seen).
static PG_WORDING: RwLock<Vec<(String, Wording)>> = RwLock::new(Vec::new());

/// Which failure `message` words, if it is one learned.
pub(crate) fn recognise(message: &str) -> Option<Wording> {
    PG_WORDING
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .iter()
        .find(|(wording, _)| wording == message)
        .map(|(_, wording)| *wording)
}

/// Makes the PostgreSQL server at `url` fail once with `lock_timeout` and
/// once with `statement_timeout`, and remembers its wording of each, so that
/// `classify` knows them. Two short sessions, a few milliseconds.
pub(crate) fn learn_wording(url: &str) -> Result<(), DieselError> {
    let mut holder = PgConnection::establish(url).map_err(connection_lost)?;
    let mut waiter = PgConnection::establish(url).map_err(connection_lost)?;
    // A lock id nobody else uses: a random one.
    let lock_id = i64::from_ne_bytes(uuid::Uuid::new_v4().as_u64_pair().0.to_ne_bytes());
    let take = || diesel::sql_query("SELECT pg_advisory_xact_lock($1)").bind::<BigInt, _>(lock_id);

    holder.batch_execute("BEGIN")?;
    take().execute(&mut holder)?;
    waiter.batch_execute("BEGIN; SET LOCAL lock_timeout = 1")?;
    let lock_timeout = take().execute(&mut waiter).err();
    waiter.batch_execute("ROLLBACK")?;
    holder.batch_execute("ROLLBACK")?;

    waiter.batch_execute("BEGIN; SET LOCAL statement_timeout = 1")?;
    let statement_timeout = diesel::sql_query("SELECT pg_sleep(10)")
        .execute(&mut waiter)
        .err();
    waiter.batch_execute("ROLLBACK")?;

    for (error, wording) in [
        (lock_timeout, Wording::LockTimeout),
        (statement_timeout, Wording::StatementTimeout),
    ] {
        let Some(DieselError::DatabaseError(_, info)) = error else {
            return Err(DieselError::QueryBuilderError(
                "the server did not fail as asked while learning its wording".into(),
            ));
        };
        remember(info.message(), wording);
    }
    Ok(())
}

pub(crate) fn remember(wording: &str, failure: Wording) {
    let mut known = PG_WORDING
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if !known.iter().any(|(w, _)| w == wording) {
        known.push((wording.to_owned(), failure));
    }
}

fn connection_lost(e: diesel::ConnectionError) -> DieselError {
    DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, Box::new(e.to_string()))
}
