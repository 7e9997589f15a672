//! The lifecycle controller: the one reconciler of a service's automatic
//! decisions, so they never fight. It owns `derived/rollout/{service}`:
//! which version the scheduler rolls the service to, started by an apply
//! or an undo, ended when every instance runs it and is ready, or rolled
//! back by itself when `update.rollback_after` new instances failed
//! ([`rollout`]).
//!
//! Its work splits by service: a pass after a few changes looks at the
//! services they touch alone.

mod rollout;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;

use cca_model::{Kind, keys};

use crate::controller::{Changes, Context, Controller, Plan, Write};
use crate::view::View;

/// Writes `derived/rollout/{svc}`.
#[derive(Clone, Copy, Debug, Default)]
pub struct LifecycleController;

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
        ]
    }

    fn reconcile(&self, view: &View, context: &Context) -> Plan {
        let mut services: BTreeSet<&str> = view.services.keys().map(String::as_str).collect();
        services.extend(view.rollouts.keys().map(String::as_str));
        plan_services(view, context, services)
    }

    fn reconcile_changes(&self, view: &View, context: &Context, changes: &Changes) -> Plan {
        match changes {
            Changes::Facts(facts) => match super::services_touched(view, facts) {
                Some(services) => plan_services(view, context, services.iter().map(String::as_str)),
                None => self.reconcile(view, context),
            },
            Changes::Everything => self.reconcile(view, context),
        }
    }
}

fn plan_services<'a>(
    view: &View,
    context: &Context,
    services: impl IntoIterator<Item = &'a str>,
) -> Plan {
    let mut plan = Plan::default();
    for service in services {
        plan_service(view, context, service, &mut plan);
    }
    plan
}

/// The rollout of one service, written only when it differs from the
/// view's; deleted with the service.
fn plan_service(view: &View, context: &Context, service: &str, plan: &mut Plan) {
    let key = keys::derived_rollout(service);
    let held = view.rollouts.get(service).map(|held| &*held.value);
    let Some(spec) = view.services.get(service) else {
        if held.is_some() {
            plan.writes.push(Write::delete(key));
        }
        return;
    };
    let rollout = rollout::decide(view, service, &spec.value, context.now, &mut plan.events);
    if held != Some(&rollout) {
        plan.writes.push(Write::put_json(key, &rollout));
    }
}
