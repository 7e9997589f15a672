//! Watches on etcd. A task per watch reads etcd's watch stream, turns its
//! responses into one [`WatchMessage::Events`] per revision, and when the
//! connection is lost re-creates the watch on a reachable member from the
//! first revision not yet delivered — no gap, no duplicate — until the
//! consumer drops the stream or etcd reports the history compacted.
//!
//! Each etcd watch starts one revision *before* the first revision wanted
//! and that revision's events are dropped: etcd compacted at revision C
//! still serves revision C (partly — only keys it has not overwritten), but
//! in our model compacting C removes C. Starting at `next - 1` makes etcd
//! refuse exactly the watches our model refuses, reporting C.

use std::sync::Arc;

use etcd_client::{Event, EventType, WatchOptions, WatchResponse, WatchStream as EtcdWatchStream};
use tokio::sync::mpsc;

use super::client::{Members, Resend};
use super::errors::{Failure, classify};
use super::keys::Namespace;
use crate::error::{Result, StoreError};
use crate::types::{Revision, WatchEvent, WatchMessage};
use crate::watch::WatchStream;

type Sender = mpsc::Sender<Result<WatchMessage>>;

/// Starts watching the keys under `prefix` from revision `from` (at least
/// 1) on. Returns once etcd has accepted the watch.
pub(super) async fn start(
    members: Arc<Members>,
    ns: Namespace,
    prefix: &str,
    from: Revision,
) -> Result<WatchStream> {
    let (sender, stream) = WatchStream::channel();
    let (key, range_end) = ns.prefix_range(prefix);
    let watcher = Watcher {
        members,
        ns,
        key,
        range_end,
        next: from,
        sender,
    };
    match watcher.open(false).await? {
        Opened::Watching(etcd_stream) => {
            tokio::spawn(watcher.run(*etcd_stream));
        }
        Opened::Compacted(compact_revision) | Opened::Behind(compact_revision) => {
            watcher.end_compacted(compact_revision).await;
        }
    }
    Ok(stream)
}

/// What opening an etcd watch gave.
enum Opened {
    /// Boxed: a stream is large, and this enum is moved around.
    Watching(Box<EtcdWatchStream>),
    /// The history from the revision asked for is gone.
    Compacted(Revision),
    /// Resuming, etcd is at this revision, behind the last one the watch
    /// delivered (it was wiped, replaced or restored): it would wait for
    /// revisions of a history it no longer has and hand out another
    /// history's under the same numbers.
    Behind(Revision),
}

/// What to do after one etcd response.
enum Next {
    Continue,
    /// The connection was lost or etcd ended the watch: watch again.
    Reopen,
    Stop,
}

/// One watch: where it is, and where it delivers.
#[derive(Debug)]
struct Watcher {
    members: Arc<Members>,
    ns: Namespace,
    key: Vec<u8>,
    range_end: Vec<u8>,
    /// The first revision not delivered yet.
    next: Revision,
    sender: Sender,
}

impl Watcher {
    /// Reads etcd until the consumer leaves or the watch ends, re-creating
    /// the etcd watch whenever it is lost.
    async fn run(mut self, mut etcd_stream: EtcdWatchStream) {
        loop {
            let message = tokio::select! {
                () = self.sender.closed() => return,
                message = etcd_stream.message() => message,
            };
            let next = match message {
                Ok(Some(response)) => self.handle(response).await,
                Ok(None) => Next::Reopen,
                Err(err) => {
                    tracing::debug!(error = %err, next = self.next, "etcd watch broke");
                    Next::Reopen
                }
            };
            match next {
                Next::Continue => {}
                Next::Stop => return,
                Next::Reopen => match self.reopen().await {
                    Some(reopened) => etcd_stream = reopened,
                    None => return,
                },
            }
        }
    }

    async fn handle(&mut self, response: WatchResponse) -> Next {
        if response.compact_revision() > 0 {
            self.end_compacted(response.compact_revision()).await;
            return Next::Stop;
        }
        if response.canceled() {
            tracing::debug!(reason = response.cancel_reason(), "etcd canceled a watch");
            return Next::Reopen;
        }
        if response.events().is_empty() {
            self.note_progress(&response);
            return Next::Continue;
        }
        match revisions(&self.ns, response.events(), self.next) {
            Ok(groups) => self.deliver(groups).await,
            Err(err) => {
                let _ = self.sender.send(Err(err)).await;
                Next::Stop
            }
        }
    }

    /// A progress notification (an empty response to an established
    /// watch) promises that every event up to its revision was sent, so a
    /// later resume may start after it.
    fn note_progress(&mut self, response: &WatchResponse) {
        if response.created() {
            return;
        }
        if let Some(header) = response.header() {
            self.next = self.next.max(header.revision() + 1);
        }
    }

    async fn deliver(&mut self, groups: Vec<(Revision, Vec<WatchEvent>)>) -> Next {
        for (revision, events) in groups {
            let message = WatchMessage::Events { revision, events };
            if self.sender.send(Ok(message)).await.is_err() {
                return Next::Stop;
            }
            self.next = revision + 1;
        }
        Next::Continue
    }

    async fn end_compacted(&self, compact_revision: Revision) {
        let message = WatchMessage::Compacted { compact_revision };
        let _ = self.sender.send(Ok(message)).await;
    }

    /// Watches again from the first undelivered revision, retrying with
    /// backoff for as long as the consumer is there. `None`: stop.
    async fn reopen(&mut self) -> Option<EtcdWatchStream> {
        loop {
            let opened = tokio::select! {
                () = self.sender.closed() => return None,
                opened = self.open(true) => opened,
            };
            match opened {
                Ok(Opened::Watching(stream)) => return Some(*stream),
                Ok(Opened::Compacted(compact_revision)) => {
                    self.end_compacted(compact_revision).await;
                    return None;
                }
                Ok(Opened::Behind(current)) => {
                    // Told as a compaction: the consumer reads everything
                    // again, which is what it must do.
                    tracing::warn!(
                        store_revision = current,
                        delivered = self.next - 1,
                        "etcd is behind what this watch delivered (wiped, replaced or restored); ending it as compacted"
                    );
                    self.end_compacted(current).await;
                    return None;
                }
                Err(err) if err.is_transient() => {
                    tracing::warn!(error = %err, next = self.next, "etcd watch not resumed yet");
                }
                Err(err) => {
                    let _ = self.sender.send(Err(err)).await;
                    return None;
                }
            }
        }
    }

    /// Creates the etcd watch, with the usual retries; `resuming`, it
    /// checks that etcd has not gone back behind the watch.
    async fn open(&self, resuming: bool) -> Result<Opened> {
        let start = (self.next - 1).max(1);
        let delivered = self.next - 1;
        let options = WatchOptions::new()
            .with_range(self.range_end.clone())
            .with_start_revision(start)
            .with_progress_notify();
        self.members
            .call("watch", Resend::Always, |member, _| {
                let mut client = member.watch.clone();
                let key = self.key.clone();
                let options = options.clone();
                async move {
                    let mut stream = client.watch(key, Some(options)).await.map_err(classify)?;
                    match stream.message().await.map_err(classify)? {
                        Some(created) if created.compact_revision() > 0 => {
                            Ok(Opened::Compacted(created.compact_revision()))
                        }
                        Some(created) if created.created() && !created.canceled() => {
                            let current = created.header().map_or(delivered, |h| h.revision());
                            if resuming && current < delivered {
                                return Ok(Opened::Behind(current));
                            }
                            Ok(Opened::Watching(Box::new(stream)))
                        }
                        Some(refused) => Err(Failure::NotApplied(format!(
                            "etcd did not create the watch: {}",
                            refused.cancel_reason()
                        ))),
                        None => Err(Failure::NotApplied(
                            "etcd closed the watch stream before creating the watch".into(),
                        )),
                    }
                }
            })
            .await
    }
}

/// The events of one etcd response from revision `from` on, one group per
/// revision, each group in key order (as the embedded store delivers them).
/// etcd never splits a revision across responses unless asked to
/// (`fragment`), which we do not.
fn revisions(
    ns: &Namespace,
    events: &[Event],
    from: Revision,
) -> Result<Vec<(Revision, Vec<WatchEvent>)>> {
    let mut groups: Vec<(Revision, Vec<WatchEvent>)> = Vec::new();
    for event in events {
        let event = watch_event(ns, event)?;
        let revision = event.revision();
        if revision < from {
            continue;
        }
        match groups.last_mut() {
            Some((last, group)) if *last == revision => group.push(event),
            _ => groups.push((revision, vec![event])),
        }
    }
    for (_, group) in &mut groups {
        group.sort_by(|a, b| a.key().cmp(b.key()));
    }
    Ok(groups)
}

fn watch_event(ns: &Namespace, event: &Event) -> Result<WatchEvent> {
    let kv = event
        .kv()
        .ok_or_else(|| StoreError::Backend("etcd sent a watch event without a key".into()))?;
    Ok(match event.event_type() {
        EventType::Put => WatchEvent::Put(ns.key_value(kv)?),
        // A delete event's key carries the revision of the delete.
        EventType::Delete => WatchEvent::Delete {
            key: ns.strip(kv.key())?,
            revision: kv.mod_revision(),
        },
    })
}
