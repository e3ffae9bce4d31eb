//! The dashboard: a page and its scripts, embedded in the binary (no build
//! step, nothing fetched from elsewhere), served under `/ui` (the page
//! also at `/`) without a token; everything it shows it reads through the
//! API with the token the operator logs in with (`ui/app.js`).

use axum::http::header;
use axum::response::IntoResponse;

/// One embedded file.
pub struct Asset {
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static str,
}

const PAGE: &str = include_str!("../ui/index.html");

/// The page is at `/ui` and at `/`, the address an operator types first.
pub const ASSETS: [Asset; 5] = [
    Asset { path: "/ui", content_type: "text/html; charset=utf-8", body: PAGE },
    Asset { path: "/", content_type: "text/html; charset=utf-8", body: PAGE },
    Asset { path: "/ui/app.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../ui/app.js") },
    Asset {
        path: "/ui/pages.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../ui/pages.js"),
    },
    Asset { path: "/ui/style.css", content_type: "text/css; charset=utf-8", body: include_str!("../ui/style.css") },
];

/// Only the server's own scripts and styles run, and only the server is
/// called: a value shown on a page can never become code.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; frame-ancestors 'none'; form-action 'none'";

pub fn serve(asset: &'static Asset) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, asset.content_type),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        asset.body,
    )
}
