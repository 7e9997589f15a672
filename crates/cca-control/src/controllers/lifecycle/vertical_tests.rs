//! Vertical recommendations, pass by pass over a view with usage reports:
//! one sample per step whatever the reports, nothing until enough samples
//! count, the 95th percentile with its margin within the block's bounds,
//! steady within the tolerance, following the window as it slides, and
//! gone with the block. Every pass is also planned from the changes alone,
//! which must plan the same.

use std::collections::BTreeMap;

use cca_model::cluster::InstanceState;
use cca_model::keys;
use cca_model::spec::{Autoscale, Cpu, Memory, ServiceSpec, VerticalScale};
use cca_model::usage::{NodeUsage, UsageSummary};
use cca_model::vertical::{MIN_SAMPLES, Sizes, VERTICAL_WINDOW, VerticalScaled};

use super::tests::Cluster;
use crate::controller::Write;
use crate::controllers::fixtures::service;

/// A sample is due once a minute with the default window of an hour.
const STEP: i64 = VERTICAL_WINDOW / 60;
const MIB: u64 = 1 << 20;

/// `api` with a vertical block within `min_cpu`..`max_cpu`.
fn sized(min_cpu: Option<u64>, max_cpu: Option<u64>) -> ServiceSpec {
    let mut spec = service("api", 2);
    spec.autoscale = Some(Autoscale {
        horizontal: None,
        vertical: Some(VerticalScale {
            min_cpu: min_cpu.map(Cpu),
            max_cpu: max_cpu.map(Cpu),
            min_memory: None,
            max_memory: Some(Memory(512 * MIB)),
            ..VerticalScale::default()
        }),
    });
    spec
}

fn running(spec: &ServiceSpec) -> Cluster {
    let mut cluster = Cluster::default();
    cluster.apply(spec);
    for n in 1..=2 {
        cluster.instance(&format!("api-{n}"), spec, InstanceState::Running, 0);
    }
    cluster.pass();
    cluster
}

impl Cluster {
    /// Node `n1` reports `api-1` and `api-2`, each at `cpu` millicores and
    /// a memory peak of `memory`.
    fn report_sizes(&mut self, cpu: u64, memory: u64) {
        let usage = UsageSummary {
            cpu_millis: cpu,
            cpu_peak_millis: cpu,
            memory_bytes: memory,
            memory_peak_bytes: memory,
        };
        let instances: BTreeMap<String, UsageSummary> =
            (1..=2).map(|n| (format!("api-{n}"), usage)).collect();
        let report = NodeUsage {
            at: self.now,
            period_ms: 30_000,
            node: UsageSummary::default(),
            instances,
        };
        self.put(&keys::observed_usage("n1"), &report);
    }

    fn vertical(&self) -> VerticalScaled {
        (*self.view.vertical.get("api").expect("decided").value).clone()
    }

    /// `samples` steps, each with a report at `cpu`/`memory`.
    fn sample_steps(&mut self, samples: u64, cpu: u64, memory: u64) {
        for _ in 0..samples {
            self.now += STEP;
            self.report_sizes(cpu, memory);
            self.pass();
        }
    }
}

#[test]
fn one_sample_per_step_and_no_recommendation_before_enough_count() {
    let mut cluster = running(&sized(None, None));
    cluster.now = 1;
    cluster.report_sizes(100, 64 * MIB);
    let plan = cluster.pass();
    assert_eq!(cluster.vertical().samples, 2, "both instances counted");
    assert_eq!(
        plan.requeue_after,
        Some(STEP),
        "the next sample is due in a step"
    );
    // Another report within the step: nothing written.
    cluster.now += STEP / 2;
    cluster.report_sizes(900, 64 * MIB);
    let plan = cluster.pass();
    assert!(plan.writes.is_empty(), "{:?}", plan.writes);
    assert_eq!(cluster.vertical().samples, 2);
    // Two instances a step: MIN_SAMPLES / 2 steps in all.
    cluster.sample_steps(MIN_SAMPLES / 2 - 2, 100, 64 * MIB);
    assert_eq!(cluster.vertical().samples, MIN_SAMPLES - 2);
    assert_eq!(cluster.vertical().recommended, None, "too few samples");
    let plan = {
        cluster.now += STEP;
        cluster.report_sizes(100, 64 * MIB);
        cluster.pass()
    };
    let decided = cluster.vertical();
    let sizes = decided.recommended.expect("enough samples");
    // The p95 bucket of 100m is 100..105m; +15% → 115..121m.
    assert!((115..=121).contains(&sizes.cpu), "{sizes:?}");
    assert!((76 * MIB..=81 * MIB).contains(&sizes.memory), "{sizes:?}");
    assert!(
        plan.events
            .iter()
            .any(|event| event.message.starts_with("vertical recommendation: ")),
        "{:?}",
        plan.events
    );
}

#[test]
fn the_recommendation_follows_the_p95_within_the_bounds_and_holds_within_tolerance() {
    let mut cluster = running(&sized(Some(250), Some(1_000)));
    // 95 of 100 samples light, 5 at 2 cores: the p95 is light, and the
    // floor of 250m holds it up.
    cluster.sample_steps(48, 50, 32 * MIB);
    cluster.sample_steps(2, 2_000, 32 * MIB);
    let sizes = cluster.vertical().recommended.expect("enough samples");
    assert_eq!(sizes.cpu, 250, "min_cpu");
    // Heavy from now on: the p95 moves up to it, capped by max_cpu and
    // max_memory.
    cluster.sample_steps(10, 2_000, 900 * MIB);
    let sizes = cluster.vertical().recommended.expect("enough samples");
    assert_eq!(
        sizes,
        Sizes {
            cpu: 1_000,
            memory: 512 * MIB
        }
    );
    // A bound 5% higher: within the tolerance of the held recommendation,
    // so no new one, and `describe` does not wander.
    cluster.apply(&sized(Some(250), Some(1_050)));
    cluster.pass();
    assert_eq!(cluster.vertical().recommended.expect("held").cpu, 1_000);
}

#[test]
fn old_samples_leave_with_the_window() {
    let mut cluster = running(&sized(None, None));
    cluster.sample_steps(30, 800, 64 * MIB);
    let high = cluster.vertical().recommended.expect("enough samples");
    assert!(high.cpu >= 800, "{high:?}");
    // An hour and more of light use: the heavy samples are out of the window.
    cluster.sample_steps(70, 100, 64 * MIB);
    let decided = cluster.vertical();
    let low = decided.recommended.expect("enough samples");
    assert!(low.cpu < 200, "{low:?}");
    assert!(decided.samples <= 2 * 70, "{}", decided.samples);
    let oldest = decided.slices.first().expect("slices").from;
    assert!(oldest > cluster.now - VERTICAL_WINDOW - VERTICAL_WINDOW / 6);
}

#[test]
fn without_the_block_the_fact_goes() {
    let mut cluster = running(&sized(None, None));
    cluster.now = 1;
    cluster.report_sizes(100, 64 * MIB);
    cluster.pass();
    assert!(cluster.view.vertical.get("api").is_some());
    cluster.apply(&service("api", 2));
    let plan = cluster.pass();
    assert!(
        plan.writes
            .iter()
            .any(|write| matches!(write, Write::Delete { key } if key == "derived/vertical/api")),
        "{:?}",
        plan.writes
    );
    assert!(cluster.view.vertical.get("api").is_none());
}
