//! The watch-fed cache, the one reflector of a server: one task lists the
//! store, then follows one watch and applies every change to a [`View`]
//! (the only writer); readers take O(1) snapshots. Each revision's changes
//! are broadcast decoded ([`Change`]: the key, the value before and after),
//! so controllers wake only for the kinds that concern them and indexes
//! (the API's assignment hub) follow the cluster without a watch or a
//! store read of their own. A compacted watch or a lost stream is repaired
//! by relisting — never by skipping history.
//!
//! Ordering: a revision's view is published before its change is
//! broadcast, so a subscriber handling the change of revision R always
//! finds [`Cache::view`] at R or later.

use std::sync::Arc;
use std::time::Duration;

use cca_store::{RangeRequest, Revision, Store, StoreError, WatchEvent, WatchMessage};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::view::{FactChange, View};

/// Keys per page while listing.
const LIST_PAGE: usize = 5_000;
/// Revisions of change notifications buffered per subscriber before it is
/// told it lagged (and must look at everything).
const CHANGE_BUFFER: usize = 4_096;
/// Wait between attempts to relist after a store error.
const RELIST_BACKOFF: Duration = Duration::from_millis(200);

/// What one revision changed, decoded.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub revision: Revision,
    /// The facts the revision wrote or deleted (those the view did not
    /// already hold at that revision are left out).
    pub facts: Vec<FactChange>,
    /// The cache relisted the store: anything may have changed, and
    /// `facts` is empty. Subscribers rebuild from the view.
    pub relisted: bool,
}

/// A running cache; dropping it stops the task.
#[derive(Debug)]
pub struct Cache {
    views: watch::Receiver<Arc<View>>,
    changes: broadcast::Sender<Arc<Change>>,
    task: JoinHandle<()>,
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Cache {
    /// Lists the store and starts following it. Returns once the first
    /// complete view is available.
    pub async fn start(store: Arc<dyn Store>) -> Result<Self, StoreError> {
        let first = list(store.as_ref()).await?;
        let (publish, views) = watch::channel(Arc::new(first));
        let (changes, _) = broadcast::channel(CHANGE_BUFFER);
        let task = tokio::spawn(follow(store, publish, changes.clone()));
        Ok(Self {
            views,
            changes,
            task,
        })
    }

    /// The latest snapshot.
    pub fn view(&self) -> Arc<View> {
        Arc::clone(&self.views.borrow())
    }

    /// A snapshot reflecting at least `revision` (waits for the watch to
    /// deliver it). Fails only if the cache task is gone.
    pub async fn view_at_least(&self, revision: Revision) -> Result<Arc<View>, StoreError> {
        let mut views = self.views.clone();
        let view = views
            .wait_for(|view| view.revision >= revision)
            .await
            .map_err(|_| StoreError::Closed)?;
        Ok(Arc::clone(&view))
    }

    /// Change notifications from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }

    /// Notifies when a new snapshot is published.
    pub fn views(&self) -> watch::Receiver<Arc<View>> {
        self.views.clone()
    }
}

/// Reads every key into a fresh view.
async fn list(store: &dyn Store) -> Result<View, StoreError> {
    let mut view = View::default();
    let mut request = RangeRequest::prefix("").limit(LIST_PAGE);
    let mut first_revision = None;
    loop {
        let page = store.range(request.clone()).await?;
        first_revision.get_or_insert(page.revision);
        for kv in &page.kvs {
            view.put(&kv.key, &kv.value, kv.mod_revision);
        }
        match page.continuation {
            Some(last) => request = request.after(last),
            None => break,
        }
    }
    // Later pages may already hold newer changes; the watch replays from the
    // first page on, and older replays are ignored by the view.
    view.revision = first_revision.unwrap_or(0);
    Ok(view)
}

/// Follows the store forever, relisting whenever the watch cannot go on.
async fn follow(
    store: Arc<dyn Store>,
    publish: watch::Sender<Arc<View>>,
    changes: broadcast::Sender<Arc<Change>>,
) {
    loop {
        let from = publish.borrow().revision + 1;
        let ended = match store.watch("", from).await {
            Ok(mut stream) => follow_stream(&mut stream, &publish, &changes).await,
            Err(error) => Err(error),
        };
        match ended {
            Ok(()) => {}
            Err(error) => tracing::warn!(%error, "cache watch ended; relisting"),
        }
        if publish.is_closed() {
            return;
        }
        relist(store.as_ref(), &publish, &changes).await;
    }
}

/// Applies watch messages until the stream ends or history is compacted.
async fn follow_stream(
    stream: &mut cca_store::WatchStream,
    publish: &watch::Sender<Arc<View>>,
    changes: &broadcast::Sender<Arc<Change>>,
) -> Result<(), StoreError> {
    while let Some(message) = stream.next().await {
        match message? {
            WatchMessage::Events { revision, events } => {
                let facts = apply(publish, revision, &events);
                // Nobody listening is fine: controllers subscribe later.
                let _ = changes.send(Arc::new(Change {
                    revision,
                    facts,
                    relisted: false,
                }));
            }
            WatchMessage::Compacted { compact_revision } => {
                tracing::info!(compact_revision, "cache fell behind compaction; relisting");
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Applies one revision's events to the view, publishes it and says what
/// changed.
fn apply(
    publish: &watch::Sender<Arc<View>>,
    revision: Revision,
    events: &[WatchEvent],
) -> Vec<FactChange> {
    let mut facts = Vec::with_capacity(events.len());
    publish.send_modify(|view| {
        let view = Arc::make_mut(view);
        for event in events {
            let change = match event {
                WatchEvent::Put(kv) => view.put(&kv.key, &kv.value, kv.mod_revision),
                WatchEvent::Delete { key, revision } => view.delete(key, *revision),
            };
            facts.extend(change);
        }
        view.revision = view.revision.max(revision);
    });
    facts
}

/// Rebuilds the view from a fresh list, retrying until the store answers,
/// and tells every subscriber that everything may have changed.
async fn relist(
    store: &dyn Store,
    publish: &watch::Sender<Arc<View>>,
    changes: &broadcast::Sender<Arc<Change>>,
) {
    loop {
        match list(store).await {
            Ok(view) => {
                let revision = view.revision;
                publish.send_replace(Arc::new(view));
                let _ = changes.send(Arc::new(Change {
                    revision,
                    facts: Vec::new(),
                    relisted: true,
                }));
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "relisting the store failed; retrying");
                tokio::time::sleep(RELIST_BACKOFF).await;
            }
        }
    }
}
