//! The HTTP layer: routes, authentication, bodies, and the mapping of every
//! outcome to a response.

pub mod app;
pub mod auth;
pub mod body;
pub mod connection;
pub mod error;
pub mod health;
pub mod mutation;
pub mod openapi;
pub mod orders;

use actix_cors::Cors;
use actix_web::http::{Method, header};
use actix_web::middleware::from_fn;
use actix_web::{HttpResponse, web};
use metrics_exporter_prometheus::PrometheusHandle;

use idempotency_ledger::Ledger;

use crate::auth::cache::TokenCache;
use crate::db::Pool;
use error::ApiError;

/// What every handler shares.
pub struct AppState {
    pub pool: Pool,
    /// Tokens the database accepted moments ago (see its bound on revocation).
    pub tokens: TokenCache,
    /// Every mutation runs through it; it holds the write admission.
    pub ledger: Ledger,
    pub max_body_bytes: usize,
    pub metrics: PrometheusHandle,
}

/// One operation of the API: a method on a path. [`routes`] registers
/// exactly these (besides the web client's static files, which are not
/// API), and the OpenAPI test compares them with the document, so an API
/// route cannot exist without being documented.
pub struct Endpoint {
    pub method: Method,
    /// The full path, in the router's (and OpenAPI's) `{param}` syntax.
    pub path: &'static str,
    handler: fn() -> actix_web::Route,
}

/// Paths under this prefix need a bearer token, checked before anything else.
pub const AUTHENTICATED_PREFIX: &str = "/v1";

/// Every operation, grouped by path; within a path, in the order `Allow` lists them.
/// Every `GET` has its `HEAD` (RFC 9110 §9.3.2): the same handler, answered
/// without the body (actix-http leaves it out, `Content-Length` kept).
pub const ENDPOINTS: &[Endpoint] = &[
    Endpoint {
        method: Method::GET,
        path: "/healthz",
        handler: || web::route().to(health::healthz),
    },
    Endpoint {
        method: Method::HEAD,
        path: "/healthz",
        handler: || web::route().to(health::healthz),
    },
    Endpoint {
        method: Method::GET,
        path: "/readyz",
        handler: || web::route().to(health::readyz),
    },
    Endpoint {
        method: Method::HEAD,
        path: "/readyz",
        handler: || web::route().to(health::readyz),
    },
    Endpoint {
        method: Method::GET,
        path: "/metrics",
        handler: || web::route().to(health::metrics),
    },
    Endpoint {
        method: Method::HEAD,
        path: "/metrics",
        handler: || web::route().to(health::metrics),
    },
    Endpoint {
        method: Method::GET,
        path: "/openapi.json",
        handler: || web::route().to(openapi::serve),
    },
    Endpoint {
        method: Method::HEAD,
        path: "/openapi.json",
        handler: || web::route().to(openapi::serve),
    },
    Endpoint {
        method: Method::GET,
        path: "/v1/orders",
        handler: || web::route().to(orders::list),
    },
    Endpoint {
        method: Method::HEAD,
        path: "/v1/orders",
        handler: || web::route().to(orders::list),
    },
    Endpoint {
        method: Method::POST,
        path: "/v1/orders",
        handler: || web::route().to(orders::create),
    },
    Endpoint {
        method: Method::GET,
        path: "/v1/orders/{id}",
        handler: || web::route().to(orders::get),
    },
    Endpoint {
        method: Method::HEAD,
        path: "/v1/orders/{id}",
        handler: || web::route().to(orders::get),
    },
    Endpoint {
        method: Method::PATCH,
        path: "/v1/orders/{id}",
        handler: || web::route().to(orders::update),
    },
    Endpoint {
        method: Method::DELETE,
        path: "/v1/orders/{id}",
        handler: || web::route().to(orders::cancel),
    },
];

/// Every route, for [`actix_web::App::configure`]: the [`ENDPOINTS`], one
/// resource per path, and the web client's files under [`app::PREFIX`]
/// (not API, so not among the endpoints nor in the OpenAPI document); any
/// other method on a known path is a `405` with `Allow`, an unknown path a
/// `404`.
pub fn routes(cfg: &mut web::ServiceConfig) {
    app::routes(cfg);
    let mut v1 = web::scope(AUTHENTICATED_PREFIX).wrap(from_fn(auth::require_bearer));
    for path in endpoint_paths() {
        match path.strip_prefix(AUTHENTICATED_PREFIX) {
            Some(rest) if rest.starts_with('/') => v1 = v1.service(resource(rest, path)),
            _ => {
                cfg.service(resource(path, path));
            }
        }
    }
    cfg.service(v1.default_service(web::to(not_found)))
        .default_service(web::to(not_found));
}

/// The distinct paths of [`ENDPOINTS`], in order.
fn endpoint_paths() -> Vec<&'static str> {
    let mut paths: Vec<&'static str> = Vec::new();
    for endpoint in ENDPOINTS {
        if !paths.contains(&endpoint.path) {
            paths.push(endpoint.path);
        }
    }
    paths
}

/// The resource at `rel` (relative to its scope) serving every endpoint of `path`.
fn resource(rel: &str, path: &str) -> actix_web::Resource {
    let endpoints = ENDPOINTS.iter().filter(|e| e.path == path);
    let allow = allow_header(path);
    endpoints
        .fold(web::resource(rel), |resource, e| {
            resource.route((e.handler)().method(e.method.clone()))
        })
        .default_service(allow_only(allow))
}

/// The `Allow` value of `path`: its methods, comma-separated.
fn allow_header(path: &str) -> String {
    ENDPOINTS
        .iter()
        .filter(|e| e.path == path)
        .map(|e| e.method.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Answers a method the resource does not take (`PUT` among them) with
/// `405` and `Allow`, changing nothing.
fn allow_only(methods: String) -> actix_web::Route {
    web::to(move || {
        let methods = methods.clone();
        async move { Err::<HttpResponse, _>(ApiError::MethodNotAllowed(methods)) }
    })
}

/// Runs `read` on a blocking thread and waits for it at most `bound`: past
/// it the request is answered `503` with `Retry-After` while the thread —
/// which a frozen file system or a database server that stopped answering
/// may hold for good — keeps what it holds (its connection) until the read
/// returns. Every read of a request goes through here, with the pool's
/// [`read_bound`](idempotency_ledger::db::Pool::read_bound) (`/readyz`
/// with a bound of its own).
pub async fn bounded_read<T, F>(bound: std::time::Duration, read: F) -> Result<T, ApiError>
where
    F: FnOnce() -> Result<T, ApiError> + Send + 'static,
    T: Send + 'static,
{
    match tokio::time::timeout(bound, web::block(read)).await {
        Ok(answered) => answered?,
        Err(_) => Err(ApiError::Unavailable(format!(
            "a read had no answer within {} ms",
            bound.as_millis()
        ))),
    }
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
            header::HeaderName::from_static(error::SHOULD_RETRY_HEADER),
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
