//! `spawn_maintenance`: the purge runs at its interval, in bounded batches,
//! and deletes only expired entries — on both backends.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use idempotency_ledger::db::Backend;
use idempotency_ledger::{MaintenanceOptions, Options, spawn_maintenance};
use support::Scratch;

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

fn on_db(db: &Scratch, sql: &str) -> i64 {
    let count = "SELECT count(*) AS n FROM idempotency_ledger";
    let rows: Vec<Count> = match db.backend {
        Backend::Sqlite => {
            let mut c = SqliteConnection::establish(&db.url).unwrap();
            if !sql.is_empty() {
                c.batch_execute(sql).unwrap();
            }
            diesel::sql_query(count).load(&mut c)
        }
        Backend::Postgres => {
            let mut c = PgConnection::establish(&db.url).unwrap();
            if !sql.is_empty() {
                c.batch_execute(sql).unwrap();
            }
            diesel::sql_query(count).load(&mut c)
        }
    }
    .unwrap();
    rows[0].n
}

both_backends! {
    fn the_purge_runs_at_its_interval_and_deletes_only_expired_entries(backend) {
        let db = Scratch::fresh(backend);
        let ledger = idempotency_ledger::open(&db.url, Options::default()).expect("open");
        let (past, future, blob) = match backend {
            Backend::Sqlite => ("'2000-01-01 00:00:00+00:00'", "'2999-01-01 00:00:00+00:00'", "x''"),
            Backend::Postgres => ("'2000-01-01'::timestamptz", "'2999-01-01'::timestamptz", "''::bytea"),
        };
        let mut rows: Vec<String> = (0..25)
            .map(|i| format!("('old-{i}', 'u', 'f', 200, '[]', {blob}, {past}, {past})"))
            .collect();
        rows.push(format!("('live', 'u', 'f', 200, '[]', {blob}, {past}, {future})"));
        let insert = format!("INSERT INTO idempotency_ledger VALUES {};", rows.join(","));
        assert_eq!(on_db(&db, &insert), 26);

        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let options = MaintenanceOptions {
                purge_every: Duration::from_millis(50),
                batch: 10,
                ..MaintenanceOptions::default()
            };
            let maintenance = spawn_maintenance(ledger.pool(), options);
            let deadline = Instant::now() + Duration::from_secs(20);
            while on_db(&db, "") > 1 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            maintenance.stop();
        });
        assert_eq!(on_db(&db, ""), 1, "only the live entry is left");
    }
}
