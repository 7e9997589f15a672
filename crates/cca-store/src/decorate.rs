//! [`Decorated`]: a [`Store`] that hands every call to the store it wraps
//! once a [`Hook`] has seen it (and may have waited, or refused it). The
//! one place the store's methods are forwarded: a decorator — a store
//! slowed down, one gated by a test, one whose writer "crashes" — says
//! only what it does differently, in `before`.

use std::sync::Arc;
use std::time::Duration;

use crate::{
    KeyValue, LeaseId, RangePage, RangeRequest, Result, Revision, Snapshot, Store, Txn, TxnOutcome,
    WatchStream,
};

/// A call on its way to the wrapped store.
#[derive(Clone, Copy, Debug)]
pub enum Call<'a> {
    Get {
        key: &'a str,
    },
    Range {
        request: &'a RangeRequest,
    },
    Txn {
        txn: &'a Txn,
    },
    Watch {
        prefix: &'a str,
        from_revision: Revision,
    },
    GrantLease {
        ttl: Duration,
    },
    KeepAlive {
        lease: LeaseId,
    },
    RevokeLease {
        lease: LeaseId,
    },
    Compact {
        revision: Revision,
    },
    CurrentRevision,
    Snapshot,
}

impl Call<'_> {
    /// True for the calls that change the store (a commit each).
    pub fn commits(&self) -> bool {
        matches!(
            self,
            Call::Txn { .. }
                | Call::GrantLease { .. }
                | Call::RevokeLease { .. }
                | Call::Compact { .. }
        )
    }
}

/// What a [`Decorated`] store does before passing a call on.
#[async_trait::async_trait]
pub trait Hook: Send + Sync + 'static {
    /// Runs before `call` reaches the wrapped store; an error is the
    /// call's answer and the wrapped store never sees it.
    async fn before(&self, call: Call<'_>) -> Result<()>;

    /// The `max_txn_ops` to report, given the wrapped store's.
    fn max_txn_ops(&self, inner: usize) -> usize {
        inner
    }
}

/// A store whose calls pass `hook` first; see the module documentation.
pub struct Decorated<H> {
    inner: Arc<dyn Store>,
    hook: H,
}

impl<H: std::fmt::Debug> std::fmt::Debug for Decorated<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decorated")
            .field("hook", &self.hook)
            .finish_non_exhaustive()
    }
}

impl<H> Decorated<H> {
    /// `inner`, every call of which passes `hook` first.
    pub fn wrap(inner: Arc<dyn Store>, hook: H) -> Self {
        Self { inner, hook }
    }

    pub fn hook(&self) -> &H {
        &self.hook
    }
}

#[async_trait::async_trait]
impl<H: Hook> Store for Decorated<H> {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        self.hook.before(Call::Get { key }).await?;
        self.inner.get(key).await
    }

    async fn range(&self, request: RangeRequest) -> Result<RangePage> {
        self.hook.before(Call::Range { request: &request }).await?;
        self.inner.range(request).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        self.hook.before(Call::Txn { txn: &txn }).await?;
        self.inner.txn(txn).await
    }

    async fn watch(&self, prefix: &str, from_revision: Revision) -> Result<WatchStream> {
        let call = Call::Watch {
            prefix,
            from_revision,
        };
        self.hook.before(call).await?;
        self.inner.watch(prefix, from_revision).await
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        self.hook.before(Call::GrantLease { ttl }).await?;
        self.inner.grant_lease(ttl).await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration> {
        self.hook.before(Call::KeepAlive { lease }).await?;
        self.inner.keep_alive(lease).await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.hook.before(Call::RevokeLease { lease }).await?;
        self.inner.revoke_lease(lease).await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.hook.before(Call::Compact { revision }).await?;
        self.inner.compact(revision).await
    }

    async fn current_revision(&self) -> Result<Revision> {
        self.hook.before(Call::CurrentRevision).await?;
        self.inner.current_revision().await
    }

    async fn snapshot(&self, page: usize) -> Result<Snapshot> {
        self.hook.before(Call::Snapshot).await?;
        self.inner.snapshot(page).await
    }

    fn max_txn_ops(&self) -> usize {
        self.hook.max_txn_ops(self.inner.max_txn_ops())
    }
}
