//! The `bookings` example, started as a real process on a free port of
//! 127.0.0.1 and driven over HTTP: a create, its replay, a refused reuse of
//! its key, a cancel and its replay, and a burst of identical creates that
//! makes one booking — on SQLite, and on PostgreSQL at `TEST_DATABASE_URL`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use diesel::prelude::*;
use idempotency_ledger::db::Backend;
use support::Scratch;

/// The example's process, killed when the test ends.
struct Service {
    child: Child,
    address: String,
}

impl Service {
    fn start(db: &Scratch) -> Self {
        // `cargo test` builds the examples, `cargo test --test …` does not:
        // built once here, then found beside the tests
        // (target/<profile>/examples).
        static BUILT: std::sync::Once = std::sync::Once::new();
        BUILT.call_once(|| {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let built = Command::new(cargo)
                .args(["build", "-p", "idempotency-ledger", "--example", "bookings"])
                .status()
                .expect("run cargo");
            assert!(built.success(), "cargo build --example bookings");
        });
        let deps = std::env::current_exe().expect("the test's path");
        let binary = deps
            .parent()
            .and_then(|d| d.parent())
            .expect("the profile's folder")
            .join("examples")
            .join("bookings");
        let mut child = Command::new(&binary)
            .env("DATABASE_URL", &db.url)
            .env("BIND", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("its output"))
            .read_line(&mut line)
            .expect("the address it listens on");
        let address = line
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("not an address: {line:?}"))
            .to_owned();
        Service { child, address }
    }

    /// One request on a connection of its own.
    fn call(&self, method: &str, path: &str, key: Option<&str>, body: &str) -> Answer {
        let mut stream = TcpStream::connect(&self.address).expect("connect");
        let key = key.map_or(String::new(), |k| format!("Idempotency-Key: {k}\r\n"));
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nX-Guest: ada\r\n{key}\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
        let mut raw = String::new();
        stream.read_to_string(&mut raw).expect("the answer");
        let (head, body) = raw.split_once("\r\n\r\n").expect("a head");
        let mut lines = head.lines();
        let status = lines.next().expect("a status line")[9..12]
            .parse()
            .expect("a status");
        let headers = lines
            .filter_map(|l| l.split_once(": "))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned()))
            .collect();
        Answer {
            status,
            headers,
            body: body.to_owned(),
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

fn bookings(db: &Scratch) -> i64 {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let sql = "SELECT count(*) AS n FROM bookings";
    let rows: Vec<Count> = match db.backend {
        Backend::Sqlite => {
            diesel::sql_query(sql).load(&mut SqliteConnection::establish(&db.url).unwrap())
        }
        Backend::Postgres => {
            diesel::sql_query(sql).load(&mut PgConnection::establish(&db.url).unwrap())
        }
    }
    .expect("count the bookings");
    rows[0].n
}

both_backends! {
    fn a_booking_is_made_once_and_its_retries_replay_it(backend) {
        let db = Scratch::fresh(backend);
        let service = Service::start(&db);
        let body = r#"{"room":"12","nights":3}"#;

        let created = service.call("POST", "/bookings", Some("trip-1"), body);
        assert_eq!(created.status, 201, "{}", created.body);
        let id = created.json()["id"].as_str().expect("an id").to_owned();
        assert_eq!(created.header("location"), Some(format!("/bookings/{id}").as_str()));
        assert_eq!(created.header("idempotent-replayed"), None);

        // The same request again, spelled differently: the first answer.
        let replay = service.call("POST", "/bookings", Some("trip-1"), r#"{ "nights": 3, "room": "12" }"#);
        assert_eq!(replay.status, 200);
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
        assert_eq!(replay.header("location"), created.header("location"));
        assert_eq!(replay.body, created.body);

        let reused = service.call("POST", "/bookings", Some("trip-1"), r#"{"room":"14","nights":3}"#);
        assert_eq!(reused.status, 409);
        assert_eq!(reused.json()["error"], "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD");

        let cancelled = service.call("POST", &format!("/bookings/{id}/cancel"), Some("cancel-1"), "");
        assert_eq!(cancelled.status, 200, "{}", cancelled.body);
        assert_eq!(cancelled.json()["status"], "cancelled");
        let again = service.call("POST", &format!("/bookings/{id}/cancel"), Some("cancel-1"), "");
        assert_eq!((again.status, again.header("idempotent-replayed")), (200, Some("true")));

        let missing_key = service.call("POST", "/bookings", None, body);
        assert_eq!(missing_key.status, 400);
        assert_eq!(missing_key.header("content-type"), Some("application/problem+json"));
        assert_eq!(bookings(&db), 1);
    }

    fn a_burst_of_identical_requests_makes_one_booking(backend) {
        let db = Scratch::fresh(backend);
        let service = Service::start(&db);
        let body = r#"{"room":"7","nights":1}"#;
        let answers: Vec<Answer> = std::thread::scope(|s| {
            let calls: Vec<_> = (0..30)
                .map(|_| s.spawn(|| service.call("POST", "/bookings", Some("burst"), body)))
                .collect();
            calls.into_iter().map(|c| c.join().expect("no panic")).collect()
        });
        let created = answers.iter().filter(|a| a.status == 201).count();
        assert_eq!(created, 1, "{answers:?}");
        for answer in &answers {
            match answer.status {
                201 => {}
                200 => assert_eq!(answer.header("idempotent-replayed"), Some("true")),
                409 => {
                    assert_eq!(answer.json()["error"], "IDEMPOTENCY_IN_PROGRESS");
                    assert_eq!(answer.header("retry-after"), Some("1"));
                }
                other => panic!("{other}: {}", answer.body),
            }
        }
        assert_eq!(bookings(&db), 1);
    }
}
