//! Measurements and limits of the benchmark process itself: the store's
//! raw transaction rate (the ceiling every placement works against), the
//! CPU time and peak resident memory it used, and the open-file limit
//! thousands of agents need.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cca_store::{Op, Store, Txn};
use tokio::time::Instant;

use crate::BenchError;

/// Where the transaction-rate probe writes; deleted afterwards.
const PROBE_PREFIX: &str = "bench/txn-rate/";
/// Concurrent writers of the probe, as many as the runner and API might.
const PROBE_WRITERS: usize = 64;

/// Single-put transactions per second that `store` commits with 64
/// concurrent writers during `window` — the same measure as the store's
/// own criterion benchmark. Leaves no key behind.
pub(crate) async fn store_txn_per_s(
    store: &Arc<dyn Store>,
    window: Duration,
) -> Result<f64, BenchError> {
    let committed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + window;
    let begun = Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..PROBE_WRITERS {
        let store = Arc::clone(store);
        let committed = Arc::clone(&committed);
        writers.spawn(async move {
            let key = format!("{PROBE_PREFIX}{writer}");
            while Instant::now() < deadline {
                let txn = Txn::new().then(Op::put(key.clone(), b"x".to_vec()));
                store.txn(txn).await?;
                committed.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), cca_store::StoreError>(())
        });
    }
    while let Some(joined) = writers.join_next().await {
        joined.map_err(|err| BenchError::Task {
            what: "transaction-rate probe".into(),
            problem: err.to_string(),
        })??;
    }
    let elapsed = begun.elapsed().as_secs_f64();
    store
        .txn(Txn::new().then(Op::delete_prefix(PROBE_PREFIX)))
        .await?;
    Ok(committed.load(Ordering::Relaxed) as f64 / elapsed.max(1e-9))
}

/// The process's peak resident set size in bytes (`VmHWM`), if readable.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}

/// CPU time (user and system, every thread) this process has used.
pub(crate) fn process_cpu() -> Duration {
    let spent = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    let seconds = u64::try_from(spent.tv_sec).unwrap_or(0);
    let nanos = u32::try_from(spent.tv_nsec).unwrap_or(0);
    Duration::new(seconds, nanos)
}

/// The soft open-file limit of this process (`None`: unlimited).
pub(crate) fn open_file_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Raises the soft open-file limit to at least `wanted` (up to the hard
/// limit, and the hard limit too when allowed): every simulated node holds
/// a few sockets. Returns the soft limit in force afterwards.
pub fn raise_open_file_limit(wanted: u64) -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let current = getrlimit(Resource::Nofile);
    let soft = current.current.unwrap_or(u64::MAX);
    if soft >= wanted {
        return soft;
    }
    let hard = current.maximum.unwrap_or(u64::MAX);
    let raised = Rlimit {
        current: Some(wanted),
        maximum: Some(hard.max(wanted)),
    };
    if setrlimit(Resource::Nofile, raised).is_ok() {
        return wanted;
    }
    let capped = Rlimit {
        current: Some(wanted.min(hard)),
        maximum: current.maximum,
    };
    match setrlimit(Resource::Nofile, capped) {
        Ok(()) => wanted.min(hard),
        Err(_) => soft,
    }
}
