//! The web client at `/app/`: an offline-first page whose outbox lives in
//! the browser's IndexedDB (see `docs/CLIENT.md`). Its files are in
//! `web/app/` and compiled into the binary; nothing is read from disk.
//!
//! Every file is served with a strict `Content-Security-Policy` (scripts,
//! styles, images and requests from this origin only; no inline script or
//! style; no framing), `X-Content-Type-Options: nosniff`, its exact content
//! type, and `Cache-Control: no-cache` with an `ETag`: the browser keeps a
//! copy and asks each time whether it is still current (`304`), so a new
//! binary's files are seen at once. The page is not API: it needs no token
//! (it asks for one and keeps it in the tab's `sessionStorage`), it is not
//! in `/openapi.json`, and the API's CORS rules do not change for it — the
//! page calls the API from the same origin.

use std::sync::LazyLock;

use actix_web::http::header::{self, ETag, EntityTag, IfNoneMatch};
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use sha2::{Digest, Sha256};

use super::error::ApiError;

/// Where the page lives.
pub const PREFIX: &str = "/app";

/// The policy every file of the page is served with. `require-trusted-types-for`
/// makes the browser refuse any string written into a script or HTML sink
/// (`innerHTML` and the like): the page builds its DOM from its templates
/// and `textContent` only, and its one Trusted Types policy
/// (`orders-app`) lets through exactly one script URL, its service worker's.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     connect-src 'self'; style-src 'self'; img-src 'self'; worker-src 'self'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'; \
     require-trusted-types-for 'script'; trusted-types orders-app";

/// One file of the page.
pub struct Asset {
    /// Its name under `/app/` (`""` is the page itself).
    pub name: &'static str,
    pub content_type: &'static str,
    body: &'static [u8],
}

const HTML: &str = "text/html; charset=utf-8";
const JAVASCRIPT: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const SVG: &str = "image/svg+xml";

/// Every file of the page; any other name under `/app/` is a `404`.
pub const ASSETS: &[Asset] = &[
    Asset {
        name: "",
        content_type: HTML,
        body: include_bytes!("../../web/app/index.html"),
    },
    Asset {
        name: "app.css",
        content_type: CSS,
        body: include_bytes!("../../web/app/app.css"),
    },
    Asset {
        name: "icon.svg",
        content_type: SVG,
        body: include_bytes!("../../web/app/icon.svg"),
    },
    Asset {
        name: "main.js",
        content_type: JAVASCRIPT,
        body: include_bytes!("../../web/app/main.js"),
    },
    Asset {
        name: "outbox.js",
        content_type: JAVASCRIPT,
        body: include_bytes!("../../web/app/outbox.js"),
    },
    Asset {
        name: "drain.js",
        content_type: JAVASCRIPT,
        body: include_bytes!("../../web/app/drain.js"),
    },
    Asset {
        name: "orders.js",
        content_type: JAVASCRIPT,
        body: include_bytes!("../../web/app/orders.js"),
    },
    Asset {
        name: "sw.js",
        content_type: JAVASCRIPT,
        body: include_bytes!("../../web/app/sw.js"),
    },
];

/// Each asset's `ETag`: the first 16 bytes of its SHA-256, in hex.
static ETAGS: LazyLock<Vec<EntityTag>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|asset| EntityTag::new_strong(hex::encode(&Sha256::digest(asset.body)[..16])))
        .collect()
});

/// The page's routes: `/app` (redirected to `/app/`, so that the page's
/// relative URLs resolve under it), `/app/` and `/app/{file}`. Any other
/// method than `GET` is a `405` with `Allow: GET`.
pub fn routes(cfg: &mut web::ServiceConfig) {
    let get_only = || super::allow_only("GET".to_owned());
    cfg.service(
        web::resource(PREFIX)
            .route(web::get().to(to_folder))
            .default_service(get_only()),
    )
    .service(
        web::resource(format!("{PREFIX}/"))
            .route(web::get().to(|req: HttpRequest| async move { serve(&req, "") }))
            .default_service(get_only()),
    )
    .service(
        web::resource(format!("{PREFIX}/{{file}}"))
            .route(
                web::get().to(|req: HttpRequest, file: web::Path<String>| async move {
                    serve(&req, &file)
                }),
            )
            .default_service(get_only()),
    );
}

async fn to_folder() -> HttpResponse {
    HttpResponse::PermanentRedirect()
        .insert_header((header::LOCATION, format!("{PREFIX}/")))
        .finish()
}

/// The asset `name`, or `304` when the browser's copy is current, or a
/// `404` problem when there is no such file.
fn serve(req: &HttpRequest, name: &str) -> Result<HttpResponse, ApiError> {
    let (index, asset) = ASSETS
        .iter()
        .enumerate()
        .find(|(_, asset)| asset.name == name)
        .ok_or(ApiError::NotFound)?;
    let etag = ETAGS.get(index).cloned().ok_or(ApiError::NotFound)?;
    let current = match req.get_header::<IfNoneMatch>() {
        Some(IfNoneMatch::Any) => true,
        Some(IfNoneMatch::Items(tags)) => tags.iter().any(|tag| tag.weak_eq(&etag)),
        None => false,
    };
    let mut response = if current {
        HttpResponse::NotModified()
    } else {
        HttpResponse::Ok()
    };
    response
        .insert_header(ETag(etag))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        .insert_header((
            header::HeaderName::from_static("cross-origin-opener-policy"),
            "same-origin",
        ));
    Ok(if current {
        response.finish()
    } else {
        response
            .insert_header((header::CONTENT_TYPE, asset.content_type))
            .body(asset.body)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_has_a_distinct_name_and_a_body() {
        for (i, asset) in ASSETS.iter().enumerate() {
            assert!(!asset.body.is_empty(), "{} is empty", asset.name);
            assert!(
                ASSETS[..i].iter().all(|other| other.name != asset.name),
                "{} twice",
                asset.name
            );
        }
    }

    #[test]
    fn no_asset_holds_inline_script_or_style_the_policy_would_refuse() {
        for asset in ASSETS.iter().filter(|a| a.content_type == HTML) {
            let html = std::str::from_utf8(asset.body).unwrap_or_default();
            assert!(
                !html.contains("<script>"),
                "inline script in {}",
                asset.name
            );
            assert!(!html.contains("<style"), "inline style in {}", asset.name);
            assert!(!html.contains(" style="), "inline style in {}", asset.name);
            let handler = html.split(" on").skip(1).any(|rest| {
                let name: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
                !name.is_empty() && rest[name.len()..].starts_with('=')
            });
            assert!(!handler, "an inline event handler in {}", asset.name);
        }
    }
}
