//! The store's identity (`meta/store`, see [`cca_model::recovery`]): the
//! first server on a store makes it, every later one reads it. Streams
//! hand it to agents with every snapshot, so a node that followed another
//! store (a new one, or one restored from a backup) resyncs instead of
//! resuming.

use std::sync::Arc;

use cca_model::clock::now_millis;
use cca_model::keys;
use cca_model::recovery::StoreIdentity;
use cca_store::{Compare, Op, Store, StoreError, Txn};

/// A new identity, from the system's random source.
pub fn mint_identity() -> Result<StoreIdentity, StoreError> {
    let mut random = [0u8; 16];
    aws_lc_rs::rand::fill(&mut random).map_err(|_| {
        StoreError::Backend("the system's random source failed making a store identity".into())
    })?;
    Ok(StoreIdentity::new(random, now_millis()))
}

/// The store's identity, made now when the store has none. Two servers
/// starting at once agree: the second one's create fails its compare and
/// it reads the first one's.
pub async fn ensure_store_identity(store: &Arc<dyn Store>) -> Result<StoreIdentity, StoreError> {
    let key = keys::store_identity();
    loop {
        if let Some(held) = store.get(&key).await? {
            return decode(&key, &held.value);
        }
        let identity = mint_identity()?;
        let value = serde_json::to_vec(&identity).map_err(|error| {
            StoreError::Backend(format!("encoding the store identity failed: {error}"))
        })?;
        let txn = Txn::new()
            .when(Compare::absent(key.clone()))
            .then(Op::put(key.clone(), value));
        if store.txn(txn).await?.is_committed() {
            tracing::info!(store = %identity.id, "made the store's identity");
            return Ok(identity);
        }
    }
}

fn decode(key: &str, value: &[u8]) -> Result<StoreIdentity, StoreError> {
    serde_json::from_slice(value).map_err(|error| {
        StoreError::Backend(format!(
            "`{key}` does not hold a store identity ({error}); restore the store from a backup"
        ))
    })
}
