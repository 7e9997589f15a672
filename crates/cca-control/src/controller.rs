//! The contract between controllers and the runner. A controller is a pure
//! function from a [`View`] and a [`Context`] (the time, how long this
//! server has led) to a [`Plan`]: plain data saying which facts to write or
//! delete and which events to log. The runner does all IO, so controllers
//! are deterministic and testable without a store.
//!
//! **Atomicity contract (the one place it is stated).** The runner commits
//! a plan's writes in order, in parts of at most the store's
//! `max_txn_ops` operations (etcd allows 128). Every part is one
//! compare-and-swap transaction carrying the leader's fencing compare, the
//! plan's guards and a compare per written key against the view the plan
//! was made on; a part commits entirely or not at all. Parts are not atomic
//! together: a conflict, a lost leadership or a crash between two parts
//! leaves the earlier parts committed. So controllers are level-based: each
//! write is right on its own given the view, and a reconcile from any
//! prefix of a plan (the next pass, or the next leader's) converges to the
//! same end. A controller that needs A to land before B puts A earlier in
//! its plan. Tested by `tests/runner.rs`, which cuts a scheduler plan at
//! every point.

use cca_model::cluster::{EventLevel, Millis};
use cca_model::{Kind, Owner};
use serde::Serialize;

use crate::view::{FactChange, View};

/// What a controller knows besides the facts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Context {
    /// The current time.
    pub now: Millis,
    /// When this server became leader: grace periods count from here, so
    /// a freshly (re)started control plane does not act on stale liveness.
    pub leader_since: Millis,
}

/// A controller: a name (its write domain in the ownership table), the
/// kinds of fact whose changes should wake it, and the pure reconcile
/// function.
pub trait Controller: Send + Sync + 'static {
    /// The name under which `cca_model::ownership` lists its prefixes.
    fn name(&self) -> &'static str;

    /// Kinds of fact whose changes make this controller reconcile again.
    fn interests(&self) -> &'static [Kind];

    /// Compares what is with what should be and says what to change.
    fn reconcile(&self, view: &View, context: &Context) -> Plan;

    /// [`reconcile`](Self::reconcile), told which facts changed since this
    /// controller's previous pass. A controller whose work splits by the
    /// facts it reads (the endpoint controller: one service at a time)
    /// overrides it to look only at what `changes` touch; it must then
    /// plan, for those, exactly what `reconcile` would, and nothing else.
    /// What it skips is as the previous passes left it: the runner passes
    /// [`Changes::Everything`] whenever it cannot vouch for that. The
    /// default looks at everything.
    fn reconcile_changes(&self, view: &View, context: &Context, changes: &Changes) -> Plan {
        let _ = changes;
        self.reconcile(view, context)
    }

    /// The owner the runner checks this controller's writes against.
    fn owner(&self) -> Owner {
        Owner::Controller(self.name())
    }
}

/// What changed since a controller's previous pass.
#[derive(Clone, Debug, Default)]
pub enum Changes {
    /// Anything may have changed: the first pass, a periodic resync, a
    /// relist or lost notifications, a retry after a commit that failed or
    /// conflicted, a requeue the controller asked for, or more changes
    /// than are worth following one by one.
    #[default]
    Everything,
    /// Only these facts, each with its value before and after. Every
    /// change the view shows beyond the previous pass's is here, or will
    /// be in the next pass's (a change may land in the view a moment
    /// before its notification), so each is looked at on a view that
    /// holds it. Facts of kinds outside the controller's interests are
    /// left out.
    Facts(Vec<FactChange>),
}

/// One change to a fact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    Put { key: String, value: Vec<u8> },
    Delete { key: String },
}

impl Write {
    /// A put of `value` encoded as JSON (the encoding of every fact).
    pub fn put_json<T: Serialize>(key: impl Into<String>, value: &T) -> Self {
        Write::Put {
            key: key.into(),
            // Fact types are plain data with string map keys: encoding them
            // cannot fail, so a failure is a bug worth a loud stop.
            value: serde_json::to_vec(value).expect("fact types always encode as JSON"),
        }
    }

    pub fn delete(key: impl Into<String>) -> Self {
        Write::Delete { key: key.into() }
    }

    pub fn key(&self) -> &str {
        match self {
            Write::Put { key, .. } | Write::Delete { key } => key,
        }
    }
}

/// An event for the log, without its time (the runner stamps it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventDraft {
    pub level: EventLevel,
    pub subject: String,
    pub message: String,
}

impl EventDraft {
    pub fn info(subject: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            level: EventLevel::Info,
            subject: subject.into(),
            message: message.into(),
        }
    }

    pub fn warning(subject: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            level: EventLevel::Warning,
            subject: subject.into(),
            message: message.into(),
        }
    }
}

/// What a reconcile decided. An empty plan costs no write. Committed in
/// order, possibly in several transactions: see the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Changes, each guarded by the mod revision the view holds for its key.
    pub writes: Vec<Write>,
    /// Further keys the decision depended on: the commit fails if any of
    /// them changed since the view was taken.
    pub guards: Vec<String>,
    /// Events to log once the writes are committed.
    pub events: Vec<EventDraft>,
    /// Reconcile again after this many milliseconds even if nothing changes
    /// (a grace period or backoff is running out).
    pub requeue_after: Option<Millis>,
}

impl Plan {
    pub fn is_noop(&self) -> bool {
        self.writes.is_empty() && self.events.is_empty()
    }

    /// Asks for a reconcile within `after` ms, keeping the earliest request.
    pub fn requeue(&mut self, after: Millis) {
        let after = after.max(1);
        self.requeue_after = Some(self.requeue_after.map_or(after, |held| held.min(after)));
    }
}
