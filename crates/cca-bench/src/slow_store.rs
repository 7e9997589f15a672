//! [`SlowStore`]: a [`Store`] decorator that slows the store behind it in
//! one of two ways. With a fixed latency ([`delayed`]) every
//! operation waits that long before passing on — a store on a slow disk
//! or across a WAN, for the `store-latency` scenario and resilience tests;
//! a watch pays the latency once when it opens, not per event (events
//! travel on an open stream). A latency does not lower throughput under
//! concurrency, though: many callers wait side by side. Paced
//! ([`paced`]) the store commits at most R times per second,
//! whatever the concurrency — a disk that fsyncs more slowly: every commit
//! (`txn`, `grant_lease`, `revoke_lease`, `compact`) takes the next free
//! slot of a schedule 1/R apart and waits for it, while reads, watches and
//! lease keep-alives pass through at once.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cca_store::decorate::{Call, Decorated, Hook};
use cca_store::{Result, Store};
use tokio::time::Instant;

/// Wraps a store, slowing it by a latency per operation or by pacing its
/// commits.
pub type SlowStore = Decorated<Slowing>;

/// The [`Hook`] of a [`SlowStore`]: how it slows the store.
#[derive(Debug)]
pub struct Slowing(Mode);

#[derive(Debug)]
enum Mode {
    /// Every operation waits this long first.
    Latency(Duration),
    /// Commits wait for their slot; everything else passes through.
    Paced(Pacer),
}

/// `inner`, every operation of which waits `latency` before passing on.
pub fn delayed(inner: Arc<dyn Store>, latency: Duration) -> SlowStore {
    Decorated::wrap(inner, Slowing(Mode::Latency(latency)))
}

/// `inner` with its commits paced to at most `commits_per_s` per second;
/// `None` when that is not a positive, finite rate.
pub fn paced(inner: Arc<dyn Store>, commits_per_s: f64) -> Option<SlowStore> {
    let pacer = Pacer::new(commits_per_s)?;
    Some(Decorated::wrap(inner, Slowing(Mode::Paced(pacer))))
}

#[async_trait::async_trait]
impl Hook for Slowing {
    /// The latency before any operation, or a commit's slot.
    async fn before(&self, call: Call<'_>) -> Result<()> {
        match &self.0 {
            Mode::Latency(latency) => {
                if !latency.is_zero() {
                    tokio::time::sleep(*latency).await;
                }
            }
            Mode::Paced(pacer) if call.commits() => {
                tokio::time::sleep_until(pacer.reserve(Instant::now())).await;
            }
            Mode::Paced(_) => {}
        }
        Ok(())
    }
}

/// A reservation schedule of at most `1 / interval` slots per second:
/// each reservation takes the first free slot at or after the moment it
/// asks, and the next slot is free one interval later. An idle pacer
/// saves no slots up: a burst after a pause is paced from its first
/// commit on, as a disk's fsyncs would be.
#[derive(Debug)]
struct Pacer {
    interval: Duration,
    /// The first slot not taken yet (none taken: any moment is free).
    next: Mutex<Option<Instant>>,
}

impl Pacer {
    fn new(per_second: f64) -> Option<Self> {
        if !(per_second.is_finite() && per_second > 0.0) {
            return None;
        }
        let interval = Duration::try_from_secs_f64(1.0 / per_second).ok()?;
        Some(Self {
            interval,
            next: Mutex::new(None),
        })
    }

    /// Takes the first free slot at or after `now`; returns when it is.
    fn reserve(&self, now: Instant) -> Instant {
        let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = next.map_or(now, |free| free.max(now));
        *next = Some(slot + self.interval);
        slot
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use async_trait::async_trait;
    use cca_store::embedded::{Config, EmbeddedStore};
    use cca_store::{
        KeyValue, LeaseId, Op, RangePage, RangeRequest, Revision, StoreError, Txn, TxnOutcome,
        WatchStream,
    };

    #[tokio::test]
    async fn every_operation_waits_the_latency_then_passes_through() {
        let dir = tempfile::tempdir().expect("tempdir");
        let inner = EmbeddedStore::open(Config::new(dir.path()))
            .await
            .expect("open");
        let slow = delayed(Arc::new(inner), Duration::from_millis(30));
        let begun = std::time::Instant::now();
        let put = Txn::new().then(Op::put("desired/x", b"1".to_vec()));
        assert!(slow.txn(put).await.expect("txn").is_committed());
        let read = slow.get("desired/x").await.expect("get").expect("present");
        assert_eq!(read.value, b"1");
        assert!(begun.elapsed() >= Duration::from_millis(60));
    }

    #[test]
    fn the_schedule_hands_out_slots_one_interval_apart_and_saves_none_up() {
        let pacer = Pacer::new(10.0).expect("a rate");
        let start = Instant::now();
        let ms = |millis| Duration::from_millis(millis);
        // A burst of five at once takes five consecutive slots.
        let burst: Vec<Instant> = (0..5).map(|_| pacer.reserve(start)).collect();
        let expected: Vec<Instant> = (0..5).map(|slot| start + ms(100 * slot)).collect();
        assert_eq!(burst, expected);
        // One asking in the middle of the queue waits behind it.
        assert_eq!(pacer.reserve(start + ms(250)), start + ms(500));
        // After a pause, the next commit goes at once, the one after it
        // an interval later: idle time earns no burst.
        assert_eq!(pacer.reserve(start + ms(5_000)), start + ms(5_000));
        assert_eq!(pacer.reserve(start + ms(5_000)), start + ms(5_100));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(Pacer::new(bad).is_none(), "{bad}");
        }
    }

    /// Counts the calls that reach it; every call succeeds at once.
    #[derive(Debug, Default)]
    struct Counting {
        commits: AtomicUsize,
        others: AtomicUsize,
    }

    impl Counting {
        fn other(&self) {
            self.others.fetch_add(1, Ordering::SeqCst);
        }

        fn commit(&self) {
            self.commits.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[async_trait]
    impl Store for Counting {
        async fn get(&self, _key: &str) -> Result<Option<KeyValue>> {
            self.other();
            Ok(None)
        }

        async fn range(&self, _request: RangeRequest) -> Result<RangePage> {
            self.other();
            Err(StoreError::Closed)
        }

        async fn txn(&self, _txn: Txn) -> Result<TxnOutcome> {
            self.commit();
            Err(StoreError::Closed)
        }

        async fn watch(&self, _prefix: &str, _from: Revision) -> Result<WatchStream> {
            self.other();
            Err(StoreError::Closed)
        }

        async fn grant_lease(&self, _ttl: Duration) -> Result<LeaseId> {
            self.commit();
            Ok(1)
        }

        async fn keep_alive(&self, _lease: LeaseId) -> Result<Duration> {
            self.other();
            Ok(Duration::from_secs(3))
        }

        async fn revoke_lease(&self, _lease: LeaseId) -> Result<()> {
            self.commit();
            Ok(())
        }

        async fn compact(&self, _revision: Revision) -> Result<()> {
            self.commit();
            Ok(())
        }

        async fn current_revision(&self) -> Result<Revision> {
            self.other();
            Ok(1)
        }

        async fn snapshot(&self, _page: usize) -> Result<cca_store::Snapshot> {
            self.other();
            Err(StoreError::Closed)
        }

        fn max_txn_ops(&self) -> usize {
            128
        }
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_commits_pass_at_the_paced_rate_and_reads_do_not_wait() {
        let inner = Arc::new(Counting::default());
        let paced = Arc::new(paced(Arc::clone(&inner) as Arc<dyn Store>, 10.0).expect("paced"));
        let mut commits = tokio::task::JoinSet::new();
        for index in 0..40 {
            let paced = Arc::clone(&paced);
            commits.spawn(async move {
                match index % 4 {
                    0 => drop(paced.txn(Txn::new()).await),
                    1 => drop(paced.grant_lease(Duration::from_secs(3)).await),
                    2 => drop(paced.revoke_lease(1).await),
                    _ => drop(paced.compact(1).await),
                }
            });
        }
        tokio::task::yield_now().await;
        // 40 commits queued: a read, a keep-alive and the revision still
        // go through without the clock moving.
        let asked = Instant::now();
        paced.get("desired/x").await.expect("get");
        paced.keep_alive(1).await.expect("keep-alive");
        paced.current_revision().await.expect("revision");
        assert_eq!(Instant::now(), asked);
        assert_eq!(inner.others.load(Ordering::SeqCst), 3);
        // The paused clock jumps from slot to slot: slots 0, 100, …,
        // 1,000 ms have passed after 1.05 s, the rest wait.
        tokio::time::sleep(Duration::from_millis(1_050)).await;
        assert_eq!(inner.commits.load(Ordering::SeqCst), 11);
        tokio::time::sleep(Duration::from_millis(3_000)).await;
        assert_eq!(inner.commits.load(Ordering::SeqCst), 40);
        while commits.join_next().await.is_some() {}
    }
}
