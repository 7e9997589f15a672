//! The console's page and its script and style, embedded in the binary
//! from `crates/cca-api/console/` (written by hand: no front-end build,
//! nothing to install to build the crate). They hold no data, so anyone
//! may fetch them; every answer forbids framing and inline scripts.

use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

const INDEX: &str = include_str!("../../console/index.html");

/// The files under `/ui/`, with their types.
const FILES: &[(&str, &str, &str)] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../console/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("../../console/app.css"),
    ),
];

/// Only our own script and style; the page reads the API of its origin.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /ui`: the console's one page (it routes by the URL's fragment).
pub(crate) async fn index() -> Response {
    served("text/html; charset=utf-8", INDEX)
}

/// `GET /ui/{file}`: the script and the style.
pub(crate) async fn asset(Path(file): Path<String>) -> Response {
    match FILES.iter().find(|(name, _, _)| *name == file) {
        Some((_, content_type, body)) => served(content_type, body),
        None => ApiError::not_found(format!("the console has no file `{file}`; its page is /ui"))
            .into_response(),
    }
}

fn served(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::REFERRER_POLICY, "no-referrer"),
            // A new binary may serve new files: check each time.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
