//! Test fixtures shared by the controller tests: a [`ViewBuilder`] that
//! writes typed facts into a [`View`] the way the cache would (one revision
//! per write, one per applied plan), small constructors for nodes, services,
//! instances and statuses, and an injected clock via [`context`].

use std::collections::BTreeMap;

use cca_model::cluster::{
    Heartbeat, Instance, InstanceState, InstanceStatus, NodeCondition, NodeControl, NodeInfo,
    NodeStatus,
};
use cca_model::keys;
use cca_model::spec::{Cpu, Memory, PortSpec, Resources, ServiceSpec, Workload};
use cca_store::Revision;
use serde::Serialize;

use crate::controller::{Context, Plan, Write};
use crate::view::View;

pub(crate) const MI: u64 = 1 << 20;

/// A context at `now` whose leadership began long ago (grace periods over).
pub(crate) fn context(now: i64) -> Context {
    Context {
        now,
        leader_since: now - 3_600_000,
    }
}

/// A node with `cpu` millicores and `memory_mi` MiB, amd64, no labels.
pub(crate) fn node_info(name: &str, cpu: u64, memory_mi: u64) -> NodeInfo {
    NodeInfo {
        name: name.to_owned(),
        cpu: Cpu(cpu),
        memory: Memory(memory_mi * MI),
        arch: "amd64".into(),
        zone: None,
        labels: BTreeMap::new(),
        addresses: vec!["127.0.0.1".into()],
        agent_url: None,
        registered_at: 0,
        gate: Default::default(),
    }
}

/// A process service asking 100m and 64Mi per instance, with one port `http`.
pub(crate) fn service(name: &str, replicas: u32) -> ServiceSpec {
    ServiceSpec {
        replicas,
        ports: vec![PortSpec::tcp("http", 8080)],
        resources: Resources {
            cpu: Some(Cpu(100)),
            memory: Some(Memory(64 * MI)),
        },
        ..ServiceSpec::new(name, Workload::process("sleep 1000"))
    }
}

/// An instance record of `service` on `node`, 100m / 64Mi, created at 0.
pub(crate) fn instance(id: &str, service: &str, node: &str) -> Instance {
    Instance {
        id: id.to_owned(),
        service: service.to_owned(),
        node: node.to_owned(),
        ordinal: None,
        spec_hash: String::new(),
        cpu: Cpu(100),
        memory: Memory(64 * MI),
        host_ports: BTreeMap::new(),
        created_at: 0,
        stopping: false,
        replaces: None,
        failures: vec![],
        resized: None,
    }
}

/// What an agent reports about an instance.
pub(crate) fn status(id: &str, service: &str, node: &str, state: InstanceState) -> InstanceStatus {
    InstanceStatus {
        id: id.to_owned(),
        service: service.to_owned(),
        node: node.to_owned(),
        state,
        healthy: None,
        pid: None,
        address: Some("127.0.0.1".into()),
        own_network: false,
        host_ports: BTreeMap::new(),
        restarts: 0,
        last_exit: None,
        message: None,
        updated_at: 0,
    }
}

/// Builds a [`View`] one fact at a time, each at the next revision.
#[derive(Clone, Debug, Default)]
pub(crate) struct ViewBuilder {
    view: View,
}

impl From<View> for ViewBuilder {
    fn from(view: View) -> Self {
        Self { view }
    }
}

impl ViewBuilder {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn next_revision(&mut self) -> Revision {
        self.view.revision += 1;
        self.view.revision
    }

    pub(crate) fn put<T: Serialize>(mut self, key: &str, value: &T) -> Self {
        let revision = self.next_revision();
        let bytes = serde_json::to_vec(value).expect("fixtures encode");
        self.view.put(key, &bytes, revision);
        self
    }

    pub(crate) fn delete(mut self, key: &str) -> Self {
        let revision = self.next_revision();
        self.view.delete(key, revision);
        self
    }

    /// A registered, heartbeating, ready node.
    pub(crate) fn node(self, name: &str, cpu: u64, memory_mi: u64) -> Self {
        self.ready_node(node_info(name, cpu, memory_mi))
    }

    /// `info` registered, heartbeating and ready.
    pub(crate) fn ready_node(self, info: NodeInfo) -> Self {
        let name = info.name.clone();
        let ready = NodeStatus {
            condition: NodeCondition::Ready,
            since: 0,
        };
        self.node_info(info)
            .heartbeat(&name)
            .node_status(&name, &ready)
    }

    pub(crate) fn node_info(self, info: NodeInfo) -> Self {
        let key = keys::observed_node(&info.name);
        self.put(&key, &info)
    }

    pub(crate) fn heartbeat(self, node: &str) -> Self {
        let beat = Heartbeat {
            lease_ttl_secs: 15,
            started_at: 0,
            lease: 1,
        };
        self.put(&keys::observed_heartbeat(node), &beat)
    }

    pub(crate) fn node_status(self, node: &str, status: &NodeStatus) -> Self {
        self.put(&keys::derived_node(node), status)
    }

    pub(crate) fn node_control(self, node: &str, control: NodeControl) -> Self {
        self.put(&keys::desired_node(node), &control)
    }

    /// An operator's drain of `node`.
    pub(crate) fn draining(self, node: &str) -> Self {
        let control = NodeControl {
            drain: true,
            disabled: false,
        };
        self.node_control(node, control)
    }

    pub(crate) fn service(self, spec: ServiceSpec) -> Self {
        let key = keys::desired_service(&spec.name);
        self.put(&key, &spec)
    }

    pub(crate) fn remove_service(self, name: &str) -> Self {
        self.delete(&keys::desired_service(name))
    }

    pub(crate) fn instance(self, instance: Instance) -> Self {
        let key = keys::derived_instance(&instance.service, &instance.id);
        self.put(&key, &instance)
    }

    pub(crate) fn status(self, status: InstanceStatus) -> Self {
        let key = keys::observed_instance(&status.id);
        self.put(&key, &status)
    }

    /// Commits `plan` as the runner would: every write at one new revision.
    pub(crate) fn apply(mut self, plan: &Plan) -> Self {
        let revision = self.next_revision();
        for write in &plan.writes {
            match write {
                Write::Put { key, value } => self.view.put(key, value, revision),
                Write::Delete { key } => self.view.delete(key, revision),
            };
        }
        self
    }

    pub(crate) fn build(self) -> View {
        self.view
    }
}
