//! The control plane's Prometheus metrics: per-controller reconcile cycles,
//! durations, errors and conflicts, scheduler placements and unplaced
//! demand, leadership, and store transaction latency. The runner records;
//! the API server renders them at `GET /metrics` through [`Metrics::render`]
//! in the Prometheus text format 0.0.4 (see [`Metrics::render`] for why not
//! OpenMetrics).

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    pub controller: String,
}

fn latency_histogram() -> Histogram {
    // 50 µs … ~1.6 s
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

/// Every control-plane metric, registered once.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    pub cycles: Family<ControllerLabel, Counter>,
    pub cycle_seconds: Family<ControllerLabel, Histogram, fn() -> Histogram>,
    pub errors: Family<ControllerLabel, Counter>,
    pub conflicts: Family<ControllerLabel, Counter>,
    pub writes: Family<ControllerLabel, Counter>,
    pub placements: Counter,
    pub unplaced_services: Gauge,
    pub leader: Gauge,
    /// Times leadership ended without this server giving it up: its lease
    /// was not renewed in time, or another server's record replaced it.
    pub leadership_lost: Counter,
    /// 1 while lost-node replacement is paused (too many nodes missing).
    pub replacement_paused: Gauge,
    /// Nodes whose heartbeat lease is gone.
    pub nodes_unreachable: Gauge,
    pub store_txn_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let metrics = Self {
            registry: Mutex::new(Registry::default()),
            cycles: Family::default(),
            cycle_seconds: Family::new_with_constructor(latency_histogram),
            errors: Family::default(),
            conflicts: Family::default(),
            writes: Family::default(),
            placements: Counter::default(),
            unplaced_services: Gauge::default(),
            leader: Gauge::default(),
            leadership_lost: Counter::default(),
            replacement_paused: Gauge::default(),
            nodes_unreachable: Gauge::default(),
            store_txn_seconds: latency_histogram(),
        };
        metrics.register_all();
        metrics
    }

    /// Makes every per-controller series of `controllers` exist from now
    /// on, at zero: a dashboard or an operator's grep finds
    /// `reconciliation_errors_total` before the first error, not only after.
    pub fn know_controllers(&self, controllers: &[&str]) {
        for name in controllers {
            let label = ControllerLabel {
                controller: (*name).to_owned(),
            };
            drop(self.cycles.get_or_create(&label));
            drop(self.cycle_seconds.get_or_create(&label));
            drop(self.errors.get_or_create(&label));
            drop(self.conflicts.get_or_create(&label));
            drop(self.writes.get_or_create(&label));
        }
    }

    fn register_all(&self) {
        let mut registry = self.lock();
        registry.register(
            "reconciliation_cycle",
            "Reconcile cycles run, per controller",
            self.cycles.clone(),
        );
        registry.register(
            "reconciliation_cycle_duration_seconds",
            "Time from taking a view to committing the plan, per controller",
            self.cycle_seconds.clone(),
        );
        registry.register(
            "reconciliation_errors",
            "Reconcile cycles that failed (store errors, refused writes), per controller",
            self.errors.clone(),
        );
        registry.register(
            "reconciliation_conflicts",
            "Plans refused because a fact changed since the view was taken, per controller",
            self.conflicts.clone(),
        );
        registry.register(
            "reconciliation_writes",
            "Facts written, per controller",
            self.writes.clone(),
        );
        registry.register(
            "scheduler_placements",
            "Instances placed on a node",
            self.placements.clone(),
        );
        registry.register(
            "scheduler_unplaced_services",
            "Services with demand the scheduler cannot place",
            self.unplaced_services.clone(),
        );
        registry.register(
            "leader",
            "1 while this server runs the controllers",
            self.leader.clone(),
        );
        registry.register(
            "leadership_lost",
            "Times this server lost leadership it had not given up (its lease lapsed or was taken)",
            self.leadership_lost.clone(),
        );
        registry.register(
            "node_replacement_paused",
            "1 while lost-node replacement is paused because many nodes missed their leases at once",
            self.replacement_paused.clone(),
        );
        registry.register(
            "nodes_unreachable",
            "Registered nodes whose heartbeat lease is gone",
            self.nodes_unreachable.clone(),
        );
        registry.register(
            "store_transaction_duration_seconds",
            "Latency of the runner's store transactions",
            self.store_txn_seconds.clone(),
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The label for one controller.
    pub fn label(controller: &str) -> ControllerLabel {
        ControllerLabel {
            controller: controller.to_owned(),
        }
    }

    /// Prometheus text exposition (format 0.0.4) of every metric (see
    /// [`cca_model::exposition`] for why not OpenMetrics).
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode_registry(&mut text, &self.lock());
        cca_model::exposition::openmetrics_to_text_format(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_documented_names() {
        let metrics = Metrics::new();
        metrics
            .cycles
            .get_or_create(&Metrics::label("scheduler"))
            .inc();
        metrics
            .errors
            .get_or_create(&Metrics::label("scheduler"))
            .inc();
        metrics
            .cycle_seconds
            .get_or_create(&Metrics::label("scheduler"))
            .observe(0.001);
        let text = metrics.render();
        for name in [
            "reconciliation_cycle_total{controller=\"scheduler\"} 1",
            "reconciliation_errors_total{controller=\"scheduler\"} 1",
            "reconciliation_cycle_duration_seconds_count{controller=\"scheduler\"} 1",
            "store_transaction_duration_seconds_bucket",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }

    /// The series an operator greps for exist at zero before anything
    /// happened.
    #[test]
    fn known_controllers_have_their_series_at_zero_from_the_start() {
        let metrics = Metrics::new();
        metrics.know_controllers(&["scheduler", "node"]);
        let text = metrics.render();
        for name in [
            "reconciliation_errors_total{controller=\"scheduler\"} 0",
            "reconciliation_errors_total{controller=\"node\"} 0",
            "reconciliation_cycle_total{controller=\"node\"} 0",
            "reconciliation_cycle_duration_seconds_count{controller=\"node\"} 0",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }

    #[test]
    fn counter_families_are_named_like_their_samples_and_nothing_openmetrics_is_left() {
        let metrics = Metrics::new();
        metrics.placements.inc();
        let text = metrics.render();
        assert!(
            text.contains(
                "# HELP scheduler_placements_total Instances placed on a node.\n\
                 # TYPE scheduler_placements_total counter\n\
                 scheduler_placements_total 1\n"
            ),
            "{text}"
        );
        assert!(text.contains("# TYPE leader gauge\n"), "{text}");
        assert!(text.contains("\nleadership_lost_total 0\n"), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
    }
}
