//! The web client's serving contract (`/app/`): every file of the page,
//! with no token, with its own content type, a strict
//! `Content-Security-Policy` and `nosniff`; nothing else under `/app/`;
//! and the API exactly as it was (auth, CORS). What the page does in a
//! browser is tested in one (`tests/browser/`, `scripts/browser-test.sh`).

use orders_api::http::app::{ASSETS, CONTENT_SECURITY_POLICY};

use crate::both_backends;
use crate::helpers::*;

const FOREIGN_ORIGIN: &str = "https://evil.example";

/// The directives of a policy, by name.
fn directives(policy: &str) -> Vec<(String, Vec<String>)> {
    policy
        .split(';')
        .filter_map(|d| {
            let mut words = d.split_whitespace();
            let name = words.next()?.to_ascii_lowercase();
            Some((name, words.map(str::to_owned).collect()))
        })
        .collect()
}

fn directive(policy: &str, name: &str) -> Option<Vec<String>> {
    directives(policy)
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
}

/// The headers every file of the page carries, asserted on one answer.
fn assert_page_headers(res: &TestResponse, what: &str) {
    let policy = res
        .header("Content-Security-Policy")
        .unwrap_or_else(|| panic!("{what}: no Content-Security-Policy"));
    assert_eq!(
        directive(policy, "default-src"),
        Some(vec!["'none'".to_owned()]),
        "{what}: {policy}"
    );
    for name in ["script-src", "style-src", "connect-src", "img-src"] {
        assert_eq!(
            directive(policy, name),
            Some(vec!["'self'".to_owned()]),
            "{what}: {name} is this origin only: {policy}"
        );
    }
    for name in ["frame-ancestors", "base-uri"] {
        assert_eq!(
            directive(policy, name),
            Some(vec!["'none'".to_owned()]),
            "{what}: {name}: {policy}"
        );
    }
    assert!(
        directive(policy, "require-trusted-types-for").is_some(),
        "{what}: HTML sinks refuse strings: {policy}"
    );
    for loophole in [
        "'unsafe-inline'",
        "'unsafe-eval'",
        "data:",
        "blob:",
        "*",
        "http:",
        "https:",
    ] {
        assert!(
            directives(policy)
                .iter()
                .all(|(_, sources)| !sources.iter().any(|s| s == loophole)),
            "{what}: the policy allows {loophole}: {policy}"
        );
    }
    assert_eq!(
        res.header("X-Content-Type-Options"),
        Some("nosniff"),
        "{what}"
    );
    assert_eq!(res.header("Cache-Control"), Some("no-cache"), "{what}");
    assert!(
        res.header("ETag").is_some_and(|t| t.starts_with('"')),
        "{what}: a strong ETag"
    );
}

/// Every `src="…"`/`href="…"` of the page and every `from '…'`/`import('…')`
/// and quoted `'….js'`/`'….css'`/`'….svg'` of a script: the files it asks for.
fn references(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for opener in ["src=\"", "href=\""] {
        for rest in text.split(opener).skip(1) {
            if let Some(end) = rest.find('"') {
                found.push(rest[..end].to_owned());
            }
        }
    }
    for rest in text.split('\'').skip(1) {
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || "._/-".contains(*c))
            .collect();
        // `split` took the closing quote: the whole piece is the name.
        let quoted = name.len() == rest.len();
        if quoted
            && [".js", ".css", ".svg"]
                .iter()
                .any(|ext| name.ends_with(ext))
        {
            found.push(name);
        }
    }
    found
}

both_backends! {
    fn the_page_is_served_without_a_token_as_html_under_a_strict_policy(backend) {
        let app = TestApp::spawn(backend);

        let res = app.request("GET", "/app/", &[], None);

        assert_eq!(res.status, 200, "{}", res.body);
        assert_eq!(res.header("Content-Type"), Some("text/html; charset=utf-8"));
        assert_page_headers(&res, "/app/");
        assert_eq!(res.header("Content-Security-Policy"), Some(CONTENT_SECURITY_POLICY));
        for field in [r#"name="token""#, r#"name="item""#, r#"name="quantity""#, r#"name="price""#] {
            assert!(res.body.contains(field), "the page has {field}");
        }
        assert!(res.body.contains(r#"<script type="module" src="main.js"></script>"#), "one module, from this origin");
    }

    fn every_file_of_the_page_is_served_with_its_content_type_and_the_pages_headers(backend) {
        let app = TestApp::spawn(backend);

        for asset in ASSETS {
            let path = format!("/app/{}", asset.name);
            let res = app.request("GET", &path, &[], None);
            assert_eq!(res.status, 200, "{path}: {}", res.body);
            assert_eq!(res.header("Content-Type"), Some(asset.content_type), "{path}");
            assert_page_headers(&res, &path);
        }
        let types: Vec<_> = ASSETS.iter().map(|a| a.content_type).collect();
        for wanted in ["text/html; charset=utf-8", "text/javascript; charset=utf-8", "text/css; charset=utf-8"] {
            assert!(types.contains(&wanted), "{wanted} among {types:?}");
        }
    }

    fn every_file_the_page_and_its_scripts_refer_to_is_served(backend) {
        let app = TestApp::spawn(backend);
        let mut checked = 0;

        for asset in ASSETS.iter().filter(|a| !a.content_type.starts_with("image/")) {
            let text = app.request("GET", &format!("/app/{}", asset.name), &[], None).body.clone();
            for reference in references(&text) {
                let name = reference.trim_start_matches("./");
                assert!(!name.contains("//") && !name.starts_with('/'), "{}: {reference} leaves the page's folder", asset.name);
                let res = app.request("GET", &format!("/app/{name}"), &[], None);
                assert_eq!(res.status, 200, "{} refers to {reference}", asset.name);
                checked += 1;
            }
        }
        assert!(checked >= 8, "the page's references were found ({checked})");
    }

    fn a_file_the_page_does_not_have_is_a_404_problem(backend) {
        let app = TestApp::spawn(backend);

        for path in ["/app/missing.js", "/app/main.js.map", "/app/sub/main.js", "/app/%2e%2e/Cargo.toml", "/appendix"] {
            let res = app.request("GET", path, &[], None);
            assert_eq!(res.status, 404, "{path}: {}", res.body);
            assert_eq!(res.header("Content-Type"), Some("application/problem+json"), "{path}");
            assert_eq!(res.error_code(), "NOT_FOUND", "{path}");
        }
    }

    fn the_folder_without_its_slash_is_redirected_to_the_page(backend) {
        let app = TestApp::spawn(backend);

        let res = app.request("GET", "/app", &[], None);

        assert_eq!(res.status, 308);
        assert_eq!(res.header("Location"), Some("/app/"));
    }

    fn a_copy_the_browser_still_has_is_answered_304_without_a_body(backend) {
        let app = TestApp::spawn(backend);
        let first = app.request("GET", "/app/main.js", &[], None);
        let etag = first.header("ETag").expect("an ETag").to_owned();

        let again = app.request("GET", "/app/main.js", &[("If-None-Match", &etag)], None);
        let other = app.request("GET", "/app/main.js", &[("If-None-Match", "\"another\"")], None);

        assert_eq!(again.status, 304);
        assert!(again.body.is_empty());
        assert_eq!(again.header("ETag"), Some(etag.as_str()));
        assert_eq!(other.status, 200);
        assert_eq!(other.body, first.body);
    }

    fn the_page_takes_only_get_and_changes_nothing_otherwise(backend) {
        let app = TestApp::spawn(backend);
        let auth = format!("Bearer {}", app.token);

        for path in ["/app/", "/app/main.js", "/app"] {
            let res = app.request(
                "POST",
                path,
                &[("Authorization", &auth), ("Idempotency-Key", "app-post"), ("Content-Type", "application/json")],
                Some(&order_body("Widget", 1, "1")),
            );
            assert_eq!(res.status, 405, "{path}: {}", res.body);
            assert_eq!(res.header("Allow"), Some("GET"), "{path}");
        }
        assert_eq!(app.order_count(), 0);
        assert_eq!(app.ledger_count(), 0);
    }

    fn the_api_keeps_its_auth_cors_and_headers_beside_the_page(backend) {
        let app = TestApp::spawn(backend);

        // The page itself grants no other origin anything.
        let page = app.request("GET", "/app/", &[("Origin", FOREIGN_ORIGIN)], None);
        assert_eq!(page.status, 200);
        assert_eq!(page.header("Access-Control-Allow-Origin"), None);

        // The API: still a token, still closed to other origins, without the page's headers.
        let anonymous = app.request("GET", "/v1/orders", &[], None);
        assert_eq!(anonymous.status, 401);
        let auth = format!("Bearer {}", app.token);
        let listed = app.request("GET", "/v1/orders", &[("Authorization", &auth), ("Origin", FOREIGN_ORIGIN)], None);
        assert_eq!(listed.status, 200);
        assert_eq!(listed.header("Access-Control-Allow-Origin"), None);
        assert_eq!(listed.header("Content-Security-Policy"), None, "the API's answers are not the page's");
        let preflight = app.request(
            "OPTIONS",
            "/v1/orders",
            &[("Origin", FOREIGN_ORIGIN), ("Access-Control-Request-Method", "POST")],
            None,
        );
        assert!(preflight.status < 500, "{}", preflight.status);
        assert_eq!(preflight.header("Access-Control-Allow-Origin"), None);
    }

    fn the_page_is_not_in_the_api_document(backend) {
        let app = TestApp::spawn(backend);

        let doc = app.request("GET", "/openapi.json", &[], None).json();

        let paths: Vec<&String> = doc["paths"].as_object().expect("paths").keys().collect();
        assert!(paths.iter().all(|p| !p.starts_with("/app")), "{paths:?}");
    }
}
