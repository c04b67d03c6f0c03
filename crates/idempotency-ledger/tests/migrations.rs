//! The ledger's shipped migrations: safe at every start, and from several
//! processes starting at once, with the application's own beside them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::{Arc, Barrier};

use diesel::prelude::*;
use diesel_migrations::{EmbeddedMigrations, embed_migrations};
use idempotency_ledger::db::Backend;
use idempotency_ledger::migrate;
use support::Scratch;

/// An application's own set, for each backend (one `notes` table).
const APP_SQLITE: EmbeddedMigrations = embed_migrations!("tests/app-migrations/sqlite");
const APP_POSTGRES: EmbeddedMigrations = embed_migrations!("tests/app-migrations/postgres");

fn app(backend: Backend) -> EmbeddedMigrations {
    match backend {
        Backend::Sqlite => APP_SQLITE,
        Backend::Postgres => APP_POSTGRES,
    }
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// How many rows `sql` (a `SELECT count(*) AS n …`) counts.
fn count(db: &Scratch, sql: &str) -> i64 {
    let rows: Vec<Count> = match db.backend {
        Backend::Sqlite => {
            diesel::sql_query(sql).load(&mut SqliteConnection::establish(&db.url).unwrap())
        }
        Backend::Postgres => {
            diesel::sql_query(sql).load(&mut PgConnection::establish(&db.url).unwrap())
        }
    }
    .expect(sql);
    rows[0].n
}

both_backends! {
    fn a_second_start_applies_nothing_and_keeps_every_entry(backend) {
        let db = Scratch::fresh(backend);
        let first = migrate::run(backend, &db.url, Some(app(backend))).expect("first start");
        assert_eq!(first, ["idempotencyledger0001", "20260101000000"]);
        let insert = "INSERT INTO notes (body) VALUES ('kept')";
        match backend {
            Backend::Sqlite => diesel::sql_query(insert).execute(&mut SqliteConnection::establish(&db.url).unwrap()),
            Backend::Postgres => diesel::sql_query(insert).execute(&mut PgConnection::establish(&db.url).unwrap()),
        }
        .expect("a row of the application's");
        let second = migrate::run(backend, &db.url, Some(app(backend))).expect("second start");
        assert!(second.is_empty(), "{second:?}");
        assert_eq!(count(&db, "SELECT count(*) AS n FROM notes"), 1);
        assert_eq!(count(&db, "SELECT count(*) AS n FROM idempotency_ledger"), 0);
    }

    fn processes_starting_at_once_all_start_and_apply_each_migration_once(backend) {
        let db = Scratch::fresh(backend);
        // Each "process" its own connection, all let go at once.
        let starters = 8;
        let barrier = Arc::new(Barrier::new(starters));
        let applied: Vec<Vec<String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..starters)
                .map(|_| {
                    let (barrier, url) = (Arc::clone(&barrier), db.url.clone());
                    s.spawn(move || {
                        barrier.wait();
                        migrate::run(backend, &url, Some(app(backend)))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("no panic").expect("every start succeeds"))
                .collect()
        });
        let mut all: Vec<String> = applied.into_iter().flatten().collect();
        all.sort();
        assert_eq!(all, ["20260101000000", "idempotencyledger0001"]);
        assert_eq!(
            count(&db, "SELECT count(*) AS n FROM __diesel_schema_migrations"),
            2
        );
    }

    fn a_database_whose_own_migrations_made_the_ledgers_table_keeps_it(backend) {
        let db = Scratch::fresh(backend);
        let ddl = match backend {
            Backend::Sqlite => idempotency_ledger::SQLITE_DDL,
            Backend::Postgres => idempotency_ledger::POSTGRES_DDL,
        };
        let made_by_hand = format!("{ddl}\nINSERT INTO idempotency_ledger VALUES ('k', 'u', 'f', 200, '[]', {}, {}, {});",
            if backend == Backend::Sqlite { "x''" } else { "''::bytea" },
            if backend == Backend::Sqlite { "'2000-01-01 00:00:00+00:00'" } else { "now()" },
            if backend == Backend::Sqlite { "'2999-01-01 00:00:00+00:00'" } else { "now()" });
        use diesel::connection::SimpleConnection;
        match backend {
            Backend::Sqlite => SqliteConnection::establish(&db.url).unwrap().batch_execute(&made_by_hand),
            Backend::Postgres => PgConnection::establish(&db.url).unwrap().batch_execute(&made_by_hand),
        }
        .expect("the table made beforehand");
        let applied = migrate::run(backend, &db.url, None).expect("migrate");
        assert_eq!(applied, ["idempotencyledger0001"]);
        assert_eq!(count(&db, "SELECT count(*) AS n FROM idempotency_ledger"), 1);
    }
}
