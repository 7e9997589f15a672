//! The cluster's live state as facts: nodes (registration, heartbeat,
//! operator intent, derived condition), instances (placement, reported
//! status), unplaced demand, endpoints and the event log. Each type names
//! the key it lives under and who writes it; all are JSON in the store.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::LeaseId;
use crate::spec::{Cpu, Memory};

/// Milliseconds since the Unix epoch; the clock every fact uses.
pub type Millis = i64;

/// `observed/node/{node}`, written by the node's agent when it registers.
/// Permanent: a node that stops heartbeating stays known (and becomes
/// unreachable) until an operator removes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    /// Allocatable CPU.
    pub cpu: Cpu,
    /// Allocatable memory.
    pub memory: Memory,
    /// `amd64`, `arm64`, … (Go/OCI spelling).
    pub arch: String,
    pub zone: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// Addresses other nodes and clients reach this node at.
    pub addresses: Vec<String>,
    /// Where the agent serves logs and exec for the API server.
    pub agent_url: Option<String>,
    pub registered_at: Millis,
    /// Where the node's gate proxy listens (`cca agent --gate-listen`):
    /// plain HTTP first, then HTTPS when it has one. Empty: the node
    /// serves no gates (and may not fetch gate certificates).
    #[serde(default, skip_serializing_if = "GateListen::is_off")]
    pub gate: GateListen,
}

/// A gate node's listening addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateListen {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https: Option<String>,
}

impl GateListen {
    pub fn is_off(&self) -> bool {
        self.http.is_none() && self.https.is_none()
    }
}

impl NodeInfo {
    /// Where the API reaches the node's agent, without a trailing slash;
    /// `None` when it registered none.
    pub fn agent_base_url(&self) -> Option<&str> {
        self.agent_url
            .as_deref()
            .map(|url| url.trim_end_matches('/'))
            .filter(|url| !url.is_empty())
    }

    /// The value of a placement label: `arch` and `zone` are labels too.
    pub fn label(&self, name: &str) -> Option<&str> {
        match name {
            "arch" => Some(&self.arch),
            "zone" => self.zone.as_deref(),
            "node" | "name" => Some(&self.name),
            _ => self.labels.get(name).map(String::as_str),
        }
    }
}

/// `observed/heartbeat/{node}`: attached to the agent's lease, so it
/// vanishes when the agent stops renewing it. Its presence means alive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub lease_ttl_secs: u64,
    pub started_at: Millis,
    /// The lease the key is attached to (0 in records written before it
    /// was recorded): lets the API check a heartbeat's lease against its
    /// cache instead of reading the store.
    #[serde(default)]
    pub lease: LeaseId,
}

/// `desired/node/{node}`: what an operator asked of a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeControl {
    /// Move every instance off, respecting disruption budgets.
    pub drain: bool,
    /// Place nothing new here; running instances stay.
    pub disabled: bool,
}

/// `observed/held-ports/{node}`, written by the node's agent: host ports
/// in the scheduler's range that something outside the cluster holds on
/// the node (the agent found them bound when it was about to start an
/// instance on them, and finds them still bound when it looks again).
/// The scheduler hands none of them out on that node; the agent drops a
/// port from the set once it is free again.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldPorts {
    pub ports: std::collections::BTreeSet<u16>,
}

/// `derived/node/{node}`, written by the node controller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub condition: NodeCondition,
    /// When the condition last changed.
    pub since: Millis,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeCondition {
    Ready,
    /// The heartbeat lease expired; instances are replaced after a grace
    /// period.
    Unreachable,
}

/// `derived/disruption`, written by the node controller: whether it
/// trusts lost leases. When many nodes miss their leases at once, the
/// likelier cause is the control plane, the store or the network, not the
/// nodes: the controller then pauses lost-node replacement (nodes are still
/// marked unreachable; nothing of theirs is replaced) until heartbeats
/// return, an operator resumes it, or the safeguard does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disruption {
    /// Lost-node replacement is paused.
    pub paused: bool,
    /// When the current state (paused or not) began.
    pub since: Millis,
    /// Nodes that had missed their leases within one TTL, and the nodes
    /// that could have (every node but those missing for longer), when the
    /// pause began (or ended).
    pub missing: u32,
    pub nodes: u32,
    /// What ended the last pause (absent while paused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_by: Option<ResumeCause>,
}

/// What ended a pause of lost-node replacement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeCause {
    /// Enough of the missing nodes heartbeat again.
    Heartbeats,
    /// An operator said the missing nodes are gone (`cca nodes resume-replacement`).
    Operator,
    /// No further node went missing for the configured time: the control
    /// plane is healthy, so the missing nodes are the problem.
    Safeguard,
}

/// `desired/replacement-resume`: an operator's word that the nodes missing
/// during a pause of lost-node replacement are really gone. A pause that
/// began at or before `at` ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplacementResume {
    pub at: Millis,
}

/// `derived/instance/{service}/{id}`, written by the scheduler: one
/// instance of a service, placed on a node. Agents run what is placed on
/// their node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub id: String,
    pub service: String,
    pub node: String,
    /// Stable ordinal of a stateful service's instance (`db-0`, `db-1`).
    pub ordinal: Option<u32>,
    /// Hash of the service spec this instance runs; a change rolls it.
    pub spec_hash: String,
    /// Resources reserved on the node (copied from the spec at placement).
    pub cpu: Cpu,
    pub memory: Memory,
    /// Host ports reserved on the node, by service port name or number.
    pub host_ports: BTreeMap<String, u16>,
    pub created_at: Millis,
    /// The scheduler asked the agent to stop it (drain, scale down, roll);
    /// the record goes once the agent reports it stopped.
    pub stopping: bool,
    /// The instance this one takes over from (a drain or rebalancing move):
    /// the scheduler stops that one once this one runs. Until then this
    /// instance is a surge and does not count towards the replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<String>,
    /// When failed predecessors of this instance were replaced (newest
    /// last, pruned to the scheduler's failure window). The scheduler sums
    /// these per service to cap replacements, so the restart budget is
    /// computed from facts and survives a leader change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<Millis>,
    /// The limits vertical autoscaling sized it to, in place of its
    /// spec's `resources` (`None`: the spec's); `cpu`/`memory` reserve
    /// the same. The agent applies a change in place where the runtime
    /// can, else at the instance's next start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resized: Option<crate::spec::Resources>,
}

/// `observed/instance/{id}`, written by the agent running the instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceStatus {
    pub id: String,
    pub service: String,
    pub node: String,
    pub state: InstanceState,
    /// `None` until a health check has run (or when there is none).
    pub healthy: Option<bool>,
    pub pid: Option<u32>,
    /// Address the instance is reachable at (container IP or node address).
    pub address: Option<String>,
    /// The address is the instance's own, on its node's subnet, and its
    /// declared ports answer there (a container in its own network
    /// namespace); otherwise it shares the node's address and answers on
    /// its host ports.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own_network: bool,
    /// Host ports actually bound, by service port name or number.
    pub host_ports: BTreeMap<String, u16>,
    pub restarts: u32,
    pub last_exit: Option<ExitInfo>,
    /// Human-readable detail of the current state.
    pub message: Option<String>,
    pub updated_at: Millis,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    /// Accepted by the agent, not started yet (image pull, init steps).
    Pending,
    Starting,
    Running,
    /// Crashed; the agent restarts it with backoff.
    Restarting,
    Stopping,
    Stopped,
    /// Gave up: restarts exhausted or it cannot start at all.
    Failed,
}

impl InstanceState {
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Pending => "pending",
            InstanceState::Starting => "starting",
            InstanceState::Running => "running",
            InstanceState::Restarting => "restarting",
            InstanceState::Stopping => "stopping",
            InstanceState::Stopped => "stopped",
            InstanceState::Failed => "failed",
        }
    }
}

/// How a process last ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// `oom_killed`, `killed`, `exited`, `start_failed`, …
    pub reason: String,
    pub at: Millis,
    /// The last lines the instance wrote, for `cca describe`.
    pub log_tail: Vec<String>,
}

impl ExitInfo {
    /// One line: the reason with the code or signal, e.g. `exited with
    /// code 3`, `killed by signal 9`, `oom_killed`.
    pub fn summary(&self) -> String {
        match (self.code, self.signal) {
            (_, Some(signal)) => format!("{} by signal {signal}", self.reason),
            (Some(code), None) => format!("{} with code {code}", self.reason),
            (None, None) => self.reason.clone(),
        }
    }
}

/// `derived/unplaced/{service}/{slot}`, written by the scheduler: demand it
/// could not place, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unplaced {
    pub service: String,
    /// How many instances of the service are waiting.
    pub count: u32,
    pub reason: UnplacedReason,
    /// The constraint that failed, e.g. `memory: needs 512Mi, at most 256Mi free`.
    pub constraint: String,
    /// The node that came closest, with what it lacks.
    pub nearest_node: Option<String>,
    pub since: Millis,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnplacedReason {
    /// Some node could take it if it had more room.
    InsufficientCapacity,
    /// No node can ever take it as the cluster is (labels, ports, arch).
    UnsatisfiableConstraint,
}

/// `derived/endpoint/{service}/{port}`, written by the endpoint controller:
/// the ready backends of one service port.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoints {
    pub service: String,
    pub port: String,
    pub backends: Vec<Backend>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Backend {
    pub instance: String,
    pub node: String,
    pub address: String,
    pub port: u16,
}

/// `events/{at:013}-{seq:010}-{origin:08x}`: one entry of the event log (kept for a
/// retention period, then deleted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub at: Millis,
    pub level: EventLevel,
    /// Which component said it: `api`, `scheduler`, `node`, an agent's node name.
    pub source: String,
    /// What it is about: `service/web`, `node/n1`, `instance/web-3`.
    pub subject: String,
    pub message: String,
}

/// `audit/{at:013}-{seq:010}-{origin:08x}`: one entry of the audit log — a
/// request that changed something, or one that was refused — kept for a
/// retention period, then deleted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub at: Millis,
    /// Who asked: `node:n1`, `user:alice`, or `None` when the request
    /// proved no identity.
    pub who: Option<String>,
    /// The caller's address as the server saw it.
    pub address: String,
    pub method: String,
    /// The request's path (the object it was about).
    pub path: String,
    /// The HTTP status of the answer.
    pub status: u16,
    pub outcome: AuditOutcome,
    /// What the route adds that the path does not say: the node a join
    /// token enrolled, or why a token was refused (never a secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// How an audited request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditOutcome {
    /// It did what it asked (2xx).
    Done,
    /// It was refused for who asked (401, 403).
    Denied,
    /// It failed otherwise (any other status; not recorded by the API,
    /// but for the record that says how many records were lost).
    Failed,
}

impl AuditOutcome {
    /// The outcome an HTTP status means.
    pub fn of_status(status: u16) -> Self {
        match status {
            200..=299 => AuditOutcome::Done,
            401 | 403 => AuditOutcome::Denied,
            _ => AuditOutcome::Failed,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventLevel {
    Info,
    Warning,
}

/// `meta/leader`: the server that leads the control plane, attached to
/// its lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    pub server: String,
    pub since: Millis,
}

/// `desired/service-meta/{svc}`: what the API remembers about a service
/// besides its spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceMeta {
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// `meta/desired-generation`: counts writes of program-managed facts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredGeneration {
    pub generation: u64,
}

/// `meta/apply/{apply}/chunk/{n}`: some of a staged apply's writes, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyChunk {
    pub writes: Vec<StagedWrite>,
}

/// One write of a staged apply. `value` is the fact's JSON text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum StagedWrite {
    Put { key: String, value: String },
    Delete { key: String },
}

impl StagedWrite {
    pub fn key(&self) -> &str {
        match self {
            StagedWrite::Put { key, .. } | StagedWrite::Delete { key } => key,
        }
    }
}

/// `meta/applying`: the staged apply that is committed and being copied
/// into place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyCommit {
    pub apply: String,
    /// How many chunks the apply staged (`0..chunks`).
    pub chunks: u32,
    pub at: Millis,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_zone_and_name_are_labels() {
        let node = NodeInfo {
            name: "n1".into(),
            cpu: Cpu(2000),
            memory: Memory(1 << 30),
            arch: "amd64".into(),
            zone: Some("eu-1a".into()),
            labels: BTreeMap::from([("disk".into(), "ssd".into())]),
            addresses: vec!["127.0.0.1".into()],
            agent_url: None,
            registered_at: 0,
            gate: Default::default(),
        };
        assert_eq!(node.label("arch"), Some("amd64"));
        assert_eq!(node.label("zone"), Some("eu-1a"));
        assert_eq!(node.label("disk"), Some("ssd"));
        assert_eq!(node.label("name"), Some("n1"));
        assert_eq!(node.label("gpu"), None);
    }

    #[test]
    fn states_serialise_in_snake_case() {
        let json = serde_json::to_string(&InstanceState::Restarting).expect("encodes");
        assert_eq!(json, "\"restarting\"");
        assert_eq!(InstanceState::Restarting.as_str(), "restarting");
    }
}
