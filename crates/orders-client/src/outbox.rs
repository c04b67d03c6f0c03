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

use super::schema::operation_orders::dsl as answered;
use super::schema::operations::dsl as t;
use super::stored::{
    Method, OF_TARGET, ORDERS, Operation, Row, State, Target, Unreadable, answered_order,
};

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
    #[error("outbox: {0}")]
    Unreadable(#[from] Unreadable),
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

/// An operation leased to one drainer, ready to send.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub id: i64,
    pub method: Method,
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
                    .map_err(|e| OutboxError::Migrate(e.to_string()))?;
                record_answered_orders(c)
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
            let (method, target, body) = match operation {
                NewOperation::Create { body } => (Method::Post, None, Some(body)),
                NewOperation::Update { target, body } => (Method::Patch, Some(target), Some(body)),
                NewOperation::Cancel { target } => (Method::Delete, Some(target), None),
            };
            let (path, target_op, resource) = match target {
                None => (ORDERS.to_owned(), None, None),
                Some(Target::Operation(n)) => {
                    let resource: String = t::operations
                        .find(n)
                        .select(t::resource)
                        .first(c)
                        .optional()?
                        .ok_or(OutboxError::NoSuchOperation(n))?;
                    (OF_TARGET.to_owned(), Some(n), Some(resource))
                }
                Some(Target::Order(id)) => {
                    // An order one of ours created keeps that create's
                    // resource, so its updates stay in one queue.
                    let created_here: Option<String> = t::operations
                        .inner_join(answered::operation_orders)
                        .filter(answered::order_id.eq(id.to_string()))
                        .order(t::id)
                        .select(t::resource)
                        .first(c)
                        .optional()?;
                    let resource = created_here.unwrap_or_else(|| format!("order:{id}"));
                    (format!("{ORDERS}/{id}"), None, Some(resource))
                }
            };
            let id: i64 = diesel::insert_into(t::operations)
                .values((
                    t::method.eq(method.as_str()),
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
            Ok(read_one(c, id)?.ok_or(OutboxError::NoSuchOperation(id))??)
        })
    }

    /// Leases the first operation that may be sent now to `drainer`:
    /// pending, due, not leased by a live drainer, and with no earlier
    /// pending operation on its resource. Its target is resolved from the
    /// order recorded for it; an operation whose target failed, answered no
    /// order, or does not read back fails too, unsent. So does one that does
    /// not read back itself: what it would send is not known.
    /// `only`: that operation or none.
    pub fn claim(
        &mut self,
        drainer: &Drainer,
        only: Option<i64>,
    ) -> Result<Option<Claimed>, OutboxError> {
        let lease = i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX);
        self.conn.immediate_transaction(|c| {
            let now = now_millis();
            let candidates: Vec<(Row, Option<String>)> = t::operations
                .left_join(answered::operation_orders)
                .filter(t::state.eq(State::Pending.as_str()))
                .filter(t::next_attempt_at.le(now))
                .filter(diesel::dsl::sql::<diesel::sql_types::Bool>(
                    "NOT EXISTS (SELECT 1 FROM operations e WHERE e.resource = operations.resource \
                     AND e.id < operations.id AND e.state = 'pending')",
                ))
                .order(t::id)
                .select((Row::as_select(), answered::order_id.nullable()))
                .load(c)?;
            for (row, order_id) in candidates {
                if only.is_some_and(|id| id != row.id) {
                    continue;
                }
                let op = match Operation::read(row, order_id) {
                    Ok(op) => op,
                    Err(unreadable) => {
                        let detail = unreadable.to_string();
                        fail_unsent(c, unreadable.id, Unsent::Unreadable, &detail)?;
                        continue;
                    }
                };
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
                    Some(n) => match read_one(c, n)? {
                        Some(Ok(Operation {
                            state: State::Done,
                            order_id: Some(order),
                            ..
                        })) => format!("{ORDERS}/{order}"),
                        // Not pending (it is earlier on the same resource).
                        found => {
                            let detail = match found {
                                None => format!(
                                    "operation {n}, whose order this one targets, is not in the outbox"
                                ),
                                Some(Err(unreadable)) => format!(
                                    "operation {n}, whose order this one targets: {unreadable}"
                                ),
                                Some(Ok(target)) => format!(
                                    "operation {n}, whose order this one targets, is {} without an order",
                                    target.state
                                ),
                            };
                            fail_unsent(c, op.id, Unsent::TargetFailed, &detail)?;
                            continue;
                        }
                    },
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
                    attempts: op.attempts.saturating_add(1),
                }));
            }
            Ok(None)
        })
    }

    /// Records what one send of `claimed` came to: a definitive answer (once:
    /// an operation already answered keeps its first answer), with the order
    /// a `2xx` answer names; or a release of the lease with the time of the
    /// next attempt.
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
                    let (state, order) = if (200..300).contains(status) {
                        (State::Done, answered_order(body))
                    } else {
                        (State::Failed, None)
                    };
                    let answered_now = diesel::update(
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
                    if let (1, Some(order)) = (answered_now, order) {
                        record_order(c, claimed.id, &order.to_string())?;
                    }
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

    /// Every operation, in enqueue order; an error names the first row
    /// that does not read back.
    pub fn list(&mut self) -> Result<Vec<Operation>, OutboxError> {
        Ok(self
            .list_with_unreadable()?
            .into_iter()
            .collect::<Result<_, _>>()?)
    }

    /// Every row in enqueue order, read back, or why it does not.
    pub fn list_with_unreadable(
        &mut self,
    ) -> Result<Vec<Result<Operation, Unreadable>>, OutboxError> {
        let rows: Vec<(Row, Option<String>)> = t::operations
            .left_join(answered::operation_orders)
            .order(t::id)
            .select((Row::as_select(), answered::order_id.nullable()))
            .load(&mut self.conn)?;
        Ok(rows
            .into_iter()
            .map(|(row, order_id)| Operation::read(row, order_id))
            .collect())
    }

    pub fn get(&mut self, id: i64) -> Result<Operation, OutboxError> {
        Ok(read_one(&mut self.conn, id)?.ok_or(OutboxError::NoSuchOperation(id))??)
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

/// Operation `id`, read back; `None` when there is none.
fn read_one(
    c: &mut SqliteConnection,
    id: i64,
) -> Result<Option<Result<Operation, Unreadable>>, DieselError> {
    Ok(t::operations
        .left_join(answered::operation_orders)
        .filter(t::id.eq(id))
        .select((Row::as_select(), answered::order_id.nullable()))
        .first(c)
        .optional()?
        .map(|(row, order_id)| Operation::read(row, order_id)))
}

/// Records the order operation `id` was answered with.
fn record_order(c: &mut SqliteConnection, id: i64, order: &str) -> Result<(), DieselError> {
    diesel::insert_into(answered::operation_orders)
        .values((answered::operation_id.eq(id), answered::order_id.eq(order)))
        .execute(c)?;
    Ok(())
}

/// Why a pending operation is settled as failed without being sent.
#[derive(Debug, Clone, Copy)]
enum Unsent {
    /// The operation whose order it targets failed, answered no order, or
    /// does not read back.
    TargetFailed,
    /// It does not read back itself.
    Unreadable,
}

/// Settles pending operation `id` as failed without sending it, with a
/// problem body saying why.
fn fail_unsent(
    c: &mut SqliteConnection,
    id: i64,
    why: Unsent,
    detail: &str,
) -> Result<(), DieselError> {
    let (title, error) = match why {
        Unsent::TargetFailed => ("Target operation failed", "TARGET_OPERATION_FAILED"),
        Unsent::Unreadable => ("Operation unreadable", "OPERATION_UNREADABLE"),
    };
    let problem = serde_json::json!({ "title": title, "error": error, "detail": detail });
    diesel::update(t::operations.find(id))
        .set((
            t::state.eq(State::Failed.as_str()),
            t::response_body.eq(problem.to_string()),
            t::lease_owner.eq(None::<String>),
            t::lease_until.eq(None::<i64>),
        ))
        .execute(c)?;
    Ok(())
}

/// Records the order of done operations answered before the outbox had
/// `operation_orders`, read with the reader `record` uses. Run with the
/// migrations, in their transaction; an operation answered with no order
/// keeps none.
fn record_answered_orders(c: &mut SqliteConnection) -> Result<(), OutboxError> {
    let answered: Vec<(i64, Option<String>)> = t::operations
        .left_join(answered::operation_orders)
        .filter(t::state.eq(State::Done.as_str()))
        .filter(answered::operation_id.nullable().is_null())
        .select((t::id, t::response_body))
        .load(c)?;
    for (id, body) in answered {
        if let Some(order) = body.as_deref().and_then(answered_order) {
            record_order(c, id, &order.to_string())?;
        }
    }
    Ok(())
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

    /// Changes the outbox file behind the client's back, as another program
    /// (or a damaged disk) might.
    fn tamper(outbox: &Outbox, sql: &str) {
        let mut conn = SqliteConnection::establish(outbox.path().to_str().unwrap()).unwrap();
        conn.batch_execute(sql).unwrap();
    }

    fn problem(op: &Operation) -> Value {
        serde_json::from_str(op.response_body.as_deref().unwrap()).unwrap()
    }

    /// Operation `id` failed without being sent, with the local problem
    /// `error` whose detail says `why`.
    fn assert_failed_unsent(outbox: &mut Outbox, id: i64, error: &str, why: &str) {
        let op = outbox.get(id).unwrap();
        assert_eq!((op.state, op.attempts), (State::Failed, 0), "{op:?}");
        let problem = problem(&op);
        assert_eq!(problem["error"], error, "{problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(why),
            "{problem}"
        );
    }

    fn create(outbox: &mut Outbox) -> Operation {
        outbox
            .enqueue(NewOperation::Create {
                body: serde_json::json!({"item": "Widget", "quantity": 1, "price": 1}),
            })
            .unwrap()
    }

    const ORDER: &str = "0193a5b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b";
    const OTHER_ORDER: &str = "0193a5b2-7c4d-7e8f-9a0b-000000000002";

    fn update(target: Target) -> NewOperation {
        NewOperation::Update {
            target,
            body: serde_json::json!({"quantity": 2}),
        }
    }

    fn cancel(target: Target) -> NewOperation {
        NewOperation::Cancel { target }
    }

    fn answer(order: &str) -> Outcome {
        Outcome::Answered {
            status: 201,
            body: serde_json::json!({ "id": order }).to_string(),
        }
    }

    #[test]
    fn each_operation_gets_its_own_key_and_a_create_its_own_resource() {
        let (_files, mut outbox) = outbox();
        let a = create(&mut outbox);
        let b = create(&mut outbox);
        assert_ne!(a.idempotency_key, b.idempotency_key);
        assert_eq!((a.resource.as_str(), b.resource.as_str()), ("op:1", "op:2"));
        assert_eq!(a.state, State::Pending);
    }

    #[test]
    fn an_update_waits_for_its_create_and_is_sent_to_the_order_it_created() {
        let (_files, mut outbox) = outbox();
        let drainer = outbox.drainer().unwrap();
        create(&mut outbox);
        let update = outbox.enqueue(update(Target::Operation(1))).unwrap();
        assert_eq!(update.resource, "op:1");

        let first = outbox.claim(&drainer, None).unwrap().unwrap();
        assert_eq!(first.id, 1);
        assert!(
            outbox.claim(&drainer, None).unwrap().is_none(),
            "the update waits"
        );
        outbox.record(&first, &drainer, &answer(ORDER)).unwrap();

        let second = outbox.claim(&drainer, None).unwrap().unwrap();
        assert_eq!((second.id, second.path), (2, format!("/v1/orders/{ORDER}")));
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
        outbox.record(&claimed, &drainer, &answer(ORDER)).unwrap();
        outbox
            .record(&claimed, &drainer, &answer(OTHER_ORDER))
            .unwrap();
        assert_eq!(
            outbox.get(1).unwrap().order_id.map(|o| o.to_string()),
            Some(ORDER.to_owned())
        );
        assert!(outbox.claim(&drainer, None).unwrap().is_none());
    }

    #[test]
    fn an_operation_on_a_failed_create_fails_without_being_sent() {
        let (_files, mut outbox) = outbox();
        let drainer = outbox.drainer().unwrap();
        create(&mut outbox);
        outbox.enqueue(cancel(Target::Operation(1))).unwrap();
        let claimed = outbox.claim(&drainer, None).unwrap().unwrap();
        let refused = Outcome::Answered {
            status: 422,
            body: "{}".into(),
        };
        outbox.record(&claimed, &drainer, &refused).unwrap();
        assert!(outbox.claim(&drainer, None).unwrap().is_none());
        let states: Vec<State> = outbox.list().unwrap().iter().map(|o| o.state).collect();
        assert_eq!(states, vec![State::Failed, State::Failed]);
        assert_failed_unsent(&mut outbox, 2, "TARGET_OPERATION_FAILED", "is failed");
    }

    #[test]
    fn an_answer_whose_id_is_not_an_order_id_fails_the_operations_on_it_unsent() {
        let (_files, mut outbox) = outbox();
        let drainer = outbox.drainer().unwrap();
        create(&mut outbox);
        outbox.enqueue(update(Target::Operation(1))).unwrap();
        let claimed = outbox.claim(&drainer, None).unwrap().unwrap();
        // Pasted into the update's path, this id sent it to another route.
        outbox
            .record(&claimed, &drainer, &answer("../../admin"))
            .unwrap();

        assert!(outbox.claim(&drainer, None).unwrap().is_none());
        assert_failed_unsent(
            &mut outbox,
            2,
            "TARGET_OPERATION_FAILED",
            "is done without an order",
        );
    }

    #[test]
    fn an_answer_with_two_ids_names_no_order_and_no_update_of_either_joins_its_queue() {
        let (_files, mut outbox) = outbox();
        let drainer = outbox.drainer().unwrap();
        create(&mut outbox);
        let claimed = outbox.claim(&drainer, None).unwrap().unwrap();
        let two_ids = Outcome::Answered {
            status: 201,
            body: format!(r#"{{"id":"{ORDER}","id":"{OTHER_ORDER}"}}"#),
        };
        outbox.record(&claimed, &drainer, &two_ids).unwrap();
        assert_eq!(outbox.get(1).unwrap().order_id, None);

        // The update looked the order up with SQLite's json_extract (the
        // first id), its target with serde_json (the last one).
        for order in [ORDER, OTHER_ORDER] {
            let update = outbox
                .enqueue(update(Target::parse(order).unwrap()))
                .unwrap();
            assert_eq!(update.resource, format!("order:{order}"));
        }
    }

    #[test]
    fn an_operation_changed_outside_the_client_fails_unsent_and_the_others_are_still_sent() {
        let (_files, mut outbox) = outbox();
        let drainer = outbox.drainer().unwrap();
        create(&mut outbox);
        create(&mut outbox);
        tamper(
            &outbox,
            "UPDATE operations SET method = 'PATCH', path = '/v1/orders/../../admin' WHERE id = 1",
        );

        let claimed = outbox.claim(&drainer, None).unwrap().unwrap();
        assert_eq!(claimed.id, 2);
        let changed = outbox.get(1);
        assert!(
            matches!(changed, Err(OutboxError::Unreadable(ref u)) if u.id == 1),
            "{changed:?}"
        );
        tamper(
            &outbox,
            "UPDATE operations SET method = 'POST', path = '/v1/orders' WHERE id = 1",
        );
        assert_failed_unsent(&mut outbox, 1, "OPERATION_UNREADABLE", "../../admin");
    }

    #[test]
    fn a_target_gone_from_the_outbox_fails_the_operation_on_it_and_not_the_claim() {
        let (_files, mut outbox) = outbox();
        let drainer = outbox.drainer().unwrap();
        create(&mut outbox);
        outbox.enqueue(cancel(Target::Operation(1))).unwrap();
        tamper(
            &outbox,
            "PRAGMA foreign_keys = OFF; DELETE FROM operations WHERE id = 1;",
        );

        assert!(outbox.claim(&drainer, None).unwrap().is_none());
        assert_failed_unsent(
            &mut outbox,
            2,
            "TARGET_OPERATION_FAILED",
            "is not in the outbox",
        );
    }

    #[test]
    fn an_outbox_answered_before_operation_orders_existed_reads_each_order_from_its_answer() {
        let (files, mut outbox) = outbox();
        let drainer = outbox.drainer().unwrap();
        create(&mut outbox);
        create(&mut outbox);
        let first = outbox.claim(&drainer, None).unwrap().unwrap();
        outbox.record(&first, &drainer, &answer(ORDER)).unwrap();
        let second = outbox.claim(&drainer, None).unwrap().unwrap();
        outbox
            .record(&second, &drainer, &answer("../../admin"))
            .unwrap();
        // The outbox as the client left it before `operation_orders`.
        tamper(
            &outbox,
            "DROP TABLE operation_orders;
             DELETE FROM __diesel_schema_migrations
             WHERE version = (SELECT max(version) FROM __diesel_schema_migrations);",
        );
        drop((drainer, outbox));

        let mut outbox = Outbox::open(&files.0).unwrap();
        let orders: Vec<Option<String>> = outbox
            .list()
            .unwrap()
            .iter()
            .map(|o| o.order_id.map(|o| o.to_string()))
            .collect();
        assert_eq!(orders, vec![Some(ORDER.to_owned()), None]);
        let update = outbox
            .enqueue(update(Target::parse(ORDER).unwrap()))
            .unwrap();
        assert_eq!(update.resource, "op:1", "it joins its create's queue");
    }

    #[test]
    fn a_lease_owner_changed_to_a_path_fails_its_operation_and_no_drainer_touches_that_file() {
        let (files, mut outbox) = outbox();
        let drainer = outbox.drainer().unwrap();
        create(&mut outbox);
        // A drainer's liveness check opens, locks and removes
        // `<outbox>.drainers/<owner>.lock`: with this owner, a file outside.
        let victim = files.0.with_extension("victim.lock");
        std::fs::write(&victim, "keep me").unwrap();
        let owner = format!("../{}", victim.file_stem().unwrap().to_str().unwrap());
        tamper(
            &outbox,
            &format!(
                "UPDATE operations SET lease_owner = '{owner}', lease_until = 9223372036854775807"
            ),
        );

        assert!(outbox.claim(&drainer, None).unwrap().is_none());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
        std::fs::remove_file(&victim).unwrap();
        assert_failed_unsent(&mut outbox, 1, "OPERATION_UNREADABLE", "lease owner");
    }
}
