//! Committing a program's writes at any size, all or nothing, on any store.
//!
//! Every write of program-managed facts (an apply, `scale`, a service's
//! deletion) carries [`guard_desired`]: it compares `meta/desired-generation`
//! with what was read before planning, requires that no staged apply is
//! being copied into place (`meta/applying` absent), and bumps the
//! generation. One compare thus stands for every program fact, whatever
//! the number of them.
//!
//! A plan that fits one transaction (the store's `max_txn_ops`, and
//! [`ONE_TXN_BYTES`]) commits in one. A larger one (etcd allows 128
//! operations and 1.5 MiB per request) is staged:
//! 1. its writes go, in chunks, to `meta/apply/{apply}/chunk/{n}`, which
//!    no reader applies;
//! 2. one guarded transaction writes the commit record `meta/applying`:
//!    from that revision on the control plane's view overlays the chunks
//!    on the desired facts, so readers see the whole new program at once;
//! 3. each chunk is copied into place, deleting it in the same transaction
//!    (readers see no difference), then the commit record goes.
//!
//! Killed before step 2, the old program stays visible and the chunks are
//! orphans, deleted by a later [`settle_and_tidy`] once older than
//! [`STAGING_TIMEOUT`] (an apply that stages longer gives up before its
//! commit, whose compare on its first chunk also fails if it was deleted).
//! Killed after step 2, the new program is visible and any server finishes
//! step 3: [`settle`] runs before every program write (apply, scale, a
//! service's deletion) and when the server starts.

use std::time::{Duration, Instant};

use cca_model::cluster::{ApplyChunk, ApplyCommit, DesiredGeneration, StagedWrite};
use cca_model::keys;
use cca_store::{Compare, CompareOp, KeyValue, Op, RangeRequest, Store, Txn, TxnOutcome};

use crate::error::{ApiError, ApiResult};
use crate::state::{encode, now_millis};

/// A plan above this many bytes of writes is staged even when the store
/// takes any number of operations (etcd's default request limit is
/// 1.5 MiB; the embedded store's group commit prefers smaller batches).
pub(crate) const ONE_TXN_BYTES: usize = 1024 * 1024;

/// The most bytes of writes one chunk holds (copying it writes them again).
const CHUNK_BYTES: usize = 512 * 1024;

/// Chunks of an apply that never committed are deleted after this long;
/// an apply still staging after half of it gives up.
pub(crate) const STAGING_TIMEOUT: Duration = Duration::from_secs(600);

/// Keys per page when reading the staged chunks' keys.
const PAGE: usize = 1_000;

/// What a program write read before planning.
#[derive(Clone, Debug, Default)]
pub(crate) struct Generation {
    read: Option<KeyValue>,
}

impl Generation {
    /// Reads the generation. Read it before the facts a plan is made on:
    /// a change after this read fails the guarded commit.
    pub(crate) async fn read(store: &dyn Store) -> ApiResult<Self> {
        Ok(Self {
            read: store.get(&keys::desired_generation()).await?,
        })
    }

    fn next(&self) -> DesiredGeneration {
        let held = self
            .read
            .as_ref()
            .and_then(|kv| serde_json::from_slice::<DesiredGeneration>(&kv.value).ok())
            .unwrap_or_default();
        DesiredGeneration {
            generation: held.generation + 1,
        }
    }
}

/// Adds the guard every write of program-managed facts carries (see the
/// module documentation).
pub(crate) fn guard_desired(txn: Txn, generation: &Generation) -> Txn {
    let read = generation.read.as_ref().map_or(0, |kv| kv.mod_revision);
    txn.when(Compare::mod_revision(
        keys::desired_generation(),
        CompareOp::Equal,
        read,
    ))
    .when(Compare::absent(keys::applying()))
    .then(Op::put(
        keys::desired_generation(),
        encode(&generation.next()),
    ))
}

/// How a guarded commit ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Committed {
    At(cca_store::Revision),
    /// Program facts changed since the generation was read: plan again.
    Conflict,
}

/// Commits `writes` (with `compares` when they fit one transaction, and the
/// `extra` operations such as an event with the commit), all or nothing.
pub(crate) async fn commit(
    store: &dyn Store,
    generation: &Generation,
    compares: Vec<Compare>,
    writes: Vec<Op>,
    extra: Vec<Op>,
) -> ApiResult<Committed> {
    let max_ops = store.max_txn_ops();
    let bytes: usize = writes.iter().map(op_bytes).sum();
    // The guard adds one write (the generation) and two compares.
    let fits = writes.len() + extra.len() < max_ops
        && compares.len() + 2 <= max_ops
        && bytes <= ONE_TXN_BYTES;
    if fits {
        let mut txn = guard_desired(Txn::new(), generation);
        txn.compares.extend(compares);
        txn.ops.extend(writes);
        txn.ops.extend(extra);
        return Ok(match store.txn(txn).await? {
            TxnOutcome::Committed { revision } => Committed::At(revision),
            TxnOutcome::CompareFailed { .. } => Committed::Conflict,
        });
    }
    let chunks = chunk(writes, max_ops.saturating_sub(1).max(1))?;
    let apply = format!("{:013}-{:016x}", now_millis(), fastrand::u64(..));
    let outcome = stage_and_commit(store, generation, &apply, &chunks, extra).await;
    if !matches!(outcome, Ok(Committed::At(_))) {
        // Best effort: what is left is an orphan a later settle deletes.
        let _ = store
            .txn(Txn::new().then(Op::delete_prefix(keys::apply_chunks(&apply))))
            .await;
    }
    let committed = outcome?;
    settle(store).await?;
    Ok(committed)
}

async fn stage_and_commit(
    store: &dyn Store,
    generation: &Generation,
    apply: &str,
    chunks: &[ApplyChunk],
    extra: Vec<Op>,
) -> ApiResult<Committed> {
    let started = Instant::now();
    for (index, chunk) in chunks.iter().enumerate() {
        let key = keys::apply_chunk(apply, index);
        store
            .txn(Txn::new().then(Op::put(key, encode(chunk))))
            .await?;
    }
    if started.elapsed() > STAGING_TIMEOUT / 2 {
        return Err(ApiError::unavailable(format!(
            "staging the apply took {:.0?}, too close to the {STAGING_TIMEOUT:?} after which staged chunks are discarded; nothing was applied, retry",
            started.elapsed()
        )));
    }
    let record = ApplyCommit {
        apply: apply.to_owned(),
        chunks: u32::try_from(chunks.len()).unwrap_or(u32::MAX),
        at: now_millis(),
    };
    let mut txn = guard_desired(Txn::new(), generation)
        .when(Compare::exists(keys::apply_chunk(apply, 0)))
        .then(Op::put(keys::applying(), encode(&record)));
    txn.ops.extend(extra);
    Ok(match store.txn(txn).await? {
        TxnOutcome::Committed { revision } => Committed::At(revision),
        TxnOutcome::CompareFailed { .. } => Committed::Conflict,
    })
}

/// Splits `writes` into chunks of at most `max_ops` writes and
/// [`CHUNK_BYTES`] (a single larger write gets a chunk of its own).
fn chunk(writes: Vec<Op>, max_ops: usize) -> ApiResult<Vec<ApplyChunk>> {
    let mut chunks = Vec::new();
    let mut current = ApplyChunk::default();
    let mut bytes = 0;
    for op in writes {
        let size = op_bytes(&op);
        if !current.writes.is_empty()
            && (current.writes.len() == max_ops || bytes + size > CHUNK_BYTES)
        {
            chunks.push(std::mem::take(&mut current));
            bytes = 0;
        }
        current.writes.push(staged_write(op)?);
        bytes += size;
    }
    if !current.writes.is_empty() {
        chunks.push(current);
    }
    Ok(chunks)
}

fn staged_write(op: Op) -> ApiResult<StagedWrite> {
    match op {
        Op::Put { key, value, .. } => {
            let value = String::from_utf8(value).map_err(|_| {
                ApiError::internal(format!("the value planned for `{key}` is not UTF-8 JSON"))
            })?;
            Ok(StagedWrite::Put { key, value })
        }
        Op::Delete { key } => Ok(StagedWrite::Delete { key }),
        Op::DeletePrefix { prefix } => Err(ApiError::internal(format!(
            "an apply cannot stage a prefix delete (`{prefix}`)"
        ))),
    }
}

fn op_bytes(op: &Op) -> usize {
    match op {
        Op::Put { key, value, .. } => key.len() + value.len(),
        Op::Delete { key } => key.len(),
        Op::DeletePrefix { prefix } => prefix.len(),
    }
}

/// Finishes a committed staged apply, if there is one (copies its
/// remaining chunks into place, then removes its record). Idempotent:
/// several servers may settle at once. Costs one read when there is none.
pub(crate) async fn settle(store: &dyn Store) -> ApiResult<()> {
    settle_commit(store).await.map(|_| ())
}

/// [`settle`], then deletes the chunks of applies that never committed and
/// are older than [`STAGING_TIMEOUT`] (an apply, and a starting server,
/// tidy up; other writers only settle).
pub(crate) async fn settle_and_tidy(store: &dyn Store) -> ApiResult<()> {
    let pending = settle_commit(store).await?;
    delete_orphans(store, pending.as_deref()).await
}

/// Returns the apply it finished, if any.
async fn settle_commit(store: &dyn Store) -> ApiResult<Option<String>> {
    let pending = store.get(&keys::applying()).await?;
    let committed =
        match &pending {
            Some(kv) => Some(serde_json::from_slice::<ApplyCommit>(&kv.value).map_err(
                |error| ApiError::internal(format!("`{}` does not decode: {error}", kv.key)),
            )?),
            None => None,
        };
    if let (Some(kv), Some(record)) = (&pending, &committed) {
        copy_into_place(store, record).await?;
        let done = Txn::new()
            .when(Compare::mod_revision(
                keys::applying(),
                CompareOp::Equal,
                kv.mod_revision,
            ))
            .then(Op::delete(keys::applying()));
        store.txn(done).await?;
    }
    Ok(committed.map(|record| record.apply))
}

async fn copy_into_place(store: &dyn Store, record: &ApplyCommit) -> ApiResult<()> {
    for index in 0..record.chunks as usize {
        let key = keys::apply_chunk(&record.apply, index);
        let Some(kv) = store.get(&key).await? else {
            continue; // copied already
        };
        let chunk: ApplyChunk = serde_json::from_slice(&kv.value)
            .map_err(|error| ApiError::internal(format!("`{key}` does not decode: {error}")))?;
        let mut txn = Txn::new().when(Compare::mod_revision(
            &key,
            CompareOp::Equal,
            kv.mod_revision,
        ));
        for write in chunk.writes {
            txn = txn.then(match write {
                StagedWrite::Put { key, value } => Op::put(key, value.into_bytes()),
                StagedWrite::Delete { key } => Op::delete(key),
            });
        }
        // Another server copying the same chunk makes this compare fail:
        // either way the chunk is in place.
        store.txn(txn.then(Op::delete(key))).await?;
    }
    Ok(())
}

/// [`settle`], retried with backoff until it succeeds or the server stops.
pub(crate) async fn settle_in_background(state: crate::state::ApiState) {
    let mut shutdown = state.shutdown_signal();
    let mut backoff = Duration::from_millis(200);
    loop {
        match settle_and_tidy(state.store()).await {
            Ok(()) => return,
            Err(error) => tracing::warn!(%error, "finishing a staged apply failed; retrying"),
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

/// Deletes the chunks of applies other than `keep` staged longer ago than
/// [`STAGING_TIMEOUT`].
async fn delete_orphans(store: &dyn Store, keep: Option<&str>) -> ApiResult<()> {
    let cutoff = now_millis() - i64::try_from(STAGING_TIMEOUT.as_millis()).unwrap_or(i64::MAX);
    let mut request = RangeRequest::prefix(cca_model::Kind::ApplyChunk.prefix()).limit(PAGE);
    let mut stale = std::collections::BTreeSet::new();
    loop {
        let page = store.range(request.clone()).await?;
        for kv in &page.kvs {
            if let Some(cca_model::Key::ApplyChunk { apply, .. }) = cca_model::Key::parse(&kv.key)
                && Some(apply.as_str()) != keep
                && staged_at(&apply).is_none_or(|at| at < cutoff)
            {
                stale.insert(apply);
            }
        }
        match page.continuation {
            Some(last) => request = request.after(last),
            None => break,
        }
    }
    for apply in stale {
        tracing::info!(
            apply,
            "deleting the chunks of an apply that never committed"
        );
        store
            .txn(Txn::new().then(Op::delete_prefix(keys::apply_chunks(&apply))))
            .await?;
    }
    Ok(())
}

/// When an apply started staging: its id begins with the millisecond.
fn staged_at(apply: &str) -> Option<i64> {
    apply.split_once('-')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_hold_at_most_max_ops_and_keep_order() {
        let writes: Vec<Op> = (0..10)
            .map(|n| Op::put(format!("desired/gate/g{n}"), b"{}".to_vec()))
            .collect();
        let chunks = chunk(writes, 4).expect("chunks");
        let sizes: Vec<usize> = chunks.iter().map(|chunk| chunk.writes.len()).collect();
        assert_eq!(sizes, [4, 4, 2]);
        assert_eq!(chunks[2].writes[1].key(), "desired/gate/g9");
    }

    #[test]
    fn chunks_hold_at_most_chunk_bytes() {
        let big = vec![b'x'; CHUNK_BYTES / 2];
        let writes: Vec<Op> = (0..3)
            .map(|n| Op::put(format!("desired/gate/g{n}"), big.clone()))
            .collect();
        let chunks = chunk(writes, 100).expect("chunks");
        assert_eq!(chunks.len(), 3, "two halves and their keys exceed a chunk");
    }

    #[test]
    fn apply_ids_start_with_their_time() {
        assert_eq!(staged_at("0001700000000000-00ff"), Some(1_700_000_000_000));
        assert_eq!(staged_at("nonsense"), None);
    }
}
