//! The `/v1/orders` routes.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};

use super::AppState;
use super::auth::AuthUser;
use super::error::ApiError;
use super::mutation::{BodyRule, Mutation, json_reply, mark_replayed};
use crate::idempotency::Completion;
use crate::orders::input::{parse_new_order, parse_order_patch};
use crate::orders::model::{Order, OrderView};
use crate::orders::{self, Created, Cursor};

pub const DEFAULT_PAGE_SIZE: u8 = 20;
pub const MAX_PAGE_SIZE: u8 = 100;

fn location(order: &Order) -> String {
    format!("/v1/orders/{}", order.id)
}

/// `POST /v1/orders`
pub async fn create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let mutation = Mutation::prepare(&req, payload, &state, BodyRule::Json).await?;
    let new = parse_new_order(mutation.json()).map_err(ApiError::Validation)?;
    mutation
        .execute(state, move |tx, ctx| {
            Ok(
                match orders::create(tx, &ctx.user_id, &ctx.key, &ctx.fingerprint, new)? {
                    Created::New(order) => Completion::Record(json_reply(
                        StatusCode::CREATED,
                        &order.view(),
                        Some(location(&order)),
                    )),
                    // The ledger entry of the request that created this order was
                    // purged; the UNIQUE (user_id, idempotency_key) column still
                    // knows it. Answer from the order, record nothing.
                    Created::Existing(order) => Completion::Release(mark_replayed(json_reply(
                        StatusCode::OK,
                        &order.view(),
                        Some(location(&order)),
                    ))),
                    Created::KeyReused => Completion::Release(ApiError::KeyReused.to_recorded()),
                },
            )
        })
        .await
}

/// `GET /v1/orders/{id}`
pub async fn get(
    user: AuthUser,
    id: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let order = web::block(move || -> Result<Order, ApiError> {
        let mut pooled = state.pool.get()?;
        Ok(orders::get(&mut pooled.conn(), &user.0, &id)?)
    })
    .await??;
    Ok(HttpResponse::Ok().json(order.view()))
}

/// A page of orders.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OrderPage {
    pub data: Vec<OrderView>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    limit: Option<String>,
    cursor: Option<String>,
}

/// `GET /v1/orders?limit=&cursor=`
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
    let page = web::block(move || -> Result<orders::Page, ApiError> {
        let mut pooled = state.pool.get()?;
        Ok(orders::list(&mut pooled.conn(), &user.0, cursor, limit)?)
    })
    .await??;
    Ok(HttpResponse::Ok().json(OrderPage {
        data: page.orders.iter().map(Order::view).collect(),
        next_cursor: page.next.map(Cursor::encode),
    }))
}

/// `PATCH /v1/orders/{id}`
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

/// `DELETE /v1/orders/{id}`
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
