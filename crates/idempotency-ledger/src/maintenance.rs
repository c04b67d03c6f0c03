//! What a service runs beside its requests: the purge of expired entries
//! at an interval, and the watch over SQLite's writer — started by one
//! call, [`spawn_maintenance`], stopped by dropping (or
//! [`Maintenance::stop`]ping) the handle it returns.

use std::time::Duration;

use tokio::task::JoinHandle;

use crate::Ledger;
use crate::db::Pool;

/// How the maintenance runs; [`MaintenanceOptions::default`] is what the
/// ledger's own service uses.
#[derive(Debug, Clone, Copy)]
pub struct MaintenanceOptions {
    /// The time between two purge rounds (the first one after this long).
    pub purge_every: Duration,
    /// How many expired entries one purge transaction deletes.
    pub batch: i64,
    /// How many batches one round deletes at most before it waits for the
    /// next (a backlog of millions never stalls live writes).
    pub max_batches_per_round: usize,
    /// The pause between two batches of a round, so live writers get the
    /// lock between them.
    pub pause: Duration,
    /// Told how many entries each batch deleted (a metric, say).
    pub on_purged: fn(usize),
}

impl Default for MaintenanceOptions {
    fn default() -> Self {
        Self {
            purge_every: Duration::from_secs(60),
            batch: 1_000,
            max_batches_per_round: 1_000,
            pause: Duration::from_millis(5),
            on_purged: |_| {},
        }
    }
}

/// The running maintenance of one pool: stops when dropped.
pub struct Maintenance {
    purge: JoinHandle<()>,
    pool: Pool,
}

/// Starts, on the current tokio runtime (actix-web's included), the purge
/// of `pool`'s expired entries every `options.purge_every` — in bounded
/// batches, on a blocking thread, failures logged and retried at the next
/// round; the handle's [`Maintenance::writer_gave_up`] is the watch over
/// SQLite's writer, to await beside the server. Call it once per pool.
pub fn spawn_maintenance(pool: &Pool, options: MaintenanceOptions) -> Maintenance {
    let purge = tokio::spawn(purge_periodically(pool.clone(), options));
    Maintenance {
        purge,
        pool: pool.clone(),
    }
}

impl std::fmt::Debug for Maintenance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Maintenance").finish_non_exhaustive()
    }
}

impl Maintenance {
    /// Resolves, with why, once SQLite's writer has given up: writing has
    /// been impossible for longer than the lease plus its commit grace, and
    /// the process cannot recover by itself — it should stop serving and
    /// exit non-zero, so that its supervisor restarts it. Never on
    /// PostgreSQL (a lost server is recovered from in process).
    /// The writer watches itself (a watchdog thread of its own); this
    /// waits for its word.
    pub async fn writer_gave_up(&self) -> String {
        self.pool.writer_gave_up().await
    }

    /// Stops the purge (a purge batch under way finishes).
    pub fn stop(self) {}
}

impl Drop for Maintenance {
    fn drop(&mut self) {
        self.purge.abort();
    }
}

async fn purge_periodically(pool: Pool, options: MaintenanceOptions) {
    let mut ticker = tokio::time::interval(options.purge_every);
    ticker.tick().await; // the first tick is immediate
    loop {
        ticker.tick().await;
        let pool = pool.clone();
        match tokio::task::spawn_blocking(move || purge_round(&pool, &options)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(purged = n, "purged expired idempotency entries"),
            Ok(Err(e)) => tracing::warn!(error = %e, "purge failed; will retry"),
            Err(e) => tracing::warn!(error = %e, "purge task failed; will retry"),
        }
    }
}

/// One purge round: at most `max_batches_per_round` batches, a pause
/// between two. It blocks.
pub fn purge_round(
    pool: &Pool,
    options: &MaintenanceOptions,
) -> Result<usize, crate::LedgerError<std::convert::Infallible>> {
    let mut total: usize = 0;
    for _ in 0..options.max_batches_per_round {
        let n = Ledger::purge_expired(pool, options.batch, 1)?;
        total = total.saturating_add(n);
        (options.on_purged)(n);
        if i64::try_from(n).unwrap_or(i64::MAX) < options.batch {
            break;
        }
        std::thread::sleep(options.pause);
    }
    Ok(total)
}
