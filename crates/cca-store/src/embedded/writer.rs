//! The embedded store's single writer: a dedicated thread that drains every
//! queued request into one batch, evaluates the batch on top of the
//! committed state, writes it to disk with one fsync (group commit), then
//! publishes it to readers and watchers and answers the callers. It also
//! expires leases (their deadlines are kept by the [`LeaseClock`], which it
//! sweeps before every batch) and compacts history past the retention.
//!
//! [`LeaseClock`]: super::lease_clock::LeaseClock

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, oneshot};

use super::Shared;
use super::disk::DataFile;
use super::state::{Staged, State};
use super::watchers;
use crate::error::{Result, StoreError};
use crate::types::{LeaseId, Revision, Txn, TxnOutcome};

/// Most requests folded into one batch (one fsync).
const MAX_BATCH: usize = 1024;

/// How often the writer looks for expired leases when otherwise idle.
const LEASE_CHECK_INTERVAL: Duration = Duration::from_millis(100);

pub(super) type Reply<T> = oneshot::Sender<Result<T>>;

/// A request to the writer.
#[derive(Debug)]
pub(super) enum Request {
    Txn(Txn, Reply<TxnOutcome>),
    Grant(i64, Reply<LeaseId>),
    Revoke(LeaseId, Reply<Revision>),
    Compact(Revision, Reply<()>),
}

/// A request with its slot in the bounded queue, freed once it is answered.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) request: Request,
    pub(super) slot: OwnedSemaphorePermit,
}

/// An answer computed during evaluation, sent once the batch is durable.
enum Answer {
    Txn(Reply<TxnOutcome>, Result<TxnOutcome>),
    Lease(Reply<LeaseId>, Result<LeaseId>),
    Revoked(Reply<Revision>, Result<Revision>),
    Compacted(Reply<()>, Result<()>),
}

impl Answer {
    fn send(self) {
        // A caller that stopped waiting has nothing to be told.
        let _ = match self {
            Answer::Txn(reply, result) => reply.send(result).map_err(drop),
            Answer::Lease(reply, result) => reply.send(result).map_err(drop),
            Answer::Revoked(reply, result) => reply.send(result).map_err(drop),
            Answer::Compacted(reply, result) => reply.send(result).map_err(drop),
        };
    }

    fn fail(self, error: &StoreError) {
        let error = error.clone();
        let _ = match self {
            Answer::Txn(reply, _) => reply.send(Err(error)).map_err(drop),
            Answer::Lease(reply, _) => reply.send(Err(error)).map_err(drop),
            Answer::Revoked(reply, _) => reply.send(Err(error)).map_err(drop),
            Answer::Compacted(reply, _) => reply.send(Err(error)).map_err(drop),
        };
    }
}

/// The writer's loop; returns when every request sender is gone or a write
/// fails (then the store refuses everything with that write error).
pub(super) fn run(
    shared: Arc<Shared>,
    file: DataFile,
    requests: Receiver<Queued>,
    retention: usize,
) {
    let writer = Writer {
        shared,
        file,
        retention,
    };
    loop {
        let first = match requests.recv_timeout(LEASE_CHECK_INTERVAL) {
            Ok(request) => Some(request),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let (batch, slots): (Vec<Request>, Vec<OwnedSemaphorePermit>) = first
            .into_iter()
            .chain(std::iter::from_fn(|| requests.try_recv().ok()))
            .take(MAX_BATCH)
            .map(|queued| (queued.request, queued.slot))
            .unzip();
        let committed = writer.commit(batch);
        drop(slots);
        if !committed {
            return;
        }
    }
}

struct Writer {
    shared: Arc<Shared>,
    file: DataFile,
    retention: usize,
}

impl Writer {
    /// Evaluates, persists and publishes one batch (plus lease expiry and
    /// compaction). Returns false after a fatal write error.
    fn commit(&self, batch: Vec<Request>) -> bool {
        let (staged, answers) = {
            let state = self.shared.read_state();
            self.evaluate(&state, batch)
        };
        if staged.is_empty() {
            answers.into_iter().for_each(Answer::send);
            return true;
        }
        if let Err(error) = self.file.write(&staged) {
            tracing::error!(%error, "store write failed; the store is now closed");
            self.shared.fail(&error);
            answers.into_iter().for_each(|answer| answer.fail(&error));
            return false;
        }
        {
            let mut state = self.shared.write_state();
            self.track_leases(&staged);
            let entries = state.apply(staged);
            let mut live = std::mem::take(&mut state.watchers);
            watchers::fan_out(&self.shared, &mut live, &entries);
            state.watchers.append(&mut live);
        }
        answers.into_iter().for_each(Answer::send);
        true
    }

    /// Starts the countdown of leases granted in `staged` and stops that
    /// of leases it revokes, before anyone hears of either.
    fn track_leases(&self, staged: &Staged) {
        let now = Instant::now();
        for (id, lease) in &staged.leases {
            match lease {
                Some(record) => self.shared.leases.start(*id, record.ttl_secs, now),
                None => self.shared.leases.forget(*id),
            }
        }
    }

    fn evaluate(&self, state: &State, batch: Vec<Request>) -> (Staged, Vec<Answer>) {
        let now = cca_model::clock::now_millis();
        let mut staged = Staged::new(state);
        let answers = batch
            .into_iter()
            .map(|request| match request {
                Request::Txn(txn, reply) => {
                    let result = staged.txn(state, &txn);
                    Answer::Txn(reply, result)
                }
                Request::Grant(ttl, reply) => Answer::Lease(reply, Ok(staged.grant(ttl, now))),
                Request::Revoke(id, reply) => {
                    let result = staged.revoke(state, id);
                    Answer::Revoked(reply, result)
                }
                Request::Compact(revision, reply) => {
                    let result = staged.compact(state, revision);
                    Answer::Compacted(reply, result)
                }
            })
            .collect();
        self.expire_leases(state, &mut staged);
        self.compact_past_retention(state, &mut staged);
        (staged, answers)
    }

    /// Revokes every lease past its deadline (a lease this batch already
    /// revoked is simply gone).
    fn expire_leases(&self, state: &State, staged: &mut Staged) {
        let (expired, stall) = self.shared.leases.take_expired(Instant::now());
        if let Some(stall) = stall {
            tracing::warn!(
                stalled_ms = stall.as_millis() as u64,
                "the store did not run for a while; lease deadlines moved by that much"
            );
        }
        for id in expired {
            match staged.revoke(state, id) {
                Ok(_) | Err(StoreError::LeaseNotFound(_)) => {}
                Err(error) => tracing::warn!(lease = id, %error, "expiring lease failed"),
            }
        }
    }

    /// Keeps at most `retention` revisions of history.
    fn compact_past_retention(&self, state: &State, staged: &mut Staged) {
        let retained_from = staged.revision - self.retention as Revision;
        let compacted = staged.compact_to.unwrap_or(state.compact_revision);
        // Compact in steps of a tenth of the retention so that the log is
        // not trimmed (and rewritten) on every single commit.
        let step = (self.retention as Revision / 10).max(1);
        if retained_from >= compacted + step {
            staged.compact_to = Some(retained_from);
        }
    }
}
