//! A dropped SQLite pool leaves nothing of its writer running: the writer
//! finishes what it was given and is joined, with its watchdog, before the
//! drop returns — so a process that drops its pool (a command ending, a
//! server shutting down) goes on with its queue drained and no thread still
//! replacing a writer. A test binary of its own, so that the process's
//! threads are this test's.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::result::Error as DieselError;
use idempotency_ledger::db::{Backend, Pool, PoolOptions};

/// Threads of this process with `name` (as `/proc` shows it).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

#[test]
fn a_dropped_sqlite_pool_has_finished_its_writers_work_and_stopped_its_threads_when_the_drop_returns()
 {
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let path = std::env::temp_dir().join(format!("ledger-writer-threads-{unique}.db"));
    let url = path.to_str().expect("a UTF-8 path").to_owned();
    SqliteConnection::establish(&url)
        .expect("create the file")
        .batch_execute(idempotency_ledger::SQLITE_DDL)
        .expect("the ledger's table");
    let options = PoolOptions {
        max_size: 2,
        connection_timeout: Duration::from_secs(10),
        lease: Duration::from_secs(30),
        write_queue: 16,
        shown: "the test database".into(),
    };
    let pool = Pool::connect(Backend::Sqlite, &url, &options).expect("pool");
    pool.write_blocking(|_| Ok::<_, DieselError>(()))
        .expect("the writer")
        .expect("the unit");
    let running = || {
        (
            threads_named("sqlite-writer"),
            threads_named("sqlite-watchdog"),
        )
    };
    // A thread names itself as it starts; an exited one may linger in /proc
    // for a moment after it was joined.
    let soon = |want: (usize, usize)| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while running() != want && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        running()
    };
    assert_eq!(soon((1, 1)), (1, 1), "the first write started both");

    // A unit whose caller stopped waiting (its future dropped) while the
    // writer runs it: nobody holds the pool for it any more.
    let finished = Arc::new(AtomicBool::new(false));
    let (started, running_unit) = std::sync::mpsc::channel();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let caller = rt.spawn({
        let (pool, finished) = (pool.clone(), Arc::clone(&finished));
        async move {
            pool.write(move |_| {
                started.send(()).expect("the test waits");
                // Long enough that a drop which did not wait returns first.
                std::thread::sleep(Duration::from_millis(300));
                finished.store(true, Ordering::SeqCst);
                Ok::<_, DieselError>(())
            })
            .await
        }
    });
    running_unit.recv().expect("the unit runs");
    caller.abort();
    assert!(rt.block_on(caller).is_err_and(|e| e.is_cancelled()));

    drop(pool);

    assert!(
        finished.load(Ordering::SeqCst),
        "the drop returned before its writer's unit ended"
    );
    assert_eq!(soon((0, 0)), (0, 0), "(writers, watchdogs) left running");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{url}{suffix}"));
    }
}
