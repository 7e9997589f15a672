//! [`Tracker`]: the benchmark's stopwatch. It follows one watch on the
//! store (read-only: it never writes) and remembers, with the local time
//! it saw each change, where every instance is placed, since when each one
//! has been reported running, and when (local time and store revision)
//! each node's heartbeat lease expired. Scenarios ask it whether the cluster has converged and for
//! per-instance latencies.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cca_model::cluster::{Instance, InstanceState, InstanceStatus};
use cca_model::keys;
use cca_store::{Revision, Store, WatchEvent, WatchMessage};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::BenchError;

/// Where an instance is placed.
#[derive(Clone, Debug)]
pub(crate) struct Placed {
    pub(crate) node: String,
    pub(crate) stopping: bool,
    /// Store revision that created the placement.
    pub(crate) created: Revision,
}

/// When a node's heartbeat lease expired.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expiry {
    /// When the tracker saw the heartbeat key go.
    pub(crate) at: Instant,
    /// Store revision of the heartbeat key's deletion.
    pub(crate) revision: Revision,
}

#[derive(Debug, Default)]
struct Seen {
    placements: HashMap<String, Placed>,
    /// First time each instance was seen running in its current run.
    running_since: HashMap<String, Instant>,
    /// When each node's heartbeat key went away (lease expiry).
    expired: HashMap<String, Expiry>,
    /// The watch ended (compaction or store failure): figures would lie.
    broken: Option<String>,
}

/// Counts of a convergence check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Placed, not stopping, on a live node, and running.
    pub(crate) running: usize,
    /// Placed, not stopping, on a live node.
    pub(crate) placed: usize,
}

/// Follows the store and timestamps what it sees.
#[derive(Debug)]
pub(crate) struct Tracker {
    seen: Arc<Mutex<Seen>>,
    task: JoinHandle<()>,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Tracker {
    /// Starts following every change made to `store` from now on.
    pub(crate) async fn start(store: Arc<dyn Store>) -> Result<Self, BenchError> {
        let mut stream = store.watch("", 0).await?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let shared = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            loop {
                match stream.next().await {
                    Some(Ok(WatchMessage::Events { events, .. })) => {
                        let now = Instant::now();
                        let mut seen = lock(&shared);
                        for event in events {
                            seen.apply(event, now);
                        }
                    }
                    Some(Ok(WatchMessage::Compacted { compact_revision })) => {
                        lock(&shared).broken =
                            Some(format!("compacted at revision {compact_revision}"));
                        return;
                    }
                    Some(Err(error)) => {
                        lock(&shared).broken = Some(error.to_string());
                        return;
                    }
                    None => return,
                }
            }
        });
        Ok(Self { seen, task })
    }

    /// The watch's failure, if it ended.
    pub(crate) fn broken(&self) -> Option<String> {
        lock(&self.seen).broken.clone()
    }

    /// How many instances on nodes not in `dead` are placed and running.
    pub(crate) fn progress(&self, dead: &HashSet<String>) -> Progress {
        let seen = lock(&self.seen);
        let mut progress = Progress::default();
        for (id, placed) in &seen.placements {
            if placed.stopping || dead.contains(&placed.node) {
                continue;
            }
            progress.placed += 1;
            if seen.running_since.contains_key(id) {
                progress.running += 1;
            }
        }
        progress
    }

    /// Every live placement: instance id → placement.
    pub(crate) fn placements(&self) -> HashMap<String, Placed> {
        lock(&self.seen).placements.clone()
    }

    /// For each instance placed (not stopping) on a live node, running,
    /// and not in `before`: how long after `since` it was first running.
    pub(crate) fn new_latencies(
        &self,
        before: &HashSet<String>,
        dead: &HashSet<String>,
        since: Instant,
    ) -> Vec<std::time::Duration> {
        let seen = lock(&self.seen);
        seen.placements
            .iter()
            .filter(|(id, placed)| {
                !placed.stopping && !dead.contains(&placed.node) && !before.contains(*id)
            })
            .filter_map(|(id, _)| seen.running_since.get(id))
            .map(|at| at.saturating_duration_since(since))
            .collect()
    }

    /// When each of `nodes` lost its heartbeat lease (those that did).
    pub(crate) fn expiries(&self, nodes: &HashSet<String>) -> HashMap<String, Expiry> {
        let seen = lock(&self.seen);
        nodes
            .iter()
            .filter_map(|node| Some((node.clone(), *seen.expired.get(node)?)))
            .collect()
    }
}

fn lock(seen: &Mutex<Seen>) -> MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Seen {
    fn apply(&mut self, event: WatchEvent, now: Instant) {
        match event {
            WatchEvent::Put(kv) => {
                if let Some(rest) = kv.key.strip_prefix(keys::DERIVED_INSTANCES) {
                    self.placed(rest, &kv.value, kv.create_revision);
                } else if let Some(id) = kv.key.strip_prefix(keys::OBSERVED_INSTANCES) {
                    self.reported(id, &kv.value, now);
                } else if let Some(node) = kv.key.strip_prefix(keys::OBSERVED_HEARTBEATS) {
                    self.expired.remove(node);
                }
            }
            WatchEvent::Delete { key, revision } => {
                if let Some(rest) = key.strip_prefix(keys::DERIVED_INSTANCES) {
                    if let Some((_, id)) = rest.split_once('/') {
                        self.placements.remove(id);
                    }
                } else if let Some(id) = key.strip_prefix(keys::OBSERVED_INSTANCES) {
                    self.running_since.remove(id);
                } else if let Some(node) = key.strip_prefix(keys::OBSERVED_HEARTBEATS) {
                    self.expired
                        .insert(node.to_owned(), Expiry { at: now, revision });
                }
            }
        }
    }

    /// `rest` is `{service}/{id}`.
    fn placed(&mut self, rest: &str, value: &[u8], created: Revision) {
        let Ok(instance) = serde_json::from_slice::<Instance>(value) else {
            tracing::warn!(key = rest, "an undecodable placement");
            return;
        };
        self.placements.insert(
            instance.id,
            Placed {
                node: instance.node,
                stopping: instance.stopping,
                created,
            },
        );
    }

    fn reported(&mut self, id: &str, value: &[u8], now: Instant) {
        let Ok(status) = serde_json::from_slice::<InstanceStatus>(value) else {
            tracing::warn!(instance = id, "an undecodable report");
            return;
        };
        if status.state == InstanceState::Running {
            self.running_since.entry(id.to_owned()).or_insert(now);
        } else {
            self.running_since.remove(id);
        }
    }
}
