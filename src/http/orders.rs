//! The `/v1/orders` routes and the schemas of their bodies. Each
//! `#[utoipa::path]` says only what is its own: what every mutation shares
//! (the `Idempotency-Key` header, the `400`/`413`/`415` of its checks, the
//! ledger's `409` codes and `Retry-After`, `Idempotent-Replayed` on what a
//! replay can answer) is added where the OpenAPI document is assembled
//! (`http/openapi.rs`), which this module does not depend on.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::AuthUser;
use super::error::{ApiError, Problem};
use super::mutation::{BodyRule, Mutation, MutationCtx, json_reply};
use super::{AppState, bounded_read};
use crate::orders::input::{parse_new_order, parse_order_patch};
use crate::orders::model::{Order, OrderView};
use crate::orders::{self, Created, Cursor};
use idempotency_ledger::Completion;

pub const DEFAULT_PAGE_SIZE: u8 = 20;
pub const MAX_PAGE_SIZE: u8 = 100;

// Only a schema: the handler reads the body with
// `crate::orders::input::parse_new_order`, whose field rules
// (`crate::orders::input::OrderFields`) these mirror; a unit test of the
// OpenAPI document keeps them equal.
/// The body of `POST /v1/orders`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"item": "Widget", "quantity": 2, "price": 9.99}))]
#[allow(dead_code)] // a schema only; the handler parses the JSON itself
pub struct CreateOrder {
    /// What is ordered: trimmed, no control characters.
    #[schema(min_length = 1, max_length = 200)]
    item: String,
    /// A JSON integer literal (no fraction, no exponent).
    #[schema(minimum = 1, maximum = 1000000)]
    quantity: i32,
    /// The unit price, a whole number of cents.
    #[schema(minimum = 0, maximum = 1000000000, multiple_of = 0.01)]
    price: f64,
}

// Only a schema, like `CreateOrder`: see `parse_order_patch`.
/// The body of `PATCH /v1/orders/{id}`: at least one member.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(min_properties = 1, example = json!({"quantity": 3}))]
#[allow(dead_code)] // a schema only; the handler parses the JSON itself
pub struct UpdateOrder {
    /// What is ordered: trimmed, no control characters.
    #[schema(min_length = 1, max_length = 200, nullable = false)]
    item: Option<String>,
    /// A JSON integer literal (no fraction, no exponent).
    #[schema(minimum = 1, maximum = 1000000, nullable = false)]
    quantity: Option<i32>,
    /// The unit price, a whole number of cents.
    #[schema(
        minimum = 0,
        maximum = 1000000000,
        multiple_of = 0.01,
        nullable = false
    )]
    price: Option<f64>,
}

fn location(order: &Order) -> String {
    format!("/v1/orders/{}", order.id)
}

/// Creates an order.
///
/// Safe to retry: the first request with a key runs, and its answer is
/// recorded with the order in one transaction; a retry with the same key and
/// body gets that answer back (`200`, `Idempotent-Replayed: true`).
#[utoipa::path(
    post,
    path = "/v1/orders",
    operation_id = "createOrder",
    tag = "orders",
    request_body(content = CreateOrder, content_type = "application/json"),
    responses(
        (status = 201, description = "Created.", body = OrderView,
            headers(("Location" = String, description = "`/v1/orders/{id}`."))),
        (status = 200, description = "A replay: an earlier request with this key and body created this order (shown as it is now when its ledger entry was purged).", body = OrderView,
            headers(("Location" = String, description = "`/v1/orders/{id}`."))),
        (status = 422, description = "`VALIDATION_FAILED`: the body is not an object of the documented members; `errors` lists each failing field. Not recorded: the key stays unused.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let mutation = Mutation::prepare(&req, payload, &state, BodyRule::Json).await?;
    let new = parse_new_order(mutation.json()).map_err(ApiError::Validation)?;
    // Made only for a key the ledger has no entry for: a replay makes no id.
    let make = move |ctx: &MutationCtx| {
        let order = orders::prepare(&ctx.user_id, &ctx.fingerprint, new);
        let created = json_reply(StatusCode::CREATED, &order.view(), Some(location(&order)));
        (orders::new_row(&order, &ctx.key), created)
    };
    mutation
        .execute_insert(state, make, |tx, ctx| {
            Ok(
                match orders::existing(tx, &ctx.user_id, &ctx.key, &ctx.fingerprint)? {
                    // The ledger entry of the request that created this order
                    // was purged; the UNIQUE (user_id, idempotency_key) column
                    // still knows it. Answer from the order, record nothing.
                    Created::Existing(order) => Completion::ReplayFound(json_reply(
                        StatusCode::OK,
                        &order.view(),
                        Some(location(&order)),
                    )),
                    Created::KeyReused => Completion::KeyReusedFound,
                },
            )
        })
        .await
}

/// Reads one of the caller's orders.
#[utoipa::path(
    get,
    path = "/v1/orders/{id}",
    operation_id = "getOrder",
    tag = "orders",
    params(("id" = String, Path, description = "The order's id (a UUID). Another user's order is a `404`, like a missing one.")),
    responses(
        (status = 200, description = "The order.", body = OrderView),
        (status = 404, description = "`NOT_FOUND`: no such order of the caller's.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get(
    user: AuthUser,
    id: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bound = state.pool.read_bound();
    let order = bounded_read(bound, move || -> Result<Order, ApiError> {
        let mut pooled = state.pool.get()?;
        Ok(orders::get(&mut pooled.conn(), &user.0, &id)?)
    })
    .await?;
    Ok(HttpResponse::Ok().json(order.view()))
}

/// A page of orders.
#[derive(Debug, Serialize, ToSchema)]
pub struct OrderPage {
    pub data: Vec<OrderView>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    limit: Option<String>,
    cursor: Option<String>,
}

/// Lists the caller's orders, newest first.
///
/// Keyset-paginated: pass `next_cursor` as `cursor` for the next page;
/// `next_cursor` is `null` on the last page.
#[utoipa::path(
    get,
    path = "/v1/orders",
    operation_id = "listOrders",
    tag = "orders",
    params(
        ("limit" = Option<u8>, Query, description = "Orders per page, 1 to 100 (default 20).", minimum = 1, maximum = 100, nullable = false),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page, as the server issued it (opaque).", min_length = 1, nullable = false),
    ),
    responses(
        (status = 200, description = "A page of orders.", body = OrderPage),
        (status = 400, description = "`VALIDATION_FAILED`: `limit` is out of range, or `cursor` was not issued by this server.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list(
    user: AuthUser,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let query = web::Query::<ListQuery>::from_query(req.query_string())
        .map_err(|_| ApiError::BadQuery("the query string is malformed".into()))?
        .into_inner();
    let limit = match query.limit.as_deref() {
        None => DEFAULT_PAGE_SIZE,
        Some(raw) => raw
            .parse::<u8>()
            .ok()
            .filter(|n| (1..=MAX_PAGE_SIZE).contains(n))
            .ok_or_else(|| {
                ApiError::BadQuery(format!(
                    "limit must be an integer from 1 to {MAX_PAGE_SIZE}"
                ))
            })?,
    };
    let cursor = match query.cursor.as_deref() {
        None => None,
        Some(raw) => Some(
            Cursor::decode(raw)
                .ok_or_else(|| ApiError::BadQuery("cursor was not issued by this server".into()))?,
        ),
    };
    let bound = state.pool.read_bound();
    let page = bounded_read(bound, move || -> Result<orders::Page, ApiError> {
        let mut pooled = state.pool.get()?;
        Ok(orders::list(&mut pooled.conn(), &user.0, cursor, limit)?)
    })
    .await?;
    Ok(HttpResponse::Ok().json(OrderPage {
        data: page.orders.iter().map(Order::view).collect(),
        next_cursor: page.next.map(Cursor::encode),
    }))
}

/// Changes `item`, `quantity` and/or `price` of a pending order.
///
/// Safe to retry with the same `Idempotency-Key`, like every mutation.
#[utoipa::path(
    patch,
    path = "/v1/orders/{id}",
    operation_id = "updateOrder",
    tag = "orders",
    params(("id" = String, Path, description = "The order's id (a UUID). Another user's order is a `404`, like a missing one.")),
    request_body(content = UpdateOrder, content_type = "application/json"),
    responses(
        (status = 200, description = "The order as changed.", body = OrderView),
        (status = 404, description = "`NOT_FOUND`: no such order of the caller's. Recorded and replayed for the key.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`ORDER_NOT_PENDING`: the order is cancelled (recorded and replayed for the key).", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`VALIDATION_FAILED`: the body is not an object of the documented members; `errors` lists each failing field. Not recorded: the key stays unused.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn update(
    req: HttpRequest,
    id: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let mutation = Mutation::prepare(&req, payload, &state, BodyRule::Json).await?;
    let patch = parse_order_patch(mutation.json()).map_err(ApiError::Validation)?;
    let id = id.into_inner();
    mutation
        .execute(state, move |tx, ctx| {
            let order = orders::update(tx, &ctx.user_id, &id, &patch)?;
            Ok(Completion::Record(json_reply(
                StatusCode::OK,
                &order.view(),
                None,
            )))
        })
        .await
}

/// Cancels an order: its `status` becomes `cancelled`.
///
/// Cancelling a cancelled order is a no-op that answers the order. No body
/// is needed; one that is sent must be JSON.
#[utoipa::path(
    delete,
    path = "/v1/orders/{id}",
    operation_id = "cancelOrder",
    tag = "orders",
    params(("id" = String, Path, description = "The order's id (a UUID). Another user's order is a `404`, like a missing one.")),
    responses(
        (status = 200, description = "The cancelled order.", body = OrderView),
        (status = 404, description = "`NOT_FOUND`: no such order of the caller's. Recorded and replayed for the key.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn cancel(
    req: HttpRequest,
    id: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let mutation = Mutation::prepare(&req, payload, &state, BodyRule::Optional).await?;
    let id = id.into_inner();
    mutation
        .execute(state, move |tx, ctx| {
            let order = orders::cancel(tx, &ctx.user_id, &id)?;
            Ok(Completion::Record(json_reply(
                StatusCode::OK,
                &order.view(),
                None,
            )))
        })
        .await
}
