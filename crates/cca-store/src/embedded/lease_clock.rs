//! The embedded store's lease deadlines, kept in memory only. A lease's
//! existence and TTL are durable (keys are attached to it, so losing a
//! grant would orphan them), but its deadline is not: a renewal is a
//! mutex-guarded map update, answered at once, never queued behind the
//! writer's batches and never an fsync. Under a 5,000-node cluster that
//! is thousands of renewals a second that cost no commit and cannot be
//! starved by a slow disk.
//!
//! Why a deadline need not be durable: the only thing a persisted deadline
//! could do after a restart is expire a lease *sooner*, and sooner is
//! exactly wrong — while the store was down no holder could renew, so the
//! downtime says nothing about the holders. On open every lease therefore
//! gets one full TTL from the moment the store runs again (etcd does the
//! same when a leader takes over its leases). The same reasoning covers a
//! store that was alive but not running — the process stopped (SIGSTOP, a
//! paused VM) or the writer stalled: when the sweep finds that more than
//! [`STALL_TOLERANCE`] passed since it last looked, the unwatched time is
//! added to every deadline instead of being charged to the holders. The
//! price is that a holder that died just before a restart or a stall is
//! noticed up to that much later.
//!
//! Pure bookkeeping: the caller passes the (monotonic) time in.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Result, StoreError};
use crate::types::LeaseId;

/// A gap between two sweeps longer than this is time the store was not
/// running, not time the lease holders were silent. The writer sweeps at
/// least every 100 ms when idle and after every batch when busy.
pub(super) const STALL_TOLERANCE: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug)]
struct Deadline {
    ttl_secs: i64,
    at: Instant,
}

#[derive(Debug)]
struct Deadlines {
    leases: HashMap<LeaseId, Deadline>,
    last_sweep: Instant,
}

/// Every live lease's deadline; see the module documentation.
#[derive(Debug)]
pub(super) struct LeaseClock {
    deadlines: Mutex<Deadlines>,
}

impl LeaseClock {
    pub(super) fn new(now: Instant) -> Self {
        Self {
            deadlines: Mutex::new(Deadlines {
                leases: HashMap::new(),
                last_sweep: now,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Deadlines> {
        // Only plain map updates happen under the lock.
        self.deadlines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts (or restarts) `id`'s countdown: one full TTL from `now`.
    pub(super) fn start(&self, id: LeaseId, ttl_secs: i64, now: Instant) {
        let at = now + ttl(ttl_secs);
        self.lock().leases.insert(id, Deadline { ttl_secs, at });
    }

    /// Renews `id` for one TTL from `now` and returns the TTL. A lease
    /// that is unknown, or whose deadline has passed even if the sweep has
    /// not yet revoked it, is not found: it cannot be brought back.
    pub(super) fn renew(&self, id: LeaseId, now: Instant) -> Result<i64> {
        let mut deadlines = self.lock();
        match deadlines.leases.get_mut(&id) {
            Some(deadline) if deadline.at > now => {
                deadline.at = now + ttl(deadline.ttl_secs);
                Ok(deadline.ttl_secs)
            }
            _ => Err(StoreError::LeaseNotFound(id)),
        }
    }

    /// Stops tracking a revoked lease.
    pub(super) fn forget(&self, id: LeaseId) {
        self.lock().leases.remove(&id);
    }

    /// Removes and returns every lease whose deadline has passed at `now`,
    /// first moving every deadline past a stall (see the module docs).
    /// Returns the stall it compensated, if any, for the caller to log.
    pub(super) fn take_expired(&self, now: Instant) -> (Vec<LeaseId>, Option<Duration>) {
        let mut deadlines = self.lock();
        let gap = now.saturating_duration_since(deadlines.last_sweep);
        deadlines.last_sweep = now;
        let stall = (gap > STALL_TOLERANCE).then_some(gap);
        if let Some(stall) = stall {
            for deadline in deadlines.leases.values_mut() {
                deadline.at += stall;
            }
        }
        let mut expired: Vec<LeaseId> = deadlines
            .leases
            .iter()
            .filter(|(_, deadline)| deadline.at <= now)
            .map(|(id, _)| *id)
            .collect();
        expired.sort_unstable();
        for id in &expired {
            deadlines.leases.remove(id);
        }
        (expired, stall)
    }
}

fn ttl(ttl_secs: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_renewed_lease_outlives_its_first_deadline_and_an_idle_one_expires() {
        let start = Instant::now();
        let clock = LeaseClock::new(start);
        clock.start(1, 3, start);
        clock.start(2, 3, start);
        let mut now = start;
        for _ in 0..5 {
            now += SECOND / 2;
            assert_eq!(clock.take_expired(now).0, Vec::<LeaseId>::new());
            assert_eq!(clock.renew(1, now).expect("renews"), 3);
        }
        // Lease 2 was started 2.5 s ago; lease 1 renewed just now.
        now += SECOND;
        assert_eq!(clock.take_expired(now).0, vec![2]);
        assert!(matches!(
            clock.renew(2, now),
            Err(StoreError::LeaseNotFound(2))
        ));
        assert_eq!(clock.renew(1, now).expect("still live"), 3);
    }

    #[test]
    fn a_lease_past_its_deadline_cannot_be_renewed_before_the_sweep() {
        let start = Instant::now();
        let clock = LeaseClock::new(start);
        clock.start(7, 1, start);
        let late = start + SECOND / 2 + SECOND;
        // Keep the sweep current so that no stall is compensated.
        let _ = clock.take_expired(start + SECOND / 2);
        assert!(matches!(
            clock.renew(7, late),
            Err(StoreError::LeaseNotFound(7))
        ));
        assert_eq!(clock.take_expired(late).0, vec![7]);
    }

    #[test]
    fn time_the_sweep_did_not_run_is_not_charged_to_the_holders() {
        let start = Instant::now();
        let clock = LeaseClock::new(start);
        clock.start(1, 2, start);
        // The process was stopped for 10 s: nobody could renew.
        let resumed = start + 10 * SECOND;
        let (expired, stall) = clock.take_expired(resumed);
        assert!(expired.is_empty());
        assert_eq!(stall, Some(10 * SECOND));
        assert_eq!(clock.renew(1, resumed).expect("renews"), 2);
        // Silence after the stall counts again.
        let mut now = resumed;
        for _ in 0..4 {
            now += SECOND / 2;
            let (expired, stall) = clock.take_expired(now);
            assert!(stall.is_none());
            if now >= resumed + 2 * SECOND {
                assert_eq!(expired, vec![1]);
                return;
            }
            assert!(expired.is_empty());
        }
        panic!("the lease never expired after the stall");
    }

    #[test]
    fn forgotten_leases_neither_renew_nor_expire() {
        let start = Instant::now();
        let clock = LeaseClock::new(start);
        clock.start(4, 1, start);
        clock.forget(4);
        assert!(clock.renew(4, start).is_err());
        assert!(clock.take_expired(start + SECOND / 2 * 3).0.is_empty());
    }
}
