//! [`Tracker`]: the benchmark's stopwatch. It follows one watch on the
//! store (read-only: it never writes) and remembers, with the local time
//! it saw each change, where every instance is placed, since when each one
//! has been reported running, and when (local time and store revision)
//! each node's heartbeat lease expired. Scenarios ask it whether the cluster has converged and for
//! per-instance latencies. A watch that falls behind compaction is
//! repaired as the control plane's cache repairs its own: it relists and
//! watches on from the list, and what changed in the gap is timed when the
//! list was read (an upper bound).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cca_model::cluster::{Instance, InstanceState, InstanceStatus};
use cca_model::{Key, Kind};
use cca_store::{KeyValue, RangeRequest, Revision, Store, WatchEvent, WatchMessage};
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
    /// [`Progress`] per node, kept up to date with every change so that
    /// a convergence check costs O(nodes), not O(instances): scenarios
    /// check every 10 ms, and walking 100,000 placements that often took
    /// a fifth of the 2 cores from the control plane being measured.
    per_node: HashMap<String, Progress>,
    /// When each node's heartbeat key went away (lease expiry).
    expired: HashMap<String, Expiry>,
    /// The watch failed and could not be repaired: figures would lie.
    broken: Option<String>,
    /// Times the watch fell behind compaction and was repaired by a list.
    relists: u32,
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
        let stream = store.watch("", 0).await?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let task = tokio::spawn(follow(store, stream, Arc::clone(&seen)));
        Ok(Self { seen, task })
    }

    /// How many times the watch was repaired by relisting.
    pub(crate) fn relists(&self) -> u32 {
        lock(&self.seen).relists
    }

    /// The watch's failure, if it ended.
    pub(crate) fn broken(&self) -> Option<String> {
        lock(&self.seen).broken.clone()
    }

    /// How many instances on nodes not in `dead` are placed and running.
    pub(crate) fn progress(&self, dead: &HashSet<String>) -> Progress {
        lock(&self.seen).progress(dead)
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

/// Applies the watch until it ends; relists and watches again when it
/// falls behind compaction.
async fn follow(store: Arc<dyn Store>, mut stream: cca_store::WatchStream, seen: Arc<Mutex<Seen>>) {
    loop {
        match stream.next().await {
            Some(Ok(WatchMessage::Events { events, .. })) => {
                let now = Instant::now();
                let mut seen = lock(&seen);
                for event in events {
                    seen.apply(event, now);
                }
            }
            Some(Ok(WatchMessage::Compacted { compact_revision })) => {
                tracing::info!(
                    compact_revision,
                    "the tracker fell behind compaction; relisting"
                );
                match relist(store.as_ref(), &seen).await {
                    Ok(stream_from) => stream = stream_from,
                    Err(error) => {
                        lock(&seen).broken = Some(format!(
                            "compacted at revision {compact_revision}, and relisting failed: {error}"
                        ));
                        return;
                    }
                }
            }
            Some(Err(error)) => {
                lock(&seen).broken = Some(error.to_string());
                return;
            }
            None => return,
        }
    }
}

/// Reads what the tracker follows, replaces its state with it and opens
/// the watch right after the list.
async fn relist(
    store: &dyn Store,
    seen: &Mutex<Seen>,
) -> Result<cca_store::WatchStream, cca_store::StoreError> {
    let mut listed = Listed::default();
    let mut revision = None;
    for kind in [
        Kind::Instance,
        Kind::InstanceStatus,
        Kind::Node,
        Kind::Heartbeat,
    ] {
        let mut request = RangeRequest::prefix(kind.prefix()).limit(LIST_PAGE);
        loop {
            let page = store.range(request.clone()).await?;
            revision.get_or_insert(page.revision);
            for kv in page.kvs {
                listed.add(kv);
            }
            match page.continuation {
                Some(last) => request = request.after(last),
                None => break,
            }
        }
    }
    // Later pages may hold newer changes; replaying them is harmless.
    let revision = revision.unwrap_or(0);
    let stream = store.watch("", revision + 1).await?;
    let mut seen = lock(seen);
    seen.resync(listed, revision, Instant::now());
    seen.relists += 1;
    Ok(stream)
}

/// Keys per page while relisting.
const LIST_PAGE: usize = 5_000;

/// What a relist read.
#[derive(Debug, Default)]
struct Listed {
    placements: Vec<KeyValue>,
    statuses: Vec<KeyValue>,
    nodes: HashSet<String>,
    heartbeats: HashSet<String>,
}

impl Listed {
    fn add(&mut self, kv: KeyValue) {
        match Key::parse(&kv.key) {
            Some(Key::Instance { .. }) => self.placements.push(kv),
            Some(Key::InstanceStatus { .. }) => self.statuses.push(kv),
            Some(Key::Node { node }) => {
                self.nodes.insert(node);
            }
            Some(Key::Heartbeat { node }) => {
                self.heartbeats.insert(node);
            }
            _ => {}
        }
    }
}

/// The instance id an event is about, if any.
fn instance_of(event: &WatchEvent) -> Option<String> {
    let key = match event {
        WatchEvent::Put(kv) => kv.key.as_str(),
        WatchEvent::Delete { key, .. } => key.as_str(),
    };
    match Key::parse(key)? {
        Key::Instance { id, .. } | Key::InstanceStatus { id } => Some(id),
        _ => None,
    }
}

fn lock(seen: &Mutex<Seen>) -> MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Seen {
    /// Replaces what the watch built with what a list at `revision` read:
    /// instances running already keep when they were first seen running,
    /// others that run now are timed `now`; a node without its heartbeat
    /// lost it at `now` unless its loss was seen.
    fn resync(&mut self, listed: Listed, revision: Revision, now: Instant) {
        self.placements.clear();
        for kv in &listed.placements {
            if let Some(Key::Instance { id, .. }) = Key::parse(&kv.key) {
                self.placed(&id, &kv.value, kv.create_revision);
            }
        }
        let before = std::mem::take(&mut self.running_since);
        for kv in &listed.statuses {
            if let Some(Key::InstanceStatus { id }) = Key::parse(&kv.key) {
                let since = before.get(&id).copied().unwrap_or(now);
                self.reported(&id, &kv.value, since);
            }
        }
        for node in &listed.nodes {
            if listed.heartbeats.contains(node) {
                self.expired.remove(node);
            } else {
                self.expired
                    .entry(node.clone())
                    .or_insert(Expiry { at: now, revision });
            }
        }
        self.recount();
    }

    /// Rebuilds `per_node` from the placements.
    fn recount(&mut self) {
        self.per_node.clear();
        let ids: Vec<String> = self.placements.keys().cloned().collect();
        for id in ids {
            self.count(&id, true);
        }
    }

    fn progress(&self, dead: &HashSet<String>) -> Progress {
        let mut progress = Progress::default();
        for (node, counts) in &self.per_node {
            if !dead.contains(node) {
                progress.placed += counts.placed;
                progress.running += counts.running;
            }
        }
        progress
    }

    /// Applies `event`, keeping `per_node` in step: the instance it is
    /// about is uncounted before and counted again after.
    fn apply(&mut self, event: WatchEvent, now: Instant) {
        let instance = instance_of(&event);
        if let Some(id) = &instance {
            self.count(id, false);
        }
        self.change(event, now);
        if let Some(id) = &instance {
            self.count(id, true);
        }
    }

    /// Adds (or takes away) instance `id`'s share of its node's progress.
    fn count(&mut self, id: &str, add: bool) {
        let Some(placed) = self.placements.get(id) else {
            return;
        };
        if placed.stopping {
            return;
        }
        let running = usize::from(self.running_since.contains_key(id));
        let counts = self.per_node.entry(placed.node.clone()).or_default();
        if add {
            counts.placed += 1;
            counts.running += running;
        } else {
            counts.placed -= 1;
            counts.running -= running;
        }
    }

    fn change(&mut self, event: WatchEvent, now: Instant) {
        match event {
            WatchEvent::Put(kv) => match Key::parse(&kv.key) {
                Some(Key::Instance { id, .. }) => self.placed(&id, &kv.value, kv.create_revision),
                Some(Key::InstanceStatus { id }) => self.reported(&id, &kv.value, now),
                Some(Key::Heartbeat { node }) => {
                    self.expired.remove(&node);
                }
                _ => {}
            },
            WatchEvent::Delete { key, revision } => match Key::parse(&key) {
                Some(Key::Instance { id, .. }) => {
                    self.placements.remove(&id);
                }
                Some(Key::InstanceStatus { id }) => {
                    self.running_since.remove(&id);
                }
                Some(Key::Heartbeat { node }) => {
                    self.expired.insert(node, Expiry { at: now, revision });
                }
                _ => {}
            },
        }
    }

    fn placed(&mut self, id: &str, value: &[u8], created: Revision) {
        let Ok(instance) = serde_json::from_slice::<Instance>(value) else {
            tracing::warn!(instance = id, "an undecodable placement");
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

#[cfg(test)]
mod tests {
    use super::*;
    use cca_store::KeyValue;

    fn put(key: String, value: serde_json::Value) -> WatchEvent {
        WatchEvent::Put(KeyValue {
            key,
            value: serde_json::to_vec(&value).unwrap(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: None,
        })
    }

    fn placement(id: &str, node: &str, stopping: bool) -> WatchEvent {
        let instance = serde_json::json!({
            "id": id, "service": "web", "node": node, "ordinal": null,
            "spec_hash": "h", "cpu": 100, "memory": 67108864, "host_ports": {},
            "created_at": 0, "stopping": stopping,
        });
        put(cca_model::keys::derived_instance("web", id), instance)
    }

    fn report(id: &str, node: &str, state: &str) -> WatchEvent {
        let status = serde_json::json!({
            "id": id, "service": "web", "node": node, "state": state,
            "healthy": null, "pid": null, "address": null, "host_ports": {},
            "restarts": 0, "last_exit": null, "message": null, "updated_at": 0,
        });
        put(cca_model::keys::observed_instance(id), status)
    }

    fn delete(key: String) -> WatchEvent {
        WatchEvent::Delete { key, revision: 2 }
    }

    /// What `progress` must equal: the placements walked one by one.
    fn walked(seen: &Seen, dead: &HashSet<String>) -> Progress {
        let mut progress = Progress::default();
        for (id, placed) in &seen.placements {
            if placed.stopping || dead.contains(&placed.node) {
                continue;
            }
            progress.placed += 1;
            progress.running += usize::from(seen.running_since.contains_key(id));
        }
        progress
    }

    #[test]
    fn per_node_counts_follow_every_kind_of_change() {
        let events = vec![
            placement("a", "n1", false),
            placement("b", "n1", false),
            placement("c", "n2", false),
            report("a", "n1", "running"),
            report("c", "n2", "running"),
            report("c", "n2", "running"),
            report("b", "n1", "starting"),
            // Moved to another node while running, then one asked to stop.
            placement("a", "n2", false),
            placement("c", "n2", true),
            report("b", "n1", "running"),
            report("b", "n1", "failed"),
            delete(cca_model::keys::observed_instance("a")),
            delete(cca_model::keys::derived_instance("web", "c")),
            // Reported before it is seen placed.
            report("d", "n3", "running"),
            placement("d", "n3", false),
        ];
        let mut seen = Seen::default();
        let now = Instant::now();
        let some_dead: HashSet<String> = ["n1".to_owned()].into();
        for event in events {
            seen.apply(event, now);
            for dead in [HashSet::new(), some_dead.clone()] {
                assert_eq!(seen.progress(&dead), walked(&seen, &dead));
            }
        }
        let end = Progress {
            running: 1,
            placed: 3,
        };
        assert_eq!(seen.progress(&HashSet::new()), end);
    }

    fn kv_of(event: WatchEvent) -> KeyValue {
        match event {
            WatchEvent::Put(kv) => kv,
            WatchEvent::Delete { .. } => unreachable!("puts only"),
        }
    }

    #[test]
    fn a_relist_replaces_the_state_and_keeps_what_it_timed() {
        let mut seen = Seen::default();
        let early = Instant::now();
        for event in [
            placement("a", "n1", false),
            placement("b", "n1", false),
            report("a", "n1", "running"),
        ] {
            seen.apply(event, early);
        }
        // The list: `b` gone, `a` still running, `c` placed and running
        // in the gap; n2 registered without a heartbeat (its lease went).
        let mut listed = Listed::default();
        for event in [
            placement("a", "n1", false),
            report("a", "n1", "running"),
            placement("c", "n2", false),
            report("c", "n2", "running"),
            put(
                cca_model::keys::observed_heartbeat("n1"),
                serde_json::json!({}),
            ),
            put(cca_model::keys::observed_node("n1"), serde_json::json!({})),
            put(cca_model::keys::observed_node("n2"), serde_json::json!({})),
        ] {
            listed.add(kv_of(event));
        }
        let later = early + std::time::Duration::from_secs(5);
        seen.resync(listed, 42, later);
        let all = HashSet::new();
        assert_eq!(seen.progress(&all), walked(&seen, &all));
        assert_eq!(
            seen.progress(&all),
            Progress {
                running: 2,
                placed: 2
            }
        );
        assert_eq!(seen.running_since["a"], early, "already timed");
        assert_eq!(seen.running_since["c"], later, "timed when listed");
        assert!(!seen.placements.contains_key("b"));
        assert_eq!(seen.expired["n2"].revision, 42);
        assert!(!seen.expired.contains_key("n1"));
    }
}
