//! The baseline: the same stack (actix-web, diesel, r2d2, a blocking hop)
//! doing nothing but the storage work, served from this process.
//!
//! On SQLite two inserts: one transaction per request from a pool at
//! `synchronous = NORMAL` (`/bare`), and the service's own group-committing
//! [`Writer`] at `synchronous = FULL`, one savepoint per row, doing nothing
//! but the insert, awaited from the worker as the service awaits it
//! (`/bare-group`): the ceiling of a durable write here.

use actix_web::{App, HttpResponse, HttpServer, web};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{self, ConnectionManager, CustomizeConnection};
use orders_api::db::Conn;
use orders_api::db::writer::Writer;
use std::sync::Arc;

use super::server::free_port;
use super::{Config, Target};

#[derive(Clone)]
pub(crate) enum BaselinePool {
    Sqlite {
        pool: r2d2::Pool<ConnectionManager<SqliteConnection>>,
        /// The group-committing writer, on a file of its own at `FULL`.
        group: Arc<Writer>,
    },
    Postgres(r2d2::Pool<ConnectionManager<PgConnection>>),
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct SqliteNormal;

impl CustomizeConnection<SqliteConnection, r2d2::Error> for SqliteNormal {
    fn on_acquire(&self, conn: &mut SqliteConnection) -> Result<(), r2d2::Error> {
        conn.batch_execute(
            "PRAGMA busy_timeout = 5000; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;",
        )
        .map_err(r2d2::Error::QueryError)
    }
}

pub(crate) const BARE_TABLE: &str = "CREATE TABLE IF NOT EXISTS bare_rows (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, user_id TEXT NOT NULL,
    item TEXT NOT NULL, quantity INTEGER NOT NULL, price_cents BIGINT NOT NULL,
    status TEXT NOT NULL, idempotency_key TEXT NOT NULL, created_at TEXT NOT NULL,
    UNIQUE (user_id, idempotency_key))";
pub(crate) const BARE_TABLE_PG: &str = "CREATE TABLE IF NOT EXISTS bare_rows (
    seq BIGSERIAL PRIMARY KEY, id TEXT NOT NULL UNIQUE, user_id TEXT NOT NULL,
    item TEXT NOT NULL, quantity INTEGER NOT NULL, price_cents BIGINT NOT NULL,
    status TEXT NOT NULL, idempotency_key TEXT NOT NULL, created_at TEXT NOT NULL,
    UNIQUE (user_id, idempotency_key))";

diesel::table! {
    bare_rows (seq) {
        seq -> BigInt,
        id -> Text,
        user_id -> Text,
        item -> Text,
        quantity -> Integer,
        price_cents -> BigInt,
        status -> Text,
        idempotency_key -> Text,
        created_at -> Text,
    }
}

#[derive(Queryable, serde::Serialize)]
pub(crate) struct BareRow {
    pub(crate) id: String,
    pub(crate) item: String,
    pub(crate) price_cents: i64,
    pub(crate) created_at: String,
}

/// Both baseline statements are diesel's DSL, so that diesel caches their
/// prepared statements exactly as it does the service's.
macro_rules! bare_row {
    ($id:expr, $now:expr) => {{
        use bare_rows::dsl as t;
        (
            t::id.eq($id),
            t::user_id.eq("bench"),
            t::item.eq("Widget"),
            t::quantity.eq(2),
            t::price_cents.eq(999_i64),
            t::status.eq("pending"),
            t::idempotency_key.eq($id),
            t::created_at.eq($now),
        )
    }};
}

impl BaselinePool {
    pub(crate) fn insert(&self) -> QueryResult<String> {
        use bare_rows::dsl as t;
        let id = uuid::Uuid::now_v7().to_string();
        let now = chrono::Utc::now().to_rfc3339();
        let row = bare_row!(&id, &now);
        let unavailable =
            |e: diesel::r2d2::PoolError| diesel::result::Error::QueryBuilderError(e.into());
        match self {
            BaselinePool::Sqlite { pool: p, .. } => {
                let mut c = p.get().map_err(unavailable)?;
                c.immediate_transaction(|c| {
                    diesel::insert_into(t::bare_rows).values(row).execute(c)
                })?;
            }
            BaselinePool::Postgres(p) => {
                let mut c = p.get().map_err(unavailable)?;
                c.transaction(|c| diesel::insert_into(t::bare_rows).values(row).execute(c))?;
            }
        }
        Ok(id)
    }

    /// SQLite: one row through the group-committing writer, in a savepoint
    /// of whatever batch it joins; answered once that batch has committed.
    /// Awaited as the service awaits it (no blocking thread parked).
    pub(crate) async fn group_insert(&self) -> QueryResult<String> {
        use bare_rows::dsl as t;
        let BaselinePool::Sqlite { group, .. } = self else {
            return Err(diesel::result::Error::NotFound);
        };
        let id = uuid::Uuid::now_v7().to_string();
        let now = chrono::Utc::now().to_rfc3339();
        let answer = id.clone();
        group
            .run(move |conn: &mut Conn<'_>| match conn {
                Conn::Sqlite(c) => diesel::insert_into(t::bare_rows)
                    .values(bare_row!(&id, &now))
                    .execute(*c),
                Conn::Postgres(_) => Err(diesel::result::Error::NotFound),
            })
            .await
            .map_err(|e| diesel::result::Error::QueryBuilderError(e.into()))??;
        Ok(answer)
    }

    pub(crate) fn read(&self, seq: i64) -> QueryResult<Option<BareRow>> {
        use bare_rows::dsl as t;
        let query = t::bare_rows.filter(t::seq.eq(seq)).select((
            t::id,
            t::item,
            t::price_cents,
            t::created_at,
        ));
        let unavailable =
            |e: diesel::r2d2::PoolError| diesel::result::Error::QueryBuilderError(e.into());
        match self {
            BaselinePool::Sqlite { pool: p, .. } => query
                .get_result(&mut p.get().map_err(unavailable)?)
                .optional(),
            BaselinePool::Postgres(p) => query
                .get_result(&mut p.get().map_err(unavailable)?)
                .optional(),
        }
    }
}

pub(crate) struct Baseline {
    pub(crate) base: String,
    pub(crate) handle: actix_web::dev::ServerHandle,
    pub(crate) thread: Option<std::thread::JoinHandle<()>>,
}

impl Baseline {
    pub(crate) fn start(config: &Config, target: &Target) -> Self {
        let pool = match target {
            Target::Sqlite(_) => {
                let path = config.dir.join("bare.db");
                let manager =
                    ConnectionManager::<SqliteConnection>::new(path.display().to_string());
                // As the service's pools: no `SELECT 1` on every checkout.
                let pool = r2d2::Pool::builder()
                    .max_size(8)
                    .test_on_check_out(false)
                    .connection_customizer(Box::new(SqliteNormal))
                    .build(manager)
                    .expect("baseline pool");
                pool.get()
                    .expect("baseline connection")
                    .batch_execute(BARE_TABLE)
                    .expect("table");
                let file = config.dir.join("bare-group.db").display().to_string();
                // How the service's writer opens its connection (and a
                // replacement's): the same pragmas, synchronous = FULL.
                let open = move || -> Result<SqliteConnection, String> {
                    let mut conn = SqliteConnection::establish(&file).map_err(|e| e.to_string())?;
                    conn.batch_execute(
                        "PRAGMA busy_timeout = 5000; PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;",
                    )
                    .map_err(|e| e.to_string())?;
                    Ok(conn)
                };
                let mut conn = open().expect("the group writer's file");
                conn.batch_execute(BARE_TABLE)
                    .expect("the group writer's table");
                let group = Arc::new(
                    Writer::start(
                        conn,
                        Box::new(open),
                        4_096,
                        std::time::Duration::from_secs(30),
                    )
                    .expect("the group writer"),
                );
                BaselinePool::Sqlite { pool, group }
            }
            Target::Postgres { url, .. } => {
                let manager = ConnectionManager::<PgConnection>::new(url.clone());
                // As the service's pools: no `SELECT 1` (a round trip) on
                // every checkout.
                let pool = r2d2::Pool::builder()
                    .max_size(config.connections.max(8))
                    .test_on_check_out(false)
                    .build(manager)
                    .expect("baseline pool");
                pool.get()
                    .expect("baseline connection")
                    .batch_execute(BARE_TABLE_PG)
                    .expect("table");
                BaselinePool::Postgres(pool)
            }
        };
        pool.insert().expect("the row that bare reads read");
        let port = free_port();
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let data = web::Data::new(pool);
                let server = HttpServer::new(move || {
                    App::new()
                        .app_data(data.clone())
                        .route("/bare", web::post().to(bare_insert))
                        .route("/bare-group", web::post().to(bare_group_insert))
                        .route("/bare/{seq}", web::get().to(bare_read))
                })
                .bind(("127.0.0.1", port))
                .expect("bind the baseline")
                .disable_signals()
                .run();
                tx.send(server.handle()).expect("report the handle");
                let _ = server.await;
            });
        });
        let handle = rx.recv().expect("baseline started");
        Self {
            base: format!("http://127.0.0.1:{port}"),
            handle,
            thread: Some(thread),
        }
    }
}

impl Drop for Baseline {
    fn drop(&mut self) {
        let handle = self.handle.clone();
        actix_web::rt::System::new().block_on(handle.stop(true));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn bare_insert(pool: web::Data<BaselinePool>) -> HttpResponse {
    match web::block(move || pool.insert()).await {
        Ok(Ok(id)) => HttpResponse::Created().json(serde_json::json!({ "id": id })),
        _ => HttpResponse::ServiceUnavailable().finish(),
    }
}

async fn bare_group_insert(pool: web::Data<BaselinePool>) -> HttpResponse {
    match pool.group_insert().await {
        Ok(id) => HttpResponse::Created().json(serde_json::json!({ "id": id })),
        Err(_) => HttpResponse::ServiceUnavailable().finish(),
    }
}

async fn bare_read(pool: web::Data<BaselinePool>, seq: web::Path<i64>) -> HttpResponse {
    let seq = seq.into_inner();
    match web::block(move || pool.read(seq)).await {
        Ok(Ok(Some(row))) => HttpResponse::Ok().json(row),
        Ok(Ok(None)) => HttpResponse::NotFound().finish(),
        _ => HttpResponse::ServiceUnavailable().finish(),
    }
}
