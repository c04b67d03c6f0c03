//! Bearer-token authentication: the first check on every `/v1` request.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::{FromRequest, HttpMessage, HttpRequest, web};
use std::future::{Ready, ready};

use super::AppState;
use super::error::ApiError;
use crate::auth;
use crate::auth::cache::Cached;

/// The user the request's bearer token belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthUser(pub String);

/// Middleware for the `/v1` scope: resolves the bearer token to a user or
/// answers `401` before anything else runs.
pub async fn require_bearer<B: MessageBody>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    match authenticate(&req).await {
        Ok(user) => {
            tracing::Span::current().record("user_id", user.as_str());
            req.extensions_mut().insert(AuthUser(user));
            Ok(next.call(req).await?.map_into_left_body())
        }
        Err(e) => Ok(req.error_response(e).map_into_right_body()),
    }
}

/// The token's user: from the [`auth::cache::TokenCache`] when the database
/// answered for the token moments ago, else from the database (and
/// remembered). A lookup needs a permit first: past the bound on lookups of
/// tokens never seen live, the request waits its turn — holding no blocking
/// thread and no connection — at most the connection timeout, then `503`;
/// a lookup of its token may have answered meanwhile.
async fn authenticate(req: &ServiceRequest) -> Result<String, ApiError> {
    let token = bearer_token(req).ok_or(ApiError::Unauthorized)?;
    let state = req
        .app_data::<web::Data<AppState>>()
        .cloned()
        .ok_or_else(|| ApiError::Internal("application state missing".into()))?;
    let hash = auth::hash_token(&token);
    let remembered = |state: &AppState| match state.tokens.get(&hash) {
        Some(Cached::User(user)) => Some(Ok(user)),
        Some(Cached::Unknown) => Some(Err(ApiError::Unauthorized)),
        None => None,
    };
    if let Some(answer) = remembered(&state) {
        return answer;
    }
    let Some(permit) = state
        .tokens
        .permit(&hash, state.ledger.pool().connection_timeout())
        .await
    else {
        metrics::counter!(LOOKUPS_SHED).increment(1);
        return Err(ApiError::TooManyTokenLookups);
    };
    if let Some(answer) = remembered(&state) {
        return answer;
    }
    let bound = state.pool.read_bound();
    let user = super::bounded_read(bound, move || -> Result<Option<String>, ApiError> {
        let mut pooled = state.pool.get()?;
        Ok(state.tokens.look_up(permit, &hash, || {
            auth::user_of_hash(&mut pooled.conn(), &hash)
        })?)
    })
    .await?;
    user.ok_or(ApiError::Unauthorized)
}

/// Requests answered `503` because as many lookups of tokens never seen
/// live as the bound allows were running, for as long as they could wait.
pub const LOOKUPS_SHED: &str = "orders_api_token_lookups_shed_total";

fn bearer_token(req: &ServiceRequest) -> Option<String> {
    let mut values = req.headers().get_all(header::AUTHORIZATION);
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let (scheme, token) = value.to_str().ok()?.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && auth::looks_like_token(token))
        .then(|| token.to_owned())
}

impl FromRequest for AuthUser {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(
            req.extensions()
                .get::<AuthUser>()
                .cloned()
                .ok_or(ApiError::Unauthorized),
        )
    }
}
