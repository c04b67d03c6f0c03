//! The ledger's table, as each backend types it (`TIMESTAMPTZ` on
//! PostgreSQL, text on SQLite). The application creates it with its own
//! migrations, from [`SQLITE_DDL`](crate::SQLITE_DDL) and
//! [`POSTGRES_DDL`](crate::POSTGRES_DDL).

#![allow(missing_docs)] // diesel's table! writes the modules and columns

/// SQLite's types.
#[cfg(feature = "sqlite")]
pub mod sqlite {
    diesel::table! {
        idempotency_ledger (idempotency_key, user_id) {
            idempotency_key -> Text,
            user_id -> Text,
            request_fingerprint -> Text,
            response_status -> Integer,
            response_headers -> Text,
            response_body -> Binary,
            created_at -> TimestamptzSqlite,
            expires_at -> TimestamptzSqlite,
        }
    }
}

/// PostgreSQL's types.
#[cfg(feature = "postgres")]
pub mod pg {
    diesel::table! {
        idempotency_ledger (idempotency_key, user_id) {
            idempotency_key -> Text,
            user_id -> Text,
            request_fingerprint -> Text,
            response_status -> Integer,
            response_headers -> Text,
            response_body -> Binary,
            created_at -> Timestamptz,
            expires_at -> Timestamptz,
        }
    }
}
