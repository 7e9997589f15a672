//! How many transactions go to etcd at once: a window that adapts to how
//! long etcd takes to answer them. etcd answers a transaction once it has
//! applied it, and since 3.4.20 it holds every lease renewal until its
//! apply loop has caught up with what raft committed ("linearizable
//! renew"). Transactions sent faster than etcd applies them queue up
//! behind raft; every renewal then waits out that queue, and when it grows
//! past a lease's TTL, healthy agents' leases expire (seen with 5,000
//! agents during a 100,000-instance deploy: transactions took up to
//! 2.8 s). So the window shrinks when answers come slower than
//! [`TARGET`] and grows back while they are quicker: additive increase,
//! multiplicative decrease, as TCP paces a link it cannot see into.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Transaction latency the window aims under: short next to a lease's
/// renewal period, long next to a healthy etcd's commit (a few ms).
const TARGET: Duration = Duration::from_millis(250);
/// The window's bounds and start.
const MIN_WINDOW: f64 = 1.0;
const START_WINDOW: f64 = 16.0;
/// A slow answer cuts the window to this share of itself.
const CUT: f64 = 0.75;

/// The adaptive window; see the module documentation.
#[derive(Debug)]
pub(super) struct WriteWindow {
    max: f64,
    state: Mutex<State>,
    freed: Notify,
}

#[derive(Debug)]
struct State {
    window: f64,
    in_flight: usize,
    /// When the window was last cut: answers to transactions sent before
    /// then were sent under the larger window and do not cut it again.
    last_cut: Instant,
}

/// A transaction's place in the window, given back when dropped.
#[derive(Debug)]
pub(super) struct Slot<'a> {
    window: &'a WriteWindow,
    sent: Instant,
}

impl WriteWindow {
    /// A window of at most `max` transactions.
    pub(super) fn new(max: usize) -> Self {
        let max = (max as f64).max(MIN_WINDOW);
        Self {
            max,
            state: Mutex::new(State {
                window: START_WINDOW.min(max),
                in_flight: 0,
                last_cut: Instant::now(),
            }),
            freed: Notify::new(),
        }
    }

    /// Waits for room in the window.
    pub(super) async fn enter(&self) -> Slot<'_> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the check, so a slot freed between the
            // check and the wait still wakes this caller.
            freed.as_mut().enable();
            {
                let mut state = self.lock();
                if (state.in_flight as f64) < state.window.floor() {
                    state.in_flight += 1;
                    return Slot {
                        window: self,
                        sent: Instant::now(),
                    };
                }
            }
            freed.await;
        }
    }

    /// The current window, rounded down (what may be in flight).
    #[cfg(test)]
    fn window(&self) -> usize {
        self.lock().window.floor() as usize
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adjusts the window to an answer that took `latency`, for a
    /// transaction sent at `sent`.
    fn answered(&self, sent: Instant, latency: Duration) {
        let mut state = self.lock();
        if latency > TARGET {
            if sent >= state.last_cut {
                state.window = (state.window * CUT).max(MIN_WINDOW);
                state.last_cut = Instant::now();
            }
        } else {
            // About one more per window's worth of quick answers.
            state.window = (state.window + 1.0 / state.window).min(self.max);
        }
    }
}

impl Slot<'_> {
    /// The transaction ended (answered, refused or timed out): how long it
    /// took tells the window how etcd keeps up. A slot dropped without
    /// this (its caller gave up) only frees its place.
    pub(super) fn answered(self) {
        self.window.answered(self.sent, self.sent.elapsed());
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.window.lock().in_flight -= 1;
        self.window.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn slow_answers_shrink_the_window_once_per_window_and_quick_ones_grow_it() {
        let window = WriteWindow::new(128);
        assert_eq!(window.window(), 16);
        let mut slots = Vec::new();
        for _ in 0..16 {
            slots.push(window.enter().await);
        }
        tokio::time::advance(TARGET * 2).await;
        // Sixteen slow answers to transactions sent under one window cut
        // it once, not sixteen times.
        for slot in slots {
            slot.answered();
        }
        assert_eq!(window.window(), 12);
        let slot = window.enter().await;
        tokio::time::advance(TARGET * 2).await;
        slot.answered();
        assert_eq!(window.window(), 9, "sent after the cut, it cuts again");

        for _ in 0..200 {
            window.enter().await.answered();
        }
        assert!(window.window() > 20, "{}", window.window());
        for _ in 0..100_000 {
            window.enter().await.answered();
        }
        assert_eq!(window.window(), 128, "bounded by its maximum");
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_never_closes_and_a_full_one_waits_for_a_slot() {
        let window = WriteWindow::new(128);
        for _ in 0..50 {
            let slot = window.enter().await;
            tokio::time::advance(TARGET * 2).await;
            slot.answered();
        }
        assert_eq!(window.window(), 1, "at least one transaction may go");
        let first = window.enter().await;
        assert!(
            tokio::time::timeout(Duration::from_secs(1), window.enter())
                .await
                .is_err(),
            "the window is full"
        );
        let freed_at = Instant::now() + Duration::from_secs(1);
        let ((), second) = tokio::join!(
            async move {
                tokio::time::sleep_until(freed_at).await;
                drop(first);
            },
            window.enter()
        );
        assert!(Instant::now() >= freed_at, "entered once a slot was freed");
        drop(second);
    }
}
