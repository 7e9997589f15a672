//! Table tests of the scheduler on built views with an injected clock,
//! plus property tests: it never over-commits a node, always respects
//! `restrict`, is deterministic for a view, shares every service fairly
//! across nodes and spreads evenly over labels when capacity allows, and
//! does nothing on a converged cluster. Agents are simulated
//! by [`agents`]: they report every placed instance running and every
//! stopping one stopped.

use std::collections::BTreeMap;

use cca_model::cluster::{
    Disruption, Instance, InstanceState, NodeCondition, NodeControl, NodeStatus, ResumeCause,
    Unplaced, UnplacedReason,
};
use cca_model::keys;
use cca_model::ownership::{Owner, check_write};
use cca_model::recovery::{Unclaimed, UnclaimedInstance};
use cca_model::spec::{Cpu, DisruptionBudget, Memory, ServiceSpec};
use proptest::prelude::*;

use super::{SchedulerConfig, SchedulerController, spec_hash};
use crate::controller::{Context, Controller, Plan, Write};
use crate::controllers::fixtures::{MI, ViewBuilder, context, node_info, service, status};
use crate::view::View;

const NOW: i64 = 1_000_000;

fn schedule(view: &View, now: i64) -> Plan {
    SchedulerController::default().reconcile(view, &context(now))
}

fn instances(view: &View) -> Vec<Instance> {
    view.instances
        .iter()
        .map(|(_, i)| (*i.value).clone())
        .collect()
}

fn live(view: &View, service: &str) -> Vec<Instance> {
    instances(view)
        .into_iter()
        .filter(|i| i.service == service && !i.stopping)
        .collect()
}

fn puts(plan: &Plan) -> Vec<Instance> {
    plan.writes
        .iter()
        .filter_map(|write| match write {
            Write::Put { key, value } if key.starts_with(cca_model::Kind::Instance.prefix()) => {
                Some(serde_json::from_slice(value).expect("decodes"))
            }
            _ => None,
        })
        .collect()
}

fn deletes(plan: &Plan) -> Vec<String> {
    plan.writes
        .iter()
        .filter_map(|write| match write {
            Write::Delete { key } => Some(key.clone()),
            Write::Put { .. } => None,
        })
        .collect()
}

fn unplaced(view: &View, service: &str) -> Option<Unplaced> {
    view.unplaced.get(service).map(|u| (*u.value).clone())
}

/// Simulated agents at `now`: placed instances run, stopping ones stop.
fn agents(mut builder: ViewBuilder, now: i64) -> ViewBuilder {
    let view = builder.build();
    builder = ViewBuilder::from(view.clone());
    for instance in instances(&view) {
        let state = if instance.stopping {
            InstanceState::Stopped
        } else {
            InstanceState::Running
        };
        let held = view.statuses.get(&instance.id);
        if held.is_some_and(|s| s.state == state && s.node == instance.node) {
            continue;
        }
        let mut report = status(&instance.id, &instance.service, &instance.node, state);
        report.host_ports = instance.host_ports.clone();
        report.updated_at = now;
        builder = builder.status(report);
    }
    builder
}

/// Schedules, commits and lets agents report until the plan is empty.
fn converge(view: View, mut now: i64) -> (View, i64) {
    let mut builder = ViewBuilder::from(view);
    for _ in 0..60 {
        let view = agents(builder, now).build();
        let plan = schedule(&view, now);
        if plan.writes.is_empty() {
            return (view, now);
        }
        builder = ViewBuilder::from(view).apply(&plan);
        now += 1_000;
    }
    panic!("the scheduler did not converge in 60 passes");
}

fn cpu_used(view: &View) -> BTreeMap<String, u64> {
    let mut used = BTreeMap::new();
    for instance in instances(view) {
        *used.entry(instance.node.clone()).or_insert(0) += instance.cpu.0;
    }
    used
}

fn with_resources(mut spec: ServiceSpec, cpu: u64, memory_mi: u64) -> ServiceSpec {
    spec.resources.cpu = Some(Cpu(cpu));
    spec.resources.memory = Some(Memory(memory_mi * MI));
    spec
}

#[test]
fn startup_grace_places_nothing_and_requeues() {
    let view = ViewBuilder::new()
        .node("n1", 1000, 1024)
        .service(service("web", 2))
        .build();
    let context = Context {
        now: NOW,
        leader_since: NOW - 4_000,
    };
    let plan = SchedulerController::default().reconcile(&view, &context);
    assert!(plan.is_noop());
    assert_eq!(plan.requeue_after, Some(6_000));
    let after = Context {
        now: NOW + 6_000,
        leader_since: NOW - 4_000,
    };
    assert_eq!(
        puts(&SchedulerController::default().reconcile(&view, &after)).len(),
        2
    );
}

#[test]
fn shares_a_service_fairly_across_nodes() {
    let view = ViewBuilder::new()
        .node("n1", 1000, 4096)
        .node("n2", 1000, 4096)
        .service(service("web", 9))
        .build();
    let plan = schedule(&view, NOW);
    let placed = puts(&plan);
    let on = |node: &str| placed.iter().filter(|i| i.node == node).count();
    assert_eq!(
        (on("n1"), on("n2")),
        (5, 4),
        "base 4 each, the remainder on n1"
    );
    let hash = spec_hash(&service("web", 9));
    assert!(
        placed
            .iter()
            .all(|i| i.spec_hash == hash && i.created_at == NOW)
    );
    let mut ports: Vec<u16> = placed
        .iter()
        .filter(|i| i.node == "n1")
        .map(|i| i.host_ports["http"])
        .collect();
    ports.dedup();
    assert_eq!(ports.len(), 5, "host ports on one node are distinct");
    assert!(plan.guards.contains(&keys::desired_service("web")));
}

/// Live instances of `service` per node, in node order, nodes without any
/// included.
fn per_node(view: &View, service: &str) -> Vec<usize> {
    view.nodes
        .iter()
        .map(|(name, _)| {
            live(view, service)
                .iter()
                .filter(|i| &i.node == name)
                .count()
        })
        .collect()
}

#[test]
fn fair_share_is_base_plus_remainder_per_node() {
    let mut bare = service("web", 0);
    bare.resources.cpu = None;
    bare.resources.memory = None;
    // (case, node cpu in millicores, replicas, instances per node)
    let cases: Vec<(&str, Vec<u64>, u32, Vec<usize>)> = vec![
        ("3 on 2 empty nodes", vec![4000, 4000], 3, vec![2, 1]),
        ("10 on 4 nodes", vec![4000; 4], 10, vec![3, 3, 2, 2]),
        (
            "fewer replicas than nodes",
            vec![4000; 5],
            3,
            vec![1, 1, 1, 0, 0],
        ),
        // n2 takes two under the pressure line (240m of 300m), the others
        // share the rest fairly.
        (
            "a node lacking room",
            vec![1000, 300, 1000],
            9,
            vec![4, 2, 3],
        ),
        (
            "the remainder on the fullest",
            vec![4000, 4100],
            3,
            vec![2, 1],
        ),
    ];
    for (case, cpus, replicas, expected) in cases {
        let mut builder = ViewBuilder::new();
        for (n, cpu) in cpus.iter().enumerate() {
            builder = builder.node(&format!("n{}", n + 1), *cpu, 4096);
        }
        let mut spec = bare.clone();
        spec.replicas = replicas;
        let view = builder.service(spec).build();
        let plan = schedule(&view, NOW);
        assert_eq!(puts(&plan).len(), replicas as usize, "{case}");
        let view = ViewBuilder::from(view).apply(&plan).build();
        assert_eq!(per_node(&view, "web"), expected, "{case}");
    }
}

#[test]
fn bin_packing_decides_among_the_nodes_with_the_fewest() {
    let view = ViewBuilder::new()
        .node("n1", 1000, 4096)
        .node("n2", 1000, 4096)
        .node("n3", 1000, 4096)
        .service(with_resources(service("base", 1), 500, 64))
        .build();
    let (view, now) = converge(view, NOW);
    assert_eq!(per_node(&view, "base"), [1, 0, 0]);
    // Different services still share the fullest node.
    let view = ViewBuilder::from(view).service(service("web", 2)).build();
    let plan = schedule(&view, now);
    let view = ViewBuilder::from(view).apply(&plan).build();
    assert_eq!(per_node(&view, "web"), [1, 1, 0]);
    // The pressure line comes first: n1 would go to 85%, so web takes n2
    // and n3 although n1 runs none of it.
    let view = ViewBuilder::new()
        .node("n1", 1000, 4096)
        .node("n2", 1000, 4096)
        .node("n3", 1000, 4096)
        .service(with_resources(service("base", 1), 750, 64))
        .build();
    let (view, now) = converge(view, NOW);
    let view = ViewBuilder::from(view).service(service("web", 2)).build();
    let plan = schedule(&view, now);
    let view = ViewBuilder::from(view).apply(&plan).build();
    assert_eq!(per_node(&view, "web"), [0, 1, 1]);
}

#[test]
fn scale_down_stops_on_the_nodes_with_the_most_first() {
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .node("n2", 4000, 4096)
        .node("n3", 4000, 4096)
        .node("n4", 4000, 4096)
        .service(service("web", 10))
        .build();
    let (view, now) = converge(view, NOW);
    assert_eq!(per_node(&view, "web"), [3, 3, 2, 2]);
    let view = ViewBuilder::from(view).service(service("web", 6)).build();
    let plan = schedule(&view, now);
    assert_eq!(puts(&plan).iter().filter(|i| i.stopping).count(), 4);
    let view = ViewBuilder::from(view).apply(&plan).build();
    let mut left = per_node(&view, "web");
    left.sort();
    assert_eq!(left, [1, 1, 2, 2]);
    // And back up: the nodes with one get the new ones.
    let (view, now) = converge(view, now);
    let view = ViewBuilder::from(view).service(service("web", 8)).build();
    let (view, _) = converge(view, now);
    assert_eq!(per_node(&view, "web"), [2, 2, 2, 2]);
}

/// Old-spec instances are on their way out: counting them would skew
/// where their replacements go (without that rule every case here ended
/// unfair, e.g. 6 on 3 nodes as 3 + 2 + 1).
#[test]
fn rolling_update_keeps_the_fair_share() {
    // (replicas on 3 nodes, max surge, max unavailable)
    for (replicas, surge, unavailable) in [(3, 1, 0), (4, 2, 0), (6, 1, 0), (6, 1, 1), (8, 2, 2)] {
        let case = format!("{replicas} replicas, surge {surge}, unavailable {unavailable}");
        let view = ViewBuilder::new()
            .node("n1", 4000, 4096)
            .node("n2", 4000, 4096)
            .node("n3", 4000, 4096)
            .service(service("web", replicas))
            .build();
        let (view, now) = converge(view, NOW);
        let mut next = service("web", replicas);
        next.env.insert("VERSION".into(), "2".into());
        next.update.max_surge = surge;
        next.update.max_unavailable = unavailable;
        let view = ViewBuilder::from(view).service(next.clone()).build();
        let (view, _) = converge(view, now);
        let running = live(&view, "web");
        assert!(
            running.iter().all(|i| i.spec_hash == spec_hash(&next)),
            "{case}"
        );
        assert_eq!(running.len(), replicas as usize, "{case}");
        let counts = per_node(&view, "web");
        let (min, max) = (counts.iter().min(), counts.iter().max());
        assert!(
            max.zip(min).is_some_and(|(max, min)| max - min <= 1),
            "{case}: {counts:?}"
        );
    }
}

#[test]
fn restrict_limits_placement_to_matching_nodes() {
    let mut ssd = node_info("n2", 1000, 1024);
    ssd.labels.insert("disk".into(), "ssd".into());
    let mut spec = service("db", 3);
    spec.placement.restrict.insert("disk".into(), "ssd".into());
    let view = ViewBuilder::new()
        .node("n1", 1000, 1024)
        .ready_node(ssd)
        .service(spec)
        .build();
    let placed = puts(&schedule(&view, NOW));
    assert_eq!(placed.len(), 3);
    assert!(placed.iter().all(|i| i.node == "n2"));
}

#[test]
fn a_few_eligible_nodes_get_their_own_index_and_are_not_over_committed() {
    let mut builder = ViewBuilder::new();
    for n in 0..8 {
        let mut info = node_info(&format!("n{n}"), 1000, 1024);
        if n == 5 {
            info.labels.insert("gpu".into(), "yes".into());
        }
        builder = builder.ready_node(info);
    }
    let mut spec = with_resources(service("ml", 3), 400, 64);
    spec.placement.restrict.insert("gpu".into(), "yes".into());
    let view = builder.service(spec).build();
    let plan = schedule(&view, NOW);
    let placed = puts(&plan);
    assert_eq!(placed.len(), 2, "the third does not fit on the gpu node");
    assert!(placed.iter().all(|i| i.node == "n5"));
    let view = ViewBuilder::from(view).apply(&plan).build();
    let fact = unplaced(&view, "ml").expect("one waits");
    assert_eq!(fact.reason, UnplacedReason::InsufficientCapacity);
    assert_eq!(fact.nearest_node.as_deref(), Some("n5"));
}

#[test]
fn unplaced_demand_names_reason_constraint_and_nearest_node() {
    let mut restricted = service("a", 1);
    restricted
        .placement
        .restrict
        .insert("gpu".into(), "yes".into());
    let cases: Vec<(&str, ViewBuilder, ServiceSpec, UnplacedReason, &str, u32)> = vec![
        (
            "label no node has",
            ViewBuilder::new().node("n1", 1000, 1024),
            restricted,
            UnplacedReason::UnsatisfiableConstraint,
            "restrict gpu=yes: node n1 has no gpu label",
            1,
        ),
        (
            "bigger than any node",
            ViewBuilder::new().node("n1", 1000, 1024),
            with_resources(service("a", 1), 4000, 64),
            UnplacedReason::UnsatisfiableConstraint,
            "cpu: needs 4000m, node n1 has 1000m in total",
            1,
        ),
        (
            "full cluster",
            ViewBuilder::new().node("n1", 1000, 1024),
            with_resources(service("a", 3), 400, 64),
            UnplacedReason::InsufficientCapacity,
            "cpu: needs 400m, at most 200m free (node n1)",
            1,
        ),
        (
            "only node draining",
            ViewBuilder::new().node("n1", 1000, 1024).draining("n1"),
            service("a", 2),
            UnplacedReason::InsufficientCapacity,
            "node n1 is draining",
            2,
        ),
        (
            "no nodes",
            ViewBuilder::new(),
            service("a", 1),
            UnplacedReason::InsufficientCapacity,
            "no nodes are registered",
            1,
        ),
    ];
    for (case, builder, spec, reason, constraint, count) in cases {
        let view = builder.service(spec).build();
        let plan = schedule(&view, NOW);
        let view = ViewBuilder::from(view).apply(&plan).build();
        let fact = unplaced(&view, "a").unwrap_or_else(|| panic!("{case}: no unplaced fact"));
        assert_eq!(fact.reason, reason, "{case}");
        assert_eq!(fact.constraint, constraint, "{case}");
        assert_eq!(fact.count, count, "{case}");
        assert_eq!(fact.since, NOW, "{case}");
        assert!(
            plan.events.iter().any(|e| e.message.contains(constraint)),
            "{case}"
        );
        // Unchanged demand is not rewritten.
        assert!(
            schedule(&view, NOW + 5_000).is_noop(),
            "{case}: steady unplaced fact"
        );
    }
}

#[test]
fn unplaced_fact_goes_once_capacity_arrives() {
    let view = ViewBuilder::new()
        .node("n1", 1000, 1024)
        .service(with_resources(service("a", 3), 400, 64))
        .build();
    let (view, now) = converge(view, NOW);
    assert_eq!(unplaced(&view, "a").map(|u| u.count), Some(1));
    let view = ViewBuilder::from(view).node("n2", 1000, 1024).build();
    let (view, _) = converge(view, now);
    assert_eq!(unplaced(&view, "a"), None);
    assert_eq!(live(&view, "a").len(), 3);
}

#[test]
fn disabled_nodes_keep_their_instances_but_take_no_new_ones() {
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .node("n2", 4000, 4096)
        .service(service("web", 2))
        .build();
    let (view, now) = converge(view, NOW);
    let on_n1 = live(&view, "web").iter().filter(|i| i.node == "n1").count();
    assert_eq!(on_n1, 1, "one on each node");
    let view = ViewBuilder::from(view)
        .node_control(
            "n1",
            NodeControl {
                drain: false,
                disabled: true,
            },
        )
        .service(service("web", 4))
        .build();
    let plan = schedule(&view, now);
    let placed = puts(&plan);
    assert_eq!(placed.len(), 2);
    assert!(placed.iter().all(|i| i.node == "n2" && !i.stopping));
    assert!(deletes(&plan).is_empty());
}

#[test]
fn failed_stateful_ordinal_is_recreated_in_place() {
    let mut spec = service("db", 2);
    spec.stateful = true;
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .node("n2", 4000, 4096)
        .service(spec)
        .build();
    let (view, now) = converge(view, NOW);
    let node = live(&view, "db")
        .into_iter()
        .find(|i| i.id == "db-1")
        .map(|i| i.node)
        .expect("db-1 placed");
    let mut failed = status("db-1", "db", &node, InstanceState::Failed);
    failed.updated_at = now;
    let view = ViewBuilder::from(view).status(failed).build();
    let plan = schedule(&view, now + 1);
    let recreated = puts(&plan);
    assert_eq!(recreated.len(), 1);
    let db1 = &recreated[0];
    assert_eq!(
        (db1.id.as_str(), db1.ordinal, db1.node.as_str()),
        ("db-1", Some(1), node.as_str())
    );
    assert_eq!(
        (db1.created_at, db1.failures.clone()),
        (now + 1, vec![now + 1])
    );
    assert!(
        deletes(&plan).is_empty(),
        "the record is rewritten, not deleted"
    );
    // The stale failed report no longer counts against the new record.
    let view = ViewBuilder::from(view).apply(&plan).build();
    assert!(schedule(&view, now + 2).writes.is_empty());
}

#[test]
fn converged_cluster_yields_an_empty_plan() {
    let view = ViewBuilder::new()
        .node("n1", 2000, 2048)
        .node("n2", 2000, 2048)
        .service(service("web", 5))
        .service(service("api", 3))
        .build();
    let (view, now) = converge(view, NOW);
    assert_eq!(live(&view, "web").len(), 5);
    let plan = schedule(&view, now + 60_000);
    assert_eq!(plan, Plan::default());
}

#[test]
fn scale_down_stops_not_ready_first_then_deletes_once_stopped() {
    let view = ViewBuilder::new()
        .node("n1", 2000, 2048)
        .service(service("web", 3))
        .build();
    let (view, now) = converge(view, NOW);
    let victim = live(&view, "web")[1].clone();
    let mut crashed = status(&victim.id, "web", "n1", InstanceState::Restarting);
    crashed.updated_at = now;
    let view = ViewBuilder::from(view)
        .status(crashed)
        .service(service("web", 2))
        .build();
    let plan = schedule(&view, now);
    let stopped = puts(&plan);
    assert_eq!(stopped.len(), 1);
    assert_eq!(stopped[0].id, victim.id);
    assert!(stopped[0].stopping);
    // Still running: the record stays.
    let view = ViewBuilder::from(view).apply(&plan).build();
    assert!(schedule(&view, now).is_noop());
    let view = agents(ViewBuilder::from(view), now).build();
    let plan = schedule(&view, now);
    assert_eq!(
        deletes(&plan),
        vec![keys::derived_instance("web", &victim.id)]
    );
}

#[test]
fn rolling_update_honours_surge_and_unavailable() {
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .service(service("web", 3))
        .build();
    let (view, now) = converge(view, NOW);
    let mut next = service("web", 3);
    next.env.insert("VERSION".into(), "2".into());
    next.update.max_surge = 1;
    next.update.max_unavailable = 0;
    let view = ViewBuilder::from(view).service(next.clone()).build();
    let plan = schedule(&view, now);
    let written = puts(&plan);
    assert_eq!(written.len(), 1, "one surge instance, nothing stopped yet");
    assert_eq!(written[0].spec_hash, spec_hash(&next));
    assert!(!written[0].stopping);
    let (view, _) = converge(view, now);
    let running = live(&view, "web");
    assert_eq!(running.len(), 3);
    assert!(running.iter().all(|i| i.spec_hash == spec_hash(&next)));
}

#[test]
fn a_new_instance_that_just_restarted_does_not_let_the_roll_go_on() {
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .service(service("web", 3))
        .build();
    let (view, now) = converge(view, NOW);
    let mut next = service("web", 3);
    next.env.insert("VERSION".into(), "2".into());
    next.update.max_surge = 1;
    next.update.max_unavailable = 0;
    let view = ViewBuilder::from(view).service(next).build();
    let plan = schedule(&view, now);
    let surge = puts(&plan).remove(0);
    // Running for a moment between two crashes.
    let mut flapping = status(&surge.id, "web", "n1", InstanceState::Running);
    flapping.restarts = 1;
    flapping.last_exit = Some(cca_model::cluster::ExitInfo {
        code: Some(1),
        signal: None,
        reason: "exited".into(),
        at: now - 2_000,
        log_tail: vec![],
    });
    let view = ViewBuilder::from(view)
        .apply(&plan)
        .status(flapping)
        .build();
    let plan = schedule(&view, now);
    assert!(
        plan.writes.is_empty(),
        "no old instance stops for it: {:?}",
        plan.writes
    );
    let min_ready = cca_model::clock::span_millis(SchedulerConfig::default().min_ready);
    assert_eq!(
        plan.requeue_after,
        Some(min_ready - 2_000),
        "woken when it settles"
    );
    let settled = schedule(&view, now + min_ready);
    assert!(
        puts(&settled).iter().any(|instance| instance.stopping),
        "once it ran min_ready, an old one stops"
    );
}

#[test]
fn stateful_ordinals_start_in_order_and_stop_highest_first() {
    let mut spec = service("db", 3);
    spec.stateful = true;
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .service(spec.clone())
        .build();
    let plan = schedule(&view, NOW);
    let first = puts(&plan);
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].id.as_str(), first[0].ordinal), ("db-0", Some(0)));
    // Without a running db-0, db-1 waits.
    let pending = ViewBuilder::from(view).apply(&plan).build();
    assert!(schedule(&pending, NOW).is_noop());
    let (view, now) = converge(pending, NOW);
    let ids: Vec<String> = live(&view, "db").into_iter().map(|i| i.id).collect();
    assert_eq!(ids, ["db-0", "db-1", "db-2"]);

    spec.replicas = 1;
    let view = ViewBuilder::from(view).service(spec).build();
    let stop = puts(&schedule(&view, now));
    assert_eq!(stop.len(), 1);
    assert_eq!((stop[0].id.as_str(), stop[0].stopping), ("db-2", true));
    let (view, _) = converge(view, now);
    let ids: Vec<String> = live(&view, "db").into_iter().map(|i| i.id).collect();
    assert_eq!(ids, ["db-0"]);
}

#[test]
fn failed_instances_are_replaced_within_the_restart_budget() {
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .service(service("web", 4))
        .build();
    let (view, now) = converge(view, NOW);
    let placed = live(&view, "web");
    let mut builder = ViewBuilder::from(view);
    for instance in placed {
        let mut failed = status(&instance.id, "web", "n1", InstanceState::Failed);
        failed.updated_at = now;
        builder = builder.status(failed);
    }
    let view = builder.build();
    let plan = schedule(&view, now);
    assert_eq!(deletes(&plan).len(), 3, "budget of 3 per window");
    let replacements = puts(&plan);
    assert_eq!(replacements.len(), 3);
    assert!(replacements.iter().all(|i| i.failures == vec![now]));
    assert!(
        plan.events
            .iter()
            .any(|e| e.message.starts_with("restart budget exhausted"))
    );
    let window = cca_model::clock::span_millis(SchedulerConfig::default().failure_window);
    assert_eq!(plan.requeue_after, Some(window));
    // The fourth waits for the window, then goes.
    let view = ViewBuilder::from(view).apply(&plan).build();
    assert!(schedule(&view, now + 1_000).writes.is_empty());
    let later = schedule(&view, now + window + 1);
    assert_eq!(deletes(&later).len(), 1);
    assert_eq!(puts(&later).len(), 1);
}

/// `observed/held-ports/{node}` as the node's agent reports it.
fn held_ports(builder: ViewBuilder, node: &str, ports: &[u16]) -> ViewBuilder {
    let held = cca_model::cluster::HeldPorts {
        ports: ports.iter().copied().collect(),
    };
    builder.put(&keys::observed_held_ports(node), &held)
}

fn ports_on(placed: &[Instance], node: &str) -> Vec<u16> {
    let mut ports: Vec<u16> = placed
        .iter()
        .filter(|i| i.node == node)
        .map(|i| i.host_ports["http"])
        .collect();
    ports.sort_unstable();
    ports
}

#[test]
fn host_ports_held_on_a_node_are_never_handed_out_there() {
    let first = *SchedulerConfig::default().host_ports.start();
    let builder = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .node("n2", 4000, 4096)
        .service(service("web", 4));
    let view = held_ports(builder, "n1", &[first, first + 2]).build();
    let placed = puts(&schedule(&view, NOW));
    assert_eq!(
        ports_on(&placed, "n1"),
        [first + 1, first + 3],
        "n1 skips its held ports"
    );
    assert_eq!(
        ports_on(&placed, "n2"),
        [first, first + 1],
        "held on n1 only"
    );
}

#[test]
fn host_ports_come_from_the_configured_range() {
    let config = SchedulerConfig {
        host_ports: 41_000..=41_002,
        ..SchedulerConfig::default()
    };
    let controller = SchedulerController { config };
    let builder = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .service(service("web", 3));
    let view = held_ports(builder, "n1", &[41_001]).build();
    let plan = controller.reconcile(&view, &context(NOW));
    let placed = puts(&plan);
    assert_eq!(ports_on(&placed, "n1"), [41_000, 41_002]);
    let view = ViewBuilder::from(view).apply(&plan).build();
    let unplaced = unplaced(&view, "web").expect("the third does not fit");
    assert!(
        unplaced.constraint.contains("host ports: needs 1, 0 free"),
        "{unplaced:?}"
    );
}

/// An instance failed because something outside the cluster holds its
/// host port is placed again on other ports at once, outside the restart
/// budget, and the held port is not handed out again.
#[test]
fn an_instance_failed_on_a_held_port_is_placed_again_outside_the_budget() {
    let first = *SchedulerConfig::default().host_ports.start();
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .service(service("web", 4))
        .build();
    let (view, now) = converge(view, NOW);
    let placed = live(&view, "web");
    assert_eq!(
        ports_on(&placed, "n1"),
        [first, first + 1, first + 2, first + 3]
    );
    // Every instance fails: three of them on ports something else holds.
    let mut builder = held_ports(
        ViewBuilder::from(view),
        "n1",
        &[first, first + 1, first + 2],
    );
    for instance in &placed {
        let mut failed = status(&instance.id, "web", "n1", InstanceState::Failed);
        failed.updated_at = now;
        builder = builder.status(failed);
    }
    let view = builder.build();
    let plan = schedule(&view, now);
    assert_eq!(
        deletes(&plan).len(),
        4,
        "three outside the budget, one in it"
    );
    let replacements = puts(&plan);
    assert_eq!(
        ports_on(&replacements, "n1"),
        [first + 3, first + 4, first + 5, first + 6],
        "the held ports are skipped; the budget's one takes a free port too"
    );
    let charged = replacements
        .iter()
        .filter(|i| !i.failures.is_empty())
        .count();
    assert_eq!(
        charged, 1,
        "only the ordinary failure counts: {replacements:?}"
    );
    let warned = plan
        .events
        .iter()
        .filter(|e| {
            e.message
                .contains("is held on node n1 by something outside the cluster")
        })
        .count();
    assert_eq!(warned, 3);
}

#[test]
fn instances_of_a_lost_node_are_replaced_after_the_grace_period() {
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .node("n2", 4000, 4096)
        .node("n3", 4000, 4096)
        .service(service("web", 4))
        .build();
    let (view, now) = converge(view, NOW);
    let on_n1 = live(&view, "web").iter().filter(|i| i.node == "n1").count();
    assert_eq!(on_n1, 2, "2 + 1 + 1: the remainder on n1");
    let gone = NodeStatus {
        condition: NodeCondition::Unreachable,
        since: now,
    };
    let view = ViewBuilder::from(view)
        .delete(&keys::observed_heartbeat("n1"))
        .node_status("n1", &gone)
        .build();
    let grace = cca_model::clock::span_millis(SchedulerConfig::default().lost_grace);
    let waiting = schedule(&view, now + grace - 1_000);
    assert!(waiting.is_noop());
    assert_eq!(waiting.requeue_after, Some(1_000));
    let plan = schedule(&view, now + grace);
    assert_eq!(deletes(&plan).len(), 2);
    let mut replaced_on: Vec<String> = puts(&plan).into_iter().map(|i| i.node).collect();
    replaced_on.sort();
    assert_eq!(replaced_on, ["n2", "n3"], "the fair share again: 2 + 2");
}

/// While the node controller pauses lost-node replacement, a node past
/// its grace is not lost; once the pause ends, its instances are replaced
/// a grace period after the resume, not at once.
#[test]
fn a_paused_replacement_waits_for_the_resume_and_then_a_grace_period() {
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .node("n2", 4000, 4096)
        .node("n3", 4000, 4096)
        .service(service("web", 3))
        .build();
    let (view, now) = converge(view, NOW);
    let gone = NodeStatus {
        condition: NodeCondition::Unreachable,
        since: now,
    };
    let pause = Disruption {
        paused: true,
        since: now,
        missing: 2,
        nodes: 3,
        resumed_by: None,
    };
    let paused = ViewBuilder::from(view)
        .delete(&keys::observed_heartbeat("n1"))
        .node_status("n1", &gone)
        .put(&keys::derived_disruption(), &pause)
        .build();
    let held = schedule(&paused, now + 60_000);
    assert!(held.is_noop(), "{held:?}");
    assert_eq!(held.requeue_after, None, "nothing runs out while paused");
    let resumed = Disruption {
        paused: false,
        since: now + 60_000,
        resumed_by: Some(ResumeCause::Safeguard),
        ..pause
    };
    let view = ViewBuilder::from(paused)
        .put(&keys::derived_disruption(), &resumed)
        .build();
    let grace = cca_model::clock::span_millis(SchedulerConfig::default().lost_grace);
    let waiting = schedule(&view, now + 60_000 + grace - 1_000);
    assert!(waiting.is_noop());
    assert_eq!(
        waiting.requeue_after,
        Some(1_000),
        "the grace from the resume"
    );
    let plan = schedule(&view, now + 60_000 + grace);
    assert_eq!(deletes(&plan).len(), 1);
    assert_eq!(puts(&plan).len(), 1);
}

#[test]
fn drain_starts_replacements_first_within_the_disruption_budget() {
    let mut spec = service("web", 3);
    spec.budget = Some(DisruptionBudget { max_unavailable: 2 });
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .node("n2", 4000, 4096)
        .service(spec)
        .build();
    let (view, now) = converge(view, NOW);
    let view = ViewBuilder::from(view).draining("n1").build();
    let plan = schedule(&view, now);
    let moves = puts(&plan);
    assert_eq!(moves.len(), 2, "two moves at a time");
    assert!(
        moves
            .iter()
            .all(|i| i.node == "n2" && i.replaces.is_some() && !i.stopping)
    );
    assert!(deletes(&plan).is_empty());
    // The old ones stop only once their replacements run.
    let started = ViewBuilder::from(view).apply(&plan).build();
    assert!(puts(&schedule(&started, now)).is_empty());
    let (view, _) = converge(started, now);
    let running = live(&view, "web");
    assert_eq!(running.len(), 3);
    assert!(running.iter().all(|i| i.node == "n2"));
}

/// `budget { max_unavailable = 0 }` blocks the drain: nothing moves,
/// stateless or stateful, however long the node drains (it was once
/// clamped to one move at a time).
#[test]
fn a_zero_budget_keeps_instances_on_a_draining_node() {
    let mut web = service("web", 2);
    web.budget = Some(DisruptionBudget { max_unavailable: 0 });
    let mut db = service("db", 2);
    db.stateful = true;
    db.budget = Some(DisruptionBudget { max_unavailable: 0 });
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .service(web)
        .service(db)
        .build();
    let (view, now) = converge(view, NOW);
    let before = live(&view, "web").len() + live(&view, "db").len();
    assert_eq!(before, 4);
    let drained = ViewBuilder::from(view)
        .node("n2", 4000, 4096)
        .draining("n1")
        .build();
    let plan = schedule(&drained, now);
    assert!(puts(&plan).is_empty(), "no replacement starts: {plan:?}");
    assert!(deletes(&plan).is_empty());
    let (view, _) = converge(drained, now);
    let stayed: Vec<Instance> = instances(&view);
    assert_eq!(stayed.len(), 4);
    assert!(stayed.iter().all(|i| i.node == "n1" && !i.stopping));
}

/// Rebalancing is a voluntary move too: a zero budget keeps the service
/// where it is, even on a node above the pressure line.
#[test]
fn rebalancing_leaves_a_zero_budget_service_alone() {
    let mut builder = ViewBuilder::new();
    let mut spec = with_resources(service("web", 9), 100, 16);
    spec.budget = Some(DisruptionBudget { max_unavailable: 0 });
    let hash = spec_hash(&spec);
    for node in ["n1", "n2"] {
        builder = builder.node(node, 1000, 4096);
    }
    for n in 0..9 {
        let mut instance =
            crate::controllers::fixtures::instance(&format!("web-{n:02}"), "web", "n1");
        instance.spec_hash = hash.clone();
        instance.memory = Memory(16 * MI);
        instance.host_ports.insert("http".into(), 20_000 + n as u16);
        builder = builder.instance(instance);
    }
    let view = agents(builder.service(spec), 0).build();
    assert!(puts(&schedule(&view, NOW)).is_empty());
}

#[test]
fn rebalancing_moves_at_most_two_instances_off_pressured_nodes() {
    // Three nodes pushed to 90% by hand, one empty node.
    let mut builder = ViewBuilder::new();
    let spec = with_resources(service("web", 27), 100, 16);
    let hash = spec_hash(&spec);
    for node in ["n1", "n2", "n3", "n4"] {
        builder = builder.node(node, 1000, 4096);
    }
    for n in 0..27 {
        let node = format!("n{}", n / 9 + 1);
        let mut instance =
            crate::controllers::fixtures::instance(&format!("web-{n:02}"), "web", &node);
        instance.spec_hash = hash.clone();
        instance.memory = Memory(16 * MI);
        instance.host_ports.insert("http".into(), 20_000 + n as u16);
        builder = builder.instance(instance);
    }
    let view = agents(builder.service(spec), 0).build();
    let plan = schedule(&view, NOW);
    let moves = puts(&plan);
    assert_eq!(moves.len(), 2);
    assert!(moves.iter().all(|i| i.node == "n4" && i.replaces.is_some()));
    // While moves are in flight, no more start.
    let view = ViewBuilder::from(view).apply(&plan).build();
    assert!(puts(&schedule(&view, NOW)).is_empty());
    let (view, _) = converge(view, NOW);
    let used = cpu_used(&view);
    assert!(used.values().all(|cpu| *cpu <= 800), "{used:?}");
    assert_eq!(live(&view, "web").len(), 27);
}

#[test]
fn pressure_warning_once_per_crossing() {
    let view = ViewBuilder::new()
        .node("n1", 1000, 4096)
        .service(service("web", 9))
        .build();
    let plan = schedule(&view, NOW);
    let warnings: Vec<&str> = plan
        .events
        .iter()
        .filter(|e| e.subject == "node/n1")
        .map(|e| e.message.as_str())
        .collect();
    assert_eq!(warnings, ["cpu allocation at 90% exceeds 80%"]);
    let (view, now) = converge(view, NOW);
    let view = ViewBuilder::from(view).service(service("web", 10)).build();
    let plan = schedule(&view, now);
    assert_eq!(puts(&plan).len(), 1);
    assert!(
        plan.events.iter().all(|e| e.subject != "node/n1"),
        "already over the line"
    );
}

#[test]
fn spread_places_base_plus_remainder_per_label_value() {
    let mut builder = ViewBuilder::new();
    for (name, zone) in [("n1", "a"), ("n2", "a"), ("n3", "b"), ("n4", "c")] {
        let mut info = node_info(name, 4000, 4096);
        info.zone = Some(zone.into());
        builder = builder.ready_node(info);
    }
    let mut spec = service("web", 7);
    spec.placement.spread.push("zone".into());
    let view = builder.service(spec).build();
    let placed = puts(&schedule(&view, NOW));
    let zone = |node: &str| {
        if node < "n3" {
            "a"
        } else if node == "n3" {
            "b"
        } else {
            "c"
        }
    };
    let mut counts = BTreeMap::new();
    for instance in &placed {
        *counts.entry(zone(&instance.node)).or_insert(0) += 1;
    }
    assert_eq!(counts, BTreeMap::from([("a", 3), ("b", 2), ("c", 2)]));
}

#[test]
fn colocate_and_separate_hints_steer_placement() {
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .node("n2", 4000, 4096)
        .node("n3", 4000, 4096)
        .service(with_resources(service("cache", 1), 3000, 64))
        .build();
    let (view, now) = converge(view, NOW);
    let cache_node = live(&view, "cache")[0].node.clone();
    let mut near = service("app", 2);
    near.placement.colocate.push("cache".into());
    let mut apart = service("batch", 1);
    apart.placement.separate.push("cache".into());
    let view = ViewBuilder::from(view).service(near).service(apart).build();
    let placed = puts(&schedule(&view, now));
    let app: Vec<&Instance> = placed.iter().filter(|i| i.service == "app").collect();
    let batch: Vec<&Instance> = placed.iter().filter(|i| i.service == "batch").collect();
    assert!(
        app.iter().all(|i| i.node == cache_node),
        "colocated with cache"
    );
    assert!(
        batch.iter().all(|i| i.node != cache_node),
        "kept apart from cache"
    );
}

#[test]
fn removed_service_stops_its_instances_and_drops_its_unplaced_fact() {
    let view = ViewBuilder::new()
        .node("n1", 1000, 1024)
        .service(with_resources(service("web", 3), 400, 64))
        .build();
    let (view, now) = converge(view, NOW);
    assert!(unplaced(&view, "web").is_some());
    let view = ViewBuilder::from(view).remove_service("web").build();
    let plan = schedule(&view, now);
    assert!(puts(&plan).iter().all(|i| i.stopping));
    assert_eq!(deletes(&plan), vec![keys::derived_unplaced("web")]);
    let (view, _) = converge(view, now);
    assert!(instances(&view).is_empty());
}

/// A random cluster: nodes with zones and a disk label, services with
/// optional `restrict` and `spread`.
fn cluster_strategy() -> impl Strategy<Value = View> {
    let node = (500u64..4000, 256u64..4096, 0usize..3, any::<bool>());
    let svc = (
        0u32..12,
        50u64..900,
        32u64..700,
        any::<bool>(),
        any::<bool>(),
    );
    (
        prop::collection::vec(node, 1..8),
        prop::collection::vec(svc, 1..5),
    )
        .prop_map(|(nodes, services)| {
            let mut builder = ViewBuilder::new();
            for (i, (cpu, memory, zone, ssd)) in nodes.into_iter().enumerate() {
                let mut info = node_info(&format!("n{i}"), cpu, memory);
                info.zone = Some(["a", "b", "c"][zone].into());
                info.labels
                    .insert("disk".into(), if ssd { "ssd" } else { "hdd" }.into());
                builder = builder.ready_node(info);
            }
            for (i, (replicas, cpu, memory, restrict, spread)) in services.into_iter().enumerate() {
                let mut spec = with_resources(service(&format!("s{i}"), replicas), cpu, memory);
                if restrict {
                    spec.placement.restrict.insert("disk".into(), "ssd".into());
                }
                if spread {
                    spec.placement.spread.push("zone".into());
                }
                builder = builder.service(spec);
            }
            builder.build()
        })
}

fn assert_within_capacity_and_restrict(view: &View) {
    for (name, node) in view.nodes.iter() {
        let on: Vec<Instance> = instances(view)
            .into_iter()
            .filter(|i| &i.node == name)
            .collect();
        let cpu: u64 = on.iter().map(|i| i.cpu.0).sum();
        let memory: u64 = on.iter().map(|i| i.memory.0).sum();
        assert!(cpu <= node.cpu.0, "node {name} over-committed on cpu");
        assert!(
            memory <= node.memory.0,
            "node {name} over-committed on memory"
        );
        for instance in on {
            let spec = &view.services[&instance.service];
            for (label, wanted) in &spec.placement.restrict {
                assert_eq!(node.label(label), Some(wanted.as_str()), "restrict broken");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn never_over_commits_respects_restrict_and_converges(view in cluster_strategy()) {
        let first = schedule(&view, NOW);
        prop_assert_eq!(&first, &schedule(&view, NOW), "deterministic for a view");
        let scheduler = Owner::Controller(SchedulerController::default().name());
        for write in &first.writes {
            prop_assert!(check_write(&scheduler, write.key()).is_ok(), "{} is not ours", write.key());
        }
        let (view, now) = converge(view, NOW);
        assert_within_capacity_and_restrict(&view);
        prop_assert!(schedule(&view, now + 1).is_noop(), "converged view is a no-op");
    }

    #[test]
    fn spreads_evenly_when_capacity_allows(zones in prop::collection::vec(0usize..4, 1..10), replicas in 0u32..30) {
        let mut builder = ViewBuilder::new();
        for (i, zone) in zones.iter().enumerate() {
            let mut info = node_info(&format!("n{i}"), 64_000, 65_536);
            info.zone = Some(format!("z{zone}"));
            builder = builder.ready_node(info);
        }
        let mut spec = service("web", replicas);
        spec.placement.spread.push("zone".into());
        let view = builder.service(spec).build();
        let (view, _) = converge(view, NOW);
        let mut counts: BTreeMap<String, u32> = zones.iter().map(|z| (format!("z{z}"), 0)).collect();
        for instance in live(&view, "web") {
            let zone = view.nodes[&instance.node].zone.clone().unwrap_or_default();
            *counts.entry(zone).or_insert(0) += 1;
        }
        let (min, max) = (counts.values().min().copied(), counts.values().max().copied());
        prop_assert!(max.unwrap_or(0) - min.unwrap_or(0) <= 1, "{:?}", counts);
        prop_assert_eq!(counts.values().sum::<u32>(), replicas);
    }

    /// No restrict, ample capacity: every service's instances per node
    /// differ by at most one, after placing and after scaling either way.
    #[test]
    fn shares_every_service_fairly_when_capacity_allows(
        nodes in prop::collection::vec(200_000u64..400_000, 1..8),
        services in prop::collection::vec((0u32..30, 0u32..30, 50u64..900, 32u64..700), 1..5),
    ) {
        let mut builder = ViewBuilder::new();
        for (i, cpu) in nodes.iter().enumerate() {
            builder = builder.node(&format!("n{i}"), *cpu, 256 * 1024);
        }
        let spec = |i: usize, replicas: u32, cpu: u64, memory: u64| {
            with_resources(service(&format!("s{i}"), replicas), cpu, memory)
        };
        for (i, (replicas, _, cpu, memory)) in services.iter().enumerate() {
            builder = builder.service(spec(i, *replicas, *cpu, *memory));
        }
        let (view, now) = converge(builder.build(), NOW);
        for (i, (replicas, ..)) in services.iter().enumerate() {
            let counts = per_node(&view, &format!("s{i}"));
            let (min, max) = (counts.iter().min(), counts.iter().max());
            prop_assert!(max.zip(min).is_none_or(|(max, min)| max - min <= 1), "s{}: {:?}", i, counts);
            prop_assert_eq!(counts.iter().sum::<usize>(), *replicas as usize);
        }
        let mut builder = ViewBuilder::from(view);
        for (i, (_, rescaled, cpu, memory)) in services.iter().enumerate() {
            builder = builder.service(spec(i, *rescaled, *cpu, *memory));
        }
        let (view, _) = converge(builder.build(), now);
        for (i, (_, rescaled, ..)) in services.iter().enumerate() {
            let counts = per_node(&view, &format!("s{i}"));
            let (min, max) = (counts.iter().min(), counts.iter().max());
            prop_assert!(max.zip(min).is_none_or(|(max, min)| max - min <= 1), "s{} rescaled: {:?}", i, counts);
            prop_assert_eq!(counts.iter().sum::<usize>(), *rescaled as usize);
        }
    }
}

#[test]
fn demand_beyond_one_pass_goes_in_the_next_pass_not_unplaced() {
    let config = SchedulerConfig {
        max_creates: 100,
        ..SchedulerConfig::default()
    };
    let scheduler = SchedulerController { config };
    let view = ViewBuilder::new()
        .node("n1", 100_000, 100_000)
        .node("n2", 100_000, 100_000)
        .service(with_resources(service("web", 130), 1, 1))
        .build();
    let plan = scheduler.reconcile(&view, &context(NOW));
    assert_eq!(puts(&plan).len(), 100);
    assert!(
        plan.requeue_after.is_some_and(|after| after <= 1),
        "the rest follows at once: {:?}",
        plan.requeue_after
    );
    assert!(
        !plan
            .writes
            .iter()
            .any(|write| write.key().starts_with(cca_model::Kind::Unplaced.prefix())),
        "room is not what is missing"
    );
    assert!(
        plan.events
            .iter()
            .all(|event| !event.message.contains("cannot place")),
        "{:?}",
        plan.events
    );
    let view = ViewBuilder::from(view).apply(&plan).build();
    let rest = scheduler.reconcile(&view, &context(NOW + 1));
    assert_eq!(puts(&rest).len(), 30);
    let view = ViewBuilder::from(view).apply(&rest).build();
    assert_eq!(live(&view, "web").len(), 130);
    assert_eq!(unplaced(&view, "web"), None);
}

fn sleepy(replicas: u32) -> ServiceSpec {
    let mut spec = service("web", replicas);
    spec.scale_to_zero = Some(cca_model::spec::Duration(60_000));
    spec
}

fn scale_state(asleep: bool) -> cca_model::scale::ScaleState {
    use cca_model::scale::{ScaleCause, ScaleState};
    ScaleState {
        asleep,
        since: NOW,
        cause: if asleep {
            ScaleCause::Idle {
                window: 60_000,
                last_activity: 0,
            }
        } else {
            ScaleCause::Woken { node: "g1".into() }
        },
    }
}

#[test]
fn an_asleep_service_has_no_instances_and_wakes_to_its_replicas() {
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .node("n2", 4000, 4096)
        .service(sleepy(3))
        .build();
    let (view, now) = converge(view, NOW);
    assert_eq!(live(&view, "web").len(), 3);
    // Asleep: every instance stops (the usual way: stopping, then gone).
    let asleep = ViewBuilder::from(view)
        .put(&keys::derived_scale("web"), &scale_state(true))
        .build();
    let plan = schedule(&asleep, now);
    assert_eq!(puts(&plan).iter().filter(|i| i.stopping).count(), 3);
    assert!(
        plan.guards.contains(&keys::derived_scale("web")),
        "a wake meanwhile makes the decision again"
    );
    let (asleep, now) = converge(asleep, now);
    assert!(instances(&asleep).is_empty(), "all gone once stopped");
    assert!(unplaced(&asleep, "web").is_none());
    // A scale or a rollout while asleep starts nothing.
    let mut next = sleepy(4);
    next.env.insert("VERSION".into(), "2".into());
    let asleep = ViewBuilder::from(asleep).service(next.clone()).build();
    assert!(schedule(&asleep, now).is_noop(), "nothing while asleep");
    // Woken: the replicas of the spec it has now.
    let woken = ViewBuilder::from(asleep)
        .put(&keys::derived_scale("web"), &scale_state(false))
        .build();
    let plan = schedule(&woken, now);
    let placed = puts(&plan);
    assert_eq!(placed.len(), 4);
    assert!(placed.iter().all(|i| i.spec_hash == spec_hash(&next)));
}

#[test]
fn a_sleep_fact_without_scale_to_zero_changes_nothing() {
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .service(service("web", 2))
        .put(&keys::derived_scale("web"), &scale_state(true))
        .build();
    assert_eq!(puts(&schedule(&view, NOW)).len(), 2);
}

/// `instance` as the node reports it unclaimed, running `spec`.
fn unclaimed_of(id: &str, spec: &ServiceSpec, port: u16) -> UnclaimedInstance {
    UnclaimedInstance {
        id: id.into(),
        service: spec.name.clone(),
        ordinal: None,
        spec_hash: spec_hash(spec),
        cpu: spec.resources.cpu.unwrap_or(Cpu(0)),
        memory: spec.resources.memory.unwrap_or(Memory(0)),
        host_ports: BTreeMap::from([("http".to_owned(), port)]),
    }
}

/// After a resync with another store, instances a node still runs are
/// placed where they run, with their ids and ports, when they match the
/// version the scheduler would place; the rest of the replicas are new.
#[test]
fn unclaimed_instances_of_the_current_version_are_adopted_where_they_run() {
    let first = *SchedulerConfig::default().host_ports.start();
    let web = service("web", 3);
    let mut old = service("web", 3);
    old.env.insert("VERSION".into(), "older".into());
    let reported = Unclaimed {
        instances: vec![
            unclaimed_of("web-old1", &web, first + 7),
            unclaimed_of("web-old2", &old, first + 8),
        ],
    };
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .node("n2", 4000, 4096)
        .service(web)
        .put(&keys::observed_unclaimed("n2"), &reported)
        .build();
    let plan = schedule(&view, NOW);
    let placed = puts(&plan);
    assert_eq!(placed.len(), 3, "{placed:?}");
    let adopted: Vec<&Instance> = placed.iter().filter(|i| i.id == "web-old1").collect();
    assert_eq!(adopted.len(), 1, "the matching one is adopted: {placed:?}");
    assert_eq!(adopted[0].node, "n2");
    assert_eq!(adopted[0].host_ports["http"], first + 7);
    assert!(
        placed.iter().all(|i| i.id != "web-old2"),
        "another version is not adopted: {placed:?}"
    );
    assert!(
        plan.events
            .iter()
            .any(|event| event.message.contains("adopted")),
        "{:?}",
        plan.events
    );
    // Adopted once: the next pass over the result changes nothing.
    let view = agents(ViewBuilder::from(view).apply(&plan), NOW).build();
    assert!(puts(&schedule(&view, NOW)).is_empty());
}

/// An unclaimed instance on a node that cannot take it (draining) is not
/// adopted: the replica goes elsewhere.
#[test]
fn unclaimed_instances_on_a_node_that_cannot_take_them_are_not_adopted() {
    let first = *SchedulerConfig::default().host_ports.start();
    let web = service("web", 1);
    let reported = Unclaimed {
        instances: vec![unclaimed_of("web-old1", &web, first)],
    };
    let view = ViewBuilder::new()
        .node("n1", 4000, 4096)
        .node("n2", 4000, 4096)
        .draining("n2")
        .service(web)
        .put(&keys::observed_unclaimed("n2"), &reported)
        .build();
    let placed = puts(&schedule(&view, NOW));
    assert_eq!(placed.len(), 1);
    assert_eq!(placed[0].node, "n1");
    assert_ne!(placed[0].id, "web-old1");
}
