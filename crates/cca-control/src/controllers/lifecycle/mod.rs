//! The lifecycle controller: the one reconciler of a service's automatic
//! decisions, so they never fight. It owns `derived/rollout/{service}`:
//! which version the scheduler rolls the service to, started by an apply
//! or an undo, ended when every instance runs it and is ready, or rolled
//! back by itself when `update.rollback_after` new instances failed
//! ([`rollout`]); and `derived/autoscale/{service}`: the replicas a service
//! with horizontal `autoscale` runs at, decided after the rollout and held
//! while one progresses ([`horizontal`]); and `derived/vertical/{service}`:
//! the usage window and recommended sizes of a service with vertical
//! autoscaling ([`vertical`]).
//!
//! Its work splits by service: a pass after a few changes looks at the
//! services they touch alone; a usage report touches the autoscaled ones.

pub mod horizontal;
#[cfg(test)]
mod horizontal_tests;
mod rollout;
#[cfg(test)]
mod tests;
pub mod vertical;
#[cfg(test)]
mod vertical_tests;

use std::collections::BTreeSet;
use std::time::Duration;

use cca_model::clock::span_millis;
use cca_model::{Kind, keys};

use crate::controller::{Changes, Context, Controller, Plan, Write};
use crate::view::View;

/// The lifecycle controller's tunables; `Default` gives the documented
/// values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LifecycleConfig {
    /// How long a higher recommendation holds an autoscaled service's
    /// scale-down back (5 min).
    pub scale_down_window: Duration,
    /// The usage window vertical recommendations look at (1 h).
    pub vertical_window: Duration,
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        LifecycleConfig {
            scale_down_window: Duration::from_millis(
                u64::try_from(cca_model::autoscale::SCALE_DOWN_WINDOW).unwrap_or(300_000),
            ),
            vertical_window: Duration::from_millis(
                u64::try_from(cca_model::vertical::VERTICAL_WINDOW).unwrap_or(3_600_000),
            ),
        }
    }
}

/// Writes `derived/rollout/{svc}`, `derived/autoscale/{svc}` and
/// `derived/vertical/{svc}`.
#[derive(Clone, Debug, Default)]
pub struct LifecycleController {
    pub config: LifecycleConfig,
}

impl Controller for LifecycleController {
    fn name(&self) -> &'static str {
        "lifecycle"
    }

    /// Its own rollouts are left out: each pass sees its previous commit.
    fn interests(&self) -> &'static [Kind] {
        &[
            Kind::Service,
            Kind::ServiceVersion,
            Kind::RolloutControl,
            Kind::Instance,
            Kind::InstanceStatus,
            Kind::Scale,
            Kind::Usage,
        ]
    }

    fn reconcile(&self, view: &View, context: &Context) -> Plan {
        let mut services: BTreeSet<&str> = view.services.keys().map(String::as_str).collect();
        services.extend(view.rollouts.keys().map(String::as_str));
        services.extend(view.autoscaled.keys().map(String::as_str));
        services.extend(view.vertical.keys().map(String::as_str));
        plan_services(self, view, context, services)
    }

    fn reconcile_changes(&self, view: &View, context: &Context, changes: &Changes) -> Plan {
        match changes {
            Changes::Facts(facts) => {
                let (usage, others): (Vec<_>, Vec<_>) = facts
                    .iter()
                    .cloned()
                    .partition(|fact| fact.kind() == Kind::Usage);
                let Some(mut services) = super::services_touched(view, &others) else {
                    return self.reconcile(view, context);
                };
                if !usage.is_empty() {
                    services.extend(autoscaled(view).map(str::to_owned));
                }
                plan_services(self, view, context, services.iter().map(String::as_str))
            }
            Changes::Everything => self.reconcile(view, context),
        }
    }
}

fn plan_services<'a>(
    controller: &LifecycleController,
    view: &View,
    context: &Context,
    services: impl IntoIterator<Item = &'a str>,
) -> Plan {
    let decision = horizontal::Decision {
        now: context.now,
        window: span_millis(controller.config.scale_down_window),
        vertical_window: span_millis(controller.config.vertical_window),
    };
    let mut plan = Plan::default();
    for service in services {
        plan_service(view, &decision, service, &mut plan);
    }
    plan
}

/// The services with `autoscale`: the ones a usage report may move.
fn autoscaled(view: &View) -> impl Iterator<Item = &str> {
    view.services
        .iter()
        .filter(|(_, spec)| spec.autoscale.is_some())
        .map(|(name, _)| name.as_str())
        .chain(view.autoscaled.keys().map(String::as_str))
        .chain(view.vertical.keys().map(String::as_str))
}

/// The rollout and the autoscaled count of one service, each written only
/// when it differs from the view's; deleted with the service (the count
/// also with its `autoscale`).
fn plan_service(view: &View, decision: &horizontal::Decision, service: &str, plan: &mut Plan) {
    let rollout_key = keys::derived_rollout(service);
    let autoscale_key = keys::derived_autoscale(service);
    let held_rollout = view.rollouts.get(service).map(|held| &*held.value);
    let held_count = view.autoscaled.get(service).map(|held| &*held.value);
    let held_sizes = view.vertical.get(service).map(|held| &*held.value);
    let Some(spec) = view.services.get(service) else {
        if held_rollout.is_some() {
            plan.writes.push(Write::delete(rollout_key));
        }
        if held_count.is_some() {
            plan.writes.push(Write::delete(autoscale_key));
        }
        if held_sizes.is_some() {
            plan.writes
                .push(Write::delete(keys::derived_vertical(service)));
        }
        return;
    };
    let now = decision.now;
    let rollout = rollout::decide(view, service, &spec.value, now, &mut plan.events);
    let count = horizontal::decide(
        view,
        service,
        &spec.value,
        &rollout,
        decision,
        &mut plan.events,
    );
    if held_rollout != Some(&rollout) {
        plan.writes.push(Write::put_json(rollout_key, &rollout));
    }
    match count {
        Some((count, wake)) => {
            if let Some(at) = wake.filter(|at| *at > now) {
                plan.requeue(at - now);
            }
            if held_count != Some(&count) {
                plan.writes.push(Write::put_json(autoscale_key, &count));
            }
        }
        None if held_count.is_some() => plan.writes.push(Write::delete(autoscale_key)),
        None => {}
    }
    let sizes = vertical::decide(
        view,
        service,
        &spec.value,
        &rollout,
        (now, decision.vertical_window),
        &mut plan.events,
    );
    let vertical_key = keys::derived_vertical(service);
    match sizes {
        Some((sizes, wake)) => {
            if let Some(at) = wake.filter(|at| *at > now) {
                plan.requeue(at - now);
            }
            if held_sizes != Some(&sizes) {
                plan.writes.push(Write::put_json(vertical_key, &sizes));
            }
        }
        None if held_sizes.is_some() => plan.writes.push(Write::delete(vertical_key)),
        None => {}
    }
}
