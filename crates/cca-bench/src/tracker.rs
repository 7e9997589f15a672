//! [`Tracker`]: the benchmark's stopwatch. It follows one watch on the
//! store (read-only: it never writes) and remembers, with the local time
//! it saw each change, where every instance is placed, since when each one
//! has been reported running, and when (local time and store revision)
//! each node's heartbeat lease expired. It also logs every lease expiry
//! (a node's leased heartbeat key deleted) and every re-registration (the
//! key put again for a node that had one before in this run), so that a
//! scenario can count them over its measured part; and, per service, the
//! most instances placed at once (after each revision), so that a
//! duplicate placement is caught even when it is gone by the end.
//! Scenarios ask it
//! whether the cluster has converged and for per-instance latencies. A
//! watch that falls behind compaction is repaired as the control plane's
//! cache repairs its own: it relists and watches on from the list, and
//! what changed in the gap is timed when the list was read (an upper
//! bound); lease changes in the gap are counted at most once per node (a
//! lower bound).

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cca_model::cluster::{Heartbeat, Instance, InstanceState, InstanceStatus, Millis};
use cca_model::{Key, Kind};
use cca_store::{KeyValue, RangeRequest, Revision, Store, WatchEvent, WatchMessage};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::BenchError;

/// Where an instance is placed.
#[derive(Clone, Debug)]
pub(crate) struct Placed {
    pub(crate) service: String,
    pub(crate) node: String,
    pub(crate) stopping: bool,
    /// It takes over from a running instance (a drain or rebalancing
    /// move), not from a lost one.
    pub(crate) moves: bool,
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

/// What happened to a node's heartbeat lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeaseChange {
    /// The leased heartbeat key went away: the lease expired.
    Expired,
    /// The heartbeat key was put again for a node that had one before in
    /// this run: its agent registered again.
    Reregistered,
    /// The heartbeat key was put again with the same start: the API moved
    /// the node to a lease of the fleet's TTL (`cca_model::node_lease`).
    Moved,
}

/// One entry of the lease log.
#[derive(Clone, Debug)]
struct LeaseEvent {
    node: String,
    at: Instant,
    change: LeaseChange,
}

/// Lease expiries and re-registrations over part of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LeaseCounts {
    pub(crate) expiries: u64,
    /// Expiries the harness did not cause (see [`Faults`]).
    pub(crate) false_expiries: u64,
    pub(crate) re_registrations: u64,
    pub(crate) moves: u64,
}

/// What the harness did to nodes' liveness on purpose: an expiry it
/// explains is not a false one.
#[derive(Clone, Debug, Default)]
pub(crate) struct Faults {
    /// Nodes killed: their leases had to expire.
    pub(crate) killed: HashSet<String>,
    /// Spans in which the harness kept every lease from being renewed
    /// (a frozen control plane, until every node was ready again).
    pub(crate) suspended: Vec<Range<Instant>>,
}

impl Faults {
    fn explain(&self, event: &LeaseEvent) -> bool {
        self.killed.contains(&event.node)
            || self.suspended.iter().any(|span| span.contains(&event.at))
    }
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
    /// The last put of each node's heartbeat key seen in this run, kept
    /// after the key goes: a later put is a registration again, or a move
    /// to another lease.
    registered: HashMap<String, Registered>,
    /// Every expiry and re-registration, in the order seen.
    lease_log: Vec<LeaseEvent>,
    /// Placed, not stopping, per service (wherever they are).
    per_service: HashMap<String, usize>,
    /// The most of `per_service` at the end of any revision since the
    /// last [`Tracker::reset_peaks`].
    peaks: HashMap<String, usize>,
    /// Services whose count changed in the revision being applied.
    touched: HashSet<String>,
    /// The last revision applied (or listed).
    revision: Revision,
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

    /// Lease expiries and re-registrations seen from `since` on; an
    /// expiry `faults` explains is not false.
    pub(crate) fn lease_counts(&self, since: Instant, faults: &Faults) -> LeaseCounts {
        lock(&self.seen).lease_counts(since, faults)
    }

    /// From now on, each service's peak is counted from its current count.
    pub(crate) fn reset_peaks(&self) {
        let mut seen = lock(&self.seen);
        seen.peaks = seen.per_service.clone();
    }

    /// The most instances of each service placed (not stopping) at once
    /// since [`Tracker::reset_peaks`].
    pub(crate) fn peaks(&self) -> HashMap<String, usize> {
        lock(&self.seen).peaks.clone()
    }

    /// The last revision seen when none of `nodes` is without its
    /// heartbeat key (every one registered since its lease last expired).
    pub(crate) fn heartbeats_back(&self, nodes: &[String]) -> Option<Revision> {
        let seen = lock(&self.seen);
        let gone = nodes.iter().any(|node| seen.expired.contains_key(node));
        (!gone).then_some(seen.revision)
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
            Some(Ok(WatchMessage::Events { revision, events })) => {
                lock(&seen).apply_revision(revision, events, Instant::now());
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
    /// Each listed heartbeat key's node and put.
    heartbeats: HashMap<String, Registered>,
}

/// A put of a node's heartbeat key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Registered {
    revision: Revision,
    /// When its registration started (a move to another lease keeps it);
    /// `None` when the value does not decode.
    started_at: Option<Millis>,
}

impl Registered {
    fn of(kv: &KeyValue) -> Self {
        Registered {
            revision: kv.mod_revision,
            started_at: serde_json::from_slice::<Heartbeat>(&kv.value)
                .ok()
                .map(|heartbeat| heartbeat.started_at),
        }
    }
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
                let put = Registered::of(&kv);
                self.heartbeats.insert(node, put);
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
    /// lost it at `now` unless its loss was seen, and one whose heartbeat
    /// was put after the last put seen registered (again, if it had been
    /// seen before) at `now`.
    fn resync(&mut self, listed: Listed, revision: Revision, now: Instant) {
        self.revision = revision;
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
        for (node, put) in &listed.heartbeats {
            if self
                .registered
                .get(node)
                .is_none_or(|seen| seen.revision < put.revision)
            {
                self.heartbeat_put(node, *put, now);
            }
        }
        for node in &listed.nodes {
            if !listed.heartbeats.contains_key(node) && !self.expired.contains_key(node) {
                self.heartbeat_gone(node, revision, now);
            }
        }
        self.recount();
    }

    /// Rebuilds `per_node` and `per_service` from the placements.
    fn recount(&mut self) {
        self.per_node.clear();
        self.per_service.clear();
        let ids: Vec<String> = self.placements.keys().cloned().collect();
        for id in ids {
            self.count(&id, true);
        }
        self.note_peaks();
    }

    /// Applies one revision's events, then notes the services' peaks: a
    /// replacement written with the stop of what it replaces is never a
    /// duplicate, whatever the order of the two within the revision.
    fn apply_revision(&mut self, revision: Revision, events: Vec<WatchEvent>, now: Instant) {
        for event in events {
            self.apply(event, now);
        }
        self.revision = revision;
        self.note_peaks();
    }

    fn note_peaks(&mut self) {
        for service in self.touched.drain() {
            let count = self.per_service.get(&service).copied().unwrap_or(0);
            let peak = self.peaks.entry(service).or_default();
            *peak = (*peak).max(count);
        }
    }

    /// A node's heartbeat key was put: by a registration, or by a move
    /// to another lease (the same start, and the key was not gone).
    fn heartbeat_put(&mut self, node: &str, put: Registered, now: Instant) {
        let gone = self.expired.remove(node).is_some();
        let Some(before) = self.registered.insert(node.to_owned(), put) else {
            return;
        };
        let moved = !gone && put.started_at.is_some() && before.started_at == put.started_at;
        self.lease_log.push(LeaseEvent {
            node: node.to_owned(),
            at: now,
            change: if moved {
                LeaseChange::Moved
            } else {
                LeaseChange::Reregistered
            },
        });
    }

    /// A node's heartbeat key went away at `revision`: its lease expired.
    fn heartbeat_gone(&mut self, node: &str, revision: Revision, now: Instant) {
        self.expired
            .insert(node.to_owned(), Expiry { at: now, revision });
        self.lease_log.push(LeaseEvent {
            node: node.to_owned(),
            at: now,
            change: LeaseChange::Expired,
        });
    }

    fn lease_counts(&self, since: Instant, faults: &Faults) -> LeaseCounts {
        let mut counts = LeaseCounts::default();
        for event in self.lease_log.iter().filter(|event| event.at >= since) {
            match event.change {
                LeaseChange::Expired => {
                    counts.expiries += 1;
                    counts.false_expiries += u64::from(!faults.explain(event));
                }
                LeaseChange::Reregistered => counts.re_registrations += 1,
                LeaseChange::Moved => counts.moves += 1,
            }
        }
        counts
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
        let of_service = self.per_service.entry(placed.service.clone()).or_default();
        if add {
            counts.placed += 1;
            counts.running += running;
            *of_service += 1;
        } else {
            counts.placed -= 1;
            counts.running -= running;
            *of_service -= 1;
        }
        self.touched.insert(placed.service.clone());
    }

    fn change(&mut self, event: WatchEvent, now: Instant) {
        match event {
            WatchEvent::Put(kv) => match Key::parse(&kv.key) {
                Some(Key::Instance { id, .. }) => self.placed(&id, &kv.value, kv.create_revision),
                Some(Key::InstanceStatus { id }) => self.reported(&id, &kv.value, now),
                Some(Key::Heartbeat { node }) => {
                    self.heartbeat_put(&node, Registered::of(&kv), now);
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
                Some(Key::Heartbeat { node }) => self.heartbeat_gone(&node, revision, now),
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
                service: instance.service,
                node: instance.node,
                stopping: instance.stopping,
                moves: instance.replaces.is_some(),
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

    #[test]
    fn a_service_peaks_only_across_revisions_and_from_a_reset_on() {
        let mut seen = Seen::default();
        let now = Instant::now();
        seen.apply_revision(
            1,
            vec![placement("a", "n1", false), placement("b", "n2", false)],
            now,
        );
        assert_eq!(seen.peaks["web"], 2);
        // A replacement and the stop of what it replaces in one revision,
        // the new one first: never three at once.
        seen.apply_revision(
            2,
            vec![placement("c", "n2", false), placement("a", "n1", true)],
            now,
        );
        assert_eq!(seen.peaks["web"], 2);
        assert_eq!(seen.per_service["web"], 2);
        // The same in two revisions: three placed at once in between.
        seen.apply_revision(3, vec![placement("d", "n3", false)], now);
        seen.apply_revision(4, vec![placement("b", "n2", true)], now);
        assert_eq!(seen.peaks["web"], 3);
        assert_eq!(seen.per_service["web"], 2);
        // Reset to the current count, then a removal and a placement.
        seen.peaks = seen.per_service.clone();
        seen.apply_revision(
            5,
            vec![delete(cca_model::keys::derived_instance("web", "c"))],
            now,
        );
        seen.apply_revision(6, vec![placement("e", "n1", false)], now);
        assert_eq!(seen.peaks["web"], 2);
        assert_eq!(seen.revision, 6);
    }

    /// A registration at `revision` (which it starts at, in this test).
    fn heartbeat(node: &str, revision: Revision) -> WatchEvent {
        heartbeat_started(node, revision, revision)
    }

    fn heartbeat_started(node: &str, revision: Revision, started_at: Millis) -> WatchEvent {
        WatchEvent::Put(KeyValue {
            key: cca_model::keys::observed_heartbeat(node),
            value: format!(r#"{{"lease_ttl_secs":3,"started_at":{started_at}}}"#).into_bytes(),
            create_revision: revision,
            mod_revision: revision,
            version: 1,
            lease: Some(7),
        })
    }

    fn expiry(node: &str, revision: Revision) -> WatchEvent {
        WatchEvent::Delete {
            key: cca_model::keys::observed_heartbeat(node),
            revision,
        }
    }

    #[test]
    fn lease_expiries_and_re_registrations_are_counted_from_a_moment_on() {
        let mut seen = Seen::default();
        let start = Instant::now();
        let at = |seconds| start + std::time::Duration::from_secs(seconds);
        // First registrations are not re-registrations; neither is a
        // report or a placement.
        for (node, revision) in [("n1", 1), ("n2", 2), ("n3", 3)] {
            seen.apply(heartbeat(node, revision), at(0));
        }
        seen.apply(placement("a", "n1", false), at(0));
        assert_eq!(
            seen.lease_counts(start, &Faults::default()),
            LeaseCounts::default()
        );
        // Before the measured part: n1 expires and registers again.
        seen.apply(expiry("n1", 4), at(1));
        seen.apply(heartbeat("n1", 5), at(1));
        // Measured from 10 s on: n1 flaps twice, n2 is killed, n3
        // registers again over its live key (an agent restart).
        seen.apply(expiry("n1", 6), at(10));
        seen.apply(heartbeat("n1", 7), at(11));
        seen.apply(expiry("n1", 8), at(12));
        seen.apply(heartbeat("n1", 9), at(13));
        seen.apply(expiry("n2", 10), at(14));
        seen.apply(heartbeat("n3", 11), at(15));
        // n1 moved to another lease: its start is kept, not counted as a
        // registration.
        seen.apply(heartbeat_started("n1", 12, 9), at(16));
        let killed = Faults {
            killed: HashSet::from(["n2".to_owned()]),
            ..Faults::default()
        };
        let counts = LeaseCounts {
            expiries: 3,
            false_expiries: 2,
            re_registrations: 3,
            moves: 1,
        };
        assert_eq!(seen.lease_counts(at(10), &killed), counts);
        assert_eq!(
            seen.lease_counts(start, &killed),
            LeaseCounts {
                expiries: 4,
                false_expiries: 3,
                re_registrations: 4,
                moves: 1,
            }
        );
        // A span the harness suspended every lease explains n1's first
        // expiry in the measured part, not its second.
        let frozen = Faults {
            suspended: vec![at(9)..at(11)],
            ..killed
        };
        assert_eq!(
            seen.lease_counts(at(10), &frozen),
            LeaseCounts {
                false_expiries: 1,
                ..counts
            }
        );
    }

    #[test]
    fn a_relist_counts_the_lease_changes_it_finds_once() {
        let mut seen = Seen::default();
        let start = Instant::now();
        let later = start + std::time::Duration::from_secs(5);
        for (node, revision) in [("n1", 1), ("n2", 2), ("n3", 3)] {
            seen.apply(heartbeat(node, revision), start);
        }
        seen.apply(expiry("n3", 4), start);
        // In the gap: n1 expired (its key is gone), n2 expired and
        // registered again (a newer put), n3 registered again, n4
        // registered for the first time.
        let mut listed = Listed::default();
        for node in ["n1", "n2", "n3", "n4"] {
            listed.add(kv_of(put(
                cca_model::keys::observed_node(node),
                serde_json::json!({}),
            )));
        }
        for (node, revision) in [("n2", 20), ("n3", 21), ("n4", 22)] {
            listed.add(kv_of(heartbeat(node, revision)));
        }
        seen.resync(listed, 30, later);
        let counts = seen.lease_counts(later, &Faults::default());
        assert_eq!(
            counts,
            LeaseCounts {
                expiries: 1,
                false_expiries: 1,
                re_registrations: 2,
                moves: 0,
            }
        );
        assert_eq!(seen.expired["n1"].revision, 30);
        // Listing the same again finds nothing new.
        let mut again = Listed::default();
        again.add(kv_of(put(
            cca_model::keys::observed_node("n1"),
            serde_json::json!({}),
        )));
        for (node, revision) in [("n2", 20), ("n3", 21), ("n4", 22)] {
            again.add(kv_of(heartbeat(node, revision)));
        }
        seen.resync(again, 31, later);
        assert_eq!(seen.lease_counts(later, &Faults::default()), counts);
    }
}
