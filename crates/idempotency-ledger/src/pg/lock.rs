//! PostgreSQL: the key's lock, tried — a transaction-scoped advisory lock
//! that a unit takes if it is free and never waits for — and the bound on
//! any other lock wait of a unit.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::result::Error as DieselError;
use diesel::sql_types::BigInt;

/// How long a statement waits on PostgreSQL for a row lock another
/// transaction holds before its request is answered
/// `409 IDEMPOTENCY_IN_PROGRESS` (at most half the lease). Units of one key
/// never wait on each other (a unit only *tries* its key's advisory lock),
/// so such a wait is for a writer outside the ledger's protocol — or, for
/// the purge, for another purge.
pub const PG_LOCK_WAIT: Duration = Duration::from_secs(2);

/// How long a PostgreSQL statement waits for a lock another transaction
/// holds before it gives up (then "in progress"): [`PG_LOCK_WAIT`], or half
/// the lease when that is shorter — strictly below the lease's
/// `statement_timeout`, so that the lock wait, started later, fires first
/// (with equal timeouts the statement's would, and a duplicate would be
/// answered 503 instead of "in progress"). Every pooled session starts with
/// it, and every unit of writing sets it again for its own transaction.
pub(crate) fn lock_wait(lease: Duration) -> Duration {
    PG_LOCK_WAIT.min(lease / 2).max(Duration::from_millis(1))
}

diesel::define_sql_function! {
    /// PostgreSQL: takes a transaction-scoped advisory lock if it is free.
    fn pg_try_advisory_xact_lock(key: BigInt) -> diesel::sql_types::Bool;
}

/// The advisory-lock id of `(key, user_id)` on PostgreSQL, which a unit of
/// writing holds for its transaction: 64 bits of a SHA-256, so two keys
/// share a lock only by a chance of one in 2^64 (and then merely wait).
/// Public so that an operator or a test can see, or take, a key's lock
/// (`pg_locks`, `pg_advisory_lock`).
pub fn lock_id(key: &str, user_id: &str) -> i64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(user_id.as_bytes())
        .chain_update([0])
        .chain_update(key.as_bytes())
        .finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// First in a unit: bounds the transaction's lock waits, then tries the
/// key's advisory lock — `true` when no other unit held the key, `false`
/// at once when one does (the caller rolls back and looks again later,
/// holding no connection meanwhile).
///
/// The bound is `SET LOCAL lock_timeout`, the transaction's own setting.
/// Every session has the same bound already, but a distributed PostgreSQL
/// (Citus) runs a transaction's statements in the sessions the coordinator
/// holds on its workers, which the service's session settings never reach;
/// a `SET LOCAL` does: Citus sends it to every worker the transaction
/// touches (with `citus.propagate_set_commands = 'local'`, which every
/// session of the pool sets where Citus is loaded).
pub(crate) fn try_lock(
    c: &mut PgConnection,
    key: &str,
    user_id: &str,
    lease: Duration,
) -> Result<bool, DieselError> {
    c.batch_execute(&format!(
        "SET LOCAL lock_timeout = {}",
        lock_wait(lease).as_millis().max(1)
    ))?;
    diesel::select(pg_try_advisory_xact_lock(lock_id(key, user_id))).get_result::<bool>(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A statement that waits for a lock gives up before the lease's
    /// `statement_timeout` would cut it, whatever the lease: the duplicate
    /// is answered "in progress", never `503`.
    #[test]
    fn the_lock_wait_is_below_the_lease_and_at_most_its_own_bound() {
        for millis in [4, 100, 1_000, 2_000, 3_999, 4_000, 30_000, 600_000] {
            let lease = Duration::from_millis(millis);
            let wait = lock_wait(lease);
            assert!(wait < lease, "{wait:?} for a lease of {lease:?}");
            assert!(wait <= PG_LOCK_WAIT, "{wait:?} for a lease of {lease:?}");
            assert!(
                wait >= (lease / 2).min(PG_LOCK_WAIT),
                "{wait:?} for a lease of {lease:?}"
            );
        }
    }

    /// Each `(key, user)` has its own advisory lock: a unit never waits for
    /// another key's, nor for the same key of another user.
    #[test]
    fn each_key_of_each_user_has_its_own_lock_and_keeps_it() {
        let ids = [
            lock_id("k-1", "alice"),
            lock_id("k-2", "alice"),
            lock_id("k-1", "bob"),
            // Not the same bytes run together: the two parts are kept apart.
            lock_id("1", "alicek-"),
            lock_id("alicek-1", ""),
        ];
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                assert_ne!(a, b, "{ids:?}");
            }
        }
        assert_eq!(
            lock_id("k-1", "alice"),
            ids[0],
            "the same key, the same lock"
        );
    }
}
