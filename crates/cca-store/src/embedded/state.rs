//! The embedded store's in-memory state — the key space, the revision log
//! that watches replay, and the leases — and [`Staged`], a batch of requests
//! evaluated on top of it before the batch is made durable. Pure data: no IO
//! and no clock; the writer passes the time in.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use super::codec::LeaseRecord;
use super::watchers::Watcher;
use crate::error::{Result, StoreError};
use crate::types::{
    KeyValue, LeaseId, Op, RangePage, RangeRequest, Revision, Txn, TxnOutcome, WatchEvent,
};

/// The events committed at one revision.
#[derive(Debug)]
pub(super) struct LogEntry {
    pub(super) revision: Revision,
    pub(super) events: Vec<WatchEvent>,
}

/// What a reader sees: only durable, committed data.
#[derive(Debug)]
pub(super) struct State {
    pub(super) kvs: BTreeMap<String, KeyValue>,
    pub(super) revision: Revision,
    /// The log holds every revision after this one.
    pub(super) compact_revision: Revision,
    pub(super) log: VecDeque<Arc<LogEntry>>,
    pub(super) leases: HashMap<LeaseId, LeaseRecord>,
    /// Keys attached to each lease (derived from `kvs`).
    pub(super) lease_keys: HashMap<LeaseId, BTreeSet<String>>,
    pub(super) next_lease_id: LeaseId,
    pub(super) watchers: Vec<Watcher>,
}

impl State {
    /// A fresh store: revision 1, like etcd.
    pub(super) fn empty() -> Self {
        Self {
            kvs: BTreeMap::new(),
            revision: 1,
            compact_revision: 0,
            log: VecDeque::new(),
            leases: HashMap::new(),
            lease_keys: HashMap::new(),
            next_lease_id: 1,
            watchers: Vec::new(),
        }
    }

    pub(super) fn range(&self, request: &RangeRequest) -> RangePage {
        let start = match &request.after {
            Some(after) if after.as_str() >= request.prefix.as_str() => {
                Bound::Excluded(after.as_str())
            }
            _ => Bound::Included(request.prefix.as_str()),
        };
        let limit = if request.limit == 0 {
            usize::MAX
        } else {
            request.limit
        };
        let mut matching = self
            .kvs
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(&request.prefix))
            .map(|(_, kv)| kv);
        let kvs: Vec<KeyValue> = matching.by_ref().take(limit).cloned().collect();
        let continuation = match (matching.next(), kvs.last()) {
            (Some(_), Some(last)) => Some(last.key.clone()),
            _ => None,
        };
        RangePage {
            kvs,
            revision: self.revision,
            continuation,
        }
    }

    /// Log entries at or after `from`, at most `max` of them.
    pub(super) fn log_from(&self, from: Revision, max: usize) -> Vec<Arc<LogEntry>> {
        let start = self.log.partition_point(|entry| entry.revision < from);
        self.log.range(start..).take(max).cloned().collect()
    }

    /// Applies a durable batch. Returns the new log entries for fan-out.
    pub(super) fn apply(&mut self, staged: Staged) -> Vec<Arc<LogEntry>> {
        for (key, change) in staged.kvs {
            if let Some(old) = self.kvs.get(&key).and_then(|kv| kv.lease) {
                self.detach(old, &key);
            }
            match change {
                Some(kv) => {
                    if let Some(lease) = kv.lease {
                        self.lease_keys
                            .entry(lease)
                            .or_default()
                            .insert(key.clone());
                    }
                    self.kvs.insert(key, kv);
                }
                None => {
                    self.kvs.remove(&key);
                }
            }
        }
        for (id, lease) in staged.leases {
            match lease {
                Some(record) => {
                    self.leases.insert(id, record);
                }
                None => {
                    self.leases.remove(&id);
                    self.lease_keys.remove(&id);
                }
            }
        }
        self.next_lease_id = staged.next_lease_id;
        self.revision = staged.revision;
        let entries: Vec<Arc<LogEntry>> = staged.entries.into_iter().map(Arc::new).collect();
        self.log.extend(entries.iter().cloned());
        if let Some(compact) = staged.compact_to {
            self.compact_revision = compact;
            let keep_from = self.log.partition_point(|entry| entry.revision <= compact);
            self.log.drain(..keep_from);
        }
        entries
    }

    fn detach(&mut self, lease: LeaseId, key: &str) {
        if let Some(keys) = self.lease_keys.get_mut(&lease) {
            keys.remove(key);
        }
    }
}

/// A batch of requests evaluated on top of a [`State`] without touching it:
/// later requests in the batch see earlier ones' effects. Becomes visible
/// to readers only through [`State::apply`], after it is durable.
#[derive(Debug)]
pub(super) struct Staged {
    pub(super) kvs: BTreeMap<String, Option<KeyValue>>,
    pub(super) leases: BTreeMap<LeaseId, Option<LeaseRecord>>,
    pub(super) entries: Vec<LogEntry>,
    pub(super) revision: Revision,
    pub(super) next_lease_id: LeaseId,
    pub(super) compact_to: Option<Revision>,
}

impl Staged {
    pub(super) fn new(base: &State) -> Self {
        Self {
            kvs: BTreeMap::new(),
            leases: BTreeMap::new(),
            entries: Vec::new(),
            revision: base.revision,
            next_lease_id: base.next_lease_id,
            compact_to: None,
        }
    }

    /// True when the batch changes nothing on disk.
    pub(super) fn is_empty(&self) -> bool {
        self.kvs.is_empty() && self.leases.is_empty() && self.compact_to.is_none()
    }

    fn get<'a>(&'a self, base: &'a State, key: &str) -> Option<&'a KeyValue> {
        match self.kvs.get(key) {
            Some(change) => change.as_ref(),
            None => base.kvs.get(key),
        }
    }

    fn lease<'a>(&'a self, base: &'a State, id: LeaseId) -> Option<&'a LeaseRecord> {
        match self.leases.get(&id) {
            Some(change) => change.as_ref(),
            None => base.leases.get(&id),
        }
    }

    /// Evaluates a transaction; all-or-nothing.
    pub(super) fn txn(&mut self, base: &State, txn: &Txn) -> Result<TxnOutcome> {
        if let Some(index) = txn
            .compares
            .iter()
            .position(|compare| !compare.holds(self.get(base, &compare.key)))
        {
            return Ok(TxnOutcome::CompareFailed {
                index,
                revision: self.revision,
            });
        }
        for op in &txn.ops {
            if let Op::Put {
                lease: Some(id), ..
            } = op
                && self.lease(base, *id).is_none()
            {
                return Err(StoreError::LeaseNotFound(*id));
            }
        }
        let revision = self.revision + 1;
        let mut events = Vec::new();
        for op in &txn.ops {
            self.apply_op(base, op, revision, &mut events);
        }
        Ok(TxnOutcome::Committed {
            revision: self.commit_events(revision, events),
        })
    }

    fn apply_op(
        &mut self,
        base: &State,
        op: &Op,
        revision: Revision,
        events: &mut Vec<WatchEvent>,
    ) {
        match op {
            Op::Put { key, value, lease } => {
                let previous = self.get(base, key);
                let kv = KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                    create_revision: previous.map_or(revision, |kv| kv.create_revision),
                    mod_revision: revision,
                    version: previous.map_or(1, |kv| kv.version + 1),
                    lease: *lease,
                };
                events.push(WatchEvent::Put(kv.clone()));
                self.kvs.insert(key.clone(), Some(kv));
            }
            Op::Delete { key } => self.delete(base, key, revision, events),
            Op::DeletePrefix { prefix } => {
                for key in self.keys_with_prefix(base, prefix) {
                    self.delete(base, &key, revision, events);
                }
            }
        }
    }

    fn delete(
        &mut self,
        base: &State,
        key: &str,
        revision: Revision,
        events: &mut Vec<WatchEvent>,
    ) {
        if self.get(base, key).is_none() {
            return;
        }
        events.push(WatchEvent::Delete {
            key: key.to_owned(),
            revision,
        });
        self.kvs.insert(key.to_owned(), None);
    }

    fn keys_with_prefix(&self, base: &State, prefix: &str) -> Vec<String> {
        let in_base = base
            .kvs
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, _)| key);
        let in_batch = self
            .kvs
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, _)| key);
        let all: BTreeSet<&String> = in_base.chain(in_batch).collect();
        all.into_iter()
            .filter(|key| self.get(base, key).is_some())
            .cloned()
            .collect()
    }

    /// Records the events of one revision, if any; returns the revision the
    /// store is at afterwards.
    fn commit_events(&mut self, revision: Revision, events: Vec<WatchEvent>) -> Revision {
        if events.is_empty() {
            return self.revision;
        }
        // Events of one revision are delivered in key order, as etcd does.
        let mut events = events;
        events.sort_by(|a, b| a.key().cmp(b.key()));
        self.entries.push(LogEntry { revision, events });
        self.revision = revision;
        revision
    }

    pub(super) fn grant(&mut self, ttl_secs: i64, now_ms: i64) -> LeaseId {
        let id = self.next_lease_id;
        self.next_lease_id += 1;
        self.leases
            .insert(id, Some(LeaseRecord::starting(ttl_secs, now_ms)));
        id
    }

    /// Ends a lease and deletes its keys in one revision.
    pub(super) fn revoke(&mut self, base: &State, id: LeaseId) -> Result<Revision> {
        if self.lease(base, id).is_none() {
            return Err(StoreError::LeaseNotFound(id));
        }
        let mut attached: BTreeSet<String> = base.lease_keys.get(&id).cloned().unwrap_or_default();
        attached.extend(self.kvs.keys().cloned());
        let revision = self.revision + 1;
        let mut events = Vec::new();
        for key in attached {
            if self.get(base, &key).and_then(|kv| kv.lease) == Some(id) {
                self.delete(base, &key, revision, &mut events);
            }
        }
        self.leases.insert(id, None);
        Ok(self.commit_events(revision, events))
    }

    pub(super) fn compact(&mut self, base: &State, revision: Revision) -> Result<()> {
        let current_compact = self.compact_to.unwrap_or(base.compact_revision);
        if revision <= current_compact {
            return Err(StoreError::Compacted {
                requested: revision,
                compact_revision: current_compact,
            });
        }
        if revision > self.revision {
            return Err(StoreError::FutureRevision {
                requested: revision,
                current: self.revision,
            });
        }
        self.compact_to = Some(revision);
        Ok(())
    }
}

impl LeaseRecord {
    fn starting(ttl_secs: i64, now_ms: i64) -> Self {
        Self {
            ttl_secs,
            deadline_ms: now_ms.saturating_add(ttl_secs.saturating_mul(1000)),
        }
    }
}
