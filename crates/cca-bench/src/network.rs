//! The `network` scenario: time from an endpoint change to every node's
//! rules updated. N services with a port and a few instances each are
//! deployed on the simulated nodes (their agents report them running, so
//! the endpoint controller writes real endpoints and the network
//! controller real VIPs); then K observer nodes follow the API's network
//! stream with the agent's own follower (`cca_agent::netmap::
//! follow_network`) and each drives a real [`DataPlane`] on `nft` in a
//! network namespace of its own, as a node's agent does. An endpoint
//! change is one instance of a random service stopped in its node's
//! runtime: its agent notices and reports it, the endpoint controller
//! drops the backend, the network stream carries it, every observer syncs
//! its table.
//!
//! t0 is when the agent's report of the stopped instance is committed:
//! the moment the harness's watch of the store delivers it (the store
//! publishes a commit to its watchers before it answers the writer, so
//! this is no later than the API's answer to the agent). t1, per observer,
//! is when its `DataPlane::sync` of the first map without that backend
//! returned. A change counts the slowest observer (the "every node"
//! time). The changes are spaced: the next starts once every observer has
//! the stopped instance back (its agent restarts it after a backoff) and
//! a short random gap has passed. Every observer's sync time during the
//! changes is the machine's own limit for the node's part.
//!
//! Needs root (namespaces, nftables): without it the scenario refuses to
//! start and says so. The namespaces are removed on every way out.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use cca_agent::netmap::{NetworkView, follow_network};
use cca_model::cluster::{InstanceState, InstanceStatus};
use cca_model::net::{NetworkMap, Target};
use cca_model::spec::Program;
use cca_net::dataplane::{DataPlane, DataPlaneConfig, Nft};
use cca_store::{Store, WatchEvent, WatchMessage};
use cca_wire::Client;
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::BenchError;
use crate::cluster::Cluster;
use crate::scenario::{BenchConfig, Outcome, Progress, converge};
use crate::stats::Summary;
use crate::tracker::Tracker;
use crate::workload::{INSTANCE_CPU_MILLIS, INSTANCE_MEMORY_MIB};

/// The port every benchmark service declares (its endpoints' key).
const PORT: &str = "http";
/// Longest wait for every observer to see one change.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest wait for a stopped instance to be back on every observer (its
/// agent restarts it after a backoff that doubles on quick repeats).
const BACK_TIMEOUT: Duration = Duration::from_secs(60);

/// What the `network` scenario measured, in seconds.
#[derive(Clone, Debug, Serialize)]
pub struct NetworkFigures {
    pub services: usize,
    pub observers: usize,
    /// Changes made.
    pub changes: usize,
    /// Changes some observer did not show within the timeout.
    pub missed: usize,
    /// Per change, t0 to the slowest observer's sync returning.
    pub every_node: Summary,
    /// Per change, t0 to the slowest observer's sync thread taking the
    /// first map without the backend (the control plane's and the
    /// stream's part, plus any wait behind the observer's previous sync).
    pub map_taken: Summary,
    /// Every observer's `DataPlane::sync` during the changes (one
    /// service's elements each): the machine's own limit.
    pub sync: Summary,
    /// nftables commands per sync during the changes (median).
    pub sync_commands_p50: usize,
    /// The slowest observer's first full build of its table.
    pub first_build_seconds: f64,
}

/// The benchmark's services as `.cca` text: `net00000`… with one port
/// and `replicas` instances each.
pub(crate) fn source(services: usize, replicas: u32) -> String {
    let mut text = String::new();
    for index in 0..services {
        text.push_str(&format!(
            "service {} {{\n  run = \"sim\"\n  replicas = {replicas}\n  port {PORT} 8080\n  resources {{\n    cpu = {INSTANCE_CPU_MILLIS}m\n    memory = {INSTANCE_MEMORY_MIB}Mi\n  }}\n}}\n\n",
            service_name(index)
        ));
    }
    text
}

fn service_name(index: usize) -> String {
    format!("net{index:05}")
}

fn program(services: usize, replicas: u32) -> Result<Program, BenchError> {
    let compilation = cca_dsl::compile::compile_str(
        &source(services, replicas),
        &cca_dsl::template::Values::default(),
    );
    if compilation.has_errors() {
        let messages: Vec<String> = compilation
            .diagnostics
            .iter()
            .map(|diagnostic| format!("{diagnostic:?}"))
            .collect();
        return Err(BenchError::Workload(messages.join("; ")));
    }
    Ok(compilation.program)
}

/// Refuses to start without root: observers need namespaces and nftables.
pub(crate) fn check_root() -> Result<(), BenchError> {
    if rustix::process::geteuid().is_root() {
        return Ok(());
    }
    Err(BenchError::Config(
        "the network scenario needs root: each observer node programs nftables in a network \
         namespace of its own; run it as root"
            .into(),
    ))
}

/// Deploys the services, starts the observers, makes the changes.
pub(crate) async fn drive(
    cluster: &Cluster,
    tracker: &Tracker,
    store: &Arc<dyn Store>,
    config: &BenchConfig,
    progress: &dyn Progress,
) -> Result<Outcome, BenchError> {
    let instances = config.services * config.service_replicas as usize;
    let program = program(config.services, config.service_replicas)?;
    progress.phase(
        &format!("deploying {} services", config.services),
        instances as u64,
    );
    let begun = Instant::now();
    cluster.client().apply(&program, false).await?;
    let deployed = converge(
        cluster,
        tracker,
        &HashSet::new(),
        begun,
        instances,
        config,
        progress,
    )
    .await?;
    if deployed.success_rate < 1.0 {
        return Ok(deployed);
    }
    let nodes = cluster.node_names();
    let names: Vec<String> = (0..config.observers)
        .map(|index| {
            nodes
                .get(index)
                .cloned()
                .unwrap_or_else(|| format!("observer-{index}"))
        })
        .collect();
    let mut observers = Vec::new();
    for (index, name) in names.iter().enumerate() {
        // The node's own client: with TLS, only it may follow its map.
        let client = cluster
            .node_tls_client(name)
            .unwrap_or_else(|| Client::new(cluster.client().base_url()));
        observers.push(Observer::start(client, name, index)?);
    }
    let measured = measure(cluster, store, &observers, config, instances, progress).await;
    for observer in observers {
        observer.stop().await;
    }
    let figures = measured?;
    Ok(Outcome {
        seconds: figures.0,
        latencies: figures.1,
        success_rate: figures.2.changes.saturating_sub(figures.2.missed) as f64
            / figures.2.changes.max(1) as f64,
        instances,
        network: Some(figures.2),
        ..Outcome::default()
    })
}

/// Waits for every observer to hold the whole deployment, then makes the
/// changes. Returns the span, the per-change latencies and the figures.
async fn measure(
    cluster: &Cluster,
    store: &Arc<dyn Store>,
    observers: &[Observer],
    config: &BenchConfig,
    instances: usize,
    progress: &dyn Progress,
) -> Result<(f64, Vec<Duration>, NetworkFigures), BenchError> {
    progress.phase("observers building their tables", observers.len() as u64);
    let settled = |map: &NetworkMap| {
        map.services.len() == config.services
            && map
                .services
                .values()
                .map(|service| {
                    service
                        .vip
                        .map_or(0, |_| backends(map, &service.name).len())
                })
                .sum::<usize>()
                == instances
    };
    wait_all(
        observers,
        config.timeout,
        "the observers holding every endpoint",
        |state| state.synced.as_ref().is_some_and(|view| settled(&view.map)),
    )
    .await?;
    let first_build_seconds = observers
        .iter()
        .map(|observer| {
            observer
                .lock()
                .first_build
                .map_or(0.0, |took| took.as_secs_f64())
        })
        .fold(0.0, f64::max);
    for observer in observers {
        observer.lock().syncs.clear();
    }
    let reports = ReportWatch::start(store).await?;
    let mut random = Random(config.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut every_node = Vec::new();
    let mut map_taken = Vec::new();
    let mut missed = 0;
    progress.phase("endpoint changes", config.endpoint_changes as u64);
    let begun = Instant::now();
    for change in 0..config.endpoint_changes {
        let map = observers[0].synced_map().ok_or_else(|| BenchError::Task {
            what: "network observer".into(),
            problem: "no map synced".into(),
        })?;
        let Some((service, target)) = pick(&map, config.service_replicas as usize, &mut random)
        else {
            return Err(BenchError::Task {
                what: "network scenario".into(),
                problem: "no service has all its backends to take one away".into(),
            });
        };
        for observer in observers {
            observer.lock().pending.push(Pending {
                change,
                service: service.clone(),
                instance: target.instance.clone(),
            });
        }
        reports.expect(&target.instance);
        let runtime = cluster
            .runtime(&target.node)
            .ok_or_else(|| BenchError::Task {
                what: "network scenario".into(),
                problem: format!("no simulated node {}", target.node),
            })?;
        cca_runtime::Runtime::stop(runtime.as_ref(), &target.instance, Duration::ZERO)
            .await
            .map_err(|error| BenchError::Task {
                what: "stopping an instance".into(),
                problem: error.to_string(),
            })?;
        let seen = wait_all(
            observers,
            CHANGE_TIMEOUT,
            "every observer seeing a change",
            |state| state.seen.iter().any(|seen| seen.change == change),
        )
        .await;
        let t0 = reports.committed(&target.instance);
        match (seen, t0) {
            (Ok(()), Some(t0)) => {
                let mut slowest = Duration::ZERO;
                let mut slowest_taken = Duration::ZERO;
                for observer in observers {
                    let state = observer.lock();
                    if let Some(seen) = state.seen.iter().find(|seen| seen.change == change) {
                        slowest = slowest.max(seen.synced.saturating_duration_since(t0));
                        slowest_taken = slowest_taken.max(seen.taken.saturating_duration_since(t0));
                    }
                }
                every_node.push(slowest);
                map_taken.push(slowest_taken);
            }
            _ => {
                missed += 1;
                tracing::warn!(change, %service, instance = %target.instance, "change missed");
            }
        }
        for observer in observers {
            observer
                .lock()
                .pending
                .retain(|pending| pending.change != change);
        }
        // Back on every node before the next change, so changes do not
        // pile up; then a gap of 100-300 ms.
        wait_all(
            observers,
            BACK_TIMEOUT,
            "a stopped instance coming back",
            |state| {
                state.synced.as_ref().is_some_and(|view| {
                    backends(&view.map, &service)
                        .iter()
                        .any(|backend| backend.instance == target.instance)
                })
            },
        )
        .await?;
        progress.advance(change as u64 + 1);
        tokio::time::sleep(Duration::from_millis(100 + random.below(200) as u64)).await;
    }
    let seconds = begun.elapsed().as_secs_f64();
    reports.stop();
    let mut syncs = Vec::new();
    let mut commands = Vec::new();
    for observer in observers {
        let state = observer.lock();
        syncs.extend(state.syncs.iter().map(|sample| sample.took));
        commands.extend(state.syncs.iter().map(|sample| sample.commands));
    }
    commands.sort_unstable();
    let figures = NetworkFigures {
        services: config.services,
        observers: observers.len(),
        changes: config.endpoint_changes,
        missed,
        every_node: Summary::of(every_node.clone()),
        map_taken: Summary::of(map_taken),
        sync: Summary::of(syncs),
        sync_commands_p50: commands.get(commands.len() / 2).copied().unwrap_or(0),
        first_build_seconds,
    };
    Ok((seconds, every_node, figures))
}

/// A service with all `replicas` backends and one of them, at random.
fn pick(map: &NetworkMap, replicas: usize, random: &mut Random) -> Option<(String, Target)> {
    for _ in 0..100 {
        let index = random.below(map.services.len().max(1));
        let (name, _) = map.services.iter().nth(index)?;
        let targets = backends(map, name);
        if targets.len() >= replicas && !targets.is_empty() {
            let target = targets[random.below(targets.len())].clone();
            return Some((name.clone(), target));
        }
    }
    None
}

/// The backends of `service`'s benchmark port in `map`.
fn backends<'a>(map: &'a NetworkMap, service: &str) -> &'a [Target] {
    map.services
        .get(service)
        .and_then(|service| service.endpoints.get(PORT))
        .map_or(&[], Vec::as_slice)
}

/// Polls every observer until `done` holds for each, or `timeout`.
async fn wait_all(
    observers: &[Observer],
    timeout: Duration,
    what: &str,
    done: impl Fn(&State) -> bool,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut all = true;
        for observer in observers {
            let state = observer.lock();
            if let Some(problem) = &state.failed {
                return Err(BenchError::Task {
                    what: format!("network observer {}", observer.node),
                    problem: problem.clone(),
                });
            }
            all &= done(&state);
        }
        if all {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(BenchError::Timeout {
                what: what.to_owned(),
                timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A change an observer waits for: `instance` gone from `service`.
#[derive(Debug)]
struct Pending {
    change: usize,
    service: String,
    instance: String,
}

/// When an observer showed a change.
#[derive(Debug)]
struct Seen {
    change: usize,
    /// Its sync thread took the first view without the backend.
    taken: Instant,
    /// The sync of that view returned.
    synced: Instant,
}

#[derive(Debug)]
struct SyncSample {
    took: Duration,
    commands: usize,
}

/// What an observer's sync thread shares with the harness.
#[derive(Debug, Default)]
struct State {
    pending: Vec<Pending>,
    seen: Vec<Seen>,
    syncs: Vec<SyncSample>,
    first_build: Option<Duration>,
    /// The view last synced.
    synced: Option<Arc<NetworkView>>,
    failed: Option<String>,
}

/// A network namespace of the harness's, deleted when dropped.
#[derive(Debug)]
struct Namespace {
    name: String,
}

impl Namespace {
    fn create(name: String) -> Result<Self, BenchError> {
        let namespace = Self { name };
        cca_net::netns::create(&namespace.name).map_err(|error| BenchError::Task {
            what: format!("creating network namespace {}", namespace.name),
            problem: error.to_string(),
        })?;
        Ok(namespace)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if let Err(error) = cca_net::netns::delete(&self.name) {
            tracing::warn!(namespace = %self.name, %error, "removing a benchmark namespace failed");
        }
    }
}

/// One observer node: the agent's network follower and a sync thread in
/// the node's namespace driving its data plane.
struct Observer {
    node: String,
    state: Arc<Mutex<State>>,
    stop: watch::Sender<bool>,
    follower: JoinHandle<()>,
    thread: Option<std::thread::JoinHandle<()>>,
    _data_dir: tempfile::TempDir,
    /// Declared last: removed once the thread is gone.
    _namespace: Namespace,
}

impl Observer {
    fn start(client: Client, node: &str, index: usize) -> Result<Self, BenchError> {
        let namespace = Namespace::create(format!("cca-nb-{}-{index}", std::process::id()))?;
        let data_dir = tempfile::Builder::new()
            .prefix("cca-bench-observer-")
            .tempdir()
            .map_err(BenchError::io("creating an observer's directory"))?;
        let state = Arc::new(Mutex::new(State::default()));
        let (views, mut updates) = watch::channel(Arc::new(NetworkView::default()));
        updates.mark_unchanged();
        let (stop, stopping) = watch::channel(false);
        let follower = tokio::spawn(follow_network(
            client,
            node.to_owned(),
            data_dir.path().to_owned(),
            views,
            stopping,
        ));
        let path = cca_net::netns::path(&namespace.name);
        let handle = tokio::runtime::Handle::current();
        let shared = Arc::clone(&state);
        let name = node.to_owned();
        let thread = std::thread::Builder::new()
            .name(format!("cca-bench-observer-{index}"))
            .spawn(move || {
                let failed = Arc::clone(&shared);
                let entered =
                    cca_net::netns::enter(&path, || sync_loop(&name, &handle, updates, &shared));
                let problem = match entered {
                    Ok(Ok(())) => return,
                    Ok(Err(problem)) => problem,
                    Err(error) => format!("entering {}: {error}", path.display()),
                };
                lock(&failed).failed = Some(problem);
            })
            .map_err(BenchError::io("starting an observer's thread"))?;
        Ok(Self {
            node: node.to_owned(),
            state,
            stop,
            follower,
            thread: Some(thread),
            _data_dir: data_dir,
            _namespace: namespace,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn synced_map(&self) -> Option<NetworkMap> {
        self.lock().synced.as_ref().map(|view| view.map.clone())
    }

    /// Stops the follower (its views end, so the thread ends) and joins.
    async fn stop(mut self) {
        self.stop.send_replace(true);
        if let Err(error) = (&mut self.follower).await {
            tracing::warn!(node = %self.node, %error, "an observer's follower failed");
        }
        if let Some(thread) = self.thread.take() {
            let joined = tokio::task::spawn_blocking(move || thread.join()).await;
            if !matches!(joined, Ok(Ok(()))) {
                tracing::warn!(node = %self.node, "an observer's sync thread panicked");
            }
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The observer's sync thread, inside its namespace: each new view synced
/// into the data plane (only what changed since the last), then the
/// pending changes it shows stamped. Ends when the follower does.
fn sync_loop(
    node: &str,
    handle: &tokio::runtime::Handle,
    mut updates: watch::Receiver<Arc<NetworkView>>,
    state: &Mutex<State>,
) -> Result<(), String> {
    let mut dataplane = DataPlane::new(DataPlaneConfig::new(node), Nft::new())
        .map_err(|error| format!("opening the data plane: {error}"))?;
    let mut applied: Option<Arc<NetworkView>> = None;
    while handle.block_on(updates.changed()).is_ok() {
        let view = Arc::clone(&updates.borrow_and_update());
        let taken = Instant::now();
        let touched = match &applied {
            Some(before) => view.map.touched_since(&before.map),
            None => view.map.everything(),
        };
        let report = dataplane
            .sync(&view.map, &touched)
            .map_err(|error| format!("syncing the data plane: {error}"))?;
        let synced = Instant::now();
        let mut state = lock(state);
        let took = synced.duration_since(taken);
        if report.resynced {
            state.first_build.get_or_insert(took);
        } else if report.commands > 0 {
            state.syncs.push(SyncSample {
                took,
                commands: report.commands,
            });
        }
        let State { pending, seen, .. } = &mut *state;
        pending.retain(|wanted| {
            let gone = !backends(&view.map, &wanted.service)
                .iter()
                .any(|backend| backend.instance == wanted.instance);
            if gone {
                seen.push(Seen {
                    change: wanted.change,
                    taken,
                    synced,
                });
            }
            !gone
        });
        state.synced = Some(Arc::clone(&view));
        applied = Some(view);
    }
    Ok(())
}

/// The harness's watch of agents' instance reports: when the report that
/// an expected instance is no longer running was committed.
struct ReportWatch {
    expected: Arc<Mutex<HashMap<String, Option<Instant>>>>,
    task: JoinHandle<()>,
}

impl ReportWatch {
    async fn start(store: &Arc<dyn Store>) -> Result<Self, BenchError> {
        let prefix = cca_model::keys::observed_instance("");
        let from = store.current_revision().await? + 1;
        let mut stream = store.watch(&prefix, from).await?;
        let expected: Arc<Mutex<HashMap<String, Option<Instant>>>> = Arc::default();
        let seen = Arc::clone(&expected);
        let task = tokio::spawn(async move {
            while let Some(Ok(WatchMessage::Events { events, .. })) = stream.next().await {
                let now = Instant::now();
                let mut expected = seen.lock().unwrap_or_else(PoisonError::into_inner);
                for event in events {
                    let WatchEvent::Put(kv) = event else { continue };
                    let Ok(status) = serde_json::from_slice::<InstanceStatus>(&kv.value) else {
                        continue;
                    };
                    if status.state != InstanceState::Running
                        && let Some(at @ None) = expected.get_mut(&status.id)
                    {
                        *at = Some(now);
                    }
                }
            }
        });
        Ok(Self { expected, task })
    }

    /// From now on, note when `instance`'s next not-running report lands.
    fn expect(&self, instance: &str) {
        self.lock().insert(instance.to_owned(), None);
    }

    fn committed(&self, instance: &str) -> Option<Instant> {
        self.lock().remove(instance).flatten()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Option<Instant>>> {
        self.expected.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stop(self) {
        self.task.abort();
    }
}

/// A small deterministic generator (xorshift64*): which service and which
/// of its instances, and the gaps, replay with the seed.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A draw in `0..bound` (0 when `bound` is 0).
    fn below(&mut self, bound: usize) -> usize {
        if bound == 0 {
            return 0;
        }
        (self.next() % bound as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_services_compile_with_a_port_and_their_replicas() {
        let program = program(3, 2).expect("compiles");
        assert_eq!(program.services.len(), 3);
        let service = program.services.get("net00002").expect("named by index");
        assert_eq!(service.replicas, 2);
        assert_eq!(service.ports.len(), 1);
        assert_eq!(service.ports[0].name.as_deref(), Some(PORT));
    }

    #[test]
    fn draws_stay_below_their_bound_and_replay() {
        let mut first = Random(7);
        let mut second = Random(7);
        let draws: Vec<usize> = (0..1000).map(|_| first.below(10)).collect();
        assert!(draws.iter().all(|draw| *draw < 10));
        assert!(
            (0..10).all(|value| draws.contains(&value)),
            "covers the range"
        );
        assert_eq!(
            draws,
            (0..1000).map(|_| second.below(10)).collect::<Vec<_>>()
        );
        assert_eq!(first.below(0), 0);
    }
}
