//! What every handler shares: the store (for writes and exact reads), the
//! watch-fed cache (for fast, consistent reads), limits, admission (the
//! lanes' permits and queues), the request metrics, a pluggable renderer for the control plane's own metrics, the
//! assignment hub feeding every agent's stream (an index over the cache),
//! the cluster's secret key, the TLS the server calls agents with, and
//! the shutdown signal that ends long-lived streams.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use cca_control::Cache;
use cca_model::cluster::{Event, EventLevel};
use cca_model::keys::EventIds;
use cca_store::{Op, Store};
use tokio::sync::{Semaphore, watch};

use crate::admission::{Admission, LaneSettings};
use crate::error::{ApiError, ApiResult};
use crate::hub::AssignmentHub;
use crate::metrics::RequestMetrics;
use crate::netfeed::NetworkFeed;
use crate::secrets::SecretKey;

/// Renders extra Prometheus text for `/metrics` (the controller runner's).
pub type MetricsRenderer = Arc<dyn Fn() -> String + Send + Sync>;

/// Limits and periods of the API server.
#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Per admission lane: requests served at once, requests queued, and
    /// how long one may wait (see `admission`).
    pub lanes: LaneSettings,
    /// Open watch, log and assignment streams at once.
    pub max_streams: usize,
    /// How long agents' heartbeat leases last, as the fleet grows.
    pub node_leases: cca_model::node_lease::NodeLeases,
    /// Events older than this are deleted.
    pub event_retention: Duration,
    /// At most this many events are kept (the oldest go first).
    pub max_events: usize,
    /// How often the retention task runs.
    pub retention_interval: Duration,
    /// How callers prove who they are (`auth`).
    pub authentication: crate::auth::Authentication,
    /// Audit records older than this are deleted.
    pub audit_retention: Duration,
    /// At most this many audit records are kept (the oldest go first).
    pub max_audit_records: usize,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 8 * 1024 * 1024,
            lanes: LaneSettings::default(),
            max_streams: 1024,
            node_leases: cca_model::node_lease::NodeLeases::default(),
            event_retention: Duration::from_secs(3600),
            max_events: 10_000,
            retention_interval: Duration::from_secs(30),
            authentication: crate::auth::Authentication::Open,
            audit_retention: Duration::from_secs(30 * 24 * 3600),
            max_audit_records: 100_000,
        }
    }
}

/// What a client refused a stream is told to wait: a stream's slot frees
/// only when another stream ends, so asking again at once is futile.
const STREAM_RETRY_AFTER: Duration = Duration::from_secs(2);

/// Shared state of the API; cheap to clone.
#[derive(Clone)]
pub struct ApiState {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    cache: Arc<Cache>,
    config: ApiConfig,
    extra_metrics: MetricsRenderer,
    requests: RequestMetrics,
    admission: Admission,
    stream_permits: Arc<Semaphore>,
    fleet: crate::fleet::Fleet,
    shutdown: watch::Sender<bool>,
    event_ids: EventIds,
    assignments: Arc<AssignmentHub>,
    network: Arc<NetworkFeed>,
    secret_key: RwLock<Option<Arc<SecretKey>>>,
    authority: RwLock<Option<Arc<cca_trust::pki::ClusterCa>>>,
    /// Without `authority`: the CA gates' certificates are signed with,
    /// made at the first request and kept until the server stops.
    gate_authority: std::sync::Mutex<Option<Arc<cca_trust::pki::ClusterCa>>>,
    policies: crate::authz::Policies,
    tokens: RwLock<Option<Arc<crate::auth::TokenAuthority>>>,
    agent_tls: RwLock<Option<Arc<AgentTls>>>,
    compiler: RwLock<Option<Arc<dyn crate::console::Compiler>>>,
    console_views: crate::console::BuiltViews,
    audit: crate::audit::AuditLog,
    /// Taken by the first `serve`, which runs it.
    audit_writer: std::sync::Mutex<Option<crate::audit::AuditWriter>>,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl ApiState {
    /// State over `store` and a cache following it. `extra_metrics` is
    /// appended to `/metrics` (pass [`no_extra_metrics`] when there are none).
    pub fn new(
        store: Arc<dyn Store>,
        cache: Arc<Cache>,
        config: ApiConfig,
        extra_metrics: MetricsRenderer,
    ) -> Self {
        let (shutdown, _) = watch::channel(false);
        let (audit, audit_writer) = crate::audit::AuditLog::new();
        let inner = Inner {
            audit,
            audit_writer: std::sync::Mutex::new(Some(audit_writer)),
            admission: Admission::new(&config.lanes),
            stream_permits: Arc::new(Semaphore::new(config.max_streams)),
            fleet: crate::fleet::Fleet::default(),
            store,
            cache,
            config,
            extra_metrics,
            requests: RequestMetrics::default(),
            shutdown,
            event_ids: EventIds::new(fastrand::u32(..)),
            assignments: Arc::default(),
            network: Arc::default(),
            secret_key: RwLock::new(None),
            authority: RwLock::new(None),
            gate_authority: std::sync::Mutex::new(None),
            policies: crate::authz::Policies::default(),
            tokens: RwLock::new(None),
            agent_tls: RwLock::new(None),
            compiler: RwLock::new(None),
            console_views: crate::console::BuiltViews::default(),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Tells nodes, in the network map, which ranges the control plane
    /// allocates subnets and VIPs from.
    #[must_use]
    pub fn with_network_ranges(self, ranges: cca_model::net::AddressRanges) -> Self {
        self.inner.network.set_ranges(ranges);
        self
    }

    /// Uses `key` to seal and open secret values (replacing any earlier
    /// one). Without a key the secret endpoints answer 503.
    #[must_use]
    pub fn with_secret_key(self, key: SecretKey) -> Self {
        *self
            .inner
            .secret_key
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(key));
        self
    }

    /// Enrols nodes and renews their certificates with `ca` (which holds
    /// the CA's key).
    #[must_use]
    pub fn with_authority(self, ca: Arc<cca_trust::pki::ClusterCa>) -> Self {
        *self
            .inner
            .authority
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(ca);
        self
    }

    /// Issues and checks user tokens with `tokens`.
    #[must_use]
    pub fn with_token_authority(self, tokens: crate::auth::TokenAuthority) -> Self {
        *self
            .inner
            .tokens
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(tokens));
        self
    }

    /// How user tokens are issued and checked, if this server does.
    pub(crate) fn token_authority(&self) -> Option<Arc<crate::auth::TokenAuthority>> {
        self.inner
            .tokens
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Calls agents that serve HTTPS (`https://` agent URLs) with `tls`:
    /// the cluster CA, and this server's own certificate as the client's
    /// (an agent serves only API servers). Without it such agents cannot
    /// be reached (502 saying so); plain `http://` agents can either way.
    #[must_use]
    pub fn with_agent_tls(self, tls: cca_wire::tls::ClientTls) -> Self {
        *self
            .inner
            .agent_tls
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(AgentTls {
            tls,
            clients: std::sync::Mutex::default(),
        }));
        self
    }

    /// How this server calls HTTPS agents, when it can.
    pub(crate) fn agent_tls(&self) -> Option<Arc<AgentTls>> {
        self.inner
            .agent_tls
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Compiles the programs pasted into the console's diff page.
    #[must_use]
    pub fn with_compiler(self, compiler: Arc<dyn crate::console::Compiler>) -> Self {
        *self
            .inner
            .compiler
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(compiler);
        self
    }

    /// The console's compiler, when the binary handed one.
    pub(crate) fn compiler(&self) -> Option<Arc<dyn crate::console::Compiler>> {
        self.inner
            .compiler
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The console's views built at the newest revisions.
    pub(crate) fn console_views(&self) -> &crate::console::BuiltViews {
        &self.inner.console_views
    }

    /// The roles in force.
    pub(crate) fn policies(&self) -> &crate::authz::Policies {
        &self.inner.policies
    }

    /// The cluster CA, or 503 when this server has none.
    pub(crate) fn authority(&self) -> ApiResult<Arc<cca_trust::pki::ClusterCa>> {
        self.inner
            .authority
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .ok_or_else(|| {
                ApiError::unavailable(
                    "this server has no cluster CA, so it cannot enrol nodes: run `cca init` and \
                 start `cca server` with its --config-dir",
                )
            })
    }

    /// The CA that signs gates' certificates: the cluster CA, or, on a
    /// server without one (plain HTTP, `cca dev --insecure`), a CA made
    /// in memory at the first request and kept until the server stops, so
    /// a `tls { self_signed }` gate serves HTTPS on any cluster. Its
    /// certificates outlive it on the gate nodes (they cache them); a new
    /// one signs their renewals after a restart.
    pub(crate) fn gate_authority(&self) -> ApiResult<Arc<cca_trust::pki::ClusterCa>> {
        if let Some(ca) = self
            .inner
            .authority
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
        {
            return Ok(ca);
        }
        let mut made = self
            .inner
            .gate_authority
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(ca) = made.as_ref() {
            return Ok(Arc::clone(ca));
        }
        let ca = cca_trust::pki::ClusterCa::generate(
            "gates",
            cca_model::clock::system_now(),
            cca_trust::pki::CA_VALIDITY,
        )
        .map_err(|error| {
            ApiError::internal(format!(
                "this server has no cluster CA and could not make one for gates: {error}"
            ))
        })?;
        let ca = Arc::new(ca);
        tracing::info!(
            fingerprint = %ca.fingerprint(),
            "no cluster CA: gates' certificates are signed by a CA made for this server's run"
        );
        *made = Some(Arc::clone(&ca));
        Ok(ca)
    }

    /// The cluster's secret key, or 503 when this server was given none.
    pub(crate) fn secret_key(&self) -> ApiResult<Arc<SecretKey>> {
        self.inner
            .secret_key
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .ok_or_else(|| {
                ApiError::unavailable(
                    "this server has no secret key, so it cannot store or read secret values: start `cca server` with --secret-key-file",
                )
            })
    }

    pub fn store(&self) -> &dyn Store {
        self.inner.store.as_ref()
    }

    /// The store, shared (for tasks that outlive a request).
    pub(crate) fn shared_store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.inner.store)
    }

    /// Registrations under way and room for lease moves.
    pub(crate) fn fleet(&self) -> &crate::fleet::Fleet {
        &self.inner.fleet
    }

    pub fn cache(&self) -> &Cache {
        &self.inner.cache
    }

    pub fn config(&self) -> &ApiConfig {
        &self.inner.config
    }

    pub(crate) fn requests(&self) -> &RequestMetrics {
        &self.inner.requests
    }

    pub(crate) fn extra_metrics(&self) -> String {
        (self.inner.extra_metrics)()
    }

    pub(crate) fn admission(&self) -> &Admission {
        &self.inner.admission
    }

    /// A permit for one long-lived stream, or 503 (with `Retry-After`)
    /// when too many are open.
    pub(crate) fn stream_permit(&self) -> ApiResult<tokio::sync::OwnedSemaphorePermit> {
        Arc::clone(&self.inner.stream_permits)
            .try_acquire_owned()
            .map_err(|_| {
                ApiError::unavailable(format!(
                    "too many open streams ({}, the server's limit); retry in {} s",
                    self.inner.config.max_streams,
                    STREAM_RETRY_AFTER.as_secs()
                ))
                .with_retry_after(STREAM_RETRY_AFTER)
            })
    }

    /// The one watch of placements every assignment stream is fed from.
    pub(crate) fn assignment_hub(&self) -> &Arc<AssignmentHub> {
        &self.inner.assignments
    }

    /// The network map every node follows, kept from the cache.
    pub(crate) fn network_feed(&self) -> &Arc<NetworkFeed> {
        &self.inner.network
    }

    /// The cluster's network map as this server sees it, updated after
    /// every revision that changes it (what the server's DNS answers from).
    pub async fn network_maps(&self) -> watch::Receiver<cca_model::net::NetworkMap> {
        self.inner.network.maps(self).await
    }

    /// Resolves when the server begins shutting down.
    pub(crate) fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.inner.shutdown.subscribe()
    }

    /// Tells streams and background tasks to end.
    pub(crate) fn begin_shutdown(&self) {
        self.inner.shutdown.send_replace(true);
    }

    pub(crate) fn audit(&self) -> &crate::audit::AuditLog {
        &self.inner.audit
    }

    /// The audit log's writer, once (the first `serve` runs it).
    pub(crate) fn take_audit_writer(&self) -> Option<crate::audit::AuditWriter> {
        self.inner
            .audit_writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// A put of one event-log entry, to add to the transaction it reports.
    pub(crate) fn event_op(&self, level: EventLevel, subject: &str, message: String) -> Op {
        let at = now_millis();
        let event = Event {
            at,
            level,
            source: "api".into(),
            subject: subject.into(),
            message,
        };
        Op::put(self.inner.event_ids.key(at), encode(&event))
    }
}

/// The TLS the server calls agents with, and the HTTPS client of each
/// node it called (each expects that node's certificate; kept for its
/// connection pool; built by `routes::instance_io`).
#[derive(Debug)]
pub(crate) struct AgentTls {
    pub(crate) tls: cca_wire::tls::ClientTls,
    pub(crate) clients: std::sync::Mutex<std::collections::HashMap<String, reqwest::Client>>,
}

/// No extra metrics.
pub fn no_extra_metrics() -> MetricsRenderer {
    Arc::new(String::new)
}

pub(crate) use cca_model::clock::now_millis;

/// JSON bytes of a fact. Fact types are plain data with string keys, so
/// encoding cannot fail; an empty value would be refused by decoders.
pub(crate) fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}
