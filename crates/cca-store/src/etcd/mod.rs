//! The etcd backend, for highly available control planes: [`EtcdStore`]
//! implements [`Store`] on an etcd 3.4+ cluster over its v3 gRPC API. All
//! of CCattler's keys live under a namespace prefix (`cca/` by default) so
//! an etcd can be shared. This is the only module that knows etcd.
//!
//! Submodules: `client` (members, failover, retries), `errors` (what each
//! etcd failure means for the caller), `keys` (the namespace), `txn`
//! (transactions in etcd's terms) and `watch` (resumable watches).

mod client;
mod errors;
mod keys;
mod txn;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use etcd_client::GetOptions;

use crate::error::{Result, StoreError};
use crate::types::{KeyValue, LeaseId, RangePage, RangeRequest, Revision, Txn, TxnOutcome};
use crate::{Store, WatchStream, lease_ttl_secs, validate};
use client::{Members, Resend};
use errors::{Failure, classify, message, server_said};
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
        }
    }
}

/// A [`Store`] on an etcd cluster. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct EtcdStore {
    members: Arc<Members>,
    ns: Namespace,
}

impl EtcdStore {
    /// Connects and checks that etcd answers; fails with
    /// [`StoreError::Unavailable`] naming the endpoints when no member does.
    pub async fn connect(config: Config) -> Result<EtcdStore> {
        let store = EtcdStore {
            members: Arc::new(Members::connect(&config).await?),
            ns: Namespace::new(config.namespace),
        };
        store.current_revision().await?;
        Ok(store)
    }

    /// Reads keys `[start, end)`, at most `limit` (0: all), in key order.
    async fn read(&self, start: Vec<u8>, end: Option<Vec<u8>>, limit: usize) -> Result<RangeRead> {
        let mut options = GetOptions::new().with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        if let Some(end) = end {
            options = options.with_range(end);
        }
        let response = self
            .members
            .call("read", Resend::Always, |member, _| {
                let mut kv = member.kv.clone();
                let (start, options) = (start.clone(), options.clone());
                async move { kv.get(start, Some(options)).await.map_err(classify) }
            })
            .await?;
        let kvs = response
            .kvs()
            .iter()
            .map(|kv| self.ns.key_value(kv))
            .collect::<Result<Vec<_>>>()?;
        Ok(RangeRead {
            kvs,
            revision: header_revision(response.header())?,
            more: response.more(),
        })
    }

    /// The revision etcd's history was compacted at, for a compaction of
    /// `requested` that etcd refused as already compacted (so the answer
    /// is at least `requested`), or for one below revision 1. etcd refuses
    /// reads below its compaction revision and serves the revision itself,
    /// so the answer is the oldest revision it serves: found by bisection.
    async fn compacted_revision(&self, requested: Revision) -> Result<Revision> {
        let floor = requested.max(1);
        if self.readable_at(floor).await? {
            // Serving revision 1 means nothing of note was compacted: etcd
            // starts at revision 1 with no keys.
            return Ok(if requested < 1 { 0 } else { requested });
        }
        let (mut refused, mut served) = (floor, self.current_revision().await?);
        while served - refused > 1 {
            let middle = refused + (served - refused) / 2;
            if self.readable_at(middle).await? {
                served = middle;
            } else {
                refused = middle;
            }
        }
        Ok(served)
    }

    /// Whether etcd still serves reads at `revision`.
    async fn readable_at(&self, revision: Revision) -> Result<bool> {
        let key = self.ns.key("");
        let options = GetOptions::new().with_revision(revision).with_count_only();
        self.members
            .call("read at a revision", Resend::Always, |member, _| {
                let mut kv = member.kv.clone();
                let (key, options) = (key.clone(), options.clone());
                async move {
                    match kv.get(key, Some(options)).await {
                        Ok(_) => Ok(true),
                        Err(err) if server_said(&err, message::COMPACTED) => Ok(false),
                        Err(err) => Err(classify(err)),
                    }
                }
            })
            .await
    }

    /// Which of `leases` etcd does not know, for a put that it refused for
    /// naming an unknown lease.
    async fn missing_lease(&self, leases: impl IntoIterator<Item = LeaseId>) -> Result<LeaseId> {
        let mut first = None;
        for lease in leases {
            first.get_or_insert(lease);
            let ttl = self
                .members
                .call("lease lookup", Resend::Always, |member, _| {
                    let mut client = member.lease.clone();
                    async move { client.time_to_live(lease, None).await.map_err(classify) }
                })
                .await?
                .ttl();
            if ttl < 0 {
                return Ok(lease);
            }
        }
        // It expired between the refusal and the lookup.
        first.ok_or_else(|| {
            StoreError::Backend("etcd reported an unknown lease in a txn without leases".into())
        })
    }
}

/// One page of keys as etcd returned it.
struct RangeRead {
    kvs: Vec<KeyValue>,
    revision: Revision,
    more: bool,
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
        let read = self.read(self.ns.key(key), None, 1).await?;
        Ok(read.kvs.into_iter().next())
    }

    async fn range(&self, request: RangeRequest) -> Result<RangePage> {
        let (mut start, end) = self.ns.prefix_range(&request.prefix);
        if let Some(after) = &request.after {
            start = start.max(self.ns.key_after(after));
        }
        let read = self.read(start, Some(end), request.limit).await?;
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
        let request = EtcdRequest::new(&self.ns, &txn);
        let answer = self
            .members
            .call("transaction", Resend::OnlyIfNotApplied, |member, _| {
                let mut kv = member.kv.clone();
                let etcd_txn = request.request.clone();
                async move {
                    match kv.txn(etcd_txn).await {
                        Ok(response) => Ok(Ok(response)),
                        Err(err) if server_said(&err, message::LEASE_NOT_FOUND) => Ok(Err(())),
                        Err(err) => Err(classify(err)),
                    }
                }
            })
            .await?;
        match answer {
            Ok(response) => request.outcome(&self.ns, &response),
            Err(()) => Err(StoreError::LeaseNotFound(
                self.missing_lease(EtcdRequest::leases(&txn)).await?,
            )),
        }
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
        let ttl = lease_ttl_secs(ttl)?;
        // Granting twice after a lost answer leaks one lease, which expires
        // on its own.
        let response = self
            .members
            .call("lease grant", Resend::Always, |member, _| {
                let mut client = member.lease.clone();
                async move { client.grant(ttl, None).await.map_err(classify) }
            })
            .await?;
        if !response.error().is_empty() {
            return Err(StoreError::Backend(format!(
                "etcd refused a lease: {}",
                response.error()
            )));
        }
        Ok(response.id())
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration> {
        let ttl = self
            .members
            .call("lease keep-alive", Resend::Always, |member, _| {
                let mut client = member.lease.clone();
                async move { keep_alive_once(&mut client, lease).await }
            })
            .await?;
        Ok(Duration::from_secs(u64::try_from(ttl).unwrap_or(0)))
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.members
            .call("lease revoke", Resend::Always, |member, maybe_revoked| {
                let mut client = member.lease.clone();
                async move {
                    match client.revoke(lease).await {
                        Ok(_) => Ok(()),
                        // Our earlier attempt may be what removed it.
                        Err(err)
                            if server_said(&err, message::LEASE_NOT_FOUND) && maybe_revoked =>
                        {
                            Ok(())
                        }
                        Err(err) if server_said(&err, message::LEASE_NOT_FOUND) => {
                            Err(Failure::Final(StoreError::LeaseNotFound(lease)))
                        }
                        Err(err) => Err(classify(err)),
                    }
                }
            })
            .await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        if revision < 1 {
            return Err(StoreError::Compacted {
                requested: revision,
                compact_revision: self.compacted_revision(revision).await?,
            });
        }
        let answer = self
            .members
            .call("compaction", Resend::Always, |member, maybe_compacted| {
                let mut kv = member.kv.clone();
                async move {
                    match kv.compact(revision, None).await {
                        Ok(_) => Ok(Compaction::Done),
                        // Our earlier attempt may be what compacted it.
                        Err(err) if server_said(&err, message::COMPACTED) && maybe_compacted => {
                            Ok(Compaction::Done)
                        }
                        Err(err) if server_said(&err, message::COMPACTED) => {
                            Ok(Compaction::AlreadyCompacted)
                        }
                        Err(err) if server_said(&err, message::FUTURE_REVISION) => {
                            Ok(Compaction::Future)
                        }
                        Err(err) => Err(classify(err)),
                    }
                }
            })
            .await?;
        match answer {
            Compaction::Done => Ok(()),
            Compaction::AlreadyCompacted => Err(StoreError::Compacted {
                requested: revision,
                compact_revision: self.compacted_revision(revision).await?,
            }),
            Compaction::Future => Err(StoreError::FutureRevision {
                requested: revision,
                current: self.current_revision().await?,
            }),
        }
    }

    async fn current_revision(&self) -> Result<Revision> {
        // A single-key read is the cheapest request that carries the
        // revision; the namespace key itself is as good as any.
        Ok(self.read(self.ns.key(""), None, 1).await?.revision)
    }
}

/// How a compaction request ended.
enum Compaction {
    Done,
    AlreadyCompacted,
    Future,
}

/// One keep-alive round trip; the TTL etcd granted.
async fn keep_alive_once(
    client: &mut etcd_client::LeaseClient,
    lease: LeaseId,
) -> Result<i64, Failure> {
    // The first answer (read inside `keep_alive`) proves the lease exists
    // but is not handed out; ask once more for the TTL.
    let (mut keeper, mut answers) = client.keep_alive(lease).await.map_err(|err| match err {
        etcd_client::Error::LeaseKeepAliveError(_) => {
            Failure::Final(StoreError::LeaseNotFound(lease))
        }
        other => classify(other),
    })?;
    keeper.keep_alive().await.map_err(classify)?;
    match answers.message().await.map_err(classify)? {
        Some(answer) if answer.ttl() > 0 => Ok(answer.ttl()),
        Some(_) => Err(Failure::Final(StoreError::LeaseNotFound(lease))),
        None => Err(Failure::MaybeApplied(
            "etcd closed the keep-alive stream without answering".into(),
        )),
    }
}
