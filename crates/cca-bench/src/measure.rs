//! Measurements and limits of the benchmark process itself: the store's
//! raw transaction rate (the ceiling every placement works against), the
//! CPU time and peak resident memory it used, and the open-file limit
//! thousands of agents need.

use std::collections::BTreeMap;
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

/// CPU time used so far by each thread of this process named one of
/// `names` (as far as the kernel keeps a name: 15 bytes), by thread id;
/// from `/proc/self/task`, empty where that cannot be read.
pub(crate) fn threads_cpu(names: &[&str]) -> BTreeMap<u32, Duration> {
    let ticks = rustix::param::clock_ticks_per_second().max(1);
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return BTreeMap::new();
    };
    tasks
        .filter_map(|task| {
            let task = task.ok()?;
            let id: u32 = task.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            let (name, used) = thread_cpu_ticks(&stat)?;
            names
                .iter()
                .any(|wanted| wanted.get(..KEPT_NAME_BYTES).unwrap_or(wanted) == name)
                .then(|| (id, Duration::from_secs_f64(used as f64 / ticks as f64)))
        })
        .collect()
}

/// Bytes of a thread's name the kernel keeps (16 with the NUL).
const KEPT_NAME_BYTES: usize = 15;

/// CPU spent between two [`threads_cpu`] readings by the threads alive at
/// the second (a thread that ended in between is not counted).
pub(crate) fn threads_cpu_since(
    before: &BTreeMap<u32, Duration>,
    now: &BTreeMap<u32, Duration>,
) -> Duration {
    now.iter()
        .map(|(id, used)| used.saturating_sub(before.get(id).copied().unwrap_or_default()))
        .sum()
}

/// A thread's name and user + system CPU ticks from its `stat` line:
/// `ID (NAME) STATE …`, the times the 12th and 13th fields after the name
/// (which may itself hold spaces and parentheses: the last `)` ends it).
fn thread_cpu_ticks(stat: &str) -> Option<(&str, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?;
    let mut fields = stat.get(close + 1..)?.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((name, user + system))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_stat_line_gives_its_name_and_cpu_ticks() {
        let stat = "4242 (cca-bench-plane) S 1 4242 4242 0 -1 4194368 912 0 0 0 \
                    150 25 0 0 20 0 9 0 1234 0 0";
        assert_eq!(thread_cpu_ticks(stat), Some(("cca-bench-plane", 175)));
        // A name with spaces and parentheses ends at the last `)`.
        let odd = "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 0 0";
        assert_eq!(thread_cpu_ticks(odd), Some(("a (b) c", 7)));
        assert_eq!(thread_cpu_ticks("7 (short) R 1"), None);
    }

    #[test]
    fn this_threads_cpu_is_found_by_its_name_and_grows() {
        let worker = std::thread::Builder::new()
            .name("cca-test-spin".into())
            .spawn(|| {
                let before = threads_cpu(&["cca-test-spin"]);
                let started = std::time::Instant::now();
                let mut spun = 0_u64;
                while started.elapsed() < Duration::from_millis(300) {
                    spun = std::hint::black_box(spun.wrapping_add(1));
                }
                let after = threads_cpu(&["cca-test-spin"]);
                (before, after)
            })
            .expect("a thread starts");
        let (before, after) = worker.join().expect("the thread ends");
        assert_eq!(after.len(), 1, "{after:?}");
        assert!(threads_cpu_since(&before, &after) > Duration::ZERO);
        assert!(threads_cpu(&["no-such-thread"]).is_empty());
        // A longer name is found by the part the kernel keeps.
        let long = std::thread::Builder::new()
            .name("cca-test-long-thread-name".into())
            .spawn(|| threads_cpu(&["cca-test-long-thread-name"]).len())
            .expect("a thread starts");
        assert_eq!(long.join().expect("the thread ends"), 1);
    }
}
