//! Which version of each service this pass places and rolls to: its
//! spec's, unless the lifecycle controller's rollout (`derived/rollout`)
//! names an older one (an undo or an automatic rollback). A rollout that
//! answers another version than the spec's is out of date — an apply just
//! changed it — and the spec wins at once, so a new version never waits
//! for a controller pass.
//!
//! An older version runs with the service-wide fields of the current spec
//! (replicas, rollout, budget, autoscaling, scale to zero): those are not
//! part of a version, and an apply of them must act even while a rollback
//! holds.
//!
//! A service with horizontal `autoscale` runs the replicas the lifecycle
//! controller decided (`derived/autoscale`), not its spec's.
//!
//! A paused rollout (`cca rollout pause`) holds: instances of every version
//! count as current, so none is stopped to roll on, and what is created
//! (scale up, replacements) runs the version most instances run.

use std::collections::BTreeMap;

use cca_model::spec::{ServiceSpec, spec_hash};

use crate::view::View;

/// The version a pass places for one service.
#[derive(Clone, Debug)]
pub(crate) struct Target<'v> {
    pub(crate) spec: &'v ServiceSpec,
    pub(crate) hash: String,
    /// Paused: no instance is stopped or created to roll on.
    pub(crate) held: bool,
}

/// Every service's target, by name.
pub(crate) type Targets<'v> = BTreeMap<&'v str, Target<'v>>;

/// The version each service places this pass and, for those whose run
/// differs from their stored spec — an older version, or replicas the
/// autoscaler set — the spec to run, with the current service-wide fields:
/// built before the pass, which borrows its targets from here and from the
/// view. Each spec is hashed once.
#[derive(Debug, Default)]
pub(crate) struct Placed {
    hashes: BTreeMap<String, String>,
    run: BTreeMap<String, ServiceSpec>,
}

impl Placed {
    /// What `view`'s specs, rollouts, pauses and autoscaling choose.
    pub(crate) fn of(view: &View) -> Placed {
        let mut placed = Placed::default();
        for (name, spec) in view.services.iter() {
            let current = spec_hash(&spec.value);
            let hash = view.placed_version_at(name, current.clone());
            let older = view
                .versions
                .get(name)
                .and_then(|versions| versions.get(&hash))
                .filter(|_| hash != current);
            let replicas = view.wanted_replicas(name).unwrap_or(spec.replicas);
            if older.is_some() || replicas != spec.replicas {
                let mut run = older.map_or_else(|| (*spec.value).clone(), |v| v.spec.clone());
                run.replicas = replicas;
                run.update = spec.update.clone();
                run.budget = spec.budget.clone();
                run.autoscale = spec.autoscale.clone();
                run.scale_to_zero = spec.scale_to_zero;
                placed.run.insert(name.clone(), run);
            }
            placed.hashes.insert(name.clone(), hash);
        }
        placed
    }
}

/// Every service's target this pass.
pub(crate) fn targets<'v>(view: &'v View, placed: &'v Placed) -> Targets<'v> {
    view.services
        .iter()
        .filter_map(|(name, spec)| {
            let target = Target {
                spec: placed.run.get(name).unwrap_or(&spec.value),
                hash: placed.hashes.get(name)?.clone(),
                held: view
                    .rollout_controls
                    .get(name)
                    .is_some_and(|control| control.paused),
            };
            Some((name.as_str(), target))
        })
        .collect()
}
