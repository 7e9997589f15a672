//! The node's usage reports. Every few seconds the agent reads what each
//! running instance has used (its runtime's counters) and what the whole
//! node has (`/proc/stat` and `/proc/meminfo`, or the sum of its instances
//! on a simulated node); once a period it sends the period's summary,
//! which the server keeps as `observed/usage/{node}`. [`Tracker`] is the
//! arithmetic, pure: counter readings and their times in, CPU rates and a
//! summary out. A report that cannot be sent is dropped, not queued: the
//! next period's says what matters now.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use cca_model::cluster::Millis;
use cca_model::usage::{NodeUsage, UsageSummary};
use cca_runtime::{InstanceState, Runtime, Usage};
use tokio::sync::watch;

/// How the agent measures and reports usage.
#[derive(Clone, Debug)]
pub struct UsageOptions {
    /// How often counters are read.
    pub sample_every: Duration,
    /// How often a summary is sent (a multiple of `sample_every`).
    pub report_every: Duration,
    /// Where the node's own figures come from.
    pub node: NodeMeter,
}

impl Default for UsageOptions {
    fn default() -> Self {
        Self {
            sample_every: Duration::from_secs(5),
            report_every: Duration::from_secs(30),
            node: NodeMeter::Host,
        }
    }
}

impl UsageOptions {
    /// Reports every `period` from the host's `/proc`, read every 5 s, or
    /// three times a period when it is shorter than 15 s.
    pub fn reporting_every(period: Duration) -> Self {
        Self {
            sample_every: (period / 3).min(Duration::from_secs(5)),
            report_every: period,
            node: NodeMeter::Host,
        }
    }
}

/// Where a node's own usage comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeMeter {
    /// The host's `/proc`: every process on it, the cluster's or not.
    Host,
    /// The sum of the node's instances (simulated nodes, many to a host).
    Instances,
}

/// A gate node's requests so far per service (monotonic counts).
pub trait RequestCounts: Send + Sync {
    fn requests(&self) -> BTreeMap<String, u64>;
}

impl RequestCounts for cca_gate::Gate {
    fn requests(&self) -> BTreeMap<String, u64> {
        self.traffic().requests()
    }
}

/// Each service's requests since `before` (the counts at the last
/// report), and the counts to compare the next report with.
pub fn requests_since(
    before: &BTreeMap<String, u64>,
    now: BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    now.iter()
        .map(|(service, count)| {
            let earlier = before.get(service).copied().unwrap_or(0);
            (service.clone(), count.saturating_sub(earlier))
        })
        .filter(|(_, count)| *count > 0)
        .collect()
}

/// Where summaries go: the API server, or a test's recorder.
#[async_trait]
pub trait UsageSink: Send + Sync {
    async fn send(&self, node: &str, usage: &NodeUsage) -> Result<(), String>;
}

#[async_trait]
impl UsageSink for cca_wire::Client {
    async fn send(&self, node: &str, usage: &NodeUsage) -> Result<(), String> {
        self.report_usage(node, usage)
            .await
            .map(drop)
            .map_err(|error| error.to_string())
    }
}

/// One counter reading: CPU time so far and memory now.
type Reading = Usage;

/// One source's readings within the current period.
#[derive(Clone, Debug)]
struct Series {
    /// Tells one run of an instance from the next (its start time).
    run: Millis,
    last: Reading,
    last_at: Millis,
    /// CPU time and wall time of the period's intervals.
    cpu_nanos: u64,
    span_ms: u64,
    peak_cpu_millis: u64,
    peak_memory: u64,
}

impl Series {
    fn start(run: Millis, reading: Reading, at: Millis) -> Self {
        Self {
            run,
            last: reading,
            last_at: at,
            cpu_nanos: 0,
            span_ms: 0,
            peak_cpu_millis: 0,
            peak_memory: reading.memory_bytes,
        }
    }

    fn add(&mut self, reading: Reading, at: Millis) {
        let span_ms = u64::try_from(at.saturating_sub(self.last_at)).unwrap_or(0);
        // A counter that went back is a new run the start time missed:
        // its interval is unknown, so it only restarts the series.
        if span_ms > 0 && reading.cpu_nanos >= self.last.cpu_nanos {
            let used = reading.cpu_nanos - self.last.cpu_nanos;
            self.cpu_nanos = self.cpu_nanos.saturating_add(used);
            self.span_ms = self.span_ms.saturating_add(span_ms);
            self.peak_cpu_millis = self.peak_cpu_millis.max(millicores(used, span_ms));
        }
        self.peak_memory = self.peak_memory.max(reading.memory_bytes);
        self.last = reading;
        self.last_at = at;
    }

    /// The period's summary, once two readings span some time.
    fn summary(&self) -> Option<UsageSummary> {
        (self.span_ms > 0).then(|| UsageSummary {
            cpu_millis: millicores(self.cpu_nanos, self.span_ms),
            cpu_peak_millis: self.peak_cpu_millis,
            memory_bytes: self.last.memory_bytes,
            memory_peak_bytes: self.peak_memory,
        })
    }

    /// A new period that starts from the last reading.
    fn carry_over(&mut self) {
        self.cpu_nanos = 0;
        self.span_ms = 0;
        self.peak_cpu_millis = 0;
        self.peak_memory = self.last.memory_bytes;
    }
}

/// Nanoseconds of CPU over milliseconds of wall time, in millicores.
fn millicores(cpu_nanos: u64, span_ms: u64) -> u64 {
    // ns / ms = millionths of a core; a thousandth of that is millicores.
    cpu_nanos / span_ms.max(1) / 1_000
}

/// The readings of the current period, the node's and each instance's.
#[derive(Debug)]
pub struct Tracker {
    period_start: Millis,
    node: Option<Series>,
    instances: HashMap<String, Series>,
}

impl Tracker {
    pub fn new(now: Millis) -> Self {
        Self {
            period_start: now,
            node: None,
            instances: HashMap::new(),
        }
    }

    /// Folds in the readings taken at `now`: the node's, and each running
    /// instance's with the start time of its run. Instances not read now
    /// no longer run and are forgotten.
    pub fn sample(
        &mut self,
        now: Millis,
        node: Reading,
        instances: impl IntoIterator<Item = (String, Millis, Reading)>,
    ) {
        match &mut self.node {
            Some(series) => series.add(node, now),
            None => self.node = Some(Series::start(0, node, now)),
        }
        let mut seen = HashMap::with_capacity(self.instances.len());
        for (id, run, reading) in instances {
            let series = match self.instances.remove(&id) {
                Some(mut series) if series.run == run => {
                    series.add(reading, now);
                    series
                }
                _ => Series::start(run, reading, now),
            };
            seen.insert(id, series);
        }
        self.instances = seen;
    }

    /// The summary of the period ending at `now`, and a new period; `None`
    /// while no two node readings span some time.
    pub fn report(&mut self, now: Millis) -> Option<NodeUsage> {
        let node = self.node.as_ref()?.summary()?;
        let report = NodeUsage {
            at: now,
            period_ms: u64::try_from(now.saturating_sub(self.period_start))
                .unwrap_or(0)
                .max(1),
            node,
            instances: self
                .instances
                .iter()
                .filter_map(|(id, series)| Some((id.clone(), series.summary()?)))
                .collect(),
            requests: BTreeMap::new(),
        };
        self.period_start = now;
        self.node.iter_mut().for_each(Series::carry_over);
        self.instances.values_mut().for_each(Series::carry_over);
        Some(report)
    }
}

/// Samples and reports until `shutdown` turns true; a gate node's
/// reports carry the requests its gate forwarded over each period.
pub async fn keep_reporting(
    runtime: Arc<dyn Runtime>,
    sink: Arc<dyn UsageSink>,
    (node, gate): (String, Option<Arc<dyn RequestCounts>>),
    options: UsageOptions,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut counted = BTreeMap::new();
    let mut tracker = Tracker::new(cca_model::clock::now_millis());
    // A zero period would make the interval panic.
    let mut samples = tokio::time::interval(options.sample_every.max(Duration::from_millis(1)));
    samples.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let per_report =
        (options.report_every.as_millis() / options.sample_every.as_millis().max(1)).max(1);
    let mut taken = 0u128;
    loop {
        tokio::select! {
            _ = samples.tick() => {}
            // Asked to stop, or nobody left who could ask.
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let instances = read_instances(runtime.as_ref()).await;
        let node_reading = match options.node {
            NodeMeter::Host => host_reading(),
            NodeMeter::Instances => Some(sum(instances.iter().map(|(_, _, usage)| *usage))),
        };
        let Some(node_reading) = node_reading else {
            tracing::debug!("the node's usage could not be read from /proc");
            continue;
        };
        let now = cca_model::clock::now_millis();
        tracker.sample(now, node_reading, instances);
        taken += 1;
        if !taken.is_multiple_of(per_report) {
            continue;
        }
        let Some(mut report) = tracker.report(now) else {
            continue;
        };
        if let Some(gate) = &gate {
            let totals = gate.requests();
            report.requests = requests_since(&counted, totals.clone());
            counted = totals;
        }
        if let Err(error) = sink.send(&node, &report).await {
            tracing::debug!(%error, "reporting the node's usage failed; the next period's goes");
        }
    }
}

/// Each running instance's id, run and reading; one that cannot be read
/// now is left out of this sample.
async fn read_instances(runtime: &dyn Runtime) -> Vec<(String, Millis, Usage)> {
    let Ok(statuses) = runtime.list().await else {
        return Vec::new();
    };
    let mut readings = Vec::with_capacity(statuses.len());
    for status in statuses {
        if status.state != InstanceState::Running {
            continue;
        }
        match runtime.usage(&status.id).await {
            Ok(usage) => readings.push((status.id, status.started_at_ms.unwrap_or(0), usage)),
            Err(error) => tracing::debug!(instance = %status.id, %error, "no usage reading"),
        }
    }
    readings
}

fn sum(readings: impl Iterator<Item = Usage>) -> Usage {
    readings.fold(Usage::default(), |total, usage| Usage {
        cpu_nanos: total.cpu_nanos.saturating_add(usage.cpu_nanos),
        memory_bytes: total.memory_bytes.saturating_add(usage.memory_bytes),
    })
}

/// The host's CPU time spent busy so far and its memory in use now.
fn host_reading() -> Option<Usage> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    Some(Usage {
        cpu_nanos: busy_ticks(&stat)?.saturating_mul(1_000_000_000)
            / rustix::param::clock_ticks_per_second().max(1),
        memory_bytes: memory_in_use(&meminfo)?,
    })
}

/// Ticks every CPU spent on anything but idling or waiting for IO: the
/// first line of `/proc/stat` (user nice system idle iowait irq softirq
/// steal …; guest time is already in user).
fn busy_ticks(stat: &str) -> Option<u64> {
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .take(8)
        .map(|field| field.parse().ok())
        .collect::<Option<_>>()?;
    let [user, nice, system, _idle, _iowait, irq, softirq, steal] = fields[..] else {
        return None;
    };
    Some(user + nice + system + irq + softirq + steal)
}

/// `MemTotal - MemAvailable`: what the host could not hand out now.
fn memory_in_use(meminfo: &str) -> Option<u64> {
    let total = crate::node::meminfo_bytes(meminfo, "MemTotal")?;
    Some(total.saturating_sub(crate::node::meminfo_bytes(meminfo, "MemAvailable")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(cpu_ms: u64, memory_mib: u64) -> Usage {
        Usage {
            cpu_nanos: cpu_ms * 1_000_000,
            memory_bytes: memory_mib << 20,
        }
    }

    fn instance(id: &str, run: Millis, cpu_ms: u64, memory_mib: u64) -> (String, Millis, Usage) {
        (id.to_owned(), run, reading(cpu_ms, memory_mib))
    }

    #[test]
    fn a_period_reports_mean_and_peak_cpu_and_last_and_peak_memory() {
        let mut tracker = Tracker::new(0);
        tracker.sample(0, reading(0, 100), [instance("a", 1, 0, 10)]);
        assert_eq!(tracker.report(1), None, "one reading spans no time");
        // a: 1 s of CPU in 5 s (200m), then 4 s in 5 s (800m).
        tracker.sample(5_000, reading(2_000, 120), [instance("a", 1, 1_000, 40)]);
        tracker.sample(10_000, reading(8_000, 110), [instance("a", 1, 5_000, 20)]);
        let report = tracker.report(10_000).expect("a summary");
        assert_eq!(report.period_ms, 10_000);
        assert_eq!(
            report.node,
            UsageSummary {
                cpu_millis: 800,
                cpu_peak_millis: 1_200,
                memory_bytes: 110 << 20,
                memory_peak_bytes: 120 << 20,
            }
        );
        assert_eq!(
            report.instances["a"],
            UsageSummary {
                cpu_millis: 500,
                cpu_peak_millis: 800,
                memory_bytes: 20 << 20,
                memory_peak_bytes: 40 << 20,
            }
        );
        // The next period starts from the last reading.
        tracker.sample(15_000, reading(8_500, 110), [instance("a", 1, 5_500, 20)]);
        let next = tracker.report(15_000).expect("a summary");
        assert_eq!(next.period_ms, 5_000);
        assert_eq!(next.instances["a"].cpu_millis, 100);
        assert_eq!(next.instances["a"].memory_peak_bytes, 20 << 20);
    }

    #[test]
    fn a_restarted_or_new_instance_waits_for_two_readings_and_gone_ones_are_dropped() {
        let mut tracker = Tracker::new(0);
        tracker.sample(
            0,
            reading(0, 1),
            [instance("a", 1, 0, 1), instance("b", 1, 0, 1)],
        );
        // a restarted (a new run), b ended, c started.
        tracker.sample(
            5_000,
            reading(100, 1),
            [instance("a", 2, 10, 1), instance("c", 3, 50, 1)],
        );
        let report = tracker.report(5_000).expect("a summary");
        assert!(report.instances.is_empty(), "{report:?}");
        tracker.sample(
            10_000,
            reading(200, 1),
            [instance("a", 2, 510, 1), instance("c", 3, 50, 1)],
        );
        let report = tracker.report(10_000).expect("a summary");
        assert_eq!(report.instances.keys().collect::<Vec<_>>(), ["a", "c"]);
        assert_eq!(report.instances["a"].cpu_millis, 100);
        assert_eq!(report.instances["c"].cpu_millis, 0);
    }

    #[test]
    fn a_counter_that_went_back_restarts_its_series_without_a_rate() {
        let mut tracker = Tracker::new(0);
        tracker.sample(0, reading(0, 1), [instance("a", 1, 9_000, 1)]);
        tracker.sample(5_000, reading(10, 1), [instance("a", 1, 100, 1)]);
        tracker.sample(10_000, reading(20, 1), [instance("a", 1, 600, 1)]);
        let report = tracker.report(10_000).expect("a summary");
        assert_eq!(
            report.instances["a"].cpu_millis, 100,
            "only the sound interval"
        );
    }

    #[test]
    fn the_hosts_busy_time_and_memory_in_use_are_read_from_proc_texts() {
        let stat = "cpu  100 5 50 1000 20 3 2 1 0 0\ncpu0 50 2 25 500 10 1 1 0 0 0\n";
        assert_eq!(busy_ticks(stat), Some(161));
        assert_eq!(busy_ticks("cpu0 1 2 3\n"), None);
        let meminfo =
            "MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(memory_in_use(meminfo), Some(4_000_000 * 1024));
        assert_eq!(memory_in_use("MemTotal: 1 kB\n"), None);
        let host = host_reading().expect("this host's /proc");
        assert!(host.cpu_nanos > 0 && host.memory_bytes > 0, "{host:?}");
    }

    /// A gate whose `web` count grows by 10 each time it is read.
    #[derive(Default)]
    struct GateCounts(std::sync::atomic::AtomicU64);

    impl RequestCounts for GateCounts {
        fn requests(&self) -> BTreeMap<String, u64> {
            let total = self.0.fetch_add(10, std::sync::atomic::Ordering::Relaxed) + 10;
            BTreeMap::from([("web".to_owned(), total), ("idle".to_owned(), 0)])
        }
    }

    #[test]
    fn a_period_reports_the_requests_since_the_last() {
        let before = BTreeMap::from([("web".to_owned(), 5), ("gone".to_owned(), 9)]);
        let now = BTreeMap::from([("web".to_owned(), 12), ("new".to_owned(), 3)]);
        assert_eq!(
            requests_since(&before, now),
            BTreeMap::from([("web".to_owned(), 7), ("new".to_owned(), 3)])
        );
    }

    /// Summaries received, in order.
    #[derive(Default)]
    struct Recorder(std::sync::Mutex<Vec<(String, NodeUsage)>>);

    #[async_trait]
    impl UsageSink for Recorder {
        async fn send(&self, node: &str, usage: &NodeUsage) -> Result<(), String> {
            self.0
                .lock()
                .expect("recorder")
                .push((node.to_owned(), usage.clone()));
            Ok(())
        }
    }

    #[tokio::test]
    async fn the_loop_reports_each_running_instance_once_a_period() {
        let runtime = Arc::new(cca_runtime::fake::FakeRuntime::new());
        let spec = cca_runtime::InstanceSpec::new("web-1", "web", "run");
        runtime.create(spec.clone()).await.expect("create");
        runtime.start("web-1").await.expect("start");
        runtime
            .create(cca_runtime::InstanceSpec::new("idle-1", "idle", "run"))
            .await
            .expect("create");
        runtime.set_usage(
            "web-1",
            Usage {
                cpu_nanos: 0,
                memory_bytes: 32 << 20,
            },
        );
        let recorder = Arc::new(Recorder::default());
        let (stop, shutdown) = watch::channel(false);
        let options = UsageOptions {
            sample_every: Duration::from_millis(20),
            report_every: Duration::from_millis(60),
            node: NodeMeter::Instances,
        };
        let gate: Arc<dyn RequestCounts> = Arc::new(GateCounts::default());
        let task = tokio::spawn(keep_reporting(
            runtime.clone(),
            recorder.clone(),
            ("n1".to_owned(), Some(gate)),
            options,
            shutdown,
        ));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let reports = loop {
            let reports = recorder.0.lock().expect("recorder").clone();
            if reports.len() >= 2 {
                break reports;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no reports: {reports:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        stop.send(true).expect("stop");
        task.await.expect("the loop ends on shutdown");
        let (node, report) = &reports[1];
        assert_eq!(node, "n1");
        assert_eq!(
            report.requests,
            BTreeMap::from([("web".to_owned(), 10)]),
            "the period's requests, not the total"
        );
        assert_eq!(
            report.instances.keys().collect::<Vec<_>>(),
            ["web-1"],
            "only the running instance"
        );
        assert_eq!(report.instances["web-1"].memory_bytes, 32 << 20);
        assert_eq!(
            report.node.memory_bytes,
            32 << 20,
            "the sum of the instances"
        );
    }
}
