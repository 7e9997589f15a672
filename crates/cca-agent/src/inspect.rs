//! The agent's view of itself for `cca node-inspect`: its desired-state
//! cache, what its runtime runs, the drift between the two (with what the
//! agent will do about each difference), and how its reports fare. The
//! agent loop posts each tick's statuses and report outcomes on a
//! [`Board`]; the agent API's `GET /v1/inspect` reads the board, the cache
//! and the runtime when asked ([`Inspector::inspect`]), and [`drift`] is a
//! pure function of what they hold.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use cca_model::clock::now_millis;
use cca_model::cluster::{InstanceState, InstanceStatus, Millis};
use cca_runtime::{InstanceState as RtState, InstanceStatus as RtStatus, Runtime};
use cca_wire::types::{
    AgentInspection, CacheInspection, DesiredInstance, Drift, ReportLog, RuntimeInstance,
    UnclaimedRunView,
};
use tokio::sync::watch;

use crate::Desired;

/// What the agent loop posts for inspection: its last tick and its
/// reports' outcomes.
#[derive(Debug, Default)]
pub struct Board {
    reports: ReportLog,
}

impl Board {
    /// The statuses of the tick just done.
    pub(crate) fn ticked(&mut self, statuses: &[InstanceStatus]) {
        self.reports.last_tick = statuses.to_vec();
    }

    /// A report of `statuses` instance statuses got through at `at`.
    pub(crate) fn sent(&mut self, statuses: usize, at: Millis) {
        self.reports.last_sent_at = Some(at);
        self.reports.last_error = None;
        self.reports.last_error_at = None;
        self.reports.statuses_sent += statuses as u64;
    }

    /// A report failed at `at`.
    pub(crate) fn failed(&mut self, error: String, at: Millis) {
        self.reports.last_error = Some(error);
        self.reports.last_error_at = Some(at);
    }
}

/// Everything `GET /v1/inspect` reads.
#[derive(Clone, Debug)]
pub struct Inspector {
    pub(crate) node: String,
    pub(crate) runtime: Arc<dyn Runtime>,
    pub(crate) desired: watch::Receiver<Arc<Desired>>,
    pub(crate) connected: watch::Receiver<bool>,
    pub(crate) board: Arc<Mutex<Board>>,
}

impl Inspector {
    /// The agent's view now. A runtime that cannot list its instances is
    /// an error: the view would claim the node runs nothing.
    pub async fn inspect(&self) -> Result<AgentInspection, cca_runtime::Error> {
        let runtime = self.runtime.list().await?;
        let desired = Arc::clone(&self.desired.borrow());
        let reports = match self.board.lock() {
            Ok(board) => board.reports.clone(),
            Err(poisoned) => poisoned.into_inner().reports.clone(),
        };
        Ok(AgentInspection {
            node: self.node.clone(),
            at: now_millis(),
            connected: *self.connected.borrow(),
            cache: CacheInspection {
                revision: desired.revision,
                known: desired.known,
                origin: desired.origin.clone(),
            },
            desired: desired_instances(&desired),
            drift: drift(&desired, &runtime, &reports.last_tick),
            runtime: runtime.iter().map(runtime_instance).collect(),
            unclaimed: desired
                .unclaimed
                .iter()
                .map(|(id, run)| UnclaimedRunView {
                    id: id.clone(),
                    service: run.assignment.instance.service.clone(),
                    since: run.since,
                })
                .collect(),
            reports,
        })
    }
}

fn desired_instances(desired: &Desired) -> Vec<DesiredInstance> {
    desired
        .assignments
        .values()
        .map(|assignment| DesiredInstance {
            id: assignment.instance.id.clone(),
            service: assignment.instance.service.clone(),
            spec_hash: assignment.instance.spec_hash.clone(),
            host_ports: assignment.instance.host_ports.clone(),
        })
        .collect()
}

fn runtime_instance(status: &RtStatus) -> RuntimeInstance {
    RuntimeInstance {
        id: status.id.clone(),
        state: status.state.to_string(),
        pid: status.pid,
        started_at: status.started_at_ms,
        exit: status.exit.as_ref().map(ToString::to_string),
        adopted: status.adopted,
    }
}

/// Where the runtime differs from the cache: assignments the runtime does
/// not run (with the state the agent reports for them), and what the
/// runtime runs that nothing assigns (unclaimed, or an orphan the next
/// tick removes once the node holds a snapshot). Init steps
/// (`{id}.init-{step}`) of an assigned instance are not drift.
pub fn drift(desired: &Desired, runtime: &[RtStatus], last_tick: &[InstanceStatus]) -> Vec<Drift> {
    let reported = |id: &str| last_tick.iter().find(|status| status.id == id);
    let mut drift = Vec::new();
    for id in desired.assignments.keys() {
        let running = runtime.iter().find(|status| status.id == *id);
        let problem = match (running.map(|status| status.state), reported(id)) {
            (Some(RtState::Running), _) => continue,
            (_, Some(status)) if waits_to_start(status) => continue,
            (None, Some(status)) => format!(
                "assigned here, not in the runtime; reported {}{}",
                state_name(status.state),
                detail(status)
            ),
            (None, None) => "assigned here, not in the runtime yet (no tick since)".to_owned(),
            (Some(state), status) => format!(
                "assigned here, {state} in the runtime{}",
                status.map(detail).unwrap_or_default()
            ),
        };
        drift.push(Drift {
            id: id.clone(),
            problem,
        });
    }
    let assigned: BTreeSet<&str> = desired.assignments.keys().map(String::as_str).collect();
    for status in runtime {
        let id = status.id.as_str();
        let init_of_assigned = id
            .split_once(".init-")
            .is_some_and(|(main, _)| assigned.contains(main));
        if assigned.contains(id) || init_of_assigned {
            continue;
        }
        let problem = match desired.unclaimed.get(id) {
            Some(run) => format!(
                "{} in the runtime, unclaimed since {}: it ran for a store this node no longer \
                 follows; kept while it awaits adoption",
                status.state, run.since
            ),
            None if desired.known => format!(
                "{} in the runtime, assigned nowhere: an orphan, removed at the next tick",
                status.state
            ),
            None => format!(
                "{} in the runtime, not assigned: kept until the node holds its first snapshot",
                status.state
            ),
        };
        drift.push(Drift {
            id: id.to_owned(),
            problem,
        });
    }
    drift
}

/// Pending and starting instances are on their way, not drift.
fn waits_to_start(status: &InstanceStatus) -> bool {
    matches!(
        status.state,
        InstanceState::Pending | InstanceState::Starting
    )
}

fn state_name(state: InstanceState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{state:?}"))
}

fn detail(status: &InstanceStatus) -> String {
    status
        .message
        .as_deref()
        .map(|message| format!(": {message}"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use cca_runtime::{InstanceSpec, LimitsEnforcement};

    use super::*;
    use crate::desired::UnclaimedRun;
    use crate::desired::tests::assignment;

    fn in_runtime(id: &str, state: RtState) -> RtStatus {
        RtStatus {
            id: id.into(),
            spec: Arc::new(InstanceSpec::new(id, "web", "sleep 1")),
            state,
            pid: None,
            started_at_ms: None,
            exit: None,
            limits: LimitsEnforcement::NotRequested,
            adopted: false,
        }
    }

    fn reported(id: &str, state: InstanceState, message: &str) -> InstanceStatus {
        InstanceStatus {
            id: id.into(),
            service: "web".into(),
            node: "n1".into(),
            state,
            healthy: None,
            pid: None,
            address: None,
            own_network: false,
            host_ports: BTreeMap::new(),
            restarts: 0,
            last_exit: None,
            message: Some(message.into()),
            updated_at: 0,
        }
    }

    #[test]
    fn drift_names_each_difference_and_what_comes_of_it() {
        let mut desired = Desired {
            known: true,
            ..Desired::default()
        };
        for id in ["ok", "starting", "crashed", "failed-to-create", "new"] {
            desired.assignments.insert(id.into(), assignment(id));
        }
        desired.unclaimed.insert(
            "old-store".into(),
            UnclaimedRun {
                assignment: assignment("old-store"),
                since: 7,
            },
        );
        let runtime = [
            in_runtime("ok", RtState::Running),
            in_runtime("crashed", RtState::Exited),
            in_runtime("starting.init-0", RtState::Running),
            in_runtime("old-store", RtState::Running),
            in_runtime("stray", RtState::Running),
        ];
        let last_tick = [
            reported("starting", InstanceState::Starting, "init step 0"),
            reported("crashed", InstanceState::Failed, "exited with code 1"),
            reported("failed-to-create", InstanceState::Failed, "image not found"),
        ];
        let found: BTreeMap<String, String> = drift(&desired, &runtime, &last_tick)
            .into_iter()
            .map(|drift| (drift.id, drift.problem))
            .collect();
        assert_eq!(
            found.keys().map(String::as_str).collect::<Vec<_>>(),
            ["crashed", "failed-to-create", "new", "old-store", "stray"]
        );
        assert_eq!(
            found["crashed"],
            "assigned here, exited in the runtime: exited with code 1"
        );
        assert_eq!(
            found["failed-to-create"],
            "assigned here, not in the runtime; reported failed: image not found"
        );
        assert!(found["new"].contains("no tick since"), "{}", found["new"]);
        assert!(found["old-store"].contains("unclaimed since 7"));
        assert!(found["stray"].contains("orphan, removed at the next tick"));

        desired.known = false;
        let before_snapshot = drift(&desired, &runtime, &last_tick);
        let stray = before_snapshot.iter().find(|d| d.id == "stray");
        assert!(
            stray.is_some_and(|d| d.problem.contains("first snapshot")),
            "{before_snapshot:?}"
        );
    }
}
