//! The web console's views at full size: 5,000 ready nodes and 100,000
//! running instances (1,000 services of 100), what the server builds for
//! each page a browser follows (once a second at most per open page).
//! Run with `cargo bench -p cca-api --bench console`.

use std::collections::BTreeMap;
use std::hint::black_box;

use cca_api::console::views;
use cca_control::View;
use cca_model::cluster::{Heartbeat, Instance, InstanceState, InstanceStatus, NodeInfo};
use cca_model::keys;
use cca_model::spec::{Cpu, Memory, PortSpec, ServiceSpec, Workload};
use criterion::{Criterion, criterion_group, criterion_main};
use serde::Serialize;

const NODES: usize = 5_000;
const SERVICES: usize = 1_000;
const REPLICAS: usize = 100;

fn put<T: Serialize>(view: &mut View, key: &str, value: &T) {
    view.revision += 1;
    let bytes = serde_json::to_vec(value).expect("encodes");
    view.put(key, &bytes, view.revision);
}

fn node(view: &mut View, n: usize) {
    let name = format!("node-{n:04}");
    let info = NodeInfo {
        name: name.clone(),
        cpu: Cpu(16_000),
        memory: Memory(64 << 30),
        arch: "amd64".into(),
        zone: Some(format!("zone-{}", n % 3)),
        labels: BTreeMap::new(),
        addresses: vec![format!("10.1.{}.{}", n / 250, n % 250)],
        agent_url: None,
        registered_at: 0,
        gate: Default::default(),
    };
    put(view, &keys::observed_node(&name), &info);
    let beat = Heartbeat {
        lease_ttl_secs: 6,
        started_at: 0,
        lease: 0,
    };
    put(view, &keys::observed_heartbeat(&name), &beat);
}

fn service(view: &mut View, s: usize) {
    let name = format!("svc-{s:04}");
    let spec = ServiceSpec {
        replicas: REPLICAS as u32,
        ports: vec![PortSpec::tcp("http", 8080)],
        ..ServiceSpec::new(&name, Workload::process("sleep 1000"))
    };
    put(view, &keys::desired_service(&name), &spec);
    for replica in 0..REPLICAS {
        let index = s * REPLICAS + replica;
        let instance = Instance {
            id: format!("{name}-{replica:03}"),
            service: name.clone(),
            node: format!("node-{:04}", index % NODES),
            ordinal: None,
            spec_hash: String::new(),
            cpu: Cpu(100),
            memory: Memory(64 << 20),
            host_ports: BTreeMap::new(),
            created_at: 0,
            stopping: false,
            replaces: None,
            failures: Vec::new(),
            resized: None,
        };
        let status = InstanceStatus {
            id: instance.id.clone(),
            service: name.clone(),
            node: instance.node.clone(),
            state: InstanceState::Running,
            healthy: Some(true),
            pid: Some(1_000),
            address: None,
            own_network: false,
            host_ports: BTreeMap::new(),
            restarts: 0,
            last_exit: None,
            message: None,
            updated_at: 0,
        };
        put(
            view,
            &keys::derived_instance(&name, &instance.id),
            &instance,
        );
        put(view, &keys::observed_instance(&instance.id), &status);
    }
}

fn cluster() -> View {
    let mut view = View::default();
    (0..NODES).for_each(|n| node(&mut view, n));
    (0..SERVICES).for_each(|s| service(&mut view, s));
    view
}

fn bench(c: &mut Criterion) {
    let view = cluster();
    let mut group = c.benchmark_group("console view, 5,000 nodes, 100,000 instances");
    group.sample_size(20);
    group.bench_function("overview", |b| {
        b.iter(|| black_box(views::overview(&view, |_| true)));
    });
    group.bench_function("services, first page", |b| {
        b.iter(|| black_box(views::services(&view, "", 0, |_| true)));
    });
    group.bench_function("service of 100 instances", |b| {
        b.iter(|| black_box(views::service(&view, "svc-0500", 0)));
    });
    group.bench_function("nodes, first page", |b| {
        b.iter(|| black_box(views::nodes(&view, "", 0)));
    });
    group.bench_function("node of 20 instances", |b| {
        b.iter(|| black_box(views::node(&view, "node-2500", 0)));
    });
    group.bench_function("instance", |b| {
        b.iter(|| black_box(views::instance(&view, "svc-0500-050")));
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
