//! The embedded store's data file: one redb database holding the key space,
//! the revision log, the leases and a format marker. Opening checks every
//! page checksum and every record, so a corrupt, truncated or foreign file is
//! refused with its path and the problem; a batch is written in one redb
//! transaction with one fsync (the group commit).

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use super::codec::{self, DecodeError};
use super::state::{LogEntry, Staged, State};
use crate::error::{Result, StoreError};
use crate::types::LeaseId;

/// The name of the data file inside the data directory.
pub const FILE_NAME: &str = "store.redb";

/// Written at creation, checked at open: tells our files from others'.
const FORMAT: &[u8] = b"ccattler-store/1";

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const KVS: TableDefinition<&str, &[u8]> = TableDefinition::new("kvs");
const LOG: TableDefinition<i64, &[u8]> = TableDefinition::new("log");
const LEASES: TableDefinition<i64, &[u8]> = TableDefinition::new("leases");

const META_FORMAT: &str = "format";
const META_REVISION: &str = "revision";
const META_COMPACT: &str = "compact_revision";
const META_NEXT_LEASE: &str = "next_lease_id";

/// Cache for redb's pages; the store keeps its own copy of everything in
/// memory, so redb's cache only needs to cover a batch's working set.
const PAGE_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// The open data file.
#[derive(Debug)]
pub(super) struct DataFile {
    /// Shared with snapshot readers: a redb read transaction sees one
    /// committed state while the writer goes on.
    db: Arc<Database>,
    path: PathBuf,
}

impl DataFile {
    /// Opens the data file in `dir`, creating an empty store if there is
    /// none, and loads it.
    pub(super) fn open(dir: &Path) -> Result<(Self, State)> {
        fs::create_dir_all(dir).map_err(|err| StoreError::DataFile {
            path: dir.to_owned(),
            problem: format!("cannot create the data directory: {err}"),
        })?;
        let path = dir.join(FILE_NAME);
        if !path.exists() {
            create(&path)?;
        }
        let file = Self {
            db: Arc::new(open_database(&path)?),
            path,
        };
        let state = file.load()?;
        Ok((file, state))
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// A reader of consistent snapshots of this file.
    pub(super) fn snapshots(&self) -> SnapshotReader {
        SnapshotReader {
            db: Arc::clone(&self.db),
            path: self.path.clone(),
        }
    }

    /// Makes a batch durable: one redb transaction, one fsync.
    pub(super) fn write(&self, staged: &Staged) -> Result<()> {
        self.write_batch(staged).map_err(|err| StoreError::Write {
            path: self.path.clone(),
            problem: err.to_string(),
        })
    }

    fn write_batch(&self, staged: &Staged) -> std::result::Result<(), redb::Error> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        {
            let mut kvs = txn.open_table(KVS)?;
            let mut record = Vec::new();
            for (key, change) in &staged.kvs {
                match change {
                    Some(kv) => {
                        record.clear();
                        codec::encode_kv(kv, &mut record);
                        kvs.insert(key.as_str(), record.as_slice())?;
                    }
                    None => {
                        kvs.remove(key.as_str())?;
                    }
                }
            }
            let mut log = txn.open_table(LOG)?;
            for entry in &staged.entries {
                log.insert(
                    entry.revision,
                    codec::encode_events(&entry.events).as_slice(),
                )?;
            }
            if let Some(compact) = staged.compact_to {
                log.retain_in(..=compact, |_, _| false)?;
            }
            let mut leases = txn.open_table(LEASES)?;
            for (id, change) in &staged.leases {
                match change {
                    Some(lease) => {
                        leases.insert(*id, codec::encode_lease(lease).as_slice())?;
                    }
                    None => {
                        leases.remove(*id)?;
                    }
                }
            }
            let mut meta = txn.open_table(META)?;
            meta.insert(META_REVISION, codec::encode_i64(staged.revision).as_slice())?;
            meta.insert(
                META_NEXT_LEASE,
                codec::encode_i64(staged.next_lease_id).as_slice(),
            )?;
            if let Some(compact) = staged.compact_to {
                meta.insert(META_COMPACT, codec::encode_i64(compact).as_slice())?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    fn load(&self) -> Result<State> {
        let corrupt = |problem: String| StoreError::DataFile {
            path: self.path.clone(),
            problem,
        };
        let io = |err: redb::Error| corrupt(format!("cannot read: {err}"));
        let txn = self.db.begin_read().map_err(|err| io(err.into()))?;
        let meta = txn.open_table(META).map_err(|_| {
            corrupt(
                "not a CCattler store: it has no format marker (a file from another program?)"
                    .into(),
            )
        })?;
        let read_meta = |name: &str| -> Result<Option<Vec<u8>>> {
            Ok(meta
                .get(name)
                .map_err(|err| io(err.into()))?
                .map(|value| value.value().to_vec()))
        };
        match read_meta(META_FORMAT)? {
            Some(format) if format == FORMAT => {}
            Some(other) => {
                return Err(corrupt(format!(
                    "unsupported format `{}`; this cca reads `{}`",
                    String::from_utf8_lossy(&other),
                    String::from_utf8_lossy(FORMAT)
                )));
            }
            None => {
                return Err(corrupt(
                    "not a CCattler store: the format marker is missing".into(),
                ));
            }
        }
        let meta_i64 = |name: &str| -> Result<i64> {
            let bytes = read_meta(name)?
                .ok_or_else(|| corrupt(format!("meta entry `{name}` is missing")))?;
            codec::decode_i64(name, &bytes).map_err(|DecodeError(problem)| corrupt(problem))
        };
        let mut state = State::empty();
        state.revision = meta_i64(META_REVISION)?;
        state.compact_revision = meta_i64(META_COMPACT)?;
        state.next_lease_id = meta_i64(META_NEXT_LEASE)?;

        let kvs = txn.open_table(KVS).map_err(|err| io(err.into()))?;
        for row in kvs.iter().map_err(|err| io(err.into()))? {
            let (key, value) = row.map_err(|err| io(err.into()))?;
            let key = key.value().to_owned();
            let kv = codec::decode_kv(&key, value.value())
                .map_err(|DecodeError(problem)| corrupt(format!("key `{key}`: {problem}")))?;
            state.kvs.insert(key, kv);
        }
        let log = txn.open_table(LOG).map_err(|err| io(err.into()))?;
        for row in log.iter().map_err(|err| io(err.into()))? {
            let (revision, value) = row.map_err(|err| io(err.into()))?;
            let revision = revision.value();
            let events =
                codec::decode_events(revision, value.value()).map_err(|DecodeError(problem)| {
                    corrupt(format!("log entry {revision}: {problem}"))
                })?;
            state.log.push_back(Arc::new(LogEntry { revision, events }));
        }
        let leases = txn.open_table(LEASES).map_err(|err| io(err.into()))?;
        for row in leases.iter().map_err(|err| io(err.into()))? {
            let (id, value) = row.map_err(|err| io(err.into()))?;
            let id = id.value();
            let lease = codec::decode_lease(id, value.value())
                .map_err(|DecodeError(problem)| corrupt(problem))?;
            state.leases.insert(id, lease);
        }
        check_consistency(&mut state).map_err(corrupt)?;
        Ok(state)
    }
}

/// Cross-checks the tables against each other and derives the lease index.
fn check_consistency(state: &mut State) -> std::result::Result<(), String> {
    if state.revision < 1 || state.compact_revision < 0 || state.compact_revision > state.revision {
        return Err(format!(
            "impossible revisions: current {}, compacted {}",
            state.revision, state.compact_revision
        ));
    }
    if let Some(kv) = state
        .kvs
        .values()
        .find(|kv| kv.mod_revision > state.revision)
    {
        return Err(format!(
            "key `{}` was modified at revision {}, after the store's revision {}",
            kv.key, kv.mod_revision, state.revision
        ));
    }
    let log_revisions = state.log.front().zip(state.log.back());
    if let Some((first, last)) = log_revisions
        && (first.revision <= state.compact_revision || last.revision > state.revision)
    {
        return Err(format!(
            "log holds revisions {}..={} outside the retained history {}..={}",
            first.revision,
            last.revision,
            state.compact_revision + 1,
            state.revision
        ));
    }
    let mut lease_keys: HashMap<LeaseId, BTreeSet<String>> = HashMap::new();
    for kv in state.kvs.values() {
        if let Some(lease) = kv.lease {
            if !state.leases.contains_key(&lease) {
                return Err(format!(
                    "key `{}` is attached to lease {lease}, which is missing",
                    kv.key
                ));
            }
            lease_keys.entry(lease).or_default().insert(kv.key.clone());
        }
    }
    if let Some(id) = state.leases.keys().find(|id| **id >= state.next_lease_id) {
        return Err(format!(
            "lease {id} is not below the next lease id {}",
            state.next_lease_id
        ));
    }
    state.lease_keys = lease_keys;
    Ok(())
}

/// Creates an empty store file atomically: written under a temporary name,
/// then renamed, so a crash never leaves a half-made store behind.
fn create(path: &Path) -> Result<()> {
    let temporary = path.with_extension("redb.tmp");
    let fail = |problem: String| StoreError::DataFile {
        path: path.to_owned(),
        problem: format!("cannot create: {problem}"),
    };
    let _ = fs::remove_file(&temporary);
    let db = Database::create(&temporary).map_err(|err| fail(err.to_string()))?;
    initialise(&db).map_err(|err| fail(err.to_string()))?;
    drop(db);
    fs::rename(&temporary, path).map_err(|err| fail(err.to_string()))?;
    if let Some(dir) = path.parent() {
        fs::File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|err| fail(err.to_string()))?;
    }
    Ok(())
}

fn initialise(db: &Database) -> std::result::Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut meta = txn.open_table(META)?;
        meta.insert(META_FORMAT, FORMAT)?;
        meta.insert(META_REVISION, codec::encode_i64(1).as_slice())?;
        meta.insert(META_COMPACT, codec::encode_i64(0).as_slice())?;
        meta.insert(META_NEXT_LEASE, codec::encode_i64(1).as_slice())?;
        txn.open_table(KVS)?;
        txn.open_table(LOG)?;
        txn.open_table(LEASES)?;
    }
    txn.commit()?;
    Ok(())
}

/// Opens an existing file, verifying every page checksum.
fn open_database(path: &Path) -> Result<Database> {
    let refuse = |problem: String| StoreError::DataFile {
        path: path.to_owned(),
        problem,
    };
    let length = fs::metadata(path)
        .map_err(|err| refuse(format!("cannot read: {err}")))?
        .len();
    if length == 0 {
        return Err(refuse(
            "the file is empty (truncated?); restore it from a backup or remove it to start an empty store".into(),
        ));
    }
    let mut builder = Database::builder();
    builder
        .set_check_integrity_on_open(true)
        .set_cache_size(PAGE_CACHE_BYTES);
    // redb documents that a damaged file may make it panic; a store that
    // cannot be read must fail with a message, not take the process down.
    let opened = catch_unwind(AssertUnwindSafe(|| builder.open(path))).map_err(|_| {
        refuse("the file is corrupt: the database library failed reading it".into())
    })?;
    opened.map_err(|err| refuse(describe_open_error(err)))
}

fn describe_open_error(err: redb::DatabaseError) -> String {
    match err {
        redb::DatabaseError::DatabaseAlreadyOpen => {
            "already open in another process (is another cca server using this data directory?)"
                .into()
        }
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(detail)) => {
            format!("the file is corrupt ({detail}); restore it from a backup")
        }
        redb::DatabaseError::Storage(redb::StorageError::Io(io)) => {
            format!(
                "cannot read it as a store ({io}); the file is truncated or not a CCattler store"
            )
        }
        other => format!("cannot open it as a store: {other}"),
    }
}

/// Reads the whole key space as one redb read transaction sees it: the
/// last committed batch, its revision with it, whatever the writer does
/// meanwhile.
#[derive(Clone, Debug)]
pub(super) struct SnapshotReader {
    db: Arc<Database>,
    path: PathBuf,
}

impl SnapshotReader {
    /// Sends the keys in pages of `page` into `pages` (blocking: run it on
    /// a thread of its own); the revision and key count are sent first
    /// through `started`.
    pub(super) fn read(
        &self,
        page: usize,
        started: tokio::sync::oneshot::Sender<Result<(i64, u64)>>,
        pages: &tokio::sync::mpsc::Sender<Result<Vec<crate::KeyValue>>>,
    ) {
        let fail = |err: redb::Error| StoreError::DataFile {
            path: self.path.clone(),
            problem: format!("snapshot read failed: {err}"),
        };
        let opened = (|| -> std::result::Result<_, redb::Error> {
            let txn = self.db.begin_read()?;
            let meta = txn.open_table(META)?;
            let revision = meta.get(META_REVISION)?.map(|value| value.value().to_vec());
            let kvs = txn.open_table(KVS)?;
            let count = redb::ReadableTableMetadata::len(&kvs)?;
            Ok((revision, count, kvs))
        })();
        let (revision, count, kvs) = match opened {
            Ok(opened) => opened,
            Err(err) => {
                let _ = started.send(Err(fail(err)));
                return;
            }
        };
        let revision = revision
            .ok_or_else(|| "the revision is missing".to_owned())
            .and_then(|bytes| {
                codec::decode_i64(META_REVISION, &bytes).map_err(|DecodeError(problem)| problem)
            });
        match revision {
            Ok(revision) => {
                if started.send(Ok((revision, count))).is_err() {
                    return;
                }
            }
            Err(problem) => {
                let _ = started.send(Err(StoreError::DataFile {
                    path: self.path.clone(),
                    problem,
                }));
                return;
            }
        }
        let rows = match kvs.iter() {
            Ok(rows) => rows,
            Err(err) => {
                let _ = pages.blocking_send(Err(fail(err.into())));
                return;
            }
        };
        let mut batch = Vec::with_capacity(page);
        for row in rows {
            let decoded = row
                .map_err(|err| fail(err.into()))
                .and_then(|(key, value)| {
                    let key = key.value().to_owned();
                    codec::decode_kv(&key, value.value()).map_err(|DecodeError(problem)| {
                        StoreError::DataFile {
                            path: self.path.clone(),
                            problem: format!("key `{key}`: {problem}"),
                        }
                    })
                });
            match decoded {
                Ok(kv) => batch.push(kv),
                Err(error) => {
                    let _ = pages.blocking_send(Err(error));
                    return;
                }
            }
            if batch.len() >= page
                && pages
                    .blocking_send(Ok(std::mem::replace(&mut batch, Vec::with_capacity(page))))
                    .is_err()
            {
                return;
            }
        }
        if !batch.is_empty() {
            let _ = pages.blocking_send(Ok(batch));
        }
    }
}

/// Writes a new store file in `dir` holding exactly `kvs` at `revision`,
/// with no history before it (compacted at `revision`) and no leases: a
/// restore. Refuses a directory that already holds a store. One redb
/// transaction, made under a temporary name and renamed into place.
pub(super) fn seed(dir: &Path, revision: i64, kvs: &[crate::KeyValue]) -> Result<()> {
    fs::create_dir_all(dir).map_err(|err| StoreError::DataFile {
        path: dir.to_owned(),
        problem: format!("cannot create the data directory: {err}"),
    })?;
    let path = dir.join(FILE_NAME);
    if path.exists() {
        return Err(StoreError::DataFile {
            path,
            problem: "a store is already here; restore into an empty directory".into(),
        });
    }
    if let Some(bound) = kvs.iter().find(|kv| kv.lease.is_some()) {
        return Err(StoreError::InvalidRequest(format!(
            "key `{}` is bound to a lease, which a restored store does not have",
            bound.key
        )));
    }
    let temporary = path.with_extension("redb.tmp");
    let fail = |problem: String| StoreError::DataFile {
        path: path.clone(),
        problem: format!("cannot write the restored store: {problem}"),
    };
    let _ = fs::remove_file(&temporary);
    let db = Database::create(&temporary).map_err(|err| fail(err.to_string()))?;
    let write = || -> std::result::Result<(), redb::Error> {
        let txn = db.begin_write()?;
        {
            let mut meta = txn.open_table(META)?;
            meta.insert(META_FORMAT, FORMAT)?;
            meta.insert(META_REVISION, codec::encode_i64(revision).as_slice())?;
            meta.insert(META_COMPACT, codec::encode_i64(revision).as_slice())?;
            meta.insert(META_NEXT_LEASE, codec::encode_i64(1).as_slice())?;
            let mut table = txn.open_table(KVS)?;
            let mut record = Vec::new();
            for kv in kvs {
                record.clear();
                codec::encode_kv(kv, &mut record);
                table.insert(kv.key.as_str(), record.as_slice())?;
            }
            txn.open_table(LOG)?;
            txn.open_table(LEASES)?;
        }
        txn.commit()?;
        Ok(())
    };
    write().map_err(|err| fail(err.to_string()))?;
    drop(db);
    fs::rename(&temporary, &path).map_err(|err| fail(err.to_string()))?;
    fs::File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|err| fail(err.to_string()))
}
