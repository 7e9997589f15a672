//! Plain data exchanged with a [`Store`](crate::Store): key-values, range
//! pages, transaction compares and operations, watch messages. Shared by
//! every backend so that callers never see which one they talk to.

use std::time::Duration;

pub use cca_model::{LeaseId, Revision};

/// Largest value a put may carry. Matches etcd's default request limit
/// (1.5 MiB) minus room for the key and framing, so both backends accept
/// and refuse exactly the same values.
pub const MAX_VALUE_BYTES: usize = 1536 * 1024 - 4096;

/// Longest key accepted.
pub const MAX_KEY_BYTES: usize = 4096;

/// Longest lease TTL accepted (etcd's own maximum is about 9 billion
/// seconds; a year is plenty for a heartbeat).
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// One key with its value and bookkeeping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// Revision of the put that created this key (since its last delete).
    pub create_revision: Revision,
    /// Revision of the last put to this key.
    pub mod_revision: Revision,
    /// Number of puts since creation, starting at 1.
    pub version: i64,
    /// Lease the key is attached to; the key vanishes when it expires.
    pub lease: Option<LeaseId>,
}

/// Which keys a [`Store::range`](crate::Store::range) returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeRequest {
    /// Only keys starting with this prefix; empty means every key.
    pub prefix: String,
    /// Only keys strictly greater than this one: pass the previous page's
    /// [`RangePage::continuation`] to get the next page.
    pub after: Option<String>,
    /// At most this many keys; `0` means no limit.
    pub limit: usize,
}

impl RangeRequest {
    /// Every key under `prefix`, unpaged.
    pub fn prefix(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            ..Self::default()
        }
    }

    /// Pages of at most `limit` keys.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Continue after `key`.
    pub fn after(mut self, key: impl Into<String>) -> Self {
        self.after = Some(key.into());
        self
    }
}

/// One page of a range, read at one revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangePage {
    /// Keys in ascending byte order.
    pub kvs: Vec<KeyValue>,
    /// The store revision the page was read at.
    pub revision: Revision,
    /// Set when more keys follow: the last key of this page, to pass as
    /// [`RangeRequest::after`]. Pages are each consistent; to follow changes
    /// made between pages, watch from the first page's revision + 1.
    pub continuation: Option<String>,
}

/// How a compare relates the stored field to the given operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Equal,
    NotEqual,
    Less,
    Greater,
}

impl CompareOp {
    /// Applies the comparison `stored <op> operand`.
    pub fn holds<T: Ord + ?Sized>(self, stored: &T, operand: &T) -> bool {
        match self {
            CompareOp::Equal => stored == operand,
            CompareOp::NotEqual => stored != operand,
            CompareOp::Less => stored < operand,
            CompareOp::Greater => stored > operand,
        }
    }
}

/// What a compare checks about its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompareTarget {
    /// The key's mod revision; an absent key has mod revision 0.
    ModRevision(CompareOp, Revision),
    /// The key's value; a compare on the value of an absent key fails.
    Value(CompareOp, Vec<u8>),
    /// The key exists.
    Exists,
    /// The key does not exist.
    Absent,
}

/// A guard of a transaction: all compares must hold for its ops to apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compare {
    pub key: String,
    pub target: CompareTarget,
}

impl Compare {
    /// `key`'s mod revision `op` `revision` (0 for an absent key).
    pub fn mod_revision(key: impl Into<String>, op: CompareOp, revision: Revision) -> Self {
        Self {
            key: key.into(),
            target: CompareTarget::ModRevision(op, revision),
        }
    }

    /// `key`'s value `op` `value`.
    pub fn value(key: impl Into<String>, op: CompareOp, value: impl Into<Vec<u8>>) -> Self {
        Self {
            key: key.into(),
            target: CompareTarget::Value(op, value.into()),
        }
    }

    /// `key` exists.
    pub fn exists(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            target: CompareTarget::Exists,
        }
    }

    /// `key` does not exist.
    pub fn absent(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            target: CompareTarget::Absent,
        }
    }

    /// Evaluates the compare against the key's current state.
    pub fn holds(&self, current: Option<&KeyValue>) -> bool {
        match (&self.target, current) {
            (CompareTarget::Exists, found) => found.is_some(),
            (CompareTarget::Absent, found) => found.is_none(),
            (CompareTarget::ModRevision(op, rev), found) => {
                op.holds(&found.map_or(0, |kv| kv.mod_revision), rev)
            }
            (CompareTarget::Value(_, _), None) => false,
            (CompareTarget::Value(op, value), Some(kv)) => op.holds(kv.value.as_slice(), value),
        }
    }
}

/// A change a transaction makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Sets `key` to `value`, attached to `lease` when given.
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    },
    /// Removes `key` if present.
    Delete { key: String },
    /// Removes every key starting with `prefix` (an empty prefix is refused:
    /// wiping the store takes an explicit decision, not a typo).
    DeletePrefix { prefix: String },
}

impl Op {
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Op::Put {
            key: key.into(),
            value: value.into(),
            lease: None,
        }
    }

    pub fn put_with_lease(
        key: impl Into<String>,
        value: impl Into<Vec<u8>>,
        lease: LeaseId,
    ) -> Self {
        Op::Put {
            key: key.into(),
            value: value.into(),
            lease: Some(lease),
        }
    }

    pub fn delete(key: impl Into<String>) -> Self {
        Op::Delete { key: key.into() }
    }

    pub fn delete_prefix(prefix: impl Into<String>) -> Self {
        Op::DeletePrefix {
            prefix: prefix.into(),
        }
    }
}

/// A transaction: if every compare holds, apply every op atomically.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub ops: Vec<Op>,
}

impl Txn {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn when(mut self, compare: Compare) -> Self {
        self.compares.push(compare);
        self
    }

    pub fn then(mut self, op: Op) -> Self {
        self.ops.push(op);
        self
    }
}

/// How a transaction ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOutcome {
    /// Every compare held and every op applied. `revision` is the revision
    /// the changes carry, or the current revision when nothing changed.
    Committed { revision: Revision },
    /// The compare at `index` (the first one that did not hold) failed;
    /// nothing was applied. `revision` is the revision it was checked at.
    CompareFailed { index: usize, revision: Revision },
}

impl TxnOutcome {
    pub fn is_committed(&self) -> bool {
        matches!(self, TxnOutcome::Committed { .. })
    }

    /// The revision the transaction was committed or checked at.
    pub fn revision(&self) -> Revision {
        match self {
            TxnOutcome::Committed { revision } | TxnOutcome::CompareFailed { revision, .. } => {
                *revision
            }
        }
    }
}

/// One change seen by a watcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// The key now holds this value.
    Put(KeyValue),
    /// The key was deleted at `revision` (by a delete op or lease expiry).
    Delete { key: String, revision: Revision },
}

impl WatchEvent {
    pub fn key(&self) -> &str {
        match self {
            WatchEvent::Put(kv) => &kv.key,
            WatchEvent::Delete { key, .. } => key,
        }
    }

    pub fn revision(&self) -> Revision {
        match self {
            WatchEvent::Put(kv) => kv.mod_revision,
            WatchEvent::Delete { revision, .. } => *revision,
        }
    }
}

/// What a watch stream delivers, in revision order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchMessage {
    /// Every event of one revision under the watched prefix, never split.
    Events {
        revision: Revision,
        events: Vec<WatchEvent>,
    },
    /// The requested history is gone: the oldest revision still available
    /// is `compact_revision + 1`. The stream ends; re-read with a range and
    /// watch again from the range's revision + 1.
    Compacted { compact_revision: Revision },
}

/// A consistent read of the whole store ([`crate::Store::snapshot`]).
#[derive(Debug)]
pub struct Snapshot {
    /// Every key in `pages` is as of this revision.
    pub revision: Revision,
    /// How many keys the pages hold in all.
    pub count: u64,
    /// The keys in key order, a page at a time; an `Err` is the last item.
    pub pages: tokio::sync::mpsc::Receiver<crate::Result<Vec<KeyValue>>>,
}

/// Pages a snapshot's reader buffers ahead of its consumer.
pub const SNAPSHOT_PAGES_AHEAD: usize = 4;
