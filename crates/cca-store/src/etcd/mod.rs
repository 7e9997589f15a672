//! The etcd backend, for highly available control planes: [`EtcdStore`]
//! implements [`Store`] on an etcd 3.4+ cluster over its v3 gRPC API. All
//! of CCattler's keys live under a namespace prefix (`cca/` by default) so
//! an etcd can be shared. This is the only module that knows etcd.
//!
//! With [`Config::tls`] it talks TLS (etcd's `--cert-file`, and with
//! `--client-cert-auth` a client certificate), through etcd-client's
//! rustls on aws-lc-rs.
//!
//! Submodules: `client` (members, failover, retries), `errors` (what each
//! etcd failure means for the caller), `keys` (the namespace), `txn`
//! (transactions in etcd's terms), `watch` (resumable watches), `lease`,
//! `renewals` (keep-alives on reused streams), `pacing` (transactions in
//! flight paced to what etcd applies) and `compaction`.
//!
//! etcd behaviour worth knowing (measured on etcd 3.4):
//! - A transaction that changes nothing (no ops, deletes of absent keys, a
//!   failed compare) leaves the revision alone and reports the current one.
//! - A transaction whose connection broke, or that got no answer, may still
//!   be applied — a frozen member applies it once thawed. Such failures are
//!   [`StoreError::OutcomeUnknown`] and are never resent.
//! - etcd takes at most 128 ops (or compares) per transaction
//!   (`--max-txn-ops`) and 1.5 MiB per request (`--max-request-bytes`);
//!   beyond that it refuses with [`StoreError::InvalidRequest`].
//! - Leases: etcd raises TTLs to its minimum (1.5 × election timeout,
//!   rounded up to seconds: 2 s by default) and notices expiry up to about
//!   half a second late, in one revision that deletes all the lease's keys.

mod client;
mod compaction;
mod errors;
mod keys;
mod lease;
mod pacing;
mod renewals;
mod txn;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use etcd_client::GetOptions;

use crate::error::{Result, StoreError};
use crate::types::{
    KeyValue, LeaseId, RangePage, RangeRequest, Revision, SNAPSHOT_PAGES_AHEAD, Snapshot, Txn,
    TxnOutcome,
};
use crate::{Store, WatchStream, lease_ttl_secs, validate};
use client::{Members, Resend};
use errors::classify;
use keys::Namespace;
use txn::EtcdRequest;

/// How to reach etcd and how hard to try.
#[derive(Clone, Debug)]
pub struct Config {
    /// Client URLs of the members, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Prefix of every key CCattler stores, so that it can share an etcd
    /// with other programs; stripped from keys read back.
    pub namespace: String,
    /// How long to wait for a TCP connection to a member.
    pub connect_timeout: Duration,
    /// How long to wait for an answer to one attempt of a request. A
    /// transaction that gets no answer in time has an unknown outcome.
    pub request_timeout: Duration,
    /// Attempts per request before giving up with
    /// [`StoreError::Unavailable`]; at least 1.
    pub retry_attempts: u32,
    /// Backoff before the first retry; doubles with every retry.
    pub retry_base_delay: Duration,
    /// Longest backoff between two attempts.
    pub retry_max_delay: Duration,
    /// Largest response accepted (big ranges, watch catch-up batches).
    pub max_response_bytes: usize,
    /// Most operations (and most compares) etcd accepts in one transaction:
    /// its `--max-txn-ops`, 128 unless the cluster was started otherwise.
    pub max_txn_ops: usize,
    /// TLS to the members (`https://` endpoints); `None` for plain HTTP.
    pub tls: Option<Tls>,
}

/// How to talk TLS to etcd: the CA its members' certificates chain to
/// (trusted instead of the system's roots), and the client certificate
/// to present when etcd runs with `--client-cert-auth`.
#[derive(Clone)]
pub struct Tls {
    pub ca_pem: String,
    pub client: Option<ClientIdentity>,
}

/// A client certificate and its key, in PEM.
#[derive(Clone)]
pub struct ClientIdentity {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("client_certificate", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientIdentity { .. }")
    }
}

impl Tls {
    /// Reads the PEM files `--etcd-cacert`, `--etcd-cert` and `--etcd-key`
    /// name (the last two together or not at all).
    pub fn from_files(
        ca: &std::path::Path,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> Result<Self> {
        let read = |path: &std::path::Path, what: &str| {
            std::fs::read_to_string(path).map_err(|error| {
                StoreError::InvalidRequest(format!(
                    "cannot read the etcd {what} {}: {error}",
                    path.display()
                ))
            })
        };
        let client = match (cert, key) {
            (Some(cert), Some(key)) => Some(ClientIdentity {
                cert_pem: read(cert, "client certificate")?,
                key_pem: read(key, "client key")?,
            }),
            (None, None) => None,
            _ => {
                return Err(StoreError::InvalidRequest(
                    "an etcd client certificate needs its key, and a key its certificate: \
                     pass both --etcd-cert and --etcd-key"
                        .into(),
                ));
            }
        };
        Ok(Self {
            ca_pem: read(ca, "CA certificate")?,
            client,
        })
    }
}

impl Config {
    /// Defaults: namespace `cca/`, 5 attempts over about 1.5 s of backoff.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            namespace: "cca/".into(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            retry_attempts: 5,
            retry_base_delay: Duration::from_millis(100),
            retry_max_delay: Duration::from_secs(1),
            max_response_bytes: 512 * 1024 * 1024,
            max_txn_ops: 128,
            tls: None,
        }
    }
}

/// Reads and transactions in flight to etcd at most. Past what etcd
/// applies, more in flight only makes every request later — until
/// deadlines cancel them, and the cancelled streams' resets made h2 close
/// the connection under a 5,000-node deploy. Callers past the bound wait
/// for a slot in their own futures (bounded by the API's admission and
/// the runner). Lease calls and watches take no slot.
pub const MAX_KV_IN_FLIGHT: usize = 128;

/// A [`Store`] on an etcd cluster. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct EtcdStore {
    members: Arc<Members>,
    ns: Namespace,
    max_txn_ops: usize,
    kv_slots: tokio::sync::Semaphore,
    /// Transactions in flight, paced to what etcd applies.
    writes: pacing::WriteWindow,
}

impl EtcdStore {
    /// Connects and checks that etcd answers; fails with
    /// [`StoreError::Unavailable`] naming the endpoints when no member does.
    pub async fn connect(config: Config) -> Result<EtcdStore> {
        let store = EtcdStore {
            members: Arc::new(Members::connect(&config).await?),
            ns: Namespace::new(config.namespace),
            max_txn_ops: config.max_txn_ops.max(1),
            kv_slots: tokio::sync::Semaphore::new(MAX_KV_IN_FLIGHT),
            writes: pacing::WriteWindow::new(MAX_KV_IN_FLIGHT),
        };
        store.current_revision_read().await?;
        Ok(store)
    }

    /// The current revision: a single-key read is the cheapest request
    /// that carries it, and the namespace key itself is as good as any.
    async fn current_revision_read(&self) -> Result<Revision> {
        let read = self
            .read("current revision", self.ns.key(""), None, 1)
            .await?;
        Ok(read.revision)
    }

    /// Reads keys `[start, end)` (just `start` without an end), at most
    /// `limit` of them (0: all), in key order.
    async fn read(
        &self,
        what: &str,
        start: Vec<u8>,
        end: Option<Vec<u8>>,
        limit: usize,
    ) -> Result<RangeRead> {
        let _slot = self.kv_slot().await?;
        read_at(&self.members, &self.ns, what, (start, end), limit, None).await
    }
}

/// Reads keys `[start, end)` (just `start` without an end), at most `limit`
/// of them (0: all), in key order, as of revision `at` (`None`: now).
async fn read_at(
    members: &Members,
    ns: &Namespace,
    what: &str,
    (start, end): (Vec<u8>, Option<Vec<u8>>),
    limit: usize,
    at: Option<Revision>,
) -> Result<RangeRead> {
    let mut options = GetOptions::new().with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
    if let Some(end) = end {
        options = options.with_range(end);
    }
    if let Some(at) = at {
        options = options.with_revision(at);
    }
    let response = members
        .call(what, Resend::Always, |member, _| {
            let mut kv = member.kv.clone();
            let (start, options) = (start.clone(), options.clone());
            async move { kv.get(start, Some(options)).await.map_err(classify) }
        })
        .await?;
    let kvs = response
        .kvs()
        .iter()
        .map(|kv| ns.key_value(kv))
        .collect::<Result<Vec<_>>>()?;
    Ok(RangeRead {
        kvs,
        revision: header_revision(response.header())?,
        more: response.more(),
        count: response.count(),
    })
}

/// Sends every key of the namespace as of `revision` into `pages`, a page
/// of `page` keys at a time, one read in flight.
async fn snapshot_pages(
    members: Arc<Members>,
    ns: Namespace,
    revision: Revision,
    page: usize,
    pages: tokio::sync::mpsc::Sender<Result<Vec<KeyValue>>>,
) {
    let (mut start, end) = ns.prefix_range("");
    loop {
        let range = (start.clone(), Some(end.clone()));
        let read = read_at(&members, &ns, "snapshot", range, page, Some(revision)).await;
        let read = match read {
            Ok(read) => read,
            Err(error) => {
                let _ = pages.send(Err(error)).await;
                return;
            }
        };
        let next = read.kvs.last().map(|last| ns.key_after(&last.key));
        if pages.send(Ok(read.kvs)).await.is_err() {
            return;
        }
        match (read.more, next) {
            (true, Some(next)) => start = next,
            _ => return,
        }
    }
}

impl EtcdStore {
    /// A slot among the [`MAX_KV_IN_FLIGHT`] reads and transactions.
    async fn kv_slot(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        self.kv_slots
            .acquire()
            .await
            .map_err(|_| StoreError::Closed)
    }
}

/// One page of keys as etcd returned it.
struct RangeRead {
    kvs: Vec<KeyValue>,
    revision: Revision,
    more: bool,
    /// Keys in the whole range, not only this page.
    count: i64,
}

fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> Result<Revision> {
    header
        .map(etcd_client::ResponseHeader::revision)
        .ok_or_else(|| StoreError::Backend("etcd response has no header".into()))
}

#[async_trait::async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        validate::key(key)?;
        let read = self.read("get", self.ns.key(key), None, 1).await?;
        Ok(read.kvs.into_iter().next())
    }

    async fn range(&self, request: RangeRequest) -> Result<RangePage> {
        let (mut start, end) = self.ns.prefix_range(&request.prefix);
        if let Some(after) = &request.after {
            start = start.max(self.ns.key_after(after));
        }
        let read = self.read("range", start, Some(end), request.limit).await?;
        let continuation = match (read.more, read.kvs.last()) {
            (true, Some(last)) => Some(last.key.clone()),
            _ => None,
        };
        Ok(RangePage {
            kvs: read.kvs,
            revision: read.revision,
            continuation,
        })
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        validate::txn(&txn)?;
        self.apply(EtcdRequest::new(&self.ns, &txn)).await
    }

    async fn watch(&self, prefix: &str, from_revision: Revision) -> Result<WatchStream> {
        if from_revision < 0 {
            return Err(StoreError::InvalidRequest(format!(
                "watch from revision {from_revision}: revisions start at 1 (0 means from now)"
            )));
        }
        let from = match from_revision {
            0 => self.current_revision().await? + 1,
            from => from,
        };
        watch::start(Arc::clone(&self.members), self.ns.clone(), prefix, from).await
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        self.grant(lease_ttl_secs(ttl)?).await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration> {
        self.renew(lease).await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.revoke(lease).await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.compact_history(revision).await
    }

    async fn current_revision(&self) -> Result<Revision> {
        self.current_revision_read().await
    }

    async fn snapshot(&self, page: usize) -> Result<Snapshot> {
        // The first read fixes the revision and counts the keys; every page
        // after it reads at that revision (a compaction past it meanwhile
        // fails the snapshot, which is then taken again).
        let (start, end) = self.ns.prefix_range("");
        let first = {
            let _slot = self.kv_slot().await?;
            read_at(
                &self.members,
                &self.ns,
                "snapshot",
                (start, Some(end)),
                1,
                None,
            )
            .await?
        };
        let (sender, pages) = tokio::sync::mpsc::channel(SNAPSHOT_PAGES_AHEAD);
        tokio::spawn(snapshot_pages(
            Arc::clone(&self.members),
            self.ns.clone(),
            first.revision,
            page.max(1),
            sender,
        ));
        Ok(Snapshot {
            revision: first.revision,
            count: u64::try_from(first.count).unwrap_or(0),
            pages,
        })
    }

    fn max_txn_ops(&self) -> usize {
        self.max_txn_ops
    }
}
