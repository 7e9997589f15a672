//! Store benchmarks, embedded and etcd side by side in one run (`cargo bench
//! -p cca-store`): the disk's raw fsync rate (the limit a durable store
//! works against), durable single-put transactions with 1 and with 64
//! concurrent writers, a range over 100k keys, and watch fan-out to 100
//! watchers. The fan-out's delivery-delay percentiles are printed after the
//! criterion groups. The etcd half is skipped, with a note, when
//! /usr/bin/etcd is missing (`scripts/test` installs it).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]
#![allow(missing_debug_implementations)]

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cca_store::embedded::{Config, EmbeddedStore};
use cca_store::etcd::EtcdStore;
use cca_store::{Op, RangeRequest, Store, Txn, WatchMessage};
use criterion::{BenchmarkId, Criterion, Throughput};
use tokio::runtime::Runtime;

const RANGE_KEYS: usize = 100_000;
const WATCHERS: usize = 100;
const FAN_OUT_PUTS: usize = 1_000;

struct Backend {
    name: &'static str,
    store: Arc<dyn Store>,
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn bench_fsync(c: &mut Criterion, dir: &std::path::Path) {
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(dir.join("fsync-probe"))
        .expect("probe file");
    let page = [0x42u8; 4096];
    let mut group = c.benchmark_group("disk");
    group.throughput(Throughput::Elements(1));
    group.bench_function("fsync_4k_write", |b| {
        b.iter(|| {
            file.seek(SeekFrom::Start(0)).expect("seek");
            file.write_all(&page).expect("write");
            file.sync_data().expect("fsync");
        })
    });
    group.finish();
}

fn put(i: u64) -> Txn {
    Txn::new().then(Op::put(
        format!("bench/put/{i:012}"),
        "0123456789abcdef0123456789abcdef",
    ))
}

fn bench_txns(c: &mut Criterion, rt: &Runtime, backends: &[Backend]) {
    let mut group = c.benchmark_group("durable_put");
    for backend in backends {
        group.throughput(Throughput::Elements(1));
        group.bench_function(BenchmarkId::new("1_writer", backend.name), |b| {
            b.iter_custom(|iters| {
                let store = Arc::clone(&backend.store);
                rt.block_on(async move {
                    let started = Instant::now();
                    for i in 0..iters {
                        store.txn(put(i)).await.expect("put");
                    }
                    started.elapsed()
                })
            })
        });
        group.throughput(Throughput::Elements(64));
        group.bench_function(BenchmarkId::new("64_writers", backend.name), |b| {
            b.iter_custom(|iters| {
                let store = Arc::clone(&backend.store);
                rt.block_on(concurrent_puts(store, 64, iters))
            })
        });
    }
    group.finish();
}

/// `writers` tasks each committing `per_writer` puts back to back.
async fn concurrent_puts(store: Arc<dyn Store>, writers: u64, per_writer: u64) -> Duration {
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|writer| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                for i in 0..per_writer {
                    store.txn(put(writer << 32 | i)).await.expect("put");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("writer");
    }
    started.elapsed()
}

async fn load_range_keys(store: &Arc<dyn Store>) {
    let tasks: Vec<_> = (0..8)
        .map(|writer| {
            let store = Arc::clone(store);
            tokio::spawn(async move {
                for chunk in (writer * 100..RANGE_KEYS).step_by(800) {
                    let txn = (chunk..chunk + 100).fold(Txn::new(), |txn, i| {
                        txn.then(Op::put(
                            format!("bench/range/{i:08}"),
                            format!("{{\"n\":{i}}}"),
                        ))
                    });
                    store.txn(txn).await.expect("load");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("loader");
    }
}

fn bench_range(c: &mut Criterion, rt: &Runtime, backends: &[Backend]) {
    let mut group = c.benchmark_group("range_100k_keys");
    group.sample_size(10);
    for backend in backends {
        rt.block_on(load_range_keys(&backend.store));
        group.bench_function(backend.name, |b| {
            b.iter(|| {
                let page = rt
                    .block_on(backend.store.range(RangeRequest::prefix("bench/range/")))
                    .expect("range");
                assert_eq!(page.kvs.len(), RANGE_KEYS);
            })
        });
    }
    group.finish();
}

/// Delivery delays of one put to every watcher, in microseconds: measured
/// from the moment the writer's txn call returned (commit acknowledged) and
/// from the moment it was sent.
struct FanOut {
    after_ack: Vec<f64>,
    after_send: Vec<f64>,
}

async fn measure_fan_out(store: Arc<dyn Store>) -> FanOut {
    let (receipts, mut inbox) = tokio::sync::mpsc::unbounded_channel();
    let mut watcher_tasks = Vec::new();
    for _ in 0..WATCHERS {
        let mut watch = store.watch("bench/fan/", 0).await.expect("watch");
        let receipts = receipts.clone();
        watcher_tasks.push(tokio::spawn(async move {
            while let Some(Ok(WatchMessage::Events { revision, .. })) = watch.next().await {
                if receipts.send((revision, Instant::now())).is_err() {
                    return;
                }
            }
        }));
    }
    let mut after_ack = Vec::new();
    let mut after_send = Vec::new();
    for i in 0..FAN_OUT_PUTS {
        let sent = Instant::now();
        let txn = Txn::new().then(Op::put("bench/fan/key", i.to_string()));
        let revision = store.txn(txn).await.expect("put").revision();
        let acked = Instant::now();
        let mut received = 0;
        while received < WATCHERS {
            let (seen, at) = inbox.recv().await.expect("receipt");
            if seen == revision {
                received += 1;
                after_ack.push(at.saturating_duration_since(acked).as_secs_f64() * 1e6);
                after_send.push(at.duration_since(sent).as_secs_f64() * 1e6);
            }
        }
    }
    for task in watcher_tasks {
        task.abort();
    }
    FanOut {
        after_ack,
        after_send,
    }
}

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index]
}

fn report_fan_out(rt: &Runtime, backends: &[Backend]) {
    println!("\nwatch fan-out: {FAN_OUT_PUTS} puts, each delivered to {WATCHERS} watchers");
    println!(
        "{:<10} {:>22} {:>22} {:>22} {:>22}",
        "backend",
        "p50 after ack (µs)",
        "p99 after ack (µs)",
        "p50 after send (µs)",
        "p99 after send (µs)"
    );
    for backend in backends {
        let mut fan_out = rt.block_on(measure_fan_out(Arc::clone(&backend.store)));
        println!(
            "{:<10} {:>22.0} {:>22.0} {:>22.0} {:>22.0}",
            backend.name,
            percentile(&mut fan_out.after_ack, 0.50),
            percentile(&mut fan_out.after_ack, 0.99),
            percentile(&mut fan_out.after_send, 0.50),
            percentile(&mut fan_out.after_send, 0.99),
        );
    }
}

fn main() {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("temp dir");
    let embedded = rt
        .block_on(EmbeddedStore::open(Config::new(
            dir.path().join("embedded"),
        )))
        .expect("open embedded store");
    let mut backends = vec![Backend {
        name: "embedded",
        store: Arc::new(embedded),
    }];
    let _etcd = if std::path::Path::new("/usr/bin/etcd").exists() {
        let server = cca_store::testing::etcd::EtcdServer::start();
        let config = cca_store::etcd::Config::new(vec![server.endpoint()]);
        let store = rt
            .block_on(EtcdStore::connect(config))
            .expect("connect etcd");
        backends.push(Backend {
            name: "etcd",
            store: Arc::new(store),
        });
        Some(server)
    } else {
        println!("note: /usr/bin/etcd missing; etcd benchmarks skipped (scripts/test installs it)");
        None
    };

    let mut criterion = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(5));
    bench_fsync(&mut criterion, dir.path());
    bench_txns(&mut criterion, &rt, &backends);
    bench_range(&mut criterion, &rt, &backends);
    criterion.final_summary();
    report_fan_out(&rt, &backends);
}
