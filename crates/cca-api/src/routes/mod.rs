//! The router: every endpoint under `/v1/`, `/metrics`, and the layers
//! every request passes (JSON errors for unknown routes and panics, the
//! body limit, admission by lane, request metrics).

mod agent;
mod backup;
mod enrol;
pub(crate) mod events;
mod gates;
mod inspect;
mod instance_io;
pub(crate) mod ops;
pub(crate) mod reads;
mod revoke;
mod rollout;
mod scale;
mod secrets;
mod users;
pub(crate) mod watch;

use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post, put};
use tower_http::catch_panic::CatchPanicLayer;

use crate::admission::Lane;
use crate::console;
use crate::error::{self, ApiError};
use crate::state::ApiState;

pub(crate) use events::{prune_events, retention_task};
pub(crate) use revoke::follow_revocations;

/// The API's router over `state`.
pub fn app(state: ApiState) -> Router {
    with_layers(routes(), state)
}

/// A router of only the `liveness` lane's routes (register, heartbeat),
/// with the same layers: what [`crate::serve_liveness`] serves.
pub fn liveness_app(state: ApiState) -> Router {
    let liveness = routes()
        .into_iter()
        .filter(|(path, _)| Lane::of(path) == Lane::Liveness)
        .collect();
    with_layers(liveness, state)
}

fn with_layers(routes: Vec<(&'static str, MethodRouter<ApiState>)>, state: ApiState) -> Router {
    let body_limit = state.config().max_body_bytes;
    routes
        .into_iter()
        .fold(Router::new(), |router, (path, methods)| {
            router.route(path, methods)
        })
        .fallback(error::no_route)
        .method_not_allowed_fallback(error::wrong_method)
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            crate::auth::authenticate,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            crate::audit::record,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(CatchPanicLayer::custom(|_| {
            ApiError::internal("the request handler failed unexpectedly").into_response()
        }))
        .with_state(state)
}

/// Every route of the router. Each must have its lane in
/// [`admission::ROUTE_LANES`] (a test checks).
fn routes() -> Vec<(&'static str, MethodRouter<ApiState>)> {
    vec![
        ("/v1/apply", post(ops::apply)),
        ("/v1/diff", post(ops::diff)),
        ("/v1/services", get(reads::services)),
        (
            "/v1/services/{name}",
            get(reads::service).delete(ops::delete_service),
        ),
        (
            "/v1/services/{name}/scale",
            get(reads::scale_status).post(ops::scale),
        ),
        ("/v1/services/{name}/history", get(reads::service_history)),
        ("/v1/services/{name}/rollout", get(rollout::status)),
        ("/v1/services/{name}/rollout/pause", post(rollout::pause)),
        ("/v1/services/{name}/rollout/resume", post(rollout::resume)),
        ("/v1/services/{name}/rollout/undo", post(rollout::undo)),
        ("/v1/services/{name}/logs", get(instance_io::service_logs)),
        ("/v1/instances", get(reads::instances)),
        ("/v1/instances/{id}", get(reads::instance)),
        ("/v1/instances/{id}/logs", get(instance_io::instance_logs)),
        ("/v1/instances/{id}/exec", post(instance_io::exec)),
        ("/v1/top/nodes", get(reads::top_nodes)),
        ("/v1/top/workloads", get(reads::top_workloads)),
        ("/v1/nodes", get(reads::nodes)),
        ("/v1/nodes/{name}", get(reads::node)),
        ("/v1/nodes/{name}/inspect", get(inspect::inspect)),
        ("/v1/nodes/{name}/drain", post(ops::drain)),
        ("/v1/nodes/{name}/disable", post(ops::disable)),
        ("/v1/nodes/{name}/enable", post(ops::enable)),
        ("/v1/secrets", get(secrets::list)),
        (
            "/v1/secrets/{name}",
            put(secrets::set).delete(secrets::delete),
        ),
        ("/v1/secret-key/rotate", post(secrets::rotate_key)),
        ("/v1/tokens", get(enrol::list).post(enrol::create)),
        ("/v1/tokens/{id}", delete(enrol::revoke)),
        ("/v1/join", post(enrol::join)),
        ("/v1/revocations", get(revoke::list).post(revoke::revoke)),
        ("/v1/users", get(users::users)),
        (
            "/v1/users/{name}",
            get(users::user)
                .put(users::put_user)
                .delete(users::delete_user),
        ),
        ("/v1/users/{name}/tokens", post(users::token)),
        ("/v1/roles", get(users::roles)),
        (
            "/v1/roles/{name}",
            put(users::put_role).delete(users::delete_role),
        ),
        ("/v1/logout", post(users::logout)),
        ("/v1/gates/{name}", get(gates::describe)),
        ("/v1/status", get(reads::status)),
        ("/v1/identity", get(reads::identity)),
        (
            "/v1/cluster/resume-replacement",
            post(ops::resume_replacement),
        ),
        ("/v1/events", get(events::list)),
        ("/v1/audit", get(events::audit)),
        ("/v1/watch", get(watch::watch)),
        ("/v1/backup", get(backup::backup)),
        ("/v1/agent/register", post(agent::register)),
        ("/v1/agent/nodes/{node}/heartbeat", post(agent::heartbeat)),
        (
            "/v1/agent/nodes/{node}/assignments",
            get(agent::assignments),
        ),
        ("/v1/agent/nodes/{node}/network", get(agent::network)),
        ("/v1/agent/nodes/{node}/reports", post(agent::report_batch)),
        ("/v1/agent/nodes/{node}/held-ports", put(agent::held_ports)),
        ("/v1/agent/nodes/{node}/unclaimed", put(agent::unclaimed)),
        ("/v1/agent/nodes/{node}/usage", put(agent::usage)),
        (
            "/v1/agent/nodes/{node}/instances/{id}",
            put(agent::report).delete(agent::forget),
        ),
        (
            "/v1/agent/nodes/{node}/instances/{id}/files",
            get(secrets::instance_files),
        ),
        ("/v1/agent/nodes/{node}/certificate", post(enrol::renew)),
        ("/v1/agent/nodes/{node}/revocations", get(revoke::for_node)),
        (
            "/v1/agent/nodes/{node}/gates/{gate}/certificate",
            post(gates::certificate),
        ),
        ("/v1/agent/nodes/{node}/gates/{gate}/tls", get(gates::tls)),
        (
            "/v1/agent/nodes/{node}/gate-activity",
            post(scale::gate_activity),
        ),
        (
            "/v1/agent/nodes/{node}/services/{service}/wake",
            post(scale::wake),
        ),
        ("/metrics", get(reads::metrics)),
        ("/ui", get(console::index)),
        ("/ui/{file}", get(console::asset)),
        ("/v1/console/overview", get(console::overview)),
        ("/v1/console/services", get(console::services)),
        ("/v1/console/services/{name}", get(console::service)),
        ("/v1/console/nodes", get(console::nodes)),
        ("/v1/console/nodes/{name}", get(console::node)),
        ("/v1/console/instances/{id}", get(console::instance)),
        ("/v1/console/events", get(console::events)),
        ("/v1/console/diff", post(console::diff)),
        ("/v1/console/apply", post(console::apply)),
    ]
}

/// Admits each request through its route's lane (shedding it with 429
/// and `Retry-After` when the lane is full) and records its route, status
/// and latency. Streams hold their lane's permit only until their headers
/// are sent; they have their own bound.
async fn observe(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let method = request.method().as_str().to_owned();
    let response = match state.admission().admit(Lane::of(&route)).await {
        Ok(_admitted) => next.run(request).await,
        Err(shed) => ApiError::from(shed).into_response(),
    };
    state.requests().record(
        &route,
        &method,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{ROUTE_LANES, explicit_lane};

    #[test]
    fn every_route_of_the_router_has_its_lane() {
        let paths: Vec<&str> = routes().into_iter().map(|(path, _)| path).collect();
        for path in &paths {
            assert!(
                explicit_lane(path).is_some(),
                "route {path} has no row in admission::ROUTE_LANES: choose its lane"
            );
        }
        for (row, _) in ROUTE_LANES {
            assert!(
                paths.contains(row),
                "admission::ROUTE_LANES names {row}, which the router does not have"
            );
        }
    }
}
