//! The lifecycle controller's rollouts, step by step over a view; every
//! pass is also planned from the changes alone, which must plan the same.

use cca_model::cluster::{ExitInfo, InstanceState, Millis};
use cca_model::keys;
use cca_model::rollout::{Rollout, RolloutCause, RolloutControl, RolloutPhase, UndoRequest};
use cca_model::spec::{ServiceSpec, ServiceVersion, spec_hash};
use serde::Serialize;

use super::LifecycleController;
use crate::controller::{Changes, Controller, Plan, Write};
use crate::controllers::SchedulerController;
use crate::controllers::fixtures::{context, instance, service, status};
use crate::view::{FactChange, View};

/// A view and the changes the runner would have gathered for the
/// lifecycle controller since its last pass.
#[derive(Default)]
pub(super) struct Cluster {
    pub(super) view: View,
    gathered: Vec<FactChange>,
    pub(super) now: Millis,
}

impl Cluster {
    pub(super) fn put<T: Serialize>(&mut self, key: &str, value: &T) {
        let bytes = serde_json::to_vec(value).expect("encodes");
        let revision = self.view.revision + 1;
        let changes = self.view.put(key, &bytes, revision);
        self.view.revision = revision;
        let interests = LifecycleController::default().interests();
        self.gathered.extend(
            changes
                .into_iter()
                .filter(|change| interests.contains(&change.kind())),
        );
    }

    /// Applies `spec` as `cca apply` does: the spec and its version.
    pub(super) fn apply(&mut self, spec: &ServiceSpec) {
        let version = ServiceVersion {
            spec: spec.clone(),
            created_at: self.now,
            applied_at: self.now,
        };
        self.put(
            &keys::desired_service_version(&spec.name, &spec_hash(spec)),
            &version,
        );
        self.put(&keys::desired_service(&spec.name), spec);
    }

    /// An instance of `spec`'s version, reported in `state` after
    /// `restarts` restarts.
    pub(super) fn instance(
        &mut self,
        id: &str,
        spec: &ServiceSpec,
        state: InstanceState,
        restarts: u32,
    ) {
        let mut placed = instance(id, &spec.name, "n1");
        placed.spec_hash = spec_hash(spec);
        self.put(&keys::derived_instance(&spec.name, id), &placed);
        let mut report = status(id, &spec.name, "n1", state);
        report.restarts = restarts;
        if restarts > 0 {
            report.last_exit = Some(ExitInfo {
                code: Some(3),
                signal: None,
                reason: "exited".into(),
                at: self.now,
                log_tail: vec![],
            });
        }
        self.put(&keys::observed_instance(id), &report);
    }

    pub(super) fn stop(&mut self, id: &str, spec: &ServiceSpec) {
        let key = keys::derived_instance(&spec.name, id);
        let mut placed = (*self.view.instances.get(id).expect("placed").value).clone();
        placed.stopping = true;
        self.put(&key, &placed);
    }

    /// Node `node` reports `instances`' use over a 30 s period ending now.
    pub(super) fn report_usage(
        &mut self,
        node: &str,
        instances: std::collections::BTreeMap<String, cca_model::usage::UsageSummary>,
    ) {
        let report = cca_model::usage::NodeUsage {
            at: self.now,
            period_ms: 30_000,
            node: cca_model::usage::UsageSummary::default(),
            instances,
            requests: std::collections::BTreeMap::new(),
        };
        self.put(&keys::observed_usage(node), &report);
    }

    pub(super) fn control(&mut self, service: &str, control: &RolloutControl) {
        self.put(&keys::desired_rollout(service), control);
    }

    /// One pass (checked against the incremental one), committed.
    pub(super) fn pass(&mut self) -> Plan {
        let full = LifecycleController::default().reconcile(&self.view, &context(self.now));
        let changes = Changes::Facts(std::mem::take(&mut self.gathered));
        let scoped = LifecycleController::default().reconcile_changes(
            &self.view,
            &context(self.now),
            &changes,
        );
        assert_eq!(sorted(&scoped), sorted(&full), "incremental == full");
        for write in &full.writes {
            let Write::Put { key, value } = write else {
                let revision = self.view.revision + 1;
                self.view.delete(write.key(), revision);
                self.view.revision = revision;
                continue;
            };
            let value: serde_json::Value = serde_json::from_slice(value).expect("json");
            self.put(key, &value);
        }
        self.gathered.clear();
        full
    }

    pub(super) fn rollout(&self, service: &str) -> Rollout {
        (*self.view.rollouts.get(service).expect("a rollout").value).clone()
    }
}

fn sorted(plan: &Plan) -> Vec<String> {
    let mut writes: Vec<String> = plan.writes.iter().map(|w| format!("{w:?}")).collect();
    writes.sort();
    writes
}

fn messages(plan: &Plan) -> Vec<&str> {
    plan.events
        .iter()
        .map(|event| event.message.as_str())
        .collect()
}

fn v1() -> ServiceSpec {
    service("web", 3)
}

fn with_env(value: &str) -> ServiceSpec {
    let mut spec = v1();
    spec.env.insert("V".into(), value.into());
    spec
}

/// `web` at version 1, three ready instances, its rollout complete.
fn settled() -> Cluster {
    let mut cluster = Cluster::default();
    cluster.apply(&v1());
    for id in ["web-1", "web-2", "web-3"] {
        cluster.instance(id, &v1(), InstanceState::Running, 0);
    }
    cluster.pass();
    assert_eq!(cluster.rollout("web").phase, RolloutPhase::Complete);
    cluster
}

#[test]
fn a_new_service_rolls_out_its_version_and_completes_once_its_instances_are_ready() {
    let mut cluster = Cluster::default();
    cluster.apply(&v1());
    cluster.pass();
    let rollout = cluster.rollout("web");
    assert_eq!(rollout.target, spec_hash(&v1()));
    assert_eq!(rollout.phase, RolloutPhase::Progressing);
    assert_eq!(rollout.previous, None);
    cluster.now = 10;
    cluster.instance("web-1", &v1(), InstanceState::Running, 0);
    cluster.instance("web-2", &v1(), InstanceState::Running, 0);
    cluster.instance("web-3", &v1(), InstanceState::Starting, 0);
    assert!(cluster.pass().is_noop(), "not all ready yet");
    cluster.now = 20;
    cluster.instance("web-3", &v1(), InstanceState::Running, 0);
    let plan = cluster.pass();
    let rollout = cluster.rollout("web");
    assert_eq!(rollout.phase, RolloutPhase::Complete);
    assert_eq!(rollout.ended_at, Some(20));
    assert!(messages(&plan).iter().any(|m| m.contains("complete")));
    assert!(cluster.pass().is_noop(), "a settled service writes nothing");
}

#[test]
fn an_apply_of_a_new_version_starts_a_rollout_from_the_old_one() {
    let mut cluster = settled();
    cluster.now = 100;
    cluster.apply(&with_env("2"));
    let plan = cluster.pass();
    let rollout = cluster.rollout("web");
    assert_eq!(rollout.target, spec_hash(&with_env("2")));
    assert_eq!(rollout.previous, Some(spec_hash(&v1())));
    assert_eq!(rollout.cause, RolloutCause::Apply);
    assert_eq!(rollout.started_at, 100);
    assert_eq!(rollout.history[0].phase, RolloutPhase::Complete);
    assert!(messages(&plan)[0].starts_with("rolling out version"));
    // Replicas are not part of a version: no new rollout.
    let mut scaled = with_env("2");
    scaled.replicas = 5;
    cluster.apply(&scaled);
    cluster.pass();
    assert_eq!(cluster.rollout("web").started_at, 100);
}

/// `settled`, then version 2 applied with `failing` of its instances failing.
fn rolling_to_a_bad_version(failing: usize) -> Cluster {
    let mut cluster = settled();
    cluster.now = 100;
    cluster.apply(&with_env("2"));
    cluster.pass();
    cluster.now = 110;
    // One restart is not yet a crash loop.
    cluster.instance("web-4", &with_env("2"), InstanceState::Running, 1);
    let bad = [
        ("web-5", InstanceState::Failed, 4),
        ("web-6", InstanceState::Restarting, 2),
        ("web-7", InstanceState::Running, 3),
        ("web-8", InstanceState::Restarting, 5),
    ];
    for (id, state, restarts) in bad.into_iter().take(failing) {
        cluster.instance(id, &with_env("2"), state, restarts);
    }
    cluster
}

#[test]
fn rollback_after_failed_new_instances_returns_to_the_previous_version_at_once() {
    let mut cluster = rolling_to_a_bad_version(2);
    cluster.pass();
    let rollout = cluster.rollout("web");
    assert_eq!(rollout.phase, RolloutPhase::Progressing, "2 of 3");
    assert_eq!(rollout.failures.len(), 2);
    assert!(
        rollout.failures[0].why.starts_with("failed"),
        "{:?}",
        rollout.failures
    );
    assert_eq!(
        rollout.failures[1].why,
        "crash looping: restarted 2 times, last exit: exited with code 3"
    );
    cluster.now = 120;
    cluster.instance("web-7", &with_env("2"), InstanceState::Running, 3);
    let plan = cluster.pass();
    let rollout = cluster.rollout("web");
    let (bad, good) = (spec_hash(&with_env("2")), spec_hash(&v1()));
    assert_eq!(rollout.target, good);
    assert_eq!(rollout.previous.as_deref(), Some(bad.as_str()));
    assert_eq!(
        rollout.cause,
        RolloutCause::Rollback {
            from: bad.clone(),
            failed: 3,
            rollback_after: 3
        }
    );
    assert_eq!(
        rollout.started_at, 120,
        "decided in the pass that saw the third"
    );
    assert_eq!(rollout.history[0].phase, RolloutPhase::RolledBack);
    assert_eq!(rollout.history[0].failed, 3);
    assert!(
        plan.events
            .iter()
            .any(|e| e.message.starts_with("rolling back from version")),
        "{:?}",
        messages(&plan)
    );
    // The spec still says version 2, and the rollback holds for it.
    cluster.now = 130;
    cluster.instance("web-8", &with_env("2"), InstanceState::Failed, 5);
    cluster.pass();
    assert_eq!(cluster.rollout("web").target, good);
    assert_eq!(
        cluster.rollout("web").failures.len(),
        0,
        "failures of the version rolled back from count for nothing"
    );
}

#[test]
fn the_scheduler_rolls_to_the_version_the_rollout_chose() {
    let mut cluster = rolling_to_a_bad_version(3);
    cluster.pass();
    let good = spec_hash(&v1());
    assert_eq!(cluster.rollout("web").target, good);
    let plan = schedule(&cluster);
    let (mut stopped, mut deleted) = (Vec::new(), Vec::new());
    for write in &plan.writes {
        let Write::Put { value, .. } = write else {
            deleted.push(write.key().to_owned());
            continue;
        };
        let placed: cca_model::cluster::Instance = serde_json::from_slice(value).expect("json");
        if placed.stopping {
            stopped.push(placed.id.clone());
        } else {
            assert_eq!(placed.spec_hash, good, "created with the old version");
        }
    }
    // The failed new instance is replaced (with the old version), the
    // crash looping one stops at once; the ready ones go within
    // max_unavailable.
    assert_eq!(deleted, vec![keys::derived_instance("web", "web-5")]);
    assert!(stopped.contains(&"web-6".to_owned()), "{stopped:?}");
}

#[test]
fn no_earlier_version_means_a_failed_rollout_that_holds() {
    let mut cluster = Cluster::default();
    cluster.apply(&v1());
    cluster.pass();
    for id in ["web-1", "web-2", "web-3"] {
        cluster.instance(id, &v1(), InstanceState::Failed, 5);
    }
    let plan = cluster.pass();
    let rollout = cluster.rollout("web");
    assert_eq!(rollout.phase, RolloutPhase::Failed);
    assert_eq!(rollout.target, spec_hash(&v1()));
    assert!(
        messages(&plan)
            .iter()
            .any(|m| m.contains("no earlier version"))
    );
}

#[test]
fn a_rollback_that_fails_too_holds_rather_than_going_back_and_forth() {
    let mut cluster = rolling_to_a_bad_version(3);
    cluster.pass();
    cluster.now = 200;
    for id in ["web-9", "web-10", "web-11"] {
        cluster.instance(id, &v1(), InstanceState::Failed, 5);
    }
    let plan = cluster.pass();
    let rollout = cluster.rollout("web");
    assert_eq!(rollout.phase, RolloutPhase::Failed);
    assert_eq!(rollout.target, spec_hash(&v1()));
    assert!(
        messages(&plan)
            .iter()
            .any(|m| m.contains("itself a rollback"))
    );
}

#[test]
fn rollback_after_zero_never_rolls_back() {
    let mut cluster = settled();
    cluster.now = 100;
    let mut spec = with_env("2");
    spec.update.rollback_after = 0;
    cluster.apply(&spec);
    for id in ["web-5", "web-6", "web-7", "web-8"] {
        cluster.instance(id, &spec, InstanceState::Failed, 5);
    }
    cluster.pass();
    let rollout = cluster.rollout("web");
    assert_eq!(rollout.target, spec_hash(&spec));
    assert_eq!(rollout.phase, RolloutPhase::Progressing);
    assert_eq!(rollout.failures.len(), 4, "still recorded for `why`");
}

#[test]
fn a_paused_rollout_counts_failures_and_rolls_back_once_resumed() {
    let mut cluster = settled();
    let paused = RolloutControl {
        paused: true,
        undo: None,
    };
    cluster.control("web", &paused);
    cluster.now = 100;
    cluster.apply(&with_env("2"));
    for id in ["web-5", "web-6", "web-7"] {
        cluster.instance(id, &with_env("2"), InstanceState::Failed, 5);
    }
    cluster.pass();
    let rollout = cluster.rollout("web");
    assert!(rollout.paused);
    assert_eq!(rollout.target, spec_hash(&with_env("2")));
    assert_eq!(rollout.failures.len(), 3);
    cluster.now = 150;
    cluster.control("web", &RolloutControl::default());
    cluster.pass();
    let rollout = cluster.rollout("web");
    assert!(!rollout.paused);
    assert_eq!(rollout.target, spec_hash(&v1()), "rolled back on resume");
}

#[test]
fn an_undo_holds_until_an_apply_changes_the_version() {
    let mut cluster = settled();
    cluster.now = 100;
    cluster.apply(&with_env("2"));
    cluster.pass();
    for id in ["web-1", "web-2", "web-3"] {
        cluster.stop(id, &v1());
    }
    cluster.now = 200;
    let (one, two) = (spec_hash(&v1()), spec_hash(&with_env("2")));
    let undo = RolloutControl {
        paused: false,
        undo: Some(UndoRequest {
            to: one.clone(),
            from: two.clone(),
            at: 200,
        }),
    };
    cluster.control("web", &undo);
    cluster.pass();
    let rollout = cluster.rollout("web");
    assert_eq!(rollout.target, one);
    assert_eq!(rollout.cause, RolloutCause::Undo);
    assert_eq!(rollout.previous.as_deref(), Some(two.as_str()));
    assert_eq!(rollout.undo_at, Some(200));
    // Replicas change nothing; a new version ends the undo.
    let mut scaled = with_env("2");
    scaled.replicas = 4;
    cluster.apply(&scaled);
    cluster.pass();
    assert_eq!(cluster.rollout("web").target, one);
    cluster.now = 300;
    cluster.apply(&with_env("3"));
    cluster.pass();
    let rollout = cluster.rollout("web");
    assert_eq!(rollout.target, spec_hash(&with_env("3")));
    assert_eq!(rollout.cause, RolloutCause::Apply);
    assert_eq!(rollout.previous.as_deref(), Some(one.as_str()));
    assert_eq!(rollout.history[0].cause, RolloutCause::Undo);
}

#[test]
fn a_deleted_service_loses_its_rollout() {
    let mut cluster = settled();
    let revision = cluster.view.revision + 1;
    let changes = cluster.view.delete(&keys::desired_service("web"), revision);
    cluster.view.revision = revision;
    cluster.gathered.extend(changes);
    let plan = cluster.pass();
    assert_eq!(
        plan.writes,
        vec![Write::delete(keys::derived_rollout("web"))]
    );
}

/// The scheduler's plan for `cluster` on one roomy node.
fn schedule(cluster: &Cluster) -> Plan {
    let view = crate::controllers::fixtures::ViewBuilder::from(cluster.view.clone())
        .node("n1", 8000, 16384)
        .build();
    SchedulerController::default().reconcile(&view, &context(cluster.now))
}

#[test]
fn a_paused_rollout_holds_the_scheduler_where_it_is() {
    let mut cluster = settled();
    let paused = RolloutControl {
        paused: true,
        undo: None,
    };
    cluster.control("web", &paused);
    cluster.apply(&with_env("2"));
    cluster.pass();
    assert!(
        schedule(&cluster).writes.is_empty(),
        "a new version rolls nothing while paused"
    );
    let mut scaled = with_env("2");
    scaled.replicas = 4;
    cluster.apply(&scaled);
    let plan = schedule(&cluster);
    let created: Vec<cca_model::cluster::Instance> = plan
        .writes
        .iter()
        .filter_map(|write| match write {
            Write::Put { value, .. } => serde_json::from_slice(value).ok(),
            Write::Delete { .. } => None,
        })
        .collect();
    assert_eq!(created.len(), 1, "{created:?}");
    assert_eq!(
        created[0].spec_hash,
        spec_hash(&v1()),
        "a scale-up while paused runs what most instances run"
    );
    cluster.control("web", &RolloutControl::default());
    let plan = schedule(&cluster);
    assert!(
        plan.writes.len() > 1,
        "resumed, the roll goes on: {:?}",
        sorted(&plan)
    );
}
