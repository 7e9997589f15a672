//! Vertical recommendations, pass by pass over a view with usage reports:
//! one sample per step whatever the reports, nothing until enough samples
//! count, the 95th percentile with its margin within the block's bounds,
//! steady within the tolerance, following the window as it slides, and
//! gone with the block. Every pass is also planned from the changes alone,
//! which must plan the same.

use std::collections::BTreeMap;

use cca_model::cluster::{Instance, InstanceState};
use cca_model::spec::{
    Autoscale, Cpu, HorizontalScale, Memory, Percent, Resources, ServiceSpec, VerticalMode,
    VerticalScale,
};
use cca_model::usage::UsageSummary;
use cca_model::vertical::{MIN_SAMPLES, Sizes, VERTICAL_WINDOW, VerticalScaled};

use super::tests::Cluster;
use crate::controller::{Controller, Write};
use crate::controllers::SchedulerController;
use crate::controllers::fixtures::{ViewBuilder, context, service};

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
        self.report_usage("n1", instances);
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

fn auto(spec: &mut ServiceSpec) {
    let vertical = spec
        .autoscale
        .as_mut()
        .and_then(|autoscale| autoscale.vertical.as_mut())
        .expect("a vertical block");
    vertical.mode = VerticalMode::Auto;
}

/// The scheduler's writes for `cluster`'s view on one node of `cpu`
/// millicores and `memory_mi` MiB.
fn schedule(cluster: &Cluster, cpu: u64, memory_mi: u64) -> Vec<(String, Instance)> {
    let view = ViewBuilder::from(cluster.view.clone())
        .node("n1", cpu, memory_mi)
        .build();
    let plan = SchedulerController::default().reconcile(&view, &context(cluster.now));
    plan.writes
        .iter()
        .filter_map(|write| match write {
            Write::Put { key, value } if key.starts_with("derived/instance/") => Some((
                key.clone(),
                serde_json::from_slice(value).expect("an instance"),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn auto_mode_applies_the_recommendation_and_the_scheduler_resizes_in_place() {
    let mut spec = sized(None, None);
    auto(&mut spec);
    let mut cluster = running(&spec);
    assert!(
        cluster
            .vertical()
            .holding
            .expect("why")
            .contains("waiting for")
    );
    cluster.sample_steps(MIN_SAMPLES / 2, 100, 64 * MIB);
    let decided = cluster.vertical();
    let sizes = decided.recommended.expect("enough samples");
    let applied = decided.applied.expect("auto applies it");
    assert_eq!(
        applied,
        Resources {
            cpu: Some(Cpu(sizes.cpu)),
            memory: Some(Memory(sizes.memory))
        }
    );
    // Room on the node: both instances resized in place, same ids.
    let resized = schedule(&cluster, 8_000, 16_384);
    assert_eq!(resized.len(), 2, "{resized:?}");
    for (_, instance) in &resized {
        assert_eq!(instance.resized.as_ref(), Some(&applied));
        assert_eq!(instance.cpu, Cpu(sizes.cpu));
        assert!(!instance.stopping, "not replaced");
    }
    // A busy service on a small node: no room to grow, nothing resized.
    let mut busy = running(&spec);
    busy.sample_steps(MIN_SAMPLES / 2, 3_000, 64 * MIB);
    assert!(busy.vertical().applied.expect("applied").cpu > Some(Cpu(3_000)));
    assert!(schedule(&busy, 1_000, 16_384).is_empty());
}

#[test]
fn auto_mode_leaves_horizontals_metric_alone_and_holds_during_a_rollout() {
    let mut spec = sized(None, None);
    auto(&mut spec);
    spec.autoscale.as_mut().expect("autoscale").horizontal = Some(HorizontalScale {
        min: 2,
        max: 4,
        cpu: Some(Percent(70)),
        memory: None,
        requests_per_second: None,
    });
    let mut cluster = running(&spec);
    cluster.sample_steps(MIN_SAMPLES / 2, 100, 64 * MIB);
    let decided = cluster.vertical();
    let applied = decided.applied.expect("memory applied");
    assert_eq!(
        applied.cpu, spec.resources.cpu,
        "cpu stays the spec's: horizontal follows it"
    );
    assert!(applied.memory.is_some());
    assert!(decided.holding.expect("why").contains("cpu stays"));
    // A new version rolls out: the applied sizes hold where they are.
    let mut next = spec.clone();
    next.env.insert("V".into(), "2".into());
    cluster.apply(&next);
    cluster.sample_steps(MIN_SAMPLES, 900, 300 * MIB);
    let decided = cluster.vertical();
    assert_eq!(decided.applied, Some(applied));
    assert!(decided.holding.expect("why").contains("rollout"));
}
