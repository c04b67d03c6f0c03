//! What the people who run the service rely on: request ids, health and
//! readiness, Prometheus metrics and structured logs. Metrics and logs are
//! read from the real binary in its own process, so no other test's
//! requests are counted and the log is the one an operator sees.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use diesel::RunQueryDsl;
use orders_api::db::Conn;
use serde_json::Value;

use crate::both_backends;
use crate::helpers::*;
use crate::net::Client;
use crate::process::{self, ServerProcess};

const TIMEOUT: Duration = Duration::from_secs(30);

fn is_uuid(s: &str) -> bool {
    uuid::Uuid::try_parse(s).is_ok()
}

/// The samples of a Prometheus text exposition: `(name, labels) → value`.
fn samples(text: &str) -> BTreeMap<(String, BTreeMap<String, String>), f64> {
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("a value in {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let rest = rest.strip_suffix('}').expect("closing brace");
                let labels = rest
                    .split("\",")
                    .filter(|p| !p.is_empty())
                    .map(|pair| {
                        let (k, v) = pair.split_once("=\"").expect("label=\"value\"");
                        (k.to_owned(), v.trim_end_matches('"').to_owned())
                    })
                    .collect();
                (name.to_owned(), labels)
            }
            None => (series.to_owned(), BTreeMap::new()),
        };
        out.insert((name, labels), value);
    }
    out
}

fn sample(
    all: &BTreeMap<(String, BTreeMap<String, String>), f64>,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    let labels = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    all.get(&(name.to_owned(), labels)).copied()
}

fn scrape(server: &ServerProcess) -> BTreeMap<(String, BTreeMap<String, String>), f64> {
    samples(&scrape_text(server))
}

/// The text of `/metrics` of a server in its own process (metrics are
/// process-wide, so no other test's requests are counted).
pub(crate) fn scrape_text(server: &ServerProcess) -> String {
    let res = crate::net::Client::anonymous(&server.address(), TIMEOUT)
        .get("/metrics")
        .expect("/metrics answers");
    assert_eq!(res.status, 200);
    assert!(
        res.header("Content-Type")
            .unwrap_or_default()
            .starts_with("text/plain")
    );
    res.0.body
}

/// Scrapes until `done` holds (at most [`TIMEOUT`]); the last scrape.
fn scrape_until(
    server: &ServerProcess,
    done: impl Fn(&BTreeMap<(String, BTreeMap<String, String>), f64>) -> bool,
) -> BTreeMap<(String, BTreeMap<String, String>), f64> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let metrics = scrape(server);
        if done(&metrics) || Instant::now() > deadline {
            return metrics;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A fresh database for a server process, with alice's token.
fn database(backend: orders_api::db::Backend) -> (TestDb, orders_api::db::Pool, String) {
    let db = TestDb::fresh(backend);
    let pool = process::prepare(&db.url);
    let token = process::create_token(&pool, "alice");
    (db, pool, token)
}

pub(crate) fn remove_last_migration_record(app: &TestApp) -> String {
    #[derive(diesel::QueryableByName)]
    struct Version {
        #[diesel(sql_type = diesel::sql_types::Text)]
        version: String,
    }
    let mut pooled = app.pool.get().unwrap();
    let query = "SELECT version FROM __diesel_schema_migrations ORDER BY version DESC LIMIT 1";
    let version = match pooled.conn() {
        Conn::Sqlite(c) => diesel::sql_query(query).get_result::<Version>(c),
        Conn::Postgres(c) => diesel::sql_query(query).get_result::<Version>(c),
    }
    .unwrap()
    .version;
    let delete = format!("DELETE FROM __diesel_schema_migrations WHERE version = '{version}'");
    match pooled.conn() {
        Conn::Sqlite(c) => diesel::sql_query(&delete).execute(c),
        Conn::Postgres(c) => diesel::sql_query(&delete).execute(c),
    }
    .unwrap();
    version
}

pub(crate) fn restore_migration_record(app: &TestApp, version: &str) {
    let mut pooled = app.pool.get().unwrap();
    let insert = format!("INSERT INTO __diesel_schema_migrations (version) VALUES ('{version}')");
    match pooled.conn() {
        Conn::Sqlite(c) => diesel::sql_query(&insert).execute(c),
        Conn::Postgres(c) => diesel::sql_query(&insert).execute(c),
    }
    .unwrap();
}

both_backends! {
    fn a_sane_x_request_id_is_echoed_back_on_success_and_on_errors(backend) {
        let app = TestApp::spawn(backend);
        let auth = format!("Bearer {}", app.token);

        let ok = app.request("GET", "/v1/orders", &[("Authorization", &auth), ("X-Request-Id", "req-42.a:b_c")], None);
        let unauthorized = app.request("GET", "/v1/orders", &[("X-Request-Id", "req-43")], None);
        let bad_key = app.request(
            "POST",
            "/v1/orders",
            &[("Authorization", &auth), ("X-Request-Id", "req-44"), ("Content-Type", "application/json")],
            Some(&order_body("Widget", 1, "1.00")),
        );

        assert_eq!(ok.status, 200);
        assert_eq!(ok.header("X-Request-Id"), Some("req-42.a:b_c"));
        assert_eq!(unauthorized.status, 401);
        assert_eq!(unauthorized.header("X-Request-Id"), Some("req-43"));
        assert_eq!(bad_key.status, 400);
        assert_eq!(bad_key.header("X-Request-Id"), Some("req-44"));
    }

    fn a_request_without_x_request_id_gets_a_generated_one(backend) {
        let app = TestApp::spawn(backend);

        let first = app.request("GET", "/healthz", &[], None);
        let second = app.call("GET", "/v1/orders/nope", None, None);

        let first_id = first.header("X-Request-Id").expect("an id on a 200");
        let second_id = second.header("X-Request-Id").expect("an id on a 404");
        assert_eq!(second.status, 404);
        assert!(is_uuid(first_id), "{first_id}");
        assert!(is_uuid(second_id), "{second_id}");
        assert_ne!(first_id, second_id);
    }

    fn an_unsafe_x_request_id_is_replaced_not_echoed(backend) {
        let app = TestApp::spawn(backend);
        let too_long = "a".repeat(129);

        for given in ["has space", "semi;colon", "quote\"d", too_long.as_str(), "ünïcode"] {
            let res = app.request("GET", "/healthz", &[("X-Request-Id", given)], None);

            assert_eq!(res.status, 200, "{given}");
            let echoed = res.header("X-Request-Id").expect("an id");
            assert_ne!(echoed, given);
            assert!(is_uuid(echoed), "{given:?} was replaced by a generated id, not {echoed:?}");
        }
    }

    fn healthz_answers_200_without_a_token(backend) {
        let app = TestApp::spawn(backend);

        let res = app.request("GET", "/healthz", &[], None);

        assert_eq!(res.status, 200);
        assert_eq!(res.json()["status"], "ok");
    }

    fn readyz_answers_200_when_the_database_answers_and_every_migration_is_applied(backend) {
        let app = TestApp::spawn(backend);

        let res = app.request("GET", "/readyz", &[], None);

        assert_eq!(res.status, 200, "{}", res.body);
        assert_eq!(res.json()["status"], "ready");
    }

    fn readyz_answers_503_while_a_migration_is_pending_and_200_once_it_is_applied(backend) {
        let app = TestApp::spawn(backend);
        let version = remove_last_migration_record(&app);

        let pending = app.request("GET", "/readyz", &[], None);
        restore_migration_record(&app, &version);
        let applied = app.request("GET", "/readyz", &[], None);

        assert_eq!(pending.status, 503, "{}", pending.body);
        assert_eq!(pending.error_code(), "SERVICE_UNAVAILABLE");
        assert!(pending.header("Retry-After").is_some());
        assert!(pending.header("Content-Type").unwrap_or_default().starts_with("application/problem+json"));
        assert!(!pending.body.contains(&version), "no internals in the body: {}", pending.body);
        assert_eq!(applied.status, 200, "{}", applied.body);
    }

    fn metrics_count_requests_by_route_and_status_and_each_idempotency_outcome(backend) {
        let (db, pool, token) = database(backend);
        // The ledger is counted once per purge interval (at most a minute).
        let server = ServerProcess::start(&db.url, &["--purge-interval-secs", "1"]);
        let client = Client::new(&server.address(), &token, TIMEOUT);
        let body = order_body("Widget", 2, "9.99");

        let created = client.post_order("m-1", &body).unwrap();
        let replayed = client.post_order("m-1", &body).unwrap();
        let reused = client.post_order("m-1", &order_body("Widget", 99, "0.01")).unwrap();
        let no_key = client.call("POST", "/v1/orders", None, Some(&body)).unwrap();
        let location = created.header("Location").unwrap().to_owned();
        let read = client.call("GET", &location, None, None).unwrap();
        let missing = client.call("GET", "/v1/orders/0193a8e4-8f3c-7cc2-9d6a-5b1f2e3d4c5b", None, None).unwrap();
        let ledger_rows = |m: &BTreeMap<_, _>| sample(m, "idempotency_ledger_rows", &[]);
        let metrics = scrape_until(&server, |m| ledger_rows(m) == Some(1.0));

        assert_eq!(
            [created.status, replayed.status, reused.status, no_key.status, read.status, missing.status],
            [201, 200, 409, 400, 200, 404]
        );
        let requests = |method, route, status| {
            sample(&metrics, "http_requests_total", &[("method", method), ("route", route), ("status", status)])
        };
        assert_eq!(requests("POST", "/v1/orders", "201"), Some(1.0));
        assert_eq!(requests("POST", "/v1/orders", "200"), Some(1.0));
        assert_eq!(requests("POST", "/v1/orders", "409"), Some(1.0));
        assert_eq!(requests("POST", "/v1/orders", "400"), Some(1.0));
        assert_eq!(requests("GET", "/v1/orders/{id}", "200"), Some(1.0));
        assert_eq!(requests("GET", "/v1/orders/{id}", "404"), Some(1.0));
        let latency = [("method", "POST"), ("route", "/v1/orders"), ("status", "201")];
        assert_eq!(sample(&metrics, "http_request_duration_seconds_count", &latency), Some(1.0));
        let mut inf = latency.to_vec();
        inf.push(("le", "+Inf"));
        assert_eq!(sample(&metrics, "http_request_duration_seconds_bucket", &inf), Some(1.0));
        assert!(sample(&metrics, "http_request_duration_seconds_sum", &latency).is_some_and(|s| s > 0.0));

        let outcome = |o| sample(&metrics, "idempotency_outcomes_total", &[("outcome", o)]);
        assert_eq!(outcome("executed"), Some(1.0));
        assert_eq!(outcome("replayed"), Some(1.0));
        assert_eq!(outcome("key_reused"), Some(1.0));
        assert_eq!(outcome("in_progress"), Some(0.0));
        assert_eq!(outcome("purged"), Some(0.0));
        assert_eq!(outcome("lease_expired"), Some(0.0));
        assert_eq!(sample(&metrics, "idempotency_ledger_rows", &[]), Some(1.0));
        assert_eq!(process::ledger_count(&pool), 1);
    }

    fn metrics_count_purged_ledger_entries_and_the_ledger_rows_gauge_follows(backend) {
        let (db, pool, token) = database(backend);
        let server = ServerProcess::start(&db.url, &["--retention-secs", "1", "--purge-interval-secs", "1"]);
        let client = Client::new(&server.address(), &token, TIMEOUT);
        for key in ["p-1", "p-2"] {
            assert_eq!(client.post_order(key, &order_body("Widget", 1, "1.00")).unwrap().status, 201);
        }

        let metrics = scrape_until(&server, |m| {
            sample(m, "idempotency_outcomes_total", &[("outcome", "purged")]) == Some(2.0)
                && sample(m, "idempotency_ledger_rows", &[]) == Some(0.0)
        });

        assert_eq!(sample(&metrics, "idempotency_outcomes_total", &[("outcome", "purged")]), Some(2.0));
        assert_eq!(sample(&metrics, "idempotency_outcomes_total", &[("outcome", "executed")]), Some(2.0));
        assert_eq!(sample(&metrics, "idempotency_ledger_rows", &[]), Some(0.0));
        assert_eq!(process::ledger_count(&pool), 0);
        assert_eq!(process::order_count(&pool), 2, "the purge removes ledger entries, never orders");
    }

    fn json_request_logs_carry_request_id_user_and_outcome_and_never_a_token_or_a_body(backend) {
        let (db, _pool, token) = database(backend);
        let server = ServerProcess::start_with_env(&db.url, &[], &[("LOG_FORMAT", "json"), ("RUST_LOG", "info")]);
        let client = Client::new(&server.address(), &token, TIMEOUT);
        let secret_item = format!("Secret-{}", uuid::Uuid::new_v4().simple());
        let body = order_body(&secret_item, 3, "4.56");
        let as_alice = |method, key, body, id| {
            client.call_with(Some(&token), method, "/v1/orders", key, body, &[("X-Request-Id", id)]).unwrap()
        };

        let created = as_alice("POST", Some("log-1"), Some(body.as_str()), "log-created");
        let replayed = as_alice("POST", Some("log-1"), Some(body.as_str()), "log-replayed");
        let listed = as_alice("GET", None, None, "log-listed");
        let wrong_token = format!("{token}x");
        let refused = client.call_with(Some(&wrong_token), "GET", "/v1/orders", None, None, &[("X-Request-Id", "log-refused")]).unwrap();
        assert_eq!([created.status, replayed.status, listed.status, refused.status], [201, 200, 200, 401]);

        let log = server.log_text();
        let lines: Vec<Value> = log
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        let request_line = |id: &str| -> Value {
            lines
                .iter()
                .find(|l| l["message"] == "request" && l["span"]["request_id"] == id)
                .unwrap_or_else(|| panic!("no request line for {id} in\n{log}"))
                .clone()
        };
        let line = request_line("log-created");
        assert_eq!(line["status"], 201);
        assert_eq!(line["span"]["user_id"], "alice");
        assert_eq!(line["span"]["idempotency"], "executed");
        assert_eq!(line["span"]["route"], "/v1/orders");
        assert_eq!(line["span"]["method"], "POST");
        let line = request_line("log-replayed");
        assert_eq!(line["status"], 200);
        assert_eq!(line["span"]["idempotency"], "replayed");
        assert_eq!(request_line("log-listed")["span"]["user_id"], "alice");
        assert_eq!(request_line("log-refused")["status"], 401);

        assert!(!log.contains(&token), "a token is in the log");
        assert!(!log.contains(&wrong_token), "a token is in the log");
        assert!(!log.contains(&secret_item), "a request body is in the log");
    }
}

/// The ledger's SQLite writer counts its batches under the ledger's own
/// names (the crate knows nothing of orders), as the README lists them.
#[test]
fn on_sqlite_the_ledgers_writer_counts_its_batches_under_the_ledgers_own_names() {
    let (db, _pool, token) = database(orders_api::db::Backend::Sqlite);
    let server = ServerProcess::start(&db.url, &[]);
    let client = Client::new(&server.address(), &token, TIMEOUT);
    let created = client
        .post_order("w-1", &order_body("Widget", 2, "9.99"))
        .unwrap();
    assert_eq!(created.status, 201);

    let batches = |m: &BTreeMap<_, _>| sample(m, "idempotency_ledger_write_batches_total", &[]);
    let metrics = scrape_until(&server, |m| batches(m).is_some_and(|n| n >= 1.0));
    assert!(batches(&metrics).is_some_and(|n| n >= 1.0), "{metrics:?}");
    let units = sample(&metrics, "idempotency_ledger_write_batch_units_count", &[]);
    assert!(units.is_some_and(|n| n >= 1.0), "{metrics:?}");
    let text = scrape_text(&server);
    assert!(!text.contains("orders_api_write_batch"), "{text}");
}
