//! [`SlowStore`]: a [`Store`] decorator that delays every operation by a
//! fixed latency before passing it on — a store on a slow disk or across
//! a WAN, for the `store-latency` scenario and resilience tests. A watch
//! pays the latency once when it opens, not per event: events travel on an
//! open stream.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use cca_store::{
    KeyValue, LeaseId, RangePage, RangeRequest, Result, Revision, Store, Txn, TxnOutcome,
    WatchStream,
};

/// Wraps a store, sleeping `latency` before each operation.
#[derive(Clone)]
pub struct SlowStore {
    inner: Arc<dyn Store>,
    latency: Duration,
}

impl std::fmt::Debug for SlowStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlowStore")
            .field("latency", &self.latency)
            .finish_non_exhaustive()
    }
}

impl SlowStore {
    pub fn new(inner: Arc<dyn Store>, latency: Duration) -> Self {
        Self { inner, latency }
    }

    async fn delay(&self) {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
    }
}

#[async_trait]
impl Store for SlowStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        self.delay().await;
        self.inner.get(key).await
    }

    async fn range(&self, request: RangeRequest) -> Result<RangePage> {
        self.delay().await;
        self.inner.range(request).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        self.delay().await;
        self.inner.txn(txn).await
    }

    async fn watch(&self, prefix: &str, from_revision: Revision) -> Result<WatchStream> {
        self.delay().await;
        self.inner.watch(prefix, from_revision).await
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        self.delay().await;
        self.inner.grant_lease(ttl).await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration> {
        self.delay().await;
        self.inner.keep_alive(lease).await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.delay().await;
        self.inner.revoke_lease(lease).await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.delay().await;
        self.inner.compact(revision).await
    }

    async fn current_revision(&self) -> Result<Revision> {
        self.delay().await;
        self.inner.current_revision().await
    }

    fn max_txn_ops(&self) -> usize {
        self.inner.max_txn_ops()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cca_store::Op;
    use cca_store::embedded::{Config, EmbeddedStore};

    #[tokio::test]
    async fn every_operation_waits_the_latency_then_passes_through() {
        let dir = tempfile::tempdir().expect("tempdir");
        let inner = EmbeddedStore::open(Config::new(dir.path()))
            .await
            .expect("open");
        let slow = SlowStore::new(Arc::new(inner), Duration::from_millis(30));
        let begun = std::time::Instant::now();
        let put = Txn::new().then(Op::put("desired/x", b"1".to_vec()));
        assert!(slow.txn(put).await.expect("txn").is_committed());
        let read = slow.get("desired/x").await.expect("get").expect("present");
        assert_eq!(read.value, b"1");
        assert!(begun.elapsed() >= Duration::from_millis(60));
    }
}
