//! The supervisor: every tick it compares the node's assignments with what
//! the runtime runs and acts — start what is missing (init steps first),
//! restart what crashed with exponential backoff until a threshold marks it
//! failed, restart what fails its health check, stop what the scheduler
//! stops, remove orphans nobody claims (an instance a resync with another
//! store left unclaimed only once it no longer awaits adoption) — then
//! describes every instance as
//! an observed status. Instances started by an earlier agent process are
//! adopted as they are (same pid), never restarted.
//!
//! Volumes are node-local directories, `VOLUMES/{service}/{volume}` (for a
//! stateful service `{volume}-{ordinal}`), created before the instance and
//! never removed by the supervisor: a restarted or replacing instance on the
//! same node finds its data. Image workloads get them bind-mounted
//! read-write at the volume's path; process workloads, which see the host's
//! filesystem, get the directory as `CCA_VOLUME_{NAME}`.
//!
//! Init steps run in the start task before the main start (see
//! [`crate::init`]); what one waits for shows in the instance's status.
//!
//! An instance whose service references connections or is granted secrets
//! gets its files (see [`crate::files`]) fetched and written just before it
//! is created; when they cannot be had (a secret without a value, the API
//! away) the instance stays `pending` with the reason and is tried again
//! on the restart backoff. Its files go when it is removed.
//!
//! Before an instance on the host's network starts or restarts, each of
//! its host ports is probed (see [`crate::host_ports`]): one that
//! something outside the cluster holds fails the instance, naming the port,
//! and joins the node's held ports the agent reports; one that an instance
//! of this node still holds (an orphan being removed) makes it wait.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cca_model::clock::{now_millis, span_millis};
use cca_model::cluster::{ExitInfo, InstanceState, InstanceStatus, Millis};
use cca_model::recovery::UnclaimedInstance;
use cca_model::spec::{Probe, ServiceSpec, Workload};
use cca_runtime::{
    ExitReason, InstanceSpec, InstanceState as RtState, InstanceStatus as RtStatus, Limits,
    LogOptions, Mount, NetworkAttachment, PortBinding, Runtime,
};
use cca_wire::types::Assignment;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::desired::{Desired, UnclaimedRun};
use crate::files::{self, FileSource};
use crate::health::{self, HealthTracker, ProbeTarget};
use crate::host_ports::{self, HeldPorts, ListenerOwner, PortProbe};
use crate::init::StartNote;
use crate::netplane::NodeNet;
use crate::restart::{self, AfterExit};

/// How hard the supervisor tries.
#[derive(Clone, Debug)]
pub struct SupervisorConfig {
    /// Consecutive crashes (each within `stable_after` of its start) after
    /// which an instance is reported failed and left alone.
    pub restart_threshold: u32,
    /// First restart delay; doubles per consecutive crash.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// A run this long resets the crash streak.
    pub stable_after: Duration,
    /// SIGTERM → SIGKILL grace when stopping.
    pub stop_grace: Duration,
    /// Lines of output kept with a crash report.
    pub log_tail: usize,
    /// How long an instance left unclaimed by a resync keeps running once
    /// the store knows its service, waiting for the scheduler to adopt it.
    pub claim_grace: Duration,
    /// How long an unclaimed instance keeps running while the store does
    /// not know its service (the desired state is yet to be re-applied).
    pub adopt_window: Duration,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        Self {
            restart_threshold: 5,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            stable_after: Duration::from_secs(30),
            stop_grace: Duration::from_secs(10),
            log_tail: 20,
            claim_grace: Duration::from_secs(30),
            adopt_window: Duration::from_secs(600),
        }
    }
}

/// What the supervisor remembers about one instance between ticks.
#[derive(Debug)]
struct Record {
    restarts: u32,
    crash_streak: u32,
    next_start_at: Option<Instant>,
    failed: Option<String>,
    last_exit: Option<ExitInfo>,
    /// The start time of the run whose end was last handled.
    handled_run: Option<i64>,
    health: HealthTracker,
    /// Why the last attempt to create it stopped short (its files could
    /// not be had); it is tried again at `next_start_at`.
    waiting: Option<String>,
    /// Consecutive such attempts, for the backoff.
    file_attempts: u32,
    /// When the scheduler's stop was first seen while the instance was
    /// still a VIP target here: it drains until no longer one, for at most
    /// [`DRAIN_MAX`].
    draining_since: Option<Instant>,
    /// When the placement this record is about was made
    /// (`Instance::created_at`): a stateful instance placed again keeps
    /// its id.
    placed_at: Option<i64>,
    /// The run (main process) and host port whose listener was found to
    /// be the instance's own: not looked at again for that run.
    own_listener: Option<(u32, u16)>,
    /// Limits the runtime refused to set in place, and why: not tried
    /// again for this run; the next start applies them.
    resize_refused: Option<(Limits, String)>,
}

impl Record {
    fn new(now: Instant) -> Self {
        Self {
            restarts: 0,
            crash_streak: 0,
            next_start_at: None,
            failed: None,
            last_exit: None,
            handled_run: None,
            health: HealthTracker::new(now),
            waiting: None,
            file_attempts: 0,
            draining_since: None,
            placed_at: None,
            own_listener: None,
            resize_refused: None,
        }
    }
}

/// Supervises every instance placed on one node.
#[derive(Debug)]
pub struct Supervisor {
    node: String,
    /// Where this node's instances are reachable (reported as their address).
    address: String,
    runtime: Arc<dyn Runtime>,
    config: SupervisorConfig,
    /// Extra environment for every instance (e.g. a PATH holding `cca`).
    base_env: BTreeMap<String, String>,
    /// Where volume directories live (`DATA/volumes` for an agent); `None`:
    /// services with volumes fail to start, with that reason.
    volumes_dir: Option<PathBuf>,
    /// Where instances' secret and connection files are written and where
    /// they come from; `None`: services using them fail to start, saying so.
    files: Option<(PathBuf, Arc<dyn FileSource>)>,
    records: HashMap<String, Record>,
    starting: HashMap<String, JoinHandle<Result<(), StartProblem>>>,
    /// What each start in `starting` is doing now (an init step's wait).
    start_notes: HashMap<String, StartNote>,
    /// Notified when a background start ends, so the agent ticks at once
    /// (its first health probe, its status report) instead of at its next
    /// periodic tick: a cold start waits on this.
    started: Arc<tokio::sync::Notify>,
    /// The earliest quick startup probe due (see `health`): the agent
    /// ticks no later than this.
    quick_probe_at: Option<Instant>,
    /// The node's part of the cluster network, when it has one: instances
    /// wait for its subnet before they first start, and get its resolver.
    node_net: Option<Arc<NodeNet>>,
    /// Probes host ports before starts; `None`: they are not probed.
    port_probe: Option<Arc<dyn PortProbe>>,
    /// Host ports found held by something outside the cluster.
    held: HeldPorts,
    /// Host ports of the instances the runtime runs, as of this tick.
    own_ports: BTreeMap<u16, String>,
    /// When the server first said it knows each service of an unclaimed
    /// instance (see [`Supervisor::services_known`]).
    known_services: HashMap<String, Millis>,
}

/// Whether an instance a resync left unclaimed at `since` still waits for
/// adoption at `now`: while the store does not know its service, for the
/// adoption window; once it does (since `known`), for the claim grace.
fn awaits_adoption(
    config: &SupervisorConfig,
    since: Millis,
    known: Option<Millis>,
    now: Millis,
) -> bool {
    match known {
        None => now.saturating_sub(since) < span_millis(config.adopt_window),
        Some(known) => now.saturating_sub(known.max(since)) < span_millis(config.claim_grace),
    }
}

/// What the scheduler needs to adopt the instance `assignment` placed.
fn unclaimed_instance(assignment: &Assignment) -> UnclaimedInstance {
    let instance = &assignment.instance;
    UnclaimedInstance {
        id: instance.id.clone(),
        service: instance.service.clone(),
        ordinal: instance.ordinal,
        spec_hash: instance.spec_hash.clone(),
        cpu: instance.cpu,
        memory: instance.memory,
        host_ports: instance.host_ports.clone(),
    }
}

/// The longest a stopping instance waits for this node's VIP rules to drop
/// it before it is stopped anyway.
const DRAIN_MAX: Duration = Duration::from_secs(2);

/// How often an instance waiting for the node's subnet looks again.
const NETWORK_WAIT: Duration = Duration::from_millis(200);

/// Why a start did not get the instance running.
#[derive(Debug)]
pub(crate) enum StartProblem {
    /// For good: the instance is failed (the scheduler replaces it).
    Failed(String),
    /// For now: tried again after the restart backoff.
    Retry(String),
}

impl From<String> for StartProblem {
    fn from(problem: String) -> Self {
        StartProblem::Failed(problem)
    }
}

/// The outcome of one tick.
#[derive(Debug, Default)]
pub struct Tick {
    /// The observed status of every assigned instance.
    pub statuses: Vec<InstanceStatus>,
    /// Instances gone from the node — removed as orphans, or failed before
    /// the runtime had them and no longer assigned: their observed records
    /// should go.
    pub removed: Vec<String>,
    /// Host ports found held by something outside the cluster, all of
    /// them; `None` when the supervisor does not probe host ports.
    pub held_ports: Option<std::collections::BTreeSet<u16>>,
    /// Running instances a resync left unclaimed that still wait for
    /// adoption.
    pub unclaimed: Vec<UnclaimedInstance>,
}

impl Supervisor {
    pub fn new(
        node: impl Into<String>,
        address: impl Into<String>,
        runtime: Arc<dyn Runtime>,
        config: SupervisorConfig,
        base_env: BTreeMap<String, String>,
    ) -> Self {
        Self {
            node: node.into(),
            address: address.into(),
            runtime,
            config,
            base_env,
            volumes_dir: None,
            files: None,
            records: HashMap::new(),
            starting: HashMap::new(),
            start_notes: HashMap::new(),
            started: Arc::new(tokio::sync::Notify::new()),
            quick_probe_at: None,
            node_net: None,
            port_probe: None,
            held: HeldPorts::new(Instant::now()),
            own_ports: BTreeMap::new(),
            known_services: HashMap::new(),
        }
    }

    /// The server knows `services` of those of the unclaimed instances
    /// (its answer to their report, which replaces the last one): their
    /// instances wait only [`SupervisorConfig::claim_grace`] more for
    /// adoption, counted from the first answer that named the service.
    pub fn services_known(&mut self, services: &std::collections::BTreeSet<String>) {
        let now = now_millis();
        self.known_services
            .retain(|service, _| services.contains(service));
        for service in services {
            self.known_services.entry(service.clone()).or_insert(now);
        }
    }

    /// Whether the unclaimed `run` still waits for adoption at `now`.
    fn awaits_adoption(&self, run: &UnclaimedRun, now: Millis) -> bool {
        let known = self
            .known_services
            .get(&run.assignment.instance.service)
            .copied();
        awaits_adoption(&self.config, run.since, known, now)
    }

    /// Probes every host port with `probe` before an instance on the
    /// host's network starts (see [`crate::host_ports`]).
    #[must_use]
    pub fn with_port_probe(mut self, probe: Arc<dyn PortProbe>) -> Self {
        self.port_probe = Some(probe);
        self
    }

    /// Notified whenever a start running in the background ends: tick then.
    pub fn started(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.started)
    }

    /// When the next quick startup probe is due, if one is: tick then.
    pub fn next_probe_at(&self) -> Option<Instant> {
        self.quick_probe_at
    }

    /// Starts instances only once the node network is up, each with the
    /// node's cluster DNS as its resolver.
    #[must_use]
    pub fn with_node_net(mut self, node_net: Arc<NodeNet>) -> Self {
        self.node_net = Some(node_net);
        self
    }

    /// Keeps volume directories under `dir` (created as needed).
    #[must_use]
    pub fn with_volumes_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.volumes_dir = Some(dir.into());
        self
    }

    /// Writes instances' secret and connection files under `dir` (created
    /// as needed), fetched from `source`.
    #[must_use]
    pub fn with_files(mut self, dir: impl Into<PathBuf>, source: Arc<dyn FileSource>) -> Self {
        self.files = Some((dir.into(), source));
        self
    }

    /// Removes an instance's files, if it has any.
    fn remove_files(&self, id: &str) {
        if let Some((root, _)) = &self.files
            && let Err(error) = files::remove(root, id)
        {
            tracing::warn!(instance = %id, %error, "removing the instance's files failed");
        }
    }

    /// One pass: act on every difference, then describe every instance.
    pub async fn tick(&mut self, desired: &Desired) -> Tick {
        let now = Instant::now();
        self.collect_finished_starts().await;
        let actual = self.actual().await;
        self.own_ports = actual
            .values()
            .filter(|status| status.state == RtState::Running)
            .flat_map(|status| {
                status
                    .spec
                    .ports
                    .iter()
                    .map(|port| (port.host_port, status.id.clone()))
            })
            .collect();
        if let Some(probe) = &self.port_probe {
            self.held.recheck(probe.as_ref(), now);
        }
        for (id, assignment) in &desired.assignments {
            self.converge(id, assignment, actual.get(id), now).await;
        }
        let mut tick = Tick {
            held_ports: self.port_probe.as_ref().map(|_| self.held.ports()),
            ..Tick::default()
        };
        if desired.known {
            let wall = now_millis();
            tick.unclaimed = desired
                .unclaimed
                .iter()
                .filter(|(id, run)| {
                    self.awaits_adoption(run, wall)
                        && actual
                            .get(*id)
                            .is_some_and(|status| status.state == RtState::Running)
                })
                .map(|(_, run)| unclaimed_instance(&run.assignment))
                .collect();
            // An init step runs as an instance of its own, `{id}.init-{step}`,
            // while its instance's start task waits for it: not an orphan.
            let orphans: Vec<&String> = actual
                .keys()
                .filter(|id| !desired.assignments.contains_key(*id))
                .filter(|id| {
                    desired
                        .unclaimed
                        .get(*id)
                        .is_none_or(|run| !self.awaits_adoption(run, wall))
                })
                .filter(|id| {
                    !id.split_once(".init-")
                        .is_some_and(|(main, _)| self.starting.contains_key(main))
                })
                .collect();
            for id in orphans {
                if self.remove_orphan(id).await {
                    tick.removed.push(id.clone());
                }
            }
            // An instance that failed before the runtime had it (a pull, a
            // create) and is no longer assigned: only its record is left.
            let never_created: Vec<String> = self
                .records
                .keys()
                .filter(|id| {
                    !desired.assignments.contains_key(*id)
                        && !actual.contains_key(*id)
                        && !self.starting.contains_key(*id)
                })
                .cloned()
                .collect();
            for id in never_created {
                self.records.remove(&id);
                self.remove_files(&id);
                tick.removed.push(id);
            }
        }
        let actual = self.actual().await;
        self.probe_health(desired, &actual).await;
        for (id, assignment) in &desired.assignments {
            tick.statuses.push(self.status(assignment, actual.get(id)));
        }
        tick
    }

    /// Stops every instance (used by `cca dev` on exit); agents normally
    /// leave workloads running when they stop.
    pub async fn stop_all(&mut self) {
        for handle in self.starting.values() {
            handle.abort();
        }
        let actual = self.actual().await;
        for (id, status) in actual {
            if status.state == RtState::Running
                && let Err(error) = self.runtime.stop(&id, self.config.stop_grace).await
            {
                tracing::warn!(instance = %id, %error, "stopping failed");
            }
            if let Err(error) = self.runtime.remove(&id).await {
                tracing::warn!(instance = %id, %error, "removing failed");
            }
            self.remove_files(&id);
        }
    }

    async fn actual(&self) -> BTreeMap<String, RtStatus> {
        match self.runtime.list().await {
            Ok(list) => list
                .into_iter()
                .map(|status| (status.id.clone(), status))
                .collect(),
            Err(error) => {
                tracing::warn!(%error, "listing the runtime's instances failed");
                BTreeMap::new()
            }
        }
    }

    async fn collect_finished_starts(&mut self) {
        let finished: Vec<String> = self
            .starting
            .iter()
            .filter(|(_, handle)| handle.is_finished())
            .map(|(id, _)| id.clone())
            .collect();
        for id in finished {
            self.start_notes.remove(&id);
            let Some(handle) = self.starting.remove(&id) else {
                continue;
            };
            let outcome = handle.await.unwrap_or_else(|err| {
                Err(StartProblem::Failed(format!("start task failed: {err}")))
            });
            let now = Instant::now();
            let config = &self.config;
            let record = self
                .records
                .entry(id.clone())
                .or_insert_with(|| Record::new(now));
            match outcome {
                Ok(()) => {
                    record.waiting = None;
                    record.file_attempts = 0;
                    // Its startup probes count from the process's start,
                    // not from the assignment (a pull may take minutes).
                    record.health = HealthTracker::new(now);
                    tracing::debug!(instance = %id, "started");
                }
                Err(StartProblem::Failed(problem)) => {
                    tracing::warn!(instance = %id, %problem, "start failed");
                    record.failed = Some(problem);
                }
                Err(StartProblem::Retry(problem)) => {
                    record.file_attempts += 1;
                    let backoff = restart::backoff(config, record.file_attempts);
                    tracing::warn!(instance = %id, %problem, ?backoff, "cannot start yet");
                    record.waiting = Some(format!(
                        "cannot start: {problem}; retrying in {}s",
                        backoff.as_secs_f64().ceil()
                    ));
                    record.next_start_at = Some(now + backoff);
                }
            }
        }
    }

    async fn converge(
        &mut self,
        id: &str,
        assignment: &Assignment,
        actual: Option<&RtStatus>,
        now: Instant,
    ) {
        if self.starting.contains_key(id) {
            return;
        }
        let record = self
            .records
            .entry(id.to_owned())
            .or_insert_with(|| Record::new(now));
        let placed_at = assignment.instance.created_at;
        if record.placed_at != Some(placed_at) {
            if record.placed_at.is_some() && record.failed.is_some() && actual.is_none() {
                // Placed again under the same id (a stateful instance
                // whose first placement failed before it was created):
                // a new start.
                *record = Record::new(now);
            }
            record.placed_at = Some(placed_at);
        }
        if assignment.instance.stopping {
            // Drained first: no new flow reaches it once this node's VIP
            // rules have dropped it (the endpoint controller drops a
            // stopping instance at once), so the stop only ends flows that
            // were already under way.
            let target = self.node_net.as_ref().is_some_and(|net| net.is_target(id));
            let since = *record.draining_since.get_or_insert(now);
            if target && now.duration_since(since) < DRAIN_MAX {
                return;
            }
            if actual.is_some_and(|status| status.state == RtState::Running)
                && let Err(error) = self.runtime.stop(id, self.config.stop_grace).await
            {
                tracing::warn!(instance = %id, %error, "stop failed");
            }
            return;
        }
        if record.failed.is_some() {
            return;
        }
        match actual.map(|status| status.state) {
            None | Some(RtState::Created) => {
                // Waiting for its files: not before the backoff is over.
                if !restart::start_due(record.next_start_at, now) {
                    return;
                }
                record.next_start_at = None;
                self.begin_start(id, assignment);
            }
            Some(RtState::Running) => {
                if let Some(status) = actual {
                    let wanted = limits_of(assignment);
                    let refused = record.resize_refused.as_ref().map(|(limits, _)| *limits);
                    if Limits::of(&status.spec) == wanted {
                        record.resize_refused = None;
                    } else if refused != Some(wanted) {
                        let result = self.runtime.resize(id, wanted).await;
                        record_resize(record, id, wanted, result);
                    }
                }
                if record.health.healthy == Some(false) {
                    let reason = record.health.last_failure.clone().unwrap_or_default();
                    tracing::warn!(instance = %id, %reason, "unhealthy; restarting");
                    record.health = HealthTracker::new(now);
                    if let Err(error) = self.runtime.stop(id, self.config.stop_grace).await {
                        tracing::warn!(instance = %id, %error, "stopping an unhealthy instance failed");
                    }
                }
            }
            Some(RtState::Exited) => {
                if let Some(status) = actual {
                    self.handle_exit(id, status, now).await;
                }
            }
        }
    }

    /// A run ended: remember how, then restart after a backoff, or give up
    /// after too many quick crashes.
    async fn handle_exit(&mut self, id: &str, status: &RtStatus, now: Instant) {
        let tail = self.log_tail(id).await;
        let config = self.config.clone();
        let Some(record) = self.records.get_mut(id) else {
            return;
        };
        if record.handled_run != status.started_at_ms {
            record.handled_run = status.started_at_ms;
            record.last_exit = status.exit.as_ref().map(|exit| model_exit(exit, tail));
            let ran_for = match (status.started_at_ms, status.exit.as_ref()) {
                (Some(start), Some(exit)) => {
                    Duration::from_millis(u64::try_from(exit.finished_at_ms - start).unwrap_or(0))
                }
                _ => Duration::ZERO,
            };
            match restart::after_exit(&config, record.crash_streak, ran_for, now) {
                AfterExit::GiveUp { streak } => {
                    record.crash_streak = streak;
                    let exit = status
                        .exit
                        .as_ref()
                        .map_or_else(|| "exited".to_owned(), ToString::to_string);
                    record.failed = Some(format!(
                        "{exit}; gave up after {streak} consecutive crashes"
                    ));
                    return;
                }
                AfterExit::RestartAt { streak, at } => {
                    record.crash_streak = streak;
                    record.next_start_at = Some(at);
                    record.health = HealthTracker::new(now);
                }
            }
        }
        if restart::restart_due(record.next_start_at, now) {
            record.next_start_at = None;
            if let Some(probe) = &self.port_probe {
                let everywhere = published_everywhere(&status.spec, self.node_net.is_some());
                let ports = PortCheck {
                    probe: probe.as_ref(),
                    own: &self.own_ports,
                    held: &mut self.held,
                    address: &self.address,
                };
                match ports.problem(id, &status.spec.ports, everywhere) {
                    Some(StartProblem::Failed(problem)) => {
                        record.failed = Some(problem);
                        return;
                    }
                    Some(StartProblem::Retry(problem)) => {
                        record.waiting = Some(problem);
                        record.next_start_at = Some(now + NETWORK_WAIT);
                        return;
                    }
                    None => {}
                }
            }
            match self.runtime.start(id).await {
                Ok(()) => {
                    record.restarts += 1;
                    record.waiting = None;
                }
                // The node network is not back yet (agent restarted before
                // its subnet was known): not the instance's failure.
                Err(error @ cca_runtime::Error::NotYet { .. }) => {
                    record.waiting = Some(error.to_string());
                    record.next_start_at = Some(now + NETWORK_WAIT);
                }
                Err(error) => record.failed = Some(format!("restart failed: {error}")),
            }
        }
    }

    /// Creates (when needed), runs init steps, and starts, in the background.
    fn begin_start(&mut self, id: &str, assignment: &Assignment) {
        if let Some(waiting) = self.node_net.as_ref().and_then(|net| net.waiting()) {
            if let Some(record) = self.records.get_mut(id) {
                record.waiting = Some(waiting.to_owned());
                record.next_start_at = Some(Instant::now() + NETWORK_WAIT);
            }
            return;
        }
        let spec = match self.instance_spec(assignment) {
            Ok(spec) => spec,
            Err(problem) => {
                if let Some(record) = self.records.get_mut(id) {
                    record.failed = Some(problem);
                }
                return;
            }
        };
        if let Some(probe) = &self.port_probe {
            let everywhere = published_everywhere(&spec, self.node_net.is_some());
            let ports = PortCheck {
                probe: probe.as_ref(),
                own: &self.own_ports,
                held: &mut self.held,
                address: &self.address,
            };
            let problem = ports.problem(id, &spec.ports, everywhere);
            if let (Some(problem), Some(record)) = (problem, self.records.get_mut(id)) {
                match problem {
                    StartProblem::Failed(problem) => record.failed = Some(problem),
                    StartProblem::Retry(problem) => {
                        record.waiting = Some(problem);
                        record.next_start_at = Some(Instant::now() + NETWORK_WAIT);
                    }
                }
                return;
            }
        }
        let init = assignment
            .spec
            .as_ref()
            .map(|service| service.init.clone())
            .unwrap_or_default();
        let fetch = self
            .files
            .as_ref()
            .filter(|_| files::needed(assignment))
            .map(|(root, source)| FileFetch {
                root: root.clone(),
                source: Arc::clone(source),
                node: self.node.clone(),
            });
        let runtime = Arc::clone(&self.runtime);
        let started = Arc::clone(&self.started);
        let note = StartNote::default();
        let steps = InitSteps {
            steps: init,
            probes: assignment.probes.clone(),
            node_net: self.node_net.clone(),
            note: note.clone(),
        };
        tracing::debug!(instance = %id, "starting");
        let task = tokio::spawn(async move {
            let outcome = start_instance(runtime, spec, steps, fetch).await;
            started.notify_one();
            outcome
        });
        self.starting.insert(id.to_owned(), task);
        self.start_notes.insert(id.to_owned(), note);
    }

    /// The runtime spec of an assignment.
    fn instance_spec(&self, assignment: &Assignment) -> Result<InstanceSpec, String> {
        let instance = &assignment.instance;
        let service = assignment.spec.as_ref().ok_or_else(|| {
            format!(
                "service `{}` has no spec (being deleted?)",
                instance.service
            )
        })?;
        // Which runtime runs it is the runtime's business (see
        // `RuntimeSet`): the spec only says whether it is an image.
        let is_image = matches!(service.workload, Workload::Image { .. });
        let (command, image) = match &service.workload {
            Workload::Process { run } => (run.clone(), None),
            Workload::Image { image, command } => {
                (command.clone().unwrap_or_default(), Some(image.clone()))
            }
        };
        let mut spec = InstanceSpec::new(&instance.id, &instance.service, command);
        spec.image = image;
        spec.node = self.node.clone();
        spec.host_network = service.host_network;
        spec.dns = self
            .node_net
            .as_ref()
            .and_then(|net| net.ready())
            .map(|ready| ready.dns);
        spec.env = self.base_env.clone();
        // Instances of nodes sharing a host (tests, several agents on one
        // machine) bind their node's address, not every address.
        spec.env
            .insert("CCA_ADDRESS".to_owned(), self.address.clone());
        spec.env.extend(service.env.clone());
        spec.ports = port_bindings(service, &instance.host_ports)?;
        limits_of(assignment).set_on(&mut spec);
        if files::needed(assignment) {
            let Some((root, _)) = &self.files else {
                return Err(format!(
                    "service `{}` uses connections or secrets, and this agent has no files directory",
                    instance.service
                ));
            };
            let dir = files::instance_dir(root, &instance.id);
            for (kind, name) in files::expected(assignment) {
                let seen_at = if is_image {
                    format!("/run/{kind}/{name}")
                } else {
                    dir.join(kind).join(&name).display().to_string()
                };
                spec.env.insert(files::env_name(kind, &name), seen_at);
            }
            if is_image {
                for (kind, _) in files::KINDS {
                    spec.mounts.push(Mount {
                        source: dir.join(kind),
                        target: format!("/run/{kind}"),
                        read_only: true,
                        owned_by_workload: true,
                    });
                }
            }
        }
        for volume in &service.volumes {
            let dir = self.volume_dir(instance, &volume.name)?;
            if is_image {
                spec.mounts.push(Mount {
                    source: dir,
                    target: volume.path.clone(),
                    read_only: false,
                    owned_by_workload: false,
                });
            } else {
                // A host process has no filesystem of its own to mount
                // into: it is told where its volume is.
                spec.env
                    .insert(volume_env_name(&volume.name), dir.display().to_string());
            }
        }
        Ok(spec)
    }

    /// The directory of one of an instance's volumes, created when missing
    /// (the runtime refuses a mount source that does not exist).
    fn volume_dir(
        &self,
        instance: &cca_model::cluster::Instance,
        volume: &str,
    ) -> Result<PathBuf, String> {
        let Some(root) = &self.volumes_dir else {
            return Err(format!(
                "volume `{volume}`: this agent has no volume directory"
            ));
        };
        for name in [instance.service.as_str(), volume] {
            if !is_path_segment(name) {
                return Err(format!(
                    "volume `{volume}` of service `{}`: {name:?} cannot name a directory",
                    instance.service
                ));
            }
        }
        let leaf = match instance.ordinal {
            Some(ordinal) => format!("{volume}-{ordinal}"),
            None => volume.to_owned(),
        };
        let dir = root.join(&instance.service).join(leaf);
        std::fs::create_dir_all(&dir)
            .map_err(|err| format!("volume `{volume}`: cannot create {}: {err}", dir.display()))?;
        Ok(dir)
    }

    async fn remove_orphan(&mut self, id: &str) -> bool {
        if let Some(task) = self.starting.remove(id) {
            task.abort();
        }
        self.start_notes.remove(id);
        self.records.remove(id);
        let stopped = self.runtime.stop(id, self.config.stop_grace).await;
        if let Err(error) = stopped.and(self.runtime.remove(id).await) {
            tracing::warn!(instance = %id, %error, "removing an orphan failed");
            return false;
        }
        self.remove_files(id);
        tracing::info!(instance = %id, "removed an instance no assignment claims");
        true
    }

    async fn log_tail(&self, id: &str) -> Vec<String> {
        let options = LogOptions {
            tail: Some(self.config.log_tail),
            follow: false,
        };
        match self.runtime.logs(id, options).await {
            Ok(stream) => stream.collect().await.unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    async fn probe_health(&mut self, desired: &Desired, actual: &BTreeMap<String, RtStatus>) {
        let now = Instant::now();
        let mut probes = tokio::task::JoinSet::new();
        for (id, assignment) in &desired.assignments {
            let Some(check) = assignment
                .spec
                .as_ref()
                .and_then(|spec| spec.health.clone())
            else {
                continue;
            };
            let running = actual
                .get(id)
                .is_some_and(|status| status.state == RtState::Running);
            let Some(record) = self.records.get(id) else {
                continue;
            };
            // A start not yet collected resets the tracker when it is: a
            // probe before that would be forgotten (or flip a pass back).
            if !running
                || record.health.next_probe_at > now
                || assignment.instance.stopping
                || self.starting.contains_key(id)
            {
                continue;
            }
            let status = actual.get(id);
            let own = status.and_then(|status| status.spec.network.as_ref());
            let target = probe_target(&check.probe, assignment, &self.address, own);
            // On the host's network, a listener there may be another
            // program's (see `host_ports`): asked once per run and port.
            let owner_check = match (&self.port_probe, status.and_then(|s| s.pid), &target) {
                (Some(probe), Some(pid), Some(target))
                    if own.is_none() && record.own_listener != Some((pid, target.port)) =>
                {
                    Some((Arc::clone(probe), pid))
                }
                _ => None,
            };
            let runtime = Arc::clone(&self.runtime);
            let id = id.clone();
            probes.spawn(async move {
                let mut result = health::probe(&check, target.clone(), &runtime, &id).await;
                let mut own_listener = None;
                if let (Ok(()), Some((probe, pid)), Some(target)) = (&result, owner_check, target) {
                    match listener_owner(probe, &target, pid).await {
                        ListenerOwner::Instance => own_listener = Some((pid, target.port)),
                        ListenerOwner::Other => {
                            result = Err(format!(
                                "{}:{} answers, but its listener is not this instance's: \
                                 something outside the cluster holds the host port",
                                target.address, target.port
                            ));
                        }
                        ListenerOwner::Unknown => {}
                    }
                }
                (id, check, result, own_listener)
            });
        }
        while let Some(Ok((id, check, result, own_listener))) = probes.join_next().await {
            if let Some(record) = self.records.get_mut(&id) {
                if own_listener.is_some() {
                    record.own_listener = own_listener;
                }
                let was = record.health.healthy;
                let now = Instant::now();
                record.health.record(&check, result, now);
                if was != Some(true) && record.health.healthy == Some(true) {
                    tracing::debug!(
                        instance = %id,
                        after_start_ms = (now - record.health.started).as_millis() as u64,
                        "first health probe passed"
                    );
                }
            }
        }
        let now = Instant::now();
        self.quick_probe_at = desired
            .assignments
            .iter()
            .filter(|(_, assignment)| !assignment.instance.stopping)
            .filter_map(|(id, assignment)| {
                let check = assignment.spec.as_ref()?.health.as_ref()?;
                let running = actual
                    .get(id)
                    .is_some_and(|status| status.state == RtState::Running);
                let health = &self.records.get(id)?.health;
                (running && health.in_startup(check, now)).then_some(health.next_probe_at)
            })
            .min();
    }

    /// The observed status of one assigned instance.
    fn status(&self, assignment: &Assignment, actual: Option<&RtStatus>) -> InstanceStatus {
        let instance = &assignment.instance;
        let record = self.records.get(&instance.id);
        let has_health = assignment
            .spec
            .as_ref()
            .is_some_and(|spec| spec.health.is_some());
        let healthy = record.and_then(|record| record.health.healthy);
        let running = actual.is_some_and(|status| status.state == RtState::Running);
        let (state, message) =
            if let Some(problem) = record.and_then(|record| record.failed.clone()) {
                (InstanceState::Failed, Some(problem))
            } else if instance.stopping {
                (
                    if running {
                        InstanceState::Stopping
                    } else {
                        InstanceState::Stopped
                    },
                    None,
                )
            } else if self.starting.contains_key(&instance.id) {
                let note = self.start_notes.get(&instance.id).and_then(StartNote::get);
                (InstanceState::Starting, note)
            } else if let Some(waiting) = record
                .and_then(|record| record.waiting.clone())
                .filter(|_| actual.is_none_or(|status| status.state == RtState::Created))
            {
                (InstanceState::Pending, Some(waiting))
            } else {
                match actual.map(|status| status.state) {
                    None => (InstanceState::Pending, None),
                    Some(RtState::Created) => (InstanceState::Starting, None),
                    Some(RtState::Running) if has_health && healthy != Some(true) => (
                        InstanceState::Starting,
                        record.and_then(|record| record.health.last_failure.clone()),
                    ),
                    Some(RtState::Running) => (
                        InstanceState::Running,
                        record.and_then(|record| {
                            record.resize_refused.as_ref().map(|(_, why)| why.clone())
                        }),
                    ),
                    Some(RtState::Exited) => (InstanceState::Restarting, None),
                }
            };
        let own_network = actual.and_then(|status| status.spec.network.as_ref());
        InstanceStatus {
            id: instance.id.clone(),
            service: instance.service.clone(),
            node: self.node.clone(),
            state,
            healthy: if has_health { healthy } else { None },
            pid: actual.filter(|_| running).and_then(|status| status.pid),
            // An instance with its own network is reached at its own
            // address; the others at the node's.
            address: Some(
                own_network.map_or_else(|| self.address.clone(), |net| net.address.to_string()),
            ),
            own_network: own_network.is_some(),
            host_ports: instance.host_ports.clone(),
            restarts: record.map_or(0, |record| record.restarts),
            last_exit: record.and_then(|record| record.last_exit.clone()),
            message,
            updated_at: 0,
        }
    }
}

/// The limits an instance runs with: what vertical autoscaling sized it
/// to, else its spec's `resources`.
fn limits_of(assignment: &Assignment) -> Limits {
    let resources = assignment
        .instance
        .resized
        .as_ref()
        .or(assignment.spec.as_ref().map(|spec| &spec.resources));
    Limits {
        cpu_millis: resources.and_then(|r| r.cpu).map(|cpu| cpu.0),
        memory_bytes: resources.and_then(|r| r.memory).map(|memory| memory.0),
    }
}

/// Notes how an in-place resize went: a refusal is kept (and shown in
/// the instance's status) so it is not retried every tick.
fn record_resize(record: &mut Record, id: &str, wanted: Limits, result: cca_runtime::Result<()>) {
    match result {
        Ok(()) => {
            tracing::info!(instance = %id, ?wanted, "resized in place");
            record.resize_refused = None;
        }
        Err(error) => {
            tracing::warn!(instance = %id, %error, "resize refused; the limits apply at the next start");
            record.resize_refused = Some((
                wanted,
                format!("new limits apply at the next start: {error}"),
            ));
        }
    }
}

/// Whether an instance's host ports are published on every address of the
/// node (a container in its own network namespace, on a node in the
/// cluster network) rather than bound by the instance on the node's
/// address.
fn published_everywhere(spec: &InstanceSpec, node_network: bool) -> bool {
    spec.image.is_some() && !spec.host_network && node_network
}

/// The probe of an instance's host ports before it starts.
struct PortCheck<'a> {
    probe: &'a dyn PortProbe,
    /// Host ports of this node's running instances, and whose.
    own: &'a BTreeMap<u16, String>,
    held: &'a mut HeldPorts,
    /// The node's address.
    address: &'a str,
}

impl PortCheck<'_> {
    /// Why instance `id` cannot start on `ports` now, if it cannot: a port
    /// held outside the cluster fails it (and is recorded held), one
    /// another instance of this node holds makes it wait.
    fn problem(self, id: &str, ports: &[PortBinding], everywhere: bool) -> Option<StartProblem> {
        let address = host_ports::probe_address(self.address, everywhere);
        for port in ports {
            if let Some(other) = self.own.get(&port.host_port).filter(|other| *other != id) {
                return Some(StartProblem::Retry(format!(
                    "host port {}/{} is still held by instance {other} on this node; \
                     starting once it is free",
                    port.host_port, port.protocol
                )));
            }
            if self.probe.is_held(address, port.host_port, port.protocol) {
                tracing::warn!(
                    instance = %id,
                    port = port.host_port,
                    protocol = %port.protocol,
                    %address,
                    "a host port is held by something outside the cluster"
                );
                self.held.insert(port.host_port, address, port.protocol);
                return Some(StartProblem::Failed(format!(
                    "host port {}/{} on {address} is held by something outside the cluster \
                     (another program on this machine, or another cluster's instance); \
                     the scheduler places the instance again on other ports",
                    port.host_port, port.protocol
                )));
            }
        }
        None
    }
}

/// Creates the instance if needed, runs its init steps to completion in
/// order, then starts it.
/// `CCA_VOLUME_{NAME}`: the volume name upper-cased, other characters as
/// `_` (as ports are named).
pub fn volume_env_name(name: &str) -> String {
    format!("CCA_VOLUME_{}", cca_runtime::env_name_part(name))
}

/// Whether `name` is one directory name: a `/` or `..` would put the volume
/// elsewhere on the host.
fn is_path_segment(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// Where an instance's files come from and go, for its start task.
struct FileFetch {
    root: PathBuf,
    source: Arc<dyn FileSource>,
    node: String,
}

/// An instance's init steps, where their probes dial, and the note they
/// leave for its status.
struct InitSteps {
    steps: Vec<cca_model::spec::InitStep>,
    probes: BTreeMap<String, cca_wire::types::ProbeAddress>,
    /// Where a probe finds a VIP its assignment did not carry.
    node_net: Option<Arc<NodeNet>>,
    note: StartNote,
}

async fn start_instance(
    runtime: Arc<dyn Runtime>,
    spec: InstanceSpec,
    init: InitSteps,
    fetch: Option<FileFetch>,
) -> Result<(), StartProblem> {
    let id = spec.id.clone();
    match runtime.inspect(&id).await {
        // A restart: with the limits it has now (vertical autoscaling may
        // have resized it since it was created).
        Ok(status) if Limits::of(&status.spec) != Limits::of(&spec) => {
            runtime
                .resize(&id, Limits::of(&spec))
                .await
                .map_err(|error| StartProblem::Failed(error.to_string()))?;
        }
        Ok(_) => {}
        Err(_) => {
            if let Some(fetch) = fetch {
                let fetched = fetch
                    .source
                    .files(&fetch.node, &id)
                    .await
                    .map_err(|problem| {
                        StartProblem::Retry(format!("fetching its files failed: {problem}"))
                    })?;
                let (root, id) = (fetch.root.clone(), id.clone());
                tokio::task::spawn_blocking(move || files::write(&root, &id, &fetched))
                    .await
                    .map_err(|error| format!("writing the files failed: {error}"))?
                    .map_err(StartProblem::Retry)?;
            }
            runtime
                .create(spec.clone())
                .await
                .map_err(|error| match error {
                    cca_runtime::Error::NotYet { .. } => StartProblem::Retry(error.to_string()),
                    error => StartProblem::Failed(error.to_string()),
                })?;
        }
    }
    // Init steps run in the instance's own network namespace when it has
    // one (the runtime attached it at create), as a pod's init containers do.
    let mut main = spec.clone();
    if !init.steps.is_empty() {
        main.network = runtime
            .inspect(&id)
            .await
            .ok()
            .and_then(|status| status.spec.network.clone());
    }
    for step in &init.steps {
        let node_net = init.node_net.as_deref();
        crate::init::run_step(&runtime, &main, step, &init.probes, node_net, &init.note).await?;
    }
    match runtime.start(&id).await {
        // Running already: a start an earlier agent began (it died or was
        // restarted meanwhile) finished in between. Adopted, not failed.
        Err(cca_runtime::Error::InvalidState {
            state: cca_runtime::InstanceState::Running,
            ..
        }) => Ok(()),
        outcome => outcome.map_err(|err| StartProblem::Failed(err.to_string())),
    }
}

/// The host port of each service port, in declaration order.
fn port_bindings(
    service: &ServiceSpec,
    host_ports: &BTreeMap<String, u16>,
) -> Result<Vec<PortBinding>, String> {
    service
        .ports
        .iter()
        .map(|port| {
            let name = port.name.clone().unwrap_or_else(|| port.number.to_string());
            let host_port = *host_ports
                .get(&name)
                .ok_or_else(|| format!("no host port was assigned for port `{name}`"))?;
            Ok(PortBinding {
                name,
                host_port,
                container_port: Some(port.number),
                protocol: match port.protocol {
                    cca_model::spec::Protocol::Tcp => cca_runtime::Protocol::Tcp,
                    cca_model::spec::Protocol::Udp => cca_runtime::Protocol::Udp,
                },
            })
        })
        .collect()
}

/// Whose is the listener at `target` (procfs reads, off the runtime).
async fn listener_owner(
    probe: Arc<dyn PortProbe>,
    target: &ProbeTarget,
    pid: u32,
) -> ListenerOwner {
    let Ok(address) = target.address.parse() else {
        return ListenerOwner::Unknown;
    };
    let port = target.port;
    tokio::task::spawn_blocking(move || probe.listener_owner(address, port, pid))
        .await
        .unwrap_or(ListenerOwner::Unknown)
}

/// Where an HTTP or TCP probe connects: an instance with its own network
/// at its address and the probe's port itself; others at the node address
/// and the host port bound to the probe's service port (or the port itself
/// when the service does not declare it).
fn probe_target(
    probe: &Probe,
    assignment: &Assignment,
    address: &str,
    own: Option<&NetworkAttachment>,
) -> Option<ProbeTarget> {
    let port = match probe {
        Probe::Http { port, .. } | Probe::Tcp { port } => *port,
        Probe::Exec { .. } => return None,
    };
    if let Some(own) = own {
        return Some(ProbeTarget {
            address: own.address.to_string(),
            port,
        });
    }
    let service = assignment.spec.as_ref()?;
    let host_port = service
        .ports
        .iter()
        .find(|spec| spec.number == port)
        .and_then(|spec| {
            let name = spec.name.clone().unwrap_or_else(|| spec.number.to_string());
            assignment.instance.host_ports.get(&name).copied()
        })
        .unwrap_or(port);
    Some(ProbeTarget {
        address: address.to_owned(),
        port: host_port,
    })
}

fn model_exit(exit: &cca_runtime::ExitInfo, log_tail: Vec<String>) -> ExitInfo {
    let reason = match &exit.reason {
        ExitReason::Exited => "exited",
        ExitReason::Stopped => "stopped",
        ExitReason::OutOfMemory { .. } => "oom_killed",
        ExitReason::AgentAway => "ended_while_agent_away",
        ExitReason::FailedToStart { .. } => "start_failed",
    };
    ExitInfo {
        code: exit.code,
        signal: exit.signal,
        reason: reason.to_owned(),
        at: exit.finished_at_ms,
        log_tail,
    }
}
