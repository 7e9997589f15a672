//! MCP over HTTP (the protocol's Streamable HTTP transport, rmcp's server)
//! at `/mcp`, for assistants that connect to a URL rather than start a
//! process. Each request acts as whoever its `Authorization: Bearer`
//! token names: the tools call the API with that token, so one server
//! serves several callers, each with their own rights, and nobody acts
//! with the credentials of the account that started it. A cluster with a
//! CA requires the header on every request (401 without it); a cluster
//! without one has no users, and its API no authentication.
//!
//! It serves plain HTTP, so the caller decides where it listens (the
//! `cca` binary allows loopback only): tokens cross it in the clear.

use std::future::Future;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::{CcaMcp, Error};

/// The path MCP is served at.
pub const MCP_PATH: &str = "/mcp";

/// How [`serve_http`] treats callers.
#[derive(Clone, Copy, Debug)]
pub struct HttpOptions {
    /// Refuse requests without a bearer token (401).
    pub bearer_required: bool,
}

/// Serves `mcp` over HTTP on `listener` until `shutdown` completes. Each
/// session gets its own copy of `mcp`; each call uses the bearer token
/// of its own request.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    mcp: CcaMcp,
    options: HttpOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let address = listener
        .local_addr()
        .map_err(|error| Error::Start(error.to_string()))?;
    let config = StreamableHttpServerConfig::default().with_allowed_hosts([
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
        address.ip().to_string(),
    ]);
    let service = StreamableHttpService::new(
        move || Ok(mcp.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let app = axum::Router::new()
        .route_service(MCP_PATH, service)
        .layer(middleware::from_fn_with_state(options, check_bearer));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|error| Error::Serve(error.to_string()))
}

/// Refuses a request without a well-formed bearer token when one is
/// required.
async fn check_bearer(
    State(options): State<HttpOptions>,
    request: Request,
    next: Next,
) -> Response {
    if options.bearer_required && bearer(request.headers().get(header::AUTHORIZATION)).is_none() {
        let mut refused = (
            StatusCode::UNAUTHORIZED,
            "send your cluster user token as `Authorization: Bearer TOKEN` (`cca user token \
             NAME` makes one): this server acts as each request's caller\n",
        )
            .into_response();
        refused.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"ccattler\""),
        );
        return refused;
    }
    next.run(request).await
}

/// The token of an `Authorization: Bearer TOKEN` header.
pub(crate) fn bearer(value: Option<&HeaderValue>) -> Option<&str> {
    let text = value?.to_str().ok()?;
    let (scheme, token) = text.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_from_well_formed_headers_only() {
        let read = |text: &str| {
            let value = HeaderValue::from_str(text).expect("header");
            bearer(Some(&value)).map(str::to_owned)
        };
        assert_eq!(read("Bearer abc.def").as_deref(), Some("abc.def"));
        assert_eq!(read("bearer  abc ").as_deref(), Some("abc"));
        for bad in ["Basic abc", "Bearer", "Bearer ", "abc"] {
            assert_eq!(read(bad), None, "{bad}");
        }
        assert_eq!(bearer(None), None);
    }
}
