//! PostgreSQL's purge batch, Citus-safe.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::result::Error as DieselError;
use diesel::sql_types::{BigInt, Timestamptz};

use super::lock::PG_LOCK_WAIT;

/// The purge's statement on PostgreSQL: `$1` is now, `$2` the batch's size.
///
/// It deletes by the ledger's key the `$2` entries that expired first (the
/// `expires_at` index serves the selection, the primary key each
/// deletion). No `ctid` and no row lock: a table distributed by `user_id`
/// (Citus) refuses both in a statement that spans shards. There it runs in
/// two steps, the selection first, across shards, then the deletion of the
/// selected rows on every shard; an entry recorded for one of those keys in
/// between (after another purge removed the old one) was created later, so
/// matching `created_at` too keeps it.
///
/// The deletion matches the selected rows by key and `created_at`, a column
/// no index covers, so the only way to them is the primary key: by a range
/// of `expires_at` (`WHERE expires_at < $1 AND …`), or by `expires_at`
/// itself, the planner could reach them through the `expires_at` index
/// instead, and with a backlog inserted since the last `ANALYZE` (the
/// statistics saying almost nothing has expired) it did: once per selected
/// entry, over a backlog whose entries all expire at the same instant (one
/// batch of a 1,000,000-entry backlog: 30 s, and 469 s with the range).
/// `the_purges_plan_reads_the_backlog_only_as_far_as_one_batch_whatever_the_statistics_say`
/// checks the plan.
pub const PURGE_POSTGRES: &str = "DELETE FROM idempotency_ledger \
     WHERE (user_id, idempotency_key, created_at) IN (SELECT user_id, idempotency_key, created_at \
     FROM idempotency_ledger WHERE expires_at < $1 ORDER BY expires_at LIMIT $2)";

/// PostgreSQL: [`PURGE_POSTGRES`], planned for this batch's values each time
/// (diesel prepares it once per connection, and a generic plan, which knows
/// neither the batch's size nor how much has expired, reads the whole
/// table), with the transaction's lock waits bounded first. On a single
/// PostgreSQL it is one statement and one snapshot; two purges at once
/// select the same entries, the second waits for the first's row locks (a
/// batch is one short transaction) and then deletes what is left. A live
/// write never waits on a purge: an expired entry still answers its key's
/// read, so nothing writes a key whose entry is being purged.
pub(crate) fn batch(
    c: &mut PgConnection,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<usize, DieselError> {
    use diesel::connection::SimpleConnection;
    c.batch_execute(&format!(
        "SET LOCAL lock_timeout = {}; SET LOCAL plan_cache_mode = force_custom_plan",
        PG_LOCK_WAIT.as_millis()
    ))?;
    diesel::sql_query(PURGE_POSTGRES)
        .bind::<Timestamptz, _>(now)
        .bind::<BigInt, _>(limit)
        .execute(c)
}
