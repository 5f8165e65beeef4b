//! The dashboard: a page the admin API serves at `/`, its script and its
//! style, embedded in the binary (no build step, nothing fetched from
//! elsewhere).
//!
//! The page itself holds no data and needs no token: it asks the person for
//! the token, keeps it in the tab's session storage, and reads and acts only
//! through the authenticated API (`docs/admin.md`, "Dashboard"). A strict
//! content security policy lets it load only its own script and style and
//! talk only to this host.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

const PAGE: &str = include_str!("dashboard/index.html");
const SCRIPT: &str = include_str!("dashboard/dashboard.js");
const STYLE: &str = include_str!("dashboard/dashboard.css");

/// Only the page's own script and style, requests to this host only, never
/// in a frame.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                      connect-src 'self'; img-src 'self'; base-uri 'none'; \
                      form-action 'none'; frame-ancestors 'none'";

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// `GET /`.
pub(super) async fn page() -> Response {
    asset(PAGE, "text/html; charset=utf-8")
}

/// `GET /dashboard.js`.
pub(super) async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

/// `GET /dashboard.css`.
pub(super) async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}
