//! An order's row is described once (`NewOrderRow`), and every way of
//! writing it is built from that description: the ledger's unit of writing
//! (SQLite's group-committed savepoint, PostgreSQL's transaction) and, on
//! PostgreSQL, the one-statement create. Written through each, the stored
//! rows are the same, column by column.

use diesel::prelude::*;
use diesel::sql_types::Text;
use idempotency_ledger::{Completion, Fingerprint, IdempotencyKey, LedgerRequest, Outcome};
use orders_api::db::Conn;
use orders_api::orders::input::parse_new_order;
use orders_api::orders::model::{OrderId, OrderStatus};
use orders_api::orders::{self, model::Order};

use crate::both_backends;
use crate::helpers::*;

/// Every column of one stored order but `seq`, `id` and the key, as text.
fn stored(app: &TestApp, key: &str) -> Vec<String> {
    #[derive(QueryableByName, Debug)]
    struct Row {
        #[diesel(sql_type = Text)]
        user_id: String,
        #[diesel(sql_type = Text)]
        item: String,
        #[diesel(sql_type = Text)]
        quantity: String,
        #[diesel(sql_type = Text)]
        price_cents: String,
        #[diesel(sql_type = Text)]
        status: String,
        #[diesel(sql_type = Text)]
        request_fingerprint: String,
        #[diesel(sql_type = Text)]
        created_at: String,
        #[diesel(sql_type = Text)]
        updated_at: String,
    }
    let mut pooled = app.pool.get().expect("connection");
    let row: Row = match pooled.conn() {
        Conn::Sqlite(c) => diesel::sql_query(
            "SELECT user_id, item, CAST(quantity AS TEXT) AS quantity, \
             CAST(price_cents AS TEXT) AS price_cents, status, request_fingerprint, \
             created_at, updated_at FROM orders WHERE idempotency_key = ?",
        )
        .bind::<Text, _>(key)
        .get_result(c),
        Conn::Postgres(c) => diesel::sql_query(
            "SELECT user_id, item, quantity::text AS quantity, price_cents::text AS price_cents, \
             status, request_fingerprint, created_at::text AS created_at, \
             updated_at::text AS updated_at FROM orders WHERE idempotency_key = $1",
        )
        .bind::<Text, _>(key)
        .get_result(c),
    }
    .expect("the stored order");
    vec![
        row.user_id,
        row.item,
        row.quantity,
        row.price_cents,
        row.status,
        row.request_fingerprint,
        row.created_at,
        row.updated_at,
    ]
}

both_backends! {
    fn a_row_is_stored_the_same_whichever_path_writes_it(backend) {
        let app = TestApp::spawn(backend);
        let ledger = app.settings.ledger(app.pool.clone());
        let body = order_body("Widget", 3, "19.99");
        let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        let fingerprint = Fingerprint::of("POST", "/v1/orders", body.as_bytes(), Some(&json));
        let order = orders::prepare("alice", &fingerprint, parse_new_order(&json).expect("valid"));
        // The same order but for its id: only `seq`, `id` and the key may differ.
        let twin = |order: &Order| Order { id: OrderId::generate(), ..order.clone() };
        let created = idempotency_ledger::RecordedResponse { status: 201, headers: vec![], body: b"{}".to_vec() };
        let run = actix_web::rt::System::new();

        // The create's own path: one statement on PostgreSQL, a unit on SQLite.
        let one_key = IdempotencyKey::parse(b"path-insert").expect("key");
        let one = run.block_on(ledger.execute_insert(
            LedgerRequest { user_id: "alice", key: &one_key, fingerprint: &fingerprint },
            {
                let made = (orders::new_row(&order, &one_key), created.clone());
                move || made
            },
            |_| -> Result<Completion, ()> { panic!("the row is new") },
        ));
        assert!(matches!(one, Ok(Outcome::Executed(_))), "{one:?}");

        // The general path: a unit that inserts the row itself.
        let general_key = IdempotencyKey::parse(b"path-unit").expect("key");
        let row = orders::new_row(&twin(&order), &general_key);
        let general = run.block_on(ledger.execute(
            LedgerRequest { user_id: "alice", key: &general_key, fingerprint: &fingerprint },
            move |tx| -> Result<Completion, ()> {
                assert!(tx.insert(&row).expect("insert"), "the row is new");
                Ok(Completion::Record(created))
            },
        ));
        assert!(matches!(general, Ok(Outcome::Executed(_))), "{general:?}");

        let (a, b) = (stored(&app, "path-insert"), stored(&app, "path-unit"));
        assert_eq!(a, b, "the two paths stored different rows");
        assert_eq!(&a[..6], &["alice", "Widget", "3", "1999", OrderStatus::Pending.as_str(), fingerprint.as_str()]);
        assert_eq!(a[6], a[7], "updated_at starts as created_at");
        // And the domain reads it back as the order it wrote.
        let mut pooled = app.pool.get().expect("connection");
        let read = orders::get(&mut pooled.conn(), "alice", &order.id.to_string()).expect("read back");
        assert_eq!(read, order);
    }
}
