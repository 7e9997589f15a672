//! One scheduling pass: the [`Cluster`] working copy plus the plan being
//! built. Writes are kept by key (a later write to a key replaces an
//! earlier one, so deleting a stopped stateful instance and recreating its
//! ordinal in one pass is a single put), and leave in key order so the
//! same view always yields the same plan.

use std::collections::{BTreeMap, BTreeSet};

use cca_model::cluster::{Instance, Millis, Unplaced};
use cca_model::keys;
use cca_model::recovery::UnclaimedInstance;
use cca_model::spec::{Cpu, Memory, Resources, ServiceSpec};

use super::SchedulerConfig;
use super::adopt::Claims;
use super::cluster::{Amount, Cluster};
use super::feasibility::diagnose;
use super::ids::IdMinter;
use super::scoring::{Placer, Request};
use crate::controller::{Context, EventDraft, Plan, Write};
use crate::controllers::endpoint::port_key;
use crate::view::View;

/// What became of one instance to create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    Placed,
    /// No node can take it now: unplaced demand.
    NoRoom,
    /// This pass made all the instances it may; the next one goes on.
    Deferred,
}

/// A new instance the pass wants placed.
#[derive(Clone, Debug)]
pub(crate) struct Create {
    /// Stateful ordinal; the id is then `{svc}-{ordinal}`.
    pub(crate) ordinal: Option<u32>,
    /// The instance this one takes over from (drain, rebalancing).
    pub(crate) replaces: Option<String>,
    /// Failure history inherited from the failed instance it replaces.
    pub(crate) failures: Vec<Millis>,
    pub(crate) request: Request,
    /// The record exists (a failed stateful ordinal recreated in place):
    /// when it cannot be placed, the record is deleted instead.
    pub(crate) overwrites: bool,
}

impl Create {
    pub(crate) fn new() -> Self {
        Create {
            ordinal: None,
            replaces: None,
            failures: Vec::new(),
            request: Request::ANYWHERE,
            overwrites: false,
        }
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Pass<'v> {
    pub(crate) view: &'v View,
    pub(crate) context: &'v Context,
    pub(crate) config: &'v SchedulerConfig,
    pub(crate) cluster: Cluster<'v>,
    writes: BTreeMap<String, Write>,
    guards: BTreeSet<String>,
    pub(crate) events: Vec<EventDraft>,
    requeue_at: Option<Millis>,
    minter: IdMinter,
    claims: Claims<'v>,
    /// Instance records put or deleted so far.
    pub(crate) instance_writes: usize,
}

impl<'v> Pass<'v> {
    /// A pass over `view`; `current` holds each service's spec hash.
    pub(crate) fn new(
        view: &'v View,
        context: &'v Context,
        config: &'v SchedulerConfig,
        current: BTreeMap<&'v str, String>,
    ) -> Self {
        Pass {
            view,
            context,
            config,
            cluster: Cluster::build(view, context, config, current),
            writes: BTreeMap::new(),
            guards: BTreeSet::new(),
            events: Vec::new(),
            requeue_at: None,
            minter: IdMinter::new(view.revision, config.max_creates),
            claims: Claims::of(view),
            instance_writes: 0,
        }
    }

    pub(crate) fn now(&self) -> Millis {
        self.context.now
    }

    /// Asks to reconcile again at `at` (a grace period or window ends).
    pub(crate) fn requeue_at(&mut self, at: Millis) {
        self.requeue_at = Some(self.requeue_at.map_or(at, |held| held.min(at)));
    }

    /// The decision depended on the service's spec (and, for one that
    /// scales to zero, on whether it sleeps): commit only if they are
    /// still what the view holds.
    pub(crate) fn guard_service(&mut self, service: &str) {
        self.guards.insert(keys::desired_service(service));
        let sleeps = self
            .view
            .services
            .get(service)
            .is_some_and(|spec| spec.scale_to_zero.is_some());
        if sleeps {
            self.guards.insert(keys::derived_scale(service));
        }
    }

    fn write(&mut self, write: Write) {
        self.writes.insert(write.key().to_owned(), write);
    }

    /// Asks the agent to stop `instance`; its reservation holds until the
    /// record is deleted.
    pub(crate) fn stop(&mut self, instance: &Instance) {
        let mut stopping = instance.clone();
        stopping.stopping = true;
        let key = keys::derived_instance(&instance.service, &instance.id);
        self.write(Write::put_json(key, &stopping));
        self.cluster.leaving(instance);
        self.instance_writes += 1;
    }

    /// Deletes `instance`'s record and gives its reservation back.
    pub(crate) fn delete(&mut self, instance: &Instance) {
        self.write(Write::delete(keys::derived_instance(
            &instance.service,
            &instance.id,
        )));
        self.cluster.release(instance);
        self.instance_writes += 1;
    }

    /// Sizes a placed instance to `resized` (`None`: its spec's
    /// `resources`, which `amount` reserves) in place, when its node has
    /// room for any growth. Whether it did.
    pub(crate) fn resize(
        &mut self,
        instance: &Instance,
        resized: Option<&Resources>,
        amount: Amount,
    ) -> bool {
        if !self.cluster.resize(instance, amount) {
            return false;
        }
        let sized = Instance {
            cpu: Cpu(amount.cpu),
            memory: Memory(amount.memory),
            resized: resized.cloned(),
            ..instance.clone()
        };
        let key = keys::derived_instance(&instance.service, &instance.id);
        self.write(Write::put_json(key, &sized));
        self.instance_writes += 1;
        true
    }

    /// Places one instance of `spec`.
    pub(crate) fn place(
        &mut self,
        placer: &mut Placer<'v>,
        spec: &'v ServiceSpec,
        spec_hash: &str,
        create: Create,
    ) -> Placement {
        let service = placer.service;
        if let Some((node, adopted)) =
            self.claims
                .take(self.view, &self.cluster, placer, spec_hash, create.ordinal)
        {
            self.adopt(placer, spec_hash, node, adopted, create);
            return Placement::Placed;
        }
        if create.ordinal.is_none() && self.minter.exhausted() {
            // The cycle's ids are used up (65,536 placements): the rest
            // is not unplaceable, it goes in the next pass.
            self.requeue_at(self.now());
            return Placement::Deferred;
        }
        let chosen = placer.choose(&mut self.cluster, create.request);
        let id = match (chosen, create.ordinal) {
            (None, _) => None,
            (Some(_), Some(ordinal)) => Some(super::ids::stateful_id(service, ordinal)),
            (Some(_), None) => {
                let view = self.view;
                self.minter.mint(service, |id| {
                    view.instances.contains_key(id) || view.statuses.contains_key(id)
                })
            }
        };
        let (Some(node), Some(id)) = (chosen, id) else {
            if let (true, Some(ordinal)) = (create.overwrites, create.ordinal) {
                let id = super::ids::stateful_id(service, ordinal);
                self.write(Write::delete(keys::derived_instance(service, &id)));
            }
            return if chosen.is_some() {
                self.requeue_at(self.now());
                Placement::Deferred
            } else {
                Placement::NoRoom
            };
        };
        let amount = placer.demand.amount;
        let ports = self
            .cluster
            .reserve(node, service, amount, spec.ports.len());
        placer.placed(&self.cluster, node);
        let instance = Instance {
            id,
            service: service.to_owned(),
            node: self.cluster.node(node).info.name.clone(),
            ordinal: create.ordinal,
            spec_hash: spec_hash.to_owned(),
            cpu: Cpu(amount.cpu),
            memory: Memory(amount.memory),
            host_ports: spec.ports.iter().map(port_key).zip(ports).collect(),
            created_at: self.now(),
            stopping: false,
            replaces: create.replaces,
            failures: create.failures,
            resized: placer.resized.clone(),
        };
        let key = keys::derived_instance(service, &instance.id);
        self.write(Write::put_json(key, &instance));
        self.instance_writes += 1;
        Placement::Placed
    }

    /// Places `adopted` where it runs, with its id and host ports.
    fn adopt(
        &mut self,
        placer: &mut Placer<'v>,
        spec_hash: &str,
        node: u32,
        adopted: &UnclaimedInstance,
        create: Create,
    ) {
        let service = placer.service;
        let amount = placer.demand.amount;
        let ports: Vec<u16> = adopted.host_ports.values().copied().collect();
        self.cluster.reserve_ports(node, service, amount, &ports);
        placer.placed(&self.cluster, node);
        let instance = Instance {
            id: adopted.id.clone(),
            service: service.to_owned(),
            node: self.cluster.node(node).info.name.clone(),
            ordinal: adopted.ordinal,
            spec_hash: spec_hash.to_owned(),
            cpu: Cpu(amount.cpu),
            memory: Memory(amount.memory),
            host_ports: adopted.host_ports.clone(),
            created_at: self.now(),
            stopping: false,
            replaces: create.replaces,
            failures: create.failures,
            resized: placer.resized.clone(),
        };
        self.events.push(EventDraft::info(
            format!("instance/{}", instance.id),
            format!(
                "adopted: it already runs on node {} at this version",
                instance.node
            ),
        ));
        let key = keys::derived_instance(service, &instance.id);
        self.write(Write::put_json(key, &instance));
        self.instance_writes += 1;
    }

    /// Writes, keeps or deletes the service's unplaced-demand fact so it
    /// says `count` instances wait (none: the fact goes).
    pub(crate) fn sync_unplaced(&mut self, service: &str, count: u32, placer: Option<&Placer<'_>>) {
        let held = self.view.unplaced.get(service);
        let (Some(placer), true) = (placer, count > 0) else {
            if held.is_some() {
                self.write(Write::delete(keys::derived_unplaced(service)));
            }
            return;
        };
        let diagnosis = diagnose(&self.cluster, &placer.demand);
        let same_cause = held.filter(|held| {
            held.reason == diagnosis.reason && held.constraint == diagnosis.constraint
        });
        let fact = Unplaced {
            service: service.to_owned(),
            count,
            reason: diagnosis.reason,
            constraint: diagnosis.constraint,
            nearest_node: diagnosis.nearest_node,
            since: same_cause.map_or(self.now(), |held| held.since),
        };
        if held.is_some_and(|held| *held.value == fact) {
            return;
        }
        if same_cause.is_none() {
            let reason = serde_json::to_value(fact.reason).unwrap_or_default();
            let message = format!(
                "cannot place {count} instance(s): {} ({})",
                reason.as_str().unwrap_or_default(),
                fact.constraint
            );
            self.events
                .push(EventDraft::warning(format!("service/{service}"), message));
        }
        self.write(Write::put_json(keys::derived_unplaced(service), &fact));
    }

    /// A WARNING for every node this pass pushes over the pressure line.
    fn pressure_warnings(&mut self) {
        let line = self.cluster.pressure_line();
        for slot in &self.cluster.nodes {
            let before = slot.pressure(slot.used_before);
            let after = slot.pressure(slot.used);
            for (resource, before, after) in
                [("cpu", before.0, after.0), ("memory", before.1, after.1)]
            {
                if before <= line && after > line {
                    self.events.push(EventDraft::warning(
                        format!("node/{}", slot.info.name),
                        format!("{resource} allocation at {after}% exceeds {line}%"),
                    ));
                }
            }
        }
    }

    /// The plan: writes in key order, guards only when there are writes.
    pub(crate) fn into_plan(mut self) -> Plan {
        self.pressure_warnings();
        let mut plan = Plan::default();
        if let Some(at) = self.requeue_at {
            plan.requeue(at - self.now());
        }
        if self.writes.is_empty() {
            plan.events = self.events;
            return plan;
        }
        plan.writes = self.writes.into_values().collect();
        plan.guards = self.guards.into_iter().collect();
        plan.events = self.events;
        plan
    }
}
