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

/// Specs of older versions some service runs this pass, by service, with
/// its current service-wide fields: built before the pass, which borrows
/// its targets from here and from the view.
#[derive(Debug, Default)]
pub(crate) struct OlderSpecs(BTreeMap<String, (String, ServiceSpec)>);

impl OlderSpecs {
    /// The older versions `view`'s rollouts and pauses choose.
    pub(crate) fn of(view: &View) -> OlderSpecs {
        let mut older = BTreeMap::new();
        for (name, spec) in view.services.iter() {
            let current = spec_hash(&spec.value);
            let Some(hash) = chosen_version(view, name, &current) else {
                continue;
            };
            if hash == current {
                continue;
            }
            let kept = view
                .versions
                .get(name)
                .and_then(|versions| versions.get(&hash));
            if let Some(version) = kept {
                let mut run = version.spec.clone();
                run.replicas = spec.replicas;
                run.update = spec.update.clone();
                run.budget = spec.budget.clone();
                run.autoscale = spec.autoscale.clone();
                run.scale_to_zero = spec.scale_to_zero;
                older.insert(name.clone(), (hash, run));
            }
        }
        OlderSpecs(older)
    }
}

/// Every service's target this pass.
pub(crate) fn targets<'v>(view: &'v View, older: &'v OlderSpecs) -> Targets<'v> {
    view.services
        .iter()
        .map(|(name, spec)| {
            let held = is_paused(view, name);
            let target = match older.0.get(name) {
                Some((hash, run)) => Target {
                    spec: run,
                    hash: hash.clone(),
                    held,
                },
                None => Target {
                    spec: &spec.value,
                    hash: spec_hash(&spec.value),
                    held,
                },
            };
            (name.as_str(), target)
        })
        .collect()
}

fn is_paused(view: &View, service: &str) -> bool {
    view.rollout_controls
        .get(service)
        .is_some_and(|control| control.paused)
}

/// The version the rollout (or a pause) chooses for `service`, whose spec
/// is at version `current`; `None` leaves the spec's.
fn chosen_version(view: &View, service: &str, current: &str) -> Option<String> {
    if is_paused(view, service) {
        return most_run(view, service);
    }
    let rollout = view.rollouts.get(service)?;
    (rollout.requested == current).then(|| rollout.target.clone())
}

/// The version most of the service's instances run (ties: the smallest
/// hash, so every pass picks the same), stopping ones left out.
fn most_run(view: &View, service: &str) -> Option<String> {
    view.versions_running(service)
        .into_iter()
        .max_by(|(hash_a, a), (hash_b, b)| a.cmp(b).then_with(|| hash_b.cmp(hash_a)))
        .map(|(hash, _)| hash.to_owned())
}
