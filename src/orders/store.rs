//! The `orders` table. Every function takes a connection so that it runs
//! inside the caller's transaction.

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Integer, Text, Timestamptz, Uuid};
use diesel::sqlite::Sqlite;

use super::input::{OrderFields, cents_amount};
use super::model::{Order, OrderId, OrderStatus};
use crate::db::{Conn, dispatch, timestamp_text};
use crate::idempotency::HELD;

/// A row as stored.
#[derive(Debug, Clone, Queryable)]
pub struct OrderRow {
    pub seq: i64,
    pub id: OrderId,
    pub user_id: String,
    pub item: String,
    pub quantity: i32,
    pub price_cents: i64,
    pub status: String,
    pub idempotency_key: String,
    pub request_fingerprint: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A stored row that breaks a domain rule: a defect or a tampered database.
#[derive(Debug, thiserror::Error)]
#[error("order {0} holds an invalid {1}")]
pub struct CorruptRow(String, &'static str);

impl TryFrom<OrderRow> for Order {
    type Error = CorruptRow;

    fn try_from(row: OrderRow) -> Result<Self, CorruptRow> {
        let id = row.id.to_string();
        // A stored item was trimmed when written; one that is not breaks the rule too.
        let trimmed = row.item.trim() == row.item;
        let fields = OrderFields {
            item: Some(row.item),
            quantity: Some(i64::from(row.quantity)),
            price: Some(cents_amount(row.price_cents)),
        }
        .check()
        .map_err(|errors| {
            let field = match errors.first().map(|e| e.field.as_str()) {
                Some("quantity") => "quantity",
                Some("price") => "price",
                _ => "item",
            };
            CorruptRow(id.clone(), field)
        })?;
        let (Some(item), Some(quantity), Some(price), true) =
            (fields.item, fields.quantity, fields.price, trimmed)
        else {
            return Err(CorruptRow(id, "item"));
        };
        Ok(Order {
            item,
            quantity,
            price,
            status: OrderStatus::parse(&row.status)
                .ok_or_else(|| CorruptRow(id.clone(), "status"))?,
            id: row.id,
            user_id: row.user_id,
            request_fingerprint: row.request_fingerprint,
            created_at: row.created_at,
        })
    }
}

/// What a new row needs besides the order itself.
pub struct NewRow<'a> {
    pub order: &'a Order,
    pub idempotency_key: &'a str,
}

/// Inserts the order unless `(user_id, idempotency_key)` is taken:
/// `true` when the row was written.
pub fn insert(conn: &mut Conn<'_>, new: &NewRow<'_>) -> QueryResult<bool> {
    let o = new.order;
    if let Conn::Sqlite(c) = conn {
        return Ok(SqliteInsert::new(new).execute(*c)? == 1);
    }
    let written = dispatch!(conn, c, s => {
        use s::orders::dsl as t;
        diesel::insert_into(t::orders)
            .values((
                t::id.eq(o.id),
                t::user_id.eq(&o.user_id),
                t::item.eq(o.item.as_str()),
                t::quantity.eq(o.quantity.get()),
                t::price_cents.eq(o.price.cents()),
                t::status.eq(o.status.as_str()),
                t::idempotency_key.eq(new.idempotency_key),
                t::request_fingerprint.eq(&o.request_fingerprint),
                t::created_at.eq(o.created_at),
                t::updated_at.eq(o.created_at),
            ))
            .on_conflict((t::user_id, t::idempotency_key))
            .do_nothing()
            .execute(c)
    })?;
    Ok(written == 1)
}

/// SQLite: the statement of [`insert`], written out so that diesel finds its
/// prepared statement by type: for its DSL insert it would build the SQL
/// text on every call to look the statement up (the single writer's
/// largest cost after SQLite itself). Every value is a bind parameter; the
/// timestamp is bound as the text diesel's `TimestamptzSqlite` would write.
struct SqliteInsert<'a> {
    order: &'a Order,
    idempotency_key: &'a str,
    quantity: i32,
    price_cents: i64,
    /// `created_at`, also the first `updated_at`.
    created_at: String,
}

impl<'a> SqliteInsert<'a> {
    fn new(new: &NewRow<'a>) -> Self {
        Self {
            order: new.order,
            idempotency_key: new.idempotency_key,
            quantity: new.order.quantity.get(),
            price_cents: new.order.price.cents(),
            created_at: timestamp_text(&new.order.created_at),
        }
    }
}

impl QueryId for SqliteInsert<'_> {
    type QueryId = SqliteInsert<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl QueryFragment<Sqlite> for SqliteInsert<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        let o = self.order;
        out.push_sql(
            "INSERT INTO orders (id, user_id, item, quantity, price_cents, status, \
             idempotency_key, request_fingerprint, created_at, updated_at) \
             VALUES (",
        );
        out.push_bind_param::<Text, _>(&o.id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&o.user_id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, str>(o.item.as_str())?;
        out.push_sql(", ");
        out.push_bind_param::<Integer, _>(&self.quantity)?;
        out.push_sql(", ");
        out.push_bind_param::<BigInt, _>(&self.price_cents)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, str>(o.status.as_str())?;
        out.push_sql(", ");
        out.push_bind_param::<Text, str>(self.idempotency_key)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&o.request_fingerprint)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&self.created_at)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&self.created_at)?;
        out.push_sql(") ON CONFLICT (user_id, idempotency_key) DO NOTHING");
        Ok(())
    }
}

impl RunQueryDsl<SqliteConnection> for SqliteInsert<'_> {}

/// PostgreSQL: the same row as `insert`, as the ledger's one-statement
/// create needs it (see `idempotency::Ledger::execute_insert`): its values
/// are selected from the ledger's [`HELD`] relation, so the row is written
/// only once the key's lock is held, and `RETURNING 1` tells the ledger it
/// was. It names a relation only the ledger's statement defines, so it
/// cannot run on its own. Every value is a bind parameter.
pub struct PgInsert {
    id: OrderId,
    user_id: String,
    item: String,
    quantity: i32,
    price_cents: i64,
    status: &'static str,
    idempotency_key: String,
    request_fingerprint: String,
    created_at: DateTime<Utc>,
}

impl PgInsert {
    pub fn new(new: &NewRow<'_>) -> Self {
        let o = new.order;
        Self {
            id: o.id,
            user_id: o.user_id.clone(),
            item: o.item.as_str().to_owned(),
            quantity: o.quantity.get(),
            price_cents: o.price.cents(),
            status: o.status.as_str(),
            idempotency_key: new.idempotency_key.to_owned(),
            request_fingerprint: o.request_fingerprint.clone(),
            created_at: o.created_at,
        }
    }
}

impl QueryId for PgInsert {
    type QueryId = Self;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl QueryFragment<Pg> for PgInsert {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql(
            "INSERT INTO orders (id, user_id, item, quantity, price_cents, status, \
             idempotency_key, request_fingerprint, created_at, updated_at) SELECT ",
        );
        out.push_bind_param::<Uuid, _>(&self.id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&self.user_id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&self.item)?;
        out.push_sql(", ");
        out.push_bind_param::<Integer, _>(&self.quantity)?;
        out.push_sql(", ");
        out.push_bind_param::<BigInt, _>(&self.price_cents)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, str>(self.status)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&self.idempotency_key)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&self.request_fingerprint)?;
        out.push_sql(", ");
        out.push_bind_param::<Timestamptz, _>(&self.created_at)?;
        out.push_sql(", ");
        out.push_bind_param::<Timestamptz, _>(&self.created_at)?;
        out.push_sql(" FROM ");
        out.push_sql(HELD);
        out.push_sql(" ON CONFLICT (user_id, idempotency_key) DO NOTHING RETURNING 1");
        Ok(())
    }
}

pub fn find(conn: &mut Conn<'_>, user_id: &str, id: OrderId) -> QueryResult<Option<OrderRow>> {
    dispatch!(conn, c, s => {
        use s::orders::dsl as t;
        t::orders.filter(t::user_id.eq(user_id).and(t::id.eq(id))).get_result::<OrderRow>(c).optional()
    })
}

pub fn find_by_key(conn: &mut Conn<'_>, user_id: &str, key: &str) -> QueryResult<Option<OrderRow>> {
    dispatch!(conn, c, s => {
        use s::orders::dsl as t;
        t::orders
            .filter(t::user_id.eq(user_id).and(t::idempotency_key.eq(key)))
            .get_result::<OrderRow>(c)
            .optional()
    })
}

/// The list position of one of the user's orders.
pub fn seq_of(conn: &mut Conn<'_>, user_id: &str, id: OrderId) -> QueryResult<Option<i64>> {
    dispatch!(conn, c, s => {
        use s::orders::dsl as t;
        t::orders.filter(t::user_id.eq(user_id).and(t::id.eq(id))).select(t::seq).get_result::<i64>(c).optional()
    })
}

/// The user's orders with `seq < before`, newest first.
pub fn list(
    conn: &mut Conn<'_>,
    user_id: &str,
    before: Option<i64>,
    limit: i64,
) -> QueryResult<Vec<OrderRow>> {
    let before = before.unwrap_or(i64::MAX);
    dispatch!(conn, c, s => {
        use s::orders::dsl as t;
        t::orders
            .filter(t::user_id.eq(user_id).and(t::seq.lt(before)))
            .order(t::seq.desc())
            .limit(limit)
            .load::<OrderRow>(c)
    })
}

/// The fields a patch may change; `None` leaves a column as it is.
pub struct Changes<'a> {
    pub item: Option<&'a str>,
    pub quantity: Option<i32>,
    pub price_cents: Option<i64>,
}

/// Applies `changes` to a pending order and returns the new row; `None`
/// when no pending order of this user has that id.
pub fn update_pending(
    conn: &mut Conn<'_>,
    user_id: &str,
    id: OrderId,
    changes: &Changes<'_>,
    now: DateTime<Utc>,
) -> QueryResult<Option<OrderRow>> {
    dispatch!(conn, c, s => {
        use s::orders::dsl as t;
        diesel::update(t::orders.filter(t::user_id.eq(user_id).and(t::id.eq(id)).and(t::status.eq("pending"))))
            .set((
                changes.item.map(|v| t::item.eq(v)),
                changes.quantity.map(|v| t::quantity.eq(v)),
                changes.price_cents.map(|v| t::price_cents.eq(v)),
                t::updated_at.eq(now),
            ))
            .returning(s::orders::all_columns)
            .get_result::<OrderRow>(c)
            .optional()
    })
}

/// Sets a pending order's status; `None` when no pending order matched.
pub fn set_status_from_pending(
    conn: &mut Conn<'_>,
    user_id: &str,
    id: OrderId,
    status: OrderStatus,
    now: DateTime<Utc>,
) -> QueryResult<Option<OrderRow>> {
    dispatch!(conn, c, s => {
        use s::orders::dsl as t;
        diesel::update(t::orders.filter(t::user_id.eq(user_id).and(t::id.eq(id)).and(t::status.eq("pending"))))
            .set((t::status.eq(status.as_str()), t::updated_at.eq(now)))
            .returning(s::orders::all_columns)
            .get_result::<OrderRow>(c)
            .optional()
    })
}
