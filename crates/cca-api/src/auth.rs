//! Who may call which route. Under [`Authentication::Certificates`] every
//! caller proves an identity with a client certificate of the cluster CA
//! (`tls::Peer`): agent routes serve only the node the certificate names
//! — a node acts only as itself — and every other route needs a user's
//! certificate, except `GET /v1/identity`, which tells anyone who the
//! server takes them for, and `POST /v1/join`, where a new node's join
//! token is its credential. [`Authentication::Open`] is plain HTTP on
//! loopback (`cca dev`, tests), where nobody proves anything.
//!
//! Roles, tenants and bearer tokens refine the user side (issue 14); the
//! node rule stays as it is.

use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cca_trust::identity::Identity;

use crate::error::ApiError;
use crate::state::ApiState;
use crate::tls::Peer;

/// How callers prove who they are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Authentication {
    /// Nobody proves anything: only for a server on loopback.
    #[default]
    Open,
    /// A client certificate of the cluster CA on every request.
    Certificates,
}

/// The identity the request's connection proved, if any.
pub(crate) fn caller(request: &Request) -> Option<Identity> {
    request
        .extensions()
        .get::<ConnectInfo<Peer>>()
        .and_then(|ConnectInfo(peer)| peer.identity.clone())
}

/// Refuses requests whose caller may not use their route (see the module
/// documentation).
pub(crate) async fn authenticate(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    if state.config().authentication == Authentication::Open {
        return next.run(request).await;
    }
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("", MatchedPath::as_str)
        .to_owned();
    match admit(&route, request.uri().path(), caller(&request).as_ref()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
}

/// The rule, pure: may `caller` use `route` (the matched pattern) at `path`?
fn admit(route: &str, path: &str, caller: Option<&Identity>) -> Result<(), ApiError> {
    // Who-am-I, and the join: a joining node has no certificate yet (its
    // join token is its credential, checked by the route).
    if route == "/v1/identity" || route == "/v1/join" {
        return Ok(());
    }
    let Some(caller) = caller else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "this server needs a client certificate of the cluster CA: nodes get theirs \
             when they join, users from `cca init` or their administrator",
        ));
    };
    if route.starts_with("/v1/agent/") {
        return admit_agent(route, path, caller);
    }
    match caller {
        Identity::User(_) => Ok(()),
        other => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("{other} may use only the agent routes of its own node, not {route}"),
        )),
    }
}

/// Agent routes: only the node named in the path (register checks the
/// name in its body itself, through [`check_node`]).
fn admit_agent(route: &str, path: &str, caller: &Identity) -> Result<(), ApiError> {
    let Identity::Node(own) = caller else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("agent routes are for nodes; {caller} is not one"),
        ));
    };
    if route == "/v1/agent/register" {
        return Ok(());
    }
    let named = path
        .strip_prefix("/v1/agent/nodes/")
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_default();
    if named == own {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("node `{own}` may act only as itself, not as node `{named}`"),
        ))
    }
}

/// For routes that name the node in their body: under certificates, the
/// caller must be that node.
pub(crate) fn check_node(
    state: &ApiState,
    caller: Option<&Identity>,
    node: &str,
) -> Result<(), ApiError> {
    if state.config().authentication == Authentication::Open {
        return Ok(());
    }
    match caller {
        Some(Identity::Node(own)) if own == node => Ok(()),
        Some(Identity::Node(own)) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("node `{own}` may act only as itself, not as node `{node}`"),
        )),
        _ => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("only node `{node}` itself may do this"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(route: &str, path: &str, caller: Option<&Identity>) -> Option<u16> {
        admit(route, path, caller)
            .err()
            .map(|error| error.status.as_u16())
    }

    #[test]
    fn nodes_act_only_as_themselves_and_users_only_on_user_routes() {
        let n1 = Identity::Node("n1".into());
        let alice = Identity::User("alice".into());
        let beat = "/v1/agent/nodes/{node}/heartbeat";
        assert_eq!(
            status(beat, "/v1/agent/nodes/n1/heartbeat", Some(&n1)),
            None
        );
        assert_eq!(
            status(beat, "/v1/agent/nodes/n2/heartbeat", Some(&n1)),
            Some(403)
        );
        assert_eq!(
            status(beat, "/v1/agent/nodes/n1/heartbeat", Some(&alice)),
            Some(403)
        );
        assert_eq!(
            status(beat, "/v1/agent/nodes/n1/heartbeat", None),
            Some(401)
        );
        assert_eq!(status("/v1/services", "/v1/services", Some(&alice)), None);
        assert_eq!(status("/v1/services", "/v1/services", Some(&n1)), Some(403));
        assert_eq!(status("/v1/services", "/v1/services", None), Some(401));
        assert_eq!(status("/v1/identity", "/v1/identity", None), None);
        assert_eq!(
            status("/v1/agent/register", "/v1/agent/register", Some(&n1)),
            None,
            "the body's name is checked by the route"
        );
    }
}
