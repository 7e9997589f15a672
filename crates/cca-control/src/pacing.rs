//! The runner's pacing decision, pure: after each reconcile-and-commit
//! cycle of a controller, on which view revision to reconcile next, when
//! to wake without a change (a requeue, a backoff, or at once), and how
//! long to rest before a pass triggered by a change. Inputs are the
//! cycle's outcome, when it started, `now` and a random draw for the
//! backoff's jitter; the runner reads the clock and the random source and
//! does the waiting, so this is tested with injected instants.

use std::time::Duration;

use cca_model::cluster::Millis;
use cca_store::Revision;
use tokio::time::Instant;

use crate::leader::Backoff;

/// The longest a controller rests between passes.
pub(crate) const MAX_REST: Duration = Duration::from_secs(1);

/// How one reconcile-and-commit cycle ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Cycle {
    /// Nothing to do; reconcile again after `requeue` ms if set.
    Idle { requeue: Option<Millis> },
    /// The plan is in the store at `revision`.
    Committed {
        revision: Revision,
        requeue: Option<Millis>,
    },
    /// A fact changed under the plan; retry on a view at least this new.
    Conflict { revision: Revision },
    /// The store failed or refused; retry after a backoff.
    Failed,
    /// The fencing token no longer holds: another server leads.
    Deposed,
}

/// What the driver does until its next pass.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Wait for a relevant change, `wake_at` or the periodic resync; a
    /// pass triggered by a change first rests until `rest_until`.
    Wait {
        wake_at: Option<Instant>,
        rest_until: Option<Instant>,
    },
    /// Deposed: this controller stops until leadership returns.
    Stop,
}

/// What pacing remembers between one controller's cycles.
#[derive(Debug)]
pub(crate) struct Pacing {
    backoff: Backoff,
    /// The next pass reconciles on a view at least this new (its own last
    /// commit, or the revision a conflict was seen at).
    pub(crate) min_revision: Revision,
}

impl Pacing {
    pub(crate) fn new() -> Self {
        Self {
            backoff: Backoff::new(),
            min_revision: 0,
        }
    }

    /// The decision after `cycle`, which started at `started`; `draw` in
    /// `[0, 1)` jitters a backoff.
    ///
    /// - Idle: the backoff resets; wake at the requested requeue; after a
    ///   change, rest as long as the pass took (at most [`MAX_REST`]), so
    ///   changes arriving meanwhile fold into one pass and a long pass
    ///   takes at most half a core.
    /// - Committed: the backoff resets; look again at once, on a view that
    ///   shows the commit (work of several steps continues).
    /// - Conflict: retry after the backoff on a view at least as new as
    ///   the conflict's revision. Failed: retry after the backoff.
    pub(crate) fn after(
        &mut self,
        cycle: &Cycle,
        started: Instant,
        now: Instant,
        draw: f64,
    ) -> Decision {
        let (wake_at, rest_until) = match *cycle {
            Cycle::Idle { requeue } => {
                self.backoff.reset();
                let took = now.saturating_duration_since(started).min(MAX_REST);
                (requeue.map(|ms| after_millis(now, ms)), Some(now + took))
            }
            Cycle::Committed { revision, requeue } => {
                self.backoff.reset();
                self.min_revision = revision;
                let requested = requeue.map(|ms| after_millis(now, ms));
                ([requested, Some(now)].into_iter().flatten().min(), None)
            }
            Cycle::Conflict { revision } => {
                self.min_revision = self.min_revision.max(revision);
                (Some(now + self.backoff.next_with(draw)), None)
            }
            Cycle::Failed => (Some(now + self.backoff.next_with(draw)), None),
            Cycle::Deposed => return Decision::Stop,
        };
        Decision::Wait {
            wake_at,
            rest_until,
        }
    }
}

/// `now` plus a requeue of `millis` (at least 1 ms).
fn after_millis(now: Instant, millis: Millis) -> Instant {
    now + Duration::from_millis(u64::try_from(millis.max(1)).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A requeue asked as a span, in the `Plan`'s milliseconds.
    fn requeue(span: Duration) -> Option<Millis> {
        Some(cca_model::clock::span_millis(span))
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn an_idle_pass_wakes_at_its_requeue_and_rests_as_long_as_it_took() {
        let started = Instant::now();
        let now = started + 300 * MS;
        let mut pacing = Pacing::new();
        assert_eq!(
            pacing.after(
                &Cycle::Idle {
                    requeue: requeue(Duration::from_secs(5))
                },
                started,
                now,
                0.5
            ),
            Decision::Wait {
                wake_at: Some(now + Duration::from_secs(5)),
                rest_until: Some(now + 300 * MS),
            }
        );
        // A pass longer than MAX_REST rests MAX_REST; no requeue, no wake.
        let now = started + Duration::from_secs(7);
        assert_eq!(
            pacing.after(&Cycle::Idle { requeue: None }, started, now, 0.5),
            Decision::Wait {
                wake_at: None,
                rest_until: Some(now + MAX_REST),
            }
        );
    }

    #[test]
    fn a_commit_looks_again_at_once_on_a_view_showing_it() {
        let now = Instant::now();
        let mut pacing = Pacing::new();
        let decision = pacing.after(
            &Cycle::Committed {
                revision: 42,
                requeue: requeue(Duration::from_secs(1)),
            },
            now,
            now,
            0.5,
        );
        assert_eq!(
            decision,
            Decision::Wait {
                wake_at: Some(now),
                rest_until: None
            }
        );
        assert_eq!(pacing.min_revision, 42);
    }

    #[test]
    fn conflicts_and_failures_back_off_doubling_with_jitter_until_a_success() {
        let now = Instant::now();
        let mut pacing = Pacing::new();
        let mut waits = Vec::new();
        for (cycle, draw) in [
            (Cycle::Conflict { revision: 7 }, 0.0),
            (Cycle::Failed, 0.0),
            (Cycle::Conflict { revision: 5 }, 0.999),
        ] {
            match pacing.after(&cycle, now, now, draw) {
                Decision::Wait {
                    wake_at: Some(at),
                    rest_until: None,
                } => waits.push(at - now),
                other => panic!("{cycle:?}: {other:?}"),
            }
        }
        // Steps of 10, 20, 40 ms; each wait in the upper half of its step.
        assert_eq!(waits[0], 5 * MS);
        assert_eq!(waits[1], 10 * MS);
        assert!(waits[2] > 39 * MS && waits[2] <= 40 * MS, "{waits:?}");
        // The newest revision seen is kept.
        assert_eq!(pacing.min_revision, 7);
        // Success resets the backoff.
        pacing.after(&Cycle::Idle { requeue: None }, now, now, 0.0);
        assert_eq!(
            pacing.after(&Cycle::Failed, now, now, 0.0),
            Decision::Wait {
                wake_at: Some(now + 5 * MS),
                rest_until: None
            }
        );
    }

    #[test]
    fn deposed_stops() {
        let now = Instant::now();
        assert_eq!(
            Pacing::new().after(&Cycle::Deposed, now, now, 0.5),
            Decision::Stop
        );
    }
}
