//! The node controller: derives each node's condition from its heartbeat.
//! A node is `ready` while its leased heartbeat key exists and
//! `unreachable` (with the time it became so) once the lease has expired.
//! The scheduler reads the condition to stop placing on the node and, after
//! a grace period, to replace what ran there.

use cca_model::cluster::{NodeCondition, NodeStatus};
use cca_model::{Kind, keys};

use crate::controller::{Context, Controller, EventDraft, Plan, Write};
use crate::view::View;

/// Writes `derived/node/{node}`; see the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeController;

impl Controller for NodeController {
    fn name(&self) -> &'static str {
        "node"
    }

    fn interests(&self) -> &'static [Kind] {
        &[Kind::Node, Kind::Heartbeat, Kind::NodeStatus]
    }

    fn reconcile(&self, view: &View, context: &Context) -> Plan {
        let mut plan = Plan::default();
        for (name, _) in view.nodes.iter() {
            let condition = if view.heartbeats.contains_key(name) {
                NodeCondition::Ready
            } else {
                NodeCondition::Unreachable
            };
            let held = view.node_statuses.get(name).map(|status| status.condition);
            if held == Some(condition) {
                continue;
            }
            let status = NodeStatus {
                condition,
                since: context.now,
            };
            plan.writes
                .push(Write::put_json(keys::derived_node(name), &status));
            plan.events.push(transition_event(name, held, condition));
        }
        // A node an operator removed leaves no condition behind.
        for (name, _) in view.node_statuses.iter() {
            if !view.nodes.contains_key(name) {
                plan.writes.push(Write::delete(keys::derived_node(name)));
            }
        }
        plan
    }
}

fn transition_event(name: &str, from: Option<NodeCondition>, to: NodeCondition) -> EventDraft {
    let subject = format!("node/{name}");
    match (from, to) {
        (None, NodeCondition::Ready) => EventDraft::info(subject, "node is ready"),
        (Some(_), NodeCondition::Ready) => {
            EventDraft::info(subject, "node is ready again: heartbeat resumed")
        }
        (_, NodeCondition::Unreachable) => {
            EventDraft::warning(subject, "node is unreachable: its heartbeat lease expired")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::fixtures::{ViewBuilder, context, node_info};

    fn check(
        case: &str,
        view: &View,
        now: i64,
        expected: &[(&str, Option<NodeCondition>)],
        events: usize,
    ) {
        let plan = NodeController.reconcile(view, &context(now));
        let got: Vec<(String, Option<NodeCondition>)> = plan
            .writes
            .iter()
            .map(|write| match write {
                Write::Put { key, value } => {
                    let status: NodeStatus = serde_json::from_slice(value).expect("decodes");
                    assert_eq!(status.since, now, "since is the transition time");
                    (key.clone(), Some(status.condition))
                }
                Write::Delete { key } => (key.clone(), None),
            })
            .collect();
        let expected: Vec<(String, Option<NodeCondition>)> = expected
            .iter()
            .map(|(node, condition)| (keys::derived_node(node), *condition))
            .collect();
        assert_eq!(got, expected, "{case}");
        assert_eq!(plan.events.len(), events, "{case}");
    }

    #[test]
    fn transitions_follow_the_heartbeat() {
        let ready = NodeStatus {
            condition: NodeCondition::Ready,
            since: 1,
        };
        let unreachable = NodeStatus {
            condition: NodeCondition::Unreachable,
            since: 1,
        };
        type Case = (
            &'static str,
            View,
            Vec<(&'static str, Option<NodeCondition>)>,
        );
        let cases: Vec<Case> = vec![
            (
                "new node with heartbeat becomes ready",
                ViewBuilder::new()
                    .node_info(node_info("n1", 1000, 1024))
                    .heartbeat("n1")
                    .build(),
                vec![("n1", Some(NodeCondition::Ready))],
            ),
            (
                "node without heartbeat is unreachable",
                ViewBuilder::new()
                    .node_info(node_info("n1", 1000, 1024))
                    .build(),
                vec![("n1", Some(NodeCondition::Unreachable))],
            ),
            (
                "ready node that lost its heartbeat",
                ViewBuilder::new()
                    .node_info(node_info("n1", 1000, 1024))
                    .node_status("n1", &ready)
                    .build(),
                vec![("n1", Some(NodeCondition::Unreachable))],
            ),
            (
                "unreachable node whose heartbeat is back",
                ViewBuilder::new()
                    .node_info(node_info("n1", 1000, 1024))
                    .heartbeat("n1")
                    .node_status("n1", &unreachable)
                    .build(),
                vec![("n1", Some(NodeCondition::Ready))],
            ),
            (
                "removed node loses its condition",
                ViewBuilder::new().node_status("gone", &ready).build(),
                vec![("gone", None)],
            ),
        ];
        for (name, view, expected) in cases {
            let events = expected.iter().filter(|(_, c)| c.is_some()).count();
            check(name, &view, 5_000, &expected, events);
        }
    }

    #[test]
    fn converged_nodes_yield_an_empty_plan() {
        let view = ViewBuilder::new().node("n1", 1000, 1024).build();
        assert!(NodeController.reconcile(&view, &context(9_000)).is_noop());
    }
}
