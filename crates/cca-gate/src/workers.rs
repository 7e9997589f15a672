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
    /// Starts `count` workers (at least one).
    pub fn start(count: usize) -> std::io::Result<Self> {
        let workers = (0..count.max(1))
            .map(Worker::start)
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

impl Worker {
    fn start(index: usize) -> std::io::Result<Self> {
        let runtime = Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("cca-gate-{index}"))
            .spawn(move || {
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
        let workers = Workers::start(2).expect("workers");
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

    #[tokio::test]
    async fn at_least_one_worker_starts_and_dropping_them_drops_their_tasks() {
        let workers = Workers::start(0).expect("workers");
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
