//! Building and running the HTTP server.

use std::net::TcpListener;
use std::time::Duration;

use actix_web::dev::{Server, ServerHandle};
use actix_web::middleware::from_fn;
use actix_web::{App, HttpServer, web};
pub use sd_notify::NotifyState;

use idempotency_ledger::{Ledger, LedgerError};

use crate::auth::cache::{TokenCache, first_lookups_for_pool};
use crate::config::Settings;
use crate::db::Pool;
use crate::http::{self, AppState};
use crate::telemetry;

/// Blocking threads of each worker beyond the writes the process admits,
/// for reads (the ledger's among them) and token lookups: even with every
/// admitted write's unit on one worker (PostgreSQL; SQLite's units run on
/// its writer thread), reads find threads of their own.
pub const READ_BLOCKING_THREADS: usize = 32;

/// How many expired entries one purge transaction deletes.
pub const PURGE_BATCH: i64 = 1_000;
/// How many batches one purge round deletes at most before yielding.
const PURGE_MAX_BATCHES_PER_ROUND: usize = 1_000;
/// The pause between two purge batches, so live writers get the lock.
const PURGE_PAUSE: Duration = Duration::from_millis(5);
/// How long in-flight requests may run after SIGTERM. The packaged systemd
/// unit's `TimeoutStopSec` leaves room for it.
pub const SHUTDOWN_GRACE: u64 = 30;
/// How often histogram samples are folded into their buckets, so that they
/// do not pile up in memory between two scrapes of `/metrics`.
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// How long a client may take to send its first request's head (request
/// line and headers) from the moment it connects; a client still sending
/// then is answered `408` and disconnected, so a client trickling its
/// headers holds a connection no longer than this.
pub const CLIENT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an idle keep-alive connection stays open between requests.
pub const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// The largest request head accepted (actix-http's fixed limit): a bigger
/// one is answered `431` and the connection closed.
pub const MAX_REQUEST_HEAD_BYTES: usize = 131_072;
/// The most connections one worker keeps open at once (actix's default is
/// 25,000); more wait in the kernel's accept queue. With the head and body
/// limits and deadlines this bounds what connections can hold in memory.
pub const MAX_CONNECTIONS_PER_WORKER: usize = 4_096;
/// The most header fields one request may carry (actix-http's fixed
/// limit): more are answered `431` and the connection closed.
pub const MAX_REQUEST_HEADERS: usize = 96;

#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {cause}")]
pub struct BindError {
    addr: String,
    cause: std::io::Error,
}

/// Why a running server stopped by itself.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("the server failed: {0}")]
    Io(#[from] std::io::Error),
    /// The database cannot be written and the process cannot recover by
    /// itself: it exits so that its supervisor restarts it.
    #[error("{0}; exiting so that a supervisor restarts the service")]
    CannotWrite(String),
}

/// A bound, not yet running, server.
pub struct Application {
    port: u16,
    server: Server,
    pool: Pool,
    purge_interval: Duration,
}

impl Application {
    pub fn build(settings: &Settings, pool: Pool) -> Result<Self, BindError> {
        let bind_error = |cause| BindError {
            addr: settings.bind.clone(),
            cause,
        };
        let listener = TcpListener::bind(&settings.bind).map_err(bind_error)?;
        let port = listener.local_addr().map_err(bind_error)?.port();
        let state = web::Data::new(AppState {
            pool: pool.clone(),
            tokens: TokenCache::new(
                Duration::from_secs(settings.auth_cache_secs),
                first_lookups_for_pool(settings.pool_size),
            ),
            ledger: settings.ledger(pool.clone()),
            max_body_bytes: usize::try_from(settings.max_body_bytes).unwrap_or(usize::MAX),
            metrics: telemetry::metrics_handle(),
        });
        // Blocking threads per worker (database work runs on them): every
        // write this process admits, on one worker at worst, and reads'
        // own. A request waiting for its key or for the SQLite writer holds
        // none, and tokio's default (512 per worker) would let a burst grow
        // hundreds of thread stacks and malloc arenas.
        let blocking_threads = state
            .ledger
            .admission()
            .bound()
            .saturating_add(READ_BLOCKING_THREADS);
        let origins = settings.cors_origins();
        let mut server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .configure(http::routes)
                .wrap(http::cors(&origins))
                .wrap(http::error::problem_for_every_error())
                .wrap(from_fn(telemetry::observe))
                .wrap(from_fn(http::connection::close_after_unfinished_body))
        })
        .shutdown_timeout(SHUTDOWN_GRACE)
        .client_request_timeout(CLIENT_REQUEST_TIMEOUT)
        .keep_alive(KEEP_ALIVE)
        .client_disconnect_timeout(http::connection::LINGER)
        .max_connections(MAX_CONNECTIONS_PER_WORKER)
        .worker_max_blocking_threads(blocking_threads)
        // Ours instead of actix's, whose SIGINT stops at once: see `stop_on_signal`.
        .disable_signals();
        if let Some(workers) = settings.workers {
            server = server.workers(usize::from(workers));
        }
        let server = server.listen(listener).map_err(bind_error)?.run();
        Ok(Self {
            port,
            server,
            pool,
            purge_interval: Duration::from_secs(settings.purge_interval_secs),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A handle that stops the server (gracefully with `stop(true)`).
    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Serves until the server is stopped (SIGINT/SIGTERM or the handle),
    /// purging expired ledger entries in the background meanwhile — or
    /// until the SQLite writer gives up (writing has been impossible for the
    /// lease plus its commit grace): then the server stops (in-flight
    /// requests finish, each within its own bound) and this returns
    /// [`ServeError::CannotWrite`], so that the process exits non-zero and
    /// its supervisor restarts it.
    pub async fn run_until_stopped(self) -> Result<(), ServeError> {
        use futures_util::future::{Either, join, select};

        let every = self.purge_interval.min(telemetry::LEDGER_COUNT_INTERVAL);
        let gauge = actix_web::rt::spawn(telemetry::count_ledger_rows(self.pool.clone(), every));
        let purge =
            actix_web::rt::spawn(purge_periodically(self.pool.clone(), self.purge_interval));
        let handle = self.server.handle();
        let signals = actix_web::rt::spawn(stop_on_signal(handle.clone()));
        let upkeep = actix_web::rt::spawn(metrics_upkeep(METRICS_UPKEEP));
        let pool = self.pool;
        let gave_up = Box::pin(pool.writer_gave_up());
        let result = match select(self.server, gave_up).await {
            Either::Left((served, _)) => served.map_err(ServeError::Io),
            Either::Right((why, server)) => {
                // The server future runs the stop it is asked for.
                let (_, served) = join(handle.stop(true), server).await;
                served?;
                Err(ServeError::CannotWrite(why))
            }
        };
        upkeep.abort();
        signals.abort();
        purge.abort();
        gauge.abort();
        result
    }
}

async fn metrics_upkeep(every: Duration) {
    let handle = telemetry::metrics_handle();
    let mut ticker = actix_web::rt::time::interval(every);
    loop {
        ticker.tick().await;
        handle.run_upkeep();
    }
}

/// SIGTERM and SIGINT both stop the server gracefully: it stops accepting
/// connections at once, lets in-flight requests finish (and commit) for up
/// to [`SHUTDOWN_GRACE`] seconds, then exits. A second signal stops at once.
async fn stop_on_signal(server: ServerHandle) {
    use actix_web::rt::signal::unix::{SignalKind, signal};
    use futures_util::future::{Either, select};

    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot listen for SIGTERM/SIGINT; stop the process with SIGKILL");
        return;
    };
    let name = match select(Box::pin(term.recv()), Box::pin(int.recv())).await {
        Either::Left(_) => "SIGTERM",
        Either::Right(_) => "SIGINT",
    };
    tracing::info!(
        signal = name,
        grace_secs = SHUTDOWN_GRACE,
        "shutting down: finishing in-flight requests"
    );
    notify_supervisor(&[
        NotifyState::Stopping,
        NotifyState::Status("finishing in-flight requests"),
    ]);
    let graceful = actix_web::rt::spawn(server.stop(true));
    let _ = select(Box::pin(term.recv()), Box::pin(int.recv())).await;
    tracing::warn!("second signal: stopping now");
    graceful.abort();
    server.stop(false).await;
}

/// Tells the service manager how the service is doing, when it asked to be
/// told: a systemd unit of `Type=notify` sets `NOTIFY_SOCKET`, and learns
/// from `READY=1` that the port is open (so units ordered after this one
/// start only then, and a failed start is a failed `systemctl start`), and
/// from `STOPPING=1` that a graceful stop began. Without the variable,
/// nothing is sent.
pub fn notify_supervisor(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify the service manager (NOTIFY_SOCKET)");
    }
}

async fn purge_periodically(pool: Pool, every: Duration) {
    let mut ticker = actix_web::rt::time::interval(every);
    ticker.tick().await; // the first tick is immediate
    loop {
        ticker.tick().await;
        let pool = pool.clone();
        let purged = web::block(move || purge_round(&pool)).await;
        match purged {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(purged = n, "purged expired idempotency entries"),
            Ok(Err(e)) => tracing::warn!(error = %e, "purge failed; will retry"),
            Err(e) => tracing::warn!(error = %e, "purge task failed; will retry"),
        }
    }
}

/// One purge round: bounded batches with a pause between them.
fn purge_round(pool: &Pool) -> Result<usize, LedgerError<std::convert::Infallible>> {
    let mut total = 0;
    for _ in 0..PURGE_MAX_BATCHES_PER_ROUND {
        let n = Ledger::purge_expired(pool, PURGE_BATCH, 1)?;
        total += n;
        telemetry::count_purged(n);
        if (n as i64) < PURGE_BATCH {
            break;
        }
        std::thread::sleep(PURGE_PAUSE);
    }
    Ok(total)
}

/// Purges until nothing expired is left (the `purge` command).
pub fn purge_all(pool: &Pool) -> Result<usize, LedgerError<std::convert::Infallible>> {
    let mut total = 0;
    loop {
        let n = purge_round(pool)?;
        total += n;
        if n == 0 || n % (PURGE_BATCH as usize) != 0 {
            return Ok(total);
        }
    }
}
