//! The router: every endpoint under `/v1/`, `/metrics`, and the layers
//! every request passes (JSON errors for unknown routes and panics, the
//! body limit, the concurrency bound, request metrics).

mod agent;
mod events;
mod instance_io;
mod ops;
mod reads;
mod secrets;
mod watch;

use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use tower_http::catch_panic::CatchPanicLayer;

use crate::error::{self, ApiError};
use crate::state::ApiState;

pub(crate) use events::{prune_events, retention_task};

/// The API's router over `state`.
pub fn app(state: ApiState) -> Router {
    let body_limit = state.config().max_body_bytes;
    Router::new()
        .merge(user_routes())
        .merge(agent_routes())
        .route("/metrics", get(reads::metrics))
        .fallback(error::no_route)
        .method_not_allowed_fallback(error::wrong_method)
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(CatchPanicLayer::custom(|_| {
            ApiError::internal("the request handler failed unexpectedly").into_response()
        }))
        .with_state(state)
}

fn user_routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/apply", post(ops::apply))
        .route("/v1/diff", post(ops::diff))
        .route("/v1/services", get(reads::services))
        .route(
            "/v1/services/{name}",
            get(reads::service).delete(ops::delete_service),
        )
        .route("/v1/services/{name}/scale", post(ops::scale))
        .route("/v1/services/{name}/history", get(reads::service_history))
        .route("/v1/services/{name}/logs", get(instance_io::service_logs))
        .route("/v1/instances", get(reads::instances))
        .route("/v1/instances/{id}", get(reads::instance))
        .route("/v1/instances/{id}/logs", get(instance_io::instance_logs))
        .route("/v1/instances/{id}/exec", post(instance_io::exec))
        .route("/v1/nodes", get(reads::nodes))
        .route("/v1/nodes/{name}", get(reads::node))
        .route("/v1/nodes/{name}/drain", post(ops::drain))
        .route("/v1/nodes/{name}/disable", post(ops::disable))
        .route("/v1/nodes/{name}/enable", post(ops::enable))
        .route("/v1/secrets", get(secrets::list))
        .route(
            "/v1/secrets/{name}",
            put(secrets::set).delete(secrets::delete),
        )
        .route("/v1/status", get(reads::status))
        .route(
            "/v1/cluster/resume-replacement",
            post(ops::resume_replacement),
        )
        .route("/v1/events", get(events::list))
        .route("/v1/watch", get(watch::watch))
}

fn agent_routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/agent/register", post(agent::register))
        .route("/v1/agent/nodes/{node}/heartbeat", post(agent::heartbeat))
        .route(
            "/v1/agent/nodes/{node}/assignments",
            get(agent::assignments),
        )
        .route("/v1/agent/nodes/{node}/reports", post(agent::report_batch))
        .route(
            "/v1/agent/nodes/{node}/instances/{id}",
            put(agent::report).delete(agent::forget),
        )
        .route(
            "/v1/agent/nodes/{node}/instances/{id}/files",
            get(secrets::instance_files),
        )
}

/// Bounds concurrent requests (waiting up to the queue timeout, then 503)
/// and records each request's route, status and latency. Streams hold a
/// permit only until their headers are sent; they have their own bound.
async fn observe(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let method = request.method().as_str().to_owned();
    let permit = tokio::time::timeout(
        state.config().queue_timeout,
        state.request_permits().acquire(),
    )
    .await;
    let response = match permit {
        Ok(Ok(_permit)) => next.run(request).await,
        _ => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server busy: too many requests in flight; retry later",
        )
        .into_response(),
    };
    state.requests().record(
        &route,
        &method,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}
