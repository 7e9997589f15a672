//! Scheduler benchmarks: one placement against the capacity index of 5,000
//! nodes (target ≤ 20 µs), one placement restricted to 10 labelled nodes
//! of 5,000 (their private index), one full scheduler pass that places a single
//! pending instance on 5,000 nodes (building the pass's view of the
//! cluster included), and a full pass placing 10,000 instances of 20
//! services on 5,000 nodes. Run with
//! `cargo bench -p cca-control --bench scheduler`.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use cca_control::controllers::SchedulerController;
use cca_control::controllers::scheduler::PlacementProbe;
use cca_control::{Context, Controller, View};
use cca_model::cluster::{Heartbeat, NodeCondition, NodeInfo, NodeStatus};
use cca_model::keys;
use cca_model::spec::{Cpu, Memory, PortSpec, Resources, ServiceSpec, Workload};
use criterion::{Criterion, criterion_group, criterion_main};
use serde::Serialize;

const NODES: usize = 5_000;
/// Placements timed per prepared cluster before it is rebuilt (untimed).
const PLACEMENTS_PER_CLUSTER: u64 = 20_000;

fn put<T: Serialize>(view: &mut View, key: &str, value: &T) {
    view.revision += 1;
    let bytes = serde_json::to_vec(value).expect("encodes");
    view.put(key, &bytes, view.revision);
}

/// `count` ready nodes of 16 cores and 64 GiB across three zones, each a
/// little different so the index holds distinct keys.
fn cluster(count: usize) -> View {
    let mut view = View::default();
    for index in 0..count {
        let name = format!("node-{index:05}");
        let info = NodeInfo {
            name: name.clone(),
            cpu: Cpu(16_000 + (index % 7) as u64 * 500),
            memory: Memory((64 << 30) + (index % 5) as u64 * (1 << 30)),
            arch: "amd64".into(),
            zone: Some(format!("zone-{}", index % 3)),
            labels: BTreeMap::new(),
            addresses: vec![format!("10.0.{}.{}", index / 250, index % 250)],
            agent_url: None,
            registered_at: 0,
            gate: Default::default(),
        };
        put(&mut view, &keys::observed_node(&name), &info);
        let beat = Heartbeat {
            lease_ttl_secs: 15,
            started_at: 0,
            lease: 1,
        };
        put(&mut view, &keys::observed_heartbeat(&name), &beat);
        let ready = NodeStatus {
            condition: NodeCondition::Ready,
            since: 0,
        };
        put(&mut view, &keys::derived_node(&name), &ready);
    }
    view
}

fn service(name: &str, replicas: u32) -> ServiceSpec {
    ServiceSpec {
        replicas,
        ports: vec![PortSpec::tcp("http", 8080)],
        resources: Resources {
            cpu: Some(Cpu(250)),
            memory: Some(Memory(256 << 20)),
        },
        ..ServiceSpec::new(name, Workload::image(format!("registry.local/{name}:1")))
    }
}

fn with_services(mut view: View, services: usize, replicas: u32) -> View {
    for index in 0..services {
        let spec = service(&format!("svc-{index:02}"), replicas);
        put(&mut view, &keys::desired_service(&spec.name), &spec);
    }
    view
}

fn settled() -> Context {
    Context {
        now: 1_000_000,
        leader_since: 0,
    }
}

fn one_placement(c: &mut Criterion) {
    let view = with_services(cluster(NODES), 1, 1);
    c.bench_function("one placement, 5000 nodes", |b| {
        b.iter_custom(|iters| {
            let mut elapsed = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let mut probe = PlacementProbe::new(&view, "svc-00").expect("service exists");
                let chunk = left.min(PLACEMENTS_PER_CLUSTER);
                let start = Instant::now();
                for _ in 0..chunk {
                    black_box(probe.place_one());
                }
                elapsed += start.elapsed();
                left -= chunk;
            }
            elapsed
        });
    });
}

/// Ten nodes of 5,000 carry `gpu=yes`; the service is restricted to them.
fn one_restricted_placement(c: &mut Criterion) {
    let mut view = cluster(NODES);
    for index in (0..NODES).step_by(NODES / 10) {
        let key = keys::observed_node(&format!("node-{index:05}"));
        let mut info = (*view.nodes[&format!("node-{index:05}")].value).clone();
        info.labels.insert("gpu".into(), "yes".into());
        put(&mut view, &key, &info);
    }
    let mut spec = service("ml", 1);
    spec.placement.restrict.insert("gpu".into(), "yes".into());
    put(&mut view, &keys::desired_service("ml"), &spec);
    c.bench_function("one restricted placement, 10 of 5000 nodes", |b| {
        b.iter_custom(|iters| {
            let mut elapsed = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let mut probe = PlacementProbe::new(&view, "ml").expect("service exists");
                // Ten nodes hold a few hundred instances; rebuild before they fill.
                let chunk = left.min(200);
                let start = Instant::now();
                for _ in 0..chunk {
                    black_box(probe.place_one());
                }
                elapsed += start.elapsed();
                left -= chunk;
            }
            elapsed
        });
    });
}

fn one_pending_pass(c: &mut Criterion) {
    let view = with_services(cluster(NODES), 1, 1);
    let scheduler = SchedulerController::default();
    let mut group = c.benchmark_group("scheduler pass");
    group.sample_size(20);
    group.bench_function("1 pending instance, 5000 nodes", |b| {
        b.iter(|| black_box(scheduler.reconcile(&view, &settled())));
    });
    group.finish();
}

fn full_placement(c: &mut Criterion) {
    let view = with_services(cluster(NODES), 20, 500);
    let scheduler = SchedulerController::default();
    let plan = scheduler.reconcile(&view, &settled());
    assert_eq!(
        plan.writes.len(),
        10_000,
        "every instance placed in one pass"
    );
    let mut group = c.benchmark_group("scheduler pass");
    group.sample_size(10);
    group.bench_function("10000 instances, 5000 nodes", |b| {
        b.iter(|| black_box(scheduler.reconcile(&view, &settled())));
    });
    group.finish();
}

criterion_group!(
    benches,
    one_placement,
    one_restricted_placement,
    one_pending_pass,
    full_placement
);
criterion_main!(benches);
