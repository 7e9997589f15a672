//! Horizontal autoscaling, pass by pass over a view with usage reports:
//! up fast within a step, down only to the highest recommendation of the
//! window, held during a rollout, never outside min..max, and a periodic
//! load does not make the count flap. Every pass is also planned from the
//! changes alone, which must plan the same.

use std::collections::BTreeMap;

use cca_model::autoscale::{Autoscaled, SCALE_DOWN_WINDOW};
use cca_model::cluster::InstanceState;
use cca_model::keys;
use cca_model::spec::{Autoscale, HorizontalScale, Percent, ServiceSpec};
use cca_model::usage::{NodeUsage, UsageSummary};

use super::tests::Cluster;
use crate::controller::{Controller, Write};
use crate::controllers::SchedulerController;
use crate::controllers::fixtures::{ViewBuilder, context, service};

/// `web`, 2 replicas, autoscaled 2..10 on cpu at 70% of its 100m request.
fn autoscaled() -> ServiceSpec {
    let mut spec = service("web", 2);
    spec.autoscale = Some(Autoscale {
        horizontal: Some(HorizontalScale {
            min: 2,
            max: 10,
            cpu: Some(Percent(70)),
            memory: None,
            requests_per_second: None,
        }),
        vertical: None,
    });
    spec
}

impl Cluster {
    /// `count` ready instances `web-1`.. of `spec`.
    fn ready(&mut self, spec: &ServiceSpec, count: u32) {
        for n in 1..=count {
            self.instance(&format!("web-{n}"), spec, InstanceState::Running, 0);
        }
    }

    /// Node `n1` reports each of `web-1..=count` using `cpu` millicores.
    fn report(&mut self, count: u32, cpu: u64) {
        let instances: BTreeMap<String, UsageSummary> = (1..=count)
            .map(|n| {
                let usage = UsageSummary {
                    cpu_millis: cpu,
                    cpu_peak_millis: cpu,
                    memory_bytes: 10 << 20,
                    memory_peak_bytes: 10 << 20,
                };
                (format!("web-{n}"), usage)
            })
            .collect();
        self.report_usage("n1", instances);
    }

    fn autoscaled(&self) -> Autoscaled {
        (*self.view.autoscaled.get("web").expect("decided").value).clone()
    }
}

/// `web` applied with `count` ready instances, its rollout complete.
fn running(count: u32) -> Cluster {
    let mut cluster = Cluster::default();
    cluster.apply(&autoscaled());
    cluster.ready(&autoscaled(), count);
    cluster.pass();
    cluster
}

#[test]
fn load_above_target_scales_up_at_once_within_a_step() {
    let mut cluster = running(2);
    assert_eq!(cluster.autoscaled().replicas, 2, "no reports: spec's count");
    cluster.now = 30_000;
    cluster.report(2, 140);
    let plan = cluster.pass();
    let decided = cluster.autoscaled();
    assert_eq!((decided.replicas, decided.recommended), (4, 4));
    let change = decided.last_change.expect("a change");
    assert_eq!((change.from, change.to, change.at), (2, 4, 30_000));
    assert_eq!(change.signals[0].utilization, 140);
    assert!(
        plan.events[0]
            .message
            .contains("cpu at 140% of requests against a 70% target"),
        "{:?}",
        plan.events
    );
    // Far above: at most doubling (or +4) per step, and never past max.
    cluster.ready(&autoscaled(), 4);
    cluster.now = 60_000;
    cluster.report(4, 1_000);
    cluster.pass();
    let decided = cluster.autoscaled();
    assert_eq!((decided.replicas, decided.recommended), (8, 10));
    assert!(decided.holding.expect("why").contains("stepping up"));
}

#[test]
fn a_scale_down_waits_for_the_window_and_goes_to_its_highest_recommendation() {
    let mut cluster = running(2);
    cluster.now = 30_000;
    cluster.report(2, 280); // recommends 8; a step from 2 goes to 6
    cluster.pass();
    let decided = cluster.autoscaled();
    assert_eq!((decided.replicas, decided.recommended), (6, 8));
    cluster.ready(&autoscaled(), 6);
    cluster.now = 60_000;
    cluster.report(6, 70); // on target: recommends 6
    cluster.pass();
    assert_eq!(cluster.autoscaled().replicas, 6);
    cluster.now = 90_000;
    cluster.report(6, 10); // recommends the minimum
    let plan = cluster.pass();
    let decided = cluster.autoscaled();
    assert_eq!((decided.replicas, decided.recommended), (6, 2));
    assert!(
        decided.holding.expect("why").contains("waits"),
        "held by the window"
    );
    assert_eq!(
        plan.requeue_after,
        Some(SCALE_DOWN_WINDOW - 30_000),
        "woken when the oldest recommendation leaves the window"
    );
    // Past the window of the 8 but within that of the 6.
    cluster.now = 60_000 + SCALE_DOWN_WINDOW + 1;
    cluster.report(6, 10);
    cluster.pass();
    assert_eq!(cluster.autoscaled().replicas, 6);
    cluster.now = 90_000 + SCALE_DOWN_WINDOW + 1;
    cluster.report(6, 10);
    let plan = cluster.pass();
    let decided = cluster.autoscaled();
    assert_eq!(decided.replicas, 2, "the low load held for a whole window");
    assert!(plan.events[0].message.contains("autoscaled from 6 to 2"));
}

#[test]
fn a_periodic_load_does_not_make_the_count_flap() {
    let mut cluster = running(2);
    let mut counts = Vec::new();
    // A minute of high load, a minute of low, for 30 minutes.
    for step in 1..=60 {
        cluster.now = step * 30_000;
        let high = (step / 2) % 2 == 0;
        let replicas = cluster.view.wanted_replicas("web").expect("a count");
        cluster.ready(&autoscaled(), replicas);
        let total = if high { 420 } else { 70 };
        cluster.report(replicas, total / u64::from(replicas));
        cluster.pass();
        counts.push(cluster.autoscaled().replicas);
    }
    let changes = counts.windows(2).filter(|pair| pair[0] != pair[1]).count();
    assert!(changes <= 2, "the count flapped: {counts:?}");
    assert_eq!(
        counts.last(),
        Some(&6),
        "it holds the peaks' count: {counts:?}"
    );
}

#[test]
fn the_count_holds_while_a_rollout_progresses_and_stays_within_bounds() {
    let mut cluster = running(2);
    let mut next = autoscaled();
    next.env.insert("V".into(), "2".into());
    cluster.apply(&next);
    cluster.now = 30_000;
    cluster.report(2, 500);
    cluster.pass();
    let decided = cluster.autoscaled();
    assert_eq!(decided.replicas, 2);
    assert!(
        decided.holding.expect("why").contains("rollout"),
        "held during the rollout"
    );
    // Tighter bounds apply at once, whatever the signals say.
    let mut bounded = next.clone();
    if let Some(h) = bounded
        .autoscale
        .as_mut()
        .and_then(|a| a.horizontal.as_mut())
    {
        h.min = 3;
    }
    cluster.apply(&bounded);
    cluster.now = 31_000;
    cluster.pass();
    assert_eq!(cluster.autoscaled().replicas, 3);
    // Without autoscale, the fact goes and the spec's count rules.
    let mut plain = bounded;
    plain.autoscale = None;
    cluster.apply(&plain);
    let plan = cluster.pass();
    assert!(
        plan.writes
            .contains(&Write::delete(keys::derived_autoscale("web"))),
        "{:?}",
        plan.writes
    );
    assert_eq!(cluster.view.wanted_replicas("web"), Some(2));
}

#[test]
fn stale_reports_and_not_ready_instances_count_for_nothing() {
    let mut cluster = running(2);
    cluster.now = 30_000;
    cluster.report(2, 500);
    cluster.now = 30_000 + 3 * 30_000 + 1;
    cluster.pass();
    assert_eq!(
        cluster.autoscaled().replicas,
        2,
        "a report three periods old is stale"
    );
    cluster.instance("web-1", &autoscaled(), InstanceState::Starting, 0);
    cluster.report(2, 300);
    cluster.pass();
    let signal = &cluster.autoscaled().last_change.expect("a change").signals[0];
    assert_eq!(signal.reporting, 1, "only the ready instance counts");
}

#[test]
fn the_scheduler_runs_the_autoscaled_count() {
    let mut cluster = running(2);
    cluster.now = 30_000;
    cluster.report(2, 140);
    cluster.pass();
    assert_eq!(cluster.autoscaled().replicas, 4);
    let view = ViewBuilder::from(cluster.view.clone())
        .node("n1", 8000, 16384)
        .build();
    let plan = SchedulerController::default().reconcile(&view, &context(cluster.now));
    let created = plan
        .writes
        .iter()
        .filter(|write| matches!(write, Write::Put { .. }))
        .count();
    assert_eq!(created, 2, "two more for the autoscaled four");
}

#[test]
fn requests_per_second_through_the_gates_scale_the_count() {
    let mut spec = autoscaled();
    let horizontal = spec
        .autoscale
        .as_mut()
        .and_then(|autoscale| autoscale.horizontal.as_mut())
        .expect("horizontal");
    horizontal.cpu = None;
    horizontal.requests_per_second = Some(100);
    let mut cluster = Cluster::default();
    cluster.apply(&spec);
    cluster.ready(&spec, 2);
    cluster.pass();
    cluster.now = 200_000;
    // Two gate nodes forwarded 280 requests per second between them over
    // their 30 s periods; one more node's report is stale and counts for
    // nothing.
    let reports = [
        ("g1", 6_000, 200_000),
        ("g2", 2_400, 200_000),
        ("g3", 90_000, 0),
    ];
    for (node, requests, at) in reports {
        let report = NodeUsage {
            at,
            period_ms: 30_000,
            node: UsageSummary::default(),
            instances: BTreeMap::new(),
            requests: BTreeMap::from([("web".to_owned(), requests)]),
        };
        cluster.put(&keys::observed_usage(node), &report);
    }
    let plan = cluster.pass();
    let decided = cluster.autoscaled();
    assert_eq!((decided.replicas, decided.recommended), (3, 3));
    let signal = &decided.last_change.expect("a change").signals[0];
    assert_eq!(
        signal.metric,
        cca_model::autoscale::Metric::RequestsPerSecond
    );
    assert_eq!((signal.used, signal.request), (280_000, 100_000));
    assert!(
        plan.events[0]
            .message
            .contains("requests_per_second at 280/s through the gates against 100/s per instance"),
        "{:?}",
        plan.events
    );
}
