//! Facts the first server on a store makes and every later one reads: the
//! store's identity (`meta/store`, see [`cca_model::recovery`]) — streams
//! hand it to agents with every snapshot, so a node that followed another
//! store (a new one, or one restored from a backup) resyncs instead of
//! resuming — and the cluster's flow-hash seed (`meta/flow-hash-seed`),
//! which nodes get with the address ranges.

use std::sync::Arc;

use cca_model::clock::now_millis;
use cca_model::keys;
use cca_model::net::FlowHashSeed;
use cca_model::recovery::StoreIdentity;
use cca_store::{Compare, Op, Store, StoreError, Txn};
use serde::Serialize;
use serde::de::DeserializeOwned;

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
    let identity = ensure_once(store, &keys::store_identity(), mint_identity).await?;
    Ok(identity)
}

/// The cluster's flow-hash seed, made now (random) when the store has
/// none; like the identity, every server reads the first one's.
pub async fn ensure_flow_hash_seed(store: &Arc<dyn Store>) -> Result<FlowHashSeed, StoreError> {
    ensure_once(store, &keys::flow_hash_seed(), || {
        let mut random = [0u8; 8];
        aws_lc_rs::rand::fill(&mut random).map_err(|_| {
            StoreError::Backend("the system's random source failed making a flow-hash seed".into())
        })?;
        Ok(FlowHashSeed {
            seed: u64::from_ne_bytes(random),
        })
    })
    .await
}

/// The value at `key`, or `mint`'s, created there if the key is still
/// absent (else the winner's is read).
async fn ensure_once<T: Serialize + DeserializeOwned>(
    store: &Arc<dyn Store>,
    key: &str,
    mint: impl Fn() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    loop {
        if let Some(held) = store.get(key).await? {
            return decode(key, &held.value);
        }
        let value = mint()?;
        let bytes = serde_json::to_vec(&value)
            .map_err(|error| StoreError::Backend(format!("encoding `{key}` failed: {error}")))?;
        let txn = Txn::new()
            .when(Compare::absent(key.to_owned()))
            .then(Op::put(key.to_owned(), bytes));
        if store.txn(txn).await?.is_committed() {
            tracing::info!(key, "made a fact the store had not");
            return Ok(value);
        }
    }
}

fn decode<T: DeserializeOwned>(key: &str, value: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(value).map_err(|error| {
        StoreError::Backend(format!(
            "`{key}` does not hold what it should ({error}); restore the store from a backup"
        ))
    })
}

#[cfg(test)]
mod tests {
    use cca_store::embedded::{Config, EmbeddedStore};

    use super::*;

    #[tokio::test]
    async fn the_first_seed_made_is_the_one_every_server_reads() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store: Arc<dyn Store> = Arc::new(
            EmbeddedStore::open(Config::new(dir.path()))
                .await
                .expect("store opens"),
        );
        let (a, b) = tokio::join!(ensure_flow_hash_seed(&store), ensure_flow_hash_seed(&store));
        let (a, b) = (a.expect("made"), b.expect("read"));
        assert_eq!(a, b, "two servers starting at once agree");
        assert_eq!(ensure_flow_hash_seed(&store).await.expect("read"), a);
        // A value of another shape is an error naming the key.
        store
            .txn(Txn::new().then(Op::put(keys::flow_hash_seed(), b"[]".to_vec())))
            .await
            .expect("written");
        let error = ensure_flow_hash_seed(&store).await.expect_err("refused");
        assert!(error.to_string().contains("meta/flow-hash-seed"), "{error}");
    }
}
