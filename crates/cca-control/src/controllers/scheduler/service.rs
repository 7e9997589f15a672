//! What one service needs this pass: which records to delete (stopped,
//! lost with their node, failed within the restart budget), which to stop
//! (scale down, rolling update, finished moves, stateful order) and which
//! instances to create (scale up, replacements, drain moves). Placement of
//! the creates happens afterwards, for all services, in
//! [`super::reconcile`].
//!
//! Stateless services follow a rolling-update rule in the style of a
//! Kubernetes Deployment: old instances stop while at least
//! `replicas - max_unavailable` instances stay ready (`max_unavailable`
//! within the disruption budget), and at most `max_surge` extra instances
//! run while old ones remain. A new instance counts as ready once it runs
//! and, when the service has a health check, passed it: the roll waits for
//! each one. Which version is new is the pass's [`Target`]: the spec's,
//! or what the rollout chose (an undo, an automatic rollback). Stateful services
//! move one ordinal at a time: ordinal `k` is created only once `k - 1`
//! runs, the highest ordinal stops first, and a stop waits for the previous
//! one to finish.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use cca_model::clock::span_millis;
use cca_model::cluster::{Instance, InstanceState, InstanceStatus, Millis};
use cca_model::spec::ServiceSpec;

use super::cluster::Liveness;
use super::pass::{Create, Pass};
use super::target::Target;
use crate::controller::EventDraft;

/// An instance that counts for its service this pass.
#[derive(Clone, Copy, Debug)]
struct Member<'v> {
    instance: &'v Instance,
    /// Running, not reported unhealthy, and not restarted within
    /// `min_ready`.
    ready: bool,
    failed: bool,
    /// Runs the current spec.
    current: bool,
    /// On a draining node.
    draining: bool,
    /// How loaded its node is, in percent: scale-down prefers busy nodes.
    load: u64,
}

/// What an instance record is this pass.
enum Kind<'v> {
    /// Stopping and done (stopped, failed, gone): delete the record.
    Finished,
    /// Stopping, not done yet.
    Stopping,
    /// Its node is gone or lost: delete and replace.
    Lost,
    Member(Member<'v>),
}

/// Classifies `instance` against the version `spec_hash`; `held` (a
/// paused rollout) counts every version as current.
fn classify<'v>(
    pass: &mut Pass<'v>,
    instance: &'v Instance,
    spec_hash: &str,
    held: bool,
) -> Kind<'v> {
    let slot = pass.cluster.node_named(&instance.node);
    let liveness = slot.map_or(Liveness::Lost, |slot| slot.liveness);
    let draining = slot.is_some_and(|slot| slot.draining);
    let load = slot.map_or(0, |slot| slot.load());
    if let Liveness::Unreachable { lost_at: Some(at) } = liveness {
        pass.requeue_at(at);
    }
    let status = pass.view.fresh_status(instance);
    if instance.stopping {
        let stopped = status.is_none_or(|status| {
            matches!(status.state, InstanceState::Stopped | InstanceState::Failed)
        });
        return if stopped || liveness == Liveness::Lost {
            Kind::Finished
        } else {
            Kind::Stopping
        };
    }
    if liveness == Liveness::Lost {
        return Kind::Lost;
    }
    let ready = pass.view.is_ready(instance) && settled(pass, status);
    Kind::Member(Member {
        instance,
        ready,
        failed: status.is_some_and(|status| status.state == InstanceState::Failed),
        current: held || instance.spec_hash == spec_hash,
        draining,
        load,
    })
}

/// False while the instance restarted within `min_ready` (asking to be
/// woken when that ends): it may be crash looping, and it runs for a
/// moment between crashes.
fn settled(pass: &mut Pass<'_>, status: Option<&InstanceStatus>) -> bool {
    let Some(exit) = status.and_then(|status| status.last_exit.as_ref()) else {
        return true;
    };
    let until = exit.at.saturating_add(span_millis(pass.config.min_ready));
    if until <= pass.now() {
        return true;
    }
    pass.requeue_at(until);
    false
}

/// Instances of a service that no longer exists: stop them, then delete.
pub(crate) fn retire<'v>(pass: &mut Pass<'v>, instances: &[&'v Instance]) {
    for instance in instances {
        match classify(pass, instance, "", false) {
            Kind::Finished | Kind::Lost => pass.delete(instance),
            Kind::Stopping => {}
            Kind::Member(_) => pass.stop(instance),
        }
    }
}

/// An asleep service (`scale_to_zero`, `derived/scale`): zero replicas.
/// Every instance stops the usual way (it leaves the endpoints first, so
/// requests in flight finish), and nothing is created, replaced or moved
/// until it wakes; then [`decide`] places `replicas` of the spec it has
/// then.
pub(crate) fn sleep<'v>(pass: &mut Pass<'v>, service: &str, instances: &[&'v Instance]) {
    let mut stops = Vec::new();
    for instance in instances {
        match classify(pass, instance, "", false) {
            Kind::Finished | Kind::Lost => pass.delete(instance),
            Kind::Stopping => {}
            Kind::Member(_) => {
                pass.stop(instance);
                stops.push(instance.id.as_str());
            }
        }
    }
    if !stops.is_empty() {
        pass.events.push(EventDraft::info(
            format!("service/{service}"),
            format!("stopping {} (asleep: scale to zero)", stops.join(", ")),
        ));
    }
}

/// Decides deletes and stops for `service` and returns the instances to create.
pub(crate) fn decide<'v>(
    pass: &mut Pass<'v>,
    service: &str,
    target: &Target<'v>,
    instances: &[&'v Instance],
) -> Vec<Create> {
    let spec = target.spec;
    let mut members = Vec::new();
    let mut lingering = BTreeSet::new();
    for instance in instances {
        match classify(pass, instance, &target.hash, target.held) {
            Kind::Finished => pass.delete(instance),
            Kind::Stopping => {
                lingering.insert(instance.id.as_str());
            }
            Kind::Lost => {
                pass.delete(instance);
                pass.events.push(EventDraft::warning(
                    format!("instance/{}", instance.id),
                    format!("lost with node {}; replacing it", instance.node),
                ));
            }
            Kind::Member(member) => members.push(member),
        }
    }
    let (mut inherited, mut creates) = replace_failures(pass, service, spec, &mut members);
    complete_moves(pass, &mut members);
    let more = if spec.stateful {
        stateful(pass, service, spec, &members, &lingering, &creates)
    } else {
        stateless(pass, service, spec, &members, &mut inherited)
    };
    creates.extend(more);
    creates
}

/// Replaces failed instances within the service's restart budget. Returns
/// the failure histories the replacements inherit and, for stateful
/// services, the in-place recreations.
fn replace_failures<'v>(
    pass: &mut Pass<'v>,
    service: &str,
    spec: &ServiceSpec,
    members: &mut Vec<Member<'v>>,
) -> (VecDeque<Vec<Millis>>, Vec<Create>) {
    let now = pass.now();
    let window = span_millis(pass.config.failure_window);
    let recent = |failures: &[Millis]| -> Vec<Millis> {
        failures
            .iter()
            .copied()
            .filter(|at| *at > now - window)
            .collect()
    };
    let mut history: Vec<Millis> = members
        .iter()
        .flat_map(|member| recent(&member.instance.failures))
        .collect();
    let mut inherited = VecDeque::new();
    let mut recreations = Vec::new();
    let budget = pass.config.failure_budget as usize;
    let failed: Vec<Member<'v>> = members
        .iter()
        .filter(|member| member.failed)
        .copied()
        .collect();
    for member in failed {
        let instance = member.instance;
        if let Some(port) = held_port(pass, instance) {
            // The node, not the instance, failed it: something outside the
            // cluster holds one of its host ports. Placed again on other
            // ports (the held ones are skipped from now on), outside the
            // restart budget: each such failure names a port it can never
            // be given again while held, so they cannot repeat endlessly.
            pass.events.push(EventDraft::warning(
                format!("instance/{}", instance.id),
                format!(
                    "host port {port} is held on node {} by something outside the cluster; \
                     placing it again on other ports",
                    instance.node
                ),
            ));
            members.retain(|other| other.instance.id != instance.id);
            let failures = recent(&instance.failures);
            replace(
                pass,
                spec,
                instance,
                failures,
                &mut inherited,
                &mut recreations,
            );
            continue;
        }
        if history.len() >= budget {
            if let Some(oldest) = history.iter().min() {
                pass.requeue_at(oldest + window);
            }
            continue;
        }
        history.push(now);
        let mut failures = recent(&instance.failures);
        failures.push(now);
        pass.events.push(EventDraft::warning(
            format!("instance/{}", instance.id),
            format!(
                "failed; replacing it ({} of {budget} replacements allowed per {}s)",
                history.len(),
                window / 1000
            ),
        ));
        if history.len() == budget {
            pass.events.push(EventDraft::warning(
                format!("service/{service}"),
                format!(
                    "restart budget exhausted: {budget} failed instances replaced within {}s; \
                     further failures wait",
                    window / 1000
                ),
            ));
        }
        members.retain(|other| other.instance.id != instance.id);
        replace(
            pass,
            spec,
            instance,
            failures,
            &mut inherited,
            &mut recreations,
        );
    }
    (inherited, recreations)
}

/// Replaces a failed instance: a stateful one is recreated (same id, same
/// ordinal, on the same node if it still fits), a stateless one deleted,
/// its replacement inheriting `failures`.
fn replace(
    pass: &mut Pass<'_>,
    spec: &ServiceSpec,
    instance: &Instance,
    failures: Vec<Millis>,
    inherited: &mut VecDeque<Vec<Millis>>,
    recreations: &mut Vec<Create>,
) {
    if spec.stateful {
        pass.cluster.release(instance);
        let mut create = Create::new();
        create.ordinal = instance.ordinal;
        create.replaces = instance.replaces.clone();
        create.failures = failures;
        create.request.prefer = pass.cluster.node_id(&instance.node);
        create.overwrites = true;
        recreations.push(create);
    } else {
        pass.delete(instance);
        inherited.push_back(failures);
    }
}

/// A host port of `instance` that its node's agent reports held by
/// something outside the cluster, if any.
fn held_port(pass: &Pass<'_>, instance: &Instance) -> Option<u16> {
    let slot = pass.cluster.node_named(&instance.node)?;
    instance
        .host_ports
        .values()
        .copied()
        .find(|port| slot.held.contains(port))
}

/// Stops the instances whose move target (drain, rebalancing) now runs.
fn complete_moves<'v>(pass: &mut Pass<'v>, members: &mut Vec<Member<'v>>) {
    let finished: Vec<(&'v Instance, String)> = members
        .iter()
        .filter(|member| member.ready)
        .filter_map(|member| {
            let target = member.instance.replaces.as_deref()?;
            let old = members.iter().find(|other| other.instance.id == target)?;
            Some((old.instance, member.instance.node.clone()))
        })
        .collect();
    for (old, to) in finished {
        pass.stop(old);
        pass.events.push(EventDraft::info(
            format!("instance/{}", old.id),
            format!("moved from {} to {to}; stopping the old instance", old.node),
        ));
        members.retain(|member| member.instance.id != old.id);
    }
}

/// Scale-down and roll order: not ready first, then those on draining
/// nodes, then from the node with the most of `members`, then the busiest
/// node, then the newest id.
///
/// "The node with the most" is the count at the time each one goes:
/// taking one at a time from the fullest node is the order of
/// `Reverse(count - rank)`, where `rank` is the member's place among its
/// node's members in the same class, and every earlier class has already
/// left (so a scale-down keeps the fair share placement made). O(m log m).
fn victim_order(members: &mut [Member<'_>]) {
    // Keys borrow from the instances: a sort calls them O(m log m) times,
    // and cloning ids there was most of a 100,000-instance pass.
    fn class(m: &Member<'_>) -> (bool, bool) {
        (m.ready, !m.draining)
    }
    fn within<'v>(m: &Member<'v>) -> (Reverse<u64>, Reverse<&'v str>) {
        (Reverse(m.load), Reverse(m.instance.id.as_str()))
    }
    members.sort_by(|a, b| {
        (class(a), a.instance.node.as_str(), within(a)).cmp(&(
            class(b),
            b.instance.node.as_str(),
            within(b),
        ))
    });
    let mut left: BTreeMap<&str, usize> = BTreeMap::new();
    for member in members.iter() {
        *left.entry(member.instance.node.as_str()).or_default() += 1;
    }
    let mut keyed: Vec<(usize, Member<'_>)> = Vec::with_capacity(members.len());
    let mut start = 0;
    while start < members.len() {
        let end = start
            + members[start..]
                .iter()
                .take_while(|m| class(m) == class(&members[start]))
                .count();
        let mut rank: BTreeMap<&str, usize> = BTreeMap::new();
        for member in &members[start..end] {
            let node = member.instance.node.as_str();
            let taken = rank.entry(node).or_default();
            let count = left.get(node).copied().unwrap_or(0);
            keyed.push((count.saturating_sub(*taken), *member));
            *taken += 1;
        }
        for (node, taken) in rank {
            if let Some(count) = left.get_mut(node) {
                *count = count.saturating_sub(taken);
            }
        }
        start = end;
    }
    keyed.sort_by(|(count_a, a), (count_b, b)| {
        (class(a), Reverse(*count_a), within(a)).cmp(&(class(b), Reverse(*count_b), within(b)))
    });
    for (slot, (_, member)) in members.iter_mut().zip(keyed) {
        *slot = member;
    }
}

fn stateless<'v>(
    pass: &mut Pass<'v>,
    service: &str,
    spec: &ServiceSpec,
    members: &[Member<'v>],
    inherited: &mut VecDeque<Vec<Millis>>,
) -> Vec<Create> {
    let ids: BTreeSet<&str> = members
        .iter()
        .map(|member| member.instance.id.as_str())
        .collect();
    // A move target whose old instance still counts is surge, not a replica.
    let (surge, counted): (Vec<Member<'v>>, Vec<Member<'v>>) = members.iter().partition(|member| {
        member
            .instance
            .replaces
            .as_deref()
            .is_some_and(|old| ids.contains(old))
    });
    let mut creates = drain_moves(spec, &surge, &counted, inherited);
    let (mut current, mut old): (Vec<Member<'v>>, Vec<Member<'v>>) =
        counted.iter().partition(|member| member.current);
    let desired = spec.replicas as usize;
    // Only a choice of victims needs the order: the steady state skips it.
    if current.len() > desired {
        victim_order(&mut current);
    }
    victim_order(&mut old);
    let (mut max_surge, max_unavailable) = (
        spec.update.max_surge as usize,
        spec.rollout_unavailable() as usize,
    );
    if max_surge == 0 && max_unavailable == 0 {
        max_surge = 1; // otherwise a roll could never make progress
    }
    let ready = counted.iter().filter(|member| member.ready).count();
    let mut can_disrupt = ready.saturating_sub(desired.saturating_sub(max_unavailable));
    let mut stops: Vec<&'v Instance> = Vec::new();
    for member in &old {
        if !member.ready {
            stops.push(member.instance);
        } else if can_disrupt > 0 {
            can_disrupt -= 1;
            stops.push(member.instance);
        }
    }
    let old_left = old.len() - stops.len();
    let extra_current = current.len().saturating_sub(desired);
    stops.extend(
        current
            .iter()
            .take(extra_current)
            .map(|member| member.instance),
    );
    let current_left = current.len() - extra_current;
    let total = counted.len() - stops.len();
    let ceiling = desired + if old_left > 0 { max_surge } else { 0 };
    let to_create = desired
        .saturating_sub(current_left)
        .min(ceiling.saturating_sub(total));
    if !stops.is_empty() {
        let why = if old.is_empty() {
            "scale down"
        } else {
            "rolling update"
        };
        let names: Vec<&str> = stops.iter().map(|instance| instance.id.as_str()).collect();
        pass.events.push(EventDraft::info(
            format!("service/{service}"),
            format!("stopping {} ({why})", names.join(", ")),
        ));
    }
    for instance in stops {
        pass.stop(instance);
    }
    for _ in 0..to_create {
        let mut create = Create::new();
        create.failures = inherited.pop_front().unwrap_or_default();
        creates.push(create);
    }
    creates
}

/// Replacements for instances on draining nodes, started before the old
/// ones stop, at most `budget.max_unavailable` (default 1) moves at a time;
/// a budget of 0 moves nothing, and the node keeps draining.
fn drain_moves(
    spec: &ServiceSpec,
    surge: &[Member<'_>],
    counted: &[Member<'_>],
    inherited: &mut VecDeque<Vec<Millis>>,
) -> Vec<Create> {
    let budget = spec.voluntary_moves() as usize;
    let moving: BTreeSet<&str> = surge
        .iter()
        .filter_map(|member| member.instance.replaces.as_deref())
        .collect();
    let mut in_flight = moving.len();
    let mut creates = Vec::new();
    for member in counted.iter().filter(|member| member.draining) {
        if moving.contains(member.instance.id.as_str()) {
            continue;
        }
        if in_flight >= budget {
            break;
        }
        in_flight += 1;
        let mut create = Create::new();
        create.replaces = Some(member.instance.id.clone());
        create.failures = inherited.pop_front().unwrap_or_default();
        creates.push(create);
    }
    creates
}

fn stateful<'v>(
    pass: &mut Pass<'v>,
    service: &str,
    spec: &ServiceSpec,
    members: &[Member<'v>],
    lingering: &BTreeSet<&str>,
    recreations: &[Create],
) -> Vec<Create> {
    let desired = spec.replicas;
    let ordinal_of = |member: &Member<'_>| member.instance.ordinal;
    let recreating: BTreeSet<u32> = recreations
        .iter()
        .filter_map(|create| create.ordinal)
        .collect();
    let present = |ordinal: u32| {
        recreating.contains(&ordinal) || members.iter().any(|m| ordinal_of(m) == Some(ordinal))
    };
    let complete = (0..desired).all(present)
        && recreating.is_empty()
        && members.iter().all(|member| member.ready);
    // A budget of 0 keeps every ordinal on its draining node.
    let may_move = spec.voluntary_moves() > 0;
    if lingering.is_empty()
        && let Some(victim) = stateful_victim(members, desired, complete, may_move)
    {
        pass.stop(victim.instance);
        pass.events.push(EventDraft::info(
            format!("service/{service}"),
            format!("stopping {} (ordered teardown)", victim.instance.id),
        ));
    }
    // Ordered start: the lowest missing ordinal, once the one below runs.
    let missing = (0..desired).find(|ordinal| !present(*ordinal));
    let Some(ordinal) = missing else {
        return Vec::new();
    };
    let below_runs = ordinal == 0
        || members
            .iter()
            .any(|member| ordinal_of(member) == Some(ordinal - 1) && member.ready);
    let id = super::ids::stateful_id(service, ordinal);
    if !below_runs || lingering.contains(id.as_str()) {
        return Vec::new();
    }
    let mut create = Create::new();
    create.ordinal = Some(ordinal);
    vec![create]
}

/// The one instance a stateful service stops next, if any: a stray without
/// ordinal, else the highest ordinal beyond the replicas, else (when every
/// ordinal runs) the highest one on a draining node if the budget lets it
/// move, else the highest one running an old spec.
fn stateful_victim<'a, 'v>(
    members: &'a [Member<'v>],
    desired: u32,
    complete: bool,
    may_move: bool,
) -> Option<&'a Member<'v>> {
    let highest = |keep: &dyn Fn(&Member<'_>) -> bool| {
        members
            .iter()
            .filter(|member| keep(member))
            .max_by_key(|member| member.instance.ordinal)
    };
    let stray = members
        .iter()
        .find(|member| member.instance.ordinal.is_none());
    stray
        .or_else(|| highest(&|member| member.instance.ordinal.is_some_and(|o| o >= desired)))
        .or_else(|| {
            (complete && may_move)
                .then(|| highest(&|member| member.draining))
                .flatten()
        })
        .or_else(|| {
            complete
                .then(|| highest(&|member| !member.current))
                .flatten()
        })
}
