//! What the request path sends to PostgreSQL, read on the wire: every
//! statement that touches `orders` or `idempotency_ledger` names its user —
//! `user_id = $n` among the conditions its `WHERE` requires, or `user_id` in
//! the columns it inserts — so that a table distributed by `user_id`
//! (Citus, docs/SCALING.md) routes it to the one shard of that user.
//!
//! A relay in front of the test's PostgreSQL records the text of every
//! statement the server prepares (a Parse message) or sends whole (a Query
//! message): what the service sends, however it builds it (diesel's DSL,
//! the ledger's hand-built statements). Bind parameters are not read:
//! diesel binds every value, so a condition on the user is `user_id = $n`.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};

use diesel::pg::Pg;
use diesel::prelude::*;

use crate::expect::id_of;
use crate::failover::{authority, through};
use crate::helpers::*;

/// The protocol code of a StartupMessage (3.0); the other codes a client
/// may send before it (SSL or GSSAPI encryption requests) keep the
/// connection in its untyped startup phase.
const PROTOCOL_3: u32 = 196_608;

/// A TCP relay in front of PostgreSQL that records the text of every
/// statement its clients prepare or send.
struct StatementLog {
    front: crate::net::Front,
    seen: Arc<Mutex<Vec<String>>>,
}

impl StatementLog {
    fn start(upstream: String) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let front = crate::net::Front::start(move |client, _| {
            if let Ok(server) = TcpStream::connect(&upstream) {
                relay(client, server, Arc::clone(&log));
            }
        });
        Self { front, seen }
    }

    /// Every statement recorded since the last call, in order.
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.seen.lock().expect("not poisoned"))
    }
}

fn relay(client: TcpStream, server: TcpStream, log: Arc<Mutex<Vec<String>>>) {
    let (mut from_client, mut to_server) = (
        client.try_clone().expect("clone"),
        server.try_clone().expect("clone"),
    );
    let (mut from_server, mut to_client) = (server, client);
    std::thread::spawn(move || {
        let mut reader = FrontendMessages::default();
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n) = from_client.read(&mut buf) {
            if n == 0 {
                break;
            }
            for statement in reader.statements(&buf[..n]) {
                log.lock().expect("not poisoned").push(statement);
            }
            if to_server.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to_server.shutdown(Shutdown::Both);
    });
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_server, &mut to_client);
        let _ = to_client.shutdown(Shutdown::Both);
    });
}

/// Reads one connection's frontend messages across reads.
#[derive(Default)]
struct FrontendMessages {
    pending: Vec<u8>,
    started: bool,
}

impl FrontendMessages {
    /// The statement texts of the messages `chunk` completes.
    fn statements(&mut self, chunk: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(chunk);
        let mut found = Vec::new();
        loop {
            // Before the StartupMessage a message has no type byte.
            let header = if self.started { 5 } else { 4 };
            if self.pending.len() < header {
                break;
            }
            let at = header - 4;
            let len = u32::from_be_bytes([
                self.pending[at],
                self.pending[at + 1],
                self.pending[at + 2],
                self.pending[at + 3],
            ]) as usize;
            let total = at + len;
            if len < 4 || self.pending.len() < total {
                break;
            }
            let message: Vec<u8> = self.pending.drain(..total).collect();
            if !self.started {
                let code = message
                    .get(4..8)
                    .map_or(0, |c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
                self.started = code == PROTOCOL_3;
                continue;
            }
            let body = &message[5..];
            match message[0] {
                b'Q' => found.push(c_string(body).0),
                b'P' => {
                    let (_name, rest) = c_string(body);
                    found.push(c_string(rest).0);
                }
                _ => {}
            }
        }
        found
    }
}

/// The first NUL-terminated string of `body` (as text), and what follows it.
fn c_string(body: &[u8]) -> (String, &[u8]) {
    let end = body.iter().position(|&b| b == 0).unwrap_or(body.len());
    (
        String::from_utf8_lossy(&body[..end]).into_owned(),
        body.get(end + 1..).unwrap_or_default(),
    )
}

/// A statement's text as the checks read it: lowercase, identifiers
/// unquoted, whitespace single.
fn normalized(sql: &str) -> String {
    sql.replace('"', "")
        .to_lowercase()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `text` is wholly wrapped in one pair of parentheses.
fn wrapped(text: &str) -> bool {
    if !(text.starts_with('(') && text.ends_with(')')) {
        return false;
    }
    let mut depth = 0i32;
    for (i, ch) in text.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if depth == 0 && i < text.len() - 1 {
            return false;
        }
    }
    true
}

/// The conditions an expression requires: its top-level `AND`s, flattened
/// through parentheses. (An `OR` is one condition: nothing in it is
/// required.)
fn conjuncts(expression: &str) -> Vec<String> {
    let mut text = expression.trim();
    while wrapped(text) {
        text = text[1..text.len() - 1].trim();
    }
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'(' => depth += 1,
            b')' => depth -= 1,
            b' ' if depth == 0 && text[i..].starts_with(" and ") => {
                parts.push(&text[start..i]);
                start = i + 5;
                i += 4;
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(&text[start..]);
    if parts.len() == 1 {
        return vec![text.to_owned()];
    }
    parts.into_iter().flat_map(conjuncts).collect()
}

/// The text from `from` to the end of its enclosing parentheses (or of the
/// statement).
fn rest_of_group(sql: &str, from: usize) -> &str {
    let mut depth = 0i32;
    for (i, ch) in sql[from..].char_indices() {
        match ch {
            '(' => depth += 1,
            ')' if depth == 0 => return &sql[from..from + i],
            ')' => depth -= 1,
            _ => {}
        }
    }
    &sql[from..]
}

/// Where `word` stands at depth 0 in `text`, as a whole word.
fn top_level(text: &str, word: &str) -> Option<usize> {
    let mut depth = 0i32;
    for (i, ch) in text.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ if depth == 0 && text[i..].starts_with(word) => {
                let before = text[..i].chars().next_back().is_none_or(|c| c == ' ');
                let after = text[i + word.len()..]
                    .chars()
                    .next()
                    .is_none_or(|c| c == ' ' || c == '(');
                if before && after {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

const TABLES: [&str; 2] = ["orders", "idempotency_ledger"];

/// Each place `sql` (normalized) reads or writes one of [`TABLES`], with how
/// it names its user: `Ok(the condition or column)`, or `Err(why not)`.
fn routing(sql: &str) -> Vec<(String, Result<String, String>)> {
    let mut found = Vec::new();
    for keyword in ["from", "into", "update", "join"] {
        for table in TABLES {
            let needle = format!("{keyword} {table}");
            let mut at = 0;
            while let Some(i) = sql[at..].find(&needle).map(|i| at + i) {
                at = i + needle.len();
                let ends_word = sql[at..]
                    .chars()
                    .next()
                    .is_none_or(|c| c == ' ' || c == '(' || c == ')');
                if !ends_word {
                    continue;
                }
                let place = format!("{keyword} {table}");
                let scope = rest_of_group(sql, at);
                let how = if keyword == "into" {
                    let columns = scope
                        .trim_start()
                        .strip_prefix('(')
                        .map(|rest| rest_of_group(rest, 0))
                        .unwrap_or("");
                    match columns.split(',').any(|c| c.trim() == "user_id") {
                        true => Ok("user_id among the inserted columns".to_owned()),
                        false => Err(format!("inserts ({columns}) without user_id")),
                    }
                } else {
                    match top_level(scope, "where") {
                        None => Err("no WHERE".to_owned()),
                        Some(w) => {
                            let mut condition = &scope[w + "where".len()..];
                            for end in ["order by", "group by", "limit", "returning", "for"] {
                                if let Some(e) = top_level(condition, end) {
                                    condition = &condition[..e];
                                }
                            }
                            let required = conjuncts(condition);
                            required
                                .iter()
                                .find(|c| {
                                    let c = c.trim();
                                    let column = c.split(" = ").next().unwrap_or("");
                                    let value = c.split(" = ").nth(1).unwrap_or("");
                                    (column == "user_id" || column == format!("{table}.user_id"))
                                        && value.starts_with('$')
                                })
                                .map(|c| c.trim().to_owned())
                                .ok_or_else(|| {
                                    format!("requires no user_id = $n: {}", required.join(" AND "))
                                })
                        }
                    }
                };
                found.push((place, how));
            }
        }
    }
    found
}

/// The statements of the background tasks, which are not the request path
/// and span every shard by design: the ledger-rows gauge's count (its first
/// run is at the server's start, and it may come round again during a slow
/// test).
fn background() -> Vec<String> {
    let count = idempotency_ledger::schema::pg::idempotency_ledger::table.count();
    let text = diesel::debug_query::<Pg, _>(&count).to_string();
    let text = text.split(" -- binds").next().unwrap_or(&text);
    vec![normalized(text)]
}

/// A server on a fresh PostgreSQL database reached through a
/// [`StatementLog`], with the purge (a background task) out of the way.
fn logged_app() -> (StatementLog, TestApp) {
    let db = TestDb::fresh(orders_api::db::Backend::Postgres);
    let log = StatementLog::start(db.url.as_str()[authority(&db.url)].to_owned());
    let relayed = through(&db.url, log.front.port);
    let app = TestApp::spawn_on(db, |s| {
        s.database_url = relayed;
        s.purge_interval_secs = orders_api::config::MAX_PURGE_INTERVAL_SECS;
    });
    (log, app)
}

crate::postgres_only! {
    fn every_statement_the_request_path_sends_to_orders_or_the_ledger_names_its_user() {
        let (log, app) = logged_app();
        let bob = app.create_token("bob");
        let body = order_body("Widget", 2, "9.99");
        let _ = log.take(); // migrations and the test's own setup

        // Every route, and every way through it.
        let created = app.post_order(Some("create"), &body);
        assert_eq!(created.status, 201, "{}", created.body);
        let id = id_of(&created);
        assert_eq!(app.post_order(Some("create"), &body).status, 200, "replay");
        let reused = app.post_order(Some("create"), &order_body("Widget", 3, "9.99"));
        assert_eq!(reused.status, 409, "{}", reused.body);
        assert_eq!(app.post_order(Some("second"), &body).status, 201);
        assert_eq!(
            app.call("GET", &format!("/v1/orders/{id}"), None, None)
                .status,
            200
        );
        let theirs = app.call_as(&bob, "GET", &format!("/v1/orders/{id}"), None, None);
        assert_eq!(theirs.status, 404, "another user's order");
        let first_page = app.call("GET", "/v1/orders?limit=1", None, None);
        assert_eq!(first_page.status, 200, "{}", first_page.body);
        let cursor = first_page.json()["next_cursor"]
            .as_str()
            .expect("a second page")
            .to_owned();
        let second_page = app.call(
            "GET",
            &format!("/v1/orders?limit=1&cursor={cursor}"),
            None,
            None,
        );
        assert_eq!(second_page.status, 200, "{}", second_page.body);
        let patch = Some(r#"{"quantity":5}"#);
        let path = format!("/v1/orders/{id}");
        assert_eq!(app.call("PATCH", &path, Some("patch"), patch).status, 200);
        assert_eq!(app.call("DELETE", &path, Some("cancel"), None).status, 200);
        assert_eq!(
            app.call("DELETE", &path, Some("cancel-again"), None).status,
            200
        );
        let not_pending = app.call("PATCH", &path, Some("patch-cancelled"), patch);
        assert_eq!(not_pending.status, 409, "{}", not_pending.body);
        let missing = "/v1/orders/0193a8e48f3c7cc29d6a5b1f2e3d4c5b";
        assert_eq!(app.call("GET", missing, None, None).status, 404);
        assert_eq!(
            app.call("PATCH", missing, Some("patch-missing"), patch)
                .status,
            404
        );
        for route in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
            assert_eq!(app.request("GET", route, &[], None).status, 200, "{route}");
        }
        let mut sent = log.take();

        // After the purge the create's key is new to the ledger, and its order
        // answers: the general way (the order's INSERT, refused, then its read).
        let mut direct = PgConnection::establish(app.db.url.as_str()).expect("connect");
        diesel::sql_query("UPDATE idempotency_ledger SET expires_at = now() - interval '1 day'")
            .execute(&mut direct)
            .expect("expire every entry");
        assert!(orders_api::startup::purge_all(&app.pool).expect("purge") > 0);
        let _ = log.take(); // the purge: a background task, not a request
        assert_eq!(
            app.post_order(Some("create"), &body).status,
            200,
            "replay from the order"
        );
        sent.extend(log.take());

        let background = background();
        let mut statements: Vec<String> = sent.iter().map(|s| normalized(s)).collect();
        statements.sort();
        statements.dedup();
        let mut touched = Vec::new();
        let mut unrouted = Vec::new();
        for statement in &statements {
            if background.contains(statement) {
                continue;
            }
            for (place, how) in routing(statement) {
                match how {
                    Ok(how) => touched.push(format!("{place}: {how}\n    {statement}")),
                    Err(why) => unrouted.push(format!("{place}: {why}\n    {statement}")),
                }
            }
        }
        eprintln!("routed by user_id:\n{}", touched.join("\n"));
        assert!(
            unrouted.is_empty(),
            "statements that no user_id routes to one shard:\n{}",
            unrouted.join("\n")
        );
        for place in [
            "from orders",
            "update orders",
            "into orders",
            "from idempotency_ledger",
            "into idempotency_ledger",
        ] {
            let seen = touched.iter().filter(|t| t.starts_with(place)).count();
            assert!(seen > 0, "no statement {place} was read: {statements:#?}");
        }
    }
}

crate::postgres_only! {
    /// A fresh key's create is its ledger read and the one statement that
    /// takes the key's lock and writes the order and its entry, committed as
    /// it ends: no transaction of its own (PERFORMANCE.md, "Round trips of
    /// a fresh-key create"). A PATCH, a unit of writing, shows that the log
    /// sees a transaction when there is one.
    fn a_fresh_keys_create_opens_no_transaction_and_a_patch_does() {
        let (log, app) = logged_app();
        // The token is looked up once, and remembered.
        assert_eq!(app.call("GET", "/v1/orders", None, None).status, 200);
        let _ = log.take();
        let begins = |sent: &[String]| sent.iter().filter(|s| normalized(s).starts_with("begin")).count();

        let created = app.post_order(Some("fresh"), &order_body("Widget", 2, "9.99"));
        assert_eq!(created.status, 201, "{}", created.body);
        let sent = log.take();
        assert_eq!(begins(&sent), 0, "{sent:#?}");

        let path = format!("/v1/orders/{}", id_of(&created));
        let patched = app.call("PATCH", &path, Some("patch"), Some(r#"{"quantity":5}"#));
        assert_eq!(patched.status, 200, "{}", patched.body);
        let sent = log.take();
        assert_eq!(begins(&sent), 1, "{sent:#?}");
        assert_eq!((app.order_count(), app.ledger_count()), (1, 2));
    }
}

#[test]
fn the_statement_reader_finds_the_user_condition_only_where_it_is_required() {
    let routed = |sql: &str| routing(&normalized(sql));
    let ok = |sql: &str| routed(sql).iter().all(|(_, how)| how.is_ok()) && !routed(sql).is_empty();
    assert!(ok(
        r#"SELECT "orders"."seq" FROM "orders" WHERE (("orders"."user_id" = $1) AND ("orders"."id" = $2))"#
    ));
    assert!(ok(
        r#"UPDATE "orders" SET "status" = $1 WHERE ((("orders"."user_id" = $2) AND ("orders"."id" = $3)) AND ("orders"."status" = $4)) RETURNING "orders"."seq""#
    ));
    assert!(ok(
        "WITH held AS MATERIALIZED (SELECT 1 WHERE pg_try_advisory_xact_lock($1)), change AS \
         (INSERT INTO orders (id, user_id, item) SELECT $2, $3, $4 FROM held ON CONFLICT (user_id, idempotency_key) \
         DO NOTHING RETURNING 1), entry AS (INSERT INTO idempotency_ledger (idempotency_key, user_id) \
         SELECT $5, $6 FROM change) SELECT count(*) FROM change"
    ));
    assert!(!ok(
        r#"SELECT "orders"."seq" FROM "orders" WHERE ("orders"."id" = $1)"#
    ));
    assert!(!ok(
        r#"SELECT 1 FROM "orders" WHERE (("orders"."user_id" = $1) OR ("orders"."id" = $2))"#
    ));
    assert!(!ok(r#"SELECT COUNT(*) FROM "idempotency_ledger""#));
    assert!(!ok("INSERT INTO orders (id, item) VALUES ($1, $2)"));
    assert!(!ok(idempotency_ledger::db::PURGE_POSTGRES));
    // A table whose name only starts like one of them is not one of them.
    assert!(routed(r#"SELECT 1 FROM "orders_archive""#).is_empty());
}
