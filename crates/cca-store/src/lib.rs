//! The fact store: one async [`Store`] trait over an ordered key-value space
//! with revisions, compare-and-swap transactions, resumable watches and
//! leases (etcd's model), and two backends — [`embedded`] (the default: an
//! in-memory map made durable in one file) and [`etcd`] (for HA). Only this
//! crate knows how facts are persisted; only its `etcd` module knows etcd.
//! [`backup`] writes a store to one sealed file and restores it into any
//! backend.

pub mod backup;
pub mod decorate;
pub mod embedded;
pub mod error;
pub mod etcd;
#[cfg(feature = "testing")]
pub mod testing;
pub mod types;
mod validate;
mod watch;

use std::sync::Arc;
use std::time::Duration;

pub use error::{Result, StoreError};
pub use types::*;
pub use watch::WatchStream;

/// An ordered key-value store with revisions, transactions, watches and
/// leases. All methods are cancel-safe for the caller: dropping a future
/// either leaves the write applied in full or not at all.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// The current value of `key`.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>>;

    /// Keys under a prefix, in byte order, paged.
    async fn range(&self, request: RangeRequest) -> Result<RangePage>;

    /// Applies `txn.ops` atomically if every compare holds.
    async fn txn(&self, txn: Txn) -> Result<TxnOutcome>;

    /// Changes under `prefix` from `from_revision` on (inclusive), in order.
    /// `0` means "changes after now". History older than the compaction
    /// point yields a single [`WatchMessage::Compacted`].
    async fn watch(&self, prefix: &str, from_revision: Revision) -> Result<WatchStream>;

    /// Grants a lease; keys attached to it vanish when it is not kept alive
    /// for `ttl` (rounded up to whole seconds, at least one).
    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId>;

    /// Restarts the lease's TTL; returns the TTL granted.
    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration>;

    /// Ends the lease now, deleting its keys.
    async fn revoke_lease(&self, lease: LeaseId) -> Result<()>;

    /// Discards history up to and including `revision`.
    async fn compact(&self, revision: Revision) -> Result<()>;

    /// The store's current revision.
    async fn current_revision(&self) -> Result<Revision>;

    /// Every key of the store at one revision, in key order, in pages of at
    /// most `page` keys, while writes go on (a backup). The pages come
    /// through the returned [`Snapshot`]; an error ends them.
    async fn snapshot(&self, page: usize) -> Result<Snapshot>;

    /// Most ops (and most compares) one transaction may carry; callers that
    /// can split their work split it into transactions of this size.
    fn max_txn_ops(&self) -> usize;
}

/// Which backend to open, parsed from a store URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// `embedded:DIR` — the durable embedded store with its file in DIR.
    Embedded(std::path::PathBuf),
    /// `etcd://host:port[,host:port...]` — an etcd cluster.
    Etcd(Vec<String>),
}

/// The URL it was parsed from (`embedded:DIR`, `etcd://host:port,…`).
impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Embedded(dir) => write!(f, "embedded:{}", dir.display()),
            StoreUrl::Etcd(endpoints) => {
                let hosts: Vec<&str> = endpoints
                    .iter()
                    .map(|endpoint| endpoint.trim_start_matches("http://"))
                    .collect();
                write!(f, "etcd://{}", hosts.join(","))
            }
        }
    }
}

impl std::str::FromStr for StoreUrl {
    type Err = StoreError;

    fn from_str(url: &str) -> Result<Self> {
        if let Some(dir) = url.strip_prefix("embedded:") {
            if dir.is_empty() {
                return Err(StoreError::InvalidUrl(
                    "`embedded:` needs a directory, e.g. `embedded:./data`".into(),
                ));
            }
            return Ok(StoreUrl::Embedded(dir.into()));
        }
        if let Some(hosts) = url.strip_prefix("etcd://") {
            let endpoints: Vec<String> = hosts
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(|h| format!("http://{h}"))
                .collect();
            if endpoints.is_empty() {
                return Err(StoreError::InvalidUrl(
                    "`etcd://` needs at least one host:port".into(),
                ));
            }
            return Ok(StoreUrl::Etcd(endpoints));
        }
        Err(StoreError::InvalidUrl(format!(
            "`{url}`: expected `embedded:DIR` or `etcd://host:port[,host:port...]`"
        )))
    }
}

/// Opens the store a URL names.
pub async fn open(url: &StoreUrl) -> Result<Arc<dyn Store>> {
    open_with(url, None).await
}

/// [`open`], talking TLS to etcd with `etcd_tls` (refused for an embedded
/// store, which has no connection to secure).
pub async fn open_with(url: &StoreUrl, etcd_tls: Option<etcd::Tls>) -> Result<Arc<dyn Store>> {
    match url {
        StoreUrl::Embedded(_) if etcd_tls.is_some() => Err(StoreError::InvalidRequest(
            "etcd TLS settings were given for an embedded store: they apply to `etcd://` stores only"
                .into(),
        )),
        StoreUrl::Embedded(dir) => Ok(Arc::new(
            embedded::EmbeddedStore::open(embedded::Config::new(dir)).await?,
        )),
        StoreUrl::Etcd(endpoints) => {
            let mut config = etcd::Config::new(endpoints.clone());
            config.tls = etcd_tls;
            Ok(Arc::new(etcd::EtcdStore::connect(config).await?))
        }
    }
}

/// Rounds a lease TTL up to whole seconds (at least one), as etcd does.
pub fn lease_ttl_secs(ttl: Duration) -> Result<i64> {
    if ttl > MAX_LEASE_TTL {
        return Err(StoreError::InvalidRequest(format!(
            "lease TTL {ttl:?} exceeds the maximum of {MAX_LEASE_TTL:?}"
        )));
    }
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    Ok(i64::try_from(secs.max(1)).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_parse_or_say_what_is_expected() {
        assert_eq!(
            "embedded:/var/lib/cca".parse::<StoreUrl>().ok(),
            Some(StoreUrl::Embedded("/var/lib/cca".into()))
        );
        assert_eq!(
            "etcd://a:2379,b:2379".parse::<StoreUrl>().ok(),
            Some(StoreUrl::Etcd(vec![
                "http://a:2379".into(),
                "http://b:2379".into()
            ]))
        );
        for url in ["embedded:/var/lib/cca", "etcd://a:2379,b:2379"] {
            let parsed: StoreUrl = url.parse().expect("parses");
            assert_eq!(parsed.to_string(), url, "shown as written");
        }
        let err = "redis://x".parse::<StoreUrl>().expect_err("unknown scheme");
        assert!(err.to_string().contains("expected `embedded:DIR`"), "{err}");
        assert!("etcd://".parse::<StoreUrl>().is_err());
        assert!("embedded:".parse::<StoreUrl>().is_err());
    }

    #[test]
    fn lease_ttls_round_up_to_seconds() {
        assert_eq!(lease_ttl_secs(Duration::from_millis(1)).ok(), Some(1));
        assert_eq!(lease_ttl_secs(Duration::from_millis(1500)).ok(), Some(2));
        assert_eq!(lease_ttl_secs(Duration::from_secs(15)).ok(), Some(15));
        assert!(lease_ttl_secs(Duration::from_secs(400 * 24 * 3600)).is_err());
    }
}
