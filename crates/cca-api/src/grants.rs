//! The explicit secret grants of every service (`desired/service/{svc}/
//! secret/{name}` with `source: explicit`), kept in memory so the
//! assignment hub can tell an agent which secrets an instance gets without
//! a store read per assignment. The control plane's view does not hold
//! grants; this index follows the cache's change feed instead (the keys of
//! every revision), reading the grant keys that changed and relisting
//! every grant when the feed lags or the cache relists.
//!
//! The index says how far it has got ([`GrantIndex::caught_up`]): the hub
//! follows its own watch of placements, which may run ahead of the cache,
//! and waits for the index to have applied a placement's revision before
//! naming the grants in its assignment — a grant committed with (or just
//! before) a placement is never missing from it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use cca_model::keys;
use cca_model::spec::SecretGrant;
use cca_store::{RangeRequest, Revision, Store};
use tokio::sync::{OnceCell, broadcast, watch};

use crate::state::ApiState;

/// Service → the secrets it is granted explicitly.
#[derive(Debug, Default)]
pub(crate) struct GrantIndex {
    explicit: Mutex<HashMap<String, BTreeSet<String>>>,
    /// Every grant change up to this revision is in `explicit`.
    applied: watch::Sender<Revision>,
    started: OnceCell<()>,
}

impl GrantIndex {
    /// Lists the grants and starts following changes (once per server).
    pub(crate) async fn start(self: &Arc<Self>, api: &ApiState) -> cca_store::Result<()> {
        self.started
            .get_or_try_init(|| async {
                // Subscribe first: a change between the list and the
                // subscription would otherwise be missed.
                let changes = api.cache().subscribe();
                self.relist(api.store()).await?;
                let index = Arc::clone(self);
                let api = api.clone();
                tokio::spawn(async move { index.follow(api, changes).await });
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// Waits until every grant change up to `revision` is applied (at once
    /// when it already is). Never returns while the index is not started.
    pub(crate) async fn caught_up(&self, revision: Revision) {
        if *self.applied.borrow() >= revision {
            return;
        }
        let mut applied = self.applied.subscribe();
        // The sender lives as long as `self`: the wait cannot fail.
        let _ = applied.wait_for(|applied| *applied >= revision).await;
    }

    /// The secrets `service` is granted explicitly, sorted.
    pub(crate) fn explicit(&self, service: &str) -> Vec<String> {
        self.lock()
            .get(service)
            .map(|secrets| secrets.iter().cloned().collect())
            .unwrap_or_default()
    }

    async fn follow(
        &self,
        api: ApiState,
        mut changes: broadcast::Receiver<Arc<cca_control::cache::Change>>,
    ) {
        let mut shutdown = api.shutdown_signal();
        loop {
            let change = tokio::select! {
                change = changes.recv() => change,
                _ = shutdown.wait_for(|stop| *stop) => return,
            };
            let result = match change {
                // An empty key: the cache relisted, anything may have changed.
                Ok(change) if change.keys.iter().any(String::is_empty) => {
                    self.relist(api.store()).await
                }
                Ok(change) => self
                    .update(api.store(), &change.keys)
                    .await
                    .map(|()| self.advance(change.revision)),
                Err(broadcast::error::RecvError::Lagged(_)) => self.relist(api.store()).await,
                Err(broadcast::error::RecvError::Closed) => return,
            };
            if let Err(error) = result {
                tracing::warn!(%error, "reading secret grants failed; relisting");
                while let Err(error) = self.relist(api.store()).await {
                    tracing::warn!(%error, "relisting secret grants failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                        _ = shutdown.wait_for(|stop| *stop) => return,
                    }
                }
            }
        }
    }

    async fn relist(&self, store: &dyn Store) -> cca_store::Result<()> {
        let page = store
            .range(RangeRequest::prefix(keys::DESIRED_SERVICES))
            .await?;
        let mut explicit: HashMap<String, BTreeSet<String>> = HashMap::new();
        for kv in page.kvs {
            if let Some((service, secret)) = grant_key(&kv.key)
                && is_explicit(&kv.value)
            {
                explicit
                    .entry(service.to_owned())
                    .or_default()
                    .insert(secret.to_owned());
            }
        }
        *self.lock() = explicit;
        // Read at `page.revision`: every change up to it is in.
        self.advance(page.revision);
        Ok(())
    }

    fn advance(&self, revision: Revision) {
        self.applied.send_if_modified(|applied| {
            let later = revision > *applied;
            *applied = (*applied).max(revision);
            later
        });
    }

    async fn update(&self, store: &dyn Store, keys: &[String]) -> cca_store::Result<()> {
        for key in keys {
            let Some((service, secret)) = grant_key(key) else {
                continue;
            };
            let explicit = store
                .get(key)
                .await?
                .is_some_and(|kv| is_explicit(&kv.value));
            let mut index = self.lock();
            if explicit {
                index
                    .entry(service.to_owned())
                    .or_default()
                    .insert(secret.to_owned());
            } else if let Some(secrets) = index.get_mut(service) {
                secrets.remove(secret);
                if secrets.is_empty() {
                    index.remove(service);
                }
            }
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, BTreeSet<String>>> {
        // Every update leaves the map consistent: a poisoned lock is usable.
        self.explicit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// `desired/service/{svc}/secret/{name}` → `(svc, name)`.
pub(crate) fn grant_key(key: &str) -> Option<(&str, &str)> {
    let (service, tail) = key.strip_prefix(keys::DESIRED_SERVICES)?.split_once('/')?;
    tail.strip_prefix("secret/")
        .filter(|secret| !secret.is_empty() && !secret.contains('/'))
        .map(|secret| (service, secret))
}

fn is_explicit(value: &[u8]) -> bool {
    matches!(
        serde_json::from_slice::<SecretGrant>(value),
        Ok(SecretGrant::Explicit)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_keys_parse() {
        assert_eq!(
            grant_key("desired/service/web/secret/db"),
            Some(("web", "db"))
        );
        assert_eq!(grant_key("desired/service/web/tag/db"), None);
        assert_eq!(grant_key("desired/service/web"), None);
        assert_eq!(grant_key("desired/secret/db"), None);
        assert!(is_explicit(br#"{"source":"explicit"}"#));
        assert!(!is_explicit(br#"{"source":"connection","connection":"c"}"#));
    }
}
