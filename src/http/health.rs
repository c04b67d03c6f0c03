//! Liveness, readiness and metrics: no authentication.

use actix_web::{HttpResponse, web};
use serde::Serialize;

use super::AppState;
use super::error::ApiError;
use crate::db;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Health {
    #[schema(example = "ok")]
    pub status: &'static str,
}

/// `GET /healthz`: the process is up.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health { status: "ok" })
}

/// `GET /readyz`: the database answers and every migration is applied.
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let ready = web::block(move || -> Result<bool, ApiError> {
        let mut pooled = state.pool.get()?;
        Ok(db::migrations_applied(&mut pooled.conn())?)
    })
    .await??;
    if ready {
        Ok(HttpResponse::Ok().json(Health { status: "ready" }))
    } else {
        Err(ApiError::Unavailable("migrations are pending".into()))
    }
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let ledger_rows = web::block({
        let state = state.clone();
        move || -> Option<i64> {
            let mut pooled = state.pool.get().ok()?;
            crate::idempotency::store::count(&mut pooled.conn()).ok()
        }
    })
    .await
    .ok()
    .flatten();
    if let Some(rows) = ledger_rows {
        crate::telemetry::set_ledger_rows(rows);
    }
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}
