//! [`Cluster`]: the real control plane — cache, runner (leader election,
//! node, scheduler and endpoint controllers), HTTP API on a loopback port —
//! and N real agents, one `cca_agent::run` task per simulated node, each
//! with its own [`SimRuntime`]. Every 60 agents share one HTTP/2
//! connection (requests and assignment streams multiplexed on it) and
//! serve no agent API (nothing here asks simulated instances for logs or
//! exec): 5,000 nodes cost ~170 descriptors instead of two per node and
//! per request in flight, which would not fit under this machine's
//! open-file limit of 20,000. With TLS ([`ClusterConfig::tls`]) both
//! listeners serve HTTPS, every request needs a client certificate of
//! the cluster CA (`Authentication::Certificates`), and every agent
//! presents its own node's ([`crate::trust`]): no connection can be
//! shared, so each agent holds two (API and liveness), four descriptors
//! per node in this process with both ends. Where the open-file limit
//! cannot hold that (5,000 nodes under 20,000),
//! [`ClusterConfig::liveness_over_api`] sends registrations and
//! heartbeats over each agent's API connection to the main listener
//! instead, as agents of a `cca server` without `--liveness-listen` do:
//! two descriptors per node. Every agent's connections are opened before
//! it starts, on a runtime of their own ([`connect_all`]), so a heartbeat
//! never waits behind other agents' work. The control plane runs on a
//! runtime of its
//! own ([`PlaneRuntime`], as many workers as the machine has cores), the
//! store and the agents on the caller's — as a server process is apart
//! from its etcd and its machines. The harness can kill nodes, restart
//! the controllers, freeze the control plane and stop everything;
//! everything else happens through production code.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cca_agent::{AgentConfig, AgentError, LinkOptions, SupervisorConfig};
use cca_api::auth::Authentication;
use cca_api::{
    ApiConfig, ApiListener, ControlPlane, ControlPlaneConfig, Lane, ServerTls, TlsListener,
};
use cca_model::node_lease::NodeLeases;
use cca_model::spec::{Cpu, Memory};
use cca_runtime::sim::{SimConfig, SimRuntime};
use cca_store::Store;
use cca_wire::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::BenchError;
use crate::plane_runtime::PlaneRuntime;
use crate::trust::BenchPki;
use crate::workload::GOLD_LABEL;

/// Agents sharing one HTTP/2 connection: each holds one long-lived
/// assignment stream and at times a heartbeat and a report, which stays
/// under the server's 200 concurrent streams per connection.
const AGENTS_PER_CONNECTION: usize = 60;

/// The shape of a simulated cluster and the control plane's timings.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub nodes: usize,
    /// Capacity of every node.
    pub node_cpu: Cpu,
    pub node_memory: Memory,
    /// Every node's runtime behaviour; node `i` draws with seed `seed + i`.
    pub sim: SimConfig,
    /// The agents' heartbeat leases (production default: 6 s while the
    /// fleet's heartbeats fit 1,500 a second, longer past that).
    pub node_leases: NodeLeases,
    /// Unreachable this long → instances replaced (production default 2 s).
    pub lost_grace: Duration,
    /// No placement this long after becoming leader (production default 10 s).
    pub startup_grace: Duration,
    /// How often each agent's supervisor looks even without changes
    /// (`cca agent` uses 500 ms).
    pub agent_tick: Duration,
    /// When a pause of lost-node replacement ends on its own (`None`:
    /// only returning heartbeats or an operator end it).
    pub resume_replacement_after: Option<Duration>,
    /// How often each agent reports its usage (production 30 s).
    pub usage_every: Duration,
    /// The lifecycle controller's scale-down window (production 5 min).
    pub scale_down_window: Duration,
    /// Production security: HTTPS with client certificates on both
    /// listeners, each agent with its own node certificate, the harness
    /// with the local admin's.
    pub tls: bool,
    /// Agents send registrations and heartbeats over their API client to
    /// the main listener (its `liveness` lane), not to the liveness
    /// listener: one connection per agent fewer.
    pub liveness_over_api: bool,
    /// Without TLS too, every agent holds connections of its own (as on
    /// machines of their own) instead of sharing one per
    /// [`AGENTS_PER_CONNECTION`]: the baseline with the same connections
    /// as a TLS run, so that a comparison measures TLS alone.
    pub connection_per_node: bool,
}

/// An instance a node's runtime runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RunningInstance {
    pub(crate) id: String,
    pub(crate) service: String,
    pub(crate) node: String,
}

/// One simulated node: its agent task, its runtime and its clients.
#[derive(Debug)]
struct SimNode {
    name: String,
    runtime: Arc<SimRuntime>,
    /// The node's API and liveness clients (a restarted agent reuses them).
    link: LinkOptions,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<Result<(), AgentError>>>,
}

/// A control plane and its simulated nodes, all in this process.
pub struct Cluster {
    plane: ControlPlane,
    /// Where the control plane's tasks run (declared after `plane`: it
    /// drops first, then the runtime is shut down).
    runtime: PlaneRuntime,
    /// The control plane's liveness listener (register, heartbeat) runs
    /// on a thread of its own, as `cca server --liveness-listen` does.
    liveness: PlaneRuntime,
    liveness_task: JoinHandle<std::io::Result<()>>,
    /// Where every agent's registration and heartbeat loop runs: apart
    /// from the agents' other work, as on machines of their own.
    agents_liveness: PlaneRuntime,
    /// Where every agent's connections run (reading, writing, TLS): apart
    /// from the agents' other work too, as each agent's are on a machine
    /// of its own (see [`connect_all`]).
    agents_links: PlaneRuntime,
    config: ClusterConfig,
    client: Client,
    /// The certificates of a TLS cluster.
    pki: Option<Arc<BenchPki>>,
    api_stop: watch::Sender<bool>,
    api_task: JoinHandle<std::io::Result<()>>,
    nodes: Vec<SimNode>,
    dead: HashSet<String>,
    /// Agents' desired-state caches (on tmpfs when there is one).
    _agent_dirs: tempfile::TempDir,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("api", &self.client.base_url())
            .field("nodes", &self.nodes.len())
            .field("dead", &self.dead)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Starts the control plane on `store` and every agent; returns once
    /// the API listens (agents register in the background: see
    /// [`Cluster::wait_ready`]).
    pub async fn start(store: Arc<dyn Store>, config: ClusterConfig) -> Result<Self, BenchError> {
        let pki = if config.tls {
            let names: Vec<String> = (0..config.nodes).map(node_name).collect();
            let issued = tokio::task::spawn_blocking(move || BenchPki::generate(&names))
                .await
                .map_err(|error| BenchError::Task {
                    what: "certificate issuing".into(),
                    problem: error.to_string(),
                })??;
            Some(Arc::new(issued))
        } else {
            None
        };
        let runtime = PlaneRuntime::new(plane_workers())?;
        let plane_config = control_plane_config(&config);
        let server_tls = pki.as_ref().map(|pki| pki.server().clone());
        // Started on its runtime, so that every task it spawns (cache,
        // runner, API connections, hub, TLS handshakes) and the listener's
        // socket live there.
        let (plane, address, api_stop, api_task) = runtime
            .handle()
            .spawn(async move {
                let plane = ControlPlane::start(store, plane_config).await?;
                let (listener, address) = listen(server_tls.as_ref(), "API").await?;
                let (api_stop, mut api_stopping) = watch::channel(false);
                let state = plane.state().clone();
                let api_task = tokio::spawn(cca_api::serve(listener, state, async move {
                    let _ = api_stopping.wait_for(|stop| *stop).await;
                }));
                Ok::<_, BenchError>((plane, address, api_stop, api_task))
            })
            .await
            .map_err(|error| BenchError::Task {
                what: "control plane start".into(),
                problem: error.to_string(),
            })??;
        let liveness = PlaneRuntime::named(1, crate::plane_runtime::LIVENESS_THREAD_NAME)?;
        let (liveness_address, liveness_task) = serve_liveness(
            &liveness,
            plane.state().clone(),
            pki.as_ref().map(|pki| pki.server().clone()),
            api_stop.subscribe(),
        )
        .await?;
        let agents_liveness = PlaneRuntime::named(1, "cca-bench-heartbeats")?;
        let agents_links = PlaneRuntime::named(plane_workers(), "cca-bench-links")?;
        let agent_dirs = agent_dirs()?;
        let scheme = if pki.is_some() { "https" } else { "http" };
        let server = format!("{scheme}://{address}");
        let client = match &pki {
            Some(pki) => pki.harness_client(&server)?,
            None => Client::new(&server),
        };
        let mut cluster = Self {
            plane,
            runtime,
            liveness,
            liveness_task,
            agents_liveness,
            agents_links,
            config,
            client,
            pki,
            api_stop,
            api_task,
            nodes: Vec::new(),
            dead: HashSet::new(),
            _agent_dirs: agent_dirs,
        };
        cluster
            .start_agents(&server, &format!("{scheme}://{liveness_address}"))
            .await?;
        Ok(cluster)
    }

    /// A client of the cluster's API (with TLS, as the local admin).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// With TLS, node `name`'s own client (it presents the node's
    /// certificate: the only one its agent routes accept). `None` without
    /// TLS, where anyone may call them, or when there is no such node.
    pub fn node_tls_client(&self, name: &str) -> Option<Client> {
        self.pki.as_ref()?;
        let node = self.nodes.iter().find(|node| node.name == name)?;
        node.link.client.clone()
    }

    /// Seconds it took to issue the certificates of a TLS cluster (before
    /// it started, outside every measured span); `None` without TLS.
    pub fn certificates_seconds(&self) -> Option<f64> {
        self.pki.as_ref().map(|pki| pki.issue_seconds())
    }

    /// The per-service CPU rates every simulated node's instances use,
    /// when the run set them up.
    pub fn sim_loads(&self) -> Option<Arc<cca_runtime::sim::SimLoads>> {
        self.config.sim.loads.clone()
    }

    /// Names of every simulated node, in order.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|node| node.name.clone()).collect()
    }

    /// Nodes killed so far.
    pub fn dead(&self) -> &HashSet<String> {
        &self.dead
    }

    /// Waits until every node is registered and ready.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), BenchError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(status) = self.client.status().await
                && status.nodes.ready >= self.nodes.len()
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(BenchError::Timeout {
                    what: format!("{} nodes becoming ready", self.nodes.len()),
                    timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills nodes as a power cut would. Their agents go first, as with
    /// `kill -9`: stopped and joined before anything else happens, so no
    /// heartbeat or report leaves them afterwards (their leases expire on
    /// their own). Only then do their runtimes die, ending every instance;
    /// no agent is left to notice, so the control plane learns of the loss
    /// only from the lease, as it would of a dead machine.
    pub async fn kill_nodes(&mut self, names: &HashSet<String>) {
        for node in self.nodes.iter().filter(|node| names.contains(&node.name)) {
            node.stop.send_replace(true);
        }
        for node in self
            .nodes
            .iter_mut()
            .filter(|node| names.contains(&node.name))
        {
            join_agent(node).await;
        }
        for node in self.nodes.iter().filter(|node| names.contains(&node.name)) {
            node.runtime.kill_node();
            self.dead.insert(node.name.clone());
        }
    }

    /// Restarts a node's agent: it stops and a new one starts with the same
    /// data directory. With `reboot`, the machine restarts too: every
    /// instance ends and the new agent gets a fresh runtime, so it
    /// re-creates every instance from what it knows. False when there is
    /// no node `name`.
    pub async fn restart_agent(&mut self, name: &str, reboot: bool) -> bool {
        if !self.stop_agent(name).await {
            return false;
        }
        if reboot && let Some(index) = self.nodes.iter().position(|node| node.name == name) {
            let node = &mut self.nodes[index];
            node.runtime.kill_node();
            let sim = SimConfig {
                seed: self.config.sim.seed.wrapping_add(index as u64),
                ..self.config.sim.clone()
            };
            node.runtime = Arc::new(SimRuntime::new(sim));
        }
        self.start_agent(name)
    }

    /// Stops a node's agent as SIGSTOP or a crash would leave it: no
    /// heartbeat, report or stream from it, its instances running on. The
    /// agent is joined before this returns. False when there is no node
    /// `name`.
    pub async fn stop_agent(&mut self, name: &str) -> bool {
        let Some(node) = self.nodes.iter_mut().find(|node| node.name == name) else {
            return false;
        };
        node.stop.send_replace(true);
        join_agent(node).await;
        true
    }

    /// Starts a node's agent again with its data directory (its cached
    /// assignments) and its runtime as they are. False when there is no
    /// node `name`.
    pub fn start_agent(&mut self, name: &str) -> bool {
        let server = self.client.base_url().to_owned();
        let Some(index) = self.nodes.iter().position(|node| node.name == name) else {
            return false;
        };
        let node = &mut self.nodes[index];
        let mut config = agent_config(&self.config, index, name, &server, self._agent_dirs.path());
        config.link = node.link.clone();
        let (stop, stopping) = watch::channel(false);
        let driven: Arc<dyn cca_runtime::Runtime> = Arc::clone(&node.runtime) as _;
        node.task = Some(tokio::spawn(cca_agent::run(config, driven, stopping)));
        node.stop = stop;
        true
    }

    /// Where node `name`'s agent keeps its data (its desired-state cache).
    pub fn agent_dir(&self, name: &str) -> std::path::PathBuf {
        self._agent_dirs.path().join(name)
    }

    /// The runtime of node `name` (what its instances were created with).
    pub fn runtime(&self, name: &str) -> Option<Arc<SimRuntime>> {
        self.nodes
            .iter()
            .find(|node| node.name == name)
            .map(|node| Arc::clone(&node.runtime))
    }

    /// Every instance running on a node that is not dead, as its runtime
    /// says (not as the store does): what really runs where.
    pub(crate) async fn running_instances(&self) -> Vec<RunningInstance> {
        let mut running = Vec::new();
        for node in self
            .nodes
            .iter()
            .filter(|node| !self.dead.contains(&node.name))
        {
            // A dead node's runtime refuses every call; it runs nothing.
            let Ok(statuses) = cca_runtime::Runtime::list(node.runtime.as_ref()).await else {
                continue;
            };
            running.extend(
                statuses
                    .into_iter()
                    .filter(|status| status.state == cca_runtime::InstanceState::Running)
                    .map(|status| RunningInstance {
                        id: status.id,
                        service: status.spec.service.clone(),
                        node: node.name.clone(),
                    }),
            );
        }
        running
    }

    /// Starts a runner (leader election, then the controllers).
    pub fn start_controllers(&mut self) {
        let _on_the_plane = self.runtime.handle().enter();
        self.plane.start_controllers();
    }

    /// Freezes the control plane for `duration`, as SIGSTOP would freeze a
    /// server process: every worker thread of its runtime is blocked, and
    /// the clock starts only once all of them are. Frozen: the cache and
    /// its watch, the runner and every controller (the leader lease is
    /// not renewed), the API server, its connections and the assignment
    /// hub — so no heartbeat reaches the store. Not frozen: the store (it
    /// expires leases on time; its writer and watch fan-out do not run on
    /// the control plane's runtime), the agents (their instances keep
    /// running; their requests wait or time out and are retried), the
    /// harness's tracker, blocking work the control plane had already
    /// handed to its blocking pool, and the kernel, which queues new
    /// connections in the listener's backlog as for a stopped process.
    pub async fn freeze(&self, duration: Duration) -> Result<(), BenchError> {
        let held = self.runtime.hold().await?;
        let liveness_held = self.liveness.hold().await?;
        tokio::time::sleep(duration).await;
        drop((held, liveness_held));
        Ok(())
    }

    /// Times the control plane lost leadership it had not given up.
    pub fn leadership_losses(&self) -> u64 {
        self.plane.metrics().leadership_lost.get()
    }

    /// Stops the runner; it resigns leadership on the way out.
    pub async fn stop_controllers(&mut self) {
        self.plane.stop_controllers().await;
    }

    /// Stops every agent (leaving instances as they are), the runner, the
    /// API and the control plane's runtime.
    pub async fn stop(mut self) {
        for node in &self.nodes {
            node.stop.send_replace(true);
        }
        for node in &mut self.nodes {
            join_agent(node).await;
        }
        self.stop_controllers().await;
        self.api_stop.send_replace(true);
        for task in [&mut self.api_task, &mut self.liveness_task] {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::warn!(%error, "the API stopped with an error"),
                Err(error) => tracing::warn!(%error, "the API task failed"),
            }
        }
        let Self {
            plane,
            runtime,
            liveness,
            agents_liveness,
            agents_links,
            ..
        } = self;
        drop(plane);
        runtime.shut_down().await;
        liveness.shut_down().await;
        agents_liveness.shut_down().await;
        agents_links.shut_down().await;
    }

    /// Starts every agent, its clients made and connected before any
    /// agent starts: a client that cannot be built or connect stops the
    /// run before anything ran.
    async fn start_agents(&mut self, server: &str, liveness: &str) -> Result<(), BenchError> {
        let links = self.links(server, liveness)?;
        connect_all(&links, &self.agents_links).await?;
        for (index, link) in links.into_iter().enumerate() {
            let name = node_name(index);
            let sim = SimConfig {
                seed: self.config.sim.seed.wrapping_add(index as u64),
                ..self.config.sim.clone()
            };
            let runtime = Arc::new(SimRuntime::new(sim));
            let mut config =
                agent_config(&self.config, index, &name, server, self._agent_dirs.path());
            config.link = link.clone();
            let (stop, stopping) = watch::channel(false);
            let driven: Arc<dyn cca_runtime::Runtime> = Arc::clone(&runtime) as _;
            let task = tokio::spawn(cca_agent::run(config, driven, stopping));
            self.nodes.push(SimNode {
                name,
                runtime,
                link,
                stop,
                task: Some(task),
            });
        }
        Ok(())
    }

    /// Every node's clients: with TLS, two of its own (its certificate
    /// is its identity); without, one HTTP/2 connection to each listener
    /// per [`AGENTS_PER_CONNECTION`] agents.
    fn links(&self, server: &str, liveness: &str) -> Result<Vec<LinkOptions>, BenchError> {
        let over_api = self.config.liveness_over_api;
        let link = |client: Client, liveness_client: Option<Client>| LinkOptions {
            client: Some(client),
            without_agent_api: true,
            // `None`: the agent sends them over `client`.
            liveness_client: liveness_client.filter(|_| !over_api),
            liveness_runtime: Some(self.agents_liveness.handle().clone()),
        };
        let mut links = Vec::with_capacity(self.config.nodes);
        if let Some(pki) = &self.pki {
            for index in 0..self.config.nodes {
                let liveness_client = if over_api {
                    None
                } else {
                    Some(pki.node_client(index, liveness)?)
                };
                links.push(link(pki.node_client(index, server)?, liveness_client));
            }
            return Ok(links);
        }
        let per_connection = if self.config.connection_per_node {
            1
        } else {
            AGENTS_PER_CONNECTION
        };
        let mut shared: Option<(Client, Client)> = None;
        for index in 0..self.config.nodes {
            let (client, liveness_client) = match &shared {
                Some(pair) if !index.is_multiple_of(per_connection) => pair.clone(),
                _ => {
                    let pair = (Client::http2(server)?, Client::http2(liveness)?);
                    shared = Some(pair.clone());
                    pair
                }
            };
            links.push(link(client, Some(liveness_client)));
        }
        Ok(links)
    }
}

/// Connections opened at once by [`connect_all`].
const CONNECTING_AT_ONCE: usize = 32;

/// Opens every agent's connections on `runtime`, one request each, before
/// any agent runs. A client's connection task (its reads, writes and TLS
/// records) runs on the runtime of the request that opened it. Opened by
/// an agent's first request, thousands of nodes' connections would sit
/// in the run queue of the agents' runtime, behind every agent's
/// supervisor, or on the heartbeat thread: a heartbeat, handed to its
/// connection's task, then waited behind thousands of other nodes' work
/// and leases ran out, which no real cluster, one agent per machine,
/// does. Opened here, before an agent runs, every node also holds exactly
/// one connection (a client's first requests racing one another each open
/// their own before ALPN says the server speaks HTTP/2), and TLS
/// handshakes are over before anything is measured. Any answer will do
/// (the liveness listener has no `/v1/identity`: 404): only a connection
/// that fails stops the run.
async fn connect_all(links: &[LinkOptions], runtime: &PlaneRuntime) -> Result<(), BenchError> {
    let clients: Vec<Client> = links
        .iter()
        .flat_map(|link| [link.client.clone(), link.liveness_client.clone()])
        .flatten()
        .collect();
    for batch in clients.chunks(CONNECTING_AT_ONCE) {
        let mut connecting = tokio::task::JoinSet::new();
        for client in batch {
            let client = client.clone();
            connecting.spawn_on(
                async move {
                    match client.identity().await {
                        Err(error) if error.status().is_none() => Err(error),
                        _ => Ok(()),
                    }
                },
                runtime.handle(),
            );
        }
        while let Some(connected) = connecting.join_next().await {
            connected.map_err(|error| BenchError::Task {
                what: "agent connection".into(),
                problem: error.to_string(),
            })??;
        }
    }
    Ok(())
}

/// Simulated node `index`'s name.
fn node_name(index: usize) -> String {
    format!("sim-{index:05}")
}

/// A loopback listener on a free port, serving HTTPS with `tls` when
/// given; call it on the runtime that will serve it (a TLS listener's
/// handshakes run where it was made).
async fn listen(
    tls: Option<&ServerTls>,
    what: &str,
) -> Result<(ApiListener, SocketAddr), BenchError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(BenchError::io(format!("binding the {what} listener")))?;
    let address = listener
        .local_addr()
        .map_err(BenchError::io(format!("reading the {what} address")))?;
    let listener = match tls {
        Some(tls) => ApiListener::Tls(TlsListener::new(listener, tls).map_err(BenchError::io(
            format!("serving TLS on the {what} listener"),
        ))?),
        None => ApiListener::Plain(listener),
    };
    Ok((listener, address))
}

/// Serves the liveness routes of `state` on a loopback listener on
/// `runtime` (with TLS when given) until `stop` turns true.
async fn serve_liveness(
    runtime: &PlaneRuntime,
    state: cca_api::ApiState,
    tls: Option<ServerTls>,
    mut stop: watch::Receiver<bool>,
) -> Result<(SocketAddr, JoinHandle<std::io::Result<()>>), BenchError> {
    runtime
        .handle()
        .spawn(async move {
            let (listener, address) = listen(tls.as_ref(), "liveness").await?;
            let task = tokio::spawn(cca_api::serve_liveness(listener, state, async move {
                let _ = stop.wait_for(|stop| *stop).await;
            }));
            Ok::<_, BenchError>((address, task))
        })
        .await
        .map_err(|error| BenchError::Task {
            what: "liveness listener start".into(),
            problem: error.to_string(),
        })?
}

async fn join_agent(node: &mut SimNode) {
    let Some(task) = node.task.take() else {
        return;
    };
    match task.await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::warn!(node = %node.name, %error, "the agent failed"),
        Err(error) => tracing::warn!(node = %node.name, %error, "the agent task failed"),
    }
}

/// Worker threads of the control plane's runtime: as many as a server
/// process would start here, one per core.
fn plane_workers() -> usize {
    std::thread::available_parallelism().map_or(2, std::num::NonZero::get)
}

/// The production control plane with the cluster's timings.
fn control_plane_config(config: &ClusterConfig) -> ControlPlaneConfig {
    let mut plane = ControlPlaneConfig::new("bench");
    plane.scheduler.startup_grace = config.startup_grace;
    plane.scheduler.lost_grace = config.lost_grace;
    plane.disruption.resume_after = config.resume_replacement_after;
    plane.lifecycle.scale_down_window = config.scale_down_window;
    // Room for every simulated node's subnet (16,384 /24s), as an
    // operator of a cluster this size would configure it: the default /16
    // holds 256.
    plane.network.cluster_cidr = cca_model::net::Ipv4Net::new([10, 64, 0, 0].into(), 10)
        .unwrap_or_else(|_| unreachable!("a /10 is a valid prefix"));
    plane.api = api_config(config);
    plane
}

/// The API's defaults, sized by node count: one assignment stream per
/// node, room in the `liveness` lane for every node's heartbeat (or
/// registration) at once, and a `reports` queue for every node's report
/// (its 256 in flight stay: more at once only lengthen the run queue the
/// heartbeats wait in). The other lanes, and every queue timeout, are the
/// production defaults.
fn api_config(config: &ClusterConfig) -> ApiConfig {
    let defaults = ApiConfig::default();
    let mut lanes = defaults.lanes.clone();
    let liveness = lanes.get_mut(Lane::Liveness);
    liveness.in_flight = liveness.in_flight.max(config.nodes);
    liveness.queued = liveness.queued.max(config.nodes);
    // Reports wait their turn rather than all run at once: thousands in
    // flight fill the runtime's queue, and a heartbeat behind them waits.
    let reports = lanes.get_mut(Lane::Reports);
    reports.queued = reports.queued.max(config.nodes);
    let authentication = if config.tls {
        Authentication::Certificates
    } else {
        Authentication::Open
    };
    ApiConfig {
        max_streams: defaults.max_streams.max(config.nodes + 64),
        lanes,
        node_leases: config.node_leases,
        authentication,
        ..defaults
    }
}

fn agent_config(
    config: &ClusterConfig,
    index: usize,
    name: &str,
    server: &str,
    dirs: &Path,
) -> AgentConfig {
    let mut labels = BTreeMap::new();
    if index.is_multiple_of(2) {
        let (key, value) = GOLD_LABEL;
        labels.insert(key.to_owned(), value.to_owned());
    }
    AgentConfig {
        node: name.to_owned(),
        server: server.to_owned(),
        liveness_server: None,
        data_dir: dirs.join(name),
        cpu: config.node_cpu,
        memory: config.node_memory,
        arch: "amd64".to_owned(),
        zone: Some(format!("zone-{}", index % 3)),
        labels,
        // A made-up address per node: nothing connects to instances.
        address: format!(
            "10.{}.{}.{}",
            (index >> 16) & 0xff,
            (index >> 8) & 0xff,
            index & 0xff
        ),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        supervisor: SupervisorConfig::default(),
        tick: config.agent_tick,
        base_env: BTreeMap::new(),
        stop_instances_on_exit: false,
        link: LinkOptions::default(),
        // Simulated nodes have no kernel network to program.
        network: None,
        trust: None,
        gate: None,
        // Made-up addresses: nothing to probe.
        port_probe: None,
        // Many nodes to a host: each one's use is its instances'.
        usage: Some(cca_agent::usage::UsageOptions {
            node: cca_agent::usage::NodeMeter::Instances,
            ..cca_agent::usage::UsageOptions::reporting_every(config.usage_every)
        }),
    }
}

/// Where agents cache their desired state: tmpfs when there is one, so
/// that N agents' fsyncs measure the control plane, not this disk.
fn agent_dirs() -> Result<tempfile::TempDir, BenchError> {
    let builder = {
        let mut builder = tempfile::Builder::new();
        builder.prefix("cca-bench-agents-");
        builder
    };
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = builder.tempdir_in(shm)
    {
        return Ok(dir);
    }
    builder
        .tempdir()
        .map_err(BenchError::io("creating the agents' directory"))
}
