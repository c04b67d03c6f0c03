//! The outbox's tables (`migrations/`).

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

diesel::table! {
    operation_orders (operation_id) {
        operation_id -> BigInt,
        order_id -> Text,
    }
}

diesel::joinable!(operation_orders -> operations (operation_id));
diesel::allow_tables_to_appear_in_same_query!(operations, operation_orders);
