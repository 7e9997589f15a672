//! The assignment hub: an index over the server's one cache that routes
//! every placement change to the assignment streams of the nodes concerned.
//! It keeps each node's placements (built from the cache's view, then kept
//! current from the cache's decoded changes), so a change costs O(1) plus
//! the lines it produces, with no store watch or read of its own.
//!
//! A bounded history of recent lines lets a reconnecting agent resume
//! where it left off; older `from` revisions get a `compacted` line (the
//! agent reconnects for a snapshot), as a compacted store watch would. A
//! subscriber that falls behind, or a hub that must rebuild (the cache
//! relisted, or the hub lagged behind its change feed), ends the streams
//! concerned: agents reconnect and resume or resnapshot, so no line is ever
//! silently lost.
//!
//! An assignment also carries the spec the instance was placed with (its
//! service's version of the instance's spec hash) and its service's
//! explicit secret grants. The cache publishes a revision's view before it broadcasts the
//! revision's changes, so the view the hub reads while routing revision R
//! holds everything committed up to R: a grant or spec committed with a
//! placement, or before it, is in the placement's line without any wait.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use cca_control::cache::Change;
use cca_control::view::View;
use cca_model::cluster::Instance;
use cca_model::spec::{SecretGrant, ServiceSpec};
use cca_model::{Key, Revision, Value};
use tokio::sync::{OnceCell, broadcast, mpsc, watch};

use crate::error::ApiResult;
use crate::state::ApiState;
use crate::types::{Assignment, AssignmentLine, ProbeAddress, Resume, StreamOrigin};

/// Lines kept for resuming streams. A node reconnecting after a short
/// break resumes from here; a longer break costs it one snapshot.
const HISTORY: usize = 16_384;

/// Lines buffered per stream before the hub gives up on it (the stream
/// ends and its agent resumes from the history or resnapshots).
const SUBSCRIBER_BUFFER: usize = 1024;

/// A routed line, shared between the history and the subscribers.
pub(crate) type Line = Arc<AssignmentLine>;

/// What a new stream of an index (the assignment hub, the network feed)
/// starts with.
#[derive(Debug)]
pub(crate) enum Subscription<L> {
    /// Send `first` (the snapshot, or the lines replayed from the history),
    /// then every line `live` yields; `live` closing ends the stream.
    Live {
        first: Vec<L>,
        live: mpsc::Receiver<L>,
    },
    /// The history does not reach back to the revision asked for.
    Compacted { compact_revision: Revision },
}

/// How a stream starts, from the resume point its client names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// From a snapshot: a first connection, or a resume point from another
    /// epoch (another server, an index rebuilt since, another store).
    Snapshot,
    /// The history no longer reaches back to the resume point.
    Compacted,
    /// Replay the history from the resume point.
    Replay,
}

impl Start {
    /// The first revision a stream started this way takes live lines of:
    /// after a snapshot every line (the resume point, from another
    /// history, says nothing), else the resume point's.
    pub(crate) fn live_from(&self, resume: &Resume) -> Revision {
        match self {
            Start::Snapshot => 0,
            Start::Compacted | Start::Replay => resume.from,
        }
    }
}

/// Decides [`Start`]. A resume point counts only in the epoch that handed
/// it out: only that index saw every revision since, and a revision number
/// of another store, or of this store before it was rewound, would replay
/// the wrong lines or none.
pub(crate) fn start_of(resume: &Resume, epoch: &str, history_from: Revision) -> Start {
    if resume.from <= 0 || resume.epoch != epoch {
        Start::Snapshot
    } else if resume.from < history_from {
        Start::Compacted
    } else {
        Start::Replay
    }
}

/// A new epoch: 16 random hex digits.
pub(crate) fn new_epoch() -> String {
    format!("{:016x}", fastrand::u64(..))
}

/// The origin a snapshot of `epoch` names, with the store's identity in
/// `view`.
pub(crate) fn origin(view: &View, epoch: &str) -> StreamOrigin {
    StreamOrigin {
        store: view
            .store_identity
            .as_ref()
            .map(|identity| identity.value.id.clone())
            .unwrap_or_default(),
        epoch: epoch.to_owned(),
    }
}

/// The hub; lives in the [`ApiState`], started by the first stream.
#[derive(Debug, Default)]
pub(crate) struct AssignmentHub {
    state: Mutex<HubState>,
    started: OnceCell<()>,
}

#[derive(Debug, Default)]
struct HubState {
    /// Changes with every rebuild: resume points of another epoch get a
    /// snapshot.
    epoch: String,
    /// Every event up to this revision is applied.
    revision: Revision,
    /// Every line of a revision ≥ this is in `history`.
    history_from: Revision,
    history: VecDeque<(String, Line)>,
    /// Node → its placements by instance id.
    placed: HashMap<String, BTreeMap<String, Arc<Instance>>>,
    subscribers: HashMap<String, Vec<Subscriber>>,
}

#[derive(Debug)]
struct Subscriber {
    /// Lines of earlier revisions were already seen (replayed or resumed).
    from: Revision,
    sender: mpsc::Sender<Line>,
}

impl AssignmentHub {
    /// Subscribes `node`'s stream: a snapshot first (see [`start_of`]),
    /// else the lines since the resume point.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        api: &ApiState,
        node: &str,
        resume: &Resume,
    ) -> ApiResult<Subscription<Line>> {
        self.started.get_or_init(|| async { self.start(api) }).await;
        let mut state = self.lock();
        let start = start_of(resume, &state.epoch, state.history_from);
        let first = if start == Start::Snapshot {
            let view = api.cache().view();
            let assignments = state
                .placed
                .get(node)
                .into_iter()
                .flat_map(BTreeMap::values)
                .map(|instance| assignment(&view, instance))
                .collect();
            vec![Arc::new(AssignmentLine::Snapshot {
                revision: state.revision,
                assignments,
                origin: origin(&view, &state.epoch),
            })]
        } else if start == Start::Compacted {
            return Ok(Subscription::Compacted {
                compact_revision: state.history_from - 1,
            });
        } else {
            state
                .history
                .iter()
                .filter(|(to, line)| to == node && revision_of(line) >= resume.from)
                .map(|(_, line)| Arc::clone(line))
                .collect()
        };
        let (sender, live) = mpsc::channel(SUBSCRIBER_BUFFER);
        state
            .subscribers
            .entry(node.to_owned())
            .or_default()
            .push(Subscriber {
                from: start.live_from(resume),
                sender,
            });
        Ok(Subscription::Live { first, live })
    }

    /// Indexes the cache's view and starts following its changes.
    fn start(self: &Arc<Self>, api: &ApiState) {
        // Subscribe before reading the view: a change between the two is
        // then both in the feed and skipped as already indexed.
        let changes = api.cache().subscribe();
        self.rebuild(&api.cache().view());
        let hub = Arc::clone(self);
        let api = api.clone();
        tokio::spawn(async move {
            let shutdown = api.shutdown_signal();
            hub.follow(api, changes, shutdown).await;
        });
    }

    /// Indexes every placement of `view`. Streams open so far end: they
    /// may have missed changes.
    fn rebuild(&self, view: &View) {
        let mut state = self.lock();
        state.subscribers.clear();
        state.placed.clear();
        state.history.clear();
        state.epoch = new_epoch();
        for (id, instance) in view.instances.iter() {
            state
                .placed
                .entry(instance.node.clone())
                .or_default()
                .insert(id.clone(), Arc::clone(&instance.value));
        }
        state.revision = view.revision;
        state.history_from = view.revision + 1;
    }

    /// Routes the cache's changes until the server shuts down, rebuilding
    /// from the view when the cache relists or the feed lagged.
    async fn follow(
        &self,
        api: ApiState,
        mut changes: broadcast::Receiver<Arc<Change>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            let change = tokio::select! {
                change = changes.recv() => change,
                _ = shutdown.wait_for(|stop| *stop) => return,
            };
            match change {
                Ok(change) if change.relisted => self.rebuild(&api.cache().view()),
                Ok(change) => self.apply(&api.cache().view(), &change),
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::info!(missed, "assignment hub fell behind the cache; rebuilding");
                    self.rebuild(&api.cache().view());
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Routes one revision's placement changes to the nodes they concern.
    /// `view` is at the change's revision or later.
    fn apply(&self, view: &View, change: &Change) {
        let mut state = self.lock();
        if change.revision <= state.revision {
            return;
        }
        let revision = change.revision;
        for fact in &change.facts {
            let Key::Instance { id, .. } = &fact.key else {
                continue;
            };
            let old = instance_of(fact.old.as_ref());
            let new = instance_of(fact.new.as_ref());
            if let Some(was) = old
                && new.is_none_or(|new| new.node != was.node)
            {
                if let Some(placed) = state.placed.get_mut(&was.node) {
                    placed.remove(id);
                    if placed.is_empty() {
                        state.placed.remove(&was.node);
                    }
                }
                let line = AssignmentLine::Delete {
                    revision,
                    id: id.clone(),
                };
                state.route(was.node.clone(), Arc::new(line));
            }
            if let Some(instance) = new {
                state
                    .placed
                    .entry(instance.node.clone())
                    .or_default()
                    .insert(id.clone(), Arc::clone(instance));
                let line = AssignmentLine::Put {
                    revision,
                    assignment: Box::new(assignment(view, instance)),
                };
                state.route(instance.node.clone(), Arc::new(line));
            }
        }
        state.revision = revision;
    }

    fn lock(&self) -> MutexGuard<'_, HubState> {
        // The state is consistent between statements that could panic, so
        // a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl HubState {
    /// Records `line` for `node` and hands it to the node's streams.
    fn route(&mut self, node: String, line: Line) {
        let revision = revision_of(&line);
        if let Some(subscribers) = self.subscribers.get_mut(&node) {
            subscribers.retain(|subscriber| {
                revision < subscriber.from
                    || match subscriber.sender.try_send(Arc::clone(&line)) {
                        Ok(()) => true,
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            tracing::debug!(%node, "assignment stream fell behind; ending it");
                            false
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => false,
                    }
            });
            if subscribers.is_empty() {
                self.subscribers.remove(&node);
            }
        }
        if self.history.len() == HISTORY
            && let Some((_, oldest)) = self.history.pop_front()
        {
            self.history_from = self.history_from.max(revision_of(&oldest) + 1);
        }
        self.history.push_back((node, line));
    }
}

fn revision_of(line: &AssignmentLine) -> Revision {
    match line {
        AssignmentLine::Snapshot { revision, .. }
        | AssignmentLine::Put { revision, .. }
        | AssignmentLine::Delete { revision, .. } => *revision,
        AssignmentLine::Compacted { compact_revision } => *compact_revision,
    }
}

fn instance_of(value: Option<&Value>) -> Option<&Arc<Instance>> {
    match value {
        Some(Value::Instance(instance)) => Some(instance),
        _ => None,
    }
}

/// An instance with the spec it was placed with and its service's explicit
/// secret grants, as the agent runs it.
fn assignment(view: &View, instance: &Instance) -> Assignment {
    let spec = placed_spec(view, instance);
    let probes = spec
        .as_ref()
        .map(|spec| probe_addresses(view, spec))
        .unwrap_or_default();
    Assignment {
        instance: instance.clone(),
        spec,
        secrets: explicit_grants(view, &instance.service),
        probes,
    }
}

/// Where each connection `spec`'s init steps probe answers: its host and
/// port, and the VIP of the service its host names, if one is held.
fn probe_addresses(view: &View, spec: &ServiceSpec) -> BTreeMap<String, ProbeAddress> {
    spec.init
        .iter()
        .filter_map(|step| step.probe.as_deref())
        .filter_map(|name| {
            let connection = view.connections.get(name)?;
            let service = connection
                .host
                .strip_suffix(&format!(".{}", cca_model::net::DNS_ZONE))
                .unwrap_or(&connection.host);
            let vip = view
                .vips
                .get(service)
                .and_then(|vip| vip.value.held().copied());
            let address = ProbeAddress {
                host: connection.host.clone(),
                port: connection.port,
                vip,
            };
            Some((name.to_owned(), address))
        })
        .collect()
}

/// The spec `instance` was placed with: its service's version of the
/// instance's spec hash, so an instance an agent (re)starts during a rolling
/// update runs the version its record names rather than the newest one.
/// `None` once the service is deleted (the instance is being stopped).
/// Versions are written by `cca apply` with each spec; a spec written before
/// versions existed has none until the next apply changes it, and its
/// instances then get the current spec (what every instance got before).
fn placed_spec(view: &View, instance: &Instance) -> Option<ServiceSpec> {
    let current = view.services.get(&instance.service)?;
    let version = view
        .versions
        .get(&instance.service)
        .and_then(|versions| versions.get(&instance.spec_hash));
    Some(match version {
        Some(version) => version.spec.clone(),
        None => (*current.value).clone(),
    })
}

/// The secrets `service` is granted explicitly, sorted.
pub(crate) fn explicit_grants(view: &View, service: &str) -> Vec<String> {
    view.grants
        .get(service)
        .into_iter()
        .flat_map(|grants| grants.iter())
        .filter(|(_, grant)| matches!(*grant.value, SecretGrant::Explicit))
        .map(|(secret, _)| secret.clone())
        .collect()
}
