//! The durable outbox: a local SQLite file in which every operation, with its
//! `Idempotency-Key`, is stored (and fsynced) before it is ever sent.
//!
//! Every write is one short `BEGIN IMMEDIATE` transaction, so several
//! processes may share one outbox: SQLite's write lock orders them, and a
//! lease on the row (see [`Outbox::claim`]) keeps two drainers from sending
//! one operation at once.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::result::Error as DieselError;
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};
use serde_json::Value;

use super::schema::operations::{self, dsl as t};

const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// How long a writer waits for another process's transaction on the outbox.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the outbox could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("cannot open the outbox {path}: {cause}")]
    Open { path: String, cause: String },
    #[error("outbox: {0}")]
    Database(#[from] DieselError),
    #[error("outbox: {0}")]
    Migrate(String),
    #[error("there is no operation {0} in the outbox")]
    NoSuchOperation(i64),
}

/// Where an update or a cancel goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An order id the server gave.
    Order(String),
    /// The order that queued operation N created (or answered with).
    Operation(i64),
}

impl Target {
    /// `op:N`, or else an order id.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        if let Some(n) = raw.strip_prefix("op:") {
            return n
                .parse::<i64>()
                .ok()
                .filter(|n| *n > 0)
                .map(Self::Operation)
                .ok_or_else(|| format!("'{raw}' is not op:N with N a positive operation id"));
        }
        if raw.is_empty() || !raw.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(format!("'{raw}' is neither an order id nor op:N"));
        }
        Ok(Self::Order(raw.to_owned()))
    }
}

/// An operation on the orders API, as the caller asks for it.
#[derive(Debug, Clone)]
pub enum NewOperation {
    /// `POST /v1/orders` with this body.
    Create { body: Value },
    /// `PATCH /v1/orders/{id}` with this body.
    Update { target: Target, body: Value },
    /// `DELETE /v1/orders/{id}`.
    Cancel { target: Target },
}

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Not answered yet (maybe sent, maybe not): it will be sent, with its key.
    Pending,
    /// Answered `2xx`; never sent again.
    Done,
    /// Answered with a definitive `4xx` (or its target failed); never sent again.
    Failed,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Done => "done",
            State::Failed => "failed",
        }
    }

    fn parse(raw: &str) -> Self {
        match raw {
            "done" => State::Done,
            "failed" => State::Failed,
            _ => State::Pending,
        }
    }
}

/// One stored operation.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = operations, check_for_backend(diesel::sqlite::Sqlite))]
pub struct Operation {
    pub id: i64,
    pub method: String,
    pub path: String,
    pub target_op: Option<i64>,
    pub body: Option<String>,
    pub idempotency_key: String,
    pub resource: String,
    pub state: String,
    pub attempts: i32,
    pub created_at: i64,
    pub next_attempt_at: i64,
    pub lease_owner: Option<String>,
    pub lease_until: Option<i64>,
    pub response_status: Option<i32>,
    pub response_body: Option<String>,
    pub last_error: Option<String>,
}

impl Operation {
    pub fn state(&self) -> State {
        State::parse(&self.state)
    }

    /// The order id this operation was answered with, if it was.
    pub fn answered_order_id(&self) -> Option<String> {
        let body: Value = serde_json::from_str(self.response_body.as_deref()?).ok()?;
        body.get("id")?.as_str().map(str::to_owned)
    }
}

/// An operation leased to one drainer, ready to send.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub id: i64,
    pub method: String,
    /// With the target resolved.
    pub path: String,
    pub body: Option<String>,
    pub key: String,
    /// Sends so far, this one included.
    pub attempts: u32,
}

/// A process that may hold leases: it holds an exclusive lock on its own
/// file beside the outbox for as long as it lives, so another drainer can
/// tell a dead holder (killed with `kill -9`: the OS dropped its lock) from a
/// live one without waiting for the lease to expire.
#[derive(Debug)]
pub struct Drainer {
    id: String,
    dir: PathBuf,
    path: PathBuf,
    _lock: File,
}

impl Drainer {
    fn new(outbox: &Path) -> Result<Self, OutboxError> {
        let dir = drainers_dir(outbox);
        let open_error = |e: std::io::Error| OutboxError::Open {
            path: dir.display().to_string(),
            cause: e.to_string(),
        };
        std::fs::create_dir_all(&dir).map_err(open_error)?;
        let id = uuid::Uuid::now_v7().simple().to_string();
        // Locked under a temporary name, then renamed: a `.lock` file is
        // never seen unlocked while its drainer lives.
        let unnamed = dir.join(format!("{id}.tmp"));
        let path = dir.join(format!("{id}.lock"));
        let lock = File::create(&unnamed).map_err(open_error)?;
        lock.try_lock().map_err(|e| match e {
            TryLockError::Error(e) => open_error(e),
            TryLockError::WouldBlock => open_error(std::io::ErrorKind::WouldBlock.into()),
        })?;
        std::fs::rename(&unnamed, &path).map_err(open_error)?;
        let drainer = Self {
            id,
            dir,
            path,
            _lock: lock,
        };
        drainer.sweep();
        Ok(drainer)
    }

    /// Removes the files of drainers that died (best effort).
    fn sweep(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if let Some(owner) = name.to_str().and_then(|n| n.strip_suffix(".lock")) {
                self.is_dead(owner);
            }
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether the drainer `owner` is gone (its lock is free or its file
    /// is); a dead drainer's file is removed.
    fn is_dead(&self, owner: &str) -> bool {
        if owner == self.id {
            return false;
        }
        let path = self.dir.join(format!("{owner}.lock"));
        match File::open(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            // Unknown: trust the lease's expiry instead.
            Err(_) => false,
            Ok(file) => match file.try_lock() {
                Ok(()) => {
                    let _ = std::fs::remove_file(&path);
                    true
                }
                Err(_) => false,
            },
        }
    }
}

impl Drop for Drainer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn drainers_dir(outbox: &Path) -> PathBuf {
    let mut name = outbox.as_os_str().to_owned();
    name.push(".drainers");
    PathBuf::from(name)
}

/// What the drainer learnt from one send.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// A definitive answer: `2xx` (done) or a `4xx` other than in-progress
    /// (failed). Recorded; the operation is never sent again.
    Answered { status: u16, body: String },
    /// No answer that settles it: send again, with the same key, not before
    /// `after`.
    Retry { reason: String, after: Duration },
}

/// The outbox file, open.
pub struct Outbox {
    conn: SqliteConnection,
    path: PathBuf,
    lease: Duration,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox").field("path", &self.path).finish()
    }
}

/// How long a claim lasts when its holder neither records nor releases it
/// (a drainer only sends while its lease has far longer to run than one
/// request may take).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

impl Outbox {
    /// Opens (creating it and its folder when needed) the outbox at `path`.
    pub fn open(path: &Path) -> Result<Self, OutboxError> {
        let open_error = |cause: String| OutboxError::Open {
            path: path.display().to_string(),
            cause,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| open_error(e.to_string()))?;
        }
        let target = path
            .to_str()
            .ok_or_else(|| open_error("the path is not UTF-8".into()))?;
        let mut conn =
            SqliteConnection::establish(target).map_err(|e| open_error(e.to_string()))?;
        // FULL: a commit returns only once the WAL is on stable storage, so
        // an enqueued operation survives a power cut, not only a crash.
        conn.batch_execute(&format!(
            "PRAGMA busy_timeout = {};
             PRAGMA journal_mode = WAL;
             PRAGMA synchronous = FULL;
             PRAGMA foreign_keys = ON;",
            BUSY_TIMEOUT.as_millis()
        ))
        .map_err(|e| open_error(e.to_string()))?;
        let pending = conn
            .has_pending_migration(MIGRATIONS)
            .map_err(|e| OutboxError::Migrate(e.to_string()))?;
        if pending {
            // Under the write lock: two processes opening a new outbox at
            // once migrate it once.
            conn.immediate_transaction(|c| {
                c.run_pending_migrations(MIGRATIONS)
                    .map(|_| ())
                    .map_err(|e| OutboxError::Migrate(e.to_string()))
            })?;
        }
        Ok(Self {
            conn,
            path: path.to_owned(),
            lease: DEFAULT_LEASE,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A drainer identity for this process, holding its liveness lock.
    pub fn drainer(&self) -> Result<Drainer, OutboxError> {
        Drainer::new(&self.path)
    }

    /// Stores `operation` with a fresh key and returns it. The commit is
    /// durable when this returns.
    pub fn enqueue(&mut self, operation: NewOperation) -> Result<Operation, OutboxError> {
        let now = now_millis();
        let key = uuid::Uuid::now_v7().to_string();
        self.conn.immediate_transaction(|c| {
            let (method, path, target, body) = match operation {
                NewOperation::Create { body } => {
                    ("POST", "/v1/orders".to_owned(), None, Some(body))
                }
                NewOperation::Update { target, body } => {
                    ("PATCH", String::new(), Some(target), Some(body))
                }
                NewOperation::Cancel { target } => ("DELETE", String::new(), Some(target), None),
            };
            let (path, target_op, resource) = match target {
                None => (path, None, None),
                Some(Target::Operation(n)) => {
                    let resource: String = t::operations
                        .find(n)
                        .select(t::resource)
                        .first(c)
                        .optional()?
                        .ok_or(OutboxError::NoSuchOperation(n))?;
                    ("/v1/orders/{order}".to_owned(), Some(n), Some(resource))
                }
                Some(Target::Order(id)) => {
                    // An order one of ours created keeps that create's
                    // resource, so its updates stay in one queue.
                    let created_here: Option<String> = diesel::sql_query(
                        "SELECT resource FROM operations WHERE state = 'done' \
                         AND json_valid(response_body) \
                         AND json_extract(response_body, '$.id') = ? ORDER BY id LIMIT 1",
                    )
                    .bind::<diesel::sql_types::Text, _>(&id)
                    .get_result::<ResourceRow>(c)
                    .optional()?
                    .map(|r| r.resource);
                    let resource = created_here.unwrap_or_else(|| format!("order:{id}"));
                    (format!("/v1/orders/{id}"), None, Some(resource))
                }
            };
            let id: i64 = diesel::insert_into(t::operations)
                .values((
                    t::method.eq(method),
                    t::path.eq(&path),
                    t::target_op.eq(target_op),
                    t::body.eq(body.map(|b| b.to_string())),
                    t::idempotency_key.eq(&key),
                    t::resource.eq(resource.as_deref().unwrap_or("")),
                    t::state.eq(State::Pending.as_str()),
                    t::created_at.eq(now),
                    t::next_attempt_at.eq(now),
                ))
                .returning(t::id)
                .get_result(c)?;
            if resource.is_none() {
                diesel::update(t::operations.find(id))
                    .set(t::resource.eq(format!("op:{id}")))
                    .execute(c)?;
            }
            Ok(t::operations
                .find(id)
                .select(Operation::as_select())
                .first(c)?)
        })
    }

    /// Leases the first operation that may be sent now to `drainer`:
    /// pending, due, not leased by a live drainer, and with no earlier
    /// pending operation on its resource. Its target is resolved from the
    /// answer recorded for it; an operation whose target failed fails too.
    /// `only`: that operation or none.
    pub fn claim(
        &mut self,
        drainer: &Drainer,
        only: Option<i64>,
    ) -> Result<Option<Claimed>, OutboxError> {
        let lease = i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX);
        self.conn.immediate_transaction(|c| {
            let now = now_millis();
            let candidates: Vec<Operation> = t::operations
                .filter(t::state.eq(State::Pending.as_str()))
                .filter(t::next_attempt_at.le(now))
                .filter(diesel::dsl::sql::<diesel::sql_types::Bool>(
                    "NOT EXISTS (SELECT 1 FROM operations e WHERE e.resource = operations.resource \
                     AND e.id < operations.id AND e.state = 'pending')",
                ))
                .order(t::id)
                .select(Operation::as_select())
                .load(c)?;
            for op in candidates {
                if only.is_some_and(|id| id != op.id) {
                    continue;
                }
                let free = match (&op.lease_owner, op.lease_until) {
                    (None, _) => true,
                    (Some(_), Some(until)) if until <= now => true,
                    (Some(owner), _) => drainer.is_dead(owner),
                };
                if !free {
                    continue;
                }
                let path = match op.target_op {
                    None => op.path.clone(),
                    Some(n) => {
                        let target: Operation = t::operations
                            .find(n)
                            .select(Operation::as_select())
                            .first(c)?;
                        match (target.state(), target.answered_order_id()) {
                            (State::Done, Some(order)) => op.path.replace("{order}", &order),
                            (state, _) => {
                                // Not pending (it is earlier on the same
                                // resource): it failed, or answered no order.
                                let detail = format!(
                                    "operation {n}, whose order this one targets, is {} without an order",
                                    state.as_str()
                                );
                                let problem = serde_json::json!({
                                    "title": "Target operation failed",
                                    "error": "TARGET_OPERATION_FAILED",
                                    "detail": detail,
                                });
                                diesel::update(t::operations.find(op.id))
                                    .set((
                                        t::state.eq(State::Failed.as_str()),
                                        t::response_body.eq(problem.to_string()),
                                        t::lease_owner.eq(None::<String>),
                                        t::lease_until.eq(None::<i64>),
                                    ))
                                    .execute(c)?;
                                continue;
                            }
                        }
                    }
                };
                diesel::update(t::operations.find(op.id))
                    .set((
                        t::lease_owner.eq(drainer.id()),
                        t::lease_until.eq(now.saturating_add(lease)),
                        t::attempts.eq(t::attempts + 1),
                    ))
                    .execute(c)?;
                return Ok(Some(Claimed {
                    id: op.id,
                    method: op.method,
                    path,
                    body: op.body,
                    key: op.idempotency_key,
                    attempts: u32::try_from(op.attempts).unwrap_or(0).saturating_add(1),
                }));
            }
            Ok(None)
        })
    }

    /// Records what one send of `claimed` came to: a definitive answer (once:
    /// an operation already answered keeps its first answer), or a release
    /// of the lease with the time of the next attempt.
    pub fn record(
        &mut self,
        claimed: &Claimed,
        drainer: &Drainer,
        outcome: &Outcome,
    ) -> Result<(), OutboxError> {
        let now = now_millis();
        self.conn.immediate_transaction(|c| {
            match outcome {
                Outcome::Answered { status, body } => {
                    let state = if (200..300).contains(status) {
                        State::Done
                    } else {
                        State::Failed
                    };
                    diesel::update(
                        t::operations
                            .find(claimed.id)
                            .filter(t::state.eq(State::Pending.as_str())),
                    )
                    .set((
                        t::state.eq(state.as_str()),
                        t::response_status.eq(i32::from(*status)),
                        t::response_body.eq(body),
                        t::lease_owner.eq(None::<String>),
                        t::lease_until.eq(None::<i64>),
                        t::last_error.eq(None::<String>),
                    ))
                    .execute(c)?;
                }
                Outcome::Retry { reason, after } => {
                    let after = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
                    diesel::update(
                        t::operations
                            .find(claimed.id)
                            .filter(t::lease_owner.eq(drainer.id())),
                    )
                    .set((
                        t::lease_owner.eq(None::<String>),
                        t::lease_until.eq(None::<i64>),
                        t::next_attempt_at.eq(now.saturating_add(after)),
                        t::last_error.eq(reason),
                    ))
                    .execute(c)?;
                }
            }
            Ok(())
        })
    }

    /// Every operation, in enqueue order.
    pub fn list(&mut self) -> Result<Vec<Operation>, OutboxError> {
        Ok(t::operations
            .order(t::id)
            .select(Operation::as_select())
            .load(&mut self.conn)?)
    }

    pub fn get(&mut self, id: i64) -> Result<Operation, OutboxError> {
        t::operations
            .find(id)
            .select(Operation::as_select())
            .first(&mut self.conn)
            .optional()?
            .ok_or(OutboxError::NoSuchOperation(id))
    }

    /// Pending operations, and when the earliest of them is due or its lease
    /// ends (Unix milliseconds).
    pub fn pending(&mut self) -> Result<(i64, Option<i64>), OutboxError> {
        let pending = t::operations.filter(t::state.eq(State::Pending.as_str()));
        let count: i64 = pending.count().get_result(&mut self.conn)?;
        let due: Option<i64> = pending
            .select(diesel::dsl::min(diesel::dsl::sql::<
                diesel::sql_types::BigInt,
            >(
                "max(next_attempt_at, coalesce(lease_until, 0))",
            )))
            .first(&mut self.conn)?;
        Ok((count, due))
    }
}

#[derive(QueryableByName)]
struct ResourceRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    resource: String,
}

/// Now, in Unix milliseconds.
pub fn now_millis() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Removes a test's outbox files when dropped.
    struct Files(PathBuf);

    impl Drop for Files {
        fn drop(&mut self) {
            for suffix in ["", "-wal", "-shm"] {
                let mut name = self.0.as_os_str().to_owned();
                name.push(suffix);
                let _ = std::fs::remove_file(name);
            }
            let _ = std::fs::remove_dir_all(drainers_dir(&self.0));
        }
    }

    /// The files first: dropped after the outbox that has them open.
    fn outbox() -> (Files, Outbox) {
        let path =
            std::env::temp_dir().join(format!("outbox-{}.db", uuid::Uuid::now_v7().simple()));
        (Files(path.clone()), Outbox::open(&path).unwrap())
    }

    fn create(outbox: &mut Outbox) -> Operation {
        outbox
            .enqueue(NewOperation::Create {
                body: serde_json::json!({"item": "Widget", "quantity": 1, "price": 1}),
            })
            .unwrap()
    }

    fn answer(order: &str) -> Outcome {
        Outcome::Answered {
            status: 201,
            body: serde_json::json!({ "id": order }).to_string(),
        }
    }

    #[test]
    fn targets_are_an_order_id_or_op_n() {
        assert_eq!(Target::parse("op:17"), Ok(Target::Operation(17)));
        assert_eq!(
            Target::parse("0193ab-cd"),
            Ok(Target::Order("0193ab-cd".into()))
        );
        assert!(Target::parse("op:0").is_err());
        assert!(Target::parse("op:x").is_err());
        assert!(Target::parse("../x").is_err());
        assert!(Target::parse("").is_err());
    }

    #[test]
    fn each_operation_gets_its_own_key_and_a_create_its_own_resource() {
        let (_files, mut outbox) = outbox();
        let a = create(&mut outbox);
        let b = create(&mut outbox);
        assert_ne!(a.idempotency_key, b.idempotency_key);
        assert_eq!((a.resource.as_str(), b.resource.as_str()), ("op:1", "op:2"));
        assert_eq!(a.state(), State::Pending);
    }

    #[test]
    fn an_update_waits_for_its_create_and_is_sent_to_the_order_it_created() {
        let (_files, mut outbox) = outbox();
        let drainer = outbox.drainer().unwrap();
        create(&mut outbox);
        let update = outbox
            .enqueue(NewOperation::Update {
                target: Target::Operation(1),
                body: serde_json::json!({"quantity": 2}),
            })
            .unwrap();
        assert_eq!(update.resource, "op:1");

        let first = outbox.claim(&drainer, None).unwrap().unwrap();
        assert_eq!(first.id, 1);
        assert!(
            outbox.claim(&drainer, None).unwrap().is_none(),
            "the update waits"
        );
        outbox.record(&first, &drainer, &answer("abc")).unwrap();

        let second = outbox.claim(&drainer, None).unwrap().unwrap();
        assert_eq!((second.id, second.path.as_str()), (2, "/v1/orders/abc"));
    }

    #[test]
    fn a_live_drainers_lease_is_respected_and_a_dead_ones_is_taken_over() {
        let (_files, mut outbox) = outbox();
        create(&mut outbox);
        let first = outbox.drainer().unwrap();
        let second = outbox.drainer().unwrap();
        assert!(outbox.claim(&first, None).unwrap().is_some());
        assert!(
            outbox.claim(&second, None).unwrap().is_none(),
            "leased to a live drainer"
        );
        drop(first);
        let taken = outbox.claim(&second, None).unwrap().unwrap();
        assert_eq!((taken.id, taken.attempts), (1, 2));
    }

    #[test]
    fn an_answer_is_recorded_once_and_never_claimed_again() {
        let (_files, mut outbox) = outbox();
        let drainer = outbox.drainer().unwrap();
        create(&mut outbox);
        let claimed = outbox.claim(&drainer, None).unwrap().unwrap();
        outbox.record(&claimed, &drainer, &answer("first")).unwrap();
        outbox
            .record(&claimed, &drainer, &answer("second"))
            .unwrap();
        assert_eq!(
            outbox.get(1).unwrap().answered_order_id().as_deref(),
            Some("first")
        );
        assert!(outbox.claim(&drainer, None).unwrap().is_none());
    }

    #[test]
    fn an_operation_on_a_failed_create_fails_without_being_sent() {
        let (_files, mut outbox) = outbox();
        let drainer = outbox.drainer().unwrap();
        create(&mut outbox);
        outbox
            .enqueue(NewOperation::Cancel {
                target: Target::Operation(1),
            })
            .unwrap();
        let claimed = outbox.claim(&drainer, None).unwrap().unwrap();
        let refused = Outcome::Answered {
            status: 422,
            body: "{}".into(),
        };
        outbox.record(&claimed, &drainer, &refused).unwrap();
        assert!(outbox.claim(&drainer, None).unwrap().is_none());
        let states: Vec<State> = outbox
            .list()
            .unwrap()
            .iter()
            .map(Operation::state)
            .collect();
        assert_eq!(states, vec![State::Failed, State::Failed]);
        let cancel = outbox.get(2).unwrap();
        assert_eq!(cancel.attempts, 0, "never sent");
        let problem: Value =
            serde_json::from_str(cancel.response_body.as_deref().unwrap()).unwrap();
        assert_eq!(problem["error"], "TARGET_OPERATION_FAILED");
        assert!(
            problem["detail"].as_str().unwrap().contains("is failed"),
            "{problem}"
        );
    }
}
