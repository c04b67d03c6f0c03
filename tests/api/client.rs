//! `orders-api client …` as a real process against the real server binary:
//! killed with `kill -9` at random points of `sync` behind a front that loses
//! answers, crashed deterministically between the answer and its record,
//! offline while the server is down, and two drainers on one outbox. Each
//! ends by counting, in the server's database, what took effect.

use std::path::PathBuf;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use orders_api::db::{Backend, Pool};
use orders_client::{NewOperation, Outbox, State, Target};
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::*;
use crate::process::{
    ServerProcess, create_token, ledger_count, order_count, order_id_for_key, prepare,
};
use crate::proxy::Proxy;

const BIN: &str = env!("CARGO_BIN_EXE_orders-api");
/// Rounds of `sync` killed with SIGKILL at a random moment; each round
/// queues one more order (a create, three patches, a cancel) first.
const KILL_ROUNDS: usize = 24;
/// The longest a round lets `sync` run before the kill.
const KILL_WITHIN_MS: u64 = 200;
/// Orders in the two-drainer test.
const ORDERS: usize = 6;
/// Quantities the patches set, in order: the last one must win.
const PATCHES: [i64; 3] = [2, 3, 4];

/// An outbox file of its own, removed (with its WAL and lock files) at the end.
pub struct TempOutbox {
    pub path: PathBuf,
}

impl TempOutbox {
    pub fn new() -> Self {
        let name = format!("orders-outbox-{}.db", uuid::Uuid::now_v7().simple());
        Self {
            path: std::env::temp_dir().join(name),
        }
    }
}

impl Drop for TempOutbox {
    fn drop(&mut self) {
        let p = self.path.display();
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{p}{suffix}"));
        }
        let _ = std::fs::remove_dir_all(format!("{p}.drainers"));
    }
}

/// The client of one outbox, as user alice, run as the real binary.
struct ClientProcess {
    outbox: TempOutbox,
    token: String,
}

impl ClientProcess {
    fn command(&self, server: &str, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command
            .arg("client")
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("ORDERS_OUTBOX", &self.outbox.path)
            .env("ORDERS_API_URL", server)
            .env("ORDERS_API_TOKEN", &self.token)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null());
        command
    }

    fn run(&self, server: &str, args: &[&str]) -> Output {
        self.command(server, args)
            .output()
            .expect("run orders-api client")
    }

    fn run_with_crash(&self, server: &str, crash_at: &str) -> ExitStatus {
        self.command(server, &["sync"])
            .env("ORDERS_CLIENT_CRASH_AT", crash_at)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run orders-api client sync")
    }

    /// `client status --json`.
    fn status(&self) -> Vec<Value> {
        let output = self.run("http://127.0.0.1:9", &["status", "--json"]);
        assert!(output.status.success(), "{}", text(&output.stderr));
        serde_json::from_slice::<Value>(&output.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }

    fn outbox(&self) -> Outbox {
        Outbox::open(&self.outbox.path).unwrap()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A server binary on a fresh database, with alice's token and a pool of
/// the test's own for counting what is stored.
struct World {
    server: ServerProcess,
    pool: Pool,
    client: ClientProcess,
    // Dropped last: the database outlives the server.
    _db: TestDb,
}

impl World {
    fn start(backend: Backend) -> Self {
        let db = TestDb::fresh(backend);
        let pool = prepare(&db.url);
        let token = create_token(&pool, "alice");
        let server = ServerProcess::start(&db.url, &[]);
        Self {
            server,
            pool,
            client: ClientProcess {
                outbox: TempOutbox::new(),
                token,
            },
            _db: db,
        }
    }

    /// Queues, for each of `orders` orders, a create, the patches and a
    /// cancel, interleaved across orders; their ids per order.
    fn enqueue_workload(&self, orders: usize) -> Vec<Vec<i64>> {
        let mut outbox = self.client.outbox();
        let mut ops: Vec<Vec<i64>> = (0..orders)
            .map(|n| vec![enqueue_create(&mut outbox, n)])
            .collect();
        for quantity in PATCHES {
            for order in &mut ops {
                order.push(enqueue_patch(&mut outbox, order[0], quantity));
            }
        }
        for order in &mut ops {
            order.push(enqueue_cancel(&mut outbox, order[0]));
        }
        ops
    }

    /// Every queued operation took effect exactly once, in order: one order
    /// per create (found by its key), the last patch's quantity, cancelled
    /// last, every operation done, and one ledger entry per operation's key.
    fn assert_exactly_once(&self, ops: &[Vec<i64>]) {
        let mut outbox = self.client.outbox();
        let all = outbox.list().unwrap();
        let not_done: Vec<_> = all.iter().filter(|o| o.state != State::Done).collect();
        assert!(not_done.is_empty(), "not done: {not_done:?}");
        for order in ops {
            let create = outbox.get(order[0]).unwrap();
            let id = order_id_for_key(&self.pool, "alice", &create.idempotency_key)
                .expect("the create's key made an order");
            assert_eq!(
                create.order_id.map(|o| o.to_string()).as_deref(),
                Some(id.as_str())
            );
            let now = Client::of(self).get_order(&id);
            assert_eq!(now["quantity"], PATCHES[PATCHES.len() - 1], "{now}");
            assert_eq!(now["status"], "cancelled", "{now}");
            for later in &order[1..] {
                let op = outbox.get(*later).unwrap();
                assert_eq!(
                    op.order_id.map(|o| o.to_string()).as_deref(),
                    Some(id.as_str()),
                    "{op:?}"
                );
            }
        }
        assert_eq!(
            order_count(&self.pool),
            ops.len() as i64,
            "one order per create"
        );
        assert_eq!(
            ledger_count(&self.pool),
            all.len() as i64,
            "each operation's key executed once, and no other key"
        );
    }
}

/// Reads orders straight from the server, bypassing any front.
struct Client<'a> {
    world: &'a World,
}

impl<'a> Client<'a> {
    fn of(world: &'a World) -> Self {
        Self { world }
    }

    fn get_order(&self, id: &str) -> Value {
        let client = crate::net::Client::new(
            &self.world.server.address(),
            &self.world.client.token,
            Duration::from_secs(30),
        );
        let response = client
            .call("GET", &format!("/v1/orders/{id}"), None, None)
            .unwrap();
        assert_eq!(response.status, 200, "{}", response.body);
        response.json()
    }
}

fn enqueue_create(outbox: &mut Outbox, n: usize) -> i64 {
    let body = json!({ "item": format!("Order {n}"), "quantity": 1, "price": 2.5 });
    outbox.enqueue(NewOperation::Create { body }).unwrap().id
}

fn enqueue_patch(outbox: &mut Outbox, create: i64, quantity: i64) -> i64 {
    let (target, body) = (Target::Operation(create), json!({ "quantity": quantity }));
    outbox
        .enqueue(NewOperation::Update { target, body })
        .unwrap()
        .id
}

fn enqueue_cancel(outbox: &mut Outbox, create: i64) -> i64 {
    let target = Target::Operation(create);
    outbox.enqueue(NewOperation::Cancel { target }).unwrap().id
}

/// A random number in `0..bound` (the OS source; the seed of nothing).
fn random_below(bound: u64) -> u64 {
    getrandom::u64().unwrap() % bound.max(1)
}

both_backends! {
    fn a_client_killed_at_random_points_of_sync_behind_a_lossy_front_makes_every_operation_take_effect_once(backend) {
        let world = World::start(backend);
        let front = Proxy::lossy(&world.server.address(), 3);

        let (mut ops, mut kill_points, mut killed_holding_a_lease) = (Vec::new(), Vec::new(), 0);
        for round in 0..KILL_ROUNDS {
            // Fresh work every round, on top of what earlier rounds left.
            let mut outbox = world.client.outbox();
            let create = enqueue_create(&mut outbox, round);
            let mut order = vec![create];
            order.extend(PATCHES.map(|q| enqueue_patch(&mut outbox, create, q)));
            order.push(enqueue_cancel(&mut outbox, create));
            ops.push(order);
            drop(outbox);
            let mut sync = world.client.command(&front.address, &["sync", "--max-wait", "60"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let wait = random_below(KILL_WITHIN_MS);
            std::thread::sleep(Duration::from_millis(wait));
            sync.kill().unwrap();
            sync.wait().unwrap();
            kill_points.push(wait);
            let leased = world.client.outbox().list().unwrap().iter()
                .any(|o| o.state == State::Pending && o.lease_owner.is_some());
            killed_holding_a_lease += usize::from(leased);
        }
        let before = world.client.outbox().list().unwrap();
        let (seen, lost) = (front.keys().len(), front.answers_lost());
        let finished = world.client.run(&front.address, &["sync", "--max-wait", "120"]);

        assert!(finished.status.success(), "{}", text(&finished.stderr));
        assert!(front.answers_lost() > 0, "the front lost no answer");
        world.assert_exactly_once(&ops);
        eprintln!(
            "{KILL_ROUNDS} kills after (ms) {kill_points:?}, {killed_holding_a_lease} holding a lease: \
             {} of {} operations done, {} claims, {} requests seen, {} answers lost before the last sync",
            before.iter().filter(|o| o.state == State::Done).count(),
            before.len(),
            before.iter().map(|o| o.attempts).sum::<u32>(),
            seen,
            lost,
        );
    }

    fn a_client_that_dies_between_the_answer_and_its_record_resends_with_the_stored_key_and_records_the_replay(backend) {
        let world = World::start(backend);
        let ops = world.enqueue_workload(1);
        let address = world.server.address();
        let key = world.client.outbox().get(ops[0][0]).unwrap().idempotency_key;

        // Answered (the order exists), not recorded.
        assert!(!world.client.run_with_crash(&address, "after_send").success());
        let create = world.client.outbox().get(ops[0][0]).unwrap();
        assert_eq!((create.state, create.attempts), (State::Pending, 1));
        assert!(order_id_for_key(&world.pool, "alice", &key).is_some(), "the first send took effect");
        // Leased, not sent.
        assert!(!world.client.run_with_crash(&address, "after_claim").success());
        assert_eq!(world.client.outbox().get(ops[0][0]).unwrap().attempts, 2);

        let finished = world.client.run(&address, &["sync"]);

        assert!(finished.status.success(), "{}", text(&finished.stderr));
        let create = world.client.outbox().get(ops[0][0]).unwrap();
        assert_eq!(create.response_status, Some(200), "the resend was a replay of the first send");
        world.assert_exactly_once(&ops);
    }

    fn operations_queue_while_the_server_is_down_and_sync_drains_them_when_it_returns(backend) {
        let mut world = World::start(backend);
        let address = world.server.address();
        world.server.kill();

        let first = world.client.run(&address, &["create", "--item", "Widget", "--quantity", "2", "--price", "9.99"]);
        let second = world.client.run(&address, &["create", "--item", "Gadget", "--quantity", "1", "--price", "0.5"]);
        let update = world.client.run(&address, &["update", "op:1", "--quantity", "7"]);
        let cancel = world.client.run(&address, &["cancel", "op:2"]);
        for output in [&first, &second, &update, &cancel] {
            assert!(output.status.success(), "{}", text(&output.stderr));
        }
        assert_eq!(
            [&first, &second, &update, &cancel].map(|o| text(&o.stdout).trim().to_owned()),
            ["op:1", "op:2", "op:3", "op:4"].map(String::from),
            "the operation's id and nothing else: no order came back"
        );
        let states: Vec<Value> = world.client.status().iter().map(|o| o["state"].clone()).collect();
        assert_eq!(states, vec![json!("pending"); 4]);
        let gave_up = world.client.run(&address, &["sync", "--max-wait", "1"]);
        assert!(!gave_up.status.success());
        let line = text(&gave_up.stderr);
        assert_eq!(line.trim().lines().count(), 1, "{line}");
        assert!(line.contains("4 operation(s) still pending"), "{line}");
        assert_eq!(order_count(&world.pool), 0);

        world.server.restart(&[]);
        let drained = world.client.run(&world.server.address(), &["sync"]);

        assert!(drained.status.success(), "{}", text(&drained.stderr));
        let status = world.client.status();
        assert!(status.iter().all(|o| o["state"] == "done"), "{status:?}");
        assert_eq!(order_count(&world.pool), 2);
        let widget = status[2]["answer"]["body"].clone();
        assert_eq!((widget["item"].clone(), widget["quantity"].clone()), (json!("Widget"), json!(7)));
        assert_eq!(status[3]["answer"]["body"]["status"], "cancelled");
        assert_eq!(ledger_count(&world.pool), 4);
    }

    fn two_drainers_on_one_outbox_send_each_operation_once_and_never_both_at_once(backend) {
        let world = World::start(backend);
        let ops = world.enqueue_workload(ORDERS);
        let front = Proxy::lossy(&world.server.address(), 3);

        let started = Instant::now();
        let drainers: Vec<_> = (0..2)
            .map(|_| {
                world.client.command(&front.address, &["sync", "--max-wait", "120"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let outputs: Vec<Output> = drainers.into_iter().map(|d| d.wait_with_output().unwrap()).collect();

        for output in &outputs {
            assert!(output.status.success(), "{}", text(&output.stderr));
        }
        assert_eq!(front.overlaps(), Vec::<String>::new(), "one key in flight twice at once");
        assert!(front.answers_lost() > 0, "the front lost no answer");
        world.assert_exactly_once(&ops);
        eprintln!("two drainers took {:?}", started.elapsed());
    }
}

/// `orders-api client ARGS` with only `env` (and `PATH`) in its environment.
fn bare_client(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Output {
    Command::new(BIN)
        .arg("client")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .output()
        .expect("run orders-api client")
}

#[test]
fn status_shows_every_operation_and_names_one_whose_row_was_changed_outside_the_client() {
    let file = TempOutbox::new();
    let outbox = ("ORDERS_OUTBOX", file.path.as_os_str());
    let token = ("ORDERS_API_TOKEN", std::ffi::OsStr::new("oa_x"));
    let nowhere = ("ORDERS_API_URL", std::ffi::OsStr::new("http://127.0.0.1:9"));
    let create = ["create", "--item", "W", "--quantity", "1", "--price", "1"];
    for _ in 0..2 {
        let queued = bare_client(&create, &[outbox, token, nowhere]);
        assert!(queued.status.success(), "{}", text(&queued.stderr));
    }
    {
        use diesel::connection::SimpleConnection;
        use diesel::prelude::*;
        let mut conn = SqliteConnection::establish(file.path.to_str().unwrap()).unwrap();
        conn.batch_execute(
            "UPDATE operations SET idempotency_key = 'k' || char(13) || 'X: 1' WHERE id = 1",
        )
        .unwrap();
    }

    let status = bare_client(&["status", "--json"], &[outbox]);
    assert!(!status.status.success());
    let line = text(&status.stderr);
    assert_eq!(line.trim().lines().count(), 1, "{line}");
    assert!(
        line.contains("1 operation(s) of the outbox do not read back"),
        "{line}"
    );
    let ops: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(ops[0]["id"], 1, "{ops}");
    assert!(
        ops[0]["unreadable"].as_str().unwrap().contains("key"),
        "{ops}"
    );
    assert_eq!(
        (ops[1]["id"].clone(), ops[1]["state"].clone()),
        (json!(2), json!("pending")),
        "{ops}"
    );

    let table = bare_client(&["status"], &[outbox]);
    let table = text(&table.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("op:1") && l.contains("unreadable")),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("op:2") && l.contains("pending")),
        "{table}"
    );
}

#[test]
fn client_commands_say_in_one_line_what_is_wrong_and_queue_nothing() {
    let file = TempOutbox::new();
    let outbox = ("ORDERS_OUTBOX", file.path.as_os_str());
    let token = ("ORDERS_API_TOKEN", std::ffi::OsStr::new("oa_x"));
    let create = ["create", "--item", "W", "--quantity", "1", "--price", "1"];

    for (output, says) in [
        (bare_client(&create, &[outbox]), "no token"),
        (
            bare_client(&["update", "op:1"], &[outbox, token]),
            "at least one of",
        ),
        (
            bare_client(&["update", "op:9", "--quantity", "2"], &[outbox, token]),
            "no operation 9",
        ),
        (
            bare_client(&["cancel", "op:zero"], &[outbox, token]),
            "op:N",
        ),
        (bare_client(&["cancel", "op:05"], &[outbox, token]), "op:N"),
        (
            bare_client(
                &["update", "../../admin", "--quantity", "2"],
                &[outbox, token],
            ),
            "neither an order id",
        ),
    ] {
        let line = text(&output.stderr);
        assert!(!output.status.success(), "{line}");
        assert_eq!(line.trim().lines().count(), 1, "{line}");
        assert!(line.contains(says), "{line}");
    }
    let status = bare_client(&["status", "--json"], &[outbox]);
    assert_eq!(
        text(&status.stdout).trim(),
        "[]",
        "{}",
        text(&status.stderr)
    );
}

/// A `--server` (or `ORDERS_API_URL`) with a query, a fragment or a dot
/// segment was taken as it was: the operation's path landed in the query or
/// fragment, or a URL parser moved it elsewhere, and whatever answered there
/// failed the operation for good. It is refused in one line now, before the
/// outbox is even opened.
#[test]
fn a_server_url_with_a_query_a_fragment_or_dot_segments_is_refused_before_anything_is_queued() {
    let file = TempOutbox::new();
    let outbox = ("ORDERS_OUTBOX", file.path.as_os_str());
    let token = ("ORDERS_API_TOKEN", std::ffi::OsStr::new("oa_x"));
    let create = ["create", "--item", "W", "--quantity", "1", "--price", "1"];
    for (server, says) in [
        ("http://127.0.0.1:9/?tenant=a", "it has a query"),
        ("http://127.0.0.1:9?", "it has a query"),
        ("http://127.0.0.1:9/#top", "it has a fragment"),
        ("http://127.0.0.1:9/api/../admin", "it has a dot segment"),
        ("http://127.0.0.1:9/./api", "it has a dot segment"),
        ("http://127.0.0.1:9/%2e%2e/api", "it has a dot segment"),
    ] {
        let by_env = bare_client(
            &create,
            &[
                outbox,
                token,
                ("ORDERS_API_URL", std::ffi::OsStr::new(server)),
            ],
        );
        let by_flag = bare_client(
            &[&create[..], &["--server", server]].concat(),
            &[outbox, token],
        );
        for output in [by_env, by_flag] {
            let line = text(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{server}: {line}");
            assert_eq!(line.trim().lines().count(), 1, "{server}: {line}");
            assert!(line.contains(says), "{server}: {line}");
            assert!(text(&output.stdout).is_empty(), "{server}: nothing queued");
        }
        assert!(!file.path.exists(), "{server}: the outbox was created");
    }
}

#[test]
fn the_outbox_lives_in_the_users_data_directory_unless_named() {
    let home = std::env::temp_dir().join(format!("orders-home-{}", uuid::Uuid::now_v7().simple()));
    let xdg = home.join("xdg");

    let by_home = bare_client(&["status"], &[("HOME", home.as_os_str())]);
    let by_xdg = bare_client(
        &["status"],
        &[
            ("HOME", home.as_os_str()),
            ("XDG_DATA_HOME", xdg.as_os_str()),
        ],
    );

    assert!(by_home.status.success(), "{}", text(&by_home.stderr));
    assert!(by_xdg.status.success(), "{}", text(&by_xdg.stderr));
    assert!(home.join(".local/share/orders-api/outbox.db").is_file());
    assert!(xdg.join("orders-api/outbox.db").is_file());
    let _ = std::fs::remove_dir_all(&home);
}

/// `sync --max-wait N` returns within N seconds plus one
/// connect timeout whatever the server does — here a server that accepts
/// every connection and never answers, with three operations pending. Each
/// request may take only what is left of the deadline, and nothing is sent
/// once it has passed; before, each send waited its own 10 s (30 s and more).
#[test]
fn sync_against_a_server_that_never_answers_gives_up_at_its_max_wait_and_keeps_every_operation_pending()
 {
    // Accepts, keeps every connection open until its client closes it,
    // answers nothing.
    let silent = crate::net::Front::start(|mut stream, _| {
        let _ = std::io::copy(&mut stream, &mut std::io::sink());
    });
    let address = silent.address();
    let client = ClientProcess {
        outbox: TempOutbox::new(),
        token: "unused".into(),
    };
    let ops: Vec<i64> = {
        let mut outbox = client.outbox();
        (0..3).map(|n| enqueue_create(&mut outbox, n)).collect()
    };
    let max_wait = Duration::from_secs(2);
    let connect = orders_client::Server::new(&address, "t").connect_timeout;

    let started = Instant::now();
    let gave_up = client.run(&address, &["sync", "--max-wait", "2"]);
    let took = started.elapsed();

    assert!(!gave_up.status.success(), "{}", text(&gave_up.stdout));
    let line = text(&gave_up.stderr);
    assert!(line.contains("3 operation(s) still pending"), "{line}");
    // An outcome bound, generous: the old behaviour took 30 s.
    assert!(
        took < max_wait + connect + Duration::from_secs(5),
        "sync --max-wait 2 ran {took:?}"
    );
    let mut outbox = client.outbox();
    for id in ops {
        let op = outbox.get(id).unwrap();
        assert_eq!(op.state, State::Pending, "{op:?}");
        assert!(op.attempts <= 1, "sent after the deadline: {op:?}");
    }
}
