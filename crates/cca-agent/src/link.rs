//! The agent's link to the control plane, through the API only: register
//! the node and keep its heartbeat lease alive (registering again when the
//! lease is gone), and follow the node's assignment stream into the cached
//! [`Desired`] state. Every loop retries with backoff while the API is
//! unreachable; the supervisor keeps working from the cache meanwhile.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cca_wire::types::{AssignmentLine, RegisterRequest};
use cca_wire::{Client, ClientResult, LineStream};
use tokio::sync::watch;

use crate::desired::{Applied, Desired};

/// Delay between attempts while the API is unreachable: 100 ms doubling
/// to 5 s, jittered.
#[derive(Debug)]
pub(crate) struct Retry {
    step: Duration,
}

impl Retry {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    pub(crate) fn new() -> Self {
        Self { step: Self::FIRST }
    }

    pub(crate) fn reset(&mut self) {
        self.step = Self::FIRST;
    }

    pub(crate) async fn wait(&mut self) {
        let step = self.step;
        self.step = (self.step * 2).min(Self::MAX);
        tokio::time::sleep(step / 2 + (step / 2).mul_f64(fastrand::f64())).await;
    }
}

/// Registers the node and keeps its lease alive until `stop`.
pub(crate) async fn keep_registered(
    client: Client,
    request: RegisterRequest,
    connected: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut retry = Retry::new();
    loop {
        let registration = tokio::select! {
            registration = client.register(&request) => registration,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        let reply = match registration {
            Ok(reply) => reply,
            Err(error) => {
                tracing::warn!(%error, "registering the node failed; retrying");
                let _ = connected.send(false);
                retry.wait().await;
                continue;
            }
        };
        retry.reset();
        let _ = connected.send(true);
        tracing::info!(node = %request.name, lease = reply.lease_id, "registered");
        let period = Duration::from_secs(reply.ttl_secs.max(1)) / 3;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = stop.wait_for(|stop| *stop) => return,
            }
            match client.heartbeat(&request.name, reply.lease_id).await {
                Ok(_) => {
                    let _ = connected.send(true);
                }
                Err(error) if error.status() == Some(409) || error.status() == Some(404) => {
                    tracing::warn!(%error, "the node's lease is gone; registering again");
                    break;
                }
                Err(error) => {
                    let _ = connected.send(false);
                    tracing::warn!(%error, "heartbeat failed");
                }
            }
        }
    }
}

/// Follows the node's assignments into `desired`, caching each change on
/// disk under `dir`, until `stop`.
pub(crate) async fn follow_assignments(
    client: Client,
    node: String,
    dir: PathBuf,
    desired: watch::Sender<Arc<Desired>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut retry = Retry::new();
    let mut resume_from = 0;
    loop {
        let stream = tokio::select! {
            stream = client.assignments(&node, resume_from) => stream,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        let mut stream = match stream {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(%error, "assignment stream unavailable; retrying");
                retry.wait().await;
                continue;
            }
        };
        loop {
            let line = tokio::select! {
                line = stream.next() => line,
                _ = stop.wait_for(|stop| *stop) => return,
            };
            let mut next = Desired::clone(&desired.borrow());
            let (changed, burst) = apply_burst(line, &mut stream, &mut next).await;
            if changed {
                retry.reset();
                let next = save(next, &dir).await;
                resume_from = next.revision + 1;
                desired.send_replace(Arc::new(next));
            }
            match burst {
                Burst::Continues => {}
                Burst::Reconnect => break,
                Burst::Resnapshot => {
                    resume_from = 0;
                    break;
                }
            }
        }
        retry.wait().await;
    }
}

/// How the lines read at once ended.
enum Burst {
    /// The stream goes on.
    Continues,
    /// The stream broke or ended: resume it.
    Reconnect,
    /// The server can no longer resume it: start from a snapshot.
    Resnapshot,
}

/// A burst goes on while lines follow each other this closely…
const BURST_GAP: Duration = Duration::from_millis(5);
/// …for at most this long.
const BURST_MAX: Duration = Duration::from_millis(50);

/// Applies `first` and the lines that follow it closely to `next`, so
/// the cache is written once per burst: a deploy sends a node its
/// assignments one line each, and writing the whole cache per line was
/// quadratic in the node's assignments (a quarter of the CPU of a
/// 100,000-instance deploy). Costs a change at most [`BURST_MAX`]. True
/// when `next` changed.
async fn apply_burst(
    first: Option<ClientResult<AssignmentLine>>,
    stream: &mut LineStream<AssignmentLine>,
    next: &mut Desired,
) -> (bool, Burst) {
    let deadline = tokio::time::Instant::now() + BURST_MAX;
    let mut changed = false;
    let mut line = first;
    loop {
        match line {
            Some(Ok(assignment)) => match next.apply(assignment) {
                Applied::Resnapshot => return (changed, Burst::Resnapshot),
                Applied::Changed => changed = true,
            },
            Some(Err(error)) => {
                tracing::warn!(%error, "assignment stream broke; reconnecting");
                return (changed, Burst::Reconnect);
            }
            None => return (changed, Burst::Reconnect),
        }
        line = match stream.next_buffered() {
            Some(buffered) => Some(buffered),
            None => {
                let wait = BURST_GAP.min(deadline - tokio::time::Instant::now().min(deadline));
                match tokio::time::timeout(wait, stream.next()).await {
                    Ok(arrived) => arrived,
                    Err(_) => return (changed, Burst::Continues),
                }
            }
        };
    }
}

/// Writes the cache off the async workers (it is a file write and an
/// fsync); returns the state for the caller to publish.
async fn save(next: Desired, dir: &std::path::Path) -> Desired {
    let dir = dir.to_path_buf();
    let published = next.clone();
    let saved = tokio::task::spawn_blocking(move || next.save(&dir)).await;
    match saved {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::error!(%error, "caching the desired state failed"),
        Err(error) => tracing::error!(%error, "caching the desired state did not finish"),
    }
    published
}
