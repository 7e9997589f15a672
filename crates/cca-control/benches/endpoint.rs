//! Endpoint controller benchmarks at 10,000 services of three instances
//! on 100 nodes, every instance running: a full pass over a converged
//! cluster (what every pass cost before passes followed changes, and what
//! a resync still costs), and a pass told of one instance's status change
//! (what one backend change costs the control plane). Run with
//! `cargo bench -p cca-control --bench endpoint`.

use std::collections::BTreeMap;
use std::hint::black_box;

use cca_control::controllers::EndpointController;
use cca_control::{Changes, Context, Controller, View, Write};
use cca_model::cluster::{Instance, InstanceState, InstanceStatus};
use cca_model::keys;
use cca_model::spec::{Cpu, Memory, PortSpec, ServiceSpec, Workload};
use criterion::{Criterion, criterion_group, criterion_main};
use serde::Serialize;

const SERVICES: usize = 10_000;
const REPLICAS: usize = 3;
const NODES: usize = 100;

fn put<T: Serialize>(view: &mut View, key: &str, value: &T) -> Vec<cca_control::view::FactChange> {
    view.revision += 1;
    let bytes = serde_json::to_vec(value).expect("encodes");
    view.put(key, &bytes, view.revision)
}

fn report(instance: &Instance, index: usize, state: InstanceState) -> InstanceStatus {
    InstanceStatus {
        id: instance.id.clone(),
        service: instance.service.clone(),
        node: instance.node.clone(),
        state,
        healthy: Some(true),
        pid: Some(1_000 + index as u32),
        address: Some(format!(
            "10.0.{}.{}",
            index % NODES / 250,
            index % NODES % 250
        )),
        own_network: false,
        host_ports: BTreeMap::from([("http".to_owned(), 20_000 + (index % 40_000) as u16)]),
        restarts: 0,
        last_exit: None,
        message: None,
        updated_at: 0,
    }
}

/// The cluster, converged: every endpoint written.
fn converged() -> View {
    let mut view = View::default();
    let mut index = 0;
    for service in 0..SERVICES {
        let name = format!("svc-{service:05}");
        let spec = ServiceSpec {
            replicas: REPLICAS as u32,
            ports: vec![PortSpec::tcp("http", 8080)],
            ..ServiceSpec::new(&name, Workload::process("sleep 1000"))
        };
        put(&mut view, &keys::desired_service(&name), &spec);
        for replica in 0..REPLICAS {
            let instance = Instance {
                id: format!("{name}-{replica}"),
                service: name.clone(),
                node: format!("node-{:03}", index % NODES),
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
            put(
                &mut view,
                &keys::derived_instance(&name, &instance.id),
                &instance,
            );
            let status = report(&instance, index, InstanceState::Running);
            put(&mut view, &keys::observed_instance(&instance.id), &status);
            index += 1;
        }
    }
    let plan = EndpointController.reconcile(&view, &context());
    view.revision += 1;
    for write in &plan.writes {
        if let Write::Put { key, value } = write {
            view.put(key, value, view.revision);
        }
    }
    view
}

fn context() -> Context {
    Context {
        now: 1_000_000,
        leader_since: 0,
    }
}

fn full_pass(c: &mut Criterion) {
    let view = converged();
    assert!(EndpointController.reconcile(&view, &context()).is_noop());
    let mut group = c.benchmark_group("endpoint pass");
    group.sample_size(20);
    group.bench_function("full, 10000 services, converged", |b| {
        b.iter(|| black_box(EndpointController.reconcile(&view, &context())));
    });
    group.finish();
}

fn one_change_pass(c: &mut Criterion) {
    let mut view = converged();
    let instance = view.instances["svc-04242-2"].value.clone();
    let stopped = report(&instance, 4242 * REPLICAS + 2, InstanceState::Restarting);
    let changes = Changes::Facts(put(
        &mut view,
        &keys::observed_instance(&instance.id),
        &stopped,
    ));
    let plan = EndpointController.reconcile_changes(&view, &context(), &changes);
    assert_eq!(plan.writes.len(), 1, "one service's endpoint");
    c.bench_function("endpoint pass, one status change, 10000 services", |b| {
        b.iter(|| black_box(EndpointController.reconcile_changes(&view, &context(), &changes)));
    });
}

criterion_group!(benches, full_pass, one_change_pass);
criterion_main!(benches);
