//! The control plane assembled: over one store, the cache (the server's one
//! reflector), the controller runner (leader election and every controller
//! of [`controllers::all`]) and the API state serving them. `cca server`,
//! `cca dev` and the benchmark build it here and nowhere else, so they run
//! the same control plane with different settings.

use std::sync::Arc;

use cca_control::Cache;
use cca_control::controllers::{
    self, DisruptionConfig, LifecycleConfig, NetworkConfig, NodeConfig, SchedulerConfig,
};
use cca_control::metrics::Metrics;
use cca_control::runner::{Runner, RunnerConfig};
use cca_store::{Store, StoreError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::{ApiConfig, ApiState, SecretKey};

/// How the control plane is set up.
#[derive(Debug)]
pub struct ControlPlaneConfig {
    /// The runner's identity and leader lease.
    pub runner: RunnerConfig,
    pub scheduler: SchedulerConfig,
    /// Rollouts and autoscaling (the scale-down window).
    pub lifecycle: LifecycleConfig,
    /// When the node controller pauses lost-node replacement.
    pub disruption: DisruptionConfig,
    /// The address plan (checked by the caller with
    /// [`NetworkConfig::validate`]).
    pub network: NetworkConfig,
    pub api: ApiConfig,
    /// Seals and opens secret values; without one the secret endpoints
    /// answer 503.
    pub secret_key: Option<SecretKey>,
    /// The cluster CA with its key, to enrol nodes and renew their
    /// certificates; without it the token and join routes answer 503.
    pub authority: Option<Arc<cca_trust::pki::ClusterCa>>,
    /// Issues and checks user tokens; without it bearer tokens are refused.
    pub tokens: Option<crate::auth::TokenAuthority>,
    /// How the server calls agents that serve HTTPS (its own certificate
    /// as the client's); without it only plain-HTTP agents serve logs
    /// and exec ([`ApiState::with_agent_tls`]).
    pub agent_tls: Option<cca_wire::tls::ClientTls>,
    /// Compiles programs pasted into the console's diff page; without
    /// one that page answers 501 ([`crate::console::Compiler`]).
    pub compiler: Option<Arc<dyn crate::console::Compiler>>,
}

impl ControlPlaneConfig {
    /// The production defaults for a server named `server_id`.
    pub fn new(server_id: impl Into<String>) -> Self {
        Self {
            runner: RunnerConfig::new(server_id),
            scheduler: SchedulerConfig::default(),
            lifecycle: LifecycleConfig::default(),
            disruption: DisruptionConfig::default(),
            network: NetworkConfig::default(),
            api: ApiConfig::default(),
            secret_key: None,
            authority: None,
            tokens: None,
            agent_tls: None,
            compiler: None,
        }
    }
}

/// A running control plane; [`stop`](Self::stop) it to resign leadership.
pub struct ControlPlane {
    store: Arc<dyn Store>,
    cache: Arc<Cache>,
    state: ApiState,
    metrics: Arc<Metrics>,
    runner: RunnerConfig,
    scheduler: SchedulerConfig,
    lifecycle: LifecycleConfig,
    node: NodeConfig,
    network: NetworkConfig,
    /// Runners started so far: a restarted one campaigns under a new name.
    generation: u32,
    running: Option<(watch::Sender<bool>, JoinHandle<()>)>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("runner", &self.runner)
            .field("controllers_running", &self.running.is_some())
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Reads the store into the cache and starts the controllers. Fails
    /// only when the store cannot be read.
    pub async fn start(
        store: Arc<dyn Store>,
        config: ControlPlaneConfig,
    ) -> Result<Self, StoreError> {
        crate::identity::ensure_store_identity(&store).await?;
        let cache = Arc::new(Cache::start(Arc::clone(&store)).await?);
        let metrics = Arc::new(Metrics::new());
        let render = Arc::clone(&metrics);
        // Leases missed within one TTL of the agents' leases count
        // together: the window is that TTL by definition.
        let node = NodeConfig {
            leases: config.api.node_leases,
            disruption: config.disruption,
        };
        let mut state = ApiState::new(
            Arc::clone(&store),
            Arc::clone(&cache),
            config.api,
            Arc::new(move || render.render()),
        );
        if let Some(key) = config.secret_key {
            state = state.with_secret_key(key);
        }
        if let Some(authority) = config.authority {
            state = state.with_authority(authority);
        }
        if let Some(tokens) = config.tokens {
            state = state.with_token_authority(tokens);
        }
        if let Some(tls) = config.agent_tls {
            state = state.with_agent_tls(tls);
        }
        if let Some(compiler) = config.compiler {
            state = state.with_compiler(compiler);
        }
        let seed = crate::identity::ensure_flow_hash_seed(&store).await?;
        state = state.with_network_ranges(cca_model::net::AddressRanges {
            cluster: config.network.cluster_cidr,
            services: config.network.service_cidr,
            flow_hash_seed: Some(seed.seed),
        });
        let mut plane = Self {
            store,
            cache,
            state,
            metrics,
            runner: config.runner,
            scheduler: config.scheduler,
            lifecycle: config.lifecycle,
            node,
            network: config.network,
            generation: 0,
            running: None,
        };
        plane.start_controllers();
        Ok(plane)
    }

    /// The API state to serve (and to test routes against).
    pub fn state(&self) -> &ApiState {
        &self.state
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    /// The controllers' metrics (what `/metrics` renders for them).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Serves the API on `listener` until `shutdown` resolves (see
    /// [`crate::serve`]); the controllers keep running until
    /// [`stop`](Self::stop).
    pub async fn serve(
        &self,
        listener: impl Into<crate::ApiListener>,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        crate::serve(listener, self.state.clone(), shutdown).await
    }

    /// Starts the runner when it is not running (again after
    /// [`stop_controllers`](Self::stop_controllers), under a new name, as a
    /// restarted server would campaign).
    pub fn start_controllers(&mut self) {
        if self.running.is_some() {
            return;
        }
        let mut identity = self.runner.clone();
        if self.generation > 0 {
            identity.leader.server_id =
                format!("{}-{}", self.runner.leader.server_id, self.generation);
        }
        self.generation += 1;
        let runner = Runner::new(
            Arc::clone(&self.store),
            Arc::clone(&self.cache),
            controllers::all(&self.node, &self.scheduler, &self.network, &self.lifecycle),
            Arc::clone(&self.metrics),
            identity,
        );
        let (stop, stopping) = watch::channel(false);
        self.running = Some((stop, tokio::spawn(runner.run(stopping))));
    }

    /// Stops the runner; it resigns leadership on the way out.
    pub async fn stop_controllers(&mut self) {
        if let Some((stop, task)) = self.running.take() {
            stop.send_replace(true);
            let _ = task.await;
        }
    }

    /// Stops the controllers (the API stops with its `serve` future).
    pub async fn stop(mut self) {
        self.stop_controllers().await;
    }
}
