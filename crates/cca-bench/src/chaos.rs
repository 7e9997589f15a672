//! The `chaos` scenario: rounds of churn, each with one fault drawn at
//! random (seeded, so a run can be replayed): an agent killed and
//! restarted at once (a crash its service manager recovers), an agent
//! frozen past its lease and then thawed (SIGSTOP and SIGCONT: its
//! instances run on meanwhile and are replaced elsewhere), or the
//! controllers restarted (leadership lost and taken again). Each round
//! scales a few services up or down at the fault's start and times the
//! cluster's convergence from the fault's end: every service runs exactly
//! its replicas, as the nodes' runtimes say, with no instance on two
//! nodes. A sampler watches the runtimes throughout for duplicates:
//! instances running beyond what their service asked in that round.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::BenchError;
use crate::cluster::{Cluster, RunningInstance};
use crate::scenario::{BenchConfig, Outcome, Progress};
use crate::workload::Workload;

/// What the chaos scenario measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ChaosFigures {
    /// Rounds run, and how many of each fault.
    pub rounds: u32,
    pub faults: BTreeMap<String, u32>,
    /// The most instances that ran at once beyond what their services
    /// asked, summed over services, as the runtimes said at any sample
    /// (every 100 ms); a frozen node's instances still running while
    /// their replacements start count here.
    pub max_duplicates: usize,
    /// Of the rounds, the slowest to converge and its fault.
    pub slowest_round: Option<String>,
}

/// One fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// The agent stops and starts again at once; its instances run on.
    AgentKill,
    /// The agent stops for twice the node TTL (its lease expires and its
    /// instances are replaced elsewhere), then starts again.
    AgentFreeze,
    /// The controllers stop (resigning leadership) and start again.
    ServerRestart,
}

impl Fault {
    const ALL: [Fault; 3] = [Fault::AgentKill, Fault::AgentFreeze, Fault::ServerRestart];

    fn name(self) -> &'static str {
        match self {
            Fault::AgentKill => "agent kill",
            Fault::AgentFreeze => "agent freeze",
            Fault::ServerRestart => "server restart",
        }
    }
}

/// How often the sampler reads every runtime.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// How long the controllers stay down in a server restart.
const SERVER_DOWN: Duration = Duration::from_secs(1);

/// Runs `config.chaos_rounds` rounds on the deployed `workload`.
pub(crate) async fn chaos(
    cluster: &mut Cluster,
    workload: &Workload,
    config: &BenchConfig,
    progress: &dyn Progress,
) -> Result<Outcome, BenchError> {
    let mut rng = fastrand::Rng::with_seed(config.seed);
    let original: HashMap<String, u32> = workload.replicas.iter().cloned().collect();
    let mut desired = original.clone();
    let mut figures = ChaosFigures::default();
    let mut rounds = Vec::new();
    let mut faulted = HashSet::new();
    let begun = Instant::now();
    for round in 0..config.chaos_rounds {
        let fault = Fault::ALL[rng.usize(..Fault::ALL.len())];
        let nodes = cluster.node_names();
        let node = nodes[rng.usize(..nodes.len())].clone();
        progress.phase(
            &format!(
                "chaos round {} of {}: {} ({node})",
                round + 1,
                config.chaos_rounds,
                fault.name()
            ),
            0,
        );
        let ceiling = desired.clone();
        churn(&mut rng, &original, &mut desired);
        let ceiling = merge_max(&ceiling, &desired);
        let mut duplicates = 0;
        for (service, replicas) in &desired {
            cluster.client().scale(service, *replicas).await?;
        }
        let fault_over = inject(cluster, fault, &node, config, &ceiling, &mut duplicates).await;
        if fault == Fault::AgentFreeze {
            faulted.insert(node.clone());
        }
        let took = converge(cluster, &desired, &ceiling, config.timeout, &mut duplicates)
            .await
            .map_err(|problem| BenchError::Timeout {
                what: format!(
                    "chaos round {} ({} on {node}) to converge: {problem}",
                    round + 1,
                    fault.name()
                ),
                timeout: config.timeout,
            })?;
        let took = took.saturating_duration_since(fault_over);
        *figures.faults.entry(fault.name().to_owned()).or_default() += 1;
        figures.max_duplicates = figures.max_duplicates.max(duplicates);
        rounds.push((took, format!("{} on {node}", fault.name())));
    }
    figures.rounds = config.chaos_rounds;
    figures.slowest_round = rounds
        .iter()
        .max_by_key(|(took, _)| *took)
        .map(|(took, what)| format!("{what}: {:.2} s", took.as_secs_f64()));
    Ok(Outcome {
        seconds: begun.elapsed().as_secs_f64(),
        latencies: rounds.into_iter().map(|(took, _)| took).collect(),
        success_rate: 1.0,
        instances: desired.values().map(|n| *n as usize).sum(),
        chaos: Some(figures),
        faulted_nodes: faulted,
        ..Outcome::default()
    })
}

/// Scales a tenth of the services (at least one) up or down by a tenth
/// of their replicas (at least one), between half and 1.5 times their
/// first count.
fn churn(
    rng: &mut fastrand::Rng,
    original: &HashMap<String, u32>,
    desired: &mut HashMap<String, u32>,
) {
    let mut services: Vec<&String> = original.keys().collect();
    services.sort();
    let picks = (services.len() / 10).max(1);
    for _ in 0..picks {
        let service = services[rng.usize(..services.len())];
        let first = original[service];
        let step = (first / 10).max(1);
        let now = desired[service];
        let next = if rng.bool() {
            now.saturating_add(step).min(first * 3 / 2)
        } else {
            now.saturating_sub(step).max((first / 2).max(1))
        };
        desired.insert(service.clone(), next);
    }
}

fn merge_max(a: &HashMap<String, u32>, b: &HashMap<String, u32>) -> HashMap<String, u32> {
    let mut merged = a.clone();
    for (service, replicas) in b {
        let entry = merged.entry(service.clone()).or_default();
        *entry = (*entry).max(*replicas);
    }
    merged
}

/// Applies `fault` to `node`, sampling duplicates while it lasts; returns
/// when it ended.
async fn inject(
    cluster: &mut Cluster,
    fault: Fault,
    node: &str,
    config: &BenchConfig,
    ceiling: &HashMap<String, u32>,
    duplicates: &mut usize,
) -> Instant {
    match fault {
        Fault::AgentKill => {
            cluster.restart_agent(node, false).await;
        }
        Fault::AgentFreeze => {
            cluster.stop_agent(node).await;
            let until = Instant::now() + config.node_lease_ttl() * 2;
            while Instant::now() < until {
                *duplicates =
                    (*duplicates).max(excess(&cluster.running_instances().await, ceiling));
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
            cluster.start_agent(node);
        }
        Fault::ServerRestart => {
            cluster.stop_controllers().await;
            tokio::time::sleep(SERVER_DOWN).await;
            cluster.start_controllers();
        }
    }
    Instant::now()
}

/// Waits until every service runs exactly `desired` instances with none
/// on two nodes, sampling duplicates against `ceiling`; returns when.
async fn converge(
    cluster: &Cluster,
    desired: &HashMap<String, u32>,
    ceiling: &HashMap<String, u32>,
    timeout: Duration,
    duplicates: &mut usize,
) -> Result<Instant, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let running = cluster.running_instances().await;
        *duplicates = (*duplicates).max(excess(&running, ceiling));
        let off = difference(&running, desired);
        if off.is_empty() {
            return Ok(Instant::now());
        }
        if Instant::now() >= deadline {
            return Err(off.join("; "));
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

/// Instances running beyond each service's `ceiling`, summed; an
/// instance on two nodes counts once more.
fn excess(running: &[RunningInstance], ceiling: &HashMap<String, u32>) -> usize {
    let mut per_service: HashMap<&str, usize> = HashMap::new();
    let mut ids = HashSet::new();
    let mut twice = 0;
    for instance in running {
        *per_service.entry(&instance.service).or_default() += 1;
        if !ids.insert(instance.id.as_str()) {
            twice += 1;
        }
    }
    let beyond: usize = per_service
        .iter()
        .map(|(service, runs)| {
            runs.saturating_sub(ceiling.get(*service).copied().unwrap_or(0) as usize)
        })
        .sum();
    beyond.max(twice)
}

/// How `running` differs from `desired`: each service's count, and any
/// instance on two nodes. Empty when they agree.
fn difference(running: &[RunningInstance], desired: &HashMap<String, u32>) -> Vec<String> {
    let mut per_service: BTreeMap<&str, usize> = BTreeMap::new();
    let mut nodes_of: HashMap<&str, usize> = HashMap::new();
    for instance in running {
        *per_service.entry(&instance.service).or_default() += 1;
        *nodes_of.entry(&instance.id).or_default() += 1;
    }
    let mut off: Vec<String> = desired
        .iter()
        .filter_map(|(service, replicas)| {
            let runs = per_service.get(service.as_str()).copied().unwrap_or(0);
            (runs != *replicas as usize).then(|| format!("{service} runs {runs} of {replicas}"))
        })
        .collect();
    off.sort();
    off.extend(
        nodes_of
            .iter()
            .filter(|(_, nodes)| **nodes > 1)
            .map(|(id, nodes)| format!("{id} runs on {nodes} nodes")),
    );
    off
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(id: &str, service: &str, node: &str) -> RunningInstance {
        RunningInstance {
            id: id.into(),
            service: service.into(),
            node: node.into(),
        }
    }

    #[test]
    fn duplicates_count_what_runs_beyond_the_rounds_ceiling() {
        let ceiling = HashMap::from([("web".to_owned(), 2)]);
        let running = [
            on("a", "web", "n1"),
            on("b", "web", "n2"),
            on("c", "web", "n3"),
        ];
        assert_eq!(excess(&running, &ceiling), 1);
        assert_eq!(excess(&running[..2], &ceiling), 0);
        let twice = [on("a", "web", "n1"), on("a", "web", "n2")];
        assert_eq!(excess(&twice, &ceiling), 1, "one id on two nodes");
    }

    #[test]
    fn convergence_needs_exact_counts_and_no_id_on_two_nodes() {
        let desired = HashMap::from([("web".to_owned(), 2), ("db".to_owned(), 1)]);
        let fine = [
            on("a", "web", "n1"),
            on("b", "web", "n2"),
            on("c", "db", "n1"),
        ];
        assert!(difference(&fine, &desired).is_empty());
        let short = &fine[..2];
        assert_eq!(difference(short, &desired), ["db runs 0 of 1"]);
        let twice = [
            on("a", "web", "n1"),
            on("a", "web", "n2"),
            on("c", "db", "n1"),
        ];
        assert_eq!(difference(&twice, &desired), ["a runs on 2 nodes"]);
    }

    #[test]
    fn churn_stays_between_half_and_one_and_a_half_times_the_first_count() {
        let original = HashMap::from([("web".to_owned(), 10)]);
        let mut desired = original.clone();
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..200 {
            churn(&mut rng, &original, &mut desired);
            assert!((5..=15).contains(&desired["web"]), "{}", desired["web"]);
        }
    }
}
