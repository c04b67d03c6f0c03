//! The `orders` table. Every function takes a connection so that it runs
//! inside the caller's transaction.

use chrono::{DateTime, NaiveDate, NaiveTime, TimeZone, Utc};
use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::pg::{Pg, PgValue};
use diesel::prelude::*;
use diesel::sql_types::{Timestamptz, TimestamptzSqlite};
use diesel::sqlite::{Sqlite, SqliteValue};
use idempotency_ledger::row::{Columns, Row, Timestamp};

use super::model::{Item, Money, Order, OrderId, OrderStatus, Quantity};
use crate::db::{Conn, dispatch};

/// A row as the domain reads it: the columns an [`Order`] holds, nothing
/// more (`seq`, `idempotency_key` and `updated_at` are never read back).
#[derive(Debug, Clone, Queryable)]
pub struct OrderRow {
    pub id: OrderId,
    pub user_id: String,
    pub item: String,
    pub quantity: i32,
    pub price_cents: i64,
    pub status: String,
    pub request_fingerprint: String,
    pub created_at: StoredTime,
}

/// The columns of an [`OrderRow`], in its order, from a backend's `orders`
/// table (`t` names that table's `dsl` module).
macro_rules! row_columns {
    ($t:ident) => {
        (
            $t::id,
            $t::user_id,
            $t::item,
            $t::quantity,
            $t::price_cents,
            $t::status,
            $t::request_fingerprint,
            $t::created_at,
        )
    };
}

/// A stored row that breaks a domain rule: a defect or a tampered database.
/// Answered `500`, never repaired.
#[derive(Debug, thiserror::Error)]
#[error("order {0} holds an invalid {1}")]
pub struct CorruptRow(OrderId, &'static str);

/// Stored rows are trusted to have passed the field rules when they were
/// written ([`super::input::OrderFields`]); reading one back checks only
/// that it still holds what the domain types promise — the item's shape,
/// the ranges, a known status — with plain comparisons, so that a row
/// changed behind the service's back is a `500`, never an order shown
/// wrongly or silently fixed.
impl TryFrom<OrderRow> for Order {
    type Error = CorruptRow;

    fn try_from(row: OrderRow) -> Result<Self, CorruptRow> {
        let id = row.id;
        let corrupt = |field| CorruptRow(id, field);
        Ok(Order {
            quantity: Quantity::from_stored(row.quantity).ok_or_else(|| corrupt("quantity"))?,
            price: Money::from_stored_cents(row.price_cents).ok_or_else(|| corrupt("price"))?,
            status: OrderStatus::parse(&row.status).ok_or_else(|| corrupt("status"))?,
            item: Item::from_stored(row.item).ok_or_else(|| corrupt("item"))?,
            id,
            user_id: row.user_id,
            request_fingerprint: row.request_fingerprint,
            created_at: row.created_at.0,
        })
    }
}

/// A stored timestamp. On SQLite it is the text the ledger's row binding
/// writes (`db::timestamp_text`: `YYYY-MM-DD HH:MM:SS[.fff|.ffffff|.fffffffff]+00:00`),
/// read by position; any other text SQLite may hold goes through diesel's
/// own parser, which tries every format it knows (and costs a format
/// interpreter per try). On PostgreSQL a `timestamptz` as diesel reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromSqlRow)]
pub struct StoredTime(pub DateTime<Utc>);

impl FromSql<TimestamptzSqlite, Sqlite> for StoredTime {
    fn from_sql(mut value: SqliteValue<'_, '_, '_>) -> deserialize::Result<Self> {
        if let Some(at) = written_time(value.read_text()) {
            return Ok(Self(at));
        }
        <DateTime<Utc> as FromSql<TimestamptzSqlite, Sqlite>>::from_sql(value).map(Self)
    }
}

impl FromSql<Timestamptz, Pg> for StoredTime {
    fn from_sql(value: PgValue<'_>) -> deserialize::Result<Self> {
        <DateTime<Utc> as FromSql<Timestamptz, Pg>>::from_sql(value).map(Self)
    }
}

/// The UTC time `text` names when it is exactly what the writer writes;
/// `None` for anything else (which may still be a time in another format).
fn written_time(text: &str) -> Option<DateTime<Utc>> {
    let b = text.as_bytes();
    let rest = b.strip_suffix(b"+00:00")?;
    let (head, fraction) = match rest.len() {
        19 => (rest, &b""[..]),
        23 | 26 | 29 => {
            let (head, dot_digits) = rest.split_at(19);
            (head, dot_digits.strip_prefix(b".")?)
        }
        _ => return None,
    };
    let shape = b"dddd-dd-dd dd:dd:dd";
    if head.iter().zip(shape).any(|(c, s)| {
        if *s == b'd' {
            !c.is_ascii_digit()
        } else {
            c != s
        }
    }) {
        return None;
    }
    let number = |digits: &[u8]| {
        digits
            .iter()
            .fold(0u32, |n, d| n * 10 + u32::from(d - b'0'))
    };
    if !fraction.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let nanos = number(fraction) * 10u32.pow(9 - fraction.len() as u32);
    let date = NaiveDate::from_ymd_opt(
        i32::try_from(number(&head[0..4])).ok()?,
        number(&head[5..7]),
        number(&head[8..10]),
    )?;
    let time = NaiveTime::from_hms_nano_opt(
        number(&head[11..13]),
        number(&head[14..16]),
        number(&head[17..19]),
        nanos,
    )?;
    Some(Utc.from_utc_datetime(&date.and_time(time)))
}

/// A new order as its row stores it: the one description from which every
/// way of writing it is built (see [`idempotency_ledger::row`]) — inside a
/// unit of writing on either backend, and in the ledger's one-statement
/// create on PostgreSQL.
pub struct NewOrderRow {
    id: OrderId,
    user_id: String,
    item: String,
    quantity: i32,
    price_cents: i64,
    status: &'static str,
    idempotency_key: String,
    request_fingerprint: String,
    created_at: Timestamp,
}

impl NewOrderRow {
    pub fn new(order: &Order, idempotency_key: &str) -> Self {
        Self {
            id: order.id,
            user_id: order.user_id.clone(),
            item: order.item.as_str().to_owned(),
            quantity: order.quantity.get(),
            price_cents: order.price.cents(),
            status: order.status.as_str(),
            idempotency_key: idempotency_key.to_owned(),
            request_fingerprint: order.request_fingerprint.clone(),
            created_at: Timestamp::new(order.created_at),
        }
    }
}

impl Row for NewOrderRow {
    const TABLE: &'static str = "orders";
    /// `orders_user_idempotency_key`: the key's second guard.
    const UNIQUE: &'static [&'static str] = &["user_id", "idempotency_key"];

    fn columns<'b, C: Columns<'b>>(&'b self, c: &mut C) -> QueryResult<()> {
        c.column("id", &self.id)?;
        c.column("user_id", self.user_id.as_str())?;
        c.column("item", self.item.as_str())?;
        c.column("quantity", &self.quantity)?;
        c.column("price_cents", &self.price_cents)?;
        c.column("status", self.status)?;
        c.column("idempotency_key", self.idempotency_key.as_str())?;
        c.column("request_fingerprint", self.request_fingerprint.as_str())?;
        c.column("created_at", &self.created_at)?;
        c.column("updated_at", &self.created_at)
    }
}

pub fn find(conn: &mut Conn<'_>, user_id: &str, id: OrderId) -> QueryResult<Option<OrderRow>> {
    dispatch!(conn, c, s => {
        use s::orders::dsl as t;
        t::orders
            .filter(t::user_id.eq(user_id).and(t::id.eq(id)))
            .select(row_columns!(t))
            .get_result::<OrderRow>(c)
            .optional()
    })
}

pub fn find_by_key(conn: &mut Conn<'_>, user_id: &str, key: &str) -> QueryResult<Option<OrderRow>> {
    dispatch!(conn, c, s => {
        use s::orders::dsl as t;
        t::orders
            .filter(t::user_id.eq(user_id).and(t::idempotency_key.eq(key)))
            .select(row_columns!(t))
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
            .select(row_columns!(t))
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
            .returning(row_columns!(t))
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
            .returning(row_columns!(t))
            .get_result::<OrderRow>(c)
            .optional()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orders::input::OrderFields;
    use chrono::{Datelike, Duration};
    use idempotency_ledger::db::timestamp_text;
    use proptest::prelude::*;

    #[test]
    fn a_written_time_reads_back_as_written_at_every_precision() {
        let base = Utc.with_ymd_and_hms(2026, 12, 3, 23, 59, 58).single();
        let base = base.unwrap_or_default();
        for nanos in [0, 120_000_000, 123_456_000, 123_456_789, 999_999_999] {
            let at = base + Duration::nanoseconds(nanos);
            let text = timestamp_text(&at);
            assert_eq!(written_time(&text), Some(at), "{text}");
            let chrono = DateTime::parse_from_str(&text, "%F %T%.f%:z").ok();
            assert_eq!(chrono.map(|t| t.with_timezone(&Utc)), Some(at), "{text}");
        }
        for year in [1000, 9999] {
            let at = base.with_year(year).unwrap_or_default();
            assert_eq!(written_time(&timestamp_text(&at)), Some(at));
        }
    }

    #[test]
    fn any_other_text_is_left_to_diesels_parser() {
        for other in [
            "2026-12-03 23:59:58",
            "2026-12-03T23:59:58+00:00",
            "2026-12-03 23:59:58Z",
            "2026-12-03 23:59:58.1+00:00",
            "2026-12-03 23:59:58+01:00",
            "2026-13-03 23:59:58+00:00",
            "2026-02-30 23:59:58+00:00",
            "2026-12-03 24:00:00+00:00",
            "2026-12-03 23:59:58.12a+00:00",
            "+026-12-03 23:59:58+00:00",
            "",
        ] {
            assert_eq!(written_time(other), None, "{other}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn any_written_time_reads_back_exactly(secs in 0i64..253_402_300_799, nanos in 0u32..1_000_000_000) {
            let at = DateTime::from_timestamp(secs, nanos).unwrap_or_default();
            prop_assume!(at.year() >= 1000);
            prop_assert_eq!(written_time(&timestamp_text(&at)), Some(at));
        }

        /// The read check accepts exactly the items the field rules let
        /// through (the rules trim first, so a stored item is trimmed).
        #[test]
        fn a_stored_item_passes_the_read_check_exactly_when_it_passes_the_field_rules(
            item in prop_oneof![
                "\\PC{0,210}",
                ".{0,3}",
                "[ \t\u{7f}\u{85}\u{a0}\u{2028}a-c]{0,4}",
                Just("x".repeat(200)),
                Just("é".repeat(201)),
            ]
        ) {
            let rules = OrderFields { item: Some(item.clone()), ..OrderFields::default() }
                .check()
                .is_ok()
                && item.trim() == item;
            prop_assert_eq!(Item::from_stored(item.clone()).is_some(), rules, "{:?}", item);
        }
    }

    #[test]
    fn stored_numbers_are_checked_against_their_ranges() {
        assert!(Quantity::from_stored(1).is_some() && Quantity::from_stored(1_000_000).is_some());
        assert!(Quantity::from_stored(0).is_none() && Quantity::from_stored(1_000_001).is_none());
        assert!(Money::from_stored_cents(0).is_some());
        assert!(Money::from_stored_cents(Money::MAX_CENTS).is_some());
        assert!(Money::from_stored_cents(-1).is_none());
        assert!(Money::from_stored_cents(Money::MAX_CENTS + 1).is_none());
    }
}
