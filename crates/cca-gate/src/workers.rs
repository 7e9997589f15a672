//! The gate's worker threads: one single-threaded tokio runtime per core,
//! as nginx has one worker process per core. A listener accepts on the
//! runtime that called [`crate::Gate::serve`] and hands each connection to
//! a worker, where it stays for its whole life: its requests, its TLS
//! session and the backend connections its requests use run on that one
//! thread. A work-stealing runtime moved connections between threads and
//! woke parked threads to do so; on a busy gate those wake-ups and the
//! cache lines they move cost more than the stealing balanced.
//!
//! Connections go to the worker with the fewest open, so a worker that
//! got long-lived ones does not get more than its share.
//!
//! Each worker keeps to a CPU of its own when there are CPUs enough
//! ([`cpus_for`]; `ServerOptions::pin_workers`). A busy worker rarely
//! sleeps, and the kernel, placing a thread near the one that woke it,
//! kept stacking two workers on one CPU, where they took turns of a
//! scheduler tick (4 ms) while the other CPU had room: every turn stalled
//! the waiting worker's connections, the gate's p99 doubled. Kept apart,
//! each worker shares its CPU only with what else the machine runs, which
//! can still move (docs/benchmarks.md, "Gates against nginx").

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

/// The worker threads of one [`crate::Gate::serve`]; they stop when this
/// is dropped, dropping what they still run.
#[derive(Debug)]
pub struct Workers {
    workers: Vec<Worker>,
}

#[derive(Debug)]
struct Worker {
    handle: Handle,
    open: Arc<AtomicUsize>,
    /// Dropped to end the thread.
    _stop: oneshot::Sender<()>,
}

impl Workers {
    /// Starts `count` workers (at least one), each kept to a CPU of its
    /// own when `pin` and the process may use as many CPUs.
    pub fn start(count: usize, pin: bool) -> std::io::Result<Self> {
        let count = count.max(1);
        let cpus = if pin {
            cpus_for(count, &allowed_cpus())
        } else {
            vec![None; count]
        };
        if pin && cpus.iter().all(Option::is_none) {
            tracing::info!(
                workers = count,
                "the gate's workers are not kept to CPUs of their own: the process may use fewer CPUs than that"
            );
        }
        let workers = cpus
            .into_iter()
            .enumerate()
            .map(|(index, cpu)| Worker::start(index, cpu))
            .collect::<std::io::Result<_>>()?;
        Ok(Self { workers })
    }

    /// The worker with the fewest open connections, and a token that
    /// counts one more there until it drops.
    pub fn least_busy(&self) -> (&Handle, Placed) {
        let worker = self
            .workers
            .iter()
            .min_by_key(|worker| worker.open.load(Ordering::Relaxed))
            .expect("Workers::start starts at least one");
        worker.open.fetch_add(1, Ordering::Relaxed);
        (&worker.handle, Placed(Arc::clone(&worker.open)))
    }
}

/// A connection counted on its worker.
#[derive(Debug)]
pub struct Placed(Arc<AtomicUsize>);

impl Drop for Placed {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The CPU each of `count` workers keeps to: the one of `allowed` (the
/// CPUs the process may use) at its index, or none for every worker when
/// there are fewer CPUs than workers (two workers kept to one CPU would
/// take turns at it while another might be free).
pub fn cpus_for(count: usize, allowed: &[usize]) -> Vec<Option<usize>> {
    if allowed.len() < count {
        return vec![None; count];
    }
    allowed.iter().take(count).copied().map(Some).collect()
}

/// The CPUs the calling thread may run on (none when unreadable).
fn allowed_cpus() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&cpu| set.is_set(cpu))
            .collect(),
        Err(error) => {
            tracing::warn!(%error, "the gate cannot read which CPUs it may use; its workers are not kept to CPUs of their own");
            Vec::new()
        }
    }
}

/// Keeps the calling thread to `cpu`; a worker that cannot be kept to it
/// runs wherever the kernel puts it, said once in the log.
fn keep_to(cpu: usize) {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    if let Err(error) = rustix::thread::sched_setaffinity(None, &set) {
        tracing::warn!(cpu, %error, "a gate worker could not be kept to its CPU; it runs on any");
    }
}

impl Worker {
    fn start(index: usize, cpu: Option<usize>) -> std::io::Result<Self> {
        let runtime = Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("cca-gate-{index}"))
            .spawn(move || {
                if let Some(cpu) = cpu {
                    keep_to(cpu);
                }
                crate::sharded::claim(index);
                // Dropping the runtime here, off any async context, drops
                // the tasks still on it.
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(Self {
            handle,
            open: Arc::default(),
            _stop: stop,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn thread_of(handle: &Handle) -> String {
        handle
            .spawn(async { std::thread::current().name().map(str::to_owned) })
            .await
            .expect("no panic")
            .expect("a named thread")
    }

    #[tokio::test]
    async fn connections_go_to_the_least_busy_worker_and_run_on_its_thread() {
        let workers = Workers::start(2, false).expect("workers");
        let (first, first_placed) = workers.least_busy();
        let first_thread = thread_of(first).await;
        let (second, _second_placed) = workers.least_busy();
        let second_thread = thread_of(second).await;
        assert!(first_thread.starts_with("cca-gate-"), "{first_thread}");
        assert!(second_thread.starts_with("cca-gate-"), "{second_thread}");
        assert_ne!(first_thread, second_thread, "spread over both");
        drop(first_placed);
        let (third, _third_placed) = workers.least_busy();
        assert_eq!(thread_of(third).await, first_thread, "the one freed");
    }

    #[test]
    fn each_worker_gets_a_cpu_of_its_own_or_none_does() {
        assert_eq!(cpus_for(2, &[0, 1, 2, 3]), [Some(0), Some(1)]);
        assert_eq!(cpus_for(2, &[3, 5]), [Some(3), Some(5)], "the CPUs allowed");
        assert_eq!(cpus_for(3, &[0, 1]), [None, None, None], "never two on one");
        assert_eq!(cpus_for(1, &[]), [None], "unknown: not kept");
    }

    async fn cpus_of(handle: &Handle) -> Vec<usize> {
        handle
            .spawn(async { allowed_cpus() })
            .await
            .expect("no panic")
    }

    #[tokio::test]
    async fn pinned_workers_run_on_their_own_cpus_and_too_many_run_anywhere() {
        let allowed = allowed_cpus();
        assert!(!allowed.is_empty(), "the process may run somewhere");
        let workers = Workers::start(allowed.len(), true).expect("workers");
        for (worker, cpu) in workers.workers.iter().zip(&allowed) {
            assert_eq!(cpus_of(&worker.handle).await, [*cpu]);
        }
        let crowded = Workers::start(allowed.len() + 1, true).expect("workers");
        for worker in &crowded.workers {
            assert_eq!(cpus_of(&worker.handle).await, allowed, "not kept");
        }
        let unpinned = Workers::start(1, false).expect("workers");
        assert_eq!(cpus_of(&unpinned.workers[0].handle).await, allowed);
    }

    #[tokio::test]
    async fn at_least_one_worker_starts_and_dropping_them_drops_their_tasks() {
        let workers = Workers::start(0, true).expect("workers");
        let (handle, _placed) = workers.least_busy();
        let (dropped, mut told) = tokio::sync::mpsc::channel::<()>(1);
        struct Tell(tokio::sync::mpsc::Sender<()>);
        impl Drop for Tell {
            fn drop(&mut self) {
                let _ = self.0.try_send(());
            }
        }
        let running = Tell(dropped);
        handle.spawn(async move {
            let _running = running;
            std::future::pending::<()>().await;
        });
        drop(workers);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), told.recv()).await;
        assert_eq!(ended, Ok(Some(())), "the worker's task was dropped");
    }
}
