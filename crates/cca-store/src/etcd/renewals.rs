//! Lease renewals carried on a few long-lived keep-alive streams per
//! member, as etcd's own client carries them, instead of a stream opened
//! for every renewal. A server renews one lease per agent every few
//! seconds: 5,000 agents are 2,500 renewals a second, and opening a gRPC
//! stream for each (with the extra round trip etcd-client needs to tell a
//! renewal's TTL) cost etcd more than the renewals themselves, so that
//! renewals queued behind each other until leases expired.
//!
//! etcd answers a stream's requests one at a time and in order, so each
//! answer goes to the oldest caller waiting for that lease on that
//! stream. A lease always uses the same stream (chosen by its id), and
//! [`STREAMS`] of them let renewals of different leases proceed side by
//! side. A stream that ends or fails fails every caller waiting on it
//! as "maybe applied" (renewals are resent safely) and the next renewal
//! opens a new one.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use etcd_client::{LeaseClient, LeaseKeeper};
use tokio::sync::oneshot;

use super::errors::{Failure, classify};
use crate::error::StoreError;
use crate::types::LeaseId;

/// Keep-alive streams per member. etcd handles each stream's renewals in
/// turn; this many let renewals waiting on etcd's apply loop overlap.
pub(super) const STREAMS: usize = 16;

/// The keep-alive streams to one member.
pub(super) struct Renewals {
    client: LeaseClient,
    slots: Vec<tokio::sync::Mutex<Option<Arc<Stream>>>>,
}

/// What a renewal's caller is told.
enum Answer {
    /// The TTL etcd granted: 0 or less when it does not know the lease.
    Ttl(i64),
    /// The stream ended before answering; why.
    Closed(String),
}

/// One open keep-alive stream and the callers waiting on it.
struct Stream {
    /// Sends on the stream (for the lease it was opened with; renewals of
    /// others send through a keeper sharing its sender).
    keeper: LeaseKeeper,
    waiting: Mutex<Waiting>,
    reader: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Waiting {
    /// Set once the stream has ended: nothing more will be answered.
    closed: Option<String>,
    by_lease: HashMap<LeaseId, VecDeque<oneshot::Sender<Answer>>>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Renewals {
    pub(super) fn new(client: LeaseClient) -> Self {
        Self {
            client,
            slots: (0..STREAMS)
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
        }
    }

    /// Renews `lease` once; the TTL etcd granted.
    pub(super) async fn renew(&self, lease: LeaseId) -> Result<i64, Failure> {
        let stream = self.stream_for(lease).await?;
        let (answer, answered) = oneshot::channel();
        if let Err(reason) = stream.wait_for(lease, answer) {
            return Err(Failure::NotApplied(reason));
        }
        let mut keeper = LeaseKeeper {
            id: lease,
            sender: stream.keeper.sender.clone(),
        };
        if keeper.keep_alive().await.is_err() {
            return Err(Failure::NotApplied(
                "the keep-alive stream closed before the renewal was sent".into(),
            ));
        }
        match answered.await {
            Ok(Answer::Ttl(ttl)) if ttl > 0 => Ok(ttl),
            Ok(Answer::Ttl(_)) => Err(Failure::Final(StoreError::LeaseNotFound(lease))),
            Ok(Answer::Closed(reason)) => Err(Failure::MaybeApplied(reason)),
            Err(_) => Err(Failure::MaybeApplied(
                "the keep-alive stream ended without answering".into(),
            )),
        }
    }

    /// The open stream `lease` uses, opened (with a renewal of `lease`
    /// itself, which is how etcd-client starts one) when there is none
    /// or the last one ended.
    async fn stream_for(&self, lease: LeaseId) -> Result<Arc<Stream>, Failure> {
        let slot = &self.slots[slot_of(lease)];
        let mut open = slot.lock().await;
        if let Some(stream) = open.as_ref().filter(|stream| stream.is_open()) {
            return Ok(Arc::clone(stream));
        }
        let mut client = self.client.clone();
        let (keeper, answers) = client.keep_alive(lease).await.map_err(|err| match err {
            // etcd-client's answer when the first renewal found no lease.
            etcd_client::Error::LeaseKeepAliveError(_) => {
                Failure::Final(StoreError::LeaseNotFound(lease))
            }
            other => classify(other),
        })?;
        let stream = Arc::new_cyclic(|weak: &std::sync::Weak<Stream>| {
            let weak = weak.clone();
            Stream {
                keeper,
                waiting: Mutex::new(Waiting::default()),
                reader: tokio::spawn(async move { read_answers(answers, weak).await }),
            }
        });
        *open = Some(Arc::clone(&stream));
        Ok(stream)
    }
}

impl Stream {
    fn is_open(&self) -> bool {
        lock(&self.waiting).closed.is_none() && !self.keeper.sender.is_closed()
    }

    /// Queues `answer` for the next answer about `lease`; the reason the
    /// stream closed instead, when it has.
    fn wait_for(&self, lease: LeaseId, answer: oneshot::Sender<Answer>) -> Result<(), String> {
        let mut waiting = lock(&self.waiting);
        if let Some(reason) = &waiting.closed {
            return Err(reason.clone());
        }
        waiting.by_lease.entry(lease).or_default().push_back(answer);
        Ok(())
    }

    /// Hands an answer about `lease` to the oldest caller waiting for one.
    fn answered(&self, lease: LeaseId, ttl: i64) {
        let mut waiting = lock(&self.waiting);
        let Some(queue) = waiting.by_lease.get_mut(&lease) else {
            return;
        };
        if let Some(caller) = queue.pop_front() {
            // A caller that gave up (timed out) no longer listens.
            let _ = caller.send(Answer::Ttl(ttl));
        }
        if queue.is_empty() {
            waiting.by_lease.remove(&lease);
        }
    }

    /// Ends the stream: every waiting caller is told why.
    fn close(&self, reason: String) {
        let mut waiting = lock(&self.waiting);
        for (_, queue) in waiting.by_lease.drain() {
            for caller in queue {
                let _ = caller.send(Answer::Closed(reason.clone()));
            }
        }
        waiting.closed = Some(reason);
    }
}

/// Reads a stream's answers until it ends, then closes it.
async fn read_answers(
    mut answers: etcd_client::LeaseKeepAliveStream,
    stream: std::sync::Weak<Stream>,
) {
    let reason = loop {
        match answers.message().await {
            Ok(Some(answer)) => match stream.upgrade() {
                Some(stream) => stream.answered(answer.id(), answer.ttl()),
                None => return,
            },
            Ok(None) => break "etcd closed the keep-alive stream".to_owned(),
            Err(err) => {
                break match classify(err) {
                    Failure::NotApplied(reason) | Failure::MaybeApplied(reason) => reason,
                    Failure::Final(err) => err.to_string(),
                };
            }
        }
    };
    if let Some(stream) = stream.upgrade() {
        stream.close(format!("keep-alive stream: {reason}"));
    }
}

fn slot_of(lease: LeaseId) -> usize {
    // Lease ids are etcd's sequence numbers; their low bits spread well.
    (lease.unsigned_abs() % STREAMS as u64) as usize
}

fn lock(waiting: &Mutex<Waiting>) -> std::sync::MutexGuard<'_, Waiting> {
    waiting
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
