//! One service's rollout, decided from its spec, the operator's word
//! (`desired/rollout`), its instances and their reports:
//!
//! 1. **Start.** The request is the spec's version, or an undo while the
//!    spec stays at the version it was asked under. A request the held
//!    rollout does not answer starts a new one to it; the held one goes to
//!    the history (superseded, unless it had ended) and its target becomes
//!    the new one's previous version.
//! 2. **Failures.** While it progresses, every instance of the target that
//!    its agent gave up on or that crash loops (restarted
//!    [`CRASH_LOOP_RESTARTS`] times, health-check kills included) is
//!    recorded once, with what its agent said.
//! 3. **Rollback.** At `update.rollback_after` recorded failures (0: never)
//!    it rolls back at once — the same pass that saw the last one — to the
//!    previous version, if one is kept; otherwise, or when it is itself a
//!    rollback (no ping-pong), it is marked failed and holds. A paused
//!    rollout counts failures but waits for `cca rollout resume`.
//! 4. **Completion.** No instance of another version remains and as many
//!    instances of the target as the service wants are ready.
//!
//! [`CRASH_LOOP_RESTARTS`]: cca_model::rollout::CRASH_LOOP_RESTARTS

use cca_model::cluster::Millis;
use cca_model::rollout::{
    FailedInstance, KEPT_FAILURES, Rollout, RolloutCause, RolloutPhase, failure_of,
};
use cca_model::spec::{ServiceSpec, spec_hash};

use crate::controller::EventDraft;
use crate::view::View;

/// The rollout `service` should have now; `events` gets what changed.
pub(super) fn decide(
    view: &View,
    service: &str,
    spec: &ServiceSpec,
    now: Millis,
    events: &mut Vec<EventDraft>,
) -> Rollout {
    let desired = spec_hash(spec);
    let control = view.rollout_controls.get(service).map(|held| &*held.value);
    let undo = control
        .and_then(|control| control.undo.as_ref())
        .filter(|undo| undo.holds_for(&desired) && is_kept(view, service, &desired, &undo.to));
    let (target, undo_at, cause) = match undo {
        Some(undo) => (undo.to.as_str(), Some(undo.at), RolloutCause::Undo),
        None => (desired.as_str(), None, RolloutCause::Apply),
    };
    let held = view.rollouts.get(service).map(|held| &*held.value);
    let answered = held.filter(|held| held.requested == desired && held.undo_at == undo_at);
    let mut rollout = match (held, answered) {
        (_, Some(held)) => held.clone(),
        (Some(held), None) => {
            let next = Rollout::start(target, &desired, cause, now);
            let next = held.followed_by(next, RolloutPhase::Superseded, now);
            announce(events, service, &next);
            next
        }
        (None, None) => first(view, service, target, &desired, cause, now, events),
    };
    rollout.undo_at = undo_at;
    rollout.paused = control.is_some_and(|control| control.paused);
    if rollout.phase == RolloutPhase::Progressing {
        record_failures(view, service, spec, &mut rollout, now, events);
        rollout = breach(view, service, spec, &desired, rollout, now, events);
    }
    if rollout.phase == RolloutPhase::Progressing && is_complete(view, service, spec, &rollout) {
        rollout.phase = RolloutPhase::Complete;
        rollout.ended_at = Some(now);
        events.push(EventDraft::info(
            format!("service/{service}"),
            format!("rollout of version {} complete", rollout.target),
        ));
    }
    rollout
}

/// The first rollout the controller writes for `service`: its previous
/// version is the one most of its instances run, if another and kept (a
/// service that ran before rollouts were recorded).
fn first(
    view: &View,
    service: &str,
    target: &str,
    desired: &str,
    cause: RolloutCause,
    now: Millis,
    events: &mut Vec<EventDraft>,
) -> Rollout {
    let mut rollout = Rollout::start(target, desired, cause, now);
    rollout.previous = view
        .versions_running(service)
        .into_iter()
        .filter(|(hash, _)| *hash != target && is_kept(view, service, desired, hash))
        .max_by_key(|(_, count)| *count)
        .map(|(hash, _)| hash.to_owned());
    if rollout.previous.is_some() {
        announce(events, service, &rollout);
    }
    rollout
}

fn announce(events: &mut Vec<EventDraft>, service: &str, rollout: &Rollout) {
    let from = rollout
        .previous
        .as_deref()
        .map(|previous| format!(" from {previous}"))
        .unwrap_or_default();
    let why = match &rollout.cause {
        RolloutCause::Apply => "applied".to_owned(),
        RolloutCause::Undo => "undo requested".to_owned(),
        RolloutCause::Rollback { from, failed, .. } => {
            format!("rolling back: {failed} new instances of {from} failed")
        }
    };
    events.push(EventDraft::info(
        format!("service/{service}"),
        format!("rolling out version {}{from} ({why})", rollout.target),
    ));
}

/// Whether `version` of `service` can be rolled to: the spec's own
/// (`desired`) or a kept version.
fn is_kept(view: &View, service: &str, desired: &str, version: &str) -> bool {
    version == desired || view.keeps_version(service, version)
}

/// Records the target's instances found failing that are not recorded
/// yet, up to the larger of `rollback_after` and [`KEPT_FAILURES`].
fn record_failures(
    view: &View,
    service: &str,
    spec: &ServiceSpec,
    rollout: &mut Rollout,
    now: Millis,
    events: &mut Vec<EventDraft>,
) {
    let room = (spec.update.rollback_after as usize).max(KEPT_FAILURES);
    for instance in view.instances_of(service) {
        if instance.stopping || instance.spec_hash != rollout.target {
            continue;
        }
        if rollout.failures.iter().any(|seen| seen.id == instance.id) {
            continue;
        }
        let Some(why) = view.fresh_status(instance).and_then(failure_of) else {
            continue;
        };
        if rollout.failures.len() >= room {
            break;
        }
        events.push(EventDraft::warning(
            format!("instance/{}", instance.id),
            format!(
                "new instance of version {} is failing ({} so far): {why}",
                rollout.target,
                rollout.failures.len() + 1
            ),
        ));
        rollout.failures.push(FailedInstance {
            id: instance.id.clone(),
            node: instance.node.clone(),
            at: now,
            why,
        });
    }
}

/// At `rollback_after` failures, the rollback (or, with nowhere to go
/// back to, the failed rollout); otherwise `rollout` unchanged.
fn breach(
    view: &View,
    service: &str,
    spec: &ServiceSpec,
    desired: &str,
    mut rollout: Rollout,
    now: Millis,
    events: &mut Vec<EventDraft>,
) -> Rollout {
    let limit = spec.update.rollback_after;
    let failed = u32::try_from(rollout.failures.len()).unwrap_or(u32::MAX);
    if limit == 0 || failed < limit || rollout.paused {
        return rollout;
    }
    let names: Vec<&str> = rollout.failures.iter().map(|f| f.id.as_str()).collect();
    let back_to = rollout
        .previous
        .clone()
        .filter(|previous| *previous != rollout.target)
        .filter(|previous| is_kept(view, service, desired, previous));
    let is_rollback = matches!(rollout.cause, RolloutCause::Rollback { .. });
    let Some(back_to) = back_to.filter(|_| !is_rollback) else {
        let why = if is_rollback {
            "it is itself a rollback, so it holds rather than going back and forth"
        } else {
            "there is no earlier version to roll back to"
        };
        events.push(EventDraft::warning(
            format!("service/{service}"),
            format!(
                "rollout of version {} failed: {failed} new instances failed ({}), \
                 rollback_after = {limit}; {why}",
                rollout.target,
                names.join(", ")
            ),
        ));
        rollout.phase = RolloutPhase::Failed;
        rollout.ended_at = Some(now);
        return rollout;
    };
    events.push(EventDraft::warning(
        format!("service/{service}"),
        format!(
            "rolling back from version {} to {back_to}: {failed} new instances failed ({}), \
             rollback_after = {limit}",
            rollout.target,
            names.join(", ")
        ),
    ));
    rollout.phase = RolloutPhase::RolledBack;
    rollout.ended_at = Some(now);
    let cause = RolloutCause::Rollback {
        from: rollout.target.clone(),
        failed,
        rollback_after: limit,
    };
    let mut back = Rollout::start(&back_to, desired, cause, now);
    back.undo_at = rollout.undo_at;
    back.paused = rollout.paused;
    back.decided_by = rollout.failures.clone();
    rollout.followed_by(back, RolloutPhase::RolledBack, now)
}

/// No instance of another version remains, and as many ready instances of
/// the target as the service wants (none while it sleeps).
fn is_complete(view: &View, service: &str, spec: &ServiceSpec, rollout: &Rollout) -> bool {
    let wanted = if view.is_asleep(service) {
        0
    } else {
        view.wanted_replicas(service).unwrap_or(spec.replicas) as usize
    };
    let mut ready = 0;
    for instance in view.instances_of(service) {
        if instance.stopping {
            continue;
        }
        if instance.spec_hash != rollout.target {
            return false;
        }
        if view.is_ready(instance) {
            ready += 1;
        }
    }
    ready >= wanted
}
