//! The writer's queue: a unit as the writer thread sees it, and the one
//! answer its caller gets, from whichever side answers first.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::conn::{Conn, WriteError};

/// A unit as the writer thread sees it: run it, then tell it how its batch ended.
pub(crate) trait Job: Send {
    /// Runs the unit, unless its caller no longer waits for it; `true` to
    /// keep its changes, `false` to roll them back.
    fn run(&mut self, conn: &mut Conn<'_>) -> bool;
    /// Answers the caller once the batch is over.
    fn finish(self: Box<Self>, batch: Result<(), WriteError>);
    /// Answers the caller from another thread (the watchdog's, when the
    /// batch is abandoned); the unit's own `finish` then never answers.
    fn answer_elsewhere(&self) -> Box<dyn FnOnce(WriteError) + Send>;
}

/// What a caller is answered: its unit's result, or why the batch failed.
pub(crate) type Answer<T, E> = Result<Result<T, E>, WriteError>;

/// Where a caller's answer goes: taken by whichever answers first.
pub(crate) type Reply<T, E> = Arc<Mutex<Option<oneshot::Sender<Answer<T, E>>>>>;

pub(crate) struct Pending<F, T, E> {
    pub(crate) work: Option<F>,
    pub(crate) outcome: Option<Answer<T, E>>,
    /// Taken by whichever answers first: the writer thread after the batch,
    /// or the watchdog when it abandons the batch.
    pub(crate) reply: Reply<T, E>,
}

impl<F, T, E> Job for Pending<F, T, E>
where
    F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send,
    T: Send + 'static,
    E: Send + 'static,
{
    fn run(&mut self, conn: &mut Conn<'_>) -> bool {
        // A caller answered already (at its deadline) or gone (its request
        // was cancelled): the unit must not run now.
        let caller_waits = lock(&self.reply)
            .as_ref()
            .is_some_and(|reply| !reply.is_closed());
        let Some(work) = self.work.take().filter(|_| caller_waits) else {
            return false;
        };
        let outcome = match catch_unwind(AssertUnwindSafe(|| work(conn))) {
            Ok(result) => Ok(result),
            Err(panic) => Err(WriteError::Panicked(panic_message(&*panic))),
        };
        let keep = matches!(outcome, Ok(Ok(_)));
        self.outcome = Some(outcome);
        keep
    }

    fn finish(self: Box<Self>, batch: Result<(), WriteError>) {
        let answer = match (batch, self.outcome) {
            (Ok(()), Some(outcome)) => outcome,
            (Err(e), _) => Err(e),
            (Ok(()), None) => Err(WriteError::Unavailable("the unit never ran".into())),
        };
        answer_once(&self.reply, answer);
    }

    fn answer_elsewhere(&self) -> Box<dyn FnOnce(WriteError) + Send> {
        let reply = Arc::clone(&self.reply);
        Box::new(move |e| answer_once(&reply, Err(e)))
    }
}

/// Sends the caller its answer unless it was answered already. The caller
/// may have gone (its request was cancelled): nothing to do then.
fn answer_once<T>(reply: &Mutex<Option<oneshot::Sender<T>>>, answer: T) {
    if let Some(sender) = lock(reply).take() {
        let _ = sender.send(answer);
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while one of these is held; a poisoned one is still whole.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
