//! Counters the request path updates from every worker thread at once —
//! request counts by class, latency histograms, requests in flight — kept
//! as one cache-line-sized shard per thread and summed when read. A value
//! every request writes, shared by all threads, moves its cache line from
//! core to core on each write; on a busy gate node that traffic, not the
//! arithmetic, is the cost (and a contended lock puts threads to sleep).
//! Reads (`/metrics`, `describe gate`, least
//! connections, the retry budget) add the shards up.
//!
//! A thread takes the next shard the first time it counts anything; there
//! are as many shards as the machine has cores (a power of two, at most
//! [`MAX_SHARDS`]), so worker threads rarely share one, and when they do
//! the sums stay exact: every shard is atomic.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// More shards than this buy nothing on the machines a gate runs on.
pub const MAX_SHARDS: usize = 16;

static SHARDS: LazyLock<usize> = LazyLock::new(|| {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .next_power_of_two()
        .min(MAX_SHARDS)
});

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

/// A thread's number before it has one.
const UNNUMBERED: usize = usize::MAX;

thread_local! {
    static THREAD: Cell<usize> = const { Cell::new(UNNUMBERED) };
}

/// The shard of the calling thread.
pub fn shard() -> usize {
    THREAD.with(|thread| {
        if thread.get() == UNNUMBERED {
            thread.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
        }
        thread.get()
    }) & (*SHARDS - 1)
}

/// Gives the calling thread shard `index`: the gate's workers take one
/// each, so that no two of them share one while there are enough.
pub fn claim(index: usize) {
    THREAD.with(|thread| thread.set(index));
}

/// One value per shard, each on a cache line of its own.
#[derive(Debug)]
pub struct Shards<T>(Box<[Padded<T>]>);

/// 128 bytes: a cache line, or the pair adjacent-line prefetchers fetch.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

impl<T: Default> Default for Shards<T> {
    fn default() -> Self {
        Self((0..*SHARDS).map(|_| Padded::default()).collect())
    }
}

impl<T> Shards<T> {
    /// The calling thread's shard.
    pub fn local(&self) -> &T {
        &self.0[shard() & (self.0.len() - 1)].0
    }

    /// The shard `index` (from [`shard`]).
    pub fn at(&self, index: usize) -> &T {
        &self.0[index & (self.0.len() - 1)].0
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.0.iter().map(|padded| &padded.0)
    }
}

/// A monotonic counter; clones count together.
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<Shards<AtomicU64>>);

impl Counter {
    pub fn inc(&self) {
        self.0.local().fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0
            .iter()
            .map(|shard| shard.load(Ordering::Relaxed))
            .sum()
    }
}

/// A count that goes up and down (requests in flight): a unit taken on
/// one thread may be given back on another, so the shards are signed and
/// only their sum means anything.
#[derive(Debug, Default)]
pub struct Gauge(Shards<AtomicI64>);

impl Gauge {
    /// Adds one on the calling thread's shard, and says which.
    pub fn inc(&self) -> usize {
        let shard = shard();
        self.0.at(shard).fetch_add(1, Ordering::Relaxed);
        shard
    }

    /// Takes one off shard `index` (where it was added, so that a
    /// thread's shard keeps its own line).
    pub fn dec(&self, index: usize) {
        self.0.at(index).fetch_sub(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> u32 {
        let sum: i64 = self
            .0
            .iter()
            .map(|shard| shard.load(Ordering::Relaxed))
            .sum();
        u32::try_from(sum.max(0)).unwrap_or(u32::MAX)
    }
}

/// Upper bounds of the latency buckets: 100 µs doubling to ~52 s.
pub const LATENCY_BUCKETS: usize = 20;
const FIRST_BUCKET_NANOS: u64 = 100_000;

#[derive(Debug, Default)]
struct HistogramShard {
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    buckets: [AtomicU64; LATENCY_BUCKETS + 1],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

/// A latency histogram with the buckets of [`LATENCY_BUCKETS`], in
/// seconds on `/metrics`; clones observe together.
#[derive(Clone, Debug, Default)]
pub struct Histogram(Arc<Shards<HistogramShard>>);

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let shard = self.0.local();
        shard.buckets[bucket(nanos)].fetch_add(1, Ordering::Relaxed);
        shard.count.fetch_add(1, Ordering::Relaxed);
        shard.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.0
            .iter()
            .map(|shard| shard.count.load(Ordering::Relaxed))
            .sum()
    }

    /// Sum in seconds, observations, and `(upper bound, observations)`
    /// per bucket (not cumulative), `+Inf` last.
    fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let mut buckets: Vec<(f64, u64)> = (0..=LATENCY_BUCKETS)
            .map(|index| (upper_bound_seconds(index), 0))
            .collect();
        let (mut count, mut sum_nanos) = (0u64, 0u64);
        for shard in self.0.iter() {
            for (total, bucket) in buckets.iter_mut().zip(&shard.buckets) {
                total.1 += bucket.load(Ordering::Relaxed);
            }
            count += shard.count.load(Ordering::Relaxed);
            sum_nanos = sum_nanos.wrapping_add(shard.sum_nanos.load(Ordering::Relaxed));
        }
        (sum_nanos as f64 / 1e9, count, buckets)
    }
}

/// The bucket of an observation of `nanos`: the first whose upper bound
/// is at least it.
fn bucket(nanos: u64) -> usize {
    if nanos <= FIRST_BUCKET_NANOS {
        return 0;
    }
    // The smallest k with FIRST << k >= nanos.
    let ratio = nanos.div_ceil(FIRST_BUCKET_NANOS);
    let k = (u64::BITS - (ratio - 1).leading_zeros()) as usize;
    k.min(LATENCY_BUCKETS)
}

fn upper_bound_seconds(index: usize) -> f64 {
    if index >= LATENCY_BUCKETS {
        return f64::INFINITY;
    }
    (FIRST_BUCKET_NANOS << index) as f64 / 1e9
}

impl TypedMetric for Counter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for Counter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, u64, u64>(&self.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.snapshot();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observation_lands_in_the_first_bucket_that_holds_it() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(100_000), 0, "100 µs is the first bound");
        assert_eq!(bucket(100_001), 1);
        assert_eq!(bucket(200_000), 1);
        assert_eq!(bucket(200_001), 2);
        assert_eq!(bucket(1_000_000), 4, "1 ms ≤ 1.6 ms");
        let last_bound = FIRST_BUCKET_NANOS << (LATENCY_BUCKETS - 1);
        assert_eq!(bucket(last_bound), LATENCY_BUCKETS - 1);
        assert_eq!(bucket(last_bound + 1), LATENCY_BUCKETS, "+Inf");
        assert_eq!(bucket(u64::MAX), LATENCY_BUCKETS);
        for index in 0..LATENCY_BUCKETS {
            let bound = FIRST_BUCKET_NANOS << index;
            assert!((upper_bound_seconds(index) - bound as f64 / 1e9).abs() < 1e-12);
        }
    }

    #[test]
    fn sums_are_exact_over_threads() {
        let counter = Counter::default();
        let gauge = Arc::new(Gauge::default());
        let histogram = Histogram::default();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (counter, gauge, histogram) =
                    (counter.clone(), Arc::clone(&gauge), histogram.clone());
                std::thread::spawn(move || {
                    // Taken here, given back on another thread below.
                    let taken: Vec<usize> = (0..100).map(|_| gauge.inc()).collect();
                    for _ in 0..1000 {
                        counter.inc();
                        histogram.observe(Duration::from_micros(150));
                    }
                    taken
                })
            })
            .collect();
        let taken: Vec<usize> = threads
            .into_iter()
            .flat_map(|thread| thread.join().expect("no panic"))
            .collect();
        assert_eq!(counter.get(), 8000);
        assert_eq!(gauge.get(), 800);
        for shard in taken.into_iter().take(700) {
            gauge.dec(shard);
        }
        assert_eq!(gauge.get(), 100);
        let (sum, count, buckets) = histogram.snapshot();
        assert_eq!(count, 8000);
        assert!((sum - 8000.0 * 150e-6).abs() < 1e-9, "{sum}");
        assert_eq!(buckets[1], (0.0002, 8000), "150 µs ≤ 200 µs");
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), 8000);
    }
}
