//! Compaction on etcd. Our `compact(C)` is etcd's `compact(C)`: etcd then
//! refuses reads and watches below C and still serves C itself, partly
//! (see `watch`). etcd's refusal of an old compaction does not say where
//! history now starts, so that is found by bisection on reads at old
//! revisions.

use etcd_client::GetOptions;

use super::EtcdStore;
use super::client::Resend;
use super::errors::{classify, message, server_said};
use crate::error::{Result, StoreError};
use crate::types::Revision;

/// How etcd answered a compaction.
enum Answer {
    Done,
    AlreadyCompacted,
    Future,
}

impl EtcdStore {
    pub(super) async fn compact_history(&self, revision: Revision) -> Result<()> {
        if revision < 1 {
            // Nothing is older than revision 1; etcd would accept 0.
            return Err(self.already_compacted(revision).await);
        }
        let answer = self
            .members
            .call("compaction", Resend::Always, |member, maybe_compacted| {
                let mut kv = member.kv.clone();
                async move {
                    match kv.compact(revision, None).await {
                        Ok(_) => Ok(Answer::Done),
                        // Our own earlier attempt may have compacted it.
                        Err(err) if server_said(&err, message::COMPACTED) && maybe_compacted => {
                            Ok(Answer::Done)
                        }
                        Err(err) if server_said(&err, message::COMPACTED) => {
                            Ok(Answer::AlreadyCompacted)
                        }
                        Err(err) if server_said(&err, message::FUTURE_REVISION) => {
                            Ok(Answer::Future)
                        }
                        Err(err) => Err(classify(err)),
                    }
                }
            })
            .await?;
        match answer {
            Answer::Done => Ok(()),
            Answer::AlreadyCompacted => Err(self.already_compacted(revision).await),
            Answer::Future => Err(match self.current_revision_read().await {
                Ok(current) => StoreError::FutureRevision {
                    requested: revision,
                    current,
                },
                Err(err) => err,
            }),
        }
    }

    /// The error for a compaction of history that is already gone.
    async fn already_compacted(&self, requested: Revision) -> StoreError {
        match self.compacted_revision(requested).await {
            Ok(compact_revision) => StoreError::Compacted {
                requested,
                compact_revision,
            },
            Err(err) => err,
        }
    }

    /// The revision etcd's history was compacted at, given that
    /// `requested` is at or below it. etcd refuses reads below its
    /// compaction revision and serves the revision itself, so this is the
    /// oldest revision it serves.
    async fn compacted_revision(&self, requested: Revision) -> Result<Revision> {
        let floor = requested.max(1);
        if self.readable_at(floor).await? {
            // Revision 1 served: nothing was compacted (etcd starts at
            // revision 1, with no keys).
            return Ok(if requested < 1 { 0 } else { requested });
        }
        let (mut refused, mut served) = (floor, self.current_revision_read().await?);
        while served - refused > 1 {
            let middle = refused + (served - refused) / 2;
            if self.readable_at(middle).await? {
                served = middle;
            } else {
                refused = middle;
            }
        }
        Ok(served)
    }

    /// Whether etcd still serves reads at `revision`.
    async fn readable_at(&self, revision: Revision) -> Result<bool> {
        let key = self.ns.key("");
        let options = GetOptions::new().with_revision(revision).with_count_only();
        self.members
            .call("read at an old revision", Resend::Always, |member, _| {
                let mut kv = member.kv.clone();
                let (key, options) = (key.clone(), options.clone());
                async move {
                    match kv.get(key, Some(options)).await {
                        Ok(_) => Ok(true),
                        Err(err) if server_said(&err, message::COMPACTED) => Ok(false),
                        Err(err) => Err(classify(err)),
                    }
                }
            })
            .await
    }
}
