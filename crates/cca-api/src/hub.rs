//! The assignment hub: one store watch on `derived/instances/` for the
//! whole API server, decoded once and routed to the assignment streams of
//! the nodes concerned. A watch per stream made every placement change cost
//! O(nodes) — the store cloned each event for every stream, every stream
//! decoded it and kept its own map of the whole cluster's placements — which
//! is what kept 100,000 instances on 2,500 nodes from converging. Here a
//! change costs O(1) plus the lines it produces, and the placement map is
//! kept once.
//!
//! A bounded history of recent lines lets a reconnecting agent resume
//! where it left off; older `from` revisions get a `compacted` line (the
//! agent reconnects for a snapshot), as a compacted store watch would. A
//! subscriber that falls behind, or a hub that must relist (its watch was
//! compacted or broke), ends the streams concerned: agents reconnect and
//! resume or resnapshot, so no line is ever silently lost.
//!
//! An assignment also carries its service's spec (from the cache's view)
//! and explicit secret grants (from the [`GrantIndex`](crate::grants)),
//! both fed by the cache's watch, which may lag behind this one. Before
//! building the lines of revision R (or a snapshot at R), the hub waits
//! until both have applied R, so a grant or spec committed with a placement
//! or before it is in the placement's line. The wait costs nothing when
//! they are ahead, and no store read.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cca_model::cluster::Instance;
use cca_model::keys;
use cca_store::{RangeRequest, Revision, WatchEvent, WatchMessage, WatchStream};
use tokio::sync::{OnceCell, mpsc, watch};

use crate::error::{ApiError, ApiResult};
use crate::state::ApiState;
use crate::types::{Assignment, AssignmentLine};

/// Lines kept for resuming streams. A node reconnecting after a short
/// break resumes from here; a longer break costs it one snapshot.
const HISTORY: usize = 16_384;

/// Lines buffered per stream before the hub gives up on it (the stream
/// ends and its agent resumes from the history or resnapshots).
const SUBSCRIBER_BUFFER: usize = 1024;

/// A routed line, shared between the history and the subscribers.
pub(crate) type Line = Arc<AssignmentLine>;

/// What a new assignment stream starts with.
#[derive(Debug)]
pub(crate) enum Subscription {
    /// Send `first` (the snapshot, or the lines replayed from the history),
    /// then every line `live` yields; `live` closing ends the stream.
    Live {
        first: Vec<Line>,
        live: mpsc::Receiver<Line>,
    },
    /// The history does not reach back to the revision asked for.
    Compacted { compact_revision: Revision },
}

/// The hub; lives in the [`ApiState`], started by the first stream.
#[derive(Debug, Default)]
pub(crate) struct AssignmentHub {
    state: Mutex<HubState>,
    started: OnceCell<()>,
}

#[derive(Debug, Default)]
struct HubState {
    /// False while (re)listing: new streams are refused with 503.
    ready: bool,
    /// Every event up to this revision is applied.
    revision: Revision,
    /// Every line of a revision ≥ this is in `history`.
    history_from: Revision,
    history: VecDeque<(String, Line)>,
    /// Placement key → the node it is on.
    node_of: HashMap<String, String>,
    /// Node → its placements by key.
    placed: HashMap<String, BTreeMap<String, Instance>>,
    subscribers: HashMap<String, Vec<Subscriber>>,
}

#[derive(Debug)]
struct Subscriber {
    /// Lines of earlier revisions were already seen (replayed or resumed).
    from: Revision,
    sender: mpsc::Sender<Line>,
}

impl AssignmentHub {
    /// Subscribes `node`'s stream: a snapshot first when `from` is 0,
    /// else the lines since `from`.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        api: &ApiState,
        node: &str,
        from: Revision,
    ) -> ApiResult<Subscription> {
        self.started
            .get_or_try_init(|| self.start(api))
            .await
            .map_err(ApiError::from)?;
        let mut state = self.lock();
        if !state.ready {
            return Err(ApiError::unavailable(
                "the assignment stream is catching up with the store; retry shortly",
            ));
        }
        let first = if from == 0 {
            let assignments = state
                .placed
                .get(node)
                .into_iter()
                .flat_map(BTreeMap::values)
                .map(|instance| assignment(api, instance.clone()))
                .collect();
            vec![Arc::new(AssignmentLine::Snapshot {
                revision: state.revision,
                assignments,
            })]
        } else if from < state.history_from {
            return Ok(Subscription::Compacted {
                compact_revision: state.history_from - 1,
            });
        } else {
            state
                .history
                .iter()
                .filter(|(to, line)| to == node && revision_of(line) >= from)
                .map(|(_, line)| Arc::clone(line))
                .collect()
        };
        let (sender, live) = mpsc::channel(SUBSCRIBER_BUFFER);
        state
            .subscribers
            .entry(node.to_owned())
            .or_default()
            .push(Subscriber { from, sender });
        Ok(Subscription::Live { first, live })
    }

    /// Lists the placements and starts following them.
    async fn start(self: &Arc<Self>, api: &ApiState) -> cca_store::Result<()> {
        // Grants first: an assignment built from placements listed after
        // them names every grant its service had by then.
        api.grants().start(api).await?;
        let stream = self.relist(api).await?;
        let hub = Arc::clone(self);
        let api = api.clone();
        tokio::spawn(async move {
            let shutdown = api.shutdown_signal();
            hub.follow(api, stream, shutdown).await;
        });
        Ok(())
    }

    /// Loads every placement and opens the watch right after it. Streams
    /// open so far end: they may have missed changes.
    async fn relist(&self, api: &ApiState) -> cca_store::Result<WatchStream> {
        {
            let mut state = self.lock();
            state.ready = false;
            state.subscribers.clear();
        }
        let page = api
            .store()
            .range(RangeRequest::prefix(keys::DERIVED_INSTANCES))
            .await?;
        let stream = api
            .store()
            .watch(keys::DERIVED_INSTANCES, page.revision + 1)
            .await?;
        // Snapshots built at `page.revision` must name what was granted by
        // then; a server shutting down meanwhile serves no more streams.
        if !caught_up(api, page.revision, &mut api.shutdown_signal()).await {
            return Err(cca_store::StoreError::Closed);
        }
        let mut state = self.lock();
        state.node_of.clear();
        state.placed.clear();
        state.history.clear();
        for kv in page.kvs {
            if let Some(instance) = decode_instance(&kv.value) {
                state.node_of.insert(kv.key.clone(), instance.node.clone());
                state
                    .placed
                    .entry(instance.node.clone())
                    .or_default()
                    .insert(kv.key, instance);
            }
        }
        state.revision = page.revision;
        state.history_from = page.revision + 1;
        state.ready = true;
        Ok(stream)
    }

    /// Applies the watch until the server shuts down, relisting (with
    /// backoff while the store is unreachable) when it is compacted or
    /// breaks.
    async fn follow(
        &self,
        api: ApiState,
        mut stream: WatchStream,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let message = tokio::select! {
                message = stream.next() => message,
                _ = shutdown.wait_for(|stop| *stop) => return,
            };
            match message {
                Some(Ok(WatchMessage::Events { revision, events })) => {
                    if !caught_up(&api, revision, &mut shutdown).await {
                        return;
                    }
                    self.apply(&api, revision, events);
                    continue;
                }
                Some(Ok(WatchMessage::Compacted { compact_revision })) => {
                    tracing::info!(compact_revision, "assignment watch compacted; relisting");
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, "assignment watch failed; relisting");
                }
                None => tracing::warn!("assignment watch ended; relisting"),
            }
            loop {
                match self.relist(&api).await {
                    Ok(relisted) => {
                        stream = relisted;
                        backoff = Duration::from_millis(100);
                        break;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "relisting placements failed; retrying");
                        tokio::select! {
                            () = tokio::time::sleep(backoff) => {}
                            _ = shutdown.wait_for(|stop| *stop) => return,
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        }
    }

    /// Routes one revision's events to the nodes they concern.
    fn apply(&self, api: &ApiState, revision: Revision, events: Vec<WatchEvent>) {
        // Decode outside the lock: subscribing streams wait on it.
        let decoded: Vec<(String, Option<Instance>)> = events
            .into_iter()
            .filter_map(|event| match event {
                WatchEvent::Put(kv) => {
                    decode_instance(&kv.value).map(|instance| (kv.key, Some(instance)))
                }
                WatchEvent::Delete { key, .. } => Some((key, None)),
            })
            .collect();
        let mut state = self.lock();
        for (key, instance) in decoded {
            let id = key.rsplit('/').next().unwrap_or_default().to_owned();
            let was = match &instance {
                Some(instance) => state.node_of.insert(key.clone(), instance.node.clone()),
                None => state.node_of.remove(&key),
            };
            if let Some(was) = was
                && instance
                    .as_ref()
                    .is_none_or(|instance| instance.node != was)
            {
                if let Some(placed) = state.placed.get_mut(&was) {
                    placed.remove(&key);
                    if placed.is_empty() {
                        state.placed.remove(&was);
                    }
                }
                let line = AssignmentLine::Delete {
                    revision,
                    id: id.clone(),
                };
                state.route(was, Arc::new(line));
            }
            if let Some(instance) = instance {
                let node = instance.node.clone();
                state
                    .placed
                    .entry(node.clone())
                    .or_default()
                    .insert(key, instance.clone());
                let line = AssignmentLine::Put {
                    revision,
                    assignment: Box::new(assignment(api, instance)),
                };
                state.route(node, Arc::new(line));
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

/// Waits until the grant index and the cache's view have applied
/// `revision`; false when the server shuts down first.
async fn caught_up(
    api: &ApiState,
    revision: Revision,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    let wait = async {
        api.grants().caught_up(revision).await;
        // The index follows the cache's change feed, so the view is there
        // too unless the index relisted from the store ahead of it.
        if let Err(error) = api.cache().view_at_least(revision).await {
            tracing::warn!(%error, revision, "the cache is gone; assignments may lack specs");
        }
    };
    tokio::select! {
        () = wait => true,
        _ = shutdown.wait_for(|stop| *stop) => false,
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

fn decode_instance(value: &[u8]) -> Option<Instance> {
    serde_json::from_slice(value).ok()
}

/// An instance with its service's spec and explicit secret grants, as the
/// agent runs it.
fn assignment(api: &ApiState, instance: Instance) -> Assignment {
    let spec = api
        .cache()
        .view()
        .services
        .get(&instance.service)
        .map(|spec| (*spec.value).clone());
    let secrets = api.grants().explicit(&instance.service);
    Assignment {
        instance,
        spec,
        secrets,
    }
}
