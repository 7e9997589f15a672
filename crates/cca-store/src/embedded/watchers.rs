//! Watch fan-out for the embedded store. Live watchers get each committed
//! revision pushed by the writer without blocking it; a watcher whose
//! buffer is full, or that starts in the past, is served by a catch-up task
//! that replays the revision log at the consumer's pace and rejoins the live
//! set once it is current. History that was compacted away ends the watch
//! with `Compacted` — never a silent gap.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::Shared;
use super::state::LogEntry;
use crate::error::Result;
use crate::types::{Revision, WatchEvent, WatchMessage};

/// Log entries a catch-up task replays per lock acquisition.
const CATCH_UP_CHUNK: usize = 256;

pub(super) type WatchSender = mpsc::Sender<Result<WatchMessage>>;

/// A watcher in the live set.
#[derive(Debug)]
pub(super) struct Watcher {
    prefix: String,
    /// The first revision this watcher wants.
    from: Revision,
    sender: WatchSender,
}

/// What became of a watcher after offering it one revision.
enum Delivery {
    Delivered,
    /// Its buffer is full: it must catch up from this revision.
    Lagging(Revision),
    Gone,
}

impl Watcher {
    fn offer(&self, entry: &LogEntry) -> Delivery {
        if entry.revision < self.from {
            return Delivery::Delivered;
        }
        let Some(message) = matching(&self.prefix, entry) else {
            return Delivery::Delivered;
        };
        match self.sender.try_send(Ok(message)) {
            Ok(()) => Delivery::Delivered,
            Err(TrySendError::Full(_)) => Delivery::Lagging(entry.revision),
            Err(TrySendError::Closed(_)) => Delivery::Gone,
        }
    }
}

/// The events of `entry` under `prefix`, as one message, if any.
fn matching(prefix: &str, entry: &LogEntry) -> Option<WatchMessage> {
    let events: Vec<WatchEvent> = entry
        .events
        .iter()
        .filter(|event| event.key().starts_with(prefix))
        .cloned()
        .collect();
    (!events.is_empty()).then_some(WatchMessage::Events {
        revision: entry.revision,
        events,
    })
}

/// Pushes freshly committed entries to the live watchers. Called by the
/// writer with the state's write lock held, so no watcher can join between
/// the apply and the push.
pub(super) fn fan_out(
    shared: &Arc<Shared>,
    watchers: &mut Vec<Watcher>,
    entries: &[Arc<LogEntry>],
) {
    if entries.is_empty() {
        return;
    }
    watchers.retain(|watcher| {
        for entry in entries {
            match watcher.offer(entry) {
                Delivery::Delivered => {}
                Delivery::Gone => return false,
                Delivery::Lagging(from) => {
                    spawn_catch_up(shared, watcher.prefix.clone(), from, watcher.sender.clone());
                    return false;
                }
            }
        }
        true
    });
}

/// Starts a watch at `from` (0: after the current revision).
pub(super) fn start(shared: &Arc<Shared>, prefix: String, from: Revision, sender: WatchSender) {
    let mut state = shared.write_state();
    if from == 0 || from > state.revision {
        let from = if from == 0 { state.revision + 1 } else { from };
        state.watchers.push(Watcher {
            prefix,
            from,
            sender,
        });
        return;
    }
    drop(state);
    spawn_catch_up(shared, prefix, from, sender);
}

fn spawn_catch_up(shared: &Arc<Shared>, prefix: String, from: Revision, sender: WatchSender) {
    let task = catch_up(Arc::clone(shared), prefix, from, sender);
    shared.runtime.spawn(task);
}

/// Replays the log from `from` at the consumer's pace, then rejoins the
/// live set.
async fn catch_up(shared: Arc<Shared>, prefix: String, mut from: Revision, sender: WatchSender) {
    loop {
        let chunk = match next_chunk(&shared, &prefix, from, &sender) {
            Chunk::Replay(chunk) => chunk,
            Chunk::Compacted(compact_revision) => {
                let _ = sender
                    .send(Ok(WatchMessage::Compacted { compact_revision }))
                    .await;
                return;
            }
            Chunk::Joined => return,
        };
        for entry in chunk {
            if let Some(message) = matching(&prefix, &entry)
                && sender.send(Ok(message)).await.is_err()
            {
                return;
            }
            from = entry.revision + 1;
        }
    }
}

enum Chunk {
    Replay(Vec<Arc<LogEntry>>),
    Compacted(Revision),
    Joined,
}

fn next_chunk(shared: &Shared, prefix: &str, from: Revision, sender: &WatchSender) -> Chunk {
    {
        let state = shared.read_state();
        if from <= state.compact_revision {
            return Chunk::Compacted(state.compact_revision);
        }
        let chunk = state.log_from(from, CATCH_UP_CHUNK);
        if !chunk.is_empty() {
            return Chunk::Replay(chunk);
        }
    }
    // Caught up: join the live set under the write lock, unless a commit
    // slipped in between the two locks.
    let mut state = shared.write_state();
    if from <= state.compact_revision {
        return Chunk::Compacted(state.compact_revision);
    }
    let chunk = state.log_from(from, CATCH_UP_CHUNK);
    if !chunk.is_empty() {
        return Chunk::Replay(chunk);
    }
    state.watchers.push(Watcher {
        prefix: prefix.to_owned(),
        from,
        sender: sender.clone(),
    });
    Chunk::Joined
}
