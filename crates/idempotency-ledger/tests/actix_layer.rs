//! The actix-web layer against a real ledger: a defect — the ledger's
//! table missing — is a `500`, never a "retry later".
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use actix_web::{App, HttpResponse, ResponseError, test, web};
use idempotency_ledger::actix::Idempotent;
use idempotency_ledger::db::{Backend, Pool, PoolOptions};
use idempotency_ledger::{Completion, Ledger, LedgerError, RecordedResponse, Settings};

#[derive(Debug, thiserror::Error)]
#[error("failed")]
struct Failed;
impl ResponseError for Failed {}

async fn create(
    idem: Idempotent,
    ledger: web::Data<Ledger>,
) -> Result<HttpResponse, LedgerError<Failed>> {
    idem.execute(&ledger, "ada", |_, _| {
        Ok(Completion::Record(RecordedResponse {
            status: 201,
            headers: vec![],
            body: vec![],
        }))
    })
    .await
}

#[actix_web::test]
async fn a_missing_ledger_table_is_a_500_and_never_a_retry_later() {
    let file = std::env::temp_dir().join(format!("ledger-no-table-{}.db", uuid::Uuid::new_v4()));
    let url = file.to_str().unwrap();
    let lease = Duration::from_secs(30);
    let options = PoolOptions {
        max_size: 2,
        connection_timeout: Duration::from_secs(5),
        lease,
        write_queue: 16,
        shown: "a database without the ledger's table".into(),
    };
    let pool = Pool::connect(Backend::Sqlite, url, &options).unwrap();
    let ledger = Ledger::new(
        pool,
        Settings {
            retention: Duration::from_secs(60),
            wait: Duration::from_secs(1),
            waiters_per_key: 4,
            write_admission: 4,
            remember: Duration::ZERO,
        },
    );
    let app = test::init_service(
        App::new()
            .app_data(web::Data::new(ledger))
            .route("/x", web::post().to(create)),
    )
    .await;
    let request = test::TestRequest::post()
        .uri("/x")
        .insert_header(("Idempotency-Key", "k"))
        .insert_header(("Content-Type", "application/json"))
        .set_payload("{}")
        .to_request();
    let response = test::call_service(&app, request).await;
    assert_eq!(response.status(), 500);
    assert!(response.headers().get("retry-after").is_none());
    let body = test::read_body(response).await;
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["error"], "INTERNAL_ERROR");
    assert!(
        !String::from_utf8_lossy(&body).contains("idempotency_ledger"),
        "no internals"
    );
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{url}{suffix}"));
    }
}
