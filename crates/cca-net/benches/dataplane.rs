//! The data plane's figures (issue 13, item 8), measured with real traffic
//! in a throwaway node namespace (`tests/support/lab.rs`): TCP throughput
//! and request latency through a VIP beside the same to the backend's
//! address and to loopback (the machine's own limit); first-packet
//! latency (TCP connect) through a VIP at 100 and at 30,000 VIPs; the time
//! from `sync` to the kernel holding one endpoint change at 1,000 and
//! 10,000 services; backend replacement under steady UDP and TCP load;
//! the eBPF data plane beside nftables and direct, from the node's own
//! processes (socket programs) and from a container (tc programs), and
//! its rebuild, endpoint change and map memory at 1,000 and 10,000
//! services.
//! Each figure is measured `CCA_BENCH_RUNS` times (default 3) and printed
//! as min / median / max in Markdown; `CCA_BENCH_ONLY` (comma-separated:
//! traffic, replacement, first-packet, changes, ebpf) picks sections. Needs root
//! (namespaces, nftables); without it, says so and exits. Run: `cargo
//! bench -p cca-net --bench dataplane`.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    reason = "a benchmark reports on stdout and fails loudly"
)]

#[path = "../tests/support/lab.rs"]
mod lab;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use cca_model::net::{AddressRanges, NetworkChange, NetworkMap, ServiceNet, Touched};
use cca_net::dataplane::{Batch, DataPlane, DataPlaneConfig, Nft, PacketFilter, UdpCleanup};
use cca_net::ebpf::{AttachConfig, Attached, EbpfPlane};

use lab::{Lab, TCP_PORT, in_netns};

const VIP_TCP: u16 = 80;
const VIP_UDP: u16 = 53;
const NODE: &str = "bench-node";

/// The `index`th VIP of the benchmark's service range (10.96.0.0/16).
fn vip(index: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + index + 1)
}

fn service(name: &str, vip: Ipv4Addr, targets: &[Ipv4Addr]) -> ServiceNet {
    assert_eq!((VIP_TCP, VIP_UDP), (80, 53), "the lab's service ports");
    let named: Vec<(String, Ipv4Addr)> = targets
        .iter()
        .enumerate()
        .map(|(i, address)| (format!("{name}-{i}"), *address))
        .collect();
    lab::http_dns_service(name, vip, NODE, &named)
}

/// The real filter, timing its two kinds of kernel calls.
#[derive(Debug, Default)]
struct Timed {
    nft: Nft,
    applies: std::sync::Mutex<Vec<Duration>>,
    conntrack: std::sync::Mutex<Vec<Duration>>,
}

impl PacketFilter for Timed {
    fn apply(&self, batch: &Batch) -> cca_net::dataplane::Result<()> {
        let started = Instant::now();
        let result = self.nft.apply(batch);
        self.applies.lock().unwrap().push(started.elapsed());
        result
    }

    fn list_table(&self, table: &str) -> cca_net::dataplane::Result<Option<String>> {
        self.nft.list_table(table)
    }

    fn delete_table(&self, table: &str) -> cca_net::dataplane::Result<()> {
        self.nft.delete_table(table)
    }

    fn delete_conntrack(&self, cleanup: &UdpCleanup) -> cca_net::dataplane::Result<usize> {
        let started = Instant::now();
        let result = self.nft.delete_conntrack(cleanup);
        if !cleanup.is_empty() {
            self.conntrack.lock().unwrap().push(started.elapsed());
        }
        result
    }
}

struct Plane {
    plane: DataPlane<Timed>,
    node: String,
    map: NetworkMap,
}

impl Plane {
    fn new(lab: &Lab) -> Plane {
        let config = DataPlaneConfig {
            table: format!("cca-svc-{}", lab.tag),
            node: NODE.into(),
        };
        Plane {
            plane: DataPlane::new(config, Timed::default()).unwrap(),
            node: lab.node.clone(),
            map: NetworkMap::default(),
        }
    }

    /// Replaces the whole map and rebuilds the table; returns how long.
    fn rebuild(&mut self, services: Vec<ServiceNet>) -> Duration {
        let mut map = NetworkMap::default();
        let mut touched = Touched::default();
        for service in services {
            map.apply(NetworkChange::Service(Arc::new(service)), &mut touched);
        }
        self.map = map;
        let (map, plane) = (&self.map, &mut self.plane);
        let started = Instant::now();
        in_netns(&self.node, || plane.resync(map)).unwrap();
        started.elapsed()
    }

    /// Puts one service and syncs; returns how long `sync` took and the
    /// transaction's size.
    fn put(&mut self, service: ServiceNet) -> (Duration, usize) {
        let mut touched = Touched::default();
        self.map
            .apply(NetworkChange::Service(Arc::new(service)), &mut touched);
        let (map, plane) = (&self.map, &mut self.plane);
        let started = Instant::now();
        let report = in_netns(&self.node, || plane.sync(map, &touched)).unwrap();
        (started.elapsed(), report.commands)
    }
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort_unstable();
    let rank = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[rank.min(samples.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One figure's values over the runs.
#[derive(Default)]
struct Figures(BTreeMap<String, Vec<f64>>);

impl Figures {
    fn add(&mut self, name: &str, value: f64) {
        self.0.entry(name.to_owned()).or_default().push(value);
    }

    /// `{what} p50/p99/max at {count} services (ms)` of `samples`.
    fn add_percentiles(&mut self, what: &str, count: u32, samples: &mut [Duration]) {
        for (name, p) in [("p50", 0.5), ("p99", 0.99), ("max", 1.0)] {
            self.add(
                &format!("{what} {name} at {count} services (ms)"),
                ms(percentile(samples, p)),
            );
        }
    }

    fn print(&self, names: &[&str]) {
        println!("| figure | min | median | max |");
        println!("|---|---:|---:|---:|");
        for name in names {
            let Some(values) = self.0.get(*name) else {
                continue;
            };
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            let median = sorted[sorted.len() / 2];
            println!(
                "| {name} | {:.3} | {:.3} | {:.3} |",
                sorted[0],
                median,
                sorted[sorted.len() - 1]
            );
        }
        println!();
    }
}

/// Reads `bytes` answered to a `bulk` request: MB/s.
fn throughput(netns: &str, to: SocketAddr, bytes: usize) -> f64 {
    in_netns(netns, || {
        let mut stream = TcpStream::connect(to).unwrap();
        let started = Instant::now();
        stream
            .write_all(format!("bulk {bytes}\n").as_bytes())
            .unwrap();
        let mut buffer = vec![0u8; 256 * 1024];
        let mut left = bytes;
        while left > 0 {
            let n = stream.read(&mut buffer).unwrap();
            assert!(n > 0, "the server closed early");
            left = left.saturating_sub(n);
        }
        bytes as f64 / started.elapsed().as_secs_f64() / 1e6
    })
}

/// `count` requests on one connection: p50, p99 in ms.
fn persistent_latency(netns: &str, to: SocketAddr, count: usize) -> (f64, f64) {
    in_netns(netns, || {
        let stream = TcpStream::connect(to).unwrap();
        stream.set_nodelay(true).unwrap();
        let mut writer = stream.try_clone().unwrap();
        let mut reader = BufReader::new(stream);
        let mut samples = Vec::with_capacity(count);
        let mut line = String::new();
        for _ in 0..count {
            let started = Instant::now();
            writer.write_all(b"who\n").unwrap();
            line.clear();
            reader.read_line(&mut line).unwrap();
            samples.push(started.elapsed());
        }
        (
            ms(percentile(&mut samples, 0.5)),
            ms(percentile(&mut samples, 0.99)),
        )
    })
}

/// `count` connections, each connect + one request: connect p50/p99 and
/// request (connect included) p50/p99, in ms.
fn new_connection_latency(netns: &str, to: SocketAddr, count: usize) -> [f64; 4] {
    in_netns(netns, || {
        let mut connects = Vec::with_capacity(count);
        let mut requests = Vec::with_capacity(count);
        for _ in 0..count {
            let started = Instant::now();
            let mut stream = TcpStream::connect(to).unwrap();
            connects.push(started.elapsed());
            stream.set_nodelay(true).unwrap();
            stream.write_all(b"who\n").unwrap();
            lab::read_line(&mut stream).unwrap();
            requests.push(started.elapsed());
        }
        [
            ms(percentile(&mut connects, 0.5)),
            ms(percentile(&mut connects, 0.99)),
            ms(percentile(&mut requests, 0.5)),
            ms(percentile(&mut requests, 0.99)),
        ]
    })
}

fn traffic(figures: &mut Figures, lab: &Lab, plane: &mut Plane) {
    let (a, client) = (lab.instance("i0"), lab.instance("i2"));
    plane.rebuild(vec![service("web", vip(0), &[a.address])]);
    let through_vip = SocketAddr::from((vip(0), VIP_TCP));
    let direct = SocketAddr::from((a.address, TCP_PORT));
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, TCP_PORT));
    const BYTES: usize = 256 << 20;
    // Interleaved, three rounds each, so drift in the machine's load hits
    // all alike; the median round counts.
    let (mut vip_mbs, mut direct_mbs, mut loopback_mbs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        vip_mbs.push(throughput(&client.netns, through_vip, BYTES));
        direct_mbs.push(throughput(&client.netns, direct, BYTES));
        loopback_mbs.push(throughput(&a.netns, loopback, BYTES));
    }
    let (vip_mbs, direct_mbs) = (median(vip_mbs), median(direct_mbs));
    figures.add("throughput via VIP (MB/s)", vip_mbs);
    figures.add("throughput direct (MB/s)", direct_mbs);
    figures.add(
        "throughput loopback, the machine's limit (MB/s)",
        median(loopback_mbs),
    );
    figures.add("throughput VIP / direct", vip_mbs / direct_mbs);

    let (mut vip_lat, mut dir_lat, mut lo_lat) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        vip_lat.push(persistent_latency(&client.netns, through_vip, 3000));
        dir_lat.push(persistent_latency(&client.netns, direct, 3000));
        lo_lat.push(persistent_latency(&a.netns, loopback, 3000));
    }
    let pick = |rounds: &[(f64, f64)], p99: bool| {
        median(
            rounds
                .iter()
                .map(|(p50, p99v)| if p99 { *p99v } else { *p50 })
                .collect(),
        )
    };
    let (vip50, vip99) = (pick(&vip_lat, false), pick(&vip_lat, true));
    let (dir50, dir99) = (pick(&dir_lat, false), pick(&dir_lat, true));
    let (lo50, lo99) = (pick(&lo_lat, false), pick(&lo_lat, true));
    figures.add("request p50 via VIP (ms)", vip50);
    figures.add("request p99 via VIP (ms)", vip99);
    figures.add("request p50 direct (ms)", dir50);
    figures.add("request p99 direct (ms)", dir99);
    figures.add("request p50 loopback (ms)", lo50);
    figures.add("request p99 loopback (ms)", lo99);
    figures.add("request p99 VIP / direct", vip99 / dir99);

    let vip_new = new_connection_latency(&client.netns, through_vip, 1000);
    let dir_new = new_connection_latency(&client.netns, direct, 1000);
    figures.add("connect+request p50 via VIP (ms)", vip_new[2]);
    figures.add("connect+request p99 via VIP (ms)", vip_new[3]);
    figures.add("connect+request p50 direct (ms)", dir_new[2]);
    figures.add("connect+request p99 direct (ms)", dir_new[3]);
    figures.add("connect+request p99 VIP / direct", vip_new[3] / dir_new[3]);
}

/// Connect times through one VIP among `count`.
fn first_packet(figures: &mut Figures, lab: &Lab, plane: &mut Plane, count: u32) {
    let (a, b, client) = (lab.instance("i0"), lab.instance("i1"), lab.instance("i2"));
    let services = (0..count)
        .map(|i| service(&format!("s{i}"), vip(i), &[a.address, b.address]))
        .collect();
    let rebuild = plane.rebuild(services);
    figures.add(&format!("rebuild at {count} VIPs (ms)"), ms(rebuild));
    // The last VIP and one in the middle: no position is cheaper.
    let mut p50 = Vec::new();
    let mut p99 = Vec::new();
    for index in [count / 2, count - 1] {
        let [c50, c99, _, _] =
            new_connection_latency(&client.netns, SocketAddr::from((vip(index), VIP_TCP)), 1000);
        p50.push(c50);
        p99.push(c99);
    }
    figures.add(
        &format!("connect p50 at {count} VIPs (ms)"),
        p50.iter().copied().fold(0.0, f64::max),
    );
    figures.add(
        &format!("connect p99 at {count} VIPs (ms)"),
        p99.iter().copied().fold(0.0, f64::max),
    );
}

/// The `k`th backend (1-3) of the benchmark's service `i`.
fn backend(i: u32, k: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 100, 0, 0)) + i * 4 + k)
}

/// Service `i` with its three backends.
fn full(i: u32) -> ServiceNet {
    service(
        &format!("s{i}"),
        vip(i),
        &[backend(i, 1), backend(i, 2), backend(i, 3)],
    )
}

/// One endpoint change at a time on a node holding `count` services with
/// three backends each: sync p50/p99/max and the transaction's size.
fn endpoint_changes(figures: &mut Figures, lab: &Lab, plane: &mut Plane, count: u32) {
    plane.rebuild((0..count).map(full).collect());
    let mut samples = Vec::new();
    let mut commands = 0;
    let mut rng = fastrand::Rng::with_seed(u64::from(count));
    plane.plane.filter().applies.lock().unwrap().clear();
    plane.plane.filter().conntrack.lock().unwrap().clear();
    let mut last = 0;
    for round in 0..200 {
        let i = rng.u32(0..count);
        last = i;
        // Odd rounds take a backend away, even rounds bring it back.
        let mut next = full(i);
        if round % 2 == 0 {
            next = service(&format!("s{i}"), vip(i), &[backend(i, 1), backend(i, 2)]);
        }
        let (took, size) = plane.put(next);
        samples.push(took);
        commands = commands.max(size);
        if round % 2 == 0 {
            // Back to full so the next change starts from three.
            let (took, _) = plane.put(full(i));
            samples.push(took);
        }
    }
    // The kernel holds the last change: the last service touched has its
    // third backend back in map `addr-2`.
    let table = plane.plane.config().table.clone();
    let listing = in_netns(&lab.node, || {
        lab::run("nft", &["list", "map", "ip", &table, "addr-2"])
    });
    assert!(listing.contains(&backend(last, 3).to_string()), "{listing}");
    figures.add_percentiles("sync", count, &mut samples);
    let mut applies = plane.plane.filter().applies.lock().unwrap().clone();
    let mut conntrack = plane.plane.filter().conntrack.lock().unwrap().clone();
    figures.add(
        &format!("nft apply p50 at {count} services (ms)"),
        ms(percentile(&mut applies, 0.5)),
    );
    figures.add(
        &format!("nft apply p99 at {count} services (ms)"),
        ms(percentile(&mut applies, 0.99)),
    );
    figures.add(
        &format!("UDP conntrack cleanup p50 at {count} services (ms)"),
        ms(percentile(&mut conntrack, 0.5)),
    );
    figures.add(
        &format!("commands per change at {count} services"),
        commands as f64,
    );
}

/// A BPF file system of the benchmark's own; unmounting it detaches and
/// frees what the eBPF section left.
struct Bpffs(std::path::PathBuf);

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The eBPF data plane beside nftables: throughput and request latency
/// through a VIP each plane serves and to the backend directly, from the
/// node's own processes and from a container; then, at `counts`
/// services, the rebuild, one endpoint change's sync p50/p99/max and the
/// maps' memory.
fn ebpf(figures: &mut Figures, lab: &Lab, plane: &mut Plane, counts: &[u32]) {
    let bpffs = Bpffs(std::env::temp_dir().join(format!("cca-bench-bpffs-{}", lab.tag)));
    let config = AttachConfig {
        bpffs: bpffs.0.clone(),
        cgroup: None,
        seed: 7,
    };
    let attached = in_netns(&lab.node, || Attached::open(&config)).unwrap();
    let mut ebpf = EbpfPlane::new(attached, config.seed);
    let a = lab.instance("i0");
    // vip(0) is nftables' (output DNAT), vip(1) the socket programs'.
    plane.rebuild(vec![service("nft", vip(0), &[a.address])]);
    let mut map = NetworkMap::default();
    let mut touched = Touched::default();
    map.apply(NetworkChange::Ranges(ranges()), &mut touched);
    map.apply(
        NetworkChange::Service(Arc::new(service("bpf", vip(1), &[a.address]))),
        &mut touched,
    );
    in_netns(&lab.node, || ebpf.resync(&map)).unwrap();
    let node = |to| (lab.node.as_str(), to);
    side_by_side(
        figures,
        "node",
        [
            node(SocketAddr::from((vip(1), VIP_TCP))),
            node(SocketAddr::from((vip(0), VIP_TCP))),
            node(SocketAddr::from((a.address, TCP_PORT))),
        ],
    );
    containers(figures, lab, &ebpf);

    for count in counts {
        let mut map = NetworkMap::default();
        let mut touched = Touched::default();
        for i in 0..*count {
            map.apply(NetworkChange::Service(Arc::new(full(i))), &mut touched);
        }
        let started = Instant::now();
        in_netns(&lab.node, || ebpf.resync(&map)).unwrap();
        figures.add(
            &format!("eBPF rebuild at {count} services (ms)"),
            ms(started.elapsed()),
        );
        let mut samples = Vec::new();
        let mut ops = 0;
        let mut rng = fastrand::Rng::with_seed(u64::from(*count));
        for round in 0..400 {
            let i = rng.u32(0..*count);
            // Even rounds take a backend away, odd ones bring it back.
            let next = if round % 2 == 0 {
                service(&format!("s{i}"), vip(i), &[backend(i, 1), backend(i, 2)])
            } else {
                full(i)
            };
            let mut touched = Touched::default();
            map.apply(NetworkChange::Service(Arc::new(next)), &mut touched);
            let started = Instant::now();
            let report = in_netns(&lab.node, || ebpf.sync(&map, &touched)).unwrap();
            samples.push(started.elapsed());
            ops = ops.max(report.ops);
        }
        figures.add_percentiles("eBPF sync", *count, &mut samples);
        figures.add(
            &format!("eBPF map operations per change at {count} services"),
            ops as f64,
        );
        let memory: u64 = ebpf.maps().memory().unwrap().values().sum();
        figures.add(
            &format!("eBPF map memory at {count} services (MiB)"),
            memory as f64 / (1 << 20) as f64,
        );
    }
    in_netns(&lab.node, || ebpf.remove()).unwrap();
}

/// The service range the eBPF sections' maps hold (the tc programs
/// look up only packets to it).
fn ranges() -> AddressRanges {
    AddressRanges {
        cluster: "10.244.0.0/16".parse().unwrap(),
        services: "10.96.0.0/16".parse().unwrap(),
        flow_hash_seed: None,
    }
}

/// Containers through a VIP (the tc programs' side), with the same
/// backend as `ebpf`'s: instance `i2`, whose veth has the tc programs,
/// to the eBPF VIP; `i3`, whose veth has none, to the nftables VIP and
/// to the backend directly. Throughput, request p99 on one connection
/// (every packet crosses the programs) and connect+request p99 (a new
/// flow each).
fn containers(figures: &mut Figures, lab: &Lab, ebpf: &EbpfPlane<Attached>) {
    let (a, tc_client, plain) = (lab.instance("i0"), lab.instance("i2"), lab.instance("i3"));
    in_netns(&lab.node, || ebpf.veth_programs().attach("v2")).unwrap();
    side_by_side(
        figures,
        "container",
        [
            (
                tc_client.netns.as_str(),
                SocketAddr::from((vip(1), VIP_TCP)),
            ),
            (plain.netns.as_str(), SocketAddr::from((vip(0), VIP_TCP))),
            (
                plain.netns.as_str(),
                SocketAddr::from((a.address, TCP_PORT)),
            ),
        ],
    );
    let flows = ebpf.stats().unwrap()["tc_flows"];
    assert!(flows > 0, "the tc programs balanced none of the flows");
}

/// The three paths `side_by_side` compares, in the order it takes them.
const PATHS: [&str; 3] = ["eBPF VIP", "nftables VIP", "direct"];

/// What `side_by_side` measures of each path, with its unit.
const MEASURES: [(&str, &str); 3] = [
    ("throughput via", "MB/s"),
    ("request p99 via", "ms"),
    ("connect+request p99 via", "ms"),
];

/// The names of `side_by_side`'s figures for `from`.
fn side_by_side_names(from: &str) -> Vec<String> {
    MEASURES
        .iter()
        .flat_map(|(what, unit)| {
            PATHS
                .iter()
                .map(move |path| format!("{from}: {what} {path} ({unit})"))
                .chain([format!("{from}: {what} eBPF VIP / direct")])
        })
        .collect()
}

/// Throughput, request p99 on one connection (every packet crosses
/// whatever balances it) and connect+request p99 (a new flow each) from
/// each `(namespace, address)` of `paths` (in `PATHS`' order), five
/// rounds interleaved in a rotating order so the machine's drift hits
/// all alike; the median round of each is the figure.
fn side_by_side(figures: &mut Figures, from: &str, paths: [(&str, SocketAddr); 3]) {
    const BYTES: usize = 256 << 20;
    const ROUNDS: usize = 5;
    let mut rounds: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
    for round in 0..ROUNDS {
        for turn in 0..paths.len() {
            let path = (round + turn) % paths.len();
            let (netns, to) = paths[path];
            let values = [
                throughput(netns, to, BYTES),
                persistent_latency(netns, to, 3000).1,
                new_connection_latency(netns, to, 500)[3],
            ];
            for (measure, value) in values.into_iter().enumerate() {
                rounds.entry((measure, path)).or_default().push(value);
            }
        }
    }
    for (measure, (what, unit)) in MEASURES.iter().enumerate() {
        let figure = |path: usize| median(rounds[&(measure, path)].clone());
        for (path, name) in PATHS.iter().enumerate() {
            figures.add(&format!("{from}: {what} {name} ({unit})"), figure(path));
        }
        figures.add(
            &format!("{from}: {what} eBPF VIP / direct"),
            figure(0) / figure(2),
        );
    }
}

/// The median of `values`.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Replaces backends under steady UDP (4 sockets, each one flow, a
/// datagram each 1 ms) and TCP (a new connection each 2 ms) load: a,b ->
/// b,c -> c,a -> a,b, each step removing one backend and adding one.
fn replacement(figures: &mut Figures, lab: &Lab, plane: &mut Plane) {
    let [a, b, c] = ["i0", "i1", "i3"].map(|n| lab.instance(n));
    let client = lab.instance("i2");
    plane.rebuild(vec![service("web", vip(0), &[a.address, b.address])]);
    for instance in [a, b, c] {
        instance.datagrams.lock().unwrap().clear();
    }
    let stop = Arc::new(AtomicBool::new(false));
    // Per socket, the next sequence number: its high 16 bits name the socket.
    let next: Arc<Vec<AtomicU64>> = Arc::new((0..4u64).map(|s| AtomicU64::new(s << 48)).collect());
    let udp_errors = Arc::new(AtomicU64::new(0));
    let tcp_failed = Arc::new(AtomicU64::new(0));
    let tcp_answers = Arc::new(std::sync::Mutex::new(Vec::<(Instant, String)>::new()));
    let mut load = Vec::new();
    for socket in 0..4usize {
        let udp = in_netns(&client.netns, || {
            UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        })
        .unwrap();
        udp.connect((vip(0), VIP_UDP)).unwrap();
        let (stop, next, errors) = (stop.clone(), next.clone(), udp_errors.clone());
        load.push(thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let seq = next[socket].load(Ordering::SeqCst);
                if udp.send(&seq.to_be_bytes()).is_ok() {
                    next[socket].store(seq + 1, Ordering::SeqCst);
                } else {
                    errors.fetch_add(1, Ordering::SeqCst);
                }
                thread::sleep(Duration::from_millis(1));
            }
        }));
    }
    {
        let (stop, failed, answers) = (stop.clone(), tcp_failed.clone(), tcp_answers.clone());
        let netns = client.netns.clone();
        load.push(thread::spawn(move || {
            in_netns(&netns, || {
                while !stop.load(Ordering::SeqCst) {
                    let started = Instant::now();
                    match lab::ask_tcp(SocketAddr::from((vip(0), VIP_TCP))) {
                        Ok(name) => answers.lock().unwrap().push((started, name)),
                        Err(_) => {
                            failed.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    thread::sleep(Duration::from_millis(2));
                }
            })
        }));
    }
    thread::sleep(Duration::from_millis(300));
    let snapshot = |next: &Vec<AtomicU64>| -> Vec<u64> {
        next.iter().map(|n| n.load(Ordering::SeqCst)).collect()
    };
    // For each step: the backend removed, when sync began and returned (as
    // instants and as per-socket sequence boundaries).
    struct Step<'a> {
        removed: &'a lab::Instance,
        began: (Instant, Vec<u64>),
        returned: (Instant, Vec<u64>),
    }
    let mut steps = Vec::new();
    for (removed, now) in [(a, [b, c]), (b, [c, a]), (c, [a, b])] {
        let began = (Instant::now(), snapshot(&next));
        plane.put(service("web", vip(0), &[now[0].address, now[1].address]));
        let returned = (Instant::now(), snapshot(&next));
        steps.push(Step {
            removed,
            began,
            returned,
        });
        thread::sleep(Duration::from_millis(500));
    }
    stop.store(true, Ordering::SeqCst);
    for handle in load {
        handle.join().unwrap();
    }
    thread::sleep(Duration::from_millis(100));

    // A flow to a removed backend: sent after the sync that removed it
    // returned, before the next sync (which brings it back) began.
    let mut udp_to_removed = 0u64;
    let mut tcp_to_removed = 0u64;
    for (k, step) in steps.iter().enumerate() {
        let until = steps.get(k + 1).map(|next| &next.began);
        for &seq in step.removed.datagrams.lock().unwrap().iter() {
            let socket = (seq >> 48) as usize;
            let after = seq >= step.returned.1[socket];
            let before_next = until.is_none_or(|(_, bounds)| seq < bounds[socket]);
            if after && before_next {
                udp_to_removed += 1;
            }
        }
        for (at, name) in tcp_answers.lock().unwrap().iter() {
            let after = *at > step.returned.0;
            let before_next = until.is_none_or(|(began, _)| at < began);
            if after && before_next && *name == step.removed.name {
                tcp_to_removed += 1;
            }
        }
    }
    let sent: u64 = snapshot(&next)
        .iter()
        .enumerate()
        .map(|(s, n)| n - ((s as u64) << 48))
        .sum();
    let received: usize = [a, b, c]
        .iter()
        .map(|i| i.datagrams.lock().unwrap().len())
        .sum();
    figures.add("UDP datagrams sent", sent as f64);
    figures.add(
        "UDP datagrams lost",
        sent.saturating_sub(received as u64) as f64,
    );
    figures.add(
        "UDP datagrams to a removed backend after sync",
        udp_to_removed as f64,
    );
    figures.add(
        "TCP connections answered",
        tcp_answers.lock().unwrap().len() as f64,
    );
    figures.add(
        "TCP connections failed",
        tcp_failed.load(Ordering::SeqCst) as f64,
    );
    figures.add(
        "TCP connections to a removed backend after sync",
        tcp_to_removed as f64,
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !lab::root_test("the data plane benchmark") {
        return;
    }
    let runs: usize = std::env::var("CCA_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let mut figures = Figures::default();
    for run in 0..runs {
        eprintln!("run {} of {runs}", run + 1);
        let lab = Lab::new(4);
        let mut plane = Plane::new(&lab);
        // CCA_BENCH_ONLY=traffic,replacement,first-packet,changes picks sections.
        let only = std::env::var("CCA_BENCH_ONLY").unwrap_or_default();
        let wanted = |section: &str| only.is_empty() || only.split(',').any(|s| s == section);
        if wanted("traffic") {
            traffic(&mut figures, &lab, &mut plane);
        }
        if wanted("replacement") {
            replacement(&mut figures, &lab, &mut plane);
        }
        if wanted("first-packet") {
            for count in [100, 30_000] {
                first_packet(&mut figures, &lab, &mut plane, count);
            }
        }
        if wanted("changes") {
            for count in [1_000, 10_000] {
                endpoint_changes(&mut figures, &lab, &mut plane, count);
            }
        }
        if wanted("ebpf") {
            ebpf(&mut figures, &lab, &mut plane, &[1_000, 10_000]);
        }
        let (node, plane) = (lab.node.clone(), &mut plane.plane);
        in_netns(&node, || plane.remove()).unwrap();
    }
    println!("## Throughput and request latency ({runs} runs)\n");
    figures.print(&[
        "throughput via VIP (MB/s)",
        "throughput direct (MB/s)",
        "throughput loopback, the machine's limit (MB/s)",
        "throughput VIP / direct",
        "request p50 via VIP (ms)",
        "request p50 direct (ms)",
        "request p50 loopback (ms)",
        "request p99 via VIP (ms)",
        "request p99 direct (ms)",
        "request p99 loopback (ms)",
        "request p99 VIP / direct",
        "connect+request p50 via VIP (ms)",
        "connect+request p50 direct (ms)",
        "connect+request p99 via VIP (ms)",
        "connect+request p99 direct (ms)",
        "connect+request p99 VIP / direct",
    ]);
    println!("## First packet through a VIP\n");
    figures.print(&[
        "rebuild at 100 VIPs (ms)",
        "rebuild at 30000 VIPs (ms)",
        "connect p50 at 100 VIPs (ms)",
        "connect p50 at 30000 VIPs (ms)",
        "connect p99 at 100 VIPs (ms)",
        "connect p99 at 30000 VIPs (ms)",
    ]);
    println!("## One endpoint change\n");
    figures.print(&[
        "sync p50 at 1000 services (ms)",
        "sync p99 at 1000 services (ms)",
        "sync max at 1000 services (ms)",
        "nft apply p50 at 1000 services (ms)",
        "nft apply p99 at 1000 services (ms)",
        "UDP conntrack cleanup p50 at 1000 services (ms)",
        "commands per change at 1000 services",
        "sync p50 at 10000 services (ms)",
        "sync p99 at 10000 services (ms)",
        "sync max at 10000 services (ms)",
        "nft apply p50 at 10000 services (ms)",
        "nft apply p99 at 10000 services (ms)",
        "UDP conntrack cleanup p50 at 10000 services (ms)",
        "commands per change at 10000 services",
    ]);
    println!("## eBPF load balancing beside nftables and direct\n");
    println!(
        "From the node's own processes (socket programs) and from a container (tc programs).\n"
    );
    let mut names = side_by_side_names("node");
    names.extend(side_by_side_names("container"));
    names.extend(["1000", "10000"].iter().flat_map(|count| {
        [
            format!("eBPF rebuild at {count} services (ms)"),
            format!("eBPF sync p50 at {count} services (ms)"),
            format!("eBPF sync p99 at {count} services (ms)"),
            format!("eBPF sync max at {count} services (ms)"),
            format!("eBPF map operations per change at {count} services"),
            format!("eBPF map memory at {count} services (MiB)"),
        ]
    }));
    figures.print(&names.iter().map(String::as_str).collect::<Vec<_>>());
    println!("## Backend replacement under load\n");
    figures.print(&[
        "UDP datagrams sent",
        "UDP datagrams lost",
        "UDP send errors",
        "UDP datagrams to a removed backend after sync",
        "TCP connections answered",
        "TCP connections failed",
        "TCP connections to a removed backend after sync",
    ]);
}
