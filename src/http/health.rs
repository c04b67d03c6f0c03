//! Liveness, readiness and metrics: no authentication.

use actix_web::{HttpResponse, web};
use serde::Serialize;

use super::AppState;
use super::error::{ApiError, Problem};
use crate::db;
use idempotency_ledger::db::writer::WriterHealth;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Health {
    #[schema(example = "ok")]
    pub status: &'static str,
}

/// Liveness: the process is up and serving.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "getHealth",
    tag = "operations",
    responses((status = 200, description = "Up.", body = Health, example = json!({"status": "ok"})))
)]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health { status: "ok" })
}

/// Readiness: the database can be written (SQLite: its writer can write),
/// answers, and has every migration applied.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "getReadiness",
    tag = "operations",
    responses(
        (status = 200, description = "Ready to serve.", body = Health, example = json!({"status": "ready"})),
        (status = 503, description = "`SERVICE_UNAVAILABLE`: the database is unreachable or cannot be written now (a write stuck in its commit, no writer connection), or migrations are pending.", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u32, description = "Seconds to wait before asking again."))),
    )
)]
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    // First, and without touching the database: a disk that hangs must not
    // hang the answer.
    if let WriterHealth::Stalled(why) | WriterHealth::Unrecoverable(why) =
        state.pool.writer_health()
    {
        return Err(ApiError::Unavailable(why));
    }
    // Its own bound, half a request's read bound: a probe is answered
    // within the connection timeout (`DATABASE_TIMEOUT_SECS`), `503` when
    // the database does not answer by then.
    let bound = state.ledger.pool().connection_timeout();
    let ready = super::bounded_read(bound, move || -> Result<bool, ApiError> {
        let mut pooled = state.pool.get()?;
        Ok(db::migrations_applied(&mut pooled.conn())?)
    })
    .await?;
    if ready {
        Ok(HttpResponse::Ok().json(Health { status: "ready" }))
    } else {
        Err(ApiError::Unavailable("migrations are pending".into()))
    }
}

/// Prometheus metrics, in the text exposition format.
///
/// Requests by method, route and status (count and latency histogram),
/// idempotency outcomes, and the number of rows in the idempotency ledger as
/// last counted in the background: a scrape never touches the database.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "getMetrics",
    tag = "operations",
    responses((status = 200, description = "The metrics.", body = String, content_type = "text/plain; version=0.0.4"))
)]
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}
