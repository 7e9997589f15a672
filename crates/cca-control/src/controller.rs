//! The contract between controllers and the runner. A controller is a pure
//! function from a [`View`] and a [`Context`] (the time, how long this
//! server has led) to a [`Plan`]: plain data saying which facts to write or
//! delete and which events to log. The runner does all IO — it commits the
//! plan in one compare-and-swap transaction guarded by the revisions of the
//! view — so controllers are deterministic and testable without a store.

use cca_model::cluster::{EventLevel, Millis};
use cca_model::{Kind, Owner};
use serde::Serialize;

use crate::view::View;

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

    /// The owner the runner checks this controller's writes against.
    fn owner(&self) -> Owner {
        Owner::Controller(self.name())
    }
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

/// What a reconcile decided. An empty plan costs no write.
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
