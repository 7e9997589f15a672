//! Reactive rebalancing: when a pass changes no instance (the cluster is
//! quiet) and no move is in flight, up to `max_moves` instances leave
//! nodes allocated above the pressure line for nodes that stay under it
//! after the move, one per source node, busiest node first. A move is a
//! surge: the new instance starts first (`replaces` names the old one) and
//! the old one stops once the new one runs. Only stateless instances that
//! run the current spec and are ready move, through the same feasibility
//! and scoring as any placement, so `restrict` and hints hold; a service
//! whose disruption budget is 0 never moves.

use std::cmp::Reverse;

use cca_model::cluster::Instance;

use super::cluster::Liveness;
use super::index::Fit;
use super::pass::{Create, Pass, Placement};
use super::scoring::{Placer, Request};
use super::target::Targets;
use crate::controller::EventDraft;

/// Starts up to `config.max_moves` moves; see the module documentation.
pub(crate) fn rebalance<'v>(pass: &mut Pass<'v>, services: &Targets<'v>) {
    if move_in_flight(pass) {
        return;
    }
    let line = pass.cluster.pressure_line();
    let mut sources: Vec<(Reverse<u64>, u32)> = pass
        .cluster
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, slot)| slot.liveness == Liveness::Ready && slot.load() > line)
        .map(|(id, slot)| (Reverse(slot.load()), id as u32))
        .collect();
    sources.sort();
    let mut moves = 0;
    for (_, source) in sources {
        if moves >= pass.config.max_moves {
            break;
        }
        if move_one(pass, services, source) {
            moves += 1;
        }
    }
}

/// True while some instance still waits for its replacement to run.
fn move_in_flight(pass: &Pass<'_>) -> bool {
    pass.view.instances.iter().any(|(_, instance)| {
        instance.replaces.as_deref().is_some_and(|old| {
            pass.view
                .instances
                .get(old)
                .is_some_and(|old| !old.stopping)
        })
    })
}

fn move_one<'v>(pass: &mut Pass<'v>, services: &Targets<'v>, source: u32) -> bool {
    let source_name = pass.cluster.node(source).info.name.clone();
    let mut candidates: Vec<&'v Instance> = pass
        .view
        .instances
        .iter()
        .map(|(_, instance)| &*instance.value)
        .filter(|instance| instance.node == source_name && !instance.stopping)
        .filter(|instance| {
            services
                .get(instance.service.as_str())
                .is_some_and(|target| {
                    let spec = target.spec;
                    !spec.stateful
                        && spec.voluntary_moves() > 0
                        && instance.spec_hash == target.hash
                })
        })
        .filter(|instance| pass.view.is_ready(instance))
        .collect();
    // The biggest instance relieves the node most.
    candidates.sort_by_key(|instance| {
        (
            Reverse(instance.cpu),
            Reverse(instance.memory),
            &instance.id,
        )
    });
    for instance in candidates {
        let Some((name, target)) = services.get_key_value(instance.service.as_str()) else {
            continue;
        };
        let sized = pass.view.sized_resources(name);
        let mut placer = Placer::new(&mut pass.cluster, name, target.spec, sized);
        let request = Request {
            prefer: None,
            avoid: Some(source),
            fit: Fit::UnderPressureLine,
        };
        if placer.choose(&mut pass.cluster, request).is_none() {
            continue;
        }
        let mut create = Create::new();
        create.replaces = Some(instance.id.clone());
        create.request = request;
        if pass.place(&mut placer, target.spec, &target.hash, create) == Placement::Placed {
            pass.guard_service(name);
            pass.events.push(EventDraft::info(
                format!("instance/{}", instance.id),
                format!(
                    "rebalancing: node {source_name} is allocated above {}%; starting a replacement elsewhere",
                    pass.cluster.pressure_line()
                ),
            ));
            return true;
        }
    }
    false
}
