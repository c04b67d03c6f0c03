//! The outbox's one table (`migrations/`).

diesel::table! {
    operations (id) {
        id -> BigInt,
        method -> Text,
        path -> Text,
        target_op -> Nullable<BigInt>,
        body -> Nullable<Text>,
        idempotency_key -> Text,
        resource -> Text,
        state -> Text,
        attempts -> Integer,
        created_at -> BigInt,
        next_attempt_at -> BigInt,
        lease_owner -> Nullable<Text>,
        lease_until -> Nullable<BigInt>,
        response_status -> Nullable<Integer>,
        response_body -> Nullable<Text>,
        last_error -> Nullable<Text>,
    }
}
