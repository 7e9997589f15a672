//! The node controller: derives each node's condition from its heartbeat.
//! A node is `ready` while its leased heartbeat key exists and
//! `unreachable` (with the time it became so) once the lease has expired.
//! The scheduler reads the condition to stop placing on the node and, after
//! a grace period, to replace what ran there.
//!
//! It also judges whether lost leases can be trusted (`derived/disruption`).
//! One node missing its lease is a node problem. Many nodes missing theirs
//! within one lease TTL is far likelier a problem of the control plane
//! itself — a stalled store, a frozen or overloaded server, a network
//! partition — and replacing their instances would pile more work on the
//! sick part and start duplicates of workloads that are still running. So
//! when more than [`DisruptionConfig::max_missing_percent`] of the
//! registered nodes (or more than [`DisruptionConfig::max_missing_nodes`])
//! missed their leases within one TTL, and at least [`MIN_MISSING`] did,
//! the controller pauses lost-node replacement: nodes are still marked
//! unreachable, nothing of theirs is replaced. The pause ends when enough
//! of them heartbeat again, when an operator says they are gone
//! (`desired/replacement-resume`), or — the safeguard — once no further
//! node went missing for [`DisruptionConfig::resume_after`]: a control
//! plane that keeps every other node's lease alive that long is healthy,
//! so the missing nodes really are the problem. Nodes that went missing
//! before a pause ended never count towards the next one.

use std::time::Duration;

use cca_model::clock::span_millis;
use cca_model::cluster::{Disruption, Millis, NodeCondition, NodeStatus, ResumeCause};
use cca_model::node_lease::NodeLeases;
use cca_model::{Kind, keys};

use crate::controller::{Context, Controller, EventDraft, Plan, Write};
use crate::view::View;

/// A single missing node is never suspicious, whatever the share.
pub const MIN_MISSING: u32 = 2;

/// When lost leases are not trusted; `Default` gives the documented values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DisruptionConfig {
    /// Pause when more than this percentage of the registered nodes missed
    /// their leases within one lease TTL (33: a third).
    pub max_missing_percent: u32,
    /// Pause also when more than this many nodes did (none: the share
    /// alone decides). For large clusters, where a third is hundreds.
    pub max_missing_nodes: Option<u32>,
    /// Resume on its own once no further node went missing for this long
    /// (60 s); none: only heartbeats or an operator resume.
    pub resume_after: Option<Duration>,
}

impl Default for DisruptionConfig {
    fn default() -> Self {
        Self {
            max_missing_percent: 33,
            max_missing_nodes: None,
            resume_after: Some(Duration::from_secs(60)),
        }
    }
}

impl DisruptionConfig {
    /// Whether `missing` of `nodes` missing at once points at the control
    /// plane rather than at the nodes.
    fn suspicious(&self, missing: u32, nodes: u32) -> bool {
        missing >= MIN_MISSING
            && (u64::from(missing) * 100 > u64::from(self.max_missing_percent) * u64::from(nodes)
                || self.max_missing_nodes.is_some_and(|most| missing > most))
    }
}

/// The node controller's settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeConfig {
    /// The agents' leases: leases missed within one TTL (the fleet's, as
    /// its size sets it) count together.
    pub leases: NodeLeases,
    pub disruption: DisruptionConfig,
}

/// Writes `derived/node/{node}` and `derived/disruption`; see the module
/// documentation.
#[derive(Clone, Debug, Default)]
pub struct NodeController {
    pub config: NodeConfig,
}

/// One node's condition as of this reconcile.
struct Observed<'v> {
    name: &'v str,
    condition: NodeCondition,
    since: Millis,
    held: Option<NodeCondition>,
}

impl Controller for NodeController {
    fn name(&self) -> &'static str {
        "node"
    }

    fn interests(&self) -> &'static [Kind] {
        &[
            Kind::Node,
            Kind::Heartbeat,
            Kind::NodeStatus,
            Kind::Disruption,
            Kind::ReplacementResume,
        ]
    }

    fn reconcile(&self, view: &View, context: &Context) -> Plan {
        let observed = observe(view, context.now);
        let mut plan = Plan::default();
        let quiet = self.judge(view, context, &observed, &mut plan);
        for node in observed
            .iter()
            .filter(|node| node.held != Some(node.condition))
        {
            let status = NodeStatus {
                condition: node.condition,
                since: node.since,
            };
            plan.writes
                .push(Write::put_json(keys::derived_node(node.name), &status));
            // During a pause its events speak for every node.
            if !quiet {
                plan.events
                    .push(transition_event(node.name, node.held, node.condition));
            }
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

fn observe(view: &View, now: Millis) -> Vec<Observed<'_>> {
    view.nodes
        .iter()
        .map(|(name, _)| {
            let condition = if view.heartbeats.contains_key(name) {
                NodeCondition::Ready
            } else {
                NodeCondition::Unreachable
            };
            let held = view.node_statuses.get(name).map(|held| &held.value);
            let since = match held {
                Some(held) if held.condition == condition => held.since,
                _ => now,
            };
            Observed {
                name: name.as_str(),
                condition,
                since,
                held: held.map(|held| held.condition),
            }
        })
        .collect()
}

impl NodeController {
    /// Decides whether lost-node replacement is paused, writing the
    /// decision first in `plan` when it changes (so the scheduler sees a
    /// pause no later than the conditions that caused it). True while
    /// paused and on the pass that ends a pause: then the pause's events
    /// speak for the nodes, not one event per node.
    fn judge(
        &self,
        view: &View,
        context: &Context,
        observed: &[Observed<'_>],
        plan: &mut Plan,
    ) -> bool {
        match view.disruption.as_ref().map(|held| &*held.value) {
            Some(pause) if pause.paused => {
                self.hold_or_resume(view, context, pause, observed, plan);
                true
            }
            resumed => self.maybe_pause(context, resumed, observed, plan),
        }
    }

    /// During a pause: ends it when a cause says so, else asks to look
    /// again when the safeguard would end it.
    fn hold_or_resume(
        &self,
        view: &View,
        context: &Context,
        pause: &Disruption,
        observed: &[Observed<'_>],
        plan: &mut Plan,
    ) {
        // Every node missing since the window that started the pause.
        let from = pause.since - span_millis(self.window(observed));
        let (missing, nodes) = (missing_since(observed, from), at_risk(observed, from));
        match self.resume_cause(view, context, pause, &missing, nodes) {
            Ok(cause) => {
                let resumed = Disruption {
                    paused: false,
                    since: context.now,
                    missing: count(missing.len()),
                    nodes,
                    resumed_by: Some(cause),
                };
                plan.events.push(resume_event(&resumed, cause));
                plan.writes
                    .insert(0, Write::put_json(keys::derived_disruption(), &resumed));
            }
            Err(Some(after)) => plan.requeue(after),
            Err(None) => {}
        }
    }

    /// Not paused (`resumed`: how the last pause ended, if any): pauses
    /// when too many nodes went missing within one TTL. True if it did.
    fn maybe_pause(
        &self,
        context: &Context,
        resumed: Option<&Disruption>,
        observed: &[Observed<'_>],
        plan: &mut Plan,
    ) -> bool {
        // Nodes lost before the last pause ended were judged then.
        let resumed_at = resumed.map_or(Millis::MIN, |resumed| resumed.since);
        let window = self.window(observed);
        let window_ms = span_millis(window);
        let from = (context.now - window_ms).max(resumed_at + 1);
        let missing = count(missing_since(observed, from).len());
        let nodes = at_risk(observed, from);
        if !self.config.disruption.suspicious(missing, nodes) {
            return false;
        }
        let pause = Disruption {
            paused: true,
            since: context.now,
            missing,
            nodes,
            resumed_by: None,
        };
        plan.events.push(self.pause_event(&pause, window));
        plan.writes
            .insert(0, Write::put_json(keys::derived_disruption(), &pause));
        if let Some(after) = self.config.disruption.resume_after {
            plan.requeue(span_millis(after));
        }
        true
    }

    /// Why the pause ends now, or when to look again (`Err`).
    fn resume_cause(
        &self,
        view: &View,
        context: &Context,
        pause: &Disruption,
        missing: &[Millis],
        nodes: u32,
    ) -> Result<ResumeCause, Option<Millis>> {
        let operator = view
            .replacement_resume
            .as_ref()
            .is_some_and(|resume| resume.value.at >= pause.since);
        if operator {
            return Ok(ResumeCause::Operator);
        }
        if !self
            .config
            .disruption
            .suspicious(count(missing.len()), nodes)
        {
            return Ok(ResumeCause::Heartbeats);
        }
        let Some(after) = self.config.disruption.resume_after else {
            return Err(None);
        };
        let quiet_since = missing.iter().copied().fold(pause.since, Millis::max);
        let due = quiet_since + span_millis(after);
        if context.now >= due {
            Ok(ResumeCause::Safeguard)
        } else {
            Err(Some(due - context.now))
        }
    }

    /// How close together lost leases count as lost together: the TTL a
    /// fleet of the observed nodes' size gets.
    fn window(&self, observed: &[Observed<'_>]) -> Duration {
        self.config.leases.ttl_for(observed.len())
    }

    fn pause_event(&self, pause: &Disruption, window: Duration) -> EventDraft {
        let mut ends = String::from(
            "it resumes when their heartbeats return or on `cca nodes resume-replacement`",
        );
        if let Some(after) = self.config.disruption.resume_after {
            ends.push_str(&format!(
                ", or once no further node goes missing for {}s",
                after.as_secs()
            ));
        }
        EventDraft::warning(
            "cluster",
            format!(
                "lost-node replacement paused: {} of {} nodes missed their leases within {}s, \
                 which points at the control plane, the store or the network rather than the \
                 nodes; they are marked unreachable but nothing of theirs is replaced; {ends}",
                pause.missing,
                pause.nodes,
                window.as_secs()
            ),
        )
    }
}

/// When each node missing since `from` went missing.
fn missing_since(observed: &[Observed<'_>], from: Millis) -> Vec<Millis> {
    observed
        .iter()
        .filter(|node| node.condition == NodeCondition::Unreachable && node.since >= from)
        .map(|node| node.since)
        .collect()
}

/// The nodes whose loss since `from` could count: every node but those
/// already missing before it (a node dead for days that nobody removed
/// must not dilute the share).
fn at_risk(observed: &[Observed<'_>], from: Millis) -> u32 {
    count(
        observed
            .iter()
            .filter(|node| node.condition == NodeCondition::Ready || node.since >= from)
            .count(),
    )
}

fn count(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

fn resume_event(resumed: &Disruption, cause: ResumeCause) -> EventDraft {
    let why = match cause {
        ResumeCause::Heartbeats => "enough of the missing nodes heartbeat again",
        ResumeCause::Operator => "an operator said the missing nodes are gone",
        ResumeCause::Safeguard => {
            "no further node went missing for the safeguard's time, so the control plane is \
             healthy and the missing nodes are the problem"
        }
    };
    EventDraft::info(
        "cluster",
        format!(
            "lost-node replacement resumed: {why}; {} of {} nodes are still missing and are \
             replaced once unreachable for the lost grace",
            resumed.missing, resumed.nodes
        ),
    )
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
    use cca_model::cluster::ReplacementResume;

    fn check(
        case: &str,
        view: &View,
        now: i64,
        expected: &[(&str, Option<NodeCondition>)],
        events: usize,
    ) {
        let plan = NodeController::default().reconcile(view, &context(now));
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
        assert!(
            NodeController::default()
                .reconcile(&view, &context(9_000))
                .is_noop()
        );
    }

    const TTL: Millis = 6_000;
    const NOW: Millis = 1_000_000;

    fn lost_at(since: Millis) -> NodeStatus {
        NodeStatus {
            condition: NodeCondition::Unreachable,
            since,
        }
    }

    /// `total` ready nodes of which the first `missing` lost their
    /// heartbeat (not yet marked unreachable).
    fn cluster(total: usize, missing: usize) -> ViewBuilder {
        let mut builder = ViewBuilder::new();
        for index in 0..total {
            let name = format!("n{index}");
            builder = builder.node(&name, 1000, 1024);
            if index < missing {
                builder = builder.delete(&keys::observed_heartbeat(&name));
            }
        }
        builder
    }

    fn disruption_of(plan: &Plan) -> Option<Disruption> {
        plan.writes.iter().find_map(|write| match write {
            Write::Put { key, value } if *key == keys::derived_disruption() => {
                Some(serde_json::from_slice(value).expect("decodes"))
            }
            _ => None,
        })
    }

    fn paused_at(since: Millis, missing: u32, nodes: u32) -> Disruption {
        Disruption {
            paused: true,
            since,
            missing,
            nodes,
            resumed_by: None,
        }
    }

    #[test]
    fn many_nodes_missing_at_once_pause_replacement_with_one_event() {
        let view = cluster(9, 4).build();
        let plan = NodeController::default().reconcile(&view, &context(NOW));
        assert_eq!(
            plan.writes[0].key(),
            keys::derived_disruption(),
            "the pause lands first"
        );
        assert_eq!(disruption_of(&plan), Some(paused_at(NOW, 4, 9)));
        assert_eq!(plan.writes.len(), 5, "the pause and four conditions");
        assert_eq!(plan.events.len(), 1, "{:?}", plan.events);
        assert!(plan.events[0].message.contains("4 of 9 nodes"));
        assert_eq!(plan.requeue_after, Some(60_000), "the safeguard's time");
    }

    #[test]
    fn a_few_nodes_or_a_single_one_are_node_problems() {
        for (total, missing) in [(9, 2), (2, 1), (1, 1)] {
            let view = cluster(total, missing).build();
            let plan = NodeController::default().reconcile(&view, &context(NOW));
            assert_eq!(disruption_of(&plan), None, "{missing} of {total}");
            assert_eq!(plan.events.len(), missing, "one event per node");
        }
    }

    #[test]
    fn an_absolute_count_pauses_large_clusters_below_the_share() {
        let controller = NodeController {
            config: NodeConfig {
                disruption: DisruptionConfig {
                    max_missing_nodes: Some(10),
                    ..DisruptionConfig::default()
                },
                ..NodeConfig::default()
            },
        };
        let view = cluster(100, 11).build();
        let plan = controller.reconcile(&view, &context(NOW));
        assert_eq!(disruption_of(&plan), Some(paused_at(NOW, 11, 100)));
        let view = cluster(100, 10).build();
        assert_eq!(
            disruption_of(&controller.reconcile(&view, &context(NOW))),
            None
        );
    }

    #[test]
    fn nodes_missing_for_longer_than_a_ttl_do_not_add_up() {
        let mut builder = cluster(9, 4);
        for index in 0..3 {
            builder = builder.node_status(&format!("n{index}"), &lost_at(NOW - TTL - 1));
        }
        // Three long gone and one just now: only one went missing lately.
        let plan = NodeController::default().reconcile(&builder.build(), &context(NOW));
        assert_eq!(disruption_of(&plan), None);
    }

    #[test]
    fn nodes_long_gone_do_not_dilute_the_share() {
        // Twenty registered nodes, ten of them gone for an hour: four of
        // the ten live ones vanishing at once is 40 %, not 20 %.
        let mut builder = cluster(20, 14);
        for index in 4..14 {
            builder = builder.node_status(&format!("n{index}"), &lost_at(NOW - 3_600_000));
        }
        let plan = NodeController::default().reconcile(&builder.build(), &context(NOW));
        assert_eq!(disruption_of(&plan), Some(paused_at(NOW, 4, 10)));
    }

    #[test]
    fn nodes_missing_before_a_pause_ended_never_start_the_next() {
        let resumed = Disruption {
            paused: false,
            resumed_by: Some(ResumeCause::Operator),
            ..paused_at(NOW - 1_000, 4, 9)
        };
        let mut builder = cluster(9, 4).put(&keys::derived_disruption(), &resumed);
        for index in 0..4 {
            builder = builder.node_status(&format!("n{index}"), &lost_at(NOW - 2_000));
        }
        let plan = NodeController::default().reconcile(&builder.build(), &context(NOW));
        assert!(plan.is_noop(), "{plan:?}");
    }

    /// A paused cluster with nodes n0..n3 of nine missing since `NOW`.
    fn paused_cluster(back: usize) -> ViewBuilder {
        let mut builder = cluster(9, 4).put(&keys::derived_disruption(), &paused_at(NOW, 4, 9));
        for index in 0..4 {
            let name = format!("n{index}");
            builder = builder.node_status(&name, &lost_at(NOW));
            if index < back {
                builder = builder.heartbeat(&name);
            }
        }
        builder
    }

    #[test]
    fn a_pause_ends_when_heartbeats_return() {
        let view = paused_cluster(3).build();
        let plan = NodeController::default().reconcile(&view, &context(NOW + 5_000));
        let resumed = disruption_of(&plan).expect("resumes");
        assert!(!resumed.paused);
        assert_eq!(resumed.since, NOW + 5_000);
        assert_eq!(resumed.resumed_by, Some(ResumeCause::Heartbeats));
        assert_eq!(resumed.missing, 1);
        assert_eq!(plan.writes[0].key(), keys::derived_disruption());
        assert_eq!(plan.events.len(), 1, "one event; returning nodes are quiet");
    }

    #[test]
    fn a_pause_holds_while_the_nodes_stay_away_then_the_safeguard_ends_it() {
        let view = paused_cluster(0).build();
        let controller = NodeController::default();
        let waiting = controller.reconcile(&view, &context(NOW + 20_000));
        assert!(waiting.is_noop(), "{waiting:?}");
        assert_eq!(waiting.requeue_after, Some(40_000));
        let plan = controller.reconcile(&view, &context(NOW + 60_000));
        let resumed = disruption_of(&plan).expect("resumes");
        assert_eq!(resumed.resumed_by, Some(ResumeCause::Safeguard));
        assert_eq!(resumed.missing, 4);
    }

    #[test]
    fn another_node_going_missing_restarts_the_safeguard() {
        let view = paused_cluster(0)
            .delete(&keys::observed_heartbeat("n4"))
            .node_status("n4", &lost_at(NOW + 30_000))
            .build();
        let plan = NodeController::default().reconcile(&view, &context(NOW + 60_000));
        assert!(plan.is_noop(), "{plan:?}");
        assert_eq!(plan.requeue_after, Some(30_000));
    }

    #[test]
    fn without_a_safeguard_only_heartbeats_or_an_operator_end_a_pause() {
        let controller = NodeController {
            config: NodeConfig {
                disruption: DisruptionConfig {
                    resume_after: None,
                    ..DisruptionConfig::default()
                },
                ..NodeConfig::default()
            },
        };
        let view = paused_cluster(0).build();
        let plan = controller.reconcile(&view, &context(NOW + 3_600_000));
        assert!(plan.is_noop());
        assert_eq!(plan.requeue_after, None);
        let resume = ReplacementResume { at: NOW + 10 };
        let view = ViewBuilder::from(view)
            .put(&keys::desired_replacement_resume(), &resume)
            .build();
        let plan = controller.reconcile(&view, &context(NOW + 3_600_000));
        let resumed = disruption_of(&plan).expect("resumes");
        assert_eq!(resumed.resumed_by, Some(ResumeCause::Operator));
    }

    #[test]
    fn an_operator_word_older_than_the_pause_does_not_end_it() {
        let resume = ReplacementResume { at: NOW - 1 };
        let view = paused_cluster(0)
            .put(&keys::desired_replacement_resume(), &resume)
            .build();
        let plan = NodeController::default().reconcile(&view, &context(NOW + 1_000));
        assert_eq!(disruption_of(&plan), None);
    }
}
