//! Shared test support: an API over an embedded store in a temp dir,
//! requests through the router without a socket, a loopback server for the
//! typed client, and small fact builders.

#![allow(dead_code, reason = "each test file uses a different part")]

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use cca_api::{ApiConfig, ApiState};
use cca_control::Cache;
use cca_model::spec::{PortSpec, Program, ServiceSpec, Workload};
use cca_store::embedded::{Config, EmbeddedStore};
use cca_store::{RangeRequest, Store};
use cca_wire::Client;
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::sync::oneshot;
use tower::ServiceExt;

pub(crate) struct Harness {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) state: ApiState,
    pub(crate) app: Router,
}

pub(crate) async fn harness() -> Harness {
    harness_with(ApiConfig::default()).await
}

pub(crate) async fn harness_with(config: ApiConfig) -> Harness {
    harness_with_metrics(config, Arc::new(|| "runner_cycles_total 7\n".to_owned())).await
}

/// A harness whose `/metrics` appends what `metrics` renders.
pub(crate) async fn harness_with_metrics(
    config: ApiConfig,
    metrics: cca_api::MetricsRenderer,
) -> Harness {
    harness_over(config, metrics, |store| store).await
}

/// A harness whose API (and `Harness::store`) uses what `wrap` makes of
/// the embedded store: a store that delays or holds some calls.
pub(crate) async fn harness_wrapping(
    config: ApiConfig,
    wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
) -> Harness {
    harness_over(config, cca_api::no_extra_metrics(), wrap).await
}

async fn harness_over(
    config: ApiConfig,
    metrics: cca_api::MetricsRenderer,
    wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
) -> Harness {
    let dir = tempfile::tempdir().expect("temp dir");
    let store: Arc<dyn Store> = wrap(Arc::new(
        EmbeddedStore::open(Config::new(dir.path()))
            .await
            .expect("store opens"),
    ));
    cca_api::identity::ensure_store_identity(&store)
        .await
        .expect("the store gets its identity");
    let cache = Arc::new(
        Cache::start(Arc::clone(&store))
            .await
            .expect("cache starts"),
    );
    let state = ApiState::new(Arc::clone(&store), cache, config, metrics);
    let app = cca_api::app(state.clone());
    Harness {
        dir,
        store,
        state,
        app,
    }
}

impl Harness {
    /// Sends a request through the router; returns the status and JSON body.
    pub(crate) async fn call(
        &self,
        method: &str,
        uri: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let body = body.map(|b| serde_json::to_vec(&b).expect("encodes"));
        self.raw(method, uri, body, "application/json").await
    }

    pub(crate) async fn raw(
        &self,
        method: &str,
        uri: &str,
        body: Option<Vec<u8>>,
        content_type: &str,
    ) -> (StatusCode, Value) {
        raw(&self.app, method, uri, body, content_type).await
    }

    /// Every key in the store, to prove a failed request wrote nothing.
    /// Every key in the store but its identity, which every store has.
    pub(crate) async fn keys(&self) -> Vec<String> {
        let page = self
            .store
            .range(RangeRequest::prefix(""))
            .await
            .expect("range");
        let identity = cca_model::keys::store_identity();
        page.kvs
            .into_iter()
            .map(|kv| kv.key)
            .filter(|key| *key != identity)
            .collect()
    }

    pub(crate) async fn revision(&self) -> i64 {
        self.store.current_revision().await.expect("revision")
    }

    /// Serves the API on a loopback port; the server stops when the
    /// returned guard drops.
    pub(crate) async fn serve(&self) -> (Client, oneshot::Sender<()>) {
        let (address, stop) = self.listen().await;
        (Client::new(&format!("http://{address}")), stop)
    }

    /// Serves the API on a loopback port and returns its address, for
    /// clients other than [`Client`].
    pub(crate) async fn listen(&self) -> (std::net::SocketAddr, oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let address = listener.local_addr().expect("address");
        let (stop, stopped) = oneshot::channel::<()>();
        let state = self.state.clone();
        tokio::spawn(async move {
            let _ = cca_api::serve(listener, state, async {
                let _ = stopped.await;
            })
            .await;
        });
        (address, stop)
    }
}

/// Sends a request through `app`; returns the status and JSON body.
pub(crate) async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let body = body.map(|b| serde_json::to_vec(&b).expect("encodes"));
    raw(app, method, uri, body, "application/json").await
}

pub(crate) async fn raw(
    app: &Router,
    method: &str,
    uri: &str,
    body: Option<Vec<u8>>,
    content_type: &str,
) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if body.is_some() {
        request = request.header("content-type", content_type);
    }
    let request = request
        .body(body.map_or_else(Body::empty, Body::from))
        .expect("request builds");
    let response = app.clone().oneshot(request).await.expect("answers");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body reads")
        .to_bytes();
    let json = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, json)
}

/// The state's view once it reflects everything the store held when asked.
pub(crate) async fn fresh(state: &ApiState) -> Arc<cca_control::View> {
    let revision = state.store().current_revision().await.expect("revision");
    state
        .cache()
        .view_at_least(revision)
        .await
        .expect("the cache catches up")
}

/// A placement of `service`'s instance `id` on `node`: 100m, 64Mi, spec
/// hash `h`, created at 0.
pub(crate) fn instance(id: &str, service: &str, node: &str) -> cca_model::cluster::Instance {
    cca_model::cluster::Instance {
        id: id.into(),
        service: service.into(),
        node: node.into(),
        ordinal: None,
        spec_hash: "h".into(),
        cpu: cca_model::spec::Cpu(100),
        memory: cca_model::spec::Memory(64 << 20),
        host_ports: std::collections::BTreeMap::new(),
        created_at: 0,
        stopping: false,
        replaces: None,
        failures: Vec::new(),
        resized: None,
    }
}

/// A node's registration: 4 CPUs, 8 GiB, amd64, on loopback.
pub(crate) fn node_request(name: &str) -> cca_wire::types::RegisterRequest {
    cca_wire::types::RegisterRequest {
        name: name.into(),
        cpu: cca_model::spec::Cpu(4000),
        memory: cca_model::spec::Memory(8 << 30),
        arch: "amd64".into(),
        zone: None,
        labels: std::collections::BTreeMap::new(),
        addresses: vec!["127.0.0.1".into()],
        agent_url: None,
        gate: Default::default(),
    }
}

/// A process service with `replicas` replicas.
pub(crate) fn service(name: &str, replicas: u32) -> ServiceSpec {
    ServiceSpec {
        replicas,
        ports: vec![PortSpec::tcp("http", 8080)],
        ..ServiceSpec::new(name, Workload::process("sleep 1000"))
    }
}

/// A program of services, each tagged `team=<name>`.
pub(crate) fn program(services: &[(&str, u32)]) -> Program {
    let mut program = Program::default();
    for (name, replicas) in services {
        program
            .services
            .insert((*name).to_owned(), service(name, *replicas));
        program
            .tags
            .entry((*name).to_owned())
            .or_default()
            .insert("team".to_owned(), (*name).to_owned());
    }
    program
}

pub(crate) fn json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).expect("encodes")
}

/// `inner`, but its whole-keyspace watch (the cache's) opens only when
/// `gate` does: the cache, and the assignment hub indexing it, lag behind
/// the store for as long as the test wants.
pub(crate) fn gated(
    inner: Arc<dyn cca_store::Store>,
    gate: tokio::sync::watch::Receiver<bool>,
) -> Arc<dyn cca_store::Store> {
    Arc::new(cca_store::decorate::Decorated::wrap(
        inner,
        WatchGate { gate },
    ))
}

struct WatchGate {
    gate: tokio::sync::watch::Receiver<bool>,
}

#[async_trait::async_trait]
impl cca_store::decorate::Hook for WatchGate {
    async fn before(&self, call: cca_store::decorate::Call<'_>) -> cca_store::Result<()> {
        if let cca_store::decorate::Call::Watch { prefix: "", .. } = call {
            let _ = self.gate.clone().wait_for(|open| *open).await;
        }
        Ok(())
    }
}
