//! The scenarios and their [`Report`]s. Each scenario runs on a fresh
//! store and a fresh cluster: measure the store's raw transaction rate,
//! start the control plane and the agents, wait for every node to be
//! ready, then deploy the workload and do what the scenario is about,
//! timing it with the [`Tracker`]. The overload scenarios deploy on a
//! store paced below its raw rate, or freeze the control plane and check
//! that the cluster comes back without moving or duplicating anything.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cca_model::node_lease::NodeLeases;
use cca_model::spec::{Cpu, Memory};
use cca_runtime::sim::{SimConfig, StartLatency};
use cca_store::{Revision, Store};
use serde::Serialize;
use tokio::time::Instant;

use crate::cluster::{Cluster, ClusterConfig, RunningInstance};
use crate::measure::{peak_rss_bytes, store_txn_per_s};
use crate::plane_runtime::{LIVENESS_THREAD_NAME, PLANE_THREAD_NAME};
use crate::slow_store;
use crate::stats::Summary;
use crate::tracker::{Expiry, Faults, LeaseCounts, Placed, Tracker};
use crate::workload::{INSTANCE_CPU_MILLIS, INSTANCE_MEMORY_MIB, Workload};
use crate::{BenchError, verify};

/// What a run does once the cluster is up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Apply the workload; time until every instance runs.
    Deploy,
    /// Deploy, then verify capacity and constraints through the API.
    Placement,
    /// Deploy, kill nodes (agents first, then their instances); time from
    /// the first lease expiry to all replacements running. A replacement
    /// placed before a lease expired fails the run.
    NodeFailure,
    /// Deploy, scale every service by the scale factor (1,000 → 1,500).
    ScaleUp,
    /// Deploy, stop the controllers, scale up 10% meanwhile, start new
    /// controllers; time to converge, and check nothing placed moved.
    ControllerRestart,
    /// Deploy through a store that delays every operation.
    StoreLatency,
    /// Deploy on a store whose commits are paced to a share of its raw
    /// rate (`store_rate_fraction`, half when not given): no lease may
    /// expire.
    OverloadSlowStore,
    /// Deploy, freeze the control plane for twice the node TTL (every
    /// lease expires meanwhile), then wait until every node is ready
    /// again and everything runs; time from the thaw. Any instance moved
    /// or replaced, and any duplicate, is a violation.
    OverloadFreeze,
    /// Deploy, kill 40 % of the nodes at once (`mass_kill_percent`): more
    /// than the node controller trusts, so it pauses replacement. Nothing
    /// may be replaced during the pause (watched for the lost grace and a
    /// little more) and no surviving node's lease may expire; then an
    /// operator resumes (or the safeguard, with
    /// `resume_replacement_after`), and the time runs from the resume to
    /// every replacement running.
    OverloadMassKill,
    /// Deploy `services` services with a port and `service_replicas`
    /// instances each, follow the network map on `observers` nodes that
    /// program real nftables tables in namespaces of their own, stop one
    /// instance at a time; time from the agent's report to every
    /// observer's rules updated (see the `network` module). Needs root;
    /// not part of `all`.
    Network,
    /// Deploy with a 25% surge, roll out a new version, then one a share
    /// of whose instances crash loop: time to finish, to decide each
    /// rollback and to serve the previous version again (see the
    /// `lifecycle` module).
    Rollout,
    /// Deploy autoscaled services on target, step their load up and back
    /// down: time to reach each new count (see the `lifecycle` module).
    Autoscale,
    /// Deploy, then rounds of churn each with a random fault (an agent
    /// killed, an agent frozen past its lease, the controllers
    /// restarted): each round's convergence, and the most duplicates
    /// ever running (see the `chaos` module). Not part of `all`.
    Chaos,
    /// Deploy, then drive the web console in headless Chromium: each
    /// page's first view, live updates, the feed's bytes and the tab's
    /// memory under churn (see the `console` module). Needs Chromium; not
    /// part of `all`.
    Console,
}

impl Scenario {
    /// Every scenario, in the order `all` runs them.
    pub const ALL: &'static [Scenario] = &[
        Scenario::Deploy,
        Scenario::Placement,
        Scenario::NodeFailure,
        Scenario::ScaleUp,
        Scenario::ControllerRestart,
        Scenario::StoreLatency,
        Scenario::OverloadSlowStore,
        Scenario::OverloadFreeze,
        Scenario::OverloadMassKill,
        Scenario::Rollout,
        Scenario::Autoscale,
    ];

    /// The overload scenarios, which `overload` runs.
    pub const OVERLOAD: &'static [Scenario] = &[
        Scenario::OverloadSlowStore,
        Scenario::OverloadFreeze,
        Scenario::OverloadMassKill,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Deploy => "deploy",
            Scenario::Placement => "placement",
            Scenario::NodeFailure => "node-failure",
            Scenario::ScaleUp => "scale-up",
            Scenario::ControllerRestart => "controller-restart",
            Scenario::StoreLatency => "store-latency",
            Scenario::OverloadSlowStore => "overload-slow-store",
            Scenario::OverloadFreeze => "overload-freeze",
            Scenario::OverloadMassKill => "overload-mass-kill",
            Scenario::Network => "network",
            Scenario::Rollout => "rollout",
            Scenario::Autoscale => "autoscale",
            Scenario::Chaos => "chaos",
            Scenario::Console => "console",
        }
    }

    /// Scenarios run only by name: they need what `all` does not ask
    /// for (root, for `network`; minutes of faults, for `chaos`).
    pub const BY_NAME_ONLY: &'static [Scenario] =
        &[Scenario::Network, Scenario::Chaos, Scenario::Console];

    /// The scenario called `name`.
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .chain(Self::BY_NAME_ONLY)
            .copied()
            .find(|scenario| scenario.name() == name)
    }

    /// The scenarios `name` stands for: one scenario's name, `overload`
    /// (every overload scenario) or `all`.
    pub fn select(name: &str) -> Option<Vec<Self>> {
        match name {
            "all" => Some(Self::ALL.to_vec()),
            "overload" => Some(Self::OVERLOAD.to_vec()),
            _ => Self::named(name).map(|scenario| vec![scenario]),
        }
    }

    /// Every name [`Scenario::select`] accepts, for messages.
    pub fn choices() -> String {
        let mut names: Vec<&str> = Self::ALL
            .iter()
            .chain(Self::BY_NAME_ONLY)
            .map(|scenario| scenario.name())
            .collect();
        names.extend(["overload", "all"]);
        names.join(", ")
    }

    /// Whether `overload` runs it.
    pub fn is_overload(self) -> bool {
        Self::OVERLOAD.contains(&self)
    }

    /// Whether it drives rollouts or autoscaling.
    pub fn is_lifecycle(self) -> bool {
        matches!(self, Scenario::Rollout | Scenario::Autoscale)
    }
}

/// Which store the control plane runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreTarget {
    /// The embedded store in a fresh directory per scenario, under the
    /// given one or a temporary one.
    Embedded(Option<PathBuf>),
    /// A running etcd; each scenario uses a fresh key namespace.
    Etcd(Vec<String>),
}

/// Everything a run is parameterised by.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub nodes: usize,
    pub instances: usize,
    pub store: StoreTarget,
    /// The agents' leases: the shortest TTL, the fleet's heartbeat budget.
    pub node_leases: NodeLeases,
    pub lost_grace: Duration,
    pub startup_grace: Duration,
    pub start_latency: StartLatency,
    /// Delay per store operation in the `store-latency` scenario.
    pub store_latency: Duration,
    /// Nodes killed in `node-failure`.
    pub killed_nodes: usize,
    /// `scale-up` multiplies every service's replicas by this.
    pub scale_factor: f64,
    /// Longest wait for any one convergence.
    pub timeout: Duration,
    pub seed: u64,
    /// How long the store's transaction rate is probed.
    pub probe_window: Duration,
    /// Runs the control plane on the store paced to this share of the raw
    /// transaction rate measured first (more than 0, at most 1): commits
    /// wait for a slot, reads, watches and keep-alives do not. `None`: the
    /// store at full speed, except in `overload-slow-store`, which paces
    /// it to half.
    pub store_rate_fraction: Option<f64>,
    /// Share of the nodes `overload-mass-kill` kills at once (40 %).
    pub mass_kill_percent: u32,
    /// When a pause of lost-node replacement ends on its own; `None` (the
    /// default here): `overload-mass-kill` resumes it as an operator would.
    pub resume_replacement_after: Option<Duration>,
    /// `network`: services deployed (instead of `instances`).
    pub services: usize,
    /// `network`: instances per service.
    pub service_replicas: u32,
    /// `network`: nodes that follow the map and program real tables.
    pub observers: usize,
    /// `network`: instances stopped, one at a time.
    pub endpoint_changes: usize,
    /// Production security on: the API over HTTPS with client
    /// certificates required, each agent with its own node certificate.
    pub tls: bool,
    /// Agents send registrations and heartbeats over their API
    /// connection to the main listener (see [`ClusterConfig`]).
    pub liveness_over_api: bool,
    /// Without TLS too, every agent holds connections of its own (see
    /// [`ClusterConfig`]).
    pub connection_per_node: bool,
    /// How often agents report usage; `None`: 30 s (production), 2 s in
    /// the lifecycle scenarios.
    pub usage_every: Option<Duration>,
    /// The autoscaler's scale-down window; `None`: 5 min (production),
    /// 30 s in `autoscale`.
    pub scale_down_window: Option<Duration>,
    /// `rollout`: `max_surge` as a share of each service's replicas (25).
    pub surge_percent: u32,
    /// `rollout`: per mille of the bad version's instances that crash (100).
    pub bad_per_mille: u32,
    /// `chaos`: rounds of churn and one fault each (12).
    pub chaos_rounds: u32,
}

impl BenchConfig {
    /// The TTL every agent's lease has once all the nodes registered.
    pub fn node_lease_ttl(&self) -> Duration {
        self.node_leases.ttl_for(self.nodes)
    }

    /// Production timings, 10% of the nodes killed, 1.5× scale-up.
    pub fn new(nodes: usize, instances: usize, store: StoreTarget) -> Self {
        Self {
            nodes,
            instances,
            store,
            node_leases: NodeLeases::default(),
            lost_grace: Duration::from_secs(2),
            startup_grace: Duration::ZERO,
            start_latency: StartLatency::Uniform {
                min: Duration::from_millis(5),
                max: Duration::from_millis(50),
            },
            store_latency: Duration::from_millis(5),
            killed_nodes: (nodes / 10).max(1),
            scale_factor: 1.5,
            timeout: Duration::from_secs(600),
            seed: 1,
            probe_window: Duration::from_secs(1),
            store_rate_fraction: None,
            mass_kill_percent: 40,
            resume_replacement_after: None,
            services: 1_000,
            service_replicas: 3,
            observers: 3,
            endpoint_changes: 100,
            tls: false,
            liveness_over_api: false,
            connection_per_node: false,
            usage_every: None,
            scale_down_window: None,
            surge_percent: 25,
            bad_per_mille: 100,
            chaos_rounds: 12,
        }
    }

    /// Refuses settings no run can honour.
    pub fn check(&self) -> Result<(), BenchError> {
        if let Some(fraction) = self.store_rate_fraction
            && !(fraction > 0.0 && fraction <= 1.0)
        {
            return Err(BenchError::Config(format!(
                "store rate fraction {fraction}: it is a share of the store's raw commit \
                 rate, more than 0 and at most 1 (0.5 paces the store to half its rate)"
            )));
        }
        if self.tls || self.connection_per_node {
            // Both ends of every agent's own connections, and room for
            // the store, the listeners and the harness.
            let connections: u64 = if self.liveness_over_api { 1 } else { 2 };
            let needed = self.nodes as u64 * connections * 2 + 1_024;
            if let Some(limit) = crate::measure::open_file_limit()
                && limit < needed
            {
                let fewer = if self.liveness_over_api {
                    ""
                } else {
                    ", send heartbeats over the API connection (one connection per node \
                     fewer: --liveness-over-api)"
                };
                return Err(BenchError::Config(format!(
                    "with TLS or --connection-per-node every node holds {connections} \
                     connection(s) of its own, both \
                     ends in this process: {} nodes need about {needed} open files, but the \
                     limit is {limit}; raise it (`ulimit -n`; raising the hard limit needs \
                     CAP_SYS_RESOURCE){fewer}, or simulate fewer nodes",
                    self.nodes
                )));
            }
        }
        Ok(())
    }

    /// The settings `scenario` runs with: `network` deploys `services` ×
    /// `service_replicas` instances.
    fn for_scenario(&self, scenario: Scenario) -> Self {
        let mut config = self.clone();
        if scenario == Scenario::Network {
            config.instances = self.services * self.service_replicas as usize;
        }
        config
    }

    /// How often agents report usage in `scenario`.
    pub(crate) fn usage_every_for(&self, scenario: Scenario) -> Duration {
        self.usage_every.unwrap_or(if scenario.is_lifecycle() {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(30)
        })
    }

    /// The scale-down window the control plane runs `scenario` with.
    pub(crate) fn scale_down_window_for(&self, scenario: Scenario) -> Duration {
        self.scale_down_window
            .unwrap_or(if scenario == Scenario::Autoscale {
                Duration::from_secs(30)
            } else {
                Duration::from_secs(300)
            })
    }

    /// The share of its raw rate `scenario` paces the store to, if any.
    fn store_rate_fraction(&self, scenario: Scenario) -> Option<f64> {
        match scenario {
            Scenario::OverloadSlowStore => Some(self.store_rate_fraction.unwrap_or(0.5)),
            _ => self.store_rate_fraction,
        }
    }
}

/// Told how a run advances (a progress bar, or nothing).
pub trait Progress: Send + Sync {
    /// A new phase begins, `total` steps long (0: unknown).
    fn phase(&self, what: &str, total: u64);
    /// `done` steps of the current phase are done.
    fn advance(&self, done: u64);
}

/// One scenario's figures. Times are in seconds.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub scenario: String,
    pub nodes: usize,
    /// Instances asked for at the end of the scenario.
    pub instances: usize,
    pub store: String,
    /// The scenario's headline time (see each scenario).
    pub seconds: f64,
    /// Per-instance latencies of the instances the scenario started.
    pub mean: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    pub success_rate: f64,
    /// Instances the scenario started, per second of `seconds`.
    pub placements_per_s: f64,
    /// Single-put transactions/s of the same store, 64 writers, this run.
    pub store_txn_per_s: f64,
    /// Commits/s the control plane's store was paced to (a share of
    /// `store_txn_per_s`); absent when it ran at full speed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_paced_txn_per_s: Option<f64>,
    /// Node failure: from the kill to the first lease expiry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detection_seconds: Option<f64>,
    /// Node failure: from the kill to all replacements running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_seconds: Option<f64>,
    /// Placement and restart checks that failed; empty when all hold.
    pub violations: Vec<String>,
    /// Peak resident memory of this process so far (control plane,
    /// agents and harness together).
    pub peak_rss_bytes: Option<u64>,
    /// CPU seconds this process (control plane, agents, store, harness:
    /// every thread) spent in the measured span of a deploy or scale-up:
    /// the work done, which other load on the machine changes much less
    /// than `seconds`. Absent for the other scenarios.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// Of `cpu_seconds`, what the control plane's threads spent (its
    /// runtime's workers and blocking pool, its liveness listener): what
    /// a server would, without the agents, the store and the harness.
    /// Threads that ended within the span are not counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plane_cpu_seconds: Option<f64>,
    /// Times the harness's watch fell behind the store's compaction and
    /// relisted: latencies of instances that became running in such a gap
    /// are upper bounds. Left out when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub tracker_relists: u32,
    /// Heartbeat leases that expired during the measured part (after
    /// every node was first ready), the killed nodes' included.
    pub lease_expiries: u64,
    /// Those the harness did not cause: of nodes it did not kill, outside
    /// a span in which it kept every lease from being renewed (a frozen
    /// control plane until every node is ready again). A healthy node
    /// declared gone; any fails the run.
    pub false_lease_expiries: u64,
    /// Agents that registered again during the measured part (their lease
    /// was gone, or they restarted).
    pub re_registrations: u64,
    /// Nodes the API moved to a lease of the fleet's TTL during the
    /// measured part (the fleet outgrew their lease's heartbeat budget:
    /// docs/operations.md "Node leases"); not a fault.
    pub lease_moves: u64,
    /// Times the control plane lost leadership it had not given up (its
    /// leader lease lapsed), over the whole run.
    pub leadership_losses: u64,
    /// Those the harness did not cause (it freezes the control plane past
    /// the leader lease in `overload-freeze` only); any fails the run.
    pub false_leadership_losses: u64,
    /// Whether the run had production security on (`--tls`).
    pub tls: bool,
    /// Whether agents sent registrations and heartbeats over their API
    /// connection (`--liveness-over-api`). Left out when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub liveness_over_api: bool,
    /// Whether agents held connections of their own without TLS too
    /// (`--connection-per-node`; always so with TLS). Left out when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub connection_per_node: bool,
    /// With TLS: seconds it took to make the cluster CA and issue every
    /// certificate (server, harness, one per node), before the cluster
    /// started and outside every measured span.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificates_seconds: Option<f64>,
    /// `network`: the endpoint-propagation figures (the latencies above
    /// are then per change, to every observer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::network::NetworkFigures>,
    /// `rollout` and `autoscale`: their figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<crate::lifecycle::LifecycleFigures>,
    /// `chaos`: its figures (the latencies above are then per round, from
    /// the fault's end to convergence).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chaos: Option<crate::chaos::ChaosFigures>,
    /// `console`: the web console's figures in headless Chromium.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub console: Option<crate::console::ConsoleFigures>,
}

fn is_zero(count: &u32) -> bool {
    *count == 0
}

impl Report {
    /// Whether the run did everything it should have: no violation, full
    /// convergence, and no lease expired that the harness did not cause.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
            && self.success_rate >= 1.0
            && self.false_lease_expiries == 0
            && self.false_leadership_losses == 0
    }
}

/// What a scenario measured.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) seconds: f64,
    pub(crate) latencies: Vec<Duration>,
    pub(crate) success_rate: f64,
    pub(crate) instances: usize,
    pub(crate) network: Option<crate::network::NetworkFigures>,
    pub(crate) lifecycle: Option<crate::lifecycle::LifecycleFigures>,
    pub(crate) chaos: Option<crate::chaos::ChaosFigures>,
    pub(crate) console: Option<crate::console::ConsoleFigures>,
    /// Nodes whose agents the scenario stopped for a while: their lease
    /// expiries are explained.
    pub(crate) faulted_nodes: HashSet<String>,
    pub(crate) detection_seconds: Option<f64>,
    pub(crate) total_seconds: Option<f64>,
    pub(crate) violations: Vec<String>,
    /// Times the convergence watch fell behind compaction and relisted.
    pub(crate) tracker_relists: u32,
    /// Spans in which the scenario kept every lease from being renewed.
    pub(crate) suspended: Vec<Range<Instant>>,
    /// Counted over the measured part once the scenario is done.
    pub(crate) leases: LeaseCounts,
    /// Leadership lost over the run, and whether the harness caused it.
    pub(crate) leadership_losses: u64,
    pub(crate) leadership_losses_explained: bool,
    /// CPU seconds the process spent in the measured span, where the
    /// scenario measures it (deploys and scale-ups).
    pub(crate) cpu_seconds: Option<f64>,
    /// The same, of the control plane's threads alone.
    pub(crate) plane_cpu_seconds: Option<f64>,
}

/// Runs `scenario` on a fresh cluster and reports it.
pub async fn run_scenario(
    scenario: Scenario,
    config: &BenchConfig,
    progress: &dyn Progress,
) -> Result<Report, BenchError> {
    config.check()?;
    if scenario == Scenario::Network {
        crate::network::check_root()?;
    }
    if scenario == Scenario::Console && crate::browser::chromium().is_none() {
        return Err(BenchError::MissingProgram {
            program: "chromium".into(),
            package: "chromium".into(),
        });
    }
    let config = &config.for_scenario(scenario);
    let (raw, _data) = open_store(&config.store, scenario).await?;
    progress.phase("measuring the store's transaction rate", 0);
    let txn_rate = store_txn_per_s(&raw, config.probe_window).await?;
    let paced = config
        .store_rate_fraction(scenario)
        .map(|fraction| fraction * txn_rate);
    let mut store = raw;
    if let Some(rate) = paced {
        store = Arc::new(slow_store::paced(store, rate).ok_or_else(|| {
            BenchError::Config(format!(
                "the store measured {txn_rate} txn/s: no rate to pace its commits to"
            ))
        })?);
    }
    if scenario == Scenario::StoreLatency {
        store = Arc::new(slow_store::delayed(store, config.store_latency));
    }
    let tracker = Tracker::start(Arc::clone(&store)).await?;
    progress.phase("starting the control plane and agents", config.nodes as u64);
    let mut cluster = Cluster::start(Arc::clone(&store), cluster_config(config, scenario)).await?;
    let outcome = match cluster.wait_ready(config.timeout).await {
        Ok(()) => {
            let ready = Instant::now();
            drive(scenario, &mut cluster, &tracker, &store, config, progress)
                .await
                .map(|mut outcome| {
                    outcome.leadership_losses = cluster.leadership_losses();
                    outcome.leadership_losses_explained = !outcome.suspended.is_empty();
                    let faults = Faults {
                        killed: cluster
                            .dead()
                            .iter()
                            .chain(&outcome.faulted_nodes)
                            .cloned()
                            .collect(),
                        suspended: std::mem::take(&mut outcome.suspended),
                    };
                    outcome.leases = tracker.lease_counts(ready, &faults);
                    outcome
                })
        }
        Err(error) => Err(error),
    };
    progress.phase("stopping", 0);
    let certificates_seconds = cluster.certificates_seconds();
    cluster.stop().await;
    let outcome = outcome?;
    let mut report = report(scenario, config, txn_rate, outcome);
    report.store_paced_txn_per_s = paced;
    report.certificates_seconds = certificates_seconds;
    Ok(report)
}

async fn drive(
    scenario: Scenario,
    cluster: &mut Cluster,
    tracker: &Tracker,
    store: &Arc<dyn Store>,
    config: &BenchConfig,
    progress: &dyn Progress,
) -> Result<Outcome, BenchError> {
    if scenario == Scenario::Network {
        return crate::network::drive(cluster, tracker, store, config, progress).await;
    }
    let workload = workload_for(scenario, cluster, config);
    let deployed = deploy(cluster, tracker, &workload, config, progress).await?;
    match scenario {
        // `network` returned above, with its own deployment.
        Scenario::Deploy
        | Scenario::StoreLatency
        | Scenario::OverloadSlowStore
        | Scenario::Network => Ok(deployed),
        _ if deployed.success_rate < 1.0 => Ok(deployed),
        Scenario::Rollout => crate::lifecycle::rollout(cluster, &workload, config, progress).await,
        Scenario::Autoscale => {
            crate::lifecycle::autoscale(cluster, &workload, config, progress).await
        }
        Scenario::Placement => {
            let violations = verify::placement(cluster.client(), &workload).await?;
            Ok(Outcome {
                violations,
                ..deployed
            })
        }
        _ if deployed.success_rate < 1.0 => Ok(deployed),
        Scenario::NodeFailure => node_failure(cluster, tracker, &workload, config, progress).await,
        Scenario::ScaleUp => {
            let scaled = workload.scaled(config.scale_factor);
            scale(cluster, tracker, &scaled, config, progress).await
        }
        Scenario::ControllerRestart => {
            controller_restart(cluster, tracker, &workload, config, progress).await
        }
        Scenario::OverloadFreeze => {
            overload_freeze(cluster, tracker, &workload, config, progress).await
        }
        Scenario::OverloadMassKill => {
            overload_mass_kill(cluster, tracker, &workload, config, progress).await
        }
        Scenario::Chaos => crate::chaos::chaos(cluster, &workload, config, progress).await,
        Scenario::Console => crate::console::console(cluster, &workload, deployed, progress).await,
    }
}

/// The workload `scenario` deploys: the lifecycle scenarios' shapes
/// (for `autoscale`, its instances start on target: half their request).
fn workload_for(scenario: Scenario, cluster: &Cluster, config: &BenchConfig) -> Workload {
    let plain = Workload::new(config.instances);
    match scenario {
        Scenario::Rollout => plain.shaped(crate::lifecycle::rollout_shape(config)),
        Scenario::Autoscale => {
            if let Some(loads) = cluster.sim_loads() {
                for (service, _) in &plain.replicas {
                    loads.set(service, INSTANCE_CPU_MILLIS / 2);
                }
            }
            plain.shaped(crate::lifecycle::autoscale_shape())
        }
        _ => plain,
    }
}

/// Applies the workload; time from the apply to all running.
async fn deploy(
    cluster: &Cluster,
    tracker: &Tracker,
    workload: &Workload,
    config: &BenchConfig,
    progress: &dyn Progress,
) -> Result<Outcome, BenchError> {
    let program = workload.program()?;
    progress.phase("deploying", workload.instances() as u64);
    let cpu = CpuReading::now();
    let begun = Instant::now();
    cluster.client().apply(&program, false).await?;
    let outcome = converge(
        cluster,
        tracker,
        &HashSet::new(),
        begun,
        workload.instances(),
        config,
        progress,
    )
    .await?;
    Ok(with_cpu_since(outcome, cpu))
}

/// The threads of the control plane: its runtime's (workers and
/// blocking pool, where reconciles run) and its liveness listener's.
const PLANE_THREADS: &[&str] = &[PLANE_THREAD_NAME, LIVENESS_THREAD_NAME];

/// CPU time used so far, by the whole process and by the control plane.
struct CpuReading {
    process: Duration,
    plane: BTreeMap<u32, Duration>,
}

impl CpuReading {
    fn now() -> Self {
        Self {
            process: crate::measure::process_cpu(),
            plane: crate::measure::threads_cpu(PLANE_THREADS),
        }
    }
}

/// `outcome` with the CPU time spent since `before`.
fn with_cpu_since(outcome: Outcome, before: CpuReading) -> Outcome {
    let now = CpuReading::now();
    let plane = crate::measure::threads_cpu_since(&before.plane, &now.plane);
    Outcome {
        cpu_seconds: Some(now.process.saturating_sub(before.process).as_secs_f64()),
        plane_cpu_seconds: Some(plane.as_secs_f64()),
        ..outcome
    }
}

/// Scales every service to `target`'s replicas; time from the first
/// scale request to all running.
async fn scale(
    cluster: &Cluster,
    tracker: &Tracker,
    target: &Workload,
    config: &BenchConfig,
    progress: &dyn Progress,
) -> Result<Outcome, BenchError> {
    let before: HashSet<String> = tracker.placements().into_keys().collect();
    progress.phase("scaling up", target.instances() as u64);
    let cpu = CpuReading::now();
    let begun = Instant::now();
    for (service, replicas) in &target.replicas {
        cluster.client().scale(service, *replicas).await?;
    }
    let outcome = converge(
        cluster,
        tracker,
        &before,
        begun,
        target.instances(),
        config,
        progress,
    )
    .await?;
    Ok(with_cpu_since(outcome, cpu))
}

/// Kills nodes; time from the first lease expiry to every replacement
/// running (per instance too), plus the detection time before it: the
/// total runs from the kill. Every replacement must come after enough of
/// the killed nodes' leases expired (see [`early_replacements`]).
async fn node_failure(
    cluster: &mut Cluster,
    tracker: &Tracker,
    workload: &Workload,
    config: &BenchConfig,
    progress: &dyn Progress,
) -> Result<Outcome, BenchError> {
    let victims = victims(&cluster.node_names(), config.killed_nodes);
    let placed_before = tracker.placements();
    let before: HashSet<String> = placed_before.keys().cloned().collect();
    progress.phase(
        "killing nodes, waiting for their leases to expire",
        victims.len() as u64,
    );
    let killed = Instant::now();
    cluster.kill_nodes(&victims).await;
    let expiries = wait_for_expiries(tracker, &victims, config.timeout, progress).await?;
    let expired = expiries
        .values()
        .map(|expiry| expiry.at)
        .min()
        .unwrap_or_else(Instant::now);
    progress.phase("replacing lost instances", workload.instances() as u64);
    let mut outcome = converge(
        cluster,
        tracker,
        &before,
        expired,
        workload.instances(),
        config,
        progress,
    )
    .await?;
    let detection = expired.duration_since(killed).as_secs_f64();
    outcome.detection_seconds = Some(detection);
    outcome.total_seconds = Some(outcome.seconds + detection);
    outcome.violations = early_replacements(&placed_before, &tracker.placements(), &expiries);
    Ok(outcome)
}

/// Replacements placed before enough of the killed nodes' leases had
/// expired (moves — a rebalancing pass between two expiries — replace
/// nothing lost and do not count). In the order of the store revisions that created them, the
/// k-th new instance needs at least k instances lost on killed nodes whose
/// lease expired at an earlier revision; one placed sooner answered a
/// report from a killed node's agent, which a dead machine never sends.
fn early_replacements(
    before: &HashMap<String, Placed>,
    after: &HashMap<String, Placed>,
    expiries: &HashMap<String, Expiry>,
) -> Vec<String> {
    let mut lost: Vec<(Revision, usize)> = expiries
        .iter()
        .map(|(node, expiry)| {
            let on_node = before
                .values()
                .filter(|placed| !placed.stopping && placed.node == *node)
                .count();
            (expiry.revision, on_node)
        })
        .collect();
    lost.sort_unstable();
    // A move (drain, rebalancing) takes over from a running instance.
    let mut new: Vec<(&String, &Placed)> = after
        .iter()
        .filter(|(id, placed)| !before.contains_key(*id) && !placed.moves)
        .collect();
    new.sort_unstable_by_key(|(id, placed)| (placed.created, *id));
    let mut violations = Vec::new();
    let mut expired = lost.iter().peekable();
    let mut replaceable = 0;
    for (made, (id, placed)) in new.into_iter().enumerate() {
        while let Some((_, count)) = expired.next_if(|(revision, _)| *revision < placed.created) {
            replaceable += count;
        }
        if made + 1 > replaceable {
            violations.push(format!(
                "{id} on {} was placed at revision {} with only {replaceable} instances \
                 lost to expired leases by then: a replacement before the lease expired",
                placed.node, placed.created
            ));
        }
    }
    violations
}

/// Stops the controllers, scales up 10% while they are away, starts new
/// ones; time from the restart to all running. Every instance placed
/// before must still be placed on the same node.
async fn controller_restart(
    cluster: &mut Cluster,
    tracker: &Tracker,
    workload: &Workload,
    config: &BenchConfig,
    progress: &dyn Progress,
) -> Result<Outcome, BenchError> {
    let before = tracker.placements();
    progress.phase("restarting the controllers", 0);
    cluster.stop_controllers().await;
    let target = workload.scaled(1.1);
    for (service, replicas) in &target.replicas {
        cluster.client().scale(service, *replicas).await?;
    }
    let begun = Instant::now();
    cluster.start_controllers();
    progress.phase("converging after the restart", target.instances() as u64);
    let known = before.keys().cloned().collect();
    let mut outcome = converge(
        cluster,
        tracker,
        &known,
        begun,
        target.instances(),
        config,
        progress,
    )
    .await?;
    outcome.violations = moves(&before, &tracker.placements(), "the restart");
    Ok(outcome)
}

/// Freezes the control plane for twice the node TTL — every lease
/// expires meanwhile, as the store is not frozen — then waits until it
/// has recovered: every node ready again and every instance running.
/// Time from the thaw to that. Then watches for the lost-grace period
/// and a little more, long enough for a replacement the freeze caused to
/// be placed, and checks that nothing moved and nothing was duplicated
/// (see [`moves`] and [`duplicates`]). The expiries from the freeze until
/// every node is ready again are the harness's doing, not false ones.
async fn overload_freeze(
    cluster: &mut Cluster,
    tracker: &Tracker,
    workload: &Workload,
    config: &BenchConfig,
    progress: &dyn Progress,
) -> Result<Outcome, BenchError> {
    let before = tracker.placements();
    let frozen_for = config.node_lease_ttl() * 2;
    progress.phase(
        &format!(
            "freezing the control plane for {:.1} s",
            frozen_for.as_secs_f64()
        ),
        0,
    );
    tracker.reset_peaks();
    let frozen = Instant::now();
    cluster.freeze(frozen_for).await?;
    let thawed = Instant::now();
    wait_recovered(cluster, tracker, config.timeout, progress).await?;
    let recovered = Instant::now();
    progress.phase("converging after the freeze", workload.instances() as u64);
    let known = before.keys().cloned().collect();
    let mut outcome = converge(
        cluster,
        tracker,
        &known,
        thawed,
        workload.instances(),
        config,
        progress,
    )
    .await?;
    progress.phase("watching for late replacements", 0);
    tokio::time::sleep(config.lost_grace + LATE_REPLACEMENT_MARGIN).await;
    outcome.suspended = vec![frozen..recovered];
    outcome.violations = moves(&before, &tracker.placements(), "the freeze");
    outcome.violations.extend(duplicates(
        &workload.replicas,
        &tracker.peaks(),
        &cluster.running_instances().await,
    ));
    Ok(outcome)
}

/// Kills `mass_kill_percent` of the nodes at once and checks the pause:
/// the node controller must pause replacement, nothing may be placed
/// while the API says it is paused, and no other node's lease may expire
/// (counted as false expiries). An operator resumes once the pause held
/// for the lost grace and a little more after every victim's lease
/// expired — or, with `resume_replacement_after`, the safeguard does —
/// and the time runs from the resume to every replacement running; the
/// total from the kill.
async fn overload_mass_kill(
    cluster: &mut Cluster,
    tracker: &Tracker,
    workload: &Workload,
    config: &BenchConfig,
    progress: &dyn Progress,
) -> Result<Outcome, BenchError> {
    let nodes = cluster.node_names();
    let victims = victims(
        &nodes,
        nodes.len() * config.mass_kill_percent as usize / 100,
    );
    let before: HashSet<String> = tracker.placements().into_keys().collect();
    progress.phase(
        &format!("killing {} of {} nodes at once", victims.len(), nodes.len()),
        victims.len() as u64,
    );
    let killed = Instant::now();
    cluster.kill_nodes(&victims).await;
    let expiries = wait_for_expiries(tracker, &victims, config.timeout, progress).await?;
    let expired = expiries.values().map(|expiry| expiry.at).min();
    progress.phase("watching that nothing is replaced while paused", 0);
    let watch = match config.resume_replacement_after {
        None => Watch::For(config.lost_grace + LATE_REPLACEMENT_MARGIN),
        Some(after) => Watch::UntilResumed(after + config.timeout),
    };
    let pause = watch_pause(cluster, tracker, &before, watch).await?;
    if config.resume_replacement_after.is_none() {
        cluster.client().resume_replacement().await?;
    }
    let resumed = Instant::now();
    progress.phase("replacing lost instances", workload.instances() as u64);
    let mut outcome = converge(
        cluster,
        tracker,
        &before,
        resumed,
        workload.instances(),
        config,
        progress,
    )
    .await?;
    outcome.detection_seconds = expired.map(|at| at.duration_since(killed).as_secs_f64());
    outcome.total_seconds = Some(killed.elapsed().as_secs_f64());
    if !pause.seen {
        outcome.violations.push(format!(
            "{} of {} nodes died at once and replacement was never paused",
            victims.len(),
            nodes.len()
        ));
    }
    outcome.violations.extend(
        pause
            .early
            .iter()
            .map(|id| format!("{id} was placed while replacement was paused")),
    );
    Ok(outcome)
}

/// How long [`watch_pause`] watches.
enum Watch {
    /// This long, then an operator resumes.
    For(Duration),
    /// Until the pause ends on its own, at most this long.
    UntilResumed(Duration),
}

/// What [`watch_pause`] saw.
struct PauseSeen {
    /// The API said replacement was paused at least once.
    seen: bool,
    /// New instances created at a revision at which the API still said
    /// it was paused.
    early: BTreeSet<String>,
}

/// Polls the API's view of the pause and the tracker's placements: a new
/// instance created no later than a revision the API called paused was
/// placed during the pause.
async fn watch_pause(
    cluster: &Cluster,
    tracker: &Tracker,
    before: &HashSet<String>,
    watch: Watch,
) -> Result<PauseSeen, BenchError> {
    let (limit, until_resumed) = match watch {
        Watch::For(span) => (span, false),
        Watch::UntilResumed(span) => (span, true),
    };
    let begun = Instant::now();
    let deadline = begun + limit;
    let mut seen = PauseSeen {
        seen: false,
        early: BTreeSet::new(),
    };
    loop {
        if let Ok(status) = cluster.client().status().await {
            let paused = status.disruption.as_ref().is_some_and(|d| d.paused);
            if paused {
                seen.seen = true;
                seen.early.extend(
                    tracker
                        .placements()
                        .into_iter()
                        .filter(|(id, placed)| {
                            !before.contains(id) && placed.created <= status.revision
                        })
                        .map(|(id, _)| id),
                );
            } else if until_resumed && seen.seen {
                return Ok(seen);
            }
        }
        // The pause comes with the victims' conditions, which came with
        // their expiries: one not seen by now never came.
        let never = !seen.seen && begun.elapsed() >= LATE_REPLACEMENT_MARGIN;
        if never || Instant::now() >= deadline {
            if until_resumed && !never {
                return Err(BenchError::Timeout {
                    what: "the safeguard resuming replacement".into(),
                    timeout: limit,
                });
            }
            return Ok(seen);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// After a recovery looks complete, how much longer than the lost-grace
/// period a replacement may take to show: a scheduler pass and its commit.
const LATE_REPLACEMENT_MARGIN: Duration = Duration::from_secs(2);

/// Waits until every node's heartbeat key is back in the store, then
/// until the API, with a view at least that recent, says every node is
/// ready. The API alone would not do: right after a thaw its view is
/// still the one from before the freeze, where every node was ready.
async fn wait_recovered(
    cluster: &Cluster,
    tracker: &Tracker,
    timeout: Duration,
    progress: &dyn Progress,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + timeout;
    let nodes = cluster.node_names();
    progress.phase("waiting for every node to register again", 0);
    let revision = loop {
        if let Some(problem) = tracker.broken() {
            return Err(BenchError::Task {
                what: "store watch".into(),
                problem,
            });
        }
        if let Some(revision) = tracker.heartbeats_back(&nodes) {
            break revision;
        }
        if Instant::now() >= deadline {
            return Err(BenchError::Timeout {
                what: "every node registering again after the freeze".into(),
                timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    progress.phase(
        "waiting for every node to be ready again",
        nodes.len() as u64,
    );
    loop {
        if let Ok(status) = cluster.client().status().await {
            progress.advance(status.nodes.ready as u64);
            if status.revision >= revision && status.nodes.ready >= nodes.len() {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            return Err(BenchError::Timeout {
                what: "every node ready again after the freeze".into(),
                timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Instances placed before that are not placed on the same node now, or
/// are being stopped: moved, or replaced by a new instance. `across`
/// names what happened in between.
fn moves(
    before: &HashMap<String, Placed>,
    after: &HashMap<String, Placed>,
    across: &str,
) -> Vec<String> {
    let mut violations = Vec::new();
    let mut ids: Vec<(&String, &Placed)> = before
        .iter()
        .filter(|(_, placed)| !placed.stopping)
        .collect();
    ids.sort_unstable_by_key(|(id, _)| *id);
    for (id, placed) in ids {
        match after.get(id) {
            Some(now) if now.node == placed.node && !now.stopping => {}
            Some(now) if now.node == placed.node => violations.push(format!(
                "{id} on {} is being stopped after {across}: replaced",
                placed.node
            )),
            Some(now) => violations.push(format!(
                "{id} moved from {} to {} across {across}",
                placed.node, now.node
            )),
            None => violations.push(format!(
                "{id} on {} was replaced across {across}: its placement is gone",
                placed.node
            )),
        }
    }
    violations
}

/// Duplicates: a service with more instances placed at once (its
/// `peaks`, not stopping) or running (on the nodes' runtimes) than it
/// asks for, and an instance id running on more than one node.
fn duplicates(
    desired: &[(String, u32)],
    peaks: &HashMap<String, usize>,
    running: &[RunningInstance],
) -> Vec<String> {
    let mut violations = Vec::new();
    let mut running_per_service: HashMap<&str, usize> = HashMap::new();
    let mut nodes_per_id: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for instance in running {
        *running_per_service.entry(&instance.service).or_default() += 1;
        nodes_per_id
            .entry(&instance.id)
            .or_default()
            .insert(&instance.node);
    }
    for (service, replicas) in desired {
        let replicas = *replicas as usize;
        let peak = peaks.get(service).copied().unwrap_or(0);
        if peak > replicas {
            violations.push(format!(
                "{service} had {peak} instances placed at once; it asks for {replicas}"
            ));
        }
        let runs = running_per_service
            .get(service.as_str())
            .copied()
            .unwrap_or(0);
        if runs > replicas {
            violations.push(format!(
                "{runs} instances of {service} run on the nodes; it asks for {replicas}"
            ));
        }
    }
    for (id, nodes) in nodes_per_id.iter().filter(|(_, nodes)| nodes.len() > 1) {
        let nodes: Vec<&str> = nodes.iter().copied().collect();
        violations.push(format!(
            "{id} runs on {} nodes: {}",
            nodes.len(),
            nodes.join(", ")
        ));
    }
    violations
}

/// Waits until `target` instances run on live nodes; latencies of the
/// ones not in `before`, measured from `since`.
pub(crate) async fn converge(
    cluster: &Cluster,
    tracker: &Tracker,
    before: &HashSet<String>,
    since: Instant,
    target: usize,
    config: &BenchConfig,
    progress: &dyn Progress,
) -> Result<Outcome, BenchError> {
    let deadline = since + config.timeout;
    let dead = cluster.dead();
    loop {
        if let Some(problem) = tracker.broken() {
            return Err(BenchError::Task {
                what: "store watch".into(),
                problem,
            });
        }
        let now = tracker.progress(dead);
        progress.advance(now.running as u64);
        let converged = now.running == target && now.placed == target;
        if converged || Instant::now() >= deadline {
            let seconds = since.elapsed().as_secs_f64();
            return Ok(Outcome {
                seconds,
                latencies: tracker.new_latencies(before, dead, since),
                success_rate: (now.running.min(target) as f64 / target.max(1) as f64)
                    .min(if converged { 1.0 } else { 0.999_999 }),
                instances: target,
                tracker_relists: tracker.relists(),
                ..Outcome::default()
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until every victim's lease expired; returns each expiry.
async fn wait_for_expiries(
    tracker: &Tracker,
    victims: &HashSet<String>,
    timeout: Duration,
    progress: &dyn Progress,
) -> Result<HashMap<String, Expiry>, BenchError> {
    let deadline = Instant::now() + timeout;
    loop {
        let expiries = tracker.expiries(victims);
        progress.advance(expiries.len() as u64);
        if expiries.len() == victims.len() {
            return Ok(expiries);
        }
        if Instant::now() >= deadline {
            return Err(BenchError::Timeout {
                what: "the killed nodes' leases expiring".into(),
                timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `count` nodes spread over the cluster (gold and plain ones alike).
fn victims(nodes: &[String], count: usize) -> HashSet<String> {
    let count = count.clamp(1, nodes.len().saturating_sub(1).max(1));
    let stride = (nodes.len() / count).max(1);
    nodes.iter().step_by(stride).take(count).cloned().collect()
}

/// Nodes big enough for 2.25× their even share of the workload: room for
/// the scale-up (1.5×) on the 90% of nodes left after a node failure, and
/// for the restricted service crowding onto half of them.
fn cluster_config(config: &BenchConfig, scenario: Scenario) -> ClusterConfig {
    let share = (config.instances as f64 * 2.25 / config.nodes.max(1) as f64).ceil() as u64 + 1;
    ClusterConfig {
        nodes: config.nodes,
        node_cpu: Cpu(share * INSTANCE_CPU_MILLIS),
        node_memory: Memory(share * INSTANCE_MEMORY_MIB * 1024 * 1024),
        sim: SimConfig {
            start_latency: config.start_latency,
            seed: config.seed,
            loads: Some(Arc::new(cca_runtime::sim::SimLoads::default())),
            ..SimConfig::default()
        },
        node_leases: config.node_leases,
        lost_grace: config.lost_grace,
        startup_grace: config.startup_grace,
        agent_tick: Duration::from_millis(500),
        resume_replacement_after: config.resume_replacement_after,
        usage_every: config.usage_every_for(scenario),
        scale_down_window: config.scale_down_window_for(scenario),
        tls: config.tls,
        liveness_over_api: config.liveness_over_api,
        connection_per_node: config.connection_per_node,
    }
}

/// A fresh store for one scenario, and the directory to keep alive.
async fn open_store(
    target: &StoreTarget,
    scenario: Scenario,
) -> Result<(Arc<dyn Store>, Option<tempfile::TempDir>), BenchError> {
    match target {
        StoreTarget::Embedded(parent) => {
            let prefix = format!("cca-bench-{}-", scenario.name());
            let mut builder = tempfile::Builder::new();
            builder.prefix(&prefix);
            let dir = match parent {
                Some(parent) => {
                    // `embedded:a/b` with no `a` yet: made like the store
                    // makes its own directory.
                    std::fs::create_dir_all(parent).map_err(BenchError::io(format!(
                        "creating the store's parent directory {}",
                        parent.display()
                    )))?;
                    builder.tempdir_in(parent)
                }
                None => builder.tempdir(),
            }
            // tempfile's error names the path itself.
            .map_err(BenchError::io("creating the store directory"))?;
            let url = cca_store::StoreUrl::Embedded(dir.path().to_owned());
            Ok((cca_store::open(&url).await?, Some(dir)))
        }
        StoreTarget::Etcd(endpoints) => {
            let mut etcd = cca_store::etcd::Config::new(endpoints.clone());
            let stamp = cca_model::clock::now_millis();
            etcd.namespace = format!("cca-bench/{stamp}-{}/", scenario.name());
            let store = cca_store::etcd::EtcdStore::connect(etcd).await?;
            Ok((Arc::new(store), None))
        }
    }
}

fn report(scenario: Scenario, config: &BenchConfig, txn_rate: f64, outcome: Outcome) -> Report {
    let started = outcome.latencies.len();
    let summary = Summary::of(outcome.latencies);
    Report {
        scenario: scenario.name().to_owned(),
        nodes: config.nodes,
        instances: outcome.instances,
        store: match &config.store {
            StoreTarget::Embedded(_) => "embedded".to_owned(),
            StoreTarget::Etcd(endpoints) => format!("etcd {}", endpoints.join(",")),
        },
        seconds: outcome.seconds,
        mean: summary.mean,
        p50: summary.p50,
        p95: summary.p95,
        p99: summary.p99,
        max: summary.max,
        success_rate: outcome.success_rate,
        placements_per_s: started as f64 / outcome.seconds.max(1e-9),
        store_txn_per_s: txn_rate,
        store_paced_txn_per_s: None,
        detection_seconds: outcome.detection_seconds,
        total_seconds: outcome.total_seconds,
        violations: outcome.violations,
        peak_rss_bytes: peak_rss_bytes(),
        cpu_seconds: outcome.cpu_seconds,
        plane_cpu_seconds: outcome.plane_cpu_seconds,
        tracker_relists: outcome.tracker_relists,
        lease_expiries: outcome.leases.expiries,
        false_lease_expiries: outcome.leases.false_expiries,
        re_registrations: outcome.leases.re_registrations,
        lease_moves: outcome.leases.moves,
        leadership_losses: outcome.leadership_losses,
        false_leadership_losses: if outcome.leadership_losses_explained {
            0
        } else {
            outcome.leadership_losses
        },
        tls: config.tls,
        liveness_over_api: config.liveness_over_api,
        connection_per_node: config.connection_per_node || config.tls,
        certificates_seconds: None,
        network: outcome.network,
        lifecycle: outcome.lifecycle,
        chaos: outcome.chaos,
        console: outcome.console,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_connections_beyond_the_open_file_limit_are_refused_before_the_run() {
        let Some(limit) = crate::measure::open_file_limit() else {
            eprintln!("skipped: no open-file limit to exceed");
            return;
        };
        let Ok(nodes) = usize::try_from(limit) else {
            eprintln!("skipped: the open-file limit does not fit a node count");
            return;
        };
        let shared = BenchConfig::new(nodes, nodes, StoreTarget::Embedded(None));
        // Sixty agents to a connection: no check to fail.
        assert!(shared.check().is_ok());
        for (tls, per_node) in [(true, false), (false, true)] {
            let config = BenchConfig {
                tls,
                connection_per_node: per_node,
                ..shared.clone()
            };
            let error = config.check().expect_err("more descriptors than the limit");
            let message = error.to_string();
            assert!(message.contains(&format!("limit is {limit}")), "{message}");
            assert!(message.contains("--liveness-over-api"), "{message}");
        }
    }

    #[tokio::test]
    async fn an_embedded_store_under_a_missing_directory_creates_it() {
        let root = tempfile::tempdir().expect("temp dir");
        let parent = root.path().join("a").join("b");
        let target = StoreTarget::Embedded(Some(parent.clone()));
        let (store, dir) = open_store(&target, Scenario::Deploy)
            .await
            .expect("opens under a missing parent");
        let dir = dir.expect("an embedded store keeps its directory");
        assert_eq!(dir.path().parent(), Some(parent.as_path()));
        assert_eq!(store.current_revision().await.expect("revision"), 1);
    }

    #[tokio::test]
    async fn a_parent_that_cannot_be_made_is_named_once() {
        let root = tempfile::tempdir().expect("temp dir");
        let file = root.path().join("file");
        std::fs::write(&file, b"").expect("writes");
        let parent = file.join("b");
        let target = StoreTarget::Embedded(Some(parent.clone()));
        let Err(error) = open_store(&target, Scenario::Deploy).await else {
            panic!("a file as a directory cannot hold a store");
        };
        let text = error.to_string();
        assert_eq!(
            text.matches(&*parent.to_string_lossy()).count(),
            1,
            "{text}"
        );
        assert!(text.contains("Not a directory"), "{text}");
    }

    #[test]
    fn scenarios_are_found_by_name_and_victims_spread() {
        for &scenario in Scenario::ALL {
            assert_eq!(Scenario::named(scenario.name()), Some(scenario));
            assert_eq!(Scenario::select(scenario.name()), Some(vec![scenario]));
            assert!(Scenario::choices().contains(scenario.name()));
        }
        assert_eq!(Scenario::select("all").as_deref(), Some(Scenario::ALL));
        assert_eq!(Scenario::named("network"), Some(Scenario::Network));
        assert!(Scenario::choices().contains("network"));
        assert!(
            !Scenario::ALL.contains(&Scenario::Network),
            "network needs root: only by name"
        );
        let overload = Scenario::select("overload").expect("a group");
        assert!(!overload.is_empty() && overload.iter().all(|s| s.is_overload()));
        assert!(overload.iter().all(|s| Scenario::ALL.contains(s)));
        assert!(!Scenario::Deploy.is_overload());
        assert_eq!(Scenario::select("overload-"), None);
        let nodes: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
        let chosen = victims(&nodes, 2);
        assert_eq!(chosen, HashSet::from(["n0".to_owned(), "n5".to_owned()]));
        assert_eq!(victims(&nodes[..1], 3).len(), 1);
    }

    #[test]
    fn a_store_rate_fraction_is_a_share_of_at_most_the_whole() {
        let mut config = BenchConfig::new(2, 2, StoreTarget::Embedded(None));
        assert!(config.check().is_ok());
        for good in [0.01, 0.5, 1.0] {
            config.store_rate_fraction = Some(good);
            assert!(config.check().is_ok(), "{good}");
        }
        for bad in [0.0, -0.5, 1.01, f64::NAN] {
            config.store_rate_fraction = Some(bad);
            let text = config.check().expect_err("refused").to_string();
            assert!(text.contains("more than 0 and at most 1"), "{bad}: {text}");
        }
    }

    fn placed(node: &str, created: Revision) -> Placed {
        Placed {
            service: "web".to_owned(),
            node: node.to_owned(),
            stopping: false,
            moves: false,
            created,
        }
    }

    #[test]
    fn a_moved_or_replaced_instance_is_a_violation_a_stopping_one_before_is_not() {
        let before = HashMap::from([
            ("a".to_owned(), placed("n1", 1)),
            ("b".to_owned(), placed("n1", 2)),
            ("c".to_owned(), placed("n2", 3)),
            ("d".to_owned(), placed("n2", 4)),
            (
                "e".to_owned(),
                Placed {
                    stopping: true,
                    ..placed("n3", 5)
                },
            ),
        ]);
        let same = before.clone();
        assert!(moves(&before, &same, "the freeze").is_empty());
        let mut after = before.clone();
        after.insert("b".to_owned(), placed("n3", 2));
        after.get_mut("c").expect("c").stopping = true;
        after.remove("d");
        after.remove("e");
        after.insert("f".to_owned(), placed("n3", 9));
        let violations = moves(&before, &after, "the freeze");
        assert_eq!(
            violations,
            vec![
                "b moved from n1 to n3 across the freeze".to_owned(),
                "c on n2 is being stopped after the freeze: replaced".to_owned(),
                "d on n2 was replaced across the freeze: its placement is gone".to_owned(),
            ]
        );
    }

    #[test]
    fn more_instances_than_asked_for_or_one_id_on_two_nodes_are_duplicates() {
        let desired = vec![("web".to_owned(), 2), ("db".to_owned(), 1)];
        let on = |id: &str, service: &str, node: &str| RunningInstance {
            id: id.to_owned(),
            service: service.to_owned(),
            node: node.to_owned(),
        };
        let peaks = HashMap::from([("web".to_owned(), 2), ("db".to_owned(), 1)]);
        let running = vec![
            on("a", "web", "n1"),
            on("b", "web", "n2"),
            on("c", "db", "n1"),
        ];
        assert!(duplicates(&desired, &peaks, &running).is_empty());
        // Three web instances placed at once at some point; `a` runs on
        // n1 and n3; a third web instance runs.
        let peaks = HashMap::from([("web".to_owned(), 3), ("db".to_owned(), 1)]);
        let mut running = running;
        running.push(on("a", "web", "n3"));
        let violations = duplicates(&desired, &peaks, &running);
        assert_eq!(
            violations,
            vec![
                "web had 3 instances placed at once; it asks for 2".to_owned(),
                "3 instances of web run on the nodes; it asks for 2".to_owned(),
                "a runs on 2 nodes: n1, n3".to_owned(),
            ]
        );
    }

    #[test]
    fn replacements_before_a_lease_expired_are_violations() {
        let before = HashMap::from([
            ("a".to_owned(), placed("dead-1", 1)),
            ("b".to_owned(), placed("dead-1", 2)),
            ("c".to_owned(), placed("dead-2", 3)),
            ("d".to_owned(), placed("live", 4)),
        ]);
        let expiry = |revision| Expiry {
            at: Instant::now(),
            revision,
        };
        let expiries = HashMap::from([
            ("dead-1".to_owned(), expiry(10)),
            ("dead-2".to_owned(), expiry(20)),
        ]);
        let mut after = HashMap::from([("d".to_owned(), placed("live", 4))]);
        after.insert("x".to_owned(), placed("live", 11));
        after.insert("y".to_owned(), placed("live", 12));
        after.insert("z".to_owned(), placed("live", 21));
        assert!(early_replacements(&before, &after, &expiries).is_empty());
        // c's replacement before dead-2 expired: it answered a report,
        // not the lease.
        after.remove("z");
        after.insert("w".to_owned(), placed("live", 13));
        let violations = early_replacements(&before, &after, &expiries);
        assert_eq!(violations.len(), 1, "{violations:?}");
        // A replacement before any lease expired.
        after.insert("v".to_owned(), placed("live", 5));
        assert_eq!(early_replacements(&before, &after, &expiries).len(), 3);
        // A rebalancing move meanwhile replaces nothing lost.
        let moving = Placed {
            moves: true,
            ..placed("live", 6)
        };
        after.insert("m".to_owned(), moving);
        assert_eq!(early_replacements(&before, &after, &expiries).len(), 3);
    }
}
