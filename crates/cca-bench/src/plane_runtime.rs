//! [`PlaneRuntime`]: the tokio runtime the benchmark's control plane runs
//! on, apart from the caller's runtime where the store and the agents
//! stay — as a server process is apart from its etcd and its machines —
//! so that the harness can stop the control plane alone, as SIGSTOP stops
//! a process: [`PlaneRuntime::hold`] blocks every worker thread of the
//! runtime until the returned [`Held`] is dropped. Nothing scheduled on
//! the runtime runs meanwhile (no task is polled, no timer or socket of
//! its own is driven); blocking work already handed to its blocking pool
//! goes on, as a stopped process's pending disk writes would.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::runtime::{Handle, Runtime};

use crate::BenchError;

/// How long holding waits for every worker to be caught: one busy with a
/// long poll (a scheduler pass) picks its hold up once that poll ends.
const CATCH_WORKERS: Duration = Duration::from_secs(30);
/// How long shutting the runtime down waits for its tasks to stop.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// A multi-thread runtime of its own; dropping it never blocks and never
/// panics, even inside another runtime.
#[derive(Debug)]
pub(crate) struct PlaneRuntime {
    runtime: Option<Runtime>,
    handle: Handle,
    workers: usize,
}

/// The name of the control plane's threads.
pub(crate) const PLANE_THREAD_NAME: &str = "cca-bench-plane";
/// The name of the control plane's liveness listener's thread.
pub(crate) const LIVENESS_THREAD_NAME: &str = "cca-bench-liveness";

impl PlaneRuntime {
    /// Starts a runtime of `workers` worker threads (at least one).
    pub(crate) fn new(workers: usize) -> Result<Self, BenchError> {
        Self::named(workers, PLANE_THREAD_NAME)
    }

    /// The same, its threads named `name`.
    pub(crate) fn named(workers: usize, name: &str) -> Result<Self, BenchError> {
        let workers = workers.max(1);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .thread_name(name)
            .enable_all()
            .build()
            .map_err(BenchError::io("starting the control plane's runtime"))?;
        Ok(Self {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
            workers,
        })
    }

    /// Where to spawn the control plane's tasks (or `enter` to let code
    /// that calls `tokio::spawn` spawn there).
    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Blocks every worker thread of the runtime; returns once all of them
    /// are held, and holds them until the [`Held`] is dropped. One hold
    /// task per worker, each blocking its thread on a condition variable:
    /// a worker blocked in one cannot poll another, so when every hold has
    /// begun, every worker is in one. Fails (holding nothing) when not
    /// every worker is caught within 30 s.
    pub(crate) async fn hold(&self) -> Result<Held, BenchError> {
        let gate = Arc::new(Gate::default());
        let held = Held {
            gate: Arc::clone(&gate),
        };
        for _ in 0..self.workers {
            let gate = Arc::clone(&gate);
            // Spawned from outside the runtime, the holds go to its shared
            // queue, which every free worker takes from.
            self.handle.spawn(async move { gate.hold() });
        }
        let waiting = Arc::clone(&gate);
        let workers = self.workers;
        let caught = tokio::task::spawn_blocking(move || waiting.wait_held(workers, CATCH_WORKERS))
            .await
            .map_err(|error| BenchError::Task {
                what: "control plane freeze".into(),
                problem: error.to_string(),
            })?;
        if !caught {
            return Err(BenchError::Timeout {
                what: format!("all {workers} worker threads of the control plane held"),
                timeout: CATCH_WORKERS,
            });
        }
        Ok(held)
    }

    /// Stops the runtime, waiting a little for its tasks on a blocking
    /// thread (a runtime may not be shut down in async code).
    pub(crate) async fn shut_down(mut self) {
        if let Some(runtime) = self.runtime.take() {
            let stopped =
                tokio::task::spawn_blocking(move || runtime.shutdown_timeout(SHUTDOWN_WAIT)).await;
            if let Err(error) = stopped {
                tracing::warn!(%error, "shutting the control plane's runtime down failed");
            }
        }
    }
}

impl Drop for PlaneRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The runtime's workers, held until this is dropped.
#[derive(Debug)]
pub(crate) struct Held {
    gate: Arc<Gate>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.gate.release();
    }
}

/// Where hold tasks wait: how many are held, and whether to let go.
#[derive(Debug, Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    held: usize,
    released: bool,
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Blocks the calling thread until released.
    fn hold(&self) {
        let mut state = self.lock();
        state.held += 1;
        self.changed.notify_all();
        while !state.released {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.held -= 1;
    }

    /// Waits until `workers` threads are held; false after `timeout`.
    fn wait_held(&self, workers: usize, timeout: Duration) -> bool {
        let (state, _) = self
            .changed
            .wait_timeout_while(self.lock(), timeout, |state| {
                state.held < workers && !state.released
            })
            .unwrap_or_else(PoisonError::into_inner);
        state.held >= workers
    }

    fn release(&self) {
        self.lock().released = true;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// Waits (on the caller's runtime) until `ticks` passes `above`.
    async fn ticks_past(ticks: &AtomicU64, above: u64) -> u64 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let now = ticks.load(Ordering::SeqCst);
            if now > above {
                return now;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the runtime never ticked past {above}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_runtime_runs_nothing_until_released() {
        let plane = PlaneRuntime::new(3).expect("a runtime");
        let ticks = Arc::new(AtomicU64::new(0));
        // Tickers on every worker: timers and busy yields alike.
        for busy in [false, true, true, true] {
            let ticks = Arc::clone(&ticks);
            plane.handle().spawn(async move {
                loop {
                    if busy {
                        tokio::task::yield_now().await;
                    } else {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    ticks.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        ticks_past(&ticks, 100).await;
        let held = plane.hold().await.expect("every worker held");
        let frozen_at = ticks.load(Ordering::SeqCst);
        let (sent, mut received) = tokio::sync::oneshot::channel();
        plane.handle().spawn(async move { sent.send(()) });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(ticks.load(Ordering::SeqCst), frozen_at, "a task ran");
        assert!(received.try_recv().is_err(), "a new task ran");
        drop(held);
        ticks_past(&ticks, frozen_at).await;
        tokio::time::timeout(Duration::from_secs(10), received)
            .await
            .expect("the new task runs once released")
            .expect("sent");
        // Held and released again: the gate is per hold.
        let again = plane.hold().await.expect("held again");
        drop(again);
        let after = ticks.load(Ordering::SeqCst);
        ticks_past(&ticks, after).await;
        plane.shut_down().await;
    }

    #[tokio::test]
    async fn dropping_the_runtime_in_async_code_does_not_panic() {
        let plane = PlaneRuntime::new(1).expect("a runtime");
        plane.handle().spawn(std::future::pending::<()>());
        drop(plane);
        let plane = PlaneRuntime::new(1).expect("a runtime");
        plane.handle().spawn(std::future::pending::<()>());
        plane.shut_down().await;
    }
}
