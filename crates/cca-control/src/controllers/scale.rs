//! The scale controller: puts a service with `scale_to_zero = W` to sleep
//! (`derived/scale/{service}`, `asleep`) once no gate forwarded a request
//! to it for `W`, and the scheduler then runs none of its instances.
//!
//! The last activity is the latest of every gate node's report
//! (`observed/gate-activity/{node}`) and the start of the current awake
//! spell (`since`): when `scale_to_zero` was set or the service created —
//! the controller then writes an awake fact, so a new service gets a full
//! window — or its last wake. Waking is the API's wake route's job (a gate
//! holding a request calls it, and it writes the fact itself, at once);
//! this controller also wakes a sleeping service a gate reports a request
//! to after it fell asleep, in case a wake call was lost. Removing
//! `scale_to_zero` (or the service) deletes the fact: awake for good.
//!
//! Gate nodes report at most every 10 s, so the activity it sees may be
//! that much old: a window shorter than that may put a busy service to
//! sleep.

use cca_model::cluster::Millis;
use cca_model::scale::{ScaleCause, ScaleState};
use cca_model::{Kind, keys};

use crate::controller::{Context, Controller, EventDraft, Plan, Write};
use crate::view::View;

/// Writes `derived/scale/{svc}`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ScaleController;

impl Controller for ScaleController {
    fn name(&self) -> &'static str {
        "scale"
    }

    /// Its own kind too: the wake route writes it, and a wake starts a
    /// new window to time.
    fn interests(&self) -> &'static [Kind] {
        &[Kind::Service, Kind::Scale, Kind::GateActivity]
    }

    fn reconcile(&self, view: &View, context: &Context) -> Plan {
        let mut plan = Plan::default();
        let now = context.now;
        for (name, spec) in view.services.iter() {
            let Some(window) = spec.scale_to_zero else {
                continue;
            };
            let window = i64::try_from(window.0).unwrap_or(i64::MAX);
            let key = keys::derived_scale(name);
            let Some(state) = view.scale.get(name) else {
                plan.writes.push(Write::put_json(
                    key,
                    &ScaleState {
                        asleep: false,
                        since: now,
                        cause: ScaleCause::Enabled,
                    },
                ));
                plan.requeue(window);
                continue;
            };
            let latest = latest_request(view, name);
            if state.asleep {
                if let Some((node, at)) = latest.filter(|(_, at)| *at > state.since) {
                    plan.writes.push(Write::put_json(
                        key,
                        &ScaleState {
                            asleep: false,
                            since: now,
                            cause: ScaleCause::Woken { node: node.clone() },
                        },
                    ));
                    plan.events.push(EventDraft::info(
                        format!("service/{name}"),
                        format!(
                            "woken: gate node {node} reported a request at {at}, after it fell \
                             asleep"
                        ),
                    ));
                    plan.requeue(window);
                }
                continue;
            }
            let last = latest.map_or(state.since, |(_, at)| at.max(state.since));
            let deadline = last.saturating_add(window);
            if now < deadline {
                plan.requeue(deadline - now);
                continue;
            }
            plan.writes.push(Write::put_json(
                key,
                &ScaleState {
                    asleep: true,
                    since: now,
                    cause: ScaleCause::Idle {
                        window,
                        last_activity: last,
                    },
                },
            ));
            // Decided on every report and on the spec's window: a report
            // or an apply landing meanwhile makes the commit fail and the
            // next pass decide again.
            plan.guards.push(keys::desired_service(name));
            plan.guards.extend(
                view.gate_activity
                    .keys()
                    .map(|node| keys::observed_gate_activity(node)),
            );
            plan.events.push(EventDraft::info(
                format!("service/{name}"),
                format!(
                    "asleep: no request through a gate for {}s (last at {last}); its instances \
                     stop until a request wakes it",
                    window / 1000
                ),
            ));
        }
        for (name, state) in view.scale.iter() {
            let enabled = view
                .services
                .get(name)
                .is_some_and(|spec| spec.scale_to_zero.is_some());
            if enabled {
                continue;
            }
            plan.writes.push(Write::delete(keys::derived_scale(name)));
            if state.asleep && view.services.contains_key(name) {
                plan.events.push(EventDraft::info(
                    format!("service/{name}"),
                    "awake for good: scale_to_zero removed",
                ));
            }
        }
        plan
    }
}

/// The gate node that last forwarded a request to `service`, and when.
fn latest_request<'v>(view: &'v View, service: &str) -> Option<(&'v String, Millis)> {
    view.gate_activity
        .iter()
        .filter_map(|(node, report)| Some((node, *report.services.get(service)?)))
        .max_by_key(|(_, at)| *at)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use cca_model::scale::GateActivity;
    use cca_model::spec::{Duration, ServiceSpec};

    use super::*;
    use crate::controllers::fixtures::{ViewBuilder, context, service};

    const WINDOW: Millis = 60_000;

    fn sleepy() -> ServiceSpec {
        let mut spec = service("web", 2);
        spec.scale_to_zero = Some(Duration(WINDOW as u64));
        spec
    }

    fn activity(services: &[(&str, Millis)]) -> GateActivity {
        GateActivity {
            services: services
                .iter()
                .map(|(name, at)| ((*name).to_owned(), *at))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    fn reconcile(view: &View, now: Millis) -> Plan {
        ScaleController.reconcile(view, &context(now))
    }

    /// Runs passes at each of `times`, applying each plan, and returns
    /// the view after them.
    fn run(mut builder: ViewBuilder, times: &[Millis]) -> View {
        for &now in times {
            let plan = reconcile(&builder.clone().build(), now);
            builder = builder.apply(&plan);
        }
        builder.build()
    }

    fn state(view: &View) -> Option<ScaleState> {
        view.scale.get("web").map(|held| (*held.value).clone())
    }

    #[test]
    fn a_new_service_gets_a_full_window_then_sleeps() {
        let builder = ViewBuilder::new().service(sleepy());
        let view = run(builder.clone(), &[1_000]);
        assert_eq!(
            state(&view),
            Some(ScaleState {
                asleep: false,
                since: 1_000,
                cause: ScaleCause::Enabled
            })
        );
        let before = reconcile(&view, 1_000 + WINDOW - 1);
        assert!(before.writes.is_empty(), "not before the window ends");
        assert_eq!(before.requeue_after, Some(1));
        let view = run(builder, &[1_000, 1_000 + WINDOW]);
        let asleep = state(&view).expect("a fact");
        assert!(asleep.asleep);
        assert_eq!(
            asleep.cause,
            ScaleCause::Idle {
                window: WINDOW,
                last_activity: 1_000
            }
        );
        assert!(view.is_asleep("web"));
        assert!(
            reconcile(&view, 10 * WINDOW).is_noop(),
            "converged: asleep stays asleep"
        );
    }

    #[test]
    fn activity_from_any_gate_node_keeps_it_awake() {
        let awake = ViewBuilder::new()
            .service(sleepy())
            .put(
                &keys::derived_scale("web"),
                &ScaleState {
                    asleep: false,
                    since: 0,
                    cause: ScaleCause::Enabled,
                },
            )
            .put(
                &keys::observed_gate_activity("g1"),
                &activity(&[("web", 10_000), ("other", 90_000)]),
            )
            .put(
                &keys::observed_gate_activity("g2"),
                &activity(&[("web", 30_000)]),
            );
        let view = awake.clone().build();
        let plan = reconcile(&view, 30_000 + WINDOW - 5);
        assert!(plan.writes.is_empty(), "g2's request holds it: {plan:?}");
        assert_eq!(plan.requeue_after, Some(5));
        let plan = reconcile(&view, 30_000 + WINDOW);
        let slept = awake.apply(&plan).build();
        assert_eq!(
            state(&slept).map(|state| state.cause),
            Some(ScaleCause::Idle {
                window: WINDOW,
                last_activity: 30_000
            }),
            "another service's traffic does not count"
        );
        assert!(
            plan.guards.contains(&keys::observed_gate_activity("g1"))
                && plan.guards.contains(&keys::observed_gate_activity("g2")),
            "a report landing meanwhile makes the decision again"
        );
    }

    #[test]
    fn a_request_after_it_fell_asleep_wakes_it_and_old_ones_do_not() {
        let asleep = ScaleState {
            asleep: true,
            since: 100_000,
            cause: ScaleCause::Idle {
                window: WINDOW,
                last_activity: 40_000,
            },
        };
        let builder = ViewBuilder::new()
            .service(sleepy())
            .put(&keys::derived_scale("web"), &asleep)
            .put(
                &keys::observed_gate_activity("g1"),
                &activity(&[("web", 40_000)]),
            );
        assert!(reconcile(&builder.clone().build(), 200_000).is_noop());
        let late = builder.put(
            &keys::observed_gate_activity("g2"),
            &activity(&[("web", 150_000)]),
        );
        let view = run(late, &[200_000]);
        assert_eq!(
            state(&view),
            Some(ScaleState {
                asleep: false,
                since: 200_000,
                cause: ScaleCause::Woken { node: "g2".into() }
            })
        );
        // The wake starts a new window, which the old report does not hold.
        let plan = reconcile(&view, 200_000 + WINDOW - 1);
        assert_eq!(plan.requeue_after, Some(1));
    }

    #[test]
    fn removing_scale_to_zero_wakes_it_for_good() {
        let asleep = ScaleState {
            asleep: true,
            since: 5,
            cause: ScaleCause::Idle {
                window: WINDOW,
                last_activity: 1,
            },
        };
        let builder = ViewBuilder::new()
            .service(service("web", 2))
            .put(&keys::derived_scale("web"), &asleep);
        assert!(!builder.clone().build().is_asleep("web"));
        let plan = reconcile(&builder.clone().build(), 10);
        assert_eq!(plan.writes, vec![Write::delete(keys::derived_scale("web"))]);
        assert_eq!(plan.events.len(), 1);
        let view = builder.apply(&plan).build();
        assert!(state(&view).is_none());
        assert!(reconcile(&view, 10 * WINDOW).is_noop());
        // A deleted service's fact goes too, without an event.
        let gone = ViewBuilder::new().put(&keys::derived_scale("web"), &asleep);
        let plan = reconcile(&gone.build(), 10);
        assert_eq!(plan.writes, vec![Write::delete(keys::derived_scale("web"))]);
        assert!(plan.events.is_empty());
    }
}
