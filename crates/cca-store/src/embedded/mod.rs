//! The embedded store, CCattler's default: the whole key space in memory
//! for reads, made durable in one redb file under the data directory. One
//! writer thread owns all changes and commits queued requests together
//! (group commit: one fsync for many transactions); readers never wait for
//! the disk and only ever see durable data. Lease grants and revocations
//! are commits; renewals are not: deadlines live in memory
//! ([`lease_clock`]), so a keep-alive never waits behind the writer. The
//! writer's queue is bounded ([`MAX_QUEUED`]): callers past the bound wait
//! for a slot instead of growing an unbounded backlog.

mod codec;
mod disk;
mod lease_clock;
mod state;
mod watchers;
mod writer;

use crate::{SNAPSHOT_PAGES_AHEAD, Snapshot};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self as std_mpsc, Sender};
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, oneshot};

use crate::error::{Result, StoreError};
use crate::types::{KeyValue, LeaseId, RangePage, RangeRequest, Revision, Txn, TxnOutcome};
use crate::{Store, WatchStream, lease_ttl_secs, validate};
use lease_clock::LeaseClock;
use state::State;
use writer::{Queued, Request};

pub use disk::FILE_NAME;

/// Revisions of history kept for watches by default.
pub const DEFAULT_HISTORY_RETENTION: usize = 50_000;

/// Requests waiting for (or in) the writer at most: with a batch of up to
/// 1,024 per fsync this is several batches of backlog, enough to keep the
/// disk busy; a caller past it waits for a slot (its own future, bounded by
/// the API's admission and the runner), never a growing queue.
pub const MAX_QUEUED: usize = 8_192;

/// Where and how the embedded store keeps its data.
#[derive(Clone, Debug)]
pub struct Config {
    /// The data directory; the store's file is `DIR/store.redb`.
    pub dir: PathBuf,
    /// Revisions of history kept for watchers to resume from; older
    /// revisions are compacted away automatically.
    pub history_retention: usize,
}

impl Config {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            history_retention: DEFAULT_HISTORY_RETENTION,
        }
    }

    pub fn history_retention(mut self, revisions: usize) -> Self {
        self.history_retention = revisions.max(1);
        self
    }
}

/// State shared by the handle, the writer thread and watch tasks.
#[derive(Debug)]
struct Shared {
    state: RwLock<State>,
    /// Every live lease's deadline (in memory only).
    leases: LeaseClock,
    /// Slots of the writer's queue.
    queue: Arc<Semaphore>,
    /// Set when a write failed: every later operation fails with it.
    fatal: OnceLock<StoreError>,
    /// Where watch catch-up tasks run.
    runtime: tokio::runtime::Handle,
}

impl Shared {
    fn read_state(&self) -> RwLockReadGuard<'_, State> {
        // The state is only mutated by `State::apply`, which cannot leave it
        // half-changed by panicking midway through plain map operations.
        self.state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_state(&self) -> RwLockWriteGuard<'_, State> {
        self.state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn fail(&self, error: &StoreError) {
        let _ = self.fatal.set(error.clone());
    }

    fn check(&self) -> Result<()> {
        match self.fatal.get() {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }
}

/// A handle to an open embedded store. Cheap to share behind an `Arc`;
/// dropping the last handle stops the writer and closes the file.
#[derive(Debug)]
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    requests: Sender<Queued>,
    writer: Option<std::thread::JoinHandle<()>>,
    path: PathBuf,
    snapshots: disk::SnapshotReader,
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `config.dir`. Must be called inside a
    /// tokio runtime. Fails, without modifying anything, when the data file
    /// is corrupt, truncated, foreign, or in use by another process.
    pub async fn open(config: Config) -> Result<Self> {
        let runtime = tokio::runtime::Handle::current();
        let dir = config.dir.clone();
        let (file, state) = tokio::task::spawn_blocking(move || disk::DataFile::open(&dir))
            .await
            .map_err(|err| StoreError::DataFile {
                path: config.dir.join(FILE_NAME),
                problem: format!("opening failed: {err}"),
            })??;
        let path = file.path().to_owned();
        let snapshots = file.snapshots();
        let leases = LeaseClock::new(Instant::now());
        let now = Instant::now();
        for (id, lease) in &state.leases {
            leases.start(*id, lease.ttl_secs, now);
        }
        let shared = Arc::new(Shared {
            state: RwLock::new(state),
            leases,
            queue: Arc::new(Semaphore::new(MAX_QUEUED)),
            fatal: OnceLock::new(),
            runtime,
        });
        let (requests, receiver) = std_mpsc::channel();
        let writer_shared = Arc::clone(&shared);
        let retention = config.history_retention.max(1);
        let writer = std::thread::Builder::new()
            .name("cca-store-writer".into())
            .spawn(move || writer::run(writer_shared, file, receiver, retention))
            .map_err(|err| StoreError::DataFile {
                path: path.clone(),
                problem: format!("cannot start the writer thread: {err}"),
            })?;
        Ok(Self {
            shared,
            requests,
            writer: Some(writer),
            path,
            snapshots,
        })
    }

    /// Makes a new store in `dir` holding exactly `kvs` (none bound to a
    /// lease) at `revision`, its history compacted there: a restore. Refuses
    /// a directory that already holds a store. Blocking: one file write.
    pub fn seed(dir: &Path, revision: Revision, kvs: &[KeyValue]) -> Result<()> {
        disk::seed(dir, revision, kvs)
    }

    /// The data file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops the writer after the requests already queued and closes the
    /// file, so the directory can be opened again at once.
    pub async fn close(mut self) {
        let writer = self.writer.take();
        drop(self);
        if let Some(writer) = writer {
            let _ = tokio::task::spawn_blocking(move || writer.join()).await;
        }
    }

    async fn request<T>(&self, make: impl FnOnce(writer::Reply<T>) -> Request) -> Result<T> {
        self.shared.check()?;
        let slot = Arc::clone(&self.shared.queue)
            .acquire_owned()
            .await
            .map_err(|_| self.closed())?;
        let (reply, answer) = oneshot::channel();
        let queued = Queued {
            request: make(reply),
            slot,
        };
        self.requests.send(queued).map_err(|_| self.closed())?;
        answer.await.map_err(|_| self.closed())?
    }

    fn closed(&self) -> StoreError {
        self.shared
            .fatal
            .get()
            .cloned()
            .unwrap_or(StoreError::Closed)
    }
}

#[async_trait::async_trait]
impl Store for EmbeddedStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        self.shared.check()?;
        validate::key(key)?;
        Ok(self.shared.read_state().kvs.get(key).cloned())
    }

    async fn range(&self, request: RangeRequest) -> Result<RangePage> {
        self.shared.check()?;
        Ok(self.shared.read_state().range(&request))
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        validate::txn(&txn)?;
        self.request(|reply| Request::Txn(txn, reply)).await
    }

    async fn watch(&self, prefix: &str, from_revision: Revision) -> Result<WatchStream> {
        self.shared.check()?;
        if from_revision < 0 {
            return Err(StoreError::InvalidRequest(format!(
                "watch from revision {from_revision}: revisions start at 1 (0 means from now)"
            )));
        }
        let (sender, stream) = WatchStream::channel();
        watchers::start(&self.shared, prefix.to_owned(), from_revision, sender);
        Ok(stream)
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        let ttl = lease_ttl_secs(ttl)?;
        self.request(|reply| Request::Grant(ttl, reply)).await
    }

    async fn snapshot(&self, page: usize) -> Result<Snapshot> {
        self.shared.check()?;
        let (started, first) = tokio::sync::oneshot::channel();
        let (sender, pages) = tokio::sync::mpsc::channel(SNAPSHOT_PAGES_AHEAD);
        let reader = self.snapshots.clone();
        let page = page.max(1);
        tokio::task::spawn_blocking(move || reader.read(page, started, &sender));
        let (revision, count) = first.await.map_err(|_| StoreError::Closed)??;
        Ok(Snapshot {
            revision,
            count,
            pages,
        })
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration> {
        self.shared.check()?;
        let ttl = self.shared.leases.renew(lease, Instant::now())?;
        Ok(Duration::from_secs(u64::try_from(ttl).unwrap_or(0)))
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.request(|reply| Request::Revoke(lease, reply))
            .await
            .map(drop)
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.request(|reply| Request::Compact(revision, reply))
            .await
    }

    async fn current_revision(&self) -> Result<Revision> {
        self.shared.check()?;
        Ok(self.shared.read_state().revision)
    }

    fn max_txn_ops(&self) -> usize {
        usize::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Op;

    /// With every slot of the writer's queue taken — a backlog of large
    /// transactions — a transaction waits for a slot, and a renewal is
    /// answered at once all the same: it never queues behind the writer.
    #[tokio::test]
    async fn renewals_do_not_wait_behind_a_full_writer_queue() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open(Config::new(dir.path()))
            .await
            .expect("open");
        let lease = store
            .grant_lease(Duration::from_secs(5))
            .await
            .expect("grant");
        let backlog = Arc::clone(&store.shared.queue)
            .acquire_many_owned(MAX_QUEUED as u32)
            .await
            .expect("the queue is open");
        let put = store.txn(Txn::new().then(Op::put("k", "v")));
        tokio::pin!(put);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), &mut put)
                .await
                .is_err(),
            "a transaction got past a full queue"
        );
        assert_eq!(
            store.keep_alive(lease).await.expect("renews"),
            Duration::from_secs(5)
        );
        drop(backlog);
        assert!(put.await.expect("commits once a slot frees").is_committed());
    }
}
