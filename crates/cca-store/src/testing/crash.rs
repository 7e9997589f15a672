//! [`CrashAfter`]: a store that behaves like the one it wraps until a
//! number of transactions have committed, then fails every call, as the
//! process writing through it would look to the store had it been killed
//! there. Tests of multi-transaction protocols (chunked plans, staged
//! applies) run a writer through it, then a fresh reader over the inner
//! store, for every crash point.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::decorate::{Call, Decorated, Hook};
use crate::{Result, Store, StoreError};

/// See the module documentation.
pub type CrashAfter = Decorated<CrashBudget>;

/// The [`Hook`] of [`CrashAfter`]: the transactions still allowed to
/// commit, and the limit it reports.
#[derive(Debug)]
pub struct CrashBudget {
    /// Transactions still allowed to commit.
    budget: AtomicUsize,
    max_txn_ops: usize,
}

impl Decorated<CrashBudget> {
    /// Lets `commits` transactions through, then fails everything. Reports
    /// `max_txn_ops` as its limit (to force plans into several parts).
    pub fn new(inner: Arc<dyn Store>, commits: usize, max_txn_ops: usize) -> Self {
        let budget = CrashBudget {
            budget: AtomicUsize::new(commits),
            max_txn_ops,
        };
        Decorated::wrap(inner, budget)
    }

    /// True once the budget is spent: the simulated process is dead.
    pub fn crashed(&self) -> bool {
        self.hook().crashed()
    }
}

impl CrashBudget {
    fn crashed(&self) -> bool {
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
impl Hook for CrashBudget {
    /// A transaction spends one of the budget; once it is spent, every
    /// call fails.
    async fn before(&self, call: Call<'_>) -> Result<()> {
        if let Call::Txn { .. } = call {
            let taken = self
                .budget
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                    left.checked_sub(1)
                });
            if taken.is_ok() {
                return Ok(());
            }
        }
        self.alive()
    }

    fn max_txn_ops(&self, _inner: usize) -> usize {
        self.max_txn_ops
    }
}
