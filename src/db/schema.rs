//! The server's table definitions, one module per backend (the ledger's
//! own table is the ledger crate's, `idempotency_ledger::schema`).
//!
//! The two modules describe the same tables; they differ only where the SQL
//! types differ (`TIMESTAMPTZ` and `UUID` on PostgreSQL, `TEXT` on SQLite).
//! `orders` is keyed `(user_id, seq)` on both (PostgreSQL's primary key; on
//! SQLite a unique key beside the rowid `seq`, which numbers the orders).
//! Query code is written once and compiled against both through
//! [`crate::db::dispatch!`].

pub mod sqlite {
    diesel::table! {
        api_keys (id) {
            id -> BigInt,
            user_id -> Text,
            token_hash -> Text,
            token_prefix -> Text,
            created_at -> TimestamptzSqlite,
            revoked_at -> Nullable<TimestamptzSqlite>,
        }
    }

    diesel::table! {
        orders (user_id, seq) {
            seq -> BigInt,
            id -> Text,
            user_id -> Text,
            item -> Text,
            quantity -> Integer,
            price_cents -> BigInt,
            status -> Text,
            idempotency_key -> Text,
            request_fingerprint -> Text,
            created_at -> TimestamptzSqlite,
            updated_at -> TimestamptzSqlite,
        }
    }
}

pub mod pg {
    diesel::table! {
        api_keys (id) {
            id -> BigInt,
            user_id -> Text,
            token_hash -> Text,
            token_prefix -> Text,
            created_at -> Timestamptz,
            revoked_at -> Nullable<Timestamptz>,
        }
    }

    diesel::table! {
        orders (user_id, seq) {
            seq -> BigInt,
            id -> Uuid,
            user_id -> Text,
            item -> Text,
            quantity -> Integer,
            price_cents -> BigInt,
            status -> Text,
            idempotency_key -> Text,
            request_fingerprint -> Text,
            created_at -> Timestamptz,
            updated_at -> Timestamptz,
        }
    }
}
