//! The node's gate role (`cca agent --gate-listen`): binds the gate's
//! listeners before the node registers (so it registers where they really
//! are), keeps the proxy's route table in step with the node's network
//! view and its certificates in step with the key pairs [`gate_tls`]
//! keeps, and serves a node-local `/metrics` for Prometheus when asked to.
//! The proxy itself is `cca-gate`'s.
//!
//! [`gate_tls`]: crate::gate_tls

use std::net::SocketAddr;
use std::sync::Arc;

use cca_gate::traffic::Wake;
use cca_gate::{Gate, Listener, ProxyOptions, ServerOptions};
use cca_model::cluster::GateListen;
use cca_tls::HostPair;
use cca_wire::Client;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::error::AgentError;
use crate::gate_tls::GateKeyPairs;
use crate::netmap::NetworkView;

/// What `--gate-listen` and its companions ask for.
#[derive(Clone, Debug, Default)]
pub struct GateConfig {
    /// Plain HTTP.
    pub http: Option<SocketAddr>,
    /// HTTPS, with the gates' certificates by SNI.
    pub https: Option<SocketAddr>,
    pub server: ServerOptions,
    pub access_log: bool,
    /// Where `/metrics` is served in plain HTTP (node-local scraping).
    pub metrics_listen: Option<SocketAddr>,
}

/// A gate with its listeners bound, not yet serving.
#[derive(Debug)]
pub(crate) struct BoundGate {
    pub gate: Arc<Gate>,
    listeners: Vec<Listener>,
    metrics: Option<TcpListener>,
    /// What the node registers.
    pub advertised: GateListen,
    server: ServerOptions,
}

/// Binds the listeners of `config`; `address` is the node's own, which
/// is advertised for a listener bound to every address.
pub(crate) async fn bind(config: &GateConfig, address: &str) -> Result<BoundGate, AgentError> {
    let bind = |at: SocketAddr| async move {
        TcpListener::bind(at)
            .await
            .map_err(|error| AgentError::Listen {
                address: format!("{at} (--gate-listen)"),
                problem: error.to_string(),
            })
    };
    let advertise = |socket: &TcpListener| -> Result<String, AgentError> {
        let local = socket.local_addr().map_err(|error| AgentError::Listen {
            address: "the gate listener".into(),
            problem: error.to_string(),
        })?;
        Ok(if local.ip().is_unspecified() {
            format!("{address}:{}", local.port())
        } else {
            local.to_string()
        })
    };
    let mut advertised = GateListen::default();
    let mut sockets = Vec::new();
    if let Some(at) = config.http {
        let socket = bind(at).await?;
        advertised.http = Some(advertise(&socket)?);
        sockets.push((socket, false));
    }
    let https_port = match config.https {
        Some(at) => {
            let socket = bind(at).await?;
            let shown = advertise(&socket)?;
            let port = shown.rsplit_once(':').and_then(|(_, p)| p.parse().ok());
            advertised.https = Some(shown);
            sockets.push((socket, true));
            port
        }
        None => None,
    };
    let gate = Arc::new(Gate::new(ProxyOptions {
        access_log: config.access_log,
        https_port,
    }));
    let mut listeners = Vec::new();
    for (socket, tls) in sockets {
        let tls = if tls {
            Some(gate.tls_config().map_err(|error| AgentError::Listen {
                address: "the gate's HTTPS listener".into(),
                problem: error.to_string(),
            })?)
        } else {
            None
        };
        listeners.push(Listener { socket, tls });
    }
    let metrics = match config.metrics_listen {
        Some(at) => Some(bind(at).await?),
        None => None,
    };
    Ok(BoundGate {
        gate,
        listeners,
        metrics,
        advertised,
        server: config.server,
    })
}

impl BoundGate {
    /// Serves until `stop`, routing by every view `views` publishes and
    /// serving the certificates `pairs` holds for each gate's hosts.
    pub(crate) async fn run(
        self,
        link: Link,
        mut views: watch::Receiver<Arc<NetworkView>>,
        mut pairs: watch::Receiver<GateKeyPairs>,
        stop: watch::Receiver<bool>,
    ) {
        let gate = Arc::clone(&self.gate);
        gate.set_waker(Arc::new(link.clone()));
        let reporter = tokio::spawn(report_traffic(Arc::clone(&gate), link, stop.clone()));
        let following = Arc::clone(&gate);
        let follower = tokio::spawn(async move {
            loop {
                let view = Arc::clone(&views.borrow_and_update());
                following.update(&view.map);
                serve_certificates(&following, &view, &pairs.borrow_and_update());
                tokio::select! {
                    changed = views.changed() => if changed.is_err() { return },
                    changed = pairs.changed() => if changed.is_err() { return },
                }
            }
        });
        let metrics = self
            .metrics
            .map(|listener| tokio::spawn(serve_metrics(Arc::clone(&gate), listener, stop.clone())));
        if let Err(error) = gate.serve(self.listeners, self.server, stop).await {
            tracing::error!(%error, "the gate node stopped serving");
        }
        follower.abort();
        reporter.abort();
        if let Some(metrics) = metrics {
            let _ = metrics.await;
        }
    }
}

/// How a gate node reaches the control plane for scale to zero: it wakes
/// services and reports their traffic as itself.
#[derive(Clone, Debug)]
pub(crate) struct Link {
    pub client: Client,
    pub node: String,
}

impl Wake for Link {
    fn wake(&self, service: &str) {
        tracing::debug!(%service, "the gate asks to wake a service");
        let link = self.clone();
        let service = service.to_owned();
        tokio::spawn(async move {
            if let Err(error) = link.client.wake_service(&link.node, &service).await {
                tracing::warn!(%service, %error, "the gate could not wake a service");
            }
        });
    }
}

/// Reports when each service last got a request through this node, every
/// [`TRAFFIC_REPORT_EVERY`] and only when something is new; a failed
/// report is sent again with the next.
async fn report_traffic(gate: Arc<Gate>, link: Link, mut stop: watch::Receiver<bool>) {
    let mut every = tokio::time::interval(TRAFFIC_REPORT_EVERY);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        let fresh = gate.traffic().take_new();
        if fresh.is_empty() {
            continue;
        }
        if let Err(error) = link
            .client
            .report_gate_activity(&link.node, fresh.clone())
            .await
        {
            tracing::debug!(%error, "the gate's traffic report failed; it goes again with the next");
            gate.traffic().unreport(&fresh);
        }
    }
}

/// How often a gate node reports its services' traffic (a scale-to-zero
/// window shorter than this can put a busy service to sleep).
pub const TRAFFIC_REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves each gate's key pair for the gate's hosts.
fn serve_certificates(gate: &Gate, view: &NetworkView, pairs: &GateKeyPairs) {
    let served = view.map.gates.values().filter_map(|spec| {
        let pair = pairs.get(&spec.name)?;
        Some(HostPair {
            hosts: &spec.hosts,
            chain_pem: &pair.chain_pem,
            key_pem: &pair.key_pem,
        })
    });
    for (pair, error) in gate.certificates().replace(served) {
        tracing::warn!(hosts = ?pair.hosts, %error, "a gate certificate cannot be served");
    }
}

/// `GET /metrics` in the Prometheus text format, nothing else.
async fn serve_metrics(gate: Arc<Gate>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let gate = Arc::clone(&gate);
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    gate.metrics().render(),
                )
            }
        }),
    );
    let stopped = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    if let Err(error) = axum::serve(listener, router)
        .with_graceful_shutdown(stopped)
        .await
    {
        tracing::error!(%error, "the gate's metrics listener stopped");
    }
}
