//! The JSON shapes of the API, shared by the server and the typed
//! [`Client`](crate::Client) so both always agree. Field names are stable:
//! `cca … -o json` prints these types, and scripts rely on them.

use std::collections::BTreeMap;

use cca_model::cluster::{
    Disruption, Endpoints, Event, GateListen, Heartbeat, Instance, InstanceStatus, Millis,
    NodeControl, NodeInfo, NodeStatus, Unplaced,
};
use cca_model::net::{NetworkChange, NodeSubnet, ServiceVip};
use cca_model::spec::{Cpu, Memory, ServiceSpec};
use cca_model::{LeaseId, Revision};
use serde::{Deserialize, Serialize};

/// The body of every error response. `problems` is there only for a
/// program that breaks `cca_model::validity`'s rules: every problem, each
/// with its code, message and subject (object and field).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<cca_model::validity::Problem>,
}

impl ErrorBody {
    /// Reads an error answer's body: ours, or anything else as its text
    /// (a proxy's page, an agent that died mid-answer).
    pub fn read(body: &[u8]) -> ErrorBody {
        serde_json::from_slice(body).unwrap_or_else(|_| ErrorBody {
            error: String::from_utf8_lossy(body).trim().to_owned(),
            problems: Vec::new(),
        })
    }
}

/// What `apply` changed (or, for `diff`, would change), by store key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyReport {
    /// True for `diff`: nothing was written.
    pub dry_run: bool,
    /// The revision of the write; `None` when nothing was written.
    pub revision: Option<Revision>,
    pub created: Vec<String>,
    pub changed: Vec<String>,
    pub deleted: Vec<String>,
    /// How many facts of the program were already as asked.
    pub unchanged: usize,
}

impl ApplyReport {
    /// True when the program matches the store.
    pub fn is_empty(&self) -> bool {
        self.created.is_empty() && self.changed.is_empty() && self.deleted.is_empty()
    }
}

/// One row of `get services`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceSummary {
    pub name: String,
    /// `process` or `image`.
    pub workload: String,
    pub replicas: u32,
    /// Placed instances that are not being stopped.
    pub instances: usize,
    /// Instances reported running.
    pub running: usize,
    /// Instances waiting for a node.
    pub unplaced: u32,
    pub tags: BTreeMap<String, String>,
    /// When the service was first applied (absent for services written
    /// around the API).
    pub created_at: Option<Millis>,
    /// Its virtual IP: held, released, or why there is none (absent for a
    /// service without ports, or before the network controller ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip: Option<ServiceVip>,
    /// The DNS name that resolves to the VIP, while it holds one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<String>,
    /// Whether a `scale_to_zero` service sleeps, since when and why
    /// (absent for a service that never sleeps, or before the scale
    /// controller's first pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<cca_model::scale::ScaleState>,
}

/// `history service`: the versions of a service's spec the cluster keeps,
/// newest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceHistory {
    pub service: String,
    pub versions: Vec<VersionSummary>,
}

/// One kept version of a service's spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionSummary {
    /// The spec hash: what `Instance::spec_hash` names.
    pub version: String,
    /// When an apply first made it the service's spec.
    pub created_at: Millis,
    /// When an apply last made it the service's spec.
    pub applied_at: Millis,
    /// The revision of that apply (what `cca apply` printed).
    pub revision: Revision,
    /// Placed instances running it (stopping ones included).
    pub instances: usize,
    /// It is the service's current spec.
    pub current: bool,
    pub spec: ServiceSpec,
}

/// `GET /v1/services/{name}/rollout`: where the service's rollout stands,
/// what it waits for, and the decisions behind it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutStatus {
    pub service: String,
    /// The version of the service's spec (what the last apply asked for).
    pub spec_version: String,
    /// The version the scheduler places now: the spec's, or an older one
    /// an undo or an automatic rollback chose, or (paused) the one most
    /// instances run.
    pub placing: String,
    /// The lifecycle controller's rollout (absent before its first pass).
    pub rollout: Option<cca_model::rollout::Rollout>,
    /// Held by `cca rollout pause`.
    pub paused: bool,
    pub progress: RolloutProgress,
    /// What bounds the roll: `max_surge`, `max_unavailable` within the
    /// disruption budget, `rollback_after`.
    pub max_surge: u32,
    pub max_unavailable: u32,
    pub rollback_after: u32,
    /// Instances of the version placed that are not ready yet, with their
    /// state and their agent's message: what the roll waits for (at most
    /// 20).
    pub waiting: Vec<String>,
}

/// A rollout's progress, counted from the instances (stopping ones apart).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutProgress {
    /// The replicas the service wants (0 while asleep).
    pub wanted: u32,
    /// Instances of the version placed.
    pub updated: u32,
    /// Of those, ready.
    pub ready: u32,
    /// Instances of other versions.
    pub old: u32,
    /// Instances stopping.
    pub stopping: u32,
}

/// `POST /v1/services/{name}/rollout/undo`: the version to roll to, by
/// hash or a unique prefix of one; absent: the rollout's previous version.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UndoArgs {
    #[serde(default)]
    pub to: Option<String>,
}

/// What `rollout pause|resume|undo` changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutControlReport {
    pub service: String,
    pub control: cca_model::rollout::RolloutControl,
    /// False when it was already so (nothing written).
    pub changed: bool,
    pub revision: Revision,
}

/// `GET /v1/services/{name}/scale`: the service's replica count, who sets
/// it, and the signals, window and bounds behind it (`cca scale why`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleStatus {
    pub service: String,
    /// What the scheduler runs when the service is awake.
    pub replicas: u32,
    /// The spec's `replicas` (the starting count of an autoscaled one).
    pub spec_replicas: u32,
    /// Horizontal autoscaling's bounds and targets, when it is on: then the
    /// autoscaler sets the count and `cca scale` is refused.
    pub autoscale: Option<cca_model::spec::HorizontalScale>,
    /// What each metric says now, from the instances' last reports.
    pub signals: Vec<cca_model::autoscale::Signal>,
    /// The autoscaler's decision: recommendation, window, last change, why
    /// it holds.
    pub autoscaled: Option<cca_model::autoscale::Autoscaled>,
    /// Whether a `scale_to_zero` service sleeps (then it runs none).
    pub scale_to_zero: Option<cca_model::scale::ScaleState>,
    /// Vertical autoscaling's window and recommendation, when it is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vertical: Option<VerticalStatus>,
}

/// What vertical autoscaling recommends for a service, and from what.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerticalStatus {
    /// The `vertical` block: bounds and mode.
    pub bounds: cca_model::spec::VerticalScale,
    /// What the spec's `resources` give each instance now.
    pub resources: cca_model::spec::Resources,
    /// The usage window, in milliseconds.
    pub window_ms: Millis,
    /// Samples in the window (one per ready instance per sample).
    pub samples: u64,
    /// When the last sample was taken (0: none yet).
    pub sampled_at: Millis,
    /// The window's 95th percentiles.
    pub observed: Option<cca_model::vertical::Sizes>,
    /// The sizes recommended, once the window holds enough samples.
    pub recommended: Option<cca_model::vertical::Sizes>,
    /// The samples a first recommendation needs.
    pub min_samples: u64,
    /// `mode = "auto"`: the resources the instances are sized to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<cca_model::spec::Resources>,
    /// Why the applied sizes do not follow the recommendation, if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holding: Option<String>,
}

/// `describe service`: the spec, its instances, and why some are pending.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceDetail {
    pub summary: ServiceSummary,
    pub spec: ServiceSpec,
    pub instances: Vec<InstanceSummary>,
    /// Demand the scheduler could not place, with the reason.
    pub unplaced: Option<Unplaced>,
    pub endpoints: Vec<Endpoints>,
    /// Recent events about this service.
    pub events: Vec<EventRecord>,
    /// Each placed instance's last reported usage.
    #[serde(default)]
    pub usage: Vec<InstanceTop>,
    /// Where its rollout stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// What vertical autoscaling recommends, when it is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vertical: Option<VerticalStatus>,
}

/// One row of `get instances`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceSummary {
    pub id: String,
    pub service: String,
    pub node: String,
    /// The reported state (`running`, `failed`, …), or `assigned` when the
    /// instance is placed but its agent has not reported yet.
    pub state: String,
    pub healthy: Option<bool>,
    pub restarts: u32,
    pub address: Option<String>,
    pub ordinal: Option<u32>,
    /// The scheduler asked the agent to stop it.
    pub stopping: bool,
    /// False for a reported instance whose placement is gone.
    pub placed: bool,
    pub created_at: Option<Millis>,
}

/// `describe instance`: placement, the latest report, last exit and logs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceDetail {
    pub summary: InstanceSummary,
    pub placement: Option<Instance>,
    pub status: Option<InstanceStatus>,
    /// Its node's last report of what it used; `None` when there is none.
    #[serde(default)]
    pub usage: Option<ReportedUsage>,
}

/// One row of `get nodes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSummary {
    pub name: String,
    /// `ready` or `unreachable`.
    pub status: String,
    pub draining: bool,
    pub disabled: bool,
    pub cpu: Cpu,
    pub memory: Memory,
    /// Reserved by the instances placed here.
    pub cpu_allocated: Cpu,
    pub memory_allocated: Memory,
    pub instances: usize,
    pub arch: String,
    pub zone: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub addresses: Vec<String>,
    pub registered_at: Millis,
    /// The node's slice of the cluster CIDR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<NodeSubnet>,
}

/// `describe node`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDetail {
    pub summary: NodeSummary,
    pub info: NodeInfo,
    pub control: NodeControl,
    pub condition: Option<NodeStatus>,
    pub heartbeat: Option<Heartbeat>,
    pub instances: Vec<InstanceSummary>,
    /// While the node drains: the services whose disruption budget
    /// (`max_unavailable = 0`) keeps their instances on it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drain_held_by: Vec<String>,
    /// The node's last usage report (the whole node); `None` before one.
    #[serde(default)]
    pub usage: Option<ReportedUsage>,
    /// Instances the node runs that the store does not place there (it
    /// resynced with another store), awaiting adoption.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unclaimed: Vec<cca_model::recovery::UnclaimedInstance>,
}

/// `status`: the cluster at a glance.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub revision: Revision,
    pub nodes: NodeCounts,
    pub services: usize,
    /// Instances by state (`assigned` for placed but not yet reported).
    pub instances: BTreeMap<String, usize>,
    pub unplaced: Vec<Unplaced>,
    /// Facts in the store that do not decode (hand-edited or foreign).
    pub invalid_facts: BTreeMap<String, String>,
    /// Whether lost-node replacement is paused (absent: it never was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption: Option<Disruption>,
    /// The store's identity (absent from a server that made none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<cca_model::recovery::StoreIdentity>,
    /// Instances nodes run that the store does not place (after a resync
    /// with another store), awaiting adoption.
    #[serde(default)]
    pub unclaimed: usize,
    /// Every node with what it runs, by name.
    #[serde(default)]
    pub per_node: Vec<NodeInstanceCounts>,
}

/// What one node runs, for `cca status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInstanceCounts {
    pub node: String,
    /// `ready` or `unreachable`.
    pub status: String,
    pub running: usize,
    pub failed: usize,
    /// Placed instances neither running, failed nor stopped: assigned,
    /// starting, stopping.
    pub other: usize,
    /// Instances it runs that the store does not place.
    pub unclaimed: usize,
}

/// Reply of `POST /v1/cluster/resume-replacement`: the pause that ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplacementResumed {
    /// When the pause began, and how many of how many nodes were missing
    /// then.
    pub since: Millis,
    pub missing: u32,
    pub nodes: u32,
    pub revision: Revision,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCounts {
    pub total: usize,
    pub ready: usize,
    pub unreachable: usize,
    pub draining: usize,
    pub disabled: usize,
}

/// Body of `scale`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleRequest {
    pub replicas: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleReport {
    pub service: String,
    pub previous: u32,
    pub replicas: u32,
    pub revision: Revision,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteReport {
    pub service: String,
    pub deleted: Vec<String>,
    pub revision: Revision,
}

/// Answer of drain / disable / enable: the node's operator intent now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeControlReport {
    pub node: String,
    pub control: NodeControl,
    pub revision: Revision,
}

/// One entry of the event log with its key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    pub key: String,
    #[serde(flatten)]
    pub event: Event,
}

/// One line of the `watch` stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WatchLine {
    /// `key` now holds `value` (JSON when the fact is JSON, else a string).
    Put {
        revision: Revision,
        key: String,
        value: serde_json::Value,
    },
    Delete {
        revision: Revision,
        key: String,
    },
    /// History before `compact_revision + 1` is gone; the stream ends.
    /// Re-read and watch again from the current revision.
    Compacted {
        compact_revision: Revision,
    },
}

/// What an agent sends to join: its node's capacity and identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterRequest {
    pub name: String,
    pub cpu: Cpu,
    pub memory: Memory,
    pub arch: String,
    #[serde(default)]
    pub zone: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub agent_url: Option<String>,
    /// Where the node's gate proxy listens; off when it serves no gates.
    #[serde(default, skip_serializing_if = "GateListen::is_off")]
    pub gate: GateListen,
}

/// The lease the agent must keep alive with heartbeats.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterReply {
    pub node: String,
    pub lease_id: LeaseId,
    pub ttl_secs: u64,
    pub revision: Revision,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    pub lease_id: LeaseId,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatReply {
    /// The TTL of the lease to renew from now on.
    pub ttl_secs: u64,
    /// Set when the node's heartbeat moved to another lease (the fleet
    /// grew or shrank, see `cca_model::node_lease`): renew this one from
    /// now on, every period of `ttl_secs`; the old one is revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<LeaseId>,
}

/// An instance placed on the agent's node with the spec it runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    pub instance: Instance,
    /// The spec the instance was placed with (its service's version of
    /// `instance.spec_hash`, or the current spec when no version is kept);
    /// `None` while the service is being deleted.
    pub spec: Option<ServiceSpec>,
    /// Secrets the service is granted explicitly (`secret NAME` in its
    /// block), each delivered as a file; with `spec.connections`, what
    /// tells the agent to fetch the instance's files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// Where each connection an init step probes answers, by connection.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub probes: BTreeMap<String, ProbeAddress>,
}

/// A connection's host and port as an init step's probe dials them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeAddress {
    /// As the connection names it (resolved on the node when `vip` is
    /// absent).
    pub host: String,
    pub port: u16,
    /// The service VIP `host` names (`{svc}` or `{svc}.cca.local`), when
    /// the service holds one: dialled instead of resolving `host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip: Option<std::net::Ipv4Addr>,
}

/// One line of a node's assignment stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AssignmentLine {
    /// Everything placed on the node at `revision` (first line unless resuming).
    Snapshot {
        revision: Revision,
        assignments: Vec<Assignment>,
        /// Which store and which stream history the revisions belong to.
        #[serde(default)]
        origin: StreamOrigin,
    },
    /// An instance was placed on the node or its placement changed.
    Put {
        revision: Revision,
        assignment: Box<Assignment>,
    },
    /// The instance is no longer placed on the node: stop it.
    Delete { revision: Revision, id: String },
    /// Resuming is impossible; reconnect without `from` for a snapshot.
    Compacted { compact_revision: Revision },
}

/// Where a stream's revisions come from, named by its snapshot. A client
/// resumes only with the `epoch` it was given (the server answers a
/// snapshot to any other), and a `store` other than the one it followed
/// means its cached state belongs to another store: it resyncs from scratch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOrigin {
    /// The store's identity (`meta/store`); empty from a server that had
    /// none.
    #[serde(default)]
    pub store: String,
    /// The server's index that numbered the lines: a resume point is only
    /// good with the same index, which watched every revision in between.
    #[serde(default)]
    pub epoch: String,
}

/// Where a stream that ended picks up: the revision to replay from and the
/// epoch of the snapshot it was counted from. [`Resume::SNAPSHOT`] asks for a
/// snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resume {
    pub from: Revision,
    pub epoch: String,
}

impl Resume {
    pub const SNAPSHOT: Resume = Resume {
        from: 0,
        epoch: String::new(),
    };
}

/// One line of the network stream every node follows
/// (`GET /v1/agent/nodes/{node}/network`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum NetworkLine {
    /// The whole map at `revision` (first line unless resuming).
    Snapshot {
        revision: Revision,
        changes: Vec<NetworkChange>,
        /// Which store and which stream history the revisions belong to.
        #[serde(default)]
        origin: StreamOrigin,
    },
    /// What one revision changed.
    Changes {
        revision: Revision,
        changes: Vec<NetworkChange>,
    },
    /// Resuming is impossible; reconnect without `from` for a snapshot.
    Compacted { compact_revision: Revision },
}

/// The most reports one [`ReportBatch`] may carry.
pub const MAX_REPORT_BATCH: usize = 1_000;

/// Body of `POST /v1/agent/nodes/{node}/reports`: observed states of
/// instances of that node, at most [`MAX_REPORT_BATCH`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportBatch {
    pub statuses: Vec<InstanceStatus>,
}

/// Answer of a report batch: the reports not written, each with why;
/// every other one is written (or was already recorded as sent).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportBatchReply {
    /// Revision of the last write; `None` when nothing needed writing.
    pub revision: Option<Revision>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedReport>,
}

/// One report of a batch that was not written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedReport {
    pub id: String,
    /// The HTTP status a single report would have been answered with.
    pub status: u16,
    pub message: String,
}

/// Answer of `PUT /v1/agent/nodes/{node}/held-ports` (the body is a
/// [`cca_model::cluster::HeldPorts`]: every host port the node finds held
/// by something outside the cluster now).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldPortsReply {
    /// The revision that recorded it; `None` when it changed nothing.
    pub revision: Option<Revision>,
}

/// Answer of `PUT /v1/agent/nodes/{node}/unclaimed`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnclaimedReply {
    /// The revision that recorded it; `None` when it changed nothing.
    pub revision: Option<Revision>,
    /// The reported instances' services that the store knows.
    #[serde(default)]
    pub known_services: std::collections::BTreeSet<String>,
}

/// Answer of an observed-state report or delete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteReply {
    pub revision: Revision,
}

/// Body of `POST /v1/instances/{id}/exec`, which the API forwards as is to
/// the agent of the instance's node: a command to run in the instance's
/// context (its environment, working directory and cgroups).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecCommand {
    /// The program and its arguments, run directly (not through a shell).
    pub argv: Vec<String>,
    /// The command is killed (with its process group) after this long.
    pub timeout_ms: u64,
}

/// How an exec'd command ended and what it wrote, as the agent answered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResult {
    /// The exit code; `None` when a signal ended the command.
    pub code: Option<i32>,
    /// The signal that ended the command, if one did.
    pub signal: Option<i32>,
    /// Everything written to stdout (decoded as UTF-8, lossily).
    pub stdout: String,
    /// Everything written to stderr (decoded as UTF-8, lossily).
    pub stderr: String,
    /// It ran past `timeout_ms` and was killed.
    pub timed_out: bool,
}

/// Body of `PUT /v1/secrets/{name}`. `Debug` hides the value.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetSecretRequest {
    /// UTF-8 text, at most 64 KiB.
    pub value: String,
}

impl std::fmt::Debug for SetSecretRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SetSecretRequest { value: <redacted> }")
    }
}

/// Answer of `PUT /v1/secrets/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetSecretReply {
    pub name: String,
    /// False when the secret already had a value (now replaced).
    pub created: bool,
    pub revision: Revision,
}

/// One secret of `GET /v1/secrets`: never its value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretInfo {
    pub name: String,
    /// A program declares it (`secret NAME`).
    pub declared: bool,
    /// It has a value.
    pub set: bool,
    /// When the value was set (ms since the epoch).
    pub set_at: Option<Millis>,
    /// Services granted it, explicitly or through a connection.
    pub used_by: Vec<String>,
}

/// Answer of `DELETE /v1/secrets/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteSecretReply {
    pub name: String,
    pub revision: Revision,
}

/// Answer of `GET /v1/agent/nodes/{node}/instances/{id}/files`: what the
/// agent writes for the instance before creating it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceFiles {
    pub instance: String,
    pub files: Vec<InstanceFile>,
}

/// One file of an instance. `Debug` hides the content.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceFile {
    /// `connections/{name}` or `secrets/{name}`, relative to the instance's
    /// files directory (and to `/run/` inside a container).
    pub path: String,
    pub content: String,
}

impl std::fmt::Debug for InstanceFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceFile")
            .field("path", &self.path)
            .field("content", &"<redacted>")
            .finish()
    }
}

/// `GET /v1/identity`: who the server takes the caller for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallerIdentity {
    /// The identity the caller proved (a verified client certificate or
    /// a bearer token); `None` when it proved none.
    pub identity: Option<Principal>,
    /// The caller's address as the server sees it.
    pub address: String,
    /// How it proved it: `certificate`, `token` or `oidc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// A user's roles and tenant, from their record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<cca_model::access::UserRecord>,
}

/// A node, user or server, by kind and name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// `node`, `user` or `server`.
    pub kind: String,
    pub name: String,
}

/// One entry of `GET /v1/audit`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub key: String,
    #[serde(flatten)]
    pub record: cca_model::cluster::AuditRecord,
}

/// Answer of `POST /v1/secret-key/rotate`: what re-wrapping every secret's
/// data key under the server's primary key-encryption key did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RotateSecretKeyReply {
    /// The primary KEK's id, which every re-wrapped record now names.
    pub key_id: String,
    /// Records whose data key was re-wrapped (or, format 1, sealed again).
    pub rewrapped: u64,
    /// Records already under the primary KEK.
    pub current: u64,
    /// Records that could not be re-wrapped, by name: they still open
    /// only with the key they name.
    pub failed: Vec<RotateFailure>,
}

/// One record a rotation could not re-wrap, and why (never a value).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RotateFailure {
    pub name: String,
    pub error: String,
}

/// `POST /v1/tokens`: a join token for new nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateTokenRequest {
    /// Seconds the token is valid; the server's default (an hour) if absent.
    #[serde(default)]
    pub ttl_secs: Option<u64>,
    /// The only node the token may enrol.
    #[serde(default)]
    pub node: Option<String>,
    /// How many nodes it may enrol; any number if absent.
    #[serde(default)]
    pub uses: Option<u32>,
    #[serde(default)]
    pub description: String,
}

/// The made token: the only time its secret is shown.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatedToken {
    /// The whole token, `K10<fingerprint>::<id>.<secret>`.
    pub token: String,
    pub info: TokenInfo,
}

impl std::fmt::Debug for CreatedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatedToken")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// A join token as `cca token ls` shows it: never its secret or hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenInfo {
    pub id: String,
    pub created_at: Millis,
    pub expires_at: Millis,
    pub node: Option<String>,
    pub uses_left: Option<u32>,
    pub revoked: bool,
    pub description: String,
    pub created_by: String,
    /// `live`, `expired`, `revoked` or `used up`, at the server's clock.
    pub state: String,
}

/// `POST /v1/join`: a node enrols with a join token and a certificate
/// request for its own key.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinRequest {
    pub token_id: String,
    pub secret: String,
    /// The node's name: the identity its certificate will carry.
    pub node: String,
    /// A PKCS#10 request (PEM) for `cca://node/{node}` and the node's
    /// name and addresses.
    pub csr_pem: String,
}

impl std::fmt::Debug for JoinRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinRequest")
            .field("token_id", &self.token_id)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// A node certificate, issued at join or renewal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCertificate {
    /// The node's certificate (PEM).
    pub certificate_pem: String,
    /// The cluster CA's certificate (PEM).
    pub ca_pem: String,
}

/// `POST /v1/agent/nodes/{node}/certificate`: a node renews its
/// certificate over mTLS with a request for a new key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewRequest {
    pub csr_pem: String,
}

/// `POST /v1/agent/nodes/{node}/gates/{gate}/certificate`: a gate node
/// asks for a certificate for a `tls { self_signed }` gate, for a key it
/// made and keeps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateCertificateRequest {
    /// A PKCS#10 request (PEM) naming exactly the gate's hosts.
    pub csr_pem: String,
}

/// A gate's certificate, signed by the cluster CA.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateCertificate {
    /// The gate's certificate (PEM): its hosts, server usage only.
    pub certificate_pem: String,
    /// The certificate of the CA that signed it (PEM).
    pub ca_pem: String,
}

/// `GET /v1/agent/nodes/{node}/gates/{gate}/tls`: a `tls { cert key }`
/// gate's certificate chain and key, the values of its two secrets.
/// `Debug` hides the key.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateTls {
    /// Changes whenever either secret is set again; also the answer's
    /// `ETag`, to send back as `If-None-Match`.
    pub version: String,
    /// The `cert` secret's value: the chain, leaf first (PEM).
    pub chain_pem: String,
    /// The `key` secret's value (PEM).
    pub key_pem: String,
}

impl std::fmt::Debug for GateTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GateTls")
            .field("version", &self.version)
            .field("chain_pem", &self.chain_pem)
            .field("key_pem", &"[hidden]")
            .finish()
    }
}

/// `POST /v1/agent/nodes/{node}/gate-activity`: per service, when the
/// gate node last forwarded a request to it (ms since the epoch, the
/// node's clock). Sent at most every 10 s and only when something changed;
/// the server keeps the later time per service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateActivityReport {
    pub services: BTreeMap<String, Millis>,
}

/// The answer to a gate node's activity report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateActivityReply {
    /// The revision that recorded it; `None` when it changed nothing.
    pub revision: Option<Revision>,
}

/// `POST /v1/agent/nodes/{node}/services/{service}/wake` (202): the
/// service is awake from `revision` on; its instances start through the
/// scheduler as for any service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeReply {
    pub service: String,
    /// True when this call woke it; false when it was awake already.
    pub woke: bool,
    /// The revision that woke it (`None` when it was awake already).
    pub revision: Option<Revision>,
}

/// `POST /v1/revocations`: take back certificates before they expire —
/// exactly one of one certificate (`serial`), every certificate of a node,
/// or of a user, issued until now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokeRequest {
    #[serde(default)]
    pub serial: Option<String>,
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub reason: String,
}

/// One revocation as `cca cert revocations` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevocationEntry {
    pub id: String,
    #[serde(flatten)]
    pub record: cca_model::access::RevocationRecord,
}

/// `PUT /v1/users/{name}`: make or change a user.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRequest {
    pub roles: Vec<String>,
    #[serde(default)]
    pub tenant: Option<String>,
}

/// A role as `cca role ls` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleInfo {
    #[serde(flatten)]
    pub role: cca_model::access::RoleRecord,
    /// Built into the server (not stored, not changeable).
    pub builtin: bool,
}

/// `POST /v1/users/{name}/tokens`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserTokenRequest {
    /// Seconds; the server's default (8 h) if absent.
    #[serde(default)]
    pub ttl_secs: Option<u64>,
}

/// A user token: shown once.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuedToken {
    pub token: String,
    /// Its id, to revoke it by.
    pub jti: String,
    /// Seconds since 1970.
    pub expires_at: u64,
}

impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedToken")
            .field("jti", &self.jti)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// `POST /v1/logout`: the token presented is revoked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedOut {
    /// The revoked token's id; `None` when the caller presented none.
    pub revoked: Option<String>,
}

/// `GET /v1/gates/{name}` (`cca describe gate`): the gate, and each gate
/// node's view of its targets and their backends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateDetail {
    pub spec: cca_model::spec::GateSpec,
    pub nodes: Vec<GateNodeHealth>,
}

/// One gate node's answer for a gate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateNodeHealth {
    pub node: String,
    pub listen: GateListen,
    /// Empty when the node did not answer (`error` says why).
    pub targets: Vec<cca_model::net::GateTargetHealth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A node's row of `cca top nodes` (`GET /v1/top/nodes`): what it used
/// over its agent's last period against what it has and what its
/// instances requested.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTop {
    pub node: String,
    /// `ready` or `unreachable`.
    pub status: String,
    /// What the node has, and what the instances placed on it requested.
    pub cpu: Cpu,
    pub memory: Memory,
    pub cpu_requested: Cpu,
    pub memory_requested: Memory,
    /// The node's last usage report; `None` until its agent sent one.
    pub usage: Option<ReportedUsage>,
}

/// An instance's row of `cca top workloads` (`GET /v1/top/workloads`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceTop {
    pub instance: String,
    pub service: String,
    pub node: String,
    /// What it requested (also its limit); 0: nothing.
    pub cpu_request: Cpu,
    pub memory_request: Memory,
    /// From its node's last usage report; `None` when that report does not
    /// list it (not reported yet, or not running).
    pub usage: Option<ReportedUsage>,
}

/// One period's usage as an agent reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportedUsage {
    /// When the period ended, and how long it was.
    pub at: Millis,
    pub period_ms: u64,
    #[serde(flatten)]
    pub summary: cca_model::usage::UsageSummary,
}

/// `GET /v1/nodes/{node}/inspect` (`cca node-inspect NODE`): what the
/// node's agent says of itself, and where its cache and the store differ.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeInspection {
    pub agent: AgentInspection,
    /// The store's revision when the API server answered.
    pub store_revision: Revision,
    /// Instances the store places on the node that the agent's cache does
    /// not hold, and cached ones the store does not place there.
    pub store_drift: Vec<Drift>,
}

/// An agent's `GET /v1/inspect`: its desired-state cache, what its runtime
/// runs, the drift between the two, and how its reports fare.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentInspection {
    pub node: String,
    /// When the agent answered.
    pub at: Millis,
    /// Whether its registration and heartbeats get through now.
    pub connected: bool,
    pub cache: CacheInspection,
    /// The assignments it holds, by id.
    pub desired: Vec<DesiredInstance>,
    /// What its runtime has, by id (init steps included).
    pub runtime: Vec<RuntimeInstance>,
    /// Instances of a store it no longer follows, kept for adoption.
    pub unclaimed: Vec<UnclaimedRunView>,
    /// Where the runtime differs from the cache, and what the agent does
    /// about it.
    pub drift: Vec<Drift>,
    pub reports: ReportLog,
}

/// The agent's desired-state cache: where its assignment stream stands.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheInspection {
    /// The revision of the last assignment line applied.
    pub revision: Revision,
    /// Whether it holds a full snapshot (only then are orphans removed).
    pub known: bool,
    /// The store and stream epoch it follows.
    pub origin: StreamOrigin,
}

/// One assignment of the cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredInstance {
    pub id: String,
    pub service: String,
    pub spec_hash: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host_ports: BTreeMap<String, u16>,
}

/// One instance as the node's runtime has it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeInstance {
    pub id: String,
    /// `created`, `running` or `exited`.
    pub state: String,
    pub pid: Option<u32>,
    pub started_at: Option<Millis>,
    /// How its last run ended, when it exited.
    pub exit: Option<String>,
    /// Found running by this agent, started by an earlier one.
    pub adopted: bool,
}

/// An unclaimed instance the agent keeps while it awaits adoption.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnclaimedRunView {
    pub id: String,
    pub service: String,
    /// When the resync found it unclaimed.
    pub since: Millis,
}

/// One difference between two views of a node, and what comes of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drift {
    pub id: String,
    pub problem: String,
}

/// How the agent's reports to the API server fare.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportLog {
    /// When a report last got through.
    pub last_sent_at: Option<Millis>,
    /// The last failure, and when, if any came after the last success.
    pub last_error: Option<String>,
    pub last_error_at: Option<Millis>,
    /// Instance statuses it sent since it started.
    pub statuses_sent: u64,
    /// The statuses of its last tick, as it reports them.
    pub last_tick: Vec<InstanceStatus>,
}
