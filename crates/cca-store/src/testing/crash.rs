//! [`CrashAfter`]: a store that behaves like the one it wraps until a
//! number of transactions have committed, then fails every call, as the
//! process writing through it would look to the store had it been killed
//! there. Tests of multi-transaction protocols (chunked plans, staged
//! applies) run a writer through it, then a fresh reader over the inner
//! store, for every crash point.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::{
    KeyValue, LeaseId, RangePage, RangeRequest, Result, Revision, Store, StoreError, Txn,
    TxnOutcome, WatchStream,
};

/// See the module documentation.
pub struct CrashAfter {
    inner: Arc<dyn Store>,
    /// Transactions still allowed to commit.
    budget: AtomicUsize,
    max_txn_ops: usize,
}

impl std::fmt::Debug for CrashAfter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrashAfter")
            .field("budget", &self.budget)
            .field("max_txn_ops", &self.max_txn_ops)
            .finish_non_exhaustive()
    }
}

impl CrashAfter {
    /// Lets `commits` transactions through, then fails everything. Reports
    /// `max_txn_ops` as its limit (to force plans into several parts).
    pub fn new(inner: Arc<dyn Store>, commits: usize, max_txn_ops: usize) -> Self {
        Self {
            inner,
            budget: AtomicUsize::new(commits),
            max_txn_ops,
        }
    }

    /// True once the budget is spent: the simulated process is dead.
    pub fn crashed(&self) -> bool {
        self.budget.load(Ordering::SeqCst) == 0
    }

    fn alive(&self) -> Result<()> {
        if self.crashed() {
            Err(StoreError::Unavailable {
                reason: "the writer crashed (simulated)".into(),
            })
        } else {
            Ok(())
        }
    }
}

#[async_trait::async_trait]
impl Store for CrashAfter {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        self.alive()?;
        self.inner.get(key).await
    }

    async fn range(&self, request: RangeRequest) -> Result<RangePage> {
        self.alive()?;
        self.inner.range(request).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        let taken = self
            .budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            });
        if taken.is_err() {
            self.alive()?;
        }
        self.inner.txn(txn).await
    }

    async fn watch(&self, prefix: &str, from_revision: Revision) -> Result<WatchStream> {
        self.alive()?;
        self.inner.watch(prefix, from_revision).await
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        self.alive()?;
        self.inner.grant_lease(ttl).await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration> {
        self.alive()?;
        self.inner.keep_alive(lease).await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.alive()?;
        self.inner.revoke_lease(lease).await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.alive()?;
        self.inner.compact(revision).await
    }

    async fn current_revision(&self) -> Result<Revision> {
        self.alive()?;
        self.inner.current_revision().await
    }

    fn max_txn_ops(&self) -> usize {
        self.max_txn_ops
    }
}
