//! The HTTP layer: routes, authentication, bodies, and the mapping of every
//! outcome to a response.

pub mod auth;
pub mod body;
pub mod error;
pub mod health;
pub mod mutation;
pub mod openapi;
pub mod orders;

use actix_cors::Cors;
use actix_web::http::header;
use actix_web::middleware::from_fn;
use actix_web::{HttpResponse, web};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::db::Pool;
use crate::idempotency::Ledger;
use error::ApiError;

/// What every handler shares.
pub struct AppState {
    pub pool: Pool,
    pub ledger: Ledger,
    pub max_body_bytes: usize,
    pub metrics: PrometheusHandle,
}

/// Every route, for [`actix_web::App::configure`].
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/healthz")
            .route(web::get().to(health::healthz))
            .default_service(allow("GET")),
    )
    .service(
        web::resource("/readyz")
            .route(web::get().to(health::readyz))
            .default_service(allow("GET")),
    )
    .service(
        web::resource("/metrics")
            .route(web::get().to(health::metrics))
            .default_service(allow("GET")),
    )
    .service(
        web::resource("/openapi.json")
            .route(web::get().to(openapi::serve))
            .default_service(allow("GET")),
    )
    .service(
        web::scope("/v1")
            .wrap(from_fn(auth::require_bearer))
            .service(
                web::resource("/orders")
                    .name("orders")
                    .route(web::post().to(orders::create))
                    .route(web::get().to(orders::list))
                    .default_service(allow("GET, POST")),
            )
            .service(
                web::resource("/orders/{id}")
                    .name("order")
                    .route(web::get().to(orders::get))
                    .route(web::patch().to(orders::update))
                    .route(web::delete().to(orders::cancel))
                    .default_service(allow("GET, PATCH, DELETE")),
            )
            .default_service(web::to(not_found)),
    )
    .default_service(web::to(not_found));
}

/// Answers a method the resource does not take (`PUT` among them) with
/// `405` and `Allow`, changing nothing.
fn allow(methods: &'static str) -> actix_web::Route {
    web::to(move || async move { Err::<HttpResponse, _>(ApiError::MethodNotAllowed(methods)) })
}

async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound)
}

/// CORS: closed unless origins are listed; an origin that is not listed
/// gets no `Access-Control-Allow-Origin`, and the request itself is left to
/// the routes (so a cross-origin form post is still a `415`).
pub fn cors(allowed_origins: &[String]) -> Cors {
    let mut cors = Cors::default()
        .allowed_methods(["GET", "POST", "PATCH", "DELETE"])
        .allowed_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::HeaderName::from_static("idempotency-key"),
        ])
        .expose_headers([
            header::LOCATION,
            header::RETRY_AFTER,
            header::HeaderName::from_static("idempotent-replayed"),
            header::HeaderName::from_static("x-request-id"),
        ])
        .max_age(600)
        .block_on_origin_mismatch(false);
    for origin in allowed_origins {
        cors = if origin == "*" {
            cors.allow_any_origin().send_wildcard()
        } else {
            cors.allowed_origin(origin)
        };
    }
    cors
}
