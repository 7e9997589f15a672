//! The scheduler's working copy of the cluster for one reconcile: every
//! registered node with what is allocated on it (every instance record,
//! stopping ones included, holds its reservation until the record goes),
//! its host ports (and those its agent reports held by something outside
//! the cluster, which it never hands out), which services run there, and
//! whether it can take new instances. Placements and releases made during the reconcile update it
//! and the [`CapacityIndex`] incrementally, so later decisions in the same
//! cycle see earlier ones.
//!
//! For fair placement it also counts, per service and node, the instances
//! that *stay*: not stopping and running the service's current spec. Old
//! spec instances of a rolling update and stopping ones are on their way
//! out; counting them would skew where their replacements go. The index
//! orders nodes by these counts for one service at a time, the *focus*
//! ([`Cluster::focus`]): switching focus re-keys only the nodes the two
//! services run on, so a pass pays O(instances · log nodes) for fairness
//! in all, and a placement stays O(log nodes).

use std::collections::{BTreeMap, BTreeSet};

use cca_model::clock::span_millis;
use cca_model::cluster::{Instance, Millis, NodeCondition, NodeInfo};

use super::SchedulerConfig;
use super::index::{CapacityIndex, Fit, Room};
use crate::controller::Context;
use crate::view::View;

/// Host ports the scheduler hands out to instances unless configured
/// otherwise ([`SchedulerConfig::host_ports`]).
pub const HOST_PORTS: std::ops::RangeInclusive<u16> = 20_000..=32_767;

/// CPU millicores and memory bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Amount {
    pub(crate) cpu: u64,
    pub(crate) memory: u64,
}

impl Amount {
    pub(crate) fn room(self) -> Room {
        Room {
            cpu: signed(self.cpu),
            memory: signed(self.memory),
        }
    }
}

/// Whether a node is alive, as the node controller and heartbeats say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Liveness {
    Ready,
    /// Not ready; its instances are replaced at `lost_at` if it stays so.
    Unreachable {
        lost_at: Option<Millis>,
    },
    /// Unreachable past the grace period: what ran there is gone.
    Lost,
}

/// One node as the scheduler sees it.
#[derive(Debug)]
pub(crate) struct NodeSlot<'v> {
    pub(crate) info: &'v NodeInfo,
    pub(crate) liveness: Liveness,
    pub(crate) draining: bool,
    pub(crate) disabled: bool,
    pub(crate) used: Amount,
    /// Allocation when the reconcile started, for pressure warnings.
    pub(crate) used_before: Amount,
    pub(crate) ports: BTreeSet<u16>,
    /// Host ports the node's agent found held by something outside the
    /// cluster (`observed/held-ports/{node}`): never handed out here.
    pub(crate) held: &'v BTreeSet<u16>,
    /// The range host ports are handed out from.
    pub(crate) range: std::ops::RangeInclusive<u16>,
    /// Instances per service on this node.
    pub(crate) services: BTreeMap<&'v str, u32>,
}

impl NodeSlot<'_> {
    /// Ready, not draining, not disabled: may take new instances.
    pub(crate) fn schedulable(&self) -> bool {
        self.liveness == Liveness::Ready && !self.draining && !self.disabled
    }

    pub(crate) fn free(&self) -> Room {
        Room {
            cpu: signed(self.info.cpu.0) - signed(self.used.cpu),
            memory: signed(self.info.memory.0) - signed(self.used.memory),
        }
    }

    /// Host ports of the range neither reserved nor held (a held port an
    /// instance record still names counts once).
    pub(crate) fn free_ports(&self) -> usize {
        let held = self
            .held
            .iter()
            .filter(|port| self.range.contains(port) && !self.ports.contains(port))
            .count();
        self.range.len().saturating_sub(self.ports.len() + held)
    }

    /// Whether `port` may be handed out here: in the range, neither
    /// reserved by an instance nor held by something outside the cluster.
    pub(crate) fn port_free(&self, port: u16) -> bool {
        self.range.contains(&port) && !self.ports.contains(&port) && !self.held.contains(&port)
    }

    /// The larger of cpu and memory allocation, in percent of capacity.
    pub(crate) fn pressure(&self, used: Amount) -> (u64, u64) {
        (
            percent(used.cpu, self.info.cpu.0),
            percent(used.memory, self.info.memory.0),
        )
    }

    pub(crate) fn load(&self) -> u64 {
        let (cpu, memory) = self.pressure(self.used);
        cpu.max(memory)
    }

    pub(crate) fn runs_any(&self, services: &[String]) -> bool {
        services
            .iter()
            .any(|name| self.services.contains_key(name.as_str()))
    }
}

fn percent(used: u64, capacity: u64) -> u64 {
    if capacity == 0 {
        return if used == 0 { 0 } else { 100 };
    }
    u64::try_from(u128::from(used) * 100 / u128::from(capacity)).unwrap_or(u64::MAX)
}

fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Cluster<'v> {
    pub(crate) nodes: Vec<NodeSlot<'v>>,
    by_name: BTreeMap<&'v str, u32>,
    pub(crate) index: CapacityIndex,
    /// Nodes running each service, with instance counts.
    placements: BTreeMap<&'v str, BTreeMap<u32, u32>>,
    /// Nodes running each service, with counts of the instances that stay
    /// (see the module documentation).
    staying: BTreeMap<&'v str, BTreeMap<u32, u32>>,
    /// Each service's current spec hash.
    current: BTreeMap<&'v str, String>,
    /// The service whose staying counts are the index levels.
    focus: Option<&'v str>,
    pressure_line: u64,
}

impl<'v> Cluster<'v> {
    /// The cluster of `view`; `current` holds each service's spec hash.
    pub(crate) fn build(
        view: &'v View,
        context: &Context,
        config: &SchedulerConfig,
        current: BTreeMap<&'v str, String>,
    ) -> Self {
        let nodes: Vec<NodeSlot<'v>> = view
            .nodes
            .iter()
            .map(|(name, info)| node_slot(view, name, &info.value, context, config))
            .collect();
        let by_name = nodes
            .iter()
            .enumerate()
            .map(|(id, slot)| (slot.info.name.as_str(), id as u32))
            .collect();
        let mut cluster = Cluster {
            index: CapacityIndex::with_nodes(nodes.len()),
            nodes,
            by_name,
            placements: BTreeMap::new(),
            staying: BTreeMap::new(),
            current,
            focus: None,
            pressure_line: config.pressure_percent,
        };
        for (_, instance) in view.instances.iter() {
            cluster.account(&instance.value);
        }
        for slot in &mut cluster.nodes {
            slot.used_before = slot.used;
        }
        for id in 0..cluster.nodes.len() as u32 {
            cluster.refresh(id);
        }
        cluster
    }

    pub(crate) fn node_id(&self, name: &str) -> Option<u32> {
        self.by_name.get(name).copied()
    }

    pub(crate) fn node(&self, id: u32) -> &NodeSlot<'v> {
        &self.nodes[id as usize]
    }

    pub(crate) fn node_named(&self, name: &str) -> Option<&NodeSlot<'v>> {
        self.node_id(name).map(|id| self.node(id))
    }

    /// Nodes running `service`, with counts.
    pub(crate) fn nodes_running(&self, service: &str) -> Option<&BTreeMap<u32, u32>> {
        self.placements.get(service)
    }

    /// Adds an existing record's reservation.
    fn account(&mut self, instance: &'v Instance) {
        let Some(id) = self.node_id(&instance.node) else {
            return;
        };
        let amount = Amount {
            cpu: instance.cpu.0,
            memory: instance.memory.0,
        };
        let ports = instance.host_ports.values().copied();
        self.add(id, &instance.service, amount, ports);
        if self.stays(instance) {
            *self
                .staying
                .entry(&instance.service)
                .or_default()
                .entry(id)
                .or_default() += 1;
        }
    }

    /// Whether `instance` counts for its service's fair share: it is not
    /// stopping and runs the current spec.
    fn stays(&self, instance: &Instance) -> bool {
        !instance.stopping
            && self
                .current
                .get(instance.service.as_str())
                .is_some_and(|hash| *hash == instance.spec_hash)
    }

    /// Instances of `service` on node `id` that stay.
    pub(crate) fn staying_on(&self, service: &str, id: u32) -> u32 {
        self.staying
            .get(service)
            .and_then(|nodes| nodes.get(&id))
            .copied()
            .unwrap_or(0)
    }

    /// Node `id`'s level in the index: the focused service's instances
    /// that stay there.
    pub(crate) fn level(&self, id: u32) -> u32 {
        self.focus.map_or(0, |service| self.staying_on(service, id))
    }

    /// Orders the index by `service`'s staying instances per node, for
    /// fair placement of that service. Cheap when it already is.
    pub(crate) fn focus(&mut self, service: &'v str) {
        if self.focus == Some(service) {
            return;
        }
        let previous = self.focus.replace(service);
        let mut touched: Vec<u32> = Vec::new();
        for name in previous.into_iter().chain([service]) {
            touched.extend(
                self.staying
                    .get(name)
                    .into_iter()
                    .flat_map(|nodes| nodes.keys()),
            );
        }
        for id in touched {
            self.refresh(id);
        }
    }

    /// `instance` is being stopped: it no longer counts as staying.
    pub(crate) fn leaving(&mut self, instance: &Instance) {
        if !self.stays(instance) {
            return;
        }
        let Some(id) = self.node_id(&instance.node) else {
            return;
        };
        if let Some(nodes) = self.staying.get_mut(instance.service.as_str()) {
            decrement(nodes, &id);
        }
        self.refresh(id);
    }

    fn add(&mut self, id: u32, service: &'v str, amount: Amount, ports: impl Iterator<Item = u16>) {
        let slot = &mut self.nodes[id as usize];
        slot.used.cpu += amount.cpu;
        slot.used.memory += amount.memory;
        slot.ports.extend(ports);
        *slot.services.entry(service).or_default() += 1;
        *self
            .placements
            .entry(service)
            .or_default()
            .entry(id)
            .or_default() += 1;
    }

    /// Reserves `amount` and `port_count` host ports for a new instance of
    /// `service` on node `id`; returns the ports (lowest free first).
    pub(crate) fn reserve(
        &mut self,
        id: u32,
        service: &'v str,
        amount: Amount,
        port_count: usize,
    ) -> Vec<u16> {
        let slot = &self.nodes[id as usize];
        let ports: Vec<u16> = slot
            .range
            .clone()
            .filter(|port| slot.port_free(*port))
            .take(port_count)
            .collect();
        self.reserve_ports(id, service, amount, &ports);
        ports
    }

    /// Reserves `amount` and exactly `ports` for an instance of `service`
    /// on node `id` (one it adopts, which holds them already).
    pub(crate) fn reserve_ports(
        &mut self,
        id: u32,
        service: &'v str,
        amount: Amount,
        ports: &[u16],
    ) {
        self.add(id, service, amount, ports.iter().copied());
        *self
            .staying
            .entry(service)
            .or_default()
            .entry(id)
            .or_default() += 1;
        self.refresh(id);
    }

    /// Changes `instance`'s reservation to `amount` when its node has
    /// room for what it grows by. Whether it did.
    pub(crate) fn resize(&mut self, instance: &Instance, amount: Amount) -> bool {
        let Some(id) = self.node_id(&instance.node) else {
            return false;
        };
        let slot = &mut self.nodes[id as usize];
        let free = slot.free();
        let grows_cpu = signed(amount.cpu) - signed(instance.cpu.0);
        let grows_memory = signed(amount.memory) - signed(instance.memory.0);
        if grows_cpu > free.cpu.max(0) || grows_memory > free.memory.max(0) {
            return false;
        }
        slot.used.cpu = (slot.used.cpu + amount.cpu).saturating_sub(instance.cpu.0);
        slot.used.memory = (slot.used.memory + amount.memory).saturating_sub(instance.memory.0);
        self.refresh(id);
        true
    }

    /// Gives back a deleted record's reservation.
    pub(crate) fn release(&mut self, instance: &Instance) {
        let Some(id) = self.node_id(&instance.node) else {
            return;
        };
        if self.stays(instance)
            && let Some(nodes) = self.staying.get_mut(instance.service.as_str())
        {
            decrement(nodes, &id);
        }
        let slot = &mut self.nodes[id as usize];
        slot.used.cpu = slot.used.cpu.saturating_sub(instance.cpu.0);
        slot.used.memory = slot.used.memory.saturating_sub(instance.memory.0);
        for port in instance.host_ports.values() {
            slot.ports.remove(port);
        }
        decrement(&mut slot.services, instance.service.as_str());
        if let Some(nodes) = self.placements.get_mut(instance.service.as_str()) {
            decrement(nodes, &id);
        }
        self.refresh(id);
    }

    /// Re-indexes node `id` after its allocation or state changed.
    fn refresh(&mut self, id: u32) {
        match self.index_keys(id) {
            Some((free, headroom)) => self.index.set(id, self.level(id), free, headroom),
            None => self.index.remove(id),
        }
    }

    /// Node `id`'s free room and headroom under the pressure line, or
    /// `None` when it is not schedulable (and so not indexed).
    pub(crate) fn index_keys(&self, id: u32) -> Option<(Room, Room)> {
        let slot = &self.nodes[id as usize];
        if !slot.schedulable() {
            return None;
        }
        let free = slot.free();
        let reserve = |capacity: u64| signed(capacity) * (100 - self.pressure_line as i64) / 100;
        let headroom = Room {
            cpu: free.cpu - reserve(slot.info.cpu.0),
            memory: free.memory - reserve(slot.info.memory.0),
        };
        Some((free, headroom))
    }

    /// Best-fit lookup; see [`CapacityIndex::best_fit`].
    pub(crate) fn best_fit(
        &self,
        need: Amount,
        fit: Fit,
        accept: impl FnMut(u32) -> bool,
    ) -> Option<u32> {
        self.index.best_fit(need.room(), fit, accept)
    }

    /// True when node `id` stays at or under the pressure line with `need` added.
    pub(crate) fn stays_under_line(&self, id: u32, need: Amount) -> bool {
        let slot = self.node(id);
        let after = Amount {
            cpu: slot.used.cpu + need.cpu,
            memory: slot.used.memory + need.memory,
        };
        let (cpu, memory) = slot.pressure(after);
        cpu <= self.pressure_line && memory <= self.pressure_line
    }

    pub(crate) fn pressure_line(&self) -> u64 {
        self.pressure_line
    }
}

fn decrement<K: Ord + std::borrow::Borrow<Q>, Q: Ord + ?Sized>(
    map: &mut BTreeMap<K, u32>,
    key: &Q,
) {
    if let Some(count) = map.get_mut(key) {
        *count -= 1;
        if *count == 0 {
            map.remove(key);
        }
    }
}

fn node_slot<'v>(
    view: &'v View,
    name: &str,
    info: &'v NodeInfo,
    context: &Context,
    config: &SchedulerConfig,
) -> NodeSlot<'v> {
    let control = view.node_controls.get(name);
    static NONE_HELD: BTreeSet<u16> = BTreeSet::new();
    NodeSlot {
        info,
        liveness: liveness(view, name, context, config),
        draining: control.is_some_and(|control| control.drain),
        disabled: control.is_some_and(|control| control.disabled),
        used: Amount::default(),
        used_before: Amount::default(),
        ports: BTreeSet::new(),
        held: view
            .held_ports
            .get(name)
            .map_or(&NONE_HELD, |held| &held.value.ports),
        range: config.host_ports.clone(),
        services: BTreeMap::new(),
    }
}

fn liveness(view: &View, name: &str, context: &Context, config: &SchedulerConfig) -> Liveness {
    let beating = view.heartbeats.contains_key(name);
    let status = view.node_statuses.get(name);
    let disruption = view.disruption.as_ref().map(|held| &*held.value);
    match status.map(|status| (status.condition, status.since)) {
        // The node controller distrusts lost leases right now: nothing is
        // lost until the pause ends.
        Some((NodeCondition::Unreachable, _)) if disruption.is_some_and(|d| d.paused) => {
            Liveness::Unreachable { lost_at: None }
        }
        Some((NodeCondition::Unreachable, since)) if !beating => {
            // Count from our own leadership too: a new leader has not yet
            // watched the node long enough to call it lost. And from the
            // end of a pause: a node may be just slower to come back.
            let resumed_at = disruption.map_or(since, |resumed| resumed.since);
            let lost_at =
                since.max(context.leader_since).max(resumed_at) + span_millis(config.lost_grace);
            if context.now >= lost_at {
                Liveness::Lost
            } else {
                Liveness::Unreachable {
                    lost_at: Some(lost_at),
                }
            }
        }
        Some((NodeCondition::Unreachable, _)) => Liveness::Unreachable { lost_at: None },
        _ if beating => Liveness::Ready,
        _ => Liveness::Unreachable { lost_at: None },
    }
}
