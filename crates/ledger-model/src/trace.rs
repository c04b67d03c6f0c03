//! A discovery path as numbered steps a person can follow.

use std::fmt::Write as _;

use stateright::Path;

use crate::design::LedgerModel;
use crate::model::{Action, Net};
use crate::spec::ReqId;
use crate::state::{Entry, Orphan, Pc, Reply, State};

/// The path to a counterexample, one numbered line per step, then the
/// database as it ends.
pub fn trace(model: &LedgerModel, path: &Path<State, Action>) -> String {
    let steps = path.clone().into_vec();
    let mut out = String::new();
    let Some((first, _)) = steps.first() else {
        return out;
    };
    let bodies: Vec<String> = first
        .clients
        .iter()
        .enumerate()
        .map(|(c, client)| format!("client {c} sends body {:?}", client.body))
        .collect();
    let _ = writeln!(
        out,
        "design {:?}; {} (cN#M is client N's attempt M, and names the order it makes)",
        model.design,
        bodies.join(", ")
    );
    for (n, pair) in steps.windows(2).enumerate() {
        let [(before, Some(action)), (after, _)] = pair else {
            continue;
        };
        let _ = writeln!(out, "{:>3}. {}", n + 1, step(before, *action, after));
    }
    if let Some((last, _)) = steps.last() {
        let _ = writeln!(out, "     end: {}", database(last));
    }
    out
}

fn name(id: ReqId) -> String {
    format!("c{}#{}", id.client, id.attempt + 1)
}

fn reply(r: Reply) -> String {
    match r {
        Reply::Created(o) => format!("201 Created (order {})", name(o)),
        Reply::Replayed(o) => format!("200 replayed (order {})", name(o)),
        Reply::KeyReused => "409 IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD".into(),
        Reply::InProgress => "409 IDEMPOTENCY_IN_PROGRESS".into(),
        Reply::Unavailable => "503 (Retry-After)".into(),
        Reply::Reset => "a reset connection".into(),
    }
}

fn database(s: &State) -> String {
    let orders: Vec<String> = s.db.orders.iter().map(|&o| name(o)).collect();
    let entry = match s.db.entry {
        None if s.db.purged => "purged".to_owned(),
        None => "none".to_owned(),
        Some(Entry::Recorded { body, order }) => {
            format!("body {body:?} → 201 order {}", name(order))
        }
        Some(Entry::Claimed { body, owner }) => {
            format!("claimed by {} (body {body:?})", name(owner))
        }
    };
    format!("orders [{}]; entry: {entry}", orders.join(", "))
}

fn net(n: Net) -> &'static str {
    match n {
        Net::Acked => "",
        Net::AckLost => " — it committed, but the acknowledgement is lost",
        Net::Lost => " — the connection broke before it ran",
    }
}

fn step(before: &State, action: Action, after: &State) -> String {
    let req = |id: ReqId| after.reqs.iter().find(|r| r.id == id);
    let what = match action {
        Action::Send { client, process } => {
            let attempt = before
                .clients
                .get(usize::from(client))
                .map_or(0, |c| c.sent);
            let id = ReqId { client, attempt };
            let body = before.body_of(id);
            let how = match req(id) {
                Some(r) if r.pc == Pc::Waiting => format!(
                    "waits for the key's holder there, holding {}",
                    if r.permit {
                        "a write permit"
                    } else {
                        "nothing"
                    }
                ),
                Some(_) => "holds the key in its in-flight registry".to_owned(),
                None if after.replies.last() == Some(&(id, Reply::Unavailable)) => {
                    "is refused 503 at once: every write slot there is taken".to_owned()
                }
                None => "is refused 409 at once: the key has its full count of waiters".to_owned(),
            };
            let abandons = match before
                .clients
                .get(usize::from(client))
                .and_then(|c| c.waiting)
            {
                Some(a) => format!(
                    "client {client} stops waiting for {} (its own timeout; the request runs on); ",
                    name(ReqId { client, attempt: a })
                ),
                None => String::new(),
            };
            format!(
                "{abandons}{} (body {body:?}) is sent to process {process}: {how}",
                name(id)
            )
        }
        Action::Wake(id) => format!(
            "{} takes the key in its process (the holder ended or is past its lease)",
            name(id)
        ),
        Action::WaitBound(id) => format!("{}'s wait bound passes", name(id)),
        Action::Read(id) => match (before.db.entry, req(id).map(|r| r.pc)) {
            (Some(_), _) => format!("{} reads the key's entry", name(id)),
            (None, Some(Pc::Statement)) => format!(
                "{} finds no entry, is admitted and sends the one-statement create",
                name(id)
            ),
            (None, Some(_)) => format!("{} finds no entry and is admitted", name(id)),
            (None, None) => format!("{} finds no entry; no write admission slot", name(id)),
        },
        Action::Claim(id) => format!("{} commits a claim on the key", name(id)),
        Action::Statement(id, n) => {
            let what = match req(id).map(|r| r.pc) {
                Some(Pc::Committing) => {
                    "takes the lock, writes order and entry; they commit as it ends"
                }
                Some(_) => "it writes nothing, so the general way decides",
                None => "nothing",
            };
            format!(
                "the database runs {}'s one-statement create: {what}{}",
                name(id),
                net(n)
            )
        }
        Action::Lock(id) => match req(id).map(|r| r.pc) {
            Some(Pc::Changing) => format!("{}: BEGIN, takes the key's advisory lock", name(id)),
            Some(_) => format!(
                "{}: BEGIN, the key's lock is held by another unit: rolls back, releases \
                 everything, looks again after a pause",
                name(id)
            ),
            None => format!(
                "{}: the key's lock stays held past its wait bound",
                name(id)
            ),
        },
        Action::Change(id) => match req(id) {
            Some(_) => format!("{} inserts its order (uncommitted)", name(id)),
            None => format!(
                "{}'s order INSERT finds the key's order (UNIQUE): rolls back",
                name(id)
            ),
        },
        Action::Record(id) => match req(id).map(|r| r.pc) {
            Some(Pc::Committing) => format!(
                "{} passes the lease fence and inserts the key's entry (uncommitted)",
                name(id)
            ),
            Some(Pc::RecordingAfter) => format!(
                "{} commits its change alone (the entry is to follow)",
                name(id)
            ),
            _ if before.reqs.iter().any(|r| r.id == id && r.expired) => {
                format!("{} is past its lease: the fence rolls it back", name(id))
            }
            _ => format!(
                "{}'s entry INSERT finds the key recorded: rolls back",
                name(id)
            ),
        },
        Action::Commit(id, n) => format!("{}: COMMIT{}", name(id), net(n)),
        Action::RecordAfter(id) => format!("{} records the entry on its own", name(id)),
        Action::LeaseRunsOut(id) => format!("{} hangs past its lease", name(id)),
        Action::Crash { process } => format!(
            "process {process} is killed (and started again): its requests' connections break"
        ),
        Action::Orphan { index, runs } => {
            let what = match before.orphans.get(usize::from(index)) {
                Some(Orphan::Commit { id, .. }) => format!("{}'s COMMIT", name(*id)),
                Some(Orphan::Statement { id }) => format!("{}'s one-statement create", name(*id)),
                None => "a statement".to_owned(),
            };
            if runs {
                format!("the database finishes {what}, sent before its process died")
            } else {
                format!("the database drops {what} (the connection broke before it arrived)")
            }
        }
        Action::Purge => "retention passes: the purge deletes the key's entry".to_owned(),
    };
    let mut line = what;
    for (id, r) in after.replies.iter().skip(before.replies.len()) {
        let _ = write!(line, " ⇒ {} is answered {}", name(*id), reply(*r));
    }
    if before.db != after.db {
        let _ = write!(line, "   [{}]", database(after));
    }
    line
}
