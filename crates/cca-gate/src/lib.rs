//! Gates: the L7 ingress proxy a gate node runs (`cca agent
//! --gate-listen`). External HTTP(S) for a gate's hosts reaches the ready
//! backends of its services, routed by host and path prefix from the
//! network map's gates and endpoints and updated live: a map change builds
//! a new route table ([`table`]) and swaps it in while requests in flight
//! finish on the one they started with.
//!
//! [`balance`] owns how a request picks a backend (sticky cookies,
//! consistent hashing, round robin, least connections, outlier ejection);
//! [`gate_state`] what a gate keeps between requests (its backend client,
//! rate limits, retry budget, [`cache`]); [`forward`] what the proxy changes in the
//! messages it passes on; [`proxy`] the request path; [`h1`] HTTP/1.1
//! framing on raw bytes, which [`serve_h1`] (clients) and [`upstream`]
//! (backends) speak over [`transport`]; [`passed`] a backend's header
//! fields as they pass to the client, unparsed into a map; [`server`] the listeners, TLS,
//! HTTP/2 (hyper), idle timeouts and graceful drain; [`metrics`] what
//! `/metrics` shows. Certificates by SNI are [`cca_tls::HostCertificates`];
//! where they come from (the control plane) is the agent's business.

pub mod balance;
pub mod cache;
pub mod forward;
pub mod gate_state;
pub mod h1;
pub mod metrics;
pub mod passed;
pub mod proxy;
pub mod serve_h1;
pub mod server;
pub mod sharded;
pub mod table;
pub mod traffic;
pub mod transport;
pub mod upstream;
pub mod workers;

use std::sync::{Arc, Mutex};

use cca_model::net::{BackendState, GateBackendHealth, GateTargetHealth, NetworkMap};
use cca_tls::HostCertificates;
use tokio::sync::watch;

pub use proxy::{Proxy, ProxyOptions};
pub use server::{Listener, ServerOptions};

use crate::balance::HealthView;
use crate::metrics::Metrics;
use crate::table::{RouteTable, Routing};
use crate::traffic::{Traffic, Wake};

/// What went wrong setting up a gate's listeners.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("the gate cannot build its TLS configuration: {0}")]
    Tls(String),
    #[error(
        "the gate cannot start its worker threads: {0}; check the process's thread limit (ulimit -u)"
    )]
    Workers(std::io::Error),
}

/// A gate node's proxy: its route table, certificates and metrics.
#[derive(Debug)]
pub struct Gate {
    proxy: Arc<Proxy>,
    traffic: Arc<Traffic>,
    routing: Mutex<Routing>,
    certificates: Arc<HostCertificates>,
    metrics: Arc<Metrics>,
}

impl Gate {
    pub fn new(options: ProxyOptions) -> Self {
        let metrics = Arc::new(Metrics::default());
        let traffic = Arc::new(Traffic::default());
        Self {
            proxy: Arc::new(Proxy::new(
                Arc::clone(&metrics),
                Arc::clone(&traffic),
                options,
            )),
            routing: Mutex::new(Routing::new(Arc::clone(&metrics), Arc::clone(&traffic))),
            traffic,
            certificates: Arc::default(),
            metrics,
        }
    }

    /// Routes by `map` from the next request on.
    pub fn update(&self, map: &NetworkMap) {
        let table = self
            .routing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .build(map);
        self.proxy.replace_table(table);
    }

    /// Who wakes services at zero; without one, requests for a target with
    /// no backend get 503 at once.
    pub fn set_waker(&self, waker: Arc<dyn Wake>) {
        self.proxy.set_waker(waker);
    }

    /// When each service last got a request here, since the last call.
    pub fn traffic(&self) -> &Arc<Traffic> {
        &self.traffic
    }

    /// The route table requests use now.
    pub fn table(&self) -> Arc<RouteTable> {
        self.proxy.table()
    }

    /// `gate`'s targets and their backends' health on this node; `None`
    /// when this node does not know the gate.
    pub fn describe(&self, gate: &str) -> Option<Vec<GateTargetHealth>> {
        let table = self.table();
        let routes = table
            .gates()
            .iter()
            .find(|routes| routes.spec.name == gate)?;
        let now = tokio::time::Instant::now();
        let target = |prefix: Option<&String>, pool: &balance::Pool| GateTargetHealth {
            prefix: prefix.cloned(),
            service: pool.service.clone(),
            port: pool.port,
            backends: pool
                .backends
                .iter()
                .map(|backend| GateBackendHealth {
                    target: backend.target.clone(),
                    in_flight: backend.in_flight(),
                    state: match backend.health(now) {
                        HealthView::Healthy => BackendState::Healthy,
                        HealthView::Ejected(left) => BackendState::Ejected {
                            for_ms: left.as_millis() as u64,
                        },
                        HealthView::Probing => BackendState::Probing,
                    },
                })
                .collect(),
        };
        let mut targets = vec![target(None, &routes.default)];
        targets.extend(
            routes
                .paths
                .iter()
                .map(|(prefix, pool)| target(Some(prefix), pool)),
        );
        Some(targets)
    }

    /// The certificates HTTPS listeners serve, by SNI.
    pub fn certificates(&self) -> &Arc<HostCertificates> {
        &self.certificates
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The TLS configuration of an HTTPS listener: certificates by SNI,
    /// HTTP/2 or HTTP/1.1 by ALPN.
    pub fn tls_config(&self) -> Result<Arc<rustls::ServerConfig>, GateError> {
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
            .with_safe_default_protocol_versions()
            .map_err(|error| GateError::Tls(error.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&self.certificates) as _);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Serves `listeners` until `stop` turns true, then drains; forgets
    /// idle rate-limit clients and closes idle backend connections past
    /// their gate's idle timeout every ten seconds meanwhile.
    pub async fn serve(
        &self,
        listeners: Vec<Listener>,
        options: ServerOptions,
        stop: watch::Receiver<bool>,
    ) -> Result<(), GateError> {
        let served = server::serve(Arc::clone(&self.proxy), listeners, options, stop);
        tokio::pin!(served);
        let mut housekeeping = tokio::time::interval(std::time::Duration::from_secs(10));
        loop {
            tokio::select! {
                served = &mut served => return served.map_err(GateError::Workers),
                _ = housekeeping.tick() => {
                    for gate in self.table().gates() {
                        gate.state.forget_idle_clients();
                        gate.sweep_idle_connections();
                    }
                }
            }
        }
    }
}
