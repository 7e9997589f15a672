//! Writes a backup's keys into an empty store. The embedded store gets a
//! new data file in one transaction, at the backup's revision plus a bump
//! and with its history marked compacted there, so nothing that watched
//! the old store can resume into the new one as if it were the same. An
//! etcd cluster gets the keys in transactions of its size, after a check
//! that it is empty (etcd numbers the writes itself: its revisions start
//! over, and the new store identity is what tells watchers apart).

use std::path::PathBuf;
use std::sync::Arc;

use super::payload::Payload;
use crate::Store;
use crate::embedded::EmbeddedStore;
use crate::error::{Result, StoreError};
use crate::types::{KeyValue, Op, RangeRequest, Revision, Txn};

/// Where a restore writes.
pub enum RestoreTarget {
    /// A directory without a store in it.
    Embedded(PathBuf),
    /// An empty store (etcd, or any backend): written through its API.
    Store(Arc<dyn Store>),
}

impl std::fmt::Debug for RestoreTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreTarget::Embedded(dir) => write!(f, "Embedded({})", dir.display()),
            RestoreTarget::Store(_) => f.write_str("Store(..)"),
        }
    }
}

/// What a restore wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restored {
    /// The restored store's revision.
    pub revision: Revision,
    pub keys: usize,
    /// Keys a lease held in the backed-up store, not restored.
    pub leased: usize,
}

/// Restores `payload`'s keys, with `replace` put over them (the store's new
/// identity), into `target`; the embedded store's revision is the backup's
/// plus `bump`. `progress` is told how many keys are written so far.
pub async fn restore(
    payload: &Payload,
    replace: Vec<(String, Vec<u8>)>,
    target: RestoreTarget,
    bump: Revision,
    progress: impl Fn(usize) + Send + Sync,
) -> Result<Restored> {
    let revision = payload.revision.saturating_add(bump.max(1));
    let leased = payload.keys.iter().filter(|kv| kv.lease.is_some()).count();
    let mut keys: Vec<KeyValue> = payload
        .keys
        .iter()
        .filter(|kv| kv.lease.is_none())
        .cloned()
        .collect();
    for (key, value) in replace {
        let kv = KeyValue {
            key: key.clone(),
            value,
            create_revision: revision,
            mod_revision: revision,
            version: 1,
            lease: None,
        };
        match keys.binary_search_by(|held| held.key.as_str().cmp(key.as_str())) {
            Ok(at) => keys[at] = kv,
            Err(at) => keys.insert(at, kv),
        }
    }
    let count = keys.len();
    let revision = match target {
        RestoreTarget::Embedded(dir) => {
            tokio::task::spawn_blocking(move || EmbeddedStore::seed(&dir, revision, &keys))
                .await
                .map_err(|error| StoreError::Backend(format!("the restore stopped: {error}")))??;
            progress(count);
            revision
        }
        RestoreTarget::Store(store) => write_through(store.as_ref(), &keys, &progress).await?,
    };
    Ok(Restored {
        revision,
        keys: count,
        leased,
    })
}

/// Writes `keys` into the empty `store` in transactions of its size.
async fn write_through(
    store: &dyn Store,
    keys: &[KeyValue],
    progress: &(impl Fn(usize) + Send + Sync),
) -> Result<Revision> {
    let held = store.range(RangeRequest::prefix("").limit(1)).await?;
    if let Some(first) = held.kvs.first() {
        return Err(StoreError::InvalidRequest(format!(
            "the target store is not empty (it holds `{}`): restore into an empty store, with no server running on it",
            first.key
        )));
    }
    let mut written = 0;
    for chunk in keys.chunks(store.max_txn_ops().max(1)) {
        let txn = chunk.iter().fold(Txn::new(), |txn, kv| {
            txn.then(Op::put(kv.key.clone(), kv.value.clone()))
        });
        store.txn(txn).await?;
        written += chunk.len();
        progress(written);
    }
    store.current_revision().await
}
