//! [`View`]: an immutable snapshot of the cluster's facts, one typed table
//! per kind of the [fact table](cca_model::facts), at one store revision.
//! Built and kept current by the [`Cache`](crate::cache::Cache); cloning it
//! is O(1) (persistent maps), so every reconcile and every API request gets
//! its own consistent snapshot. Applying a put or a delete says what it
//! changed ([`FactChange`]: the decoded value before and after), which is
//! what the cache broadcasts to indexes and controllers.

use std::collections::BTreeMap;
use std::sync::Arc;

use cca_model::access::{RevocationRecord, RoleRecord, UserRecord};
use cca_model::autoscale::Autoscaled;
use cca_model::cluster::{
    ApplyChunk, ApplyCommit, DesiredGeneration, Disruption, Endpoints, Heartbeat, HeldPorts,
    Instance, InstanceState, InstanceStatus, NodeControl, NodeInfo, NodeStatus, ReplacementResume,
    ServiceMeta, StagedWrite, Unplaced,
};
use cca_model::net::{NodeSubnet, ServiceVip};
use cca_model::recovery::{StoreIdentity, Unclaimed};
use cca_model::rollout::{Rollout, RolloutControl};
use cca_model::scale::{GateActivity, ScaleState};
use cca_model::spec::{
    ConnectionSpec, GateSpec, NetworkPolicy, SealedSecret, SecretGrant, SecretSpec, ServiceSpec,
    ServiceVersion, spec_hash,
};
use cca_model::usage::NodeUsage;
use cca_model::vertical::VerticalScaled;
use cca_model::{Key, Kind, Revision, Value};
use imbl::OrdMap;
use serde::de::DeserializeOwned;

/// A fact's decoded value and the revision it was last written at.
#[derive(Debug)]
pub struct Versioned<T> {
    pub value: Arc<T>,
    pub mod_revision: Revision,
}

impl<T> Clone for Versioned<T> {
    fn clone(&self) -> Self {
        Self {
            value: Arc::clone(&self.value),
            mod_revision: self.mod_revision,
        }
    }
}

impl<T> std::ops::Deref for Versioned<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

/// The facts of one kind whose key has one name, by that name.
pub type Table<T> = OrdMap<String, Versioned<T>>;

/// The facts of one kind whose key has two names, by the first, then the
/// second (a service's tags, grants and endpoints).
pub type Grouped<T> = OrdMap<String, Table<T>>;

/// Everything controllers and the API read, at one store revision. Every
/// kind of fact has its table here except the event log (read by range,
/// pruned by age) and the leader record (the election's own).
#[derive(Clone, Debug, Default)]
pub struct View {
    /// Every change up to and including this revision is reflected.
    pub revision: Revision,
    pub services: Table<ServiceSpec>,
    /// Service → tag → value.
    pub tags: Grouped<String>,
    /// Service → secret → why the service may read it.
    pub grants: Grouped<SecretGrant>,
    /// Service → spec hash → that version's spec (what an instance placed
    /// with that hash runs).
    pub versions: Grouped<ServiceVersion>,
    pub service_meta: Table<ServiceMeta>,
    pub gates: Table<GateSpec>,
    pub connections: Table<ConnectionSpec>,
    pub secret_declarations: Table<SecretSpec>,
    /// Sealed values: never opened by the view.
    pub secrets: Table<SealedSecret>,
    pub network_policies: Table<NetworkPolicy>,
    pub node_controls: Table<NodeControl>,
    /// Revoked certificates by record id: the API's TLS refuses them.
    pub revocations: Table<RevocationRecord>,
    /// Users by name: what each may do (`auth`).
    pub users: Table<UserRecord>,
    /// Custom roles by name.
    pub roles: Table<RoleRecord>,
    /// Placements by instance id (ids are unique across services).
    pub instances: Table<Instance>,
    /// The same placements by service, then instance id: what a
    /// controller looking at a few services reads instead of every
    /// instance. Kept by the view with `instances`; never written apart.
    pub service_instances: Grouped<Instance>,
    /// Unplaced demand by service.
    pub unplaced: Table<Unplaced>,
    pub node_statuses: Table<NodeStatus>,
    /// Whether lost-node replacement is paused (the node controller's).
    pub disruption: Option<Versioned<Disruption>>,
    /// The operator's last word ending such a pause.
    pub replacement_resume: Option<Versioned<ReplacementResume>>,
    /// Service → port name → ready backends.
    pub endpoints: Grouped<Endpoints>,
    /// Whether each scale-to-zero service sleeps, by service (absent:
    /// awake).
    pub scale: Table<ScaleState>,
    /// The version each service is rolled to, and why, by service.
    pub rollouts: Table<Rollout>,
    /// Operators' pauses and undos of rollouts, by service.
    pub rollout_controls: Table<RolloutControl>,
    /// The replicas each autoscaled service runs at, by service.
    pub autoscaled: Table<Autoscaled>,
    /// The usage window and recommended sizes of each service with
    /// vertical autoscaling, by service.
    pub vertical: Table<VerticalScaled>,
    /// Node subnets by node (held, released or wanted).
    pub subnets: Table<NodeSubnet>,
    /// Service VIPs by service (held, released or wanted).
    pub vips: Table<ServiceVip>,
    pub nodes: Table<NodeInfo>,
    /// Present while the node's lease lives.
    pub heartbeats: Table<Heartbeat>,
    /// Reported instance states by instance id.
    pub statuses: Table<InstanceStatus>,
    /// Each gate node's last request per service, by node.
    pub gate_activity: Table<GateActivity>,
    /// Host ports held on each node by something outside the cluster.
    pub held_ports: Table<HeldPorts>,
    /// Each node's last usage report, by node.
    pub usage: Table<NodeUsage>,
    /// Instances each node runs that the store does not place, by node.
    pub unclaimed: Table<Unclaimed>,
    /// The store's identity (`None` until the first server made it).
    pub store_identity: Option<Versioned<StoreIdentity>>,
    pub desired_generation: Option<Versioned<DesiredGeneration>>,
    /// Staged applies' chunks, by apply, then chunk: invisible until
    /// `applying` names their apply.
    pub staged: Grouped<ApplyChunk>,
    /// The committed staged apply still being copied into place: its
    /// chunks are overlaid on the desired facts at its revision, so the
    /// view shows the whole new program from its commit on.
    pub applying: Option<Versioned<ApplyCommit>>,
    /// Facts that did not decode, by key, with the reason; shown by the API
    /// so a hand-edited fact is visible instead of silently ignored.
    pub invalid: OrdMap<String, String>,
}

/// What one put or delete did: the fact's decoded value before and after
/// (`None` when absent, or when it does not decode).
#[derive(Clone, Debug, PartialEq)]
pub struct FactChange {
    pub key: Key,
    pub old: Option<Value>,
    pub new: Option<Value>,
}

impl FactChange {
    pub fn kind(&self) -> Kind {
        self.key.kind()
    }
}

/// One table operation's outcome: the value it replaced or removed and the
/// value it holds now; `None` when the operation was older than the table.
type Outcome = Option<(Option<Value>, Option<Value>)>;

impl View {
    /// Applies one put and says what changed. Writes older than what the
    /// view holds are ignored (nothing changed), which makes replaying
    /// overlapping history harmless; keys outside the fact table are
    /// ignored too. A staged apply's commit record changes every fact the
    /// apply writes, at once.
    pub fn put(&mut self, key: &str, bytes: &[u8], revision: Revision) -> Vec<FactChange> {
        let mut changes = Vec::new();
        self.put_into(key, bytes, revision, &mut changes);
        changes
    }

    /// Applies one delete at `revision` and says what changed.
    pub fn delete(&mut self, key: &str, revision: Revision) -> Vec<FactChange> {
        let mut changes = Vec::new();
        self.delete_into(key, revision, &mut changes);
        changes
    }

    /// [`put`](Self::put), adding the changes to `changes`.
    pub fn put_into(
        &mut self,
        key: &str,
        bytes: &[u8],
        revision: Revision,
        changes: &mut Vec<FactChange>,
    ) {
        let Some(parsed) = Key::parse(key) else {
            return;
        };
        let outcome = self.put_typed(&parsed, bytes, revision);
        match &outcome {
            Ok(_) => {
                self.invalid.remove(key);
            }
            Err(reason) => {
                tracing::warn!(key, %reason, "fact does not decode; ignoring it");
                self.invalid.insert(key.to_owned(), reason.clone());
            }
        }
        let (old, new) = match outcome {
            Ok(Some(outcome)) => outcome,
            Ok(None) => return,
            // The fact is unusable: for typed readers it is gone.
            Err(_) => match self.remove_typed(&parsed, revision) {
                Some((old, _)) => (old, None),
                None => return,
            },
        };
        let staged = match &parsed {
            Key::ApplyCommit {} => self.applying.as_ref().map(|held| held.apply.clone()),
            Key::ApplyChunk { apply, chunk } if self.is_applying(apply) => {
                self.overlay_chunk(apply, chunk, revision, changes);
                None
            }
            _ => None,
        };
        push_change(changes, parsed, old, new);
        if let Some(apply) = staged {
            self.overlay(&apply, revision, changes);
        }
    }

    /// [`delete`](Self::delete), adding the changes to `changes`.
    pub fn delete_into(&mut self, key: &str, revision: Revision, changes: &mut Vec<FactChange>) {
        self.invalid.remove(key);
        let Some(parsed) = Key::parse(key) else {
            return;
        };
        if let Some((old, new)) = self.remove_typed(&parsed, revision) {
            push_change(changes, parsed, old, new);
        }
    }

    fn is_applying(&self, apply: &str) -> bool {
        self.applying
            .as_ref()
            .is_some_and(|held| held.apply == apply)
    }

    /// Applies every staged chunk of `apply` (in chunk order) at `revision`.
    fn overlay(&mut self, apply: &str, revision: Revision, changes: &mut Vec<FactChange>) {
        let chunks: Vec<String> = self
            .staged
            .get(apply)
            .map(|chunks| chunks.keys().cloned().collect())
            .unwrap_or_default();
        for chunk in chunks {
            self.overlay_chunk(apply, &chunk, revision, changes);
        }
    }

    fn overlay_chunk(
        &mut self,
        apply: &str,
        chunk: &str,
        revision: Revision,
        changes: &mut Vec<FactChange>,
    ) {
        let Some(held) = self.staged.get(apply).and_then(|chunks| chunks.get(chunk)) else {
            return;
        };
        let writes = Arc::clone(&held.value);
        for write in &writes.writes {
            match write {
                StagedWrite::Put { key, value } => {
                    self.put_into(key, value.as_bytes(), revision, changes);
                }
                StagedWrite::Delete { key } => self.delete_into(key, revision, changes),
            }
        }
    }

    /// The mod revision the view holds for `key` (0 when absent): what a
    /// compare-and-swap on that key must expect.
    pub fn mod_revision(&self, key: &str) -> Revision {
        let Some(key) = Key::parse(key) else { return 0 };
        self.held_revision(&key).unwrap_or(0)
    }

    /// True when the view holds facts of `key`'s kind (so
    /// [`mod_revision`](Self::mod_revision) is meaningful).
    pub fn tracks(key: &str) -> bool {
        Key::parse(key).is_some_and(|key| cached(key.kind()))
    }

    fn put_typed(&mut self, key: &Key, bytes: &[u8], rev: Revision) -> Result<Outcome, String> {
        Ok(match key {
            Key::Service { service } => {
                put(&mut self.services, service, bytes, rev, Value::Service)?
            }
            Key::ServiceTag { service, tag } => {
                put_grouped(&mut self.tags, service, tag, bytes, rev, Value::ServiceTag)?
            }
            Key::ServiceGrant { service, secret } => put_grouped(
                &mut self.grants,
                service,
                secret,
                bytes,
                rev,
                Value::ServiceGrant,
            )?,
            Key::ServiceVersion { service, version } => put_grouped(
                &mut self.versions,
                service,
                version,
                bytes,
                rev,
                Value::ServiceVersion,
            )?,
            Key::ServiceMeta { service } => put(
                &mut self.service_meta,
                service,
                bytes,
                rev,
                Value::ServiceMeta,
            )?,
            Key::Gate { gate } => put(&mut self.gates, gate, bytes, rev, Value::Gate)?,
            Key::Connection { connection } => put(
                &mut self.connections,
                connection,
                bytes,
                rev,
                Value::Connection,
            )?,
            Key::SecretDeclaration { secret } => put(
                &mut self.secret_declarations,
                secret,
                bytes,
                rev,
                Value::SecretDeclaration,
            )?,
            Key::Secret { secret } => put(&mut self.secrets, secret, bytes, rev, Value::Secret)?,
            Key::NetworkPolicy { policy } => put(
                &mut self.network_policies,
                policy,
                bytes,
                rev,
                Value::NetworkPolicy,
            )?,
            Key::NodeControl { node } => put(
                &mut self.node_controls,
                node,
                bytes,
                rev,
                Value::NodeControl,
            )?,
            Key::Revocation { id } => {
                put(&mut self.revocations, id, bytes, rev, Value::Revocation)?
            }
            Key::User { name } => put(&mut self.users, name, bytes, rev, Value::User)?,
            Key::Role { name } => put(&mut self.roles, name, bytes, rev, Value::Role)?,
            Key::ReplacementResume {} => put_single(
                &mut self.replacement_resume,
                bytes,
                rev,
                Value::ReplacementResume,
            )?,
            Key::Disruption {} => put_single(&mut self.disruption, bytes, rev, Value::Disruption)?,
            Key::Instance { service, id } => {
                let outcome = put(&mut self.instances, id, bytes, rev, Value::Instance)?;
                self.index_instance(service, id);
                outcome
            }
            Key::Unplaced { service } => {
                put(&mut self.unplaced, service, bytes, rev, Value::Unplaced)?
            }
            Key::NodeStatus { node } => {
                put(&mut self.node_statuses, node, bytes, rev, Value::NodeStatus)?
            }
            Key::Endpoint { service, port } => put_grouped(
                &mut self.endpoints,
                service,
                port,
                bytes,
                rev,
                Value::Endpoint,
            )?,
            Key::Scale { service } => put(&mut self.scale, service, bytes, rev, Value::Scale)?,
            Key::Rollout { service } => {
                put(&mut self.rollouts, service, bytes, rev, Value::Rollout)?
            }
            Key::Vertical { service } => {
                put(&mut self.vertical, service, bytes, rev, Value::Vertical)?
            }
            Key::Autoscale { service } => {
                put(&mut self.autoscaled, service, bytes, rev, Value::Autoscale)?
            }
            Key::RolloutControl { service } => put(
                &mut self.rollout_controls,
                service,
                bytes,
                rev,
                Value::RolloutControl,
            )?,
            Key::Subnet { node } => put(&mut self.subnets, node, bytes, rev, Value::Subnet)?,
            Key::Vip { service } => put(&mut self.vips, service, bytes, rev, Value::Vip)?,
            Key::Node { node } => put(&mut self.nodes, node, bytes, rev, Value::Node)?,
            Key::Heartbeat { node } => {
                put(&mut self.heartbeats, node, bytes, rev, Value::Heartbeat)?
            }
            Key::InstanceStatus { id } => {
                put(&mut self.statuses, id, bytes, rev, Value::InstanceStatus)?
            }
            Key::GateActivity { node } => put(
                &mut self.gate_activity,
                node,
                bytes,
                rev,
                Value::GateActivity,
            )?,
            Key::HeldPorts { node } => {
                put(&mut self.held_ports, node, bytes, rev, Value::HeldPorts)?
            }
            Key::Usage { node } => put(&mut self.usage, node, bytes, rev, Value::Usage)?,
            Key::Unclaimed { node } => {
                put(&mut self.unclaimed, node, bytes, rev, Value::Unclaimed)?
            }
            Key::StoreIdentity {} => {
                put_single(&mut self.store_identity, bytes, rev, Value::StoreIdentity)?
            }
            Key::DesiredGeneration {} => put_single(
                &mut self.desired_generation,
                bytes,
                rev,
                Value::DesiredGeneration,
            )?,
            Key::ApplyChunk { apply, chunk } => put_grouped(
                &mut self.staged,
                apply,
                chunk,
                bytes,
                rev,
                Value::ApplyChunk,
            )?,
            Key::ApplyCommit {} => put_single(&mut self.applying, bytes, rev, Value::ApplyCommit)?,
            Key::Event { .. }
            | Key::Audit { .. }
            | Key::JoinToken { .. }
            | Key::Leader {}
            | Key::FlowHashSeed {} => {
                let value = Value::decode(key.kind(), bytes).map_err(|err| err.to_string())?;
                Some((None, Some(value)))
            }
        })
    }

    fn remove_typed(&mut self, key: &Key, rev: Revision) -> Outcome {
        match key {
            Key::Service { service } => remove(&mut self.services, service, rev, Value::Service),
            Key::ServiceTag { service, tag } => {
                remove_grouped(&mut self.tags, service, tag, rev, Value::ServiceTag)
            }
            Key::ServiceGrant { service, secret } => {
                remove_grouped(&mut self.grants, service, secret, rev, Value::ServiceGrant)
            }
            Key::ServiceVersion { service, version } => remove_grouped(
                &mut self.versions,
                service,
                version,
                rev,
                Value::ServiceVersion,
            ),
            Key::ServiceMeta { service } => {
                remove(&mut self.service_meta, service, rev, Value::ServiceMeta)
            }
            Key::Gate { gate } => remove(&mut self.gates, gate, rev, Value::Gate),
            Key::Connection { connection } => {
                remove(&mut self.connections, connection, rev, Value::Connection)
            }
            Key::SecretDeclaration { secret } => remove(
                &mut self.secret_declarations,
                secret,
                rev,
                Value::SecretDeclaration,
            ),
            Key::Secret { secret } => remove(&mut self.secrets, secret, rev, Value::Secret),
            Key::NetworkPolicy { policy } => remove(
                &mut self.network_policies,
                policy,
                rev,
                Value::NetworkPolicy,
            ),
            Key::NodeControl { node } => {
                remove(&mut self.node_controls, node, rev, Value::NodeControl)
            }
            Key::Revocation { id } => remove(&mut self.revocations, id, rev, Value::Revocation),
            Key::User { name } => remove(&mut self.users, name, rev, Value::User),
            Key::Role { name } => remove(&mut self.roles, name, rev, Value::Role),
            Key::ReplacementResume {} => {
                remove_single(&mut self.replacement_resume, rev, Value::ReplacementResume)
            }
            Key::Disruption {} => remove_single(&mut self.disruption, rev, Value::Disruption),
            Key::Instance { service, id } => {
                let outcome = remove(&mut self.instances, id, rev, Value::Instance);
                self.index_instance(service, id);
                outcome
            }
            Key::Unplaced { service } => remove(&mut self.unplaced, service, rev, Value::Unplaced),
            Key::NodeStatus { node } => {
                remove(&mut self.node_statuses, node, rev, Value::NodeStatus)
            }
            Key::Endpoint { service, port } => {
                remove_grouped(&mut self.endpoints, service, port, rev, Value::Endpoint)
            }
            Key::Scale { service } => remove(&mut self.scale, service, rev, Value::Scale),
            Key::Rollout { service } => remove(&mut self.rollouts, service, rev, Value::Rollout),
            Key::Vertical { service } => remove(&mut self.vertical, service, rev, Value::Vertical),
            Key::Autoscale { service } => {
                remove(&mut self.autoscaled, service, rev, Value::Autoscale)
            }
            Key::RolloutControl { service } => remove(
                &mut self.rollout_controls,
                service,
                rev,
                Value::RolloutControl,
            ),
            Key::Subnet { node } => remove(&mut self.subnets, node, rev, Value::Subnet),
            Key::Vip { service } => remove(&mut self.vips, service, rev, Value::Vip),
            Key::Node { node } => remove(&mut self.nodes, node, rev, Value::Node),
            Key::Heartbeat { node } => remove(&mut self.heartbeats, node, rev, Value::Heartbeat),
            Key::InstanceStatus { id } => {
                remove(&mut self.statuses, id, rev, Value::InstanceStatus)
            }
            Key::GateActivity { node } => {
                remove(&mut self.gate_activity, node, rev, Value::GateActivity)
            }
            Key::HeldPorts { node } => remove(&mut self.held_ports, node, rev, Value::HeldPorts),
            Key::Usage { node } => remove(&mut self.usage, node, rev, Value::Usage),
            Key::Unclaimed { node } => remove(&mut self.unclaimed, node, rev, Value::Unclaimed),
            Key::StoreIdentity {} => {
                remove_single(&mut self.store_identity, rev, Value::StoreIdentity)
            }
            Key::DesiredGeneration {} => {
                remove_single(&mut self.desired_generation, rev, Value::DesiredGeneration)
            }
            Key::ApplyChunk { apply, chunk } => {
                remove_grouped(&mut self.staged, apply, chunk, rev, Value::ApplyChunk)
            }
            Key::ApplyCommit {} => remove_single(&mut self.applying, rev, Value::ApplyCommit),
            Key::Event { .. }
            | Key::Audit { .. }
            | Key::JoinToken { .. }
            | Key::Leader {}
            | Key::FlowHashSeed {} => None,
        }
    }

    /// Brings `service_instances` in line with `instances` for one id.
    fn index_instance(&mut self, service: &str, id: &str) {
        match self.instances.get(id) {
            Some(held) => {
                let rows = self
                    .service_instances
                    .entry(service.to_owned())
                    .or_default();
                rows.insert(id.to_owned(), held.clone());
            }
            None => {
                if let Some(rows) = self.service_instances.get_mut(service) {
                    rows.remove(id);
                    if rows.is_empty() {
                        self.service_instances.remove(service);
                    }
                }
            }
        }
    }

    /// True when `service` scales to zero and sleeps now: the scheduler
    /// runs none of its instances. A sleep fact left behind after
    /// `scale_to_zero` was removed counts for nothing.
    pub fn is_asleep(&self, service: &str) -> bool {
        self.services
            .get(service)
            .is_some_and(|spec| spec.scale_to_zero.is_some())
            && self.scale.get(service).is_some_and(|state| state.asleep)
    }

    /// The agent's report for `instance`, if it is about this placement:
    /// from the node it is placed on. Stateless ids are never reused, so
    /// that is enough for them. A stateful id is reused when its ordinal is
    /// recreated, so there a terminal report (failed, stopped) older than
    /// the record is the previous incarnation's and is ignored; only
    /// terminal reports are dated, which keeps agent clock skew from hiding
    /// a running instance.
    pub fn fresh_status(&self, instance: &Instance) -> Option<&InstanceStatus> {
        self.statuses
            .get(&instance.id)
            .map(|status| &*status.value)
            .filter(|status| status.node == instance.node)
            .filter(|status| {
                let terminal =
                    matches!(status.state, InstanceState::Failed | InstanceState::Stopped);
                instance.ordinal.is_none() || !terminal || status.updated_at >= instance.created_at
            })
    }

    /// True when the instance runs and is not reported unhealthy (an agent
    /// reports an instance with a health check running only once it
    /// passed).
    pub fn is_ready(&self, instance: &Instance) -> bool {
        self.fresh_status(instance).is_some_and(|status| {
            status.state == InstanceState::Running && status.healthy != Some(false)
        })
    }

    /// How many of `service`'s instances run each version (spec hash),
    /// stopping ones left out.
    pub fn versions_running(&self, service: &str) -> BTreeMap<&str, usize> {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for instance in self.instances_of(service) {
            if !instance.stopping {
                *counts.entry(instance.spec_hash.as_str()).or_default() += 1;
            }
        }
        counts
    }

    /// The resources vertical autoscaling sizes `service`'s instances to
    /// (`vertical { mode = "auto" }` and a size applied); `None`: their
    /// spec's `resources`.
    pub fn sized_resources(&self, service: &str) -> Option<&cca_model::spec::Resources> {
        let spec = &self.services.get(service)?.value;
        let auto = spec
            .autoscale
            .as_ref()
            .and_then(|autoscale| autoscale.vertical.as_ref())
            .is_some_and(|vertical| vertical.mode == cca_model::spec::VerticalMode::Auto);
        if !auto {
            return None;
        }
        self.vertical.get(service)?.value.applied.as_ref()
    }

    /// The replicas `service` runs at when awake: the autoscaler's count
    /// for a service with horizontal `autoscale` (its spec's `replicas`
    /// within `min..max` until the first decision), else its spec's.
    /// `None` when it has no spec.
    pub fn wanted_replicas(&self, service: &str) -> Option<u32> {
        let spec = &self.services.get(service)?.value;
        let Some(horizontal) = spec
            .autoscale
            .as_ref()
            .and_then(|autoscale| autoscale.horizontal.as_ref())
        else {
            return Some(spec.replicas);
        };
        let decided = self.autoscaled.get(service).map(|held| held.replicas);
        let replicas = decided.unwrap_or(spec.replicas);
        Some(replicas.clamp(horizontal.min, horizontal.max.max(horizontal.min)))
    }

    /// The version (spec hash) the scheduler places for `service`: its
    /// spec's, or what its rollout chose (an undo, an automatic rollback)
    /// while the rollout answers the spec's version, or, while paused, the
    /// version most of its instances run (ties: the smallest hash). Only
    /// a kept version is chosen. `None` when the service has no spec.
    pub fn placed_version(&self, service: &str) -> Option<String> {
        let current = spec_hash(&self.services.get(service)?.value);
        Some(self.placed_version_at(service, current))
    }

    /// [`placed_version`](Self::placed_version) of a service whose spec
    /// is at version `current`.
    pub fn placed_version_at(&self, service: &str, current: String) -> String {
        let paused = self
            .rollout_controls
            .get(service)
            .is_some_and(|control| control.paused);
        let chosen = if paused {
            self.versions_running(service)
                .into_iter()
                .max_by(|(hash_a, a), (hash_b, b)| a.cmp(b).then_with(|| hash_b.cmp(hash_a)))
                .map(|(hash, _)| hash.to_owned())
        } else {
            self.rollouts
                .get(service)
                .filter(|rollout| rollout.requested == current)
                .map(|rollout| rollout.target.clone())
        };
        chosen
            .filter(|hash| *hash == current || self.keeps_version(service, hash))
            .unwrap_or(current)
    }

    /// Whether `version` of `service` is kept (`desired/service/{svc}/
    /// version/{hash}`): instances may be placed with it.
    pub fn keeps_version(&self, service: &str, version: &str) -> bool {
        self.versions
            .get(service)
            .is_some_and(|versions| versions.contains_key(version))
    }

    /// The placements of `service`, by instance id.
    pub fn instances_of(&self, service: &str) -> impl Iterator<Item = &Versioned<Instance>> {
        self.service_instances
            .get(service)
            .into_iter()
            .flat_map(|rows| rows.values())
    }

    fn held_revision(&self, key: &Key) -> Option<Revision> {
        fn at<T>(table: &Table<T>, name: &str) -> Option<Revision> {
            table.get(name).map(|held| held.mod_revision)
        }
        fn at2<T>(table: &Grouped<T>, group: &str, name: &str) -> Option<Revision> {
            table.get(group).and_then(|rows| at(rows, name))
        }
        match key {
            Key::Service { service } => at(&self.services, service),
            Key::ServiceTag { service, tag } => at2(&self.tags, service, tag),
            Key::ServiceGrant { service, secret } => at2(&self.grants, service, secret),
            Key::ServiceVersion { service, version } => at2(&self.versions, service, version),
            Key::ServiceMeta { service } => at(&self.service_meta, service),
            Key::Gate { gate } => at(&self.gates, gate),
            Key::Connection { connection } => at(&self.connections, connection),
            Key::SecretDeclaration { secret } => at(&self.secret_declarations, secret),
            Key::Secret { secret } => at(&self.secrets, secret),
            Key::NetworkPolicy { policy } => at(&self.network_policies, policy),
            Key::NodeControl { node } => at(&self.node_controls, node),
            Key::Revocation { id } => at(&self.revocations, id),
            Key::User { name } => at(&self.users, name),
            Key::Role { name } => at(&self.roles, name),
            Key::ReplacementResume {} => self
                .replacement_resume
                .as_ref()
                .map(|held| held.mod_revision),
            Key::Disruption {} => self.disruption.as_ref().map(|held| held.mod_revision),
            Key::Instance { id, .. } => at(&self.instances, id),
            Key::Unplaced { service } => at(&self.unplaced, service),
            Key::NodeStatus { node } => at(&self.node_statuses, node),
            Key::Endpoint { service, port } => at2(&self.endpoints, service, port),
            Key::Scale { service } => at(&self.scale, service),
            Key::Rollout { service } => at(&self.rollouts, service),
            Key::Autoscale { service } => at(&self.autoscaled, service),
            Key::Vertical { service } => at(&self.vertical, service),
            Key::RolloutControl { service } => at(&self.rollout_controls, service),
            Key::Subnet { node } => at(&self.subnets, node),
            Key::Vip { service } => at(&self.vips, service),
            Key::Node { node } => at(&self.nodes, node),
            Key::Heartbeat { node } => at(&self.heartbeats, node),
            Key::InstanceStatus { id } => at(&self.statuses, id),
            Key::GateActivity { node } => at(&self.gate_activity, node),
            Key::HeldPorts { node } => at(&self.held_ports, node),
            Key::Usage { node } => at(&self.usage, node),
            Key::Unclaimed { node } => at(&self.unclaimed, node),
            Key::StoreIdentity {} => self.store_identity.as_ref().map(|v| v.mod_revision),
            Key::DesiredGeneration {} => self.desired_generation.as_ref().map(|v| v.mod_revision),
            Key::ApplyChunk { apply, chunk } => at2(&self.staged, apply, chunk),
            Key::ApplyCommit {} => self.applying.as_ref().map(|held| held.mod_revision),
            Key::Event { .. }
            | Key::Audit { .. }
            | Key::JoinToken { .. }
            | Key::Leader {}
            | Key::FlowHashSeed {} => None,
        }
    }
}

/// True for the kinds the view keeps a table of.
fn cached(kind: Kind) -> bool {
    // Join tokens are read from the store by the one route that spends
    // them, with the revision its compare-and-swap needs; the flow-hash
    // seed once, at start, by the server that sends it to nodes.
    !matches!(
        kind,
        Kind::Event | Kind::Audit | Kind::JoinToken | Kind::Leader | Kind::FlowHashSeed
    )
}

/// Records a change unless nothing was there before or after.
fn push_change(changes: &mut Vec<FactChange>, key: Key, old: Option<Value>, new: Option<Value>) {
    if old.is_some() || new.is_some() {
        changes.push(FactChange { key, old, new });
    }
}

fn put_single<T: DeserializeOwned>(
    slot: &mut Option<Versioned<T>>,
    bytes: &[u8],
    revision: Revision,
    wrap: fn(Arc<T>) -> Value,
) -> Result<Outcome, String> {
    if slot
        .as_ref()
        .is_some_and(|held| held.mod_revision >= revision)
    {
        return Ok(None);
    }
    let value = Arc::new(serde_json::from_slice::<T>(bytes).map_err(|err| err.to_string())?);
    let old = slot.replace(Versioned {
        value: Arc::clone(&value),
        mod_revision: revision,
    });
    Ok(Some((old.map(|old| wrap(old.value)), Some(wrap(value)))))
}

fn remove_single<T>(
    slot: &mut Option<Versioned<T>>,
    revision: Revision,
    wrap: fn(Arc<T>) -> Value,
) -> Outcome {
    if slot
        .as_ref()
        .is_some_and(|held| held.mod_revision >= revision)
    {
        return None;
    }
    Some((slot.take().map(|old| wrap(old.value)), None))
}

fn put<T: DeserializeOwned>(
    table: &mut Table<T>,
    name: &str,
    bytes: &[u8],
    revision: Revision,
    wrap: fn(Arc<T>) -> Value,
) -> Result<Outcome, String> {
    if table
        .get(name)
        .is_some_and(|held| held.mod_revision >= revision)
    {
        return Ok(None);
    }
    let value = Arc::new(serde_json::from_slice::<T>(bytes).map_err(|err| err.to_string())?);
    let versioned = Versioned {
        value: Arc::clone(&value),
        mod_revision: revision,
    };
    let old = table.insert(name.to_owned(), versioned);
    Ok(Some((old.map(|old| wrap(old.value)), Some(wrap(value)))))
}

fn remove<T>(
    table: &mut Table<T>,
    name: &str,
    revision: Revision,
    wrap: fn(Arc<T>) -> Value,
) -> Outcome {
    if table
        .get(name)
        .is_some_and(|held| held.mod_revision >= revision)
    {
        return None;
    }
    Some((table.remove(name).map(|old| wrap(old.value)), None))
}

fn put_grouped<T: DeserializeOwned>(
    table: &mut Grouped<T>,
    group: &str,
    name: &str,
    bytes: &[u8],
    revision: Revision,
    wrap: fn(Arc<T>) -> Value,
) -> Result<Outcome, String> {
    let rows = table.entry(group.to_owned()).or_default();
    let outcome = put(rows, name, bytes, revision, wrap);
    if rows.is_empty() {
        table.remove(group);
    }
    outcome
}

fn remove_grouped<T>(
    table: &mut Grouped<T>,
    group: &str,
    name: &str,
    revision: Revision,
    wrap: fn(Arc<T>) -> Value,
) -> Outcome {
    let rows = table.get_mut(group)?;
    let outcome = remove(rows, name, revision, wrap);
    if rows.is_empty() {
        table.remove(group);
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(mut changes: Vec<FactChange>) -> FactChange {
        assert_eq!(changes.len(), 1, "{changes:?}");
        changes.remove(0)
    }

    fn status_bytes(since: i64) -> Vec<u8> {
        format!(r#"{{"condition":"ready","since":{since}}}"#).into_bytes()
    }

    #[test]
    fn a_put_says_what_it_replaced() {
        let mut view = View::default();
        let first = one(view.put("derived/node/n1", &status_bytes(1), 5));
        assert_eq!(first.kind(), Kind::NodeStatus);
        assert!(first.old.is_none());
        assert!(matches!(first.new, Some(Value::NodeStatus(_))));
        let second = one(view.put("derived/node/n1", &status_bytes(2), 7));
        assert_eq!(second.old, first.new);
        assert_eq!(view.mod_revision("derived/node/n1"), 7);
        assert!(
            view.put("derived/node/n1", &status_bytes(3), 6).is_empty(),
            "an older write changes nothing"
        );
        let gone = one(view.delete("derived/node/n1", 8));
        assert_eq!(gone.old, second.new);
        assert!(gone.new.is_none());
        assert_eq!(view.mod_revision("derived/node/n1"), 0);
    }

    #[test]
    fn instances_are_indexed_by_service_through_puts_deletes_and_bad_writes() {
        let record = |id: &str, node: &str| {
            let instance = crate::controllers::fixtures::instance(id, "web", node);
            serde_json::to_vec(&instance).expect("encodes")
        };
        let ids = |view: &View| -> Vec<(String, String)> {
            view.instances_of("web")
                .map(|held| (held.id.clone(), held.node.clone()))
                .collect()
        };
        let mut view = View::default();
        view.put("derived/instance/web/web-a", &record("web-a", "n1"), 2);
        view.put("derived/instance/web/web-b", &record("web-b", "n1"), 3);
        view.put("derived/instance/web/web-a", &record("web-a", "n2"), 4);
        assert_eq!(
            ids(&view),
            vec![("web-a".into(), "n2".into()), ("web-b".into(), "n1".into())]
        );
        view.put("derived/instance/web/web-b", b"not json", 5);
        view.delete("derived/instance/web/web-a", 6);
        assert!(ids(&view).is_empty());
        assert!(view.service_instances.is_empty(), "empty groups go");
        assert!(view.instances.is_empty());
    }

    #[test]
    fn grouped_tables_drop_empty_groups() {
        let mut view = View::default();
        view.put("desired/service/web/tag/team", br#""pay""#, 3);
        assert_eq!(
            view.tags
                .get("web")
                .and_then(|tags| tags.get("team"))
                .map(|t| t.as_str()),
            Some("pay")
        );
        assert_eq!(view.mod_revision("desired/service/web/tag/team"), 3);
        view.delete("desired/service/web/tag/team", 4);
        assert!(view.tags.is_empty());
    }

    #[test]
    fn an_undecodable_fact_is_invalid_and_gone_for_readers() {
        let mut view = View::default();
        view.put("derived/node/n1", &status_bytes(1), 5);
        let change = one(view.put("derived/node/n1", b"not json", 6));
        assert!(change.old.is_some() && change.new.is_none());
        assert!(view.node_statuses.is_empty());
        assert!(view.invalid.contains_key("derived/node/n1"));
        view.put("derived/node/n1", &status_bytes(2), 7);
        assert!(view.invalid.is_empty());
    }

    #[test]
    fn keys_outside_the_table_are_ignored() {
        let mut view = View::default();
        assert!(view.put("derived/mystery/x", b"{}", 2).is_empty());
        assert!(!View::tracks("derived/mystery/x"));
        assert!(!View::tracks("events/1-1"));
        assert!(View::tracks("desired/service/web"));
    }

    fn spec(name: &str, replicas: u32) -> String {
        serde_json::json!({
            "name": name, "workload": {"kind": "process", "run": "sleep 1"},
            "replicas": replicas, "ports": [], "env": {}, "resources": {},
            "health": null, "placement": {"colocate": [], "separate": [], "restrict": {}, "spread": []},
            "connections": [], "volumes": [], "init": [],
            "update": {"max_unavailable": 1, "max_surge": 1, "rollback_after": 3},
            "budget": null, "autoscale": null, "stateful": false, "scale_to_zero": null
        })
        .to_string()
    }

    fn chunk(writes: serde_json::Value) -> Vec<u8> {
        serde_json::json!({ "writes": writes })
            .to_string()
            .into_bytes()
    }

    fn services(view: &View) -> Vec<(String, u32)> {
        view.services
            .iter()
            .map(|(name, spec)| (name.clone(), spec.replicas))
            .collect()
    }

    /// The staged apply's chunks, then its commit record at revision 10.
    fn staged_apply(view: &mut View) -> Vec<FactChange> {
        let first = chunk(serde_json::json!([
            {"op": "put", "key": "desired/service/web", "value": spec("web", 2)},
            {"op": "put", "key": "desired/service/db", "value": spec("db", 1)},
        ]));
        let second = chunk(serde_json::json!([
            {"op": "delete", "key": "desired/service/old"},
        ]));
        view.put("meta/apply/a1/chunk/000000", &first, 7);
        view.put("meta/apply/a1/chunk/000001", &second, 8);
        assert_eq!(
            services(view),
            [("old".into(), 1), ("web".into(), 1)],
            "staged chunks are invisible"
        );
        view.put("meta/applying", br#"{"apply":"a1","chunks":2,"at":0}"#, 10)
    }

    #[test]
    fn a_staged_apply_becomes_visible_at_once_at_its_commit() {
        let mut view = View::default();
        view.put("desired/service/web", spec("web", 1).as_bytes(), 2);
        view.put("desired/service/old", spec("old", 1).as_bytes(), 3);
        let changes = staged_apply(&mut view);
        assert_eq!(services(&view), [("db".into(), 1), ("web".into(), 2)]);
        let kinds: Vec<Kind> = changes.iter().map(FactChange::kind).collect();
        assert_eq!(
            kinds,
            [
                Kind::ApplyCommit,
                Kind::Service,
                Kind::Service,
                Kind::Service
            ],
            "one revision carries the whole program"
        );
        assert_eq!(view.mod_revision("desired/service/db"), 10);
        // Copying into place changes nothing a reader sees.
        view.put("desired/service/web", spec("web", 2).as_bytes(), 11);
        view.delete("meta/apply/a1/chunk/000000", 11);
        view.put("desired/service/db", spec("db", 1).as_bytes(), 12);
        view.delete("desired/service/old", 12);
        view.delete("meta/apply/a1/chunk/000001", 12);
        view.delete("meta/applying", 13);
        assert_eq!(services(&view), [("db".into(), 1), ("web".into(), 2)]);
        assert!(view.staged.is_empty() && view.applying.is_none());
    }

    #[test]
    fn a_relisted_view_shows_a_half_copied_apply_whole() {
        // What a list returns midway through the copy: `web` copied (and
        // its chunk gone), `db` and the delete of `old` still staged.
        let mut view = View::default();
        view.put("desired/service/old", spec("old", 1).as_bytes(), 3);
        view.put("desired/service/web", spec("web", 2).as_bytes(), 11);
        let rest = chunk(serde_json::json!([
            {"op": "put", "key": "desired/service/db", "value": spec("db", 1)},
            {"op": "delete", "key": "desired/service/old"},
        ]));
        view.put("meta/apply/a1/chunk/000001", &rest, 8);
        view.put("meta/applying", br#"{"apply":"a1","chunks":2,"at":0}"#, 10);
        assert_eq!(services(&view), [("db".into(), 1), ("web".into(), 2)]);
        // Replaying older history changes nothing.
        view.put("desired/service/web", spec("web", 1).as_bytes(), 2);
        assert_eq!(services(&view), [("db".into(), 1), ("web".into(), 2)]);
    }

    #[test]
    fn chunks_of_an_uncommitted_apply_are_never_overlaid() {
        let mut view = View::default();
        view.put("desired/service/web", spec("web", 1).as_bytes(), 2);
        view.put("desired/service/old", spec("old", 1).as_bytes(), 3);
        let orphan = chunk(serde_json::json!([
            {"op": "put", "key": "desired/service/web", "value": spec("web", 9)},
        ]));
        view.put("meta/apply/orphan/chunk/000000", &orphan, 4);
        staged_apply(&mut view);
        assert_eq!(services(&view), [("db".into(), 1), ("web".into(), 2)]);
    }
}
