//! The network feed: the cluster's network map as every node follows it
//! (`GET /v1/agent/nodes/{node}/network`). It keeps a
//! [`NetworkProjection`] current from the server's one cache and turns each
//! revision's changes into one line, serialized once and shared by every
//! stream (the map is the same for every node, so a change costs one
//! encoding whatever the number of nodes).
//!
//! A new stream starts with a snapshot of the whole map; a reconnecting
//! one resumes from a bounded history of recent lines, or gets `compacted`
//! and resnapshots. A stream that falls behind, or a feed that rebuilds
//! (the cache relisted, or the feed lagged behind it), ends: its node
//! reconnects, so no change is ever silently lost. The server's own DNS
//! server reads the same map through [`NetworkFeed::maps`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use cca_control::cache::Change;
use cca_control::netmap::NetworkProjection;
use cca_model::Revision;
use cca_model::net::{AddressRanges, NetworkMap};
use tokio::sync::{OnceCell, broadcast, mpsc, watch};

use crate::hub::{Start, Subscription, new_epoch, origin, start_of};
use crate::state::ApiState;
use crate::types::{NetworkLine, Resume};

/// Revisions kept for resuming streams.
const HISTORY: usize = 4096;

/// Lines buffered per stream before the feed gives up on it.
const SUBSCRIBER_BUFFER: usize = 1024;

/// The feed; lives in the [`ApiState`], started by its first user.
#[derive(Debug)]
pub(crate) struct NetworkFeed {
    state: Mutex<FeedState>,
    started: OnceCell<()>,
    maps: watch::Sender<NetworkMap>,
    /// The control plane's address ranges, from its configuration.
    ranges: std::sync::OnceLock<AddressRanges>,
}

impl Default for NetworkFeed {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            started: OnceCell::new(),
            maps: watch::Sender::new(NetworkMap::default()),
            ranges: std::sync::OnceLock::new(),
        }
    }
}

#[derive(Debug, Default)]
struct FeedState {
    /// Changes with every rebuild (see [`start_of`]).
    epoch: String,
    projection: NetworkProjection,
    /// Every change up to this revision is projected.
    revision: Revision,
    /// Every line of a revision ≥ this is in `history`.
    history_from: Revision,
    history: VecDeque<(Revision, Bytes)>,
    subscribers: Vec<Subscriber>,
}

#[derive(Debug)]
struct Subscriber {
    /// Lines of earlier revisions were already seen.
    from: Revision,
    sender: mpsc::Sender<Bytes>,
}

impl NetworkFeed {
    /// Says which ranges the control plane allocates from (once, before
    /// the first stream).
    pub(crate) fn set_ranges(&self, ranges: AddressRanges) {
        let _ = self.ranges.set(ranges);
    }

    /// Subscribes a stream: a snapshot first (see [`start_of`]), else the
    /// lines since the resume point.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        api: &ApiState,
        resume: &Resume,
    ) -> Subscription<Bytes> {
        self.start_once(api).await;
        let mut state = self.lock();
        let start = start_of(resume, &state.epoch, state.history_from);
        let first = if start == Start::Snapshot {
            let snapshot = NetworkLine::Snapshot {
                revision: state.revision,
                changes: state.projection.snapshot(),
                origin: origin(&api.cache().view(), &state.epoch),
            };
            vec![encode(&snapshot)]
        } else if start == Start::Compacted {
            return Subscription::Compacted {
                compact_revision: state.history_from - 1,
            };
        } else {
            state
                .history
                .iter()
                .filter(|(revision, _)| *revision >= resume.from)
                .map(|(_, line)| line.clone())
                .collect()
        };
        let (sender, live) = mpsc::channel(SUBSCRIBER_BUFFER);
        state.subscribers.push(Subscriber {
            from: start.live_from(resume),
            sender,
        });
        Subscription::Live { first, live }
    }

    /// The map as this server sees it, updated after every revision.
    pub(crate) async fn maps(self: &Arc<Self>, api: &ApiState) -> watch::Receiver<NetworkMap> {
        self.start_once(api).await;
        self.maps.subscribe()
    }

    async fn start_once(self: &Arc<Self>, api: &ApiState) {
        self.started.get_or_init(|| async { self.start(api) }).await;
    }

    /// Projects the cache's view and starts following its changes.
    fn start(self: &Arc<Self>, api: &ApiState) {
        // Subscribe before reading the view: a change between the two is
        // then both in the feed and skipped as already projected.
        let changes = api.cache().subscribe();
        self.rebuild(api);
        let feed = Arc::clone(self);
        let api = api.clone();
        tokio::spawn(async move {
            let shutdown = api.shutdown_signal();
            feed.follow(api, changes, shutdown).await;
        });
    }

    /// Projects the whole view again. Streams open so far end: they may
    /// have missed changes.
    fn rebuild(&self, api: &ApiState) {
        let view = api.cache().view();
        let mut state = self.lock();
        state.subscribers.clear();
        state.epoch = new_epoch();
        state.history.clear();
        state.projection = NetworkProjection::from_view(&view);
        if let Some(ranges) = self.ranges.get() {
            state.projection.set_ranges(*ranges);
        }
        state.revision = view.revision;
        state.history_from = view.revision + 1;
        self.maps.send_replace(state.projection.map().clone());
    }

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
                Ok(change) if change.relisted => self.rebuild(&api),
                Ok(change) => self.apply(&api, &change),
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::info!(missed, "network feed fell behind the cache; rebuilding");
                    self.rebuild(&api);
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Projects one revision's changes and sends the line they make.
    fn apply(&self, api: &ApiState, change: &Change) {
        let mut state = self.lock();
        if change.revision <= state.revision {
            return;
        }
        let view = api.cache().view();
        let changes = state.projection.apply(&view, &change.facts);
        state.revision = change.revision;
        if changes.is_empty() {
            return;
        }
        self.maps.send_replace(state.projection.map().clone());
        let line = encode(&NetworkLine::Changes {
            revision: change.revision,
            changes,
        });
        state.route(change.revision, line);
    }

    fn lock(&self) -> MutexGuard<'_, FeedState> {
        // The state is consistent between statements that could panic, so
        // a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl FeedState {
    /// Records `line` and hands it to every stream.
    fn route(&mut self, revision: Revision, line: Bytes) {
        self.subscribers.retain(|subscriber| {
            revision < subscriber.from
                || match subscriber.sender.try_send(line.clone()) {
                    Ok(()) => true,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        tracing::debug!("network stream fell behind; ending it");
                        false
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => false,
                }
        });
        if self.history.len() == HISTORY
            && let Some((oldest, _)) = self.history.pop_front()
        {
            self.history_from = self.history_from.max(oldest + 1);
        }
        self.history.push_back((revision, line));
    }
}

/// One NDJSON line.
fn encode(line: &NetworkLine) -> Bytes {
    // Map entries are plain data with string keys: encoding cannot fail.
    let mut bytes = serde_json::to_vec(line).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}
