//! CCattler's HTTP API: the axum [`app`] (every endpoint under `/v1/`, plus
//! `/metrics`), [`serve`] to run it on a listener with graceful shutdown,
//! and the typed [`Client`]. Only this crate knows HTTP and the JSON wire
//! format; it reads through the control plane's cache and writes through
//! the store, one transaction per request. Endpoints are listed in
//! `docs/api.md`.

mod apply;
pub mod client;
pub mod error;
mod hub;
mod metrics;
mod read;
mod routes;
pub mod secrets;
mod state;
pub mod types;
mod validate;

use std::future::Future;

use tokio::net::TcpListener;

pub use client::{
    Client, ClientError, ClientResult, EventQuery, InstanceQuery, LineStream, LogLines,
};
pub use error::ApiError;
pub use routes::app;
pub use secrets::{SecretKey, SecretKeyError};
pub use state::{ApiConfig, ApiState, MetricsRenderer, no_extra_metrics};

/// The default listen address (loopback only: no TLS yet).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9770";

/// Serves the API on `listener` until `shutdown` resolves, then stops
/// accepting, ends open streams, and waits for requests in flight. Also
/// runs the event-retention task for as long as it serves.
pub async fn serve(
    listener: TcpListener,
    state: ApiState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let retention = tokio::spawn(routes::retention_task(state.clone()));
    let stopping = state.clone();
    let result = axum::serve(listener, app(state))
        .with_graceful_shutdown(async move {
            shutdown.await;
            stopping.begin_shutdown();
        })
        .await;
    retention.abort();
    result
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
