//! What a unit runs: a request's change (a mutation, or one row to insert)
//! and why a unit was rolled back.

use std::sync::Arc;

use diesel::result::Error as DieselError;

use crate::ledger::{Completion, LedgerError, LedgerTx, Outcome};
use crate::response::{RecordedResponse, Unreplayable};
use crate::row::{Columns, Row};

/// Why a unit was rolled back.
pub(crate) enum Abort<E> {
    /// Another unit holds the key: the change did not run.
    Busy,
    /// Answer with this (the entry or effect the unit found).
    Answer(Outcome),
    /// The entry the unit found cannot be replayed.
    Unreplayable(Unreplayable),
    /// Fail with this.
    Fail(LedgerError<E>),
    /// A query of the unit failed.
    Database(DieselError),
}

impl<E> From<DieselError> for Abort<E> {
    fn from(e: DieselError) -> Self {
        Abort::Database(e)
    }
}

/// A request's change, as the unit runs it.
pub(crate) trait Work<E>: Send + 'static {
    /// The row of a change that is inserting one row (else none is).
    type Row: Row;

    /// Runs the change in the unit.
    fn run(self, tx: &mut LedgerTx<'_, '_>) -> Result<Completion, Abort<E>>;

    /// The row and its answer, when inserting it is the whole change.
    fn insert(&self) -> Option<(Arc<Self::Row>, RecordedResponse)> {
        None
    }
}

/// A mutation: whatever it does through the unit's connection.
pub(crate) struct Change<F>(pub(crate) F);

impl<E, F> Work<E> for Change<F>
where
    F: FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, E> + Send + 'static,
    E: Send + 'static,
{
    type Row = NoRow;

    fn run(self, tx: &mut LedgerTx<'_, '_>) -> Result<Completion, Abort<E>> {
        (self.0)(tx).map_err(|e| Abort::Fail(LedgerError::Operation(e)))
    }
}

/// The row of a change that has none: never made.
pub(crate) enum NoRow {}

impl Row for NoRow {
    const TABLE: &'static str = "";
    const UNIQUE: &'static [&'static str] = &[];

    fn columns<'b, C: Columns<'b>>(&'b self, _: &mut C) -> Result<(), DieselError> {
        match *self {}
    }
}

/// One row to insert, answered `created`; `found` decides when the row
/// exists already.
pub(crate) struct Insert<R, F> {
    row: Arc<R>,
    created: RecordedResponse,
    found: F,
}

impl<R, F> Insert<R, F> {
    pub(crate) fn new((row, created): (R, RecordedResponse), found: F) -> Self {
        Self {
            row: Arc::new(row),
            created,
            found,
        }
    }
}

impl<R, E, F> Work<E> for Insert<R, F>
where
    R: Row,
    F: FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, E> + Send + 'static,
    E: Send + 'static,
{
    type Row = R;

    fn run(self, tx: &mut LedgerTx<'_, '_>) -> Result<Completion, Abort<E>> {
        let written = tx.insert(&*self.row);
        if written.map_err(|e| Abort::Fail(LedgerError::database(e)))? {
            return Ok(Completion::Record(self.created));
        }
        (self.found)(tx).map_err(|e| Abort::Fail(LedgerError::Operation(e)))
    }

    fn insert(&self) -> Option<(Arc<R>, RecordedResponse)> {
        Some((Arc::clone(&self.row), self.created.clone()))
    }
}
