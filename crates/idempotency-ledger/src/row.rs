//! A row a unit of writing inserts, described once.
//!
//! A [`Row`] names its table, the unique constraint whose conflict means
//! "this row exists already", and its columns with their values, in one
//! function. Every statement that writes it is built from that one
//! description, on each backend:
//!
//! - [`Insert`]: `INSERT INTO t (…) VALUES (…) ON CONFLICT (…) DO NOTHING`,
//!   on SQLite (inside the group-committed batch) and on PostgreSQL (inside
//!   a unit's transaction);
//! - on PostgreSQL, the ledger's one-statement create builds
//!   `INSERT INTO t (…) SELECT … FROM held ON CONFLICT (…) DO NOTHING
//!   RETURNING 1` from it (see [`Ledger::execute_insert`](crate::Ledger::execute_insert)).
//!
//! Every value is a bind parameter, and each statement's SQL text depends
//! only on the row's type, so diesel finds its prepared statement by type
//! (no SQL text is built per call to look it up).
//!
//! ```
//! use idempotency_ledger::row::{Columns, Row, Timestamp};
//!
//! /// A transfer as its table stores it.
//! struct NewTransfer {
//!     account: String,
//!     idempotency_key: String,
//!     cents: i64,
//!     created_at: Timestamp,
//! }
//!
//! impl Row for NewTransfer {
//!     const TABLE: &'static str = "transfers";
//!     const UNIQUE: &'static [&'static str] = &["account", "idempotency_key"];
//!
//!     fn columns<'b, C: Columns<'b>>(&'b self, c: &mut C) -> diesel::QueryResult<()> {
//!         c.column("account", self.account.as_str())?;
//!         c.column("idempotency_key", self.idempotency_key.as_str())?;
//!         c.column("cents", &self.cents)?;
//!         c.column("created_at", &self.created_at)
//!     }
//! }
//! ```
//!
//! (`diesel::QueryResult<()>` there is the same type as the
//! `Result<(), DieselError>` this module spells out so that mutation testing
//! can replace what its functions return: `docs/MUTANTS.md`.)

use chrono::{DateTime, Utc};
use diesel::backend::Backend;
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::result::Error as DieselError;
use diesel::sql_types::{BigInt, Binary, Integer, Text, Timestamptz};
use diesel::sqlite::Sqlite;

use crate::sqlite::session::timestamp_text;

/// How a value is bound on one backend.
pub trait Bind<DB: Backend> {
    /// Pushes the value as one bind parameter.
    fn bind<'b>(&'b self, out: &mut AstPass<'_, 'b, DB>) -> Result<(), DieselError>;
}

/// A value both backends can store: what a [`Row`]'s columns hold.
pub trait Column: Bind<Sqlite> + Bind<Pg> {}

impl<T: Bind<Sqlite> + Bind<Pg> + ?Sized> Column for T {}

/// Visits a row's columns in order: its names for the column list, its
/// values for the bind parameters.
pub trait Columns<'b> {
    /// One column: its name and its value.
    fn column<C: Column + ?Sized>(
        &mut self,
        name: &'static str,
        value: &'b C,
    ) -> Result<(), DieselError>;
}

/// A row described once: table, unique constraint and columns.
pub trait Row: Send + Sync + 'static {
    /// The table the row goes to.
    const TABLE: &'static str;
    /// The columns of the unique constraint whose conflict means the row
    /// exists already (`ON CONFLICT (…) DO NOTHING`).
    const UNIQUE: &'static [&'static str];
    /// Each column's name and value, in one order.
    fn columns<'b, C: Columns<'b>>(&'b self, columns: &mut C) -> Result<(), DieselError>;
}

macro_rules! bind_as {
    ($rust:ty, $sqlite:ty, $pg:ty) => {
        impl Bind<Sqlite> for $rust {
            fn bind<'b>(&'b self, out: &mut AstPass<'_, 'b, Sqlite>) -> Result<(), DieselError> {
                out.push_bind_param::<$sqlite, $rust>(self)
            }
        }
        impl Bind<Pg> for $rust {
            fn bind<'b>(&'b self, out: &mut AstPass<'_, 'b, Pg>) -> Result<(), DieselError> {
                out.push_bind_param::<$pg, $rust>(self)
            }
        }
    };
}

bind_as!(str, Text, Text);
bind_as!(String, Text, Text);
bind_as!(i32, Integer, Integer);
bind_as!(i64, BigInt, BigInt);
bind_as!([u8], Binary, Binary);
bind_as!(Vec<u8>, Binary, Binary);

/// A moment as both backends store it: `TIMESTAMPTZ` on PostgreSQL; on
/// SQLite the text diesel's `TimestamptzSqlite` writes, made once when the
/// value is made rather than at every bind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timestamp {
    at: DateTime<Utc>,
    sqlite: String,
}

impl Timestamp {
    /// The moment `at`, ready to bind on either backend.
    pub fn new(at: DateTime<Utc>) -> Self {
        Self {
            sqlite: timestamp_text(&at),
            at,
        }
    }

    /// The moment itself.
    pub fn at(&self) -> DateTime<Utc> {
        self.at
    }
}

impl Bind<Sqlite> for Timestamp {
    fn bind<'b>(&'b self, out: &mut AstPass<'_, 'b, Sqlite>) -> Result<(), DieselError> {
        out.push_bind_param::<Text, String>(&self.sqlite)
    }
}

impl Bind<Pg> for Timestamp {
    fn bind<'b>(&'b self, out: &mut AstPass<'_, 'b, Pg>) -> Result<(), DieselError> {
        out.push_bind_param::<Timestamptz, DateTime<Utc>>(&self.at)
    }
}

/// Writes the column names, comma-separated.
pub(crate) struct Names<'x, 'a, 'b, DB: Backend> {
    out: &'x mut AstPass<'a, 'b, DB>,
    first: bool,
}

impl<'b, DB: Backend> Columns<'b> for Names<'_, '_, 'b, DB> {
    fn column<C: Column + ?Sized>(
        &mut self,
        name: &'static str,
        _: &'b C,
    ) -> Result<(), DieselError> {
        if !std::mem::take(&mut self.first) {
            self.out.push_sql(", ");
        }
        self.out.push_identifier(name)
    }
}

/// Binds the column values, comma-separated.
pub(crate) struct Values<'x, 'a, 'b, DB: Backend> {
    out: &'x mut AstPass<'a, 'b, DB>,
    first: bool,
}

macro_rules! values_for {
    ($db:ty) => {
        impl<'b> Columns<'b> for Values<'_, '_, 'b, $db> {
            fn column<C: Column + ?Sized>(
                &mut self,
                _: &'static str,
                value: &'b C,
            ) -> Result<(), DieselError> {
                if !std::mem::take(&mut self.first) {
                    self.out.push_sql(", ");
                }
                <C as Bind<$db>>::bind(value, self.out)
            }
        }
    };
}

values_for!(Sqlite);
values_for!(Pg);

/// Where an insert's values come from.
#[derive(Clone, Copy)]
pub(crate) enum Source {
    /// `VALUES (…)`.
    Values,
    /// `SELECT … FROM relation`: one row per row of `relation`.
    SelectFrom(&'static str),
}

/// Writes `INSERT INTO table (columns) <source>`; the caller adds what
/// follows (`ON CONFLICT`, `RETURNING`).
pub(crate) fn walk_insert<'b, R, DB>(
    row: &'b R,
    source: Source,
    out: &mut AstPass<'_, 'b, DB>,
) -> Result<(), DieselError>
where
    R: Row,
    DB: Backend,
    for<'x, 'a> Values<'x, 'a, 'b, DB>: Columns<'b>,
{
    out.push_sql("INSERT INTO ");
    out.push_identifier(R::TABLE)?;
    out.push_sql(" (");
    row.columns(&mut Names {
        out: &mut *out,
        first: true,
    })?;
    out.push_sql(match source {
        Source::Values => ") VALUES (",
        Source::SelectFrom(_) => ") SELECT ",
    });
    row.columns(&mut Values {
        out: &mut *out,
        first: true,
    })?;
    match source {
        Source::Values => out.push_sql(")"),
        Source::SelectFrom(relation) => {
            out.push_sql(" FROM ");
            out.push_sql(relation);
        }
    }
    Ok(())
}

/// Writes ` ON CONFLICT (unique columns) DO NOTHING`.
pub(crate) fn walk_on_conflict_do_nothing<R: Row, DB: Backend>(
    out: &mut AstPass<'_, '_, DB>,
) -> Result<(), DieselError> {
    out.push_sql(" ON CONFLICT (");
    for (i, column) in R::UNIQUE.iter().enumerate() {
        if i > 0 {
            out.push_sql(", ");
        }
        out.push_identifier(column)?;
    }
    out.push_sql(") DO NOTHING");
    Ok(())
}

/// `INSERT INTO t (…) VALUES (…) ON CONFLICT (unique) DO NOTHING`, on either
/// backend: it writes one row, or none when the unique constraint already
/// holds one.
pub struct Insert<'a, R>(pub &'a R);

impl<R: Row> QueryId for Insert<'_, R> {
    type QueryId = Insert<'static, R>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<R: Row> QueryFragment<Sqlite> for Insert<'_, R> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> Result<(), DieselError> {
        walk_insert(self.0, Source::Values, &mut out)?;
        walk_on_conflict_do_nothing::<R, _>(&mut out)
    }
}

impl<R: Row> QueryFragment<Pg> for Insert<'_, R> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> Result<(), DieselError> {
        walk_insert(self.0, Source::Values, &mut out)?;
        walk_on_conflict_do_nothing::<R, _>(&mut out)
    }
}

impl<R: Row> RunQueryDsl<SqliteConnection> for Insert<'_, R> {}
impl<R: Row> RunQueryDsl<PgConnection> for Insert<'_, R> {}

/// Inserts `row` unless its unique constraint holds one already: `true`
/// when it was written.
pub fn insert<R: Row>(conn: &mut crate::conn::Conn<'_>, row: &R) -> Result<bool, DieselError> {
    let written = match conn {
        crate::conn::Conn::Sqlite(c) => Insert(row).execute(*c)?,
        crate::conn::Conn::Postgres(c) => Insert(row).execute(*c)?,
    };
    Ok(written == 1)
}
