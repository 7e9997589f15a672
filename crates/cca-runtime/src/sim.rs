//! `SimRuntime`: simulated instances for benchmarks and chaos runs — no
//! processes, no files, a few hundred bytes per instance, so one process
//! can hold thousands of nodes with tens of instances each. A start takes
//! a latency drawn from a seeded [`StartLatency`] distribution; faults are
//! injected from a [`SimConfig`] (fail to start with a probability, crash
//! a fixed time after each start) or by [`SimRuntime::kill_node`], which
//! ends every instance at once as a machine losing power would. It follows
//! the same state rules as the real runtimes (no double start, no removing
//! a running instance), so the agent drives it exactly as it drives them.
//! Instances use CPU and memory by a model: a share of what they request
//! ([`SimRuntime::set_load`]), or, for the services a shared [`SimLoads`]
//! names, a given CPU rate per instance (a harness spreads a service's
//! demand over its instances); CPU time accrues at the rate in force at
//! each reading. An instance whose environment sets
//! [`CRASH_SHARE_ENV`] to a share crashes soon after every start when its
//! id falls in that share (a bad version, for rollout scenarios).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

use crate::memory::{created_status, end_run, refuse_when_running, stop_at_once};

use crate::{
    Error, ExecOutput, ExecRequest, ExitReason, InstanceSpec, InstanceState, InstanceStatus,
    Limits, LogOptions, LogStream, Operation, Result, Runtime, Usage,
};

/// How long a simulated start takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StartLatency {
    /// Every start takes exactly this long.
    Fixed(Duration),
    /// Uniformly between `min` and `max`.
    Uniform { min: Duration, max: Duration },
    /// Normally distributed around `mean` (never below zero): image pulls
    /// and process starts cluster around a typical time with a tail.
    Normal { mean: Duration, std_dev: Duration },
}

impl StartLatency {
    /// One draw from the distribution.
    fn sample(&self, rng: &mut fastrand::Rng) -> Duration {
        match *self {
            StartLatency::Fixed(latency) => latency,
            StartLatency::Uniform { min, max } if max > min => min + (max - min).mul_f64(rng.f64()),
            StartLatency::Uniform { min, .. } => min,
            StartLatency::Normal { mean, std_dev } => {
                let seconds = mean.as_secs_f64() + std_dev.as_secs_f64() * standard_normal(rng);
                Duration::from_secs_f64(seconds.max(0.0))
            }
        }
    }
}

/// A standard normal draw (Box–Muller): fastrand has no distributions.
fn standard_normal(rng: &mut fastrand::Rng) -> f64 {
    // 1 - f64() lies in (0, 1], so the logarithm is finite.
    let radius = (-2.0 * (1.0 - rng.f64()).ln()).sqrt();
    radius * (std::f64::consts::TAU * rng.f64()).cos()
}

/// The behaviour of one simulated node.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    pub start_latency: StartLatency,
    /// CPU rates per instance by service, shared by every node of a run.
    pub loads: Option<Arc<SimLoads>>,
    /// Each start fails (the instance exits as "failed to start") with
    /// this probability, 0.0 to 1.0.
    pub start_failure_probability: f64,
    /// Every run crashes (exit code 1) this long after it started.
    pub crash_after: Option<Duration>,
    /// Seed of the node's random draws: the same seed replays the same run.
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            start_latency: StartLatency::Fixed(Duration::ZERO),
            loads: None,
            start_failure_probability: 0.0,
            crash_after: None,
            seed: 0,
        }
    }
}

/// What a simulated instance that requests no CPU or memory is taken to
/// have requested: a tenth of a core and 64 MiB.
const UNREQUESTED_CPU_MILLIS: u64 = 100;
const UNREQUESTED_MEMORY_BYTES: u64 = 64 << 20;
/// The load instances run at until [`SimRuntime::set_load`] says.
const DEFAULT_LOAD: f64 = 0.5;

/// Exit code of a simulated crash.
const CRASH_EXIT_CODE: i32 = 1;

/// An instance environment variable: the share (0.0 to 1.0) of the
/// service's instances, chosen by their ids, that crash
/// [`DOOMED_RUN`] after every start.
pub const CRASH_SHARE_ENV: &str = "CCA_SIM_CRASH_SHARE";

/// How long a run of a doomed instance lasts.
const DOOMED_RUN: Duration = Duration::from_millis(100);

/// Per-instance CPU rates by service, shared by the runtimes of a run:
/// what a harness sets to spread each service's demand over its
/// instances. A service it does not name uses the node's load model.
#[derive(Debug, Default)]
pub struct SimLoads {
    per_instance_millis: Mutex<BTreeMap<String, u64>>,
}

impl SimLoads {
    /// Each instance of `service` uses `millicores` from now on.
    pub fn set(&self, service: &str, millicores: u64) {
        self.rates().insert(service.to_owned(), millicores);
    }

    /// The rate set for `service`, if any.
    pub fn get(&self, service: &str) -> Option<u64> {
        self.rates().get(service).copied()
    }

    fn rates(&self) -> MutexGuard<'_, BTreeMap<String, u64>> {
        self.per_instance_millis
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl PartialEq for SimLoads {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other) || *self.rates() == *other.rates()
    }
}

/// CPU time an instance's current run has used so far.
#[derive(Clone, Copy, Debug)]
struct Accrual {
    started_at: cca_model::cluster::Millis,
    nanos: f64,
    at: cca_model::cluster::Millis,
}
/// Signal that ends instances on a killed node (as SIGKILL would).
const NODE_DEATH_SIGNAL: i32 = 9;

#[derive(Debug)]
struct State {
    rng: fastrand::Rng,
    instances: BTreeMap<String, InstanceStatus>,
    next_pid: u32,
    /// The node was killed: every call fails until [`SimRuntime::revive`].
    dead: bool,
    /// The share of what they request that instances use.
    load: f64,
    /// CPU time used by each instance's current run, by id.
    accrued: BTreeMap<String, Accrual>,
}

/// A simulated node's runtime. Cheap to create; share it as
/// `Arc<SimRuntime>` to inject node death while an agent drives it.
#[derive(Debug)]
pub struct SimRuntime {
    config: SimConfig,
    state: Mutex<State>,
}

impl SimRuntime {
    pub fn new(config: SimConfig) -> Self {
        let state = State {
            rng: fastrand::Rng::with_seed(config.seed),
            instances: BTreeMap::new(),
            next_pid: 1,
            dead: false,
            load: DEFAULT_LOAD,
            accrued: BTreeMap::new(),
        };
        Self {
            config,
            state: Mutex::new(state),
        }
    }

    /// The node dies: every running instance ends at once (killed), and
    /// every later call fails until [`SimRuntime::revive`].
    pub fn kill_node(&self) {
        let mut state = self.state();
        state.dead = true;
        let now = cca_model::clock::now_millis();
        for status in state.instances.values_mut() {
            if status.state == InstanceState::Running {
                end_run(
                    status,
                    None,
                    Some(NODE_DEATH_SIGNAL),
                    ExitReason::Exited,
                    now,
                );
            }
        }
    }

    /// From now on every instance uses `load` times the CPU and memory it
    /// requests (0.5 until set; above 1.0 it uses more than it asked).
    pub fn set_load(&self, load: f64) {
        self.state().load = load.max(0.0);
    }

    /// The node is back (its instances stay exited, as after a reboot).
    pub fn revive(&self) {
        self.state().dead = false;
    }

    /// How many instances run now.
    pub fn running(&self) -> usize {
        let mut state = self.state();
        let crash_after = self.config.crash_after;
        let mut running = 0;
        for status in state.instances.values_mut() {
            apply_crash(status, crash_after);
            running += usize::from(status.state == InstanceState::Running);
        }
        running
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The state, refusing every call on a dead node.
    fn alive(&self, id: &str, operation: Operation) -> Result<MutexGuard<'_, State>> {
        let state = self.state();
        if state.dead {
            return Err(Error::Failed {
                id: id.to_owned(),
                operation,
                message: "the simulated node is dead".to_owned(),
            });
        }
        Ok(state)
    }

    /// Checks that `id` may start and draws its latency and fate.
    fn prepare_start(&self, id: &str) -> Result<(Duration, bool)> {
        let mut state = self.alive(id, Operation::Start)?;
        let crash_after = self.config.crash_after;
        let status = existing(&mut state, id)?;
        apply_crash(status, crash_after);
        refuse_when_running(status, Operation::Start)?;
        let latency = self.config.start_latency.sample(&mut state.rng);
        let fails = state.rng.f64() < self.config.start_failure_probability;
        Ok((latency, fails))
    }

    /// Ends the start: the instance runs, or exits as failed to start.
    fn finish_start(&self, id: &str, fails: bool) -> Result<()> {
        let mut state = self.alive(id, Operation::Start)?;
        let pid = state.next_pid;
        state.next_pid += 1;
        let crash_after = self.config.crash_after;
        let status = existing(&mut state, id)?;
        apply_crash(status, crash_after);
        refuse_when_running(status, Operation::Start)?;
        let now = cca_model::clock::now_millis();
        status.state = InstanceState::Running;
        status.pid = Some(pid);
        status.started_at_ms = Some(now);
        status.exit = None;
        if !fails {
            return Ok(());
        }
        let message = "simulated start failure".to_owned();
        let reason = ExitReason::FailedToStart {
            message: message.clone(),
        };
        end_run(status, None, None, reason, now);
        Err(Error::Failed {
            id: id.to_owned(),
            operation: Operation::Start,
            message,
        })
    }

    /// The status of `id` with any due crash applied.
    fn current(&self, id: &str, operation: Operation) -> Result<InstanceStatus> {
        let mut state = self.alive(id, operation)?;
        let crash_after = self.config.crash_after;
        let status = existing(&mut state, id)?;
        apply_crash(status, crash_after);
        Ok(status.clone())
    }
}

#[async_trait]
impl Runtime for SimRuntime {
    fn kind(&self) -> &'static str {
        "sim"
    }

    async fn create(&self, spec: InstanceSpec) -> Result<String> {
        let mut state = self.alive(&spec.id, Operation::Create)?;
        spec.validate()?;
        if state.instances.contains_key(&spec.id) {
            return Err(Error::AlreadyExists { id: spec.id });
        }
        let id = spec.id.clone();
        state
            .instances
            .insert(id.clone(), created_status(spec, "sim"));
        Ok(id)
    }

    async fn start(&self, id: &str) -> Result<()> {
        let (latency, fails) = self.prepare_start(id)?;
        // The lock is not held while "starting": other instances proceed.
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        self.finish_start(id, fails)
    }

    async fn stop(&self, id: &str, _grace: Duration) -> Result<InstanceStatus> {
        let mut state = self.alive(id, Operation::Stop)?;
        let crash_after = self.config.crash_after;
        let status = existing(&mut state, id)?;
        apply_crash(status, crash_after);
        stop_at_once(status);
        Ok(status.clone())
    }

    async fn remove(&self, id: &str) -> Result<()> {
        let mut state = self.alive(id, Operation::Remove)?;
        let crash_after = self.config.crash_after;
        let status = existing(&mut state, id)?;
        apply_crash(status, crash_after);
        refuse_when_running(status, Operation::Remove)?;
        state.instances.remove(id);
        state.accrued.remove(id);
        Ok(())
    }

    async fn inspect(&self, id: &str) -> Result<InstanceStatus> {
        self.current(id, Operation::Inspect)
    }

    async fn list(&self) -> Result<Vec<InstanceStatus>> {
        let mut state = self.alive("", Operation::List)?;
        let crash_after = self.config.crash_after;
        Ok(state
            .instances
            .values_mut()
            .map(|status| {
                apply_crash(status, crash_after);
                status.clone()
            })
            .collect())
    }

    async fn logs(&self, id: &str, _options: LogOptions) -> Result<LogStream> {
        let status = self.current(id, Operation::Logs)?;
        // A simulated workload writes one line per start, nothing else.
        let line = status
            .started_at_ms
            .map(|at| format!("sim: started at {at} ms"));
        Ok(LogStream::from_lines(line))
    }

    async fn exec(&self, id: &str, _request: ExecRequest) -> Result<ExecOutput> {
        let status = self.current(id, Operation::Exec)?;
        status.require_running(Operation::Exec)?;
        Ok(ExecOutput {
            code: Some(0),
            ..ExecOutput::default()
        })
    }

    async fn usage(&self, id: &str) -> Result<Usage> {
        let status = self.current(id, Operation::Usage)?;
        status.require_running(Operation::Usage)?;
        let rate = self
            .config
            .loads
            .as_ref()
            .and_then(|loads| loads.get(&status.spec.service));
        let now = cca_model::clock::now_millis();
        let mut state = self.state();
        let load = state.load;
        let started_at = status.started_at_ms.unwrap_or(now);
        let fresh = Accrual {
            started_at,
            nanos: 0.0,
            at: started_at,
        };
        let accrual = state.accrued.entry(id.to_owned()).or_insert(fresh);
        if accrual.started_at != started_at {
            *accrual = fresh;
        }
        Ok(simulated_usage(&status, load, rate, accrual, now))
    }

    async fn resize(&self, id: &str, limits: Limits) -> Result<()> {
        let mut state = self.alive(id, Operation::Resize)?;
        let status = existing(&mut state, id)?;
        limits.set_on(std::sync::Arc::make_mut(&mut status.spec));
        Ok(())
    }
}

/// What a running instance has used by `now`: its CPU time accrues from
/// the last reading at `rate` millicores when its service has one, else at
/// `load` times the CPU it requests; its memory is `load` times what it
/// requests.
fn simulated_usage(
    status: &InstanceStatus,
    load: f64,
    rate: Option<u64>,
    accrual: &mut Accrual,
    now: cca_model::cluster::Millis,
) -> Usage {
    let cpu_millis = status.spec.cpu_millis.unwrap_or(UNREQUESTED_CPU_MILLIS);
    let memory = status.spec.memory_bytes.unwrap_or(UNREQUESTED_MEMORY_BYTES);
    let millicores = rate.map_or(cpu_millis as f64 * load, |rate| rate as f64);
    let elapsed_ms = now.saturating_sub(accrual.at).max(0);
    // ms × millicores = nanoseconds of CPU.
    accrual.nanos += elapsed_ms as f64 * millicores * 1_000.0;
    accrual.at = accrual.at.max(now);
    Usage {
        cpu_nanos: accrual.nanos as u64,
        memory_bytes: (memory as f64 * load) as u64,
    }
}

/// Crashes a running instance whose `crash_after` has passed; the exit is
/// dated when it was due, not when it was noticed.
fn apply_crash(status: &mut InstanceStatus, crash_after: Option<Duration>) {
    let crash_after = crash_after.or_else(|| is_doomed(status).then_some(DOOMED_RUN));
    let (Some(after), Some(started)) = (crash_after, status.started_at_ms) else {
        return;
    };
    let due = started.saturating_add(cca_model::clock::span_millis(after));
    if status.state == InstanceState::Running && cca_model::clock::now_millis() >= due {
        end_run(status, Some(CRASH_EXIT_CODE), None, ExitReason::Exited, due);
    }
}

/// Whether the instance's id falls in the share of its service that
/// [`CRASH_SHARE_ENV`] dooms (an FNV-1a hash of the id, per mille).
fn is_doomed(status: &InstanceStatus) -> bool {
    let Some(share) = status
        .spec
        .env
        .get(CRASH_SHARE_ENV)
        .and_then(|share| share.parse::<f64>().ok())
    else {
        return false;
    };
    let hash = status
        .spec
        .id
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    ((hash % 1_000) as f64) < share * 1_000.0
}

fn existing<'a>(state: &'a mut State, id: &str) -> Result<&'a mut InstanceStatus> {
    state
        .instances
        .get_mut(id)
        .ok_or_else(|| Error::NotFound { id: id.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str) -> InstanceSpec {
        InstanceSpec::new(id, "web", "sim")
    }

    async fn started(runtime: &SimRuntime, id: &str) -> Result<()> {
        runtime.create(spec(id)).await?;
        runtime.start(id).await
    }

    #[test]
    fn cpu_accrues_at_the_rate_in_force_at_each_reading() {
        let mut requested = spec("a");
        requested.cpu_millis = Some(2000);
        requested.memory_bytes = Some(1 << 30);
        let mut status = created_status(requested, "sim");
        status.state = InstanceState::Running;
        status.started_at_ms = Some(1_000);
        let mut accrual = Accrual {
            started_at: 1_000,
            nanos: 0.0,
            at: 1_000,
        };
        // Two cores at a quarter load for 4 s: 2 s of CPU.
        assert_eq!(
            simulated_usage(&status, 0.25, None, &mut accrual, 5_000),
            Usage {
                cpu_nanos: 2_000_000_000,
                memory_bytes: 1 << 28,
            }
        );
        // Then 500m for 2 s: 1 s more, whatever the load.
        let usage = simulated_usage(&status, 0.25, Some(500), &mut accrual, 7_000);
        assert_eq!(usage.cpu_nanos, 3_000_000_000);
        // A load step does not rewrite the past.
        let usage = simulated_usage(&status, 1.0, None, &mut accrual, 7_000);
        assert_eq!(usage.cpu_nanos, 3_000_000_000);
    }

    #[tokio::test]
    async fn a_shared_rate_drives_a_services_instances() {
        let loads = Arc::new(SimLoads::default());
        let config = SimConfig {
            loads: Some(Arc::clone(&loads)),
            ..SimConfig::default()
        };
        let runtime = SimRuntime::new(config);
        started(&runtime, "a").await.expect("start a");
        loads.set("web", 1_000);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let first = runtime.usage("a").await.expect("usage").cpu_nanos;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let second = runtime.usage("a").await.expect("usage").cpu_nanos;
        // A whole core: about 100 ms of CPU in 100 ms.
        let used = second - first;
        assert!((90_000_000..200_000_000).contains(&used), "{used}");
    }

    #[tokio::test]
    async fn a_doomed_share_of_instances_crashes_soon_after_every_start() {
        let runtime = SimRuntime::new(SimConfig::default());
        let mut doomed = 0;
        for n in 0..40 {
            let mut spec = spec(&format!("web-{n}"));
            spec.env.insert(CRASH_SHARE_ENV.into(), "0.5".into());
            runtime.create(spec).await.expect("create");
            runtime.start(&format!("web-{n}")).await.expect("start");
        }
        tokio::time::sleep(DOOMED_RUN + Duration::from_millis(50)).await;
        for status in runtime.list().await.expect("list") {
            if status.state == InstanceState::Exited {
                doomed += 1;
                assert_eq!(status.exit.expect("exit").code, Some(CRASH_EXIT_CODE));
            }
        }
        assert!((8..32).contains(&doomed), "about half of 40: {doomed}");
    }

    #[tokio::test]
    async fn usage_follows_the_load_and_only_while_running() {
        let runtime = SimRuntime::new(SimConfig::default());
        started(&runtime, "a").await.expect("start a");
        let half = runtime.usage("a").await.expect("usage");
        assert_eq!(half.memory_bytes, UNREQUESTED_MEMORY_BYTES / 2);
        runtime.set_load(2.0);
        let double = runtime.usage("a").await.expect("usage");
        assert_eq!(double.memory_bytes, UNREQUESTED_MEMORY_BYTES * 2);
        runtime.stop("a", Duration::ZERO).await.expect("stop");
        assert!(matches!(
            runtime.usage("a").await,
            Err(Error::InvalidState { .. })
        ));
    }

    #[tokio::test]
    async fn an_instance_is_resized_running_or_not() {
        let runtime = SimRuntime::new(SimConfig::default());
        started(&runtime, "a").await.expect("start a");
        let limits = Limits {
            cpu_millis: Some(300),
            memory_bytes: Some(64 << 20),
        };
        runtime.resize("a", limits).await.expect("resize");
        let status = runtime.inspect("a").await.expect("inspect");
        assert_eq!(Limits::of(&status.spec), limits);
        runtime.stop("a", Duration::ZERO).await.expect("stop");
        let unlimited = Limits::default();
        runtime.resize("a", unlimited).await.expect("resize");
        let status = runtime.inspect("a").await.expect("inspect");
        assert_eq!(Limits::of(&status.spec), unlimited);
        assert!(matches!(
            runtime.resize("gone", limits).await,
            Err(Error::NotFound { .. })
        ));
    }

    #[tokio::test]
    async fn instances_run_and_stop_by_the_real_state_rules() {
        let runtime = SimRuntime::new(SimConfig::default());
        started(&runtime, "a").await.expect("start a");
        assert_eq!(runtime.running(), 1);
        assert!(matches!(
            runtime.start("a").await,
            Err(Error::InvalidState { .. })
        ));
        assert!(matches!(
            runtime.remove("a").await,
            Err(Error::InvalidState { .. })
        ));
        let stopped = runtime.stop("a", Duration::ZERO).await.expect("stop");
        assert_eq!(stopped.exit.expect("exit").reason, ExitReason::Stopped);
        runtime.remove("a").await.expect("remove");
        assert!(runtime.list().await.expect("list").is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_takes_the_drawn_latency() {
        let config = SimConfig {
            start_latency: StartLatency::Uniform {
                min: Duration::from_millis(100),
                max: Duration::from_millis(200),
            },
            ..SimConfig::default()
        };
        let runtime = SimRuntime::new(config);
        let begun = tokio::time::Instant::now();
        started(&runtime, "a").await.expect("start");
        let took = begun.elapsed();
        assert!(
            (Duration::from_millis(100)..=Duration::from_millis(200)).contains(&took),
            "{took:?}"
        );
    }

    #[test]
    fn draws_are_seeded_and_normal_ones_never_negative() {
        let normal = StartLatency::Normal {
            mean: Duration::from_millis(10),
            std_dev: Duration::from_millis(50),
        };
        let draws = |seed| {
            let mut rng = fastrand::Rng::with_seed(seed);
            (0..100)
                .map(|_| normal.sample(&mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert!(draws(7).contains(&Duration::ZERO), "the tail is clamped");
    }

    #[tokio::test]
    async fn injected_start_failures_exit_as_failed_to_start() {
        let config = SimConfig {
            start_failure_probability: 1.0,
            ..SimConfig::default()
        };
        let runtime = SimRuntime::new(config);
        let error = started(&runtime, "a").await.expect_err("fails");
        assert_eq!(
            error.to_string(),
            "instance a: start failed: simulated start failure"
        );
        let exit = runtime.inspect("a").await.expect("inspect").exit;
        assert!(matches!(
            exit.expect("exit").reason,
            ExitReason::FailedToStart { .. }
        ));
    }

    #[tokio::test]
    async fn runs_crash_after_the_configured_time() {
        let config = SimConfig {
            crash_after: Some(Duration::ZERO),
            ..SimConfig::default()
        };
        let runtime = SimRuntime::new(config);
        started(&runtime, "a").await.expect("start");
        let status = runtime.inspect("a").await.expect("inspect");
        assert_eq!(status.state, InstanceState::Exited);
        assert_eq!(status.exit.expect("exit").code, Some(CRASH_EXIT_CODE));
    }

    #[tokio::test]
    async fn a_killed_node_loses_every_instance_and_refuses_calls() {
        let runtime = SimRuntime::new(SimConfig::default());
        started(&runtime, "a").await.expect("a");
        started(&runtime, "b").await.expect("b");
        runtime.kill_node();
        assert_eq!(runtime.running(), 0);
        assert!(runtime.list().await.is_err());
        runtime.revive();
        let exits: Vec<_> = runtime
            .list()
            .await
            .expect("list")
            .into_iter()
            .map(|status| status.exit.and_then(|exit| exit.signal))
            .collect();
        assert_eq!(exits, [Some(NODE_DEATH_SIGNAL), Some(NODE_DEATH_SIGNAL)]);
    }
}
