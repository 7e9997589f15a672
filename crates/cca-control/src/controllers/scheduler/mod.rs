//! The scheduler: turns each service's desired replicas into instance
//! records placed on nodes, and keeps them placed. One pass, pure over the
//! view and the injected time:
//!
//! 1. Within `startup_grace` of becoming leader it does nothing but ask to
//!    be woken when the grace ends, so nodes that are still registering do
//!    not all lose the race to the first one (no thundering herd).
//! 2. [`service::decide`] works out, per service, what to delete, stop and
//!    create: stopped and lost records go, failed instances are replaced
//!    within a restart budget, scale and rolling updates follow
//!    `update.max_surge`/`max_unavailable`, drains move instances within
//!    the disruption budget, stateful ordinals start and stop in order.
//!    A service asleep (`scale_to_zero`, `derived/scale`) has zero
//!    replicas instead ([`service::sleep`]): its instances stop, and
//!    `replicas` of its current spec come back when it wakes.
//! 3. Creates are placed service by service: an instance a node already
//!    runs without a placement (after a resync with another store) is
//!    adopted where it runs when it matches ([`adopt`]), the rest go where
//!    [`scoring`], [`feasibility`] and the incremental [`index`] say; what
//!    cannot be placed becomes an
//!    unplaced-demand fact naming the reason, the constraint and the
//!    nearest node.
//! 4. A quiet pass rebalances ([`rebalance`]); any pass that pushes a node
//!    over the pressure line logs a WARNING for it.
//!
//! Only differences from the view are written, so a converged cluster
//! yields an empty plan.

mod adopt;
mod cluster;
mod feasibility;
mod ids;
pub(crate) mod index;
mod pass;
mod rebalance;
mod scoring;
mod service;
mod target;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::Duration;

use cca_model::Kind;
use cca_model::clock::span_millis;
use cca_model::cluster::Instance;
use cca_model::spec::spec_hash;

use crate::controller::{Context, Controller, EventDraft, Plan};
use crate::view::View;
pub use cluster::HOST_PORTS;
use pass::Pass;
use scoring::Placer;
use target::Placed;

/// The scheduler's tunables; `Default` gives the documented values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Wait after becoming leader before placing anything (10 s).
    pub startup_grace: Duration,
    /// How long a node stays unreachable (its lease expired) before its
    /// instances are replaced elsewhere (2 s: the 6 s lease already
    /// tolerated a silent agent for 4-6 s, and a mass expiry pauses
    /// replacement instead: see the node controller).
    pub lost_grace: Duration,
    /// Failed instances replaced per service per `failure_window` (3).
    pub failure_budget: u32,
    /// The window of the restart budget (5 min).
    pub failure_window: Duration,
    /// Allocation (percent of cpu or memory) above which a node is under
    /// pressure: a WARNING, a rebalancing source, avoided by bin-packing (80).
    pub pressure_percent: u64,
    /// Rebalancing moves started per pass (2).
    pub max_moves: usize,
    /// Instances created per pass, at most 65,536 (the ids a pass can
    /// mint); more demand is placed by the passes that follow at once.
    /// Bounds one pass's plan.
    pub max_creates: u32,
    /// An instance that restarted within this long does not count as
    /// ready for a rolling update or a move: between crashes a crash
    /// looping one runs for a moment (10 s).
    pub min_ready: Duration,
    /// The host ports handed out to instances, per node, lowest free
    /// first ([`HOST_PORTS`]: 20000-32767). Ports a node's agent reports
    /// held by something outside the cluster are skipped on that node.
    pub host_ports: std::ops::RangeInclusive<u16>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            startup_grace: Duration::from_secs(10),
            lost_grace: Duration::from_secs(2),
            failure_budget: 3,
            failure_window: Duration::from_secs(300),
            pressure_percent: 80,
            max_moves: 2,
            max_creates: ids::MAX_MINTED_PER_CYCLE,
            min_ready: Duration::from_secs(10),
            host_ports: HOST_PORTS,
        }
    }
}

/// Writes `derived/instance/{svc}/{id}` and `derived/unplaced/{svc}`.
#[derive(Clone, Debug, Default)]
pub struct SchedulerController {
    pub config: SchedulerConfig,
}

impl Controller for SchedulerController {
    fn name(&self) -> &'static str {
        "scheduler"
    }

    /// Everything placement depends on. Its own prefixes are left out:
    /// each pass already sees its previous commit in the next view.
    fn interests(&self) -> &'static [Kind] {
        &[
            Kind::Service,
            Kind::NodeControl,
            Kind::Node,
            Kind::Heartbeat,
            Kind::InstanceStatus,
            Kind::NodeStatus,
            Kind::Disruption,
            Kind::Scale,
            Kind::HeldPorts,
            Kind::ServiceVersion,
            Kind::Rollout,
            Kind::RolloutControl,
            Kind::Autoscale,
            Kind::Vertical,
            Kind::Unclaimed,
        ]
    }

    fn reconcile(&self, view: &View, context: &Context) -> Plan {
        let grace_ends = context.leader_since + span_millis(self.config.startup_grace);
        if context.now < grace_ends {
            let mut plan = Plan::default();
            plan.requeue(grace_ends - context.now);
            return plan;
        }
        reconcile(view, context, &self.config)
    }
}

/// One scheduling pass after the startup grace; see the module documentation.
pub(crate) fn reconcile(view: &View, context: &Context, config: &SchedulerConfig) -> Plan {
    let placed = Placed::of(view);
    let known = target::targets(view, &placed);
    let current = known
        .iter()
        .map(|(name, target)| (*name, target.hash.clone()))
        .collect();
    let mut pass = Pass::new(view, context, config, current);
    let by_service = instances_by_service(view);
    for (service, instances) in &by_service {
        if !known.contains_key(service) {
            service::retire(&mut pass, instances);
        }
    }
    for (service, _) in view.unplaced.iter() {
        if !known.contains_key(service.as_str()) {
            pass.sync_unplaced(service, 0, None);
        }
    }
    let mut creates = Vec::new();
    for (name, target) in &known {
        let instances = by_service.get(name).map_or(&[][..], Vec::as_slice);
        let before = pass.instance_writes;
        let wanted = if view.is_asleep(name) {
            service::sleep(&mut pass, name, instances);
            Vec::new()
        } else {
            service::decide(&mut pass, name, target, instances)
        };
        // A steady service's instances follow vertical autoscaling's size.
        let steady = pass.instance_writes == before && wanted.is_empty();
        if steady && resize_service(&mut pass, name, target.spec, instances) {
            pass.guard_service(name);
        }
        if pass.instance_writes > before || !wanted.is_empty() {
            pass.guard_service(name);
        }
        creates.push((*name, target.spec, target.hash.as_str(), wanted));
    }
    for (name, spec, hash, wanted) in creates {
        place_service(&mut pass, name, spec, hash, wanted);
    }
    if pass.instance_writes == 0 {
        rebalance::rebalance(&mut pass, &known);
    }
    pass.into_plan()
}

fn place_service<'v>(
    pass: &mut Pass<'v>,
    name: &'v str,
    spec: &'v cca_model::spec::ServiceSpec,
    hash: &str,
    wanted: Vec<pass::Create>,
) {
    if wanted.is_empty() {
        pass.sync_unplaced(name, 0, None);
        return;
    }
    let sized = pass.view.sized_resources(name);
    let mut placer = Placer::new(&mut pass.cluster, name, spec, sized);
    let (mut placed, mut unplaced) = (0, 0);
    for create in wanted {
        match pass.place(&mut placer, spec, hash, create) {
            pass::Placement::Placed => placed += 1,
            pass::Placement::NoRoom => unplaced += 1,
            pass::Placement::Deferred => {}
        }
    }
    pass.sync_unplaced(name, unplaced, Some(&placer));
    if placed > 0 {
        pass.events.push(EventDraft::info(
            format!("service/{name}"),
            format!("placed {placed} instance(s)"),
        ));
    }
}

/// Sizes `service`'s placed instances to what vertical autoscaling
/// applies (or back to the spec's `resources` once it no longer does), in
/// place where each node has room for the growth; the others keep their
/// size until they are replaced. Whether any changed.
fn resize_service(
    pass: &mut Pass<'_>,
    service: &str,
    spec: &cca_model::spec::ServiceSpec,
    instances: &[&Instance],
) -> bool {
    let sized = pass.view.sized_resources(service);
    let amount = cluster::Amount::of(sized.unwrap_or(&spec.resources));
    let mut changed = false;
    for instance in instances.iter().filter(|instance| !instance.stopping) {
        if instance.resized.as_ref() != sized {
            changed |= pass.resize(instance, sized, amount);
        }
    }
    changed
}

fn instances_by_service(view: &View) -> BTreeMap<&str, Vec<&Instance>> {
    let mut by_service: BTreeMap<&str, Vec<&Instance>> = BTreeMap::new();
    for (_, instance) in view.instances.iter() {
        by_service
            .entry(instance.service.as_str())
            .or_default()
            .push(&instance.value);
    }
    by_service
}

/// Benchmark support, not API: one service's placement path (scoring,
/// feasibility, index update) on a prepared cluster, without building the
/// cluster from the view each time. The benchmark times [`place_one`]
/// against the capacity index of thousands of nodes.
///
/// [`place_one`]: PlacementProbe::place_one
#[doc(hidden)]
#[derive(Debug)]
pub struct PlacementProbe<'v> {
    cluster: cluster::Cluster<'v>,
    placer: Placer<'v>,
    ports: usize,
}

impl<'v> PlacementProbe<'v> {
    /// Prepares placing instances of `service` onto the nodes of `view`;
    /// `None` when the view has no such service.
    pub fn new(view: &'v View, service: &str) -> Option<Self> {
        let (name, spec) = view.services.get_key_value(service)?;
        let context = Context {
            now: 0,
            leader_since: i64::MIN / 2,
        };
        let current = BTreeMap::from([(name.as_str(), spec_hash(&spec.value))]);
        let mut cluster =
            cluster::Cluster::build(view, &context, &SchedulerConfig::default(), current);
        let placer = Placer::new(&mut cluster, name, &spec.value, None);
        Some(PlacementProbe {
            cluster,
            placer,
            ports: spec.ports.len(),
        })
    }

    /// Places one instance (choose a node, reserve it); false when full.
    pub fn place_one(&mut self) -> bool {
        let Some(node) = self
            .placer
            .choose(&mut self.cluster, scoring::Request::ANYWHERE)
        else {
            return false;
        };
        let amount = self.placer.demand.amount;
        self.cluster
            .reserve(node, self.placer.service, amount, self.ports);
        self.placer.placed(&self.cluster, node);
        true
    }
}
