//! A room-booking service whose every mutation is safe to retry, on the
//! ledger and its actix-web layer:
//!
//! - `POST /bookings` `{"room": "12", "nights": 3}` books a room: `201` and
//!   the booking, `Location: /bookings/{id}`;
//! - `POST /bookings/{id}/cancel` cancels it: `200` and the booking;
//! - `GET /bookings/{id}` reads it.
//!
//! Every request names its guest in `X-Guest` (a stand-in for real
//! authentication); the `POST`s need an `Idempotency-Key`.
//!
//! ```text
//! cargo run -p idempotency-ledger --example bookings                  # SQLite, ./bookings.db
//! DATABASE_URL=postgres://localhost/bookings cargo run -p idempotency-ledger --example bookings
//! BIND=127.0.0.1:0 …                                                  # any free port (printed)
//! ```
#![allow(clippy::print_stdout)]

use actix_web::http::StatusCode;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, ResponseError, web};
use diesel::prelude::*;
use diesel_migrations::{EmbeddedMigrations, embed_migrations};
use idempotency_ledger::actix::{Caller, Idempotent, IdempotentConfig};
use idempotency_ledger::db::{Conn, Pool};
use idempotency_ledger::row::{Columns, Row};
use idempotency_ledger::{
    Completion, Ledger, LedgerError, LedgerTx, Migrations, Options, RecordedResponse, on_conn,
    spawn_maintenance,
};
use serde::{Deserialize, Serialize};

// ---- The domain: a booking, its table, its answers. ----

diesel::table! {
    bookings (id) {
        id -> Text,
        guest -> Text,
        idempotency_key -> Text,
        request_fingerprint -> Text,
        room -> Text,
        nights -> Integer,
        status -> Text,
    }
}

/// A booking as its table stores it.
#[derive(Debug, Clone, Queryable, Serialize)]
struct Booking {
    id: String,
    #[serde(skip)]
    guest: String,
    #[serde(skip)]
    idempotency_key: String,
    /// Kept on the row: a retry whose ledger entry was purged is told from
    /// another request with the same key by it.
    #[serde(skip)]
    request_fingerprint: String,
    room: String,
    nights: i32,
    status: String,
}

impl Row for Booking {
    const TABLE: &'static str = "bookings";
    const UNIQUE: &'static [&'static str] = &["guest", "idempotency_key"];
    fn columns<'b, C: Columns<'b>>(&'b self, c: &mut C) -> QueryResult<()> {
        c.column("id", self.id.as_str())?;
        c.column("guest", self.guest.as_str())?;
        c.column("idempotency_key", self.idempotency_key.as_str())?;
        c.column("request_fingerprint", self.request_fingerprint.as_str())?;
        c.column("room", self.room.as_str())?;
        c.column("nights", &self.nights)?;
        c.column("status", self.status.as_str())
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewBooking {
    room: String,
    nights: i32,
}

/// The domain's errors; below 500 they are recorded and replayed.
#[derive(Debug, thiserror::Error)]
enum BookingError {
    #[error("no such booking")]
    NotFound,
    #[error("the body is not a booking: {0}")]
    Invalid(String),
    #[error("a guest must be named in X-Guest")]
    NoGuest,
    #[error("the database cannot be reached; retry shortly")]
    Unavailable,
    #[error("the database failed")]
    Database(#[from] diesel::result::Error),
}

impl ResponseError for BookingError {
    fn status_code(&self) -> StatusCode {
        match self {
            BookingError::NotFound => StatusCode::NOT_FOUND,
            BookingError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            BookingError::NoGuest => StatusCode::UNAUTHORIZED,
            BookingError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            BookingError::Database(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status_code())
            .json(serde_json::json!({ "error": self.to_string() }))
    }
}

/// A JSON answer as the ledger records it.
fn reply(status: StatusCode, booking: &Booking) -> RecordedResponse {
    RecordedResponse {
        status: status.as_u16(),
        headers: vec![
            ("Content-Type".into(), "application/json".into()),
            ("Location".into(), format!("/bookings/{}", booking.id)),
        ],
        body: serde_json::to_vec(booking).unwrap_or_default(),
    }
}

fn find(conn: &mut Conn<'_>, guest: &str, id: &str) -> Result<Booking, BookingError> {
    let query = bookings::table
        .filter(bookings::guest.eq(guest))
        .filter(bookings::id.eq(id));
    on_conn!(conn, c => query.first::<Booking>(c).optional())?.ok_or(BookingError::NotFound)
}

/// The guest's booking made with this key, if any.
fn made_with(tx: &mut LedgerTx<'_, '_>, caller: &Caller) -> Result<Option<Booking>, BookingError> {
    let query = bookings::table
        .filter(bookings::guest.eq(&caller.user))
        .filter(bookings::idempotency_key.eq(caller.key.as_str()));
    Ok(on_conn!(tx.conn(), c => query.first::<Booking>(c).optional())?)
}

async fn create(
    guest: Guest,
    idem: Idempotent,
    ledger: web::Data<Ledger>,
) -> Result<HttpResponse, LedgerError<BookingError>> {
    let new: NewBooking = idem
        .json()
        .map_err(|e| LedgerError::Operation(BookingError::Invalid(e.to_string())))?;
    // Made only when the key is new: a replay makes no id.
    let make = move |caller: &Caller| {
        let booking = Booking {
            id: uuid::Uuid::now_v7().to_string(),
            guest: caller.user.clone(),
            idempotency_key: caller.key.as_str().to_owned(),
            request_fingerprint: caller.fingerprint.as_str().to_owned(),
            room: new.room,
            nights: new.nights,
            status: "booked".into(),
        };
        let created = reply(StatusCode::CREATED, &booking);
        (booking, created)
    };
    // The row exists already (its ledger entry was purged): this request's
    // own earlier effect when the fingerprints match, else a reused key.
    let found = |tx: &mut LedgerTx<'_, '_>, caller: &Caller| {
        Ok(match made_with(tx, caller)? {
            Some(b) if b.request_fingerprint == caller.fingerprint.as_str() => {
                Completion::ReplayFound(reply(StatusCode::OK, &b))
            }
            _ => Completion::KeyReusedFound,
        })
    };
    idem.execute_insert(&ledger, guest.0, make, found).await
}

async fn cancel(
    guest: Guest,
    id: web::Path<String>,
    idem: Idempotent,
    ledger: web::Data<Ledger>,
) -> Result<HttpResponse, LedgerError<BookingError>> {
    let id = id.into_inner();
    idem.execute(&ledger, guest.0, move |tx, caller| {
        let target = bookings::table
            .filter(bookings::guest.eq(&caller.user))
            .filter(bookings::id.eq(&id));
        let update = diesel::update(target).set(bookings::status.eq("cancelled"));
        if on_conn!(tx.conn(), c => update.execute(c))? == 0 {
            return Err(BookingError::NotFound); // a 404, recorded
        }
        let booking = find(tx.conn(), &caller.user, &id)?;
        Ok(Completion::Record(reply(StatusCode::OK, &booking)))
    })
    .await
}

async fn get(
    guest: Guest,
    id: web::Path<String>,
    pool: web::Data<Pool>,
) -> Result<HttpResponse, BookingError> {
    let booking = web::block(move || {
        let mut pooled = pool.get().map_err(|_| BookingError::Unavailable)?;
        find(&mut pooled.conn(), &guest.0, &id)
    })
    .await
    .map_err(|_| BookingError::Unavailable)??;
    Ok(HttpResponse::Ok().json(booking))
}

/// Who is asking: the `X-Guest` header (real authentication goes here).
struct Guest(String);

impl actix_web::FromRequest for Guest {
    type Error = BookingError;
    type Future = std::future::Ready<Result<Self, BookingError>>;
    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let guest = req.headers().get("X-Guest").and_then(|v| v.to_str().ok());
        std::future::ready(
            guest
                .map(|g| Guest(g.to_owned()))
                .ok_or(BookingError::NoGuest),
        )
    }
}

// ---- The wiring: migrations, the pool, the ledger, its maintenance. ----

const SQLITE: EmbeddedMigrations = embed_migrations!("examples/bookings/migrations/sqlite");
const POSTGRES: EmbeddedMigrations = embed_migrations!("examples/bookings/migrations/postgres");

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "bookings.db".into());
    let migrations = Migrations {
        sqlite: SQLITE,
        postgres: POSTGRES,
    };
    let options = Options {
        migrations: Some(migrations),
        ..Options::default()
    };
    let ledger = idempotency_ledger::open(&url, options).map_err(std::io::Error::other)?;
    let maintenance = spawn_maintenance(ledger.pool(), Default::default());
    let pool = web::Data::new(ledger.pool().clone());
    let ledger = web::Data::new(ledger);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(ledger.clone())
            .app_data(pool.clone())
            .route("/bookings", web::post().to(create))
            .service(
                web::resource("/bookings/{id}/cancel")
                    .app_data(IdempotentConfig::body_optional())
                    .route(web::post().to(cancel)),
            )
            .route("/bookings/{id}", web::get().to(get))
    })
    .bind(std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:8080".into()))?;
    for address in server.addrs() {
        println!("listening on http://{address}");
    }
    let server = server.run();
    tokio::select! {
        served = server => served,
        why = maintenance.writer_gave_up() => Err(std::io::Error::other(why)),
    }
}
