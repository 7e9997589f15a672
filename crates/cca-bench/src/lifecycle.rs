//! The lifecycle scenarios, driven through the API as an operator would
//! and read back from it (`GET /v1/services/{name}/rollout` and `.../scale`
//! every 100 ms):
//!
//! - **rollout**: the deployed services (each with `max_surge` a quarter
//!   of its replicas and `max_unavailable = 0`) get a new version; time
//!   until every service completes it. Then a version of which a share of
//!   the instances crash loops (the simulated runtime's
//!   `CCA_SIM_CRASH_SHARE`): time until every service's rollback is
//!   decided, and until each serves its previous version again. A service
//!   not rolled back, a decision more than 30 s after its breach, or the
//!   previous version more than 60 s after the decision to serve fully, is
//!   a violation.
//! - **autoscale**: the deployed services are autoscaled on CPU at 50% of
//!   the request, `min` their replicas and `max` twice that; each one's
//!   demand (a total CPU rate the harness spreads over its placed
//!   instances through the runtimes' [`SimLoads`]) starts on target, steps
//!   to twice that, then back. Time until every service runs twice its
//!   replicas, and until it is back (the scale-down window included). A
//!   count above the doubled one, or changing more than twice in a step,
//!   is a violation.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cca_model::autoscale::TOLERANCE_PERCENT;
use cca_model::rollout::{RolloutCause, RolloutPhase};
use cca_model::spec::spec_hash;
use cca_runtime::sim::SimLoads;
use cca_wire::Client;
use cca_wire::types::RolloutStatus;
use serde::Serialize;
use tokio::time::Instant;

use crate::BenchError;
use crate::cluster::Cluster;
use crate::scenario::{BenchConfig, Outcome, Progress};
use crate::workload::{AutoscaleShape, INSTANCE_CPU_MILLIS, Shape, Workload};

/// How often the harness asks.
const POLL: Duration = Duration::from_millis(100);

/// The autoscaling target, in percent of the CPU request.
const CPU_TARGET_PERCENT: u32 = 50;

/// What the lifecycle scenarios measured. Times in seconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LifecycleFigures {
    /// `rollout`: the apply of a good version to every service complete.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout_seconds: Option<f64>,
    /// `rollout`: the apply of a bad version to every service's rollback
    /// decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollback_seconds: Option<f64>,
    /// `rollout`: per service, the breach (its `rollback_after`-th failed
    /// instance seen) to the decision; the slowest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breach_to_decision_seconds: Option<f64>,
    /// `rollout`: per service, the decision to every instance of the
    /// previous version running and ready again; the slowest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restored_seconds: Option<f64>,
    /// `rollout`: the share of the bad version's instances that crash.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bad_share: Option<f64>,
    /// `autoscale`: the load step up to every service running its new
    /// count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_up_seconds: Option<f64>,
    /// `autoscale`: the load step down to every service back at its count
    /// (the scale-down window included).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_down_seconds: Option<f64>,
    /// `autoscale`: the scale-down window the control plane ran with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_down_window_seconds: Option<f64>,
    /// `autoscale`: the most changes of one service's count in one step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub most_count_changes: Option<u32>,
    /// `autoscale`: the most times one service's count turned back (up
    /// after down, or down after up) in one step: flapping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub most_count_reversals: Option<u32>,
}

/// The shape the scenario deploys: `rollout`'s surge, `autoscale`'s
/// bounds.
pub(crate) fn rollout_shape(config: &BenchConfig) -> Shape {
    Shape {
        version: 1,
        surge_percent: Some(config.surge_percent),
        ..Shape::default()
    }
}

pub(crate) fn autoscale_shape() -> Shape {
    Shape {
        autoscale: Some(AutoscaleShape {
            max_factor: 2,
            cpu_percent: CPU_TARGET_PERCENT,
        }),
        ..Shape::default()
    }
}

/// `rollout`, after the first version is deployed.
pub(crate) async fn rollout(
    cluster: &Cluster,
    workload: &Workload,
    config: &BenchConfig,
    progress: &dyn Progress,
) -> Result<Outcome, BenchError> {
    let client = cluster.client();
    let good = workload.shaped(Shape {
        version: 2,
        ..workload.shape.clone()
    });
    progress.phase("rolling out a new version", services(workload).len() as u64);
    let begun = Instant::now();
    let versions = apply(client, &good).await?;
    let done = until_all(client, &versions, config.timeout, progress, |status, _| {
        complete_at(status, &versions[&status.service])
    })
    .await?;
    let rollout_seconds = done.values().map(|at| at.duration_since(begun)).max();

    let bad = good.shaped(Shape {
        version: 3,
        crash_per_mille: config.bad_per_mille,
        ..good.shape.clone()
    });
    progress.phase("rolling out a bad version", services(workload).len() as u64);
    let applied_at = cca_model::clock::now_millis();
    let bad_versions = apply(client, &bad).await?;
    // Rolled back, or (a violation) the bad version's rollout ended.
    let decided = until_all(
        client,
        &bad_versions,
        config.timeout,
        progress,
        |status, _| {
            let bad = &bad_versions[&status.service];
            rolled_back_from(status, bad) || ended_at(status, bad)
        },
    )
    .await?;
    let mut rolled_back = BTreeMap::new();
    for (service, good) in &versions {
        let status = client.rollout(service).await?;
        if rolled_back_from(&status, &bad_versions[service]) {
            rolled_back.insert(service.clone(), good.clone());
        }
    }
    progress.phase(
        "serving the previous version again",
        rolled_back.len() as u64,
    );
    let restored = until_all(
        client,
        &rolled_back,
        config.timeout,
        progress,
        |status, _| complete_at(status, &versions[&status.service]),
    )
    .await?;
    let mut figures = LifecycleFigures {
        rollout_seconds: rollout_seconds.map(|span| span.as_secs_f64()),
        bad_share: Some(f64::from(config.bad_per_mille) / 1_000.0),
        ..LifecycleFigures::default()
    };
    let violations = judge_rollback(client, &decided, &restored, applied_at, &mut figures).await?;
    Ok(Outcome {
        seconds: figures.rollout_seconds.unwrap_or_default(),
        success_rate: 1.0,
        instances: workload.instances(),
        violations,
        lifecycle: Some(figures),
        ..Outcome::default()
    })
}

/// The rollback figures and violations: per service, the breach to the
/// decision (≤ 30 s) and the decision to the previous version serving
/// (≤ 60 s).
async fn judge_rollback(
    client: &Client,
    decided: &BTreeMap<String, Instant>,
    restored: &BTreeMap<String, Instant>,
    applied_at: i64,
    figures: &mut LifecycleFigures,
) -> Result<Vec<String>, BenchError> {
    let mut violations = Vec::new();
    let (mut slowest_decision, mut slowest_breach, mut slowest_restore) = (0i64, 0i64, 0.0f64);
    for service in decided.keys() {
        let status = client.rollout(service).await?;
        let Some(rollout) = status
            .rollout
            .filter(|rollout| matches!(rollout.cause, RolloutCause::Rollback { .. }))
        else {
            violations.push(format!(
                "{service}: the bad version was not rolled back (too few of its instances \
                 failed? raise --bad-per-mille)"
            ));
            continue;
        };
        let breach = rollout
            .decided_by
            .get(status.rollback_after.saturating_sub(1) as usize)
            .map_or(rollout.started_at, |failure| failure.at);
        let to_decision = rollout.started_at - breach;
        if to_decision > 30_000 {
            violations.push(format!(
                "{service}: rollback decided {to_decision} ms after its breach (more than 30 s)"
            ));
        }
        slowest_breach = slowest_breach.max(to_decision);
        slowest_decision = slowest_decision.max(rollout.started_at - applied_at);
        if let (Some(restored), Some(seen)) = (restored.get(service), decided.get(service)) {
            // The decision was seen within a poll of its time.
            let span = restored.saturating_duration_since(*seen).as_secs_f64();
            if span > 60.0 {
                violations.push(format!(
                    "{service}: its previous version served fully {span:.1} s after the rollback \
                     (more than 60 s)"
                ));
            }
            slowest_restore = slowest_restore.max(span);
        }
    }
    figures.rollback_seconds = Some(slowest_decision as f64 / 1_000.0);
    figures.breach_to_decision_seconds = Some(slowest_breach as f64 / 1_000.0);
    figures.restored_seconds = Some(slowest_restore);
    Ok(violations)
}

/// `autoscale`, after the autoscaled services are deployed on target.
pub(crate) async fn autoscale(
    cluster: &Cluster,
    workload: &Workload,
    config: &BenchConfig,
    progress: &dyn Progress,
) -> Result<Outcome, BenchError> {
    let client = cluster.client();
    let loads = cluster
        .sim_loads()
        .ok_or_else(|| BenchError::Config("the simulated nodes share no loads".into()))?;
    let base: BTreeMap<String, u32> = workload.replicas.iter().cloned().collect();
    let on_target = |replicas: u32| {
        u64::from(replicas) * INSTANCE_CPU_MILLIS * u64::from(CPU_TARGET_PERCENT) / 100
    };
    let demand: BTreeMap<String, u64> = base
        .iter()
        .map(|(service, replicas)| (service.clone(), on_target(*replicas)))
        .collect();
    let spreader = Spreader::start(client.clone(), Arc::clone(&loads), demand.clone());

    progress.phase("stepping the load up", base.len() as u64);
    let doubled: BTreeMap<String, u64> = demand.iter().map(|(s, d)| (s.clone(), d * 2)).collect();
    spreader.set(doubled);
    let begun = Instant::now();
    let mut counts = Counts::default();
    let up = until_counts(client, &base, 2, config.timeout, progress, &mut counts).await?;
    let up_seconds = up.values().map(|at| at.duration_since(begun)).max();
    let up_changes = counts.most_changes();
    let up_reversals = counts.most_reversals();

    progress.phase("stepping the load down", base.len() as u64);
    spreader.set(demand);
    let stepped_down = Instant::now();
    let mut down_counts = Counts::default();
    let down = until_counts(client, &base, 1, config.timeout, progress, &mut down_counts).await?;
    let down_seconds = down
        .values()
        .map(|at| at.duration_since(stepped_down))
        .max();
    spreader.stop().await;

    let most_changes = up_changes.max(down_counts.most_changes());
    let most_reversals = up_reversals.max(down_counts.most_reversals());
    let mut violations = Vec::new();
    for (service, peak) in counts.peaks.iter().chain(&down_counts.peaks) {
        let ceiling = base.get(service).copied().unwrap_or_default() * 2;
        if *peak > ceiling {
            violations.push(format!(
                "{service}: scaled to {peak}, past the {ceiling} its load asks"
            ));
        }
    }
    // Several steps the same way are a count catching up with reports
    // that arrive one node at a time; a step back within one load step is
    // flapping.
    if most_reversals > 0 {
        violations.push(format!(
            "a service's count turned back {most_reversals} times in one load step: it flapped"
        ));
    }
    let window = config.scale_down_window_for(crate::scenario::Scenario::Autoscale);
    let figures = LifecycleFigures {
        scale_up_seconds: up_seconds.map(|span| span.as_secs_f64()),
        scale_down_seconds: down_seconds.map(|span| span.as_secs_f64()),
        scale_down_window_seconds: Some(window.as_secs_f64()),
        most_count_changes: Some(most_changes),
        most_count_reversals: Some(most_reversals),
        ..LifecycleFigures::default()
    };
    Ok(Outcome {
        seconds: figures.scale_up_seconds.unwrap_or_default(),
        success_rate: 1.0,
        instances: workload.instances(),
        violations,
        lifecycle: Some(figures),
        ..Outcome::default()
    })
}

/// The demand the load spreads: every 200 ms, each service's total CPU
/// rate divided over its placed instances, set as the runtimes' rate.
struct Spreader {
    demand: Arc<std::sync::Mutex<BTreeMap<String, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Spreader {
    fn start(client: Client, loads: Arc<SimLoads>, demand: BTreeMap<String, u64>) -> Self {
        let demand = Arc::new(std::sync::Mutex::new(demand));
        let shared = Arc::clone(&demand);
        let task = tokio::spawn(async move {
            loop {
                let wanted = shared
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                for (service, total) in wanted {
                    if let Ok(status) = client.rollout(&service).await {
                        let placed = (status.progress.updated + status.progress.old).max(1);
                        loads.set(&service, total / u64::from(placed));
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Self { demand, task }
    }

    fn set(&self, demand: BTreeMap<String, u64>) {
        *self
            .demand
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = demand;
    }

    async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Each service's count as the harness saw it change.
#[derive(Debug, Default)]
struct Counts {
    last: BTreeMap<String, u32>,
    changes: BTreeMap<String, u32>,
    /// Whether each service's last change went up.
    rising: BTreeMap<String, bool>,
    /// Changes against the direction of the one before: flapping.
    reversals: BTreeMap<String, u32>,
    peaks: BTreeMap<String, u32>,
}

impl Counts {
    fn saw(&mut self, service: &str, replicas: u32) {
        let last = self.last.insert(service.to_owned(), replicas);
        if let Some(last) = last.filter(|last| *last != replicas) {
            *self.changes.entry(service.to_owned()).or_default() += 1;
            let rising = replicas > last;
            if self
                .rising
                .insert(service.to_owned(), rising)
                .is_some_and(|before| before != rising)
            {
                *self.reversals.entry(service.to_owned()).or_default() += 1;
            }
        }
        let peak = self.peaks.entry(service.to_owned()).or_default();
        *peak = (*peak).max(replicas);
    }

    fn most_changes(&self) -> u32 {
        self.changes.values().copied().max().unwrap_or(0)
    }

    fn most_reversals(&self) -> u32 {
        self.reversals.values().copied().max().unwrap_or(0)
    }
}

/// Waits until every service runs `factor` times its base count, or a
/// count the autoscaler holds there (see [`settled`]), every instance
/// ready; when each got there.
async fn until_counts(
    client: &Client,
    base: &BTreeMap<String, u32>,
    factor: u32,
    timeout: Duration,
    progress: &dyn Progress,
    counts: &mut Counts,
) -> Result<BTreeMap<String, Instant>, BenchError> {
    let deadline = Instant::now() + timeout;
    let mut reached = BTreeMap::new();
    loop {
        for (service, replicas) in base {
            if reached.contains_key(service) {
                continue;
            }
            let scale = client.scale_status(service).await?;
            counts.saw(service, scale.replicas);
            let count = scale.replicas;
            let status = client.rollout(service).await?;
            let p = status.progress;
            if settled(count, replicas * factor) && p.ready == count && p.updated + p.old == count {
                reached.insert(service.clone(), Instant::now());
            }
        }
        progress.advance(reached.len() as u64);
        if reached.len() == base.len() {
            return Ok(reached);
        }
        if Instant::now() >= deadline {
            return Err(BenchError::Timeout {
                what: format!("every service running {factor}× its replicas"),
                timeout,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Whether the autoscaler holds `count` for a load that asks `wanted`:
/// the instances' mean use, `wanted / count` of the target, is within
/// the autoscaler's tolerance of it. A count that approached `wanted` in
/// steps (reports arrive one node at a time, a report's period may
/// straddle the load's step) may stop just short of it, as it should.
fn settled(count: u32, wanted: u32) -> bool {
    u64::from(count.abs_diff(wanted)) * 100 <= u64::from(count) * TOLERANCE_PERCENT
}

/// Applies `workload`; each service's version (spec hash).
async fn apply(
    client: &Client,
    workload: &Workload,
) -> Result<BTreeMap<String, String>, BenchError> {
    let program = workload.program()?;
    client.apply(&program, false).await?;
    Ok(program
        .services
        .iter()
        .map(|(name, spec)| (name.clone(), spec_hash(spec)))
        .collect())
}

fn services(workload: &Workload) -> Vec<&str> {
    workload
        .replicas
        .iter()
        .map(|(name, _)| name.as_str())
        .collect()
}

/// The service runs `version` everywhere, every instance ready.
fn complete_at(status: &RolloutStatus, version: &str) -> bool {
    let p = status.progress;
    status.placing == version
        && status.rollout.as_ref().is_some_and(|rollout| {
            rollout.target == version && rollout.phase == RolloutPhase::Complete
        })
        && p.old == 0
        && p.ready == p.wanted
        && p.updated == p.wanted
}

/// The service's rollout of `version` ended (completed or failed).
fn ended_at(status: &RolloutStatus, version: &str) -> bool {
    status.rollout.as_ref().is_some_and(|rollout| {
        rollout.target == version
            && rollout.requested == version
            && rollout.phase != RolloutPhase::Progressing
    })
}

/// The service's rollout is a rollback from `version`.
fn rolled_back_from(status: &RolloutStatus, version: &str) -> bool {
    status.rollout.as_ref().is_some_and(
        |rollout| matches!(&rollout.cause, RolloutCause::Rollback { from, .. } if from == version),
    )
}

/// Waits until `done` holds for every service of `versions`; when each
/// first did.
async fn until_all(
    client: &Client,
    versions: &BTreeMap<String, String>,
    timeout: Duration,
    progress: &dyn Progress,
    done: impl Fn(&RolloutStatus, &BTreeMap<String, String>) -> bool,
) -> Result<BTreeMap<String, Instant>, BenchError> {
    let deadline = Instant::now() + timeout;
    let mut reached = BTreeMap::new();
    loop {
        for service in versions.keys() {
            if reached.contains_key(service) {
                continue;
            }
            let status = client.rollout(service).await?;
            if done(&status, versions) {
                reached.insert(service.clone(), Instant::now());
            }
        }
        progress.advance(reached.len() as u64);
        if reached.len() == versions.len() {
            return Ok(reached);
        }
        if Instant::now() >= deadline {
            let missing: Vec<&String> = versions
                .keys()
                .filter(|s| !reached.contains_key(*s))
                .collect();
            return Err(BenchError::Timeout {
                what: format!("the rollout of {missing:?}"),
                timeout,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::{Counts, settled};

    #[test]
    fn a_settled_count_is_one_the_autoscaler_holds() {
        // Instances of 100m at a 70% target; the load asks `wanted`.
        for wanted in [20u32, 40] {
            let used = u64::from(wanted) * 70;
            for count in 1..=2 * wanted {
                let held = cca_model::autoscale::recommend(count, count, used, 100, 70) == count;
                assert_eq!(settled(count, wanted), held, "{count} for {wanted}");
            }
        }
        assert!(settled(37, 40) && !settled(36, 40) && settled(22, 20));
    }

    #[test]
    fn catching_up_is_not_flapping_and_turning_back_is() {
        let mut counts = Counts::default();
        for replicas in [10, 10, 14, 20, 20] {
            counts.saw("web", replicas);
        }
        assert_eq!((counts.most_changes(), counts.most_reversals()), (2, 0));
        counts.saw("web", 15);
        counts.saw("web", 20);
        assert_eq!((counts.most_changes(), counts.most_reversals()), (4, 2));
        assert_eq!(counts.peaks["web"], 20);
    }
}
