//! [`View`]: an immutable snapshot of the cluster's facts, typed and keyed
//! for controllers and the API. Built and kept current by the
//! [`Cache`](crate::cache::Cache); cloning it is O(1) (persistent maps), so
//! every reconcile and every API request gets its own consistent snapshot.

use std::sync::Arc;

use cca_model::cluster::{
    Endpoints, Heartbeat, Instance, InstanceStatus, NodeControl, NodeInfo, NodeStatus, Unplaced,
};
use cca_model::keys;
use cca_model::spec::ServiceSpec;
use cca_store::Revision;
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

/// Everything controllers and the API read, at one store revision.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// Every change up to and including this revision is reflected.
    pub revision: Revision,
    /// `desired/service/{svc}`.
    pub services: OrdMap<String, Versioned<ServiceSpec>>,
    /// `desired/service/{svc}/tag/{k}`: service → tag → value.
    pub tags: OrdMap<String, OrdMap<String, String>>,
    /// `desired/node/{node}`.
    pub node_controls: OrdMap<String, Versioned<NodeControl>>,
    /// `observed/node/{node}`.
    pub nodes: OrdMap<String, Versioned<NodeInfo>>,
    /// `observed/heartbeat/{node}`: present while the node's lease lives.
    pub heartbeats: OrdMap<String, Versioned<Heartbeat>>,
    /// `derived/node/{node}`.
    pub node_statuses: OrdMap<String, Versioned<NodeStatus>>,
    /// `derived/instance/{svc}/{id}`, by instance id.
    pub instances: OrdMap<String, Versioned<Instance>>,
    /// `observed/instance/{id}`, by instance id.
    pub statuses: OrdMap<String, Versioned<InstanceStatus>>,
    /// `derived/unplaced/{svc}`, by service.
    pub unplaced: OrdMap<String, Versioned<Unplaced>>,
    /// `derived/endpoint/{svc}/{port}`, by `svc/port`.
    pub endpoints: OrdMap<String, Versioned<Endpoints>>,
    /// Facts that did not decode, by key, with the reason; shown by the API
    /// so a hand-edited fact is visible instead of silently ignored.
    pub invalid: OrdMap<String, String>,
}

/// What a store key means to the view.
enum Slot<'a> {
    Service(&'a str),
    Tag(&'a str, &'a str),
    NodeControl(&'a str),
    Node(&'a str),
    Heartbeat(&'a str),
    NodeStatus(&'a str),
    Instance(&'a str),
    Status(&'a str),
    Unplaced(&'a str),
    Endpoint(&'a str),
}

fn slot(key: &str) -> Option<Slot<'_>> {
    let single = |prefix: &str| key.strip_prefix(prefix).filter(|rest| !rest.contains('/'));
    if let Some(rest) = key.strip_prefix(keys::DESIRED_SERVICES) {
        return match rest.split_once('/') {
            None => Some(Slot::Service(rest)),
            Some((service, tail)) => tail.strip_prefix("tag/").map(|tag| Slot::Tag(service, tag)),
        };
    }
    if let Some(rest) = key.strip_prefix(keys::DERIVED_INSTANCES) {
        return rest.split_once('/').map(|(_, id)| Slot::Instance(id));
    }
    if let Some(rest) = key.strip_prefix(keys::DERIVED_ENDPOINTS) {
        return Some(Slot::Endpoint(rest));
    }
    if let Some(name) = single(keys::DESIRED_NODES) {
        return Some(Slot::NodeControl(name));
    }
    if let Some(name) = single(keys::OBSERVED_NODES) {
        return Some(Slot::Node(name));
    }
    if let Some(name) = single(keys::OBSERVED_HEARTBEATS) {
        return Some(Slot::Heartbeat(name));
    }
    if let Some(name) = single(keys::DERIVED_NODES) {
        return Some(Slot::NodeStatus(name));
    }
    if let Some(id) = single(keys::OBSERVED_INSTANCES) {
        return Some(Slot::Status(id));
    }
    single(keys::DERIVED_UNPLACED).map(Slot::Unplaced)
}

impl View {
    /// Applies one put. Older writes than what the view holds are ignored,
    /// which makes replaying overlapping history harmless.
    pub fn put(&mut self, key: &str, value: &[u8], mod_revision: Revision) {
        let Some(slot) = slot(key) else { return };
        let result = match slot {
            Slot::Service(name) => upsert(&mut self.services, name, value, mod_revision),
            Slot::Tag(service, tag) => match serde_json::from_slice::<String>(value) {
                Ok(text) => {
                    self.tags
                        .entry(service.to_owned())
                        .or_default()
                        .insert(tag.to_owned(), text);
                    Ok(())
                }
                Err(err) => Err(err.to_string()),
            },
            Slot::NodeControl(name) => upsert(&mut self.node_controls, name, value, mod_revision),
            Slot::Node(name) => upsert(&mut self.nodes, name, value, mod_revision),
            Slot::Heartbeat(name) => upsert(&mut self.heartbeats, name, value, mod_revision),
            Slot::NodeStatus(name) => upsert(&mut self.node_statuses, name, value, mod_revision),
            Slot::Instance(id) => upsert(&mut self.instances, id, value, mod_revision),
            Slot::Status(id) => upsert(&mut self.statuses, id, value, mod_revision),
            Slot::Unplaced(service) => upsert(&mut self.unplaced, service, value, mod_revision),
            Slot::Endpoint(name) => upsert(&mut self.endpoints, name, value, mod_revision),
        };
        match result {
            Ok(()) => {
                self.invalid.remove(key);
            }
            Err(reason) => {
                tracing::warn!(key, %reason, "fact does not decode; ignoring it");
                self.invalid.insert(key.to_owned(), reason);
            }
        }
    }

    /// Applies one delete at `revision`.
    pub fn delete(&mut self, key: &str, revision: Revision) {
        self.invalid.remove(key);
        let Some(slot) = slot(key) else { return };
        match slot {
            Slot::Service(name) => remove(&mut self.services, name, revision),
            Slot::Tag(service, tag) => {
                if let Some(tags) = self.tags.get_mut(service) {
                    tags.remove(tag);
                    if tags.is_empty() {
                        self.tags.remove(service);
                    }
                }
            }
            Slot::NodeControl(name) => remove(&mut self.node_controls, name, revision),
            Slot::Node(name) => remove(&mut self.nodes, name, revision),
            Slot::Heartbeat(name) => remove(&mut self.heartbeats, name, revision),
            Slot::NodeStatus(name) => remove(&mut self.node_statuses, name, revision),
            Slot::Instance(id) => remove(&mut self.instances, id, revision),
            Slot::Status(id) => remove(&mut self.statuses, id, revision),
            Slot::Unplaced(service) => remove(&mut self.unplaced, service, revision),
            Slot::Endpoint(name) => remove(&mut self.endpoints, name, revision),
        }
    }

    /// The mod revision the view holds for `key` (0 when absent): what a
    /// compare-and-swap on that key must expect.
    pub fn mod_revision(&self, key: &str) -> Revision {
        let Some(slot) = slot(key) else { return 0 };
        let revision = |found: Option<Revision>| found.unwrap_or(0);
        match slot {
            Slot::Service(name) => revision(self.services.get(name).map(|v| v.mod_revision)),
            Slot::Tag(..) => 0,
            Slot::NodeControl(name) => {
                revision(self.node_controls.get(name).map(|v| v.mod_revision))
            }
            Slot::Node(name) => revision(self.nodes.get(name).map(|v| v.mod_revision)),
            Slot::Heartbeat(name) => revision(self.heartbeats.get(name).map(|v| v.mod_revision)),
            Slot::NodeStatus(name) => {
                revision(self.node_statuses.get(name).map(|v| v.mod_revision))
            }
            Slot::Instance(id) => revision(self.instances.get(id).map(|v| v.mod_revision)),
            Slot::Status(id) => revision(self.statuses.get(id).map(|v| v.mod_revision)),
            Slot::Unplaced(service) => revision(self.unplaced.get(service).map(|v| v.mod_revision)),
            Slot::Endpoint(name) => revision(self.endpoints.get(name).map(|v| v.mod_revision)),
        }
    }

    /// True when the view tracks `key` (so [`mod_revision`](Self::mod_revision) is meaningful).
    pub fn tracks(key: &str) -> bool {
        slot(key).is_some_and(|slot| !matches!(slot, Slot::Tag(..)))
    }
}

fn upsert<T: DeserializeOwned>(
    map: &mut OrdMap<String, Versioned<T>>,
    name: &str,
    value: &[u8],
    mod_revision: Revision,
) -> Result<(), String> {
    if map
        .get(name)
        .is_some_and(|held| held.mod_revision >= mod_revision)
    {
        return Ok(());
    }
    match serde_json::from_slice::<T>(value) {
        Ok(decoded) => {
            map.insert(
                name.to_owned(),
                Versioned {
                    value: Arc::new(decoded),
                    mod_revision,
                },
            );
            Ok(())
        }
        Err(err) => {
            map.remove(name);
            Err(err.to_string())
        }
    }
}

fn remove<T>(map: &mut OrdMap<String, Versioned<T>>, name: &str, revision: Revision) {
    if map
        .get(name)
        .is_some_and(|held| held.mod_revision < revision)
    {
        map.remove(name);
    }
}
