//! The supervisor's restart decisions, pure: given what an instance's
//! record holds, how its run went and `now`, whether to restart it and
//! when, or give up. No runtime, no clock: the supervisor reads the clock
//! once per tick and applies what these answer, so they are tested with
//! injected instants.

use std::time::Duration;

use tokio::time::Instant;

use crate::supervisor::SupervisorConfig;

/// What to do once a run has ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AfterExit {
    /// Start it again at `at` (after the backoff for `streak` crashes).
    RestartAt { streak: u32, at: Instant },
    /// `streak` quick crashes in a row reached the threshold: report the
    /// instance failed (the scheduler replaces it).
    GiveUp { streak: u32 },
}

/// The decision after a run that lasted `ran_for` ended, `streak` being
/// the quick crashes before it: a run that lasted `stable_after` starts a
/// new streak at 1, a shorter one extends it; at `restart_threshold` the
/// supervisor gives up, otherwise it restarts after the backoff.
pub(crate) fn after_exit(
    config: &SupervisorConfig,
    streak: u32,
    ran_for: Duration,
    now: Instant,
) -> AfterExit {
    let streak = if ran_for >= config.stable_after {
        1
    } else {
        streak.saturating_add(1)
    };
    if streak >= config.restart_threshold {
        return AfterExit::GiveUp { streak };
    }
    AfterExit::RestartAt {
        streak,
        at: now + backoff(config, streak),
    }
}

/// The wait before attempt `attempt` (1 for the first retry):
/// `backoff_base` doubling per attempt, at most `backoff_max`.
pub(crate) fn backoff(config: &SupervisorConfig, attempt: u32) -> Duration {
    config
        .backoff_base
        .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1)))
        .min(config.backoff_max)
}

/// Whether an instance not yet created (or waiting for its files) may be
/// started at `now`: nothing scheduled means at once.
pub(crate) fn start_due(next_start_at: Option<Instant>, now: Instant) -> bool {
    next_start_at.is_none_or(|at| at <= now)
}

/// Whether an ended run is restarted at `now`: only once a restart was
/// scheduled (by [`after_exit`]) and its time has come.
pub(crate) fn restart_due(next_start_at: Option<Instant>, now: Instant) -> bool {
    next_start_at.is_some_and(|at| at <= now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> SupervisorConfig {
        SupervisorConfig {
            restart_threshold: 3,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            stable_after: Duration::from_secs(30),
            ..SupervisorConfig::default()
        }
    }

    #[test]
    fn quick_crashes_back_off_doubling_then_give_up_at_the_threshold() {
        let now = Instant::now();
        let quick = Duration::from_secs(1);
        assert_eq!(
            after_exit(&config(), 0, quick, now),
            AfterExit::RestartAt {
                streak: 1,
                at: now + Duration::from_secs(1)
            }
        );
        assert_eq!(
            after_exit(&config(), 1, quick, now),
            AfterExit::RestartAt {
                streak: 2,
                at: now + Duration::from_secs(2)
            }
        );
        assert_eq!(
            after_exit(&config(), 2, quick, now),
            AfterExit::GiveUp { streak: 3 }
        );
    }

    #[test]
    fn a_run_that_lasted_starts_a_new_streak() {
        let now = Instant::now();
        assert_eq!(
            after_exit(&config(), 2, Duration::from_secs(30), now),
            AfterExit::RestartAt {
                streak: 1,
                at: now + Duration::from_secs(1)
            }
        );
    }

    #[test]
    fn the_backoff_is_capped_and_never_overflows() {
        let config = config();
        assert_eq!(backoff(&config, 1), Duration::from_secs(1));
        assert_eq!(backoff(&config, 5), Duration::from_secs(16));
        assert_eq!(backoff(&config, 6), Duration::from_secs(30));
        assert_eq!(backoff(&config, u32::MAX), Duration::from_secs(30));
        let threshold_never = SupervisorConfig {
            restart_threshold: u32::MAX,
            ..config
        };
        let now = Instant::now();
        assert_eq!(
            after_exit(&threshold_never, 1_000, Duration::ZERO, now),
            AfterExit::RestartAt {
                streak: 1_001,
                at: now + Duration::from_secs(30)
            }
        );
    }

    #[test]
    fn a_start_is_due_once_its_time_has_come() {
        let now = Instant::now();
        assert!(start_due(None, now));
        assert!(start_due(Some(now), now));
        assert!(!start_due(Some(now + Duration::from_millis(1)), now));
    }

    #[test]
    fn a_restart_happens_only_when_scheduled_and_due() {
        let now = Instant::now();
        assert!(!restart_due(None, now));
        assert!(restart_due(Some(now), now));
        assert!(!restart_due(Some(now + Duration::from_millis(1)), now));
    }
}
