//! The node agent. It registers its node and keeps a heartbeat lease
//! through the API (never the store), follows the node's assignments into a
//! desired state cached on disk, and supervises the instances through a
//! [`cca_runtime::Runtime`]: start (init steps first), health-check,
//! restart with backoff, stop, adopt what an earlier agent left running,
//! remove orphans — reporting every instance's observed state back. While
//! the control plane is away it keeps doing all of that from the cache.

pub mod desired;
pub mod enrol;
pub mod error;
pub mod files;
pub mod gate;
pub mod gate_tls;
pub mod health;
pub mod host_ports;
mod init;
pub mod inspect;
mod link;
pub mod listeners;
pub mod netmap;
pub mod netplane;
pub mod network;
pub mod node;
pub mod preflight;
mod restart;
mod retry;
pub mod revocations;
pub mod runtimes;
pub mod serve;
pub mod supervisor;
pub mod usage;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cca_model::cluster::InstanceStatus;
use cca_model::recovery::{Unclaimed, UnclaimedInstance};
use cca_model::spec::{Cpu, Memory};
use cca_runtime::Runtime;
use cca_wire::types::{MAX_REPORT_BATCH, RegisterRequest};
use cca_wire::{Client, ClientError};
use tokio::sync::watch;

pub use desired::Desired;
pub use error::AgentError;
pub use netplane::{AgentNetwork, NodeNet};
pub use network::InstanceNetwork;
pub use runtimes::{Containers, RuntimeSet};
pub use supervisor::{Supervisor, SupervisorConfig};

use crate::retry::Retry;

/// Everything an agent needs to know about itself.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The node's name (unique in the cluster).
    pub node: String,
    /// The API server, e.g. `http://127.0.0.1:9770`.
    pub server: String,
    /// Where registrations and heartbeats go when the server serves them
    /// apart (`cca server --liveness-listen`); `None`: to `server`.
    pub liveness_server: Option<String>,
    /// Where the desired-state cache lives.
    pub data_dir: PathBuf,
    pub cpu: Cpu,
    pub memory: Memory,
    pub arch: String,
    pub zone: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// The address instances on this node are reached at.
    pub address: String,
    /// Where the agent's own API (logs, exec) listens; port 0 picks one.
    pub listen: SocketAddr,
    pub supervisor: SupervisorConfig,
    /// How often instances are checked even when nothing changes.
    pub tick: Duration,
    /// Extra environment for every instance.
    pub base_env: BTreeMap<String, String>,
    /// Stop and remove every instance when the agent stops (`cca dev`);
    /// a production agent leaves workloads running.
    pub stop_instances_on_exit: bool,
    /// How the agent talks to the server and is reached; the default is
    /// `cca agent`'s.
    pub link: LinkOptions,
    /// The node's part of the cluster network (`node::node_runtime` builds
    /// it as root); `None`: the agent follows no network map, and
    /// instances share the host's network and resolver.
    pub network: Option<AgentNetwork>,
    /// The node's certificate and the cluster CA, when the server speaks
    /// mTLS (`enrol`); `None`: plain HTTP.
    pub trust: Option<Arc<enrol::NodeTrust>>,
    /// The node's gate role (`--gate-listen`); `None`: it serves no gates.
    pub gate: Option<gate::GateConfig>,
    /// Probes each host port before an instance starts on it, so a port
    /// something outside the cluster holds fails the start and is reported
    /// held (`host_ports`); `None`: ports are not probed (simulated nodes,
    /// whose made-up addresses nothing binds).
    pub port_probe: Option<Arc<dyn host_ports::PortProbe>>,
    /// How the node's usage is measured and reported (`usage`); `None`:
    /// it is not.
    pub usage: Option<usage::UsageOptions>,
}

/// Options for running many agents in one process (`cca benchmark`), where
/// what one agent per machine can afford — its own connections and its own
/// listener — adds up to several descriptors per node. The default (own
/// client, agent API served on `listen`) is what `cca agent` does.
#[derive(Clone, Debug, Default)]
pub struct LinkOptions {
    /// A client of `server` to use instead of building one: agents given
    /// clones of one client share its connection pool.
    pub client: Option<Client>,
    /// Serve no agent API (logs, exec): `listen` is ignored and the node
    /// registers without an agent URL, so `cca logs`/`exec` say the node
    /// does not serve them.
    pub without_agent_api: bool,
    /// A client for registrations and heartbeats, instead of one built
    /// for `liveness_server` (or `client`).
    pub liveness_client: Option<Client>,
    /// Where the registration and heartbeat loop runs, instead of the
    /// agent's own runtime: many agents in one process share a runtime
    /// their other work keeps busy, and heartbeats must not wait behind it.
    pub liveness_runtime: Option<tokio::runtime::Handle>,
}

/// Reports are re-sent this often even when nothing changed, so a server
/// that lost them (restart, failover) hears again.
const REPORT_REFRESH: Duration = Duration::from_secs(30);

/// Runs the agent until `shutdown` turns true.
pub async fn run(
    config: AgentConfig,
    runtime: Arc<dyn Runtime>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), AgentError> {
    std::fs::create_dir_all(&config.data_dir).map_err(|err| AgentError::Cache {
        path: config.data_dir.clone(),
        problem: format!("cannot create the data directory: {err}"),
    })?;
    let cached = Desired::load(&config.data_dir)?;
    let gate = match &config.gate {
        Some(gate) => Some(gate::bind(gate, &config.address).await?),
        None => None,
    };
    let gate_requests = gate
        .as_ref()
        .map(|gate| Arc::clone(&gate.gate) as Arc<dyn usage::RequestCounts>);
    let (desired, mut desired_changes) = watch::channel(Arc::new(cached));
    let (connected, connected_now) = watch::channel(false);
    let board = Arc::new(std::sync::Mutex::new(inspect::Board::default()));
    let (agent_url, server, revoked) = if config.link.without_agent_api {
        (None, None, None)
    } else {
        let inspector = inspect::Inspector {
            node: config.node.clone(),
            runtime: Arc::clone(&runtime),
            desired: desired_changes.clone(),
            connected: connected_now,
            board: Arc::clone(&board),
        };
        let served = serve_agent_api(
            &config,
            Arc::clone(&runtime),
            inspector,
            gate.as_ref().map(|gate| Arc::clone(&gate.gate)),
            shutdown.clone(),
        )
        .await?;
        (Some(served.url), Some(served.task), served.revocations)
    };
    let connect = |server: &str| match &config.trust {
        Some(trust) => Client::with_tls(server, &trust.tls)
            .map_err(|error| AgentError::Trust(format!("the HTTPS client of {server}: {error}"))),
        None => Ok(Client::new(server)),
    };
    let client = match &config.link.client {
        Some(client) => client.clone(),
        None => connect(&config.server)?,
    };
    let liveness_client = match (&config.link.liveness_client, &config.liveness_server) {
        (Some(liveness), _) => liveness.clone(),
        (None, Some(server)) => connect(server)?,
        (None, None) => client.clone(),
    };
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(trust) = &config.trust {
        tasks.spawn(enrol::keep_renewed(
            Arc::new(client.clone()),
            trust.renewal.clone(),
            shutdown.clone(),
        ));
        if let Some(list) = revoked {
            tasks.spawn(revocations::follow_revocations(
                Arc::new(client.clone()),
                revocations::Follow {
                    node: config.node.clone(),
                    data_dir: config.data_dir.clone(),
                    every: trust.revocation_refresh,
                },
                list,
                shutdown.clone(),
            ));
        }
    }
    let registration = link::keep_registered(
        liveness_client,
        register_request(
            &config,
            agent_url,
            gate.as_ref().map(|gate| gate.advertised.clone()),
        ),
        connected,
        shutdown.clone(),
    );
    match &config.link.liveness_runtime {
        Some(runtime) => tasks.spawn_on(registration, runtime),
        None => tasks.spawn(registration),
    };
    tasks.spawn(link::follow_assignments(
        client.clone(),
        config.node.clone(),
        config.data_dir.clone(),
        desired,
        shutdown.clone(),
    ));
    // Awaited on stop, not aborted: the gate drains its requests in flight.
    let mut gate_task = None;
    if config.network.is_some() || gate.is_some() {
        let cached = netmap::load_cached(&config.data_dir).unwrap_or_default();
        let (views, view_changes) = watch::channel(Arc::new(cached));
        tasks.spawn(netmap::follow_network(
            client.clone(),
            config.node.clone(),
            config.data_dir.clone(),
            views,
            shutdown.clone(),
        ));
        if let Some(network) = &config.network {
            tasks.spawn(netplane::run_plane(
                Arc::clone(&network.plane),
                view_changes.clone(),
                shutdown.clone(),
            ));
        }
        gate_task = gate.map(|gate| {
            let pairs = gate_tls::GateCertificates::spawn(
                client.clone(),
                config.node.clone(),
                config.data_dir.clone(),
                view_changes.clone(),
                shutdown.clone(),
            );
            let link = gate::Link {
                client: client.clone(),
                node: config.node.clone(),
            };
            tokio::spawn(gate.run(link, view_changes, pairs, shutdown.clone()))
        });
    }
    if let Some(options) = &config.usage {
        tasks.spawn(usage::keep_reporting(
            Arc::clone(&runtime),
            Arc::new(client.clone()),
            (config.node.clone(), gate_requests),
            options.clone(),
            shutdown.clone(),
        ));
    }
    let mut supervisor = Supervisor::new(
        &config.node,
        &config.address,
        runtime,
        config.supervisor.clone(),
        config.base_env.clone(),
    )
    .with_volumes_dir(config.data_dir.join("volumes"))
    .with_files(config.data_dir.join("files"), Arc::new(client.clone()));
    if let Some(network) = &config.network {
        supervisor = supervisor.with_node_net(Arc::clone(&network.node_net));
    }
    if let Some(probe) = &config.port_probe {
        supervisor = supervisor.with_port_probe(Arc::clone(probe));
    }
    let mut reporter = Reporter::new(client, config.node.clone(), board);
    let mut stop = shutdown;
    let started = supervisor.started();
    loop {
        let current = Arc::clone(&desired_changes.borrow_and_update());
        let tick = supervisor.tick(&current).await;
        if let Some(known) = reporter.report(tick).await {
            supervisor.services_known(&known);
        }
        // A start ending or a quick startup probe due ticks at once: an
        // instance is reported ready as soon as it is.
        let pause = supervisor.next_probe_at().map_or(config.tick, |at| {
            at.saturating_duration_since(tokio::time::Instant::now())
                .min(config.tick)
        });
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = started.notified() => {}
            _ = desired_changes.changed() => {}
            _ = stop.wait_for(|stop| *stop) => break,
        }
    }
    if let Some(gate) = gate_task {
        let _ = gate.await;
    }
    if config.stop_instances_on_exit {
        supervisor.stop_all().await;
    }
    tasks.shutdown().await;
    if let Some(server) = server {
        let _ = server.await;
    }
    Ok(())
}

/// The agent API being served.
struct AgentApi {
    /// What the node registers.
    url: String,
    task: tokio::task::JoinHandle<()>,
    /// What its handshakes refuse, over HTTPS.
    revocations: Option<Arc<cca_tls::RevocationList>>,
}

/// Serves the agent API on `config.listen`: over HTTPS with the node's
/// certificate, to the API server alone, when the node has one (`serve`);
/// plain HTTP without.
async fn serve_agent_api(
    config: &AgentConfig,
    runtime: Arc<dyn Runtime>,
    inspector: inspect::Inspector,
    gate: Option<Arc<cca_gate::Gate>>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<AgentApi, AgentError> {
    let listen_failed = |err: std::io::Error| AgentError::Listen {
        address: config.listen.to_string(),
        problem: err.to_string(),
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(listen_failed)?;
    let port = listener.local_addr().map_err(listen_failed)?.port();
    let router = serve::router(runtime, inspector, gate);
    let stopped = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    let (scheme, task, revocations) = match &config.trust {
        Some(trust) => {
            let tls = serve::server_tls(trust)?;
            let listener = cca_tls::TlsListener::new(listener, &tls).map_err(listen_failed)?;
            let revocations = Arc::clone(tls.revocations());
            (
                "https",
                spawn_server(listener, router, stopped),
                Some(revocations),
            )
        }
        None => ("http", spawn_server(listener, router, stopped), None),
    };
    Ok(AgentApi {
        url: format!("{scheme}://{}:{port}", config.address),
        task,
        revocations,
    })
}

fn spawn_server<L>(
    listener: L,
    router: axum::Router,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    tokio::spawn(async move {
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(stopped)
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "the agent API stopped");
        }
    })
}

fn register_request(
    config: &AgentConfig,
    agent_url: Option<String>,
    gate: Option<cca_model::cluster::GateListen>,
) -> RegisterRequest {
    RegisterRequest {
        name: config.node.clone(),
        cpu: config.cpu,
        memory: config.memory,
        arch: config.arch.clone(),
        zone: config.zone.clone(),
        labels: config.labels.clone(),
        addresses: vec![config.address.clone()],
        agent_url,
        gate: gate.unwrap_or_default(),
    }
}

/// Sends observed statuses that changed (and all of them periodically),
/// and forgets instances removed as orphans. After a failed request it
/// sends nothing until its [`Retry`] delay has passed (never sooner than
/// the server's `Retry-After`): what was not sent goes later.
struct Reporter {
    client: Client,
    node: String,
    sent: HashMap<String, InstanceStatus>,
    refreshed: tokio::time::Instant,
    /// Orphans whose observed records are still to be forgotten.
    forget: BTreeSet<String>,
    retry: Retry,
    /// No request before this instant (after a failure).
    resume_at: Option<tokio::time::Instant>,
    /// The node's held host ports as last recorded by the server.
    held_sent: Option<BTreeSet<u16>>,
    /// The unclaimed instances as last recorded, and when.
    unclaimed_sent: Option<(Vec<UnclaimedInstance>, tokio::time::Instant)>,
    /// Where ticks and report outcomes are posted for inspection.
    board: Arc<std::sync::Mutex<inspect::Board>>,
}

/// Unclaimed instances are reported again this often while there are any:
/// the answer says which of their services the store knows by now.
const UNCLAIMED_REFRESH: Duration = Duration::from_secs(5);

impl Reporter {
    fn new(client: Client, node: String, board: Arc<std::sync::Mutex<inspect::Board>>) -> Self {
        Self {
            board,
            client,
            node,
            sent: HashMap::new(),
            refreshed: tokio::time::Instant::now(),
            forget: BTreeSet::new(),
            retry: Retry::new(),
            resume_at: None,
            held_sent: None,
            unclaimed_sent: None,
        }
    }

    /// Reports a tick; the services of unclaimed instances the server said
    /// it knows, when it was asked.
    async fn report(&mut self, tick: supervisor::Tick) -> Option<BTreeSet<String>> {
        self.post(|board| board.ticked(&tick.statuses));
        if self.refreshed.elapsed() >= REPORT_REFRESH {
            self.sent.clear();
            self.held_sent = None;
            self.refreshed = tokio::time::Instant::now();
        }
        for id in tick.removed {
            self.sent.remove(&id);
            self.forget.insert(id);
        }
        if self
            .resume_at
            .is_some_and(|at| tokio::time::Instant::now() < at)
        {
            return None;
        }
        let changed: Vec<InstanceStatus> = tick
            .statuses
            .into_iter()
            .filter(|status| self.sent.get(&status.id) != Some(status))
            .collect();
        // Held ports first: the scheduler must know a port is held when it
        // reads the failed status of the instance placed on it, or it would
        // place the replacement on the same port.
        let mut outcome = match tick.held_ports {
            Some(held) => self.send_held(held).await,
            None => Ok(()),
        };
        for batch in changed.chunks(MAX_REPORT_BATCH) {
            if outcome.is_err() {
                break;
            }
            outcome = self.send(batch).await;
        }
        if outcome.is_ok() {
            outcome = self.forget_orphans().await;
        }
        let mut known = None;
        if outcome.is_ok() {
            match self.send_unclaimed(tick.unclaimed).await {
                Ok(answer) => known = answer,
                Err(error) => outcome = Err(error),
            }
        }
        match outcome {
            Ok(()) => {
                self.retry.reset();
                self.resume_at = None;
            }
            Err(error) => {
                let at = cca_model::clock::now_millis();
                self.post(|board| board.failed(error.to_string(), at));
                let wait = self.retry.next_delay(error.retry_after(), fastrand::f64());
                self.resume_at = Some(tokio::time::Instant::now() + wait);
            }
        }
        known
    }

    /// Sends the unclaimed instances when they differ from what was last
    /// recorded, or [`UNCLAIMED_REFRESH`] after that while there are any;
    /// the services the server knows, when it was asked.
    async fn send_unclaimed(
        &mut self,
        unclaimed: Vec<UnclaimedInstance>,
    ) -> Result<Option<BTreeSet<String>>, ClientError> {
        let now = tokio::time::Instant::now();
        let due = match &self.unclaimed_sent {
            None => !unclaimed.is_empty(),
            Some((sent, at)) => {
                *sent != unclaimed || (!unclaimed.is_empty() && now - *at >= UNCLAIMED_REFRESH)
            }
        };
        if !due {
            return Ok(None);
        }
        let report = Unclaimed {
            instances: unclaimed.clone(),
        };
        let reply = self
            .client
            .report_unclaimed(&self.node, &report)
            .await
            .inspect_err(|error| tracing::debug!(%error, "reporting unclaimed instances failed"))?;
        self.unclaimed_sent = Some((unclaimed, now));
        Ok(Some(reply.known_services))
    }

    /// Sends the node's held host ports when they differ from what was
    /// last recorded (and at every refresh).
    async fn send_held(&mut self, held: BTreeSet<u16>) -> Result<(), ClientError> {
        if self.held_sent.as_ref() == Some(&held) {
            return Ok(());
        }
        let report = cca_model::cluster::HeldPorts {
            ports: held.clone(),
        };
        self.client
            .report_held_ports(&self.node, &report)
            .await
            .inspect_err(|error| tracing::debug!(%error, "reporting held host ports failed"))?;
        self.held_sent = Some(held);
        Ok(())
    }

    /// Sends one batch; an error when it did not arrive or was refused as
    /// a whole (mostly: the node is not registered yet). Reports refused
    /// one by one (an instance no longer placed here) are not re-sent
    /// until they change or the refresh.
    async fn send(&mut self, batch: &[InstanceStatus]) -> Result<(), ClientError> {
        let sent_at = cca_model::clock::now_millis();
        let statuses = batch
            .iter()
            .map(|status| InstanceStatus {
                updated_at: sent_at,
                ..status.clone()
            })
            .collect();
        let reply = self
            .client
            .report_batch(&self.node, statuses)
            .await
            .inspect_err(|error| tracing::debug!(%error, "reporting failed"))?;
        for refused in &reply.refused {
            tracing::debug!(instance = %refused.id, status = refused.status, message = %refused.message, "report refused");
        }
        for status in batch {
            self.sent.insert(status.id.clone(), status.clone());
        }
        self.post(|board| board.sent(batch.len(), sent_at));
        Ok(())
    }

    /// Posts on the inspection board (a poisoned board is still written:
    /// it only holds what was last posted).
    fn post(&self, write: impl FnOnce(&mut inspect::Board)) {
        let mut board = match self.board.lock() {
            Ok(board) => board,
            Err(poisoned) => poisoned.into_inner(),
        };
        write(&mut board);
    }

    /// Forgets the orphans' records; one the server refuses for good (no
    /// record, another node's) is dropped, one that may go through later
    /// (unreachable, shed, unavailable) is kept and stops the round.
    async fn forget_orphans(&mut self) -> Result<(), ClientError> {
        while let Some(id) = self.forget.first().cloned() {
            match self.client.forget_instance(&self.node, &id).await {
                Ok(_) => {}
                Err(error) if worth_retrying(&error) => return Err(error),
                Err(error) => {
                    tracing::debug!(instance = %id, %error, "forgetting the observed record failed");
                }
            }
            self.forget.remove(&id);
        }
        Ok(())
    }
}

/// A failure that may pass later: no answer, or the server's trouble
/// (shed, unavailable, a bug) rather than a refusal of the request.
fn worth_retrying(error: &ClientError) -> bool {
    match error {
        ClientError::Api { status, .. } => *status == 429 || *status >= 500,
        ClientError::Unreachable { .. } | ClientError::Decode(_) => true,
    }
}
