//! The "Cluster DNS" figure of docs/benchmarks.md: answers per second from
//! one server on this machine, with latency, measured by `dnsperf` (Debian
//! package `dnsperf`; the benchmark requires it) against a map of 10,000
//! services — and, in the same run, the machine's own limit: the same tool
//! against a bare reply loop that only flips the QR bit of each query on
//! as many threads as the server has UDP loops.
//!
//! `cargo run --release -p cca-dns --example dnsperf -- [SECONDS] [RUNS]`
//! (defaults 10 s, 3 runs). Each run measures the bare loop, then the
//! server at full load (`dnsperf -q 200`: throughput), again with every
//! query's latency logged (`-v`, which costs dnsperf time: percentiles
//! under saturation), then at a fixed 20,000 queries per second with `-v`
//! (percentiles below saturation); the bare loop at full load and at the
//! fixed rate.

#![allow(clippy::print_stdout, reason = "a benchmark prints its results")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark stops on any failure"
)]

use std::fmt::Write as _;
use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cca_dns::{DnsConfig, DnsServer, Upstreams};
use cca_model::net::{Member, NetworkMap, ServiceNet};
use cca_model::spec::PortSpec;

const SERVICES: usize = 10_000;
/// Queries dnsperf keeps outstanding at full load.
const OUTSTANDING: &str = "200";
/// The fixed rate of the latency run: half of the goal, below saturation.
const FIXED_QPS: &str = "20000";

fn main() {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args.next().map_or(10, |arg| arg.parse().expect("SECONDS"));
    let runs: usize = args.next().map_or(3, |arg| arg.parse().expect("RUNS"));
    assert!(
        Command::new("dnsperf").arg("-h").output().is_ok(),
        "the benchmark needs dnsperf: apt-get install dnsperf"
    );
    let workers = DnsConfig::default().udp_workers;
    let dir = tempfile::tempdir().unwrap();
    let queries = dir.path().join("queries");
    std::fs::write(&queries, query_file()).unwrap();
    let queries = queries.to_str().unwrap().to_owned();
    println!(
        "{SERVICES} services, {workers} UDP loops, {} cores, {seconds} s per measurement",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    println!(
        "the answer function alone: {:.2} µs per query",
        answer_cost(&std::fs::read_to_string(&queries).unwrap())
    );
    let mut bare = Vec::new();
    let mut bare_fixed = Vec::new();
    let mut full = Vec::new();
    let mut full_logged = Vec::new();
    let mut fixed = Vec::new();
    for run in 1..=runs {
        let echo = BareLoop::start(workers);
        let limit = dnsperf(echo.address, &queries, seconds, &["-q", OUTSTANDING]);
        println!("run {run}: bare reply loop at full load {}", limit.line());
        bare.push(limit);
        let paced = dnsperf(
            echo.address,
            &queries,
            seconds,
            &["-q", OUTSTANDING, "-Q", FIXED_QPS, "-v"],
        );
        println!(
            "run {run}: bare reply loop at {FIXED_QPS} q/s {}",
            paced.line()
        );
        bare_fixed.push(paced);
        drop(echo);

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .unwrap();
        let (address, stop) = runtime.block_on(async {
            let mut config = DnsConfig::new(vec!["127.0.0.1:0".parse().unwrap()]);
            config.upstreams = Upstreams::Fixed(Vec::new());
            let server = DnsServer::bind(config, Arc::new(map())).await.unwrap();
            let address = server.local_addrs()[0];
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(server.run(async {
                let _ = stopped.await;
            }));
            (address, stop)
        });
        let loaded = dnsperf(address, &queries, seconds, &["-q", OUTSTANDING]);
        println!("run {run}: cca-dns at full load {}", loaded.line());
        full.push(loaded);
        let logged = dnsperf(address, &queries, seconds, &["-q", OUTSTANDING, "-v"]);
        println!(
            "run {run}: cca-dns at full load, each query logged {}",
            logged.line()
        );
        full_logged.push(logged);
        let paced = dnsperf(
            address,
            &queries,
            seconds,
            &["-q", OUTSTANDING, "-Q", FIXED_QPS, "-v"],
        );
        println!("run {run}: cca-dns at {FIXED_QPS} q/s {}", paced.line());
        fixed.push(paced);
        let _ = stop.send(());
        runtime.shutdown_timeout(Duration::from_secs(1));
    }
    println!();
    let figures: [Figure<'_>; 12] = [
        (
            "bare reply loop at full load, q/s (the machine's limit)",
            &bare,
            |r| r.qps,
        ),
        (
            "bare reply loop at the fixed rate, p50 ms",
            &bare_fixed,
            |r| r.p50_ms,
        ),
        (
            "bare reply loop at the fixed rate, p99 ms",
            &bare_fixed,
            |r| r.p99_ms,
        ),
        (
            "bare reply loop at the fixed rate, p99.9 ms",
            &bare_fixed,
            |r| r.p999_ms,
        ),
        ("cca-dns at full load, q/s", &full, |r| r.qps),
        ("cca-dns at full load, lost queries", &full, |r| {
            r.lost as f64
        }),
        ("cca-dns at full load with -v, q/s", &full_logged, |r| r.qps),
        ("cca-dns at full load with -v, p50 ms", &full_logged, |r| {
            r.p50_ms
        }),
        ("cca-dns at full load with -v, p99 ms", &full_logged, |r| {
            r.p99_ms
        }),
        ("cca-dns at the fixed rate, p50 ms", &fixed, |r| r.p50_ms),
        ("cca-dns at the fixed rate, p99 ms", &fixed, |r| r.p99_ms),
        ("cca-dns at the fixed rate, p99.9 ms", &fixed, |r| r.p999_ms),
    ];
    println!("fixed rate: {FIXED_QPS} q/s; min / median / max of {runs} runs");
    for (label, measured, figure) in figures {
        summary(label, measured, figure);
    }
}

/// 10,000 services with a VIP and a named port; every tenth stateful
/// with three ordinals.
fn map() -> NetworkMap {
    let mut map = NetworkMap::default();
    for index in 0..SERVICES {
        let name = format!("svc-{index}");
        let members = if index % 10 == 0 {
            (0..3)
                .map(|ordinal| Member {
                    instance: format!("{name}-{ordinal}"),
                    node: "n1".into(),
                    address: [10, 42, (index % 250) as u8, ordinal as u8 + 2].into(),
                    ordinal: Some(ordinal),
                    host_network: false,
                })
                .collect()
        } else {
            Vec::new()
        };
        let service = ServiceNet {
            name: name.clone(),
            vip: Some([10, 43, (index / 256) as u8, (index % 256) as u8].into()),
            ports: vec![PortSpec::tcp("http", 8080)],
            affinity: Default::default(),
            endpoints: Default::default(),
            members,
            asleep: false,
            scale_to_zero: None,
        };
        map.services.insert(name, Arc::new(service));
    }
    map
}

/// One query per service in a fixed shuffled order: mostly A records of
/// service names, with ordinal names, SRV names and misses mixed in.
fn query_file() -> String {
    let mut rng = fastrand::Rng::with_seed(42);
    let mut order: Vec<usize> = (0..SERVICES).collect();
    rng.shuffle(&mut order);
    let mut text = String::new();
    for (line, index) in order.into_iter().enumerate() {
        let _ = match line % 20 {
            0 => writeln!(
                text,
                "svc-{}-1.svc-{}.cca.local A",
                index / 10 * 10,
                index / 10 * 10
            ),
            1 => writeln!(text, "_http._tcp.svc-{index}.cca.local SRV"),
            2 => writeln!(text, "missing-{index}.cca.local A"),
            _ => writeln!(text, "svc-{index}.cca.local A"),
        };
    }
    text
}

/// The pure answer function's cost per query over the query file, in µs:
/// what the server spends besides the sockets.
fn answer_cost(queries: &str) -> f64 {
    use hickory_proto::op::{Message, MessageType, OpCode, Query};
    use hickory_proto::rr::{Name, RecordType};
    let packets: Vec<Vec<u8>> = queries
        .lines()
        .map(|line| {
            let (name, rtype) = line.split_once(' ').unwrap();
            let mut message = Message::new(7, MessageType::Query, OpCode::Query);
            message.metadata.recursion_desired = true;
            let rtype = if rtype == "SRV" {
                RecordType::SRV
            } else {
                RecordType::A
            };
            message.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
            message.to_vec().unwrap()
        })
        .collect();
    let map = map();
    let mut out = Vec::new();
    let started = std::time::Instant::now();
    let mut answered = 0u64;
    while started.elapsed() < Duration::from_secs(1) {
        for packet in &packets {
            cca_dns::answer::answer(packet, &map, cca_dns::Transport::Udp, &mut out);
        }
        answered += packets.len() as u64;
    }
    started.elapsed().as_secs_f64() * 1e6 / answered as f64
}

/// A line of the summary: its label, the runs, the figure of each.
type Figure<'a> = (&'a str, &'a [Measured], fn(&Measured) -> f64);

/// What one dnsperf run measured.
#[derive(Debug, Default)]
struct Measured {
    qps: f64,
    average_ms: f64,
    lost: u64,
    /// From `-v`'s per-query latencies; zero without it.
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
}

impl Measured {
    fn line(&self) -> String {
        let mut line = format!(
            "{:.0} q/s, average {:.3} ms, {} lost",
            self.qps, self.average_ms, self.lost
        );
        if self.p99_ms > 0.0 {
            let _ = write!(
                line,
                ", p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms",
                self.p50_ms, self.p99_ms, self.p999_ms
            );
        }
        line
    }
}

fn dnsperf(server: SocketAddr, queries: &str, seconds: u64, extra: &[&str]) -> Measured {
    let output = Command::new("dnsperf")
        .args([
            "-s",
            &server.ip().to_string(),
            "-p",
            &server.port().to_string(),
        ])
        .args(["-d", queries, "-l", &seconds.to_string(), "-t", "2"])
        .args(extra)
        .output()
        .expect("dnsperf runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "dnsperf failed: {text}");
    let value = |label: &str| -> f64 {
        let line = text
            .lines()
            .find(|line| line.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no {label:?} in dnsperf's output: {text}"));
        line.split(':')
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|number| number.parse().ok())
            .unwrap_or_else(|| panic!("cannot read {line:?}"))
    };
    let mut latencies: Vec<f64> = text
        .lines()
        .filter(|line| line.starts_with("> "))
        .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
        .collect();
    latencies.sort_by(f64::total_cmp);
    let percentile = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let at = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len());
        latencies[at - 1] * 1000.0
    };
    Measured {
        qps: value("Queries per second"),
        average_ms: value("Average Latency (s)") * 1000.0,
        lost: value("Queries lost") as u64,
        p50_ms: percentile(0.50),
        p99_ms: percentile(0.99),
        p999_ms: percentile(0.999),
    }
}

/// The machine's limit: receive, flip QR, send back, on `threads` threads
/// sharing one socket, as the server's loops do.
struct BareLoop {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BareLoop {
    fn start(threads: usize) -> BareLoop {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let address = socket.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let socket = socket.try_clone().unwrap();
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut packet = [0u8; 4096];
                    while !stop.load(Ordering::Relaxed) {
                        let Ok((len, peer)) = socket.recv_from(&mut packet) else {
                            continue;
                        };
                        if len > 2 {
                            packet[2] |= 0x80;
                            let _ = socket.send_to(&packet[..len], peer);
                        }
                    }
                })
            })
            .collect();
        BareLoop {
            address,
            stop,
            threads,
        }
    }
}

impl Drop for BareLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Prints min, median and max of one figure over the runs.
fn summary(label: &str, runs: &[Measured], figure: impl Fn(&Measured) -> f64) {
    let mut values: Vec<f64> = runs.iter().map(figure).collect();
    values.sort_by(f64::total_cmp);
    if values.is_empty() {
        return;
    }
    println!(
        "{label}: min {:.3}, median {:.3}, max {:.3}",
        values[0],
        values[values.len() / 2],
        values[values.len() - 1]
    );
}
