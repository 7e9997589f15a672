//! Rollouts as facts: which version of a service its instances are rolled
//! to and why (`derived/rollout/{service}`, the lifecycle controller's),
//! and an operator's word on it (`desired/rollout/{service}`: pause,
//! resume, undo).
//!
//! The service's spec (`desired/service/{service}`) says what an apply
//! asked for; the rollout says what the scheduler rolls to, which is the
//! same version unless an undo or an automatic rollback chose an older
//! one. Either holds until an apply changes the spec's version: the files
//! stay the source of truth, and the next version they describe rolls
//! out as usual.

use serde::{Deserialize, Serialize};

use crate::cluster::{InstanceState, InstanceStatus, Millis};

/// Rollouts kept in a service's [`Rollout::history`].
pub const KEPT_ROLLOUTS: usize = 10;

/// New instances' failures a rollout records at least (more when
/// `rollback_after` is larger): with rollback off, the first ones.
pub const KEPT_FAILURES: usize = 20;

/// An instance that crashed or was killed for failing its health check
/// this many times is crash looping: it counts as a failed new instance.
pub const CRASH_LOOP_RESTARTS: u32 = 2;

/// `desired/rollout/{service}`: what an operator said about a service's
/// rollout (`cca rollout pause|resume|undo`). Absent: not paused, no undo.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutControl {
    /// Hold the rollout where it is: no instance is stopped or created to
    /// move it on, no automatic rollback; new applies wait too.
    pub paused: bool,
    /// The last undo asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo: Option<UndoRequest>,
}

/// `cca rollout undo`: roll the service to an older version of its spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UndoRequest {
    /// The version (spec hash) to roll to.
    pub to: String,
    /// The version of the service's spec when it was asked: the undo holds
    /// while the spec stays at this version, and an apply of another one
    /// ends it.
    pub from: String,
    pub at: Millis,
}

impl UndoRequest {
    /// Whether the undo still holds for a spec at version `desired`.
    pub fn holds_for(&self, desired: &str) -> bool {
        self.from == desired
    }
}

/// `derived/rollout/{service}`: the version the scheduler rolls a
/// service's instances to, and why; written by the lifecycle controller
/// when a rollout starts, completes, fails or is rolled back (progress in
/// between is read from the instances, not written).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollout {
    /// The version (spec hash) new instances run.
    pub target: String,
    /// The version that was the target before: where an automatic
    /// rollback returns, and what `cca rollout undo` picks by default.
    pub previous: Option<String>,
    /// The spec version this rollout answers: while the service's spec is
    /// at another, the rollout is out of date and the spec's version wins.
    pub requested: String,
    /// The undo this rollout answers (its time), if it answers one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo_at: Option<Millis>,
    pub cause: RolloutCause,
    pub phase: RolloutPhase,
    pub started_at: Millis,
    /// When it completed, failed or was rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<Millis>,
    /// Held by `cca rollout pause`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// New instances of the target found failing, in the order seen
    /// (bounded: see [`KEPT_FAILURES`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<FailedInstance>,
    /// For a rollback: the failed instances of the version rolled back
    /// from, which decided it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decided_by: Vec<FailedInstance>,
    /// Earlier rollouts, newest first, at most [`KEPT_ROLLOUTS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<RolloutRecord>,
}

/// What started a rollout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum RolloutCause {
    /// An apply made the target the service's spec.
    Apply,
    /// `cca rollout undo`.
    Undo,
    /// The lifecycle controller rolled back from `from`: `failed` of its
    /// new instances failed, `rollback_after` allowed fewer.
    Rollback {
        from: String,
        failed: u32,
        rollback_after: u32,
    },
}

/// Where a rollout stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutPhase {
    /// Instances of older versions remain, or new ones are not ready yet.
    Progressing,
    /// Every instance runs the target and is ready.
    Complete,
    /// `rollback_after` new instances failed and there was no earlier
    /// version to return to: the scheduler keeps replacing failures within
    /// its restart budget until an apply or undo starts another rollout.
    Failed,
    /// It was rolled back: the rollout that followed returns to
    /// [`Rollout::previous`] (in history only).
    RolledBack,
    /// Another apply or undo started a new rollout before it ended (in
    /// history only).
    Superseded,
}

impl RolloutPhase {
    /// Lower-case, as the CLI prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutPhase::Progressing => "progressing",
            RolloutPhase::Complete => "complete",
            RolloutPhase::Failed => "failed",
            RolloutPhase::RolledBack => "rolled back",
            RolloutPhase::Superseded => "superseded",
        }
    }
}

/// A new instance found failing during a rollout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedInstance {
    pub id: String,
    pub node: String,
    /// When the lifecycle controller saw it fail.
    pub at: Millis,
    /// What its agent reported: gave up, or how often it restarted, and
    /// its last exit or health-check failure.
    pub why: String,
}

/// An earlier rollout, as it ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutRecord {
    pub target: String,
    pub previous: Option<String>,
    pub cause: RolloutCause,
    pub phase: RolloutPhase,
    pub started_at: Millis,
    pub ended_at: Millis,
    /// How many of its new instances failed.
    pub failed: u32,
}

impl Rollout {
    /// A new rollout to `target`.
    pub fn start(target: &str, requested: &str, cause: RolloutCause, now: Millis) -> Rollout {
        Rollout {
            target: target.to_owned(),
            previous: None,
            requested: requested.to_owned(),
            undo_at: None,
            cause,
            phase: RolloutPhase::Progressing,
            started_at: now,
            ended_at: None,
            paused: false,
            failures: Vec::new(),
            decided_by: Vec::new(),
            history: Vec::new(),
        }
    }

    /// This rollout as a history record, ending `phase` at `now` (keeps
    /// its own end when it already ended).
    pub fn record(&self, phase: RolloutPhase, now: Millis) -> RolloutRecord {
        RolloutRecord {
            target: self.target.clone(),
            previous: self.previous.clone(),
            cause: self.cause.clone(),
            phase,
            started_at: self.started_at,
            ended_at: self.ended_at.unwrap_or(now),
            failed: u32::try_from(self.failures.len()).unwrap_or(u32::MAX),
        }
    }

    /// `next` follows this rollout, which ends as `phase`: it inherits the
    /// history with this one on top, and this target as its previous.
    pub fn followed_by(&self, mut next: Rollout, phase: RolloutPhase, now: Millis) -> Rollout {
        let ended = if self.ended_at.is_some() {
            self.phase
        } else {
            phase
        };
        next.previous = Some(self.target.clone());
        next.history = std::iter::once(self.record(ended, now))
            .chain(self.history.iter().cloned())
            .take(KEPT_ROLLOUTS)
            .collect();
        next
    }
}

/// Why `status` counts as a failed new instance of a rollout, if it does:
/// its agent gave up on it, or it crash loops (restarted
/// [`CRASH_LOOP_RESTARTS`] times: crashes and health-check kills alike).
pub fn failure_of(status: &InstanceStatus) -> Option<String> {
    let detail = status
        .message
        .as_deref()
        .map(|message| format!(": {message}"))
        .unwrap_or_default();
    let exit = status
        .last_exit
        .as_ref()
        .map(|exit| format!(", last exit: {}", exit.summary()))
        .unwrap_or_default();
    if status.state == InstanceState::Failed {
        return Some(format!("failed{detail}{exit}"));
    }
    (status.restarts >= CRASH_LOOP_RESTARTS)
        .then(|| format!("crash looping: restarted {} times{exit}", status.restarts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_following_rollout_keeps_a_bounded_history_newest_first() {
        let mut rollout = Rollout::start("v0", "v0", RolloutCause::Apply, 0);
        for step in 1..=(KEPT_ROLLOUTS as i64 + 3) {
            let next = Rollout::start(&format!("v{step}"), "x", RolloutCause::Apply, step);
            rollout = rollout.followed_by(next, RolloutPhase::Superseded, step);
        }
        assert_eq!(rollout.history.len(), KEPT_ROLLOUTS);
        assert_eq!(rollout.previous.as_deref(), Some("v12"));
        assert_eq!(rollout.history[0].target, "v12");
        assert_eq!(rollout.history[0].ended_at, 13);
        assert_eq!(rollout.history[1].target, "v11");
    }

    #[test]
    fn an_ended_rollout_keeps_its_own_outcome_in_history() {
        let mut done = Rollout::start("v1", "v1", RolloutCause::Apply, 0);
        done.phase = RolloutPhase::Complete;
        done.ended_at = Some(5);
        let next = Rollout::start("v2", "v2", RolloutCause::Apply, 9);
        let next = done.followed_by(next, RolloutPhase::Superseded, 9);
        assert_eq!(next.history[0].phase, RolloutPhase::Complete);
        assert_eq!(next.history[0].ended_at, 5);
    }
}
