//! CCattler's HTTP API: the axum [`app`] (every endpoint under `/v1/`, plus
//! `/metrics`) and [`serve`] to run it on a listener with graceful
//! shutdown. Only this crate serves the cluster's routes; their request and
//! response shapes and the typed client live in `cca-wire`, which agents and
//! the CLI use. It reads through the control plane's cache and writes
//! through the store, one transaction per request. Every request is
//! admitted through its route's lane (`admission`), so agents' liveness
//! never waits behind reports, users or bulk reads. Endpoints are listed in
//! `docs/api.md`.

mod admission;
mod apply;
mod audit;
pub mod auth;
mod authz;
pub mod console;
pub mod control_plane;
pub mod error;
mod fleet;
mod hub;
pub mod identity;
mod metrics;
mod netfeed;
pub mod oidc;
mod read;
pub mod renewal;
mod routes;
pub mod secrets;
mod staged;
mod state;
mod tenancy;
pub mod tls;
mod update;
mod validate;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

pub use admission::{Lane, LaneLimits, LaneSettings};
/// The wire types are the API's contract; the server uses them as its own.
pub use cca_wire::{DEFAULT_LISTEN, types};
pub use control_plane::{ControlPlane, ControlPlaneConfig};
pub use error::ApiError;
pub use routes::{app, liveness_app};
pub use secrets::{SecretKey, SecretKeyError};
pub use state::{ApiConfig, ApiState, MetricsRenderer, no_extra_metrics};
pub use tls::{
    Peer, RevocationList, ServerCertificate, ServerTls, TlsConnection, TlsError, TlsListener,
};

/// Serves the API on `listener` until `shutdown` resolves, then stops
/// accepting, ends open streams, and waits for requests in flight. Also
/// runs the event-retention task for as long as it serves, and first
/// finishes a staged apply a previous server left half copied.
pub async fn serve(
    listener: impl Into<ApiListener>,
    state: ApiState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let retention = tokio::spawn(routes::retention_task(state.clone()));
    let settling = tokio::spawn(staged::settle_in_background(state.clone()));
    let (stop_audit, audit_stopping) = tokio::sync::oneshot::channel::<()>();
    let auditing = state.take_audit_writer().map(|writer| {
        tokio::spawn(audit::write_loop(writer, state.shared_store(), async {
            let _ = audit_stopping.await;
        }))
    });
    let stopping = state.clone();
    let shutdown = async move {
        shutdown.await;
        stopping.begin_shutdown();
    };
    let listener = listener.into();
    let revoking = match &listener {
        ApiListener::Tls(tls) => Some(tokio::spawn(routes::follow_revocations(
            state.clone(),
            Arc::clone(tls.revocations()),
        ))),
        ApiListener::Plain(_) => None,
    };
    let roles = tokio::spawn(authz::follow_roles(state.clone()));
    let refreshing = state.token_authority().and_then(|tokens| {
        let issuer = tokens.oidc_issuer()?.clone();
        Some(tokio::spawn(issuer.refresh(tokens)))
    });
    let result = serve_router(listener, app(state), shutdown).await;
    roles.abort();
    if let Some(refreshing) = refreshing {
        refreshing.abort();
    }
    if let Some(revoking) = revoking {
        revoking.abort();
    }
    retention.abort();
    settling.abort();
    let _ = stop_audit.send(());
    if let Some(auditing) = auditing {
        let _ = tokio::time::timeout(audit::FLUSH_DEADLINE, auditing).await;
    }
    result
}

/// Where the API accepts connections: plain HTTP (loopback development,
/// tests) or HTTPS.
#[derive(Debug)]
pub enum ApiListener {
    Plain(TcpListener),
    Tls(TlsListener),
}

impl From<TcpListener> for ApiListener {
    fn from(listener: TcpListener) -> Self {
        ApiListener::Plain(listener)
    }
}

impl From<TlsListener> for ApiListener {
    fn from(listener: TlsListener) -> Self {
        ApiListener::Tls(listener)
    }
}

/// Serves only the agents' liveness routes (register, heartbeat) on
/// `listener` until `shutdown` resolves. Run on a thread of its own
/// (`cca server --liveness-listen`), heartbeats then never wait behind
/// the rest of the API's work on a busy control plane: their requests
/// neither share a connection with assignment streams nor a run queue
/// with reports, reads and the controllers. Admission is the same
/// `liveness` lane as on the main listener.
pub async fn serve_liveness(
    listener: impl Into<ApiListener>,
    state: ApiState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_router(listener.into(), routes::liveness_app(state), shutdown).await
}

/// Serves `router` on `listener`, every request knowing its [`Peer`],
/// with Nagle's algorithm off on every connection.
async fn serve_router(
    listener: ApiListener,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let service = router.into_make_service_with_connect_info::<Peer>();
    match listener {
        ApiListener::Plain(listener) => {
            axum::serve(tls::NoDelayListener(listener), service)
                .with_graceful_shutdown(shutdown)
                .await
        }
        ApiListener::Tls(listener) => {
            axum::serve(listener, service)
                .with_graceful_shutdown(shutdown)
                .await
        }
    }
}

#[doc(hidden)]
/// Test support: deletes old events now (the retention task's step).
pub async fn prune_events_now(
    store: &dyn cca_store::Store,
    cutoff: cca_model::cluster::Millis,
    max_events: usize,
) -> cca_store::Result<usize> {
    routes::prune_events(store, cutoff, max_events).await
}
