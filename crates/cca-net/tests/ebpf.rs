//! Root-only tests of the eBPF socket load balancer with the real
//! programs, in throwaway namespaces (`support::lab`) and a BPF file system
//! of the test's own: the node's processes reach a VIP's backends over TCP
//! and UDP and see the VIP as their peer, an empty VIP refuses at once,
//! other namespaces are untouched, a removed backend gets no new
//! connections while an established one goes on, a restarted loader takes
//! the maps over without a gap, and removing the plane detaches the
//! programs. Without root the tests skip and say so.
#![allow(clippy::unwrap_used, reason = "a test's helpers fail the test")]

#[path = "support/lab.rs"]
mod lab;

use std::collections::BTreeMap;
use std::io::{ErrorKind, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cca_model::net::{NetworkChange, NetworkMap, ServiceNet, Touched};
use cca_net::ebpf::layout::FrontKey;
use cca_net::ebpf::plan::{FrontState, Plan, Programmed};
use cca_net::ebpf::{AttachConfig, Attached, EbpfPlane, LbMaps, maglev};

use lab::{Instance, Lab, ask_tcp, ask_udp, in_netns, read_line, tally};

const SEED: u64 = 0x00c0_ffee;

/// A BPF file system mounted for one test; unmounting it unpins
/// everything the test left.
struct Bpffs(PathBuf);

impl Bpffs {
    fn new() -> Bpffs {
        let dir = std::env::temp_dir().join(format!("cca-bpffs-{:08x}", fastrand::u32(..)));
        std::fs::create_dir_all(&dir).unwrap();
        Bpffs(dir)
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn service(name: &str, vip: Ipv4Addr, targets: &[&Instance]) -> ServiceNet {
    let named: Vec<(String, Ipv4Addr)> = targets
        .iter()
        .map(|i| (i.name.clone(), i.address))
        .collect();
    lab::http_dns_service(name, vip, "node-a", &named)
}

fn open(lab: &Lab, bpffs: &Path) -> EbpfPlane<Attached> {
    let config = AttachConfig {
        bpffs: bpffs.to_owned(),
        cgroup: None,
        seed: SEED,
    };
    let attached = in_netns(&lab.node, || Attached::open(&config)).unwrap();
    EbpfPlane::new(attached, SEED)
}

fn sync(plane: &mut EbpfPlane<Attached>, map: &mut NetworkMap, change: NetworkChange) {
    let mut touched = Touched::default();
    map.apply(change, &mut touched);
    plane.sync(map, &touched).unwrap();
}

fn translated(plane: &EbpfPlane<Attached>) -> u64 {
    plane.stats().unwrap()["translated"]
}

fn links(plane: &EbpfPlane<Attached>) -> usize {
    std::fs::read_dir(plane.maps().pin_dir())
        .unwrap()
        .filter(|entry| {
            entry
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("link-")
        })
        .count()
}

/// The kernel's id of every pinned map, by file name.
fn pinned_map_ids(plane: &EbpfPlane<Attached>) -> BTreeMap<String, u32> {
    std::fs::read_dir(plane.maps().pin_dir())
        .unwrap()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("cca_"))
        .map(|entry| {
            let info = aya::maps::MapInfo::from_pin(entry.path()).unwrap();
            (entry.file_name().to_string_lossy().into_owned(), info.id())
        })
        .collect()
}

#[test]
fn the_nodes_processes_reach_vips_through_the_socket_programs() {
    if !lab::root_test("the_nodes_processes_reach_vips_through_the_socket_programs") {
        return;
    }
    let lab = Lab::new(2);
    let bpffs = Bpffs::new();
    let (i0, i1) = (lab.instance("i0"), lab.instance("i1"));
    let web = Ipv4Addr::new(10, 96, 0, 7);
    let empty = Ipv4Addr::new(10, 96, 0, 8);
    let mut plane = open(&lab, &bpffs.0);
    let mut map = NetworkMap::default();
    plane.resync(&map).unwrap();
    sync(
        &mut plane,
        &mut map,
        NetworkChange::Service(Arc::new(service("web", web, &[i0, i1]))),
    );
    sync(
        &mut plane,
        &mut map,
        NetworkChange::Service(Arc::new(service("empty", empty, &[]))),
    );

    // TCP and connected UDP reach both backends.
    let tcp = SocketAddr::from((web, 80));
    let udp = SocketAddr::from((web, 53));
    let answers = in_netns(&lab.node, || tally((0..40).map(|_| ask_tcp(tcp).unwrap())));
    assert_eq!(
        answers.keys().collect::<Vec<_>>(),
        ["i0", "i1"],
        "{answers:?}"
    );
    let answers = in_netns(&lab.node, || tally((0..40).map(|_| ask_udp(udp).unwrap())));
    assert_eq!(
        answers.keys().collect::<Vec<_>>(),
        ["i0", "i1"],
        "{answers:?}"
    );

    // The peer is the VIP, for getpeername and for unconnected UDP.
    let (peer, from) = in_netns(&lab.node, || {
        let stream = TcpStream::connect(tcp).unwrap();
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        socket.send_to(&1u64.to_be_bytes(), udp).unwrap();
        let mut buffer = [0u8; 64];
        let (_, from) = socket.recv_from(&mut buffer).unwrap();
        (stream.peer_addr().unwrap(), from)
    });
    assert_eq!(peer, tcp);
    assert_eq!(from, udp);

    // A VIP without backends refuses at once, TCP and UDP.
    let (kind, took) = in_netns(&lab.node, || ask_tcp(SocketAddr::from((empty, 80)))).unwrap_err();
    assert_eq!(kind, ErrorKind::ConnectionRefused);
    assert!(took < Duration::from_millis(500), "{took:?}");
    let refused = in_netns(&lab.node, || ask_udp(SocketAddr::from((empty, 53)))).unwrap_err();
    assert_eq!(refused, ErrorKind::ConnectionRefused);
    assert!(plane.stats().unwrap()["rejected"] >= 2);

    // A VIP port with nine backends has a large table: i0's port 8080
    // and i1's answer, the seven other ports of i0 have no server, and
    // i0's kernel refuses them.
    let big = Ipv4Addr::new(10, 96, 0, 9);
    let mut nine = service("big", big, &[i0, i1]);
    let targets = nine.endpoints.get_mut("http").unwrap();
    for port in 8081..8088 {
        let mut extra = targets[0].clone();
        extra.port = port;
        targets.push(extra);
    }
    sync(&mut plane, &mut map, NetworkChange::Service(Arc::new(nine)));
    let to_big = SocketAddr::from((big, 80));
    let outcomes = in_netns(&lab.node, || {
        tally((0..90).map(|_| match ask_tcp(to_big) {
            Ok(name) => name,
            Err((kind, _)) => format!("{kind:?}"),
        }))
    });
    assert_eq!(
        outcomes.keys().collect::<Vec<_>>(),
        ["ConnectionRefused", "i0", "i1"],
        "{outcomes:?}"
    );

    // Another namespace's sockets are not this node's: untouched.
    let before = translated(&plane);
    in_netns(&i0.netns, || {
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        let _ = socket.connect(udp);
    });
    assert_eq!(
        translated(&plane),
        before,
        "a connect in another namespace was balanced"
    );

    // A removed backend gets no new connections; one already open to it
    // goes on (the socket talks to the backend itself).
    let mut established = in_netns(&lab.node, || {
        loop {
            let mut stream = TcpStream::connect(tcp).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(3)))
                .unwrap();
            stream.write_all(b"who\n").unwrap();
            if read_line(&mut stream).unwrap() == "i1" {
                break stream;
            }
        }
    });
    sync(
        &mut plane,
        &mut map,
        NetworkChange::Service(Arc::new(service("web", web, &[i0]))),
    );
    let answers = in_netns(&lab.node, || tally((0..20).map(|_| ask_tcp(tcp).unwrap())));
    assert_eq!(answers.keys().collect::<Vec<_>>(), ["i0"], "{answers:?}");
    established.write_all(b"who\n").unwrap();
    assert_eq!(read_line(&mut established).unwrap(), "i1");

    // A new loader (an agent restart) takes the pinned maps over: the
    // programs kept balancing meanwhile, and its links replace the old.
    sync(
        &mut plane,
        &mut map,
        NetworkChange::Service(Arc::new(service("web", web, &[i0, i1]))),
    );
    let map_ids = pinned_map_ids(&plane);
    drop(plane);
    let answers = in_netns(&lab.node, || tally((0..40).map(|_| ask_tcp(tcp).unwrap())));
    assert_eq!(
        answers.keys().collect::<Vec<_>>(),
        ["i0", "i1"],
        "while no agent runs"
    );
    let mut plane = open(&lab, &bpffs.0);
    assert_eq!(
        links(&plane),
        8,
        "one link per program, the old ones unpinned"
    );
    assert_eq!(
        pinned_map_ids(&plane),
        map_ids,
        "the new loader took the same maps over"
    );
    plane.resync(&map).unwrap();
    let answers = in_netns(&lab.node, || tally((0..40).map(|_| ask_tcp(tcp).unwrap())));
    assert_eq!(
        answers.keys().collect::<Vec<_>>(),
        ["i0", "i1"],
        "after the restart"
    );

    // Removed: the VIP is an address nothing answers at again.
    plane.remove().unwrap();
    let before = translated(&plane);
    let gone = in_netns(&lab.node, || ask_udp(udp));
    assert!(gone.is_err(), "{gone:?}");
    assert_eq!(translated(&plane), before);

    // What a run left behind is removed by the next agent that runs
    // nftables alone (`remove_pinned`), and only once.
    let mut plane = open(&lab, &bpffs.0);
    plane.resync(&map).unwrap();
    drop(plane);
    assert!(in_netns(&lab.node, || ask_udp(udp)).is_ok());
    assert!(in_netns(&lab.node, || cca_net::ebpf::remove_pinned(&bpffs.0)).unwrap());
    assert!(
        in_netns(&lab.node, || ask_udp(udp)).is_err(),
        "still translated"
    );
    assert!(!in_netns(&lab.node, || cca_net::ebpf::remove_pinned(&bpffs.0)).unwrap());
}

/// Gives the lab's instances' veths (`v0`, `v1`, …) the tc programs.
fn attach_veths(lab: &Lab, plane: &EbpfPlane<Attached>) {
    let veths = plane.veth_programs();
    in_netns(&lab.node, || {
        for index in 0..lab.instances.len() {
            veths.attach(&format!("v{index}")).unwrap();
        }
    });
}

fn tc_stat(plane: &EbpfPlane<Attached>, name: &str) -> u64 {
    plane.stats().unwrap()[name]
}

/// Which instance the programs send a UDP flow from `client` to `front`
/// to, as the planner's table and the flow hash say.
fn predicted(lab: &Lab, backends: &[&Instance], client: SocketAddr, front: SocketAddr) -> String {
    let mut addresses: Vec<SocketAddr> = backends
        .iter()
        .map(|i| SocketAddr::from((i.address, lab::UDP_PORT)))
        .collect();
    addresses.sort();
    let names: Vec<String> = addresses.iter().map(SocketAddr::to_string).collect();
    let table = maglev::table(SEED, &names);
    let flow = maglev::Flow {
        client,
        front,
        protocol: 17,
    };
    let slot = (maglev::flow_hash(SEED, &flow, false) % table.len() as u64) as usize;
    let SocketAddr::V4(chosen) = addresses[table[slot] as usize] else {
        unreachable!("IPv4 backends")
    };
    lab.name_of(*chosen.ip()).unwrap().to_owned()
}

#[test]
fn containers_reach_vips_through_the_tc_programs() {
    if !lab::root_test("containers_reach_vips_through_the_tc_programs") {
        return;
    }
    let lab = Lab::new(3);
    let bpffs = Bpffs::new();
    let (i0, i1, i2) = (lab.instance("i0"), lab.instance("i1"), lab.instance("i2"));
    let web = Ipv4Addr::new(10, 96, 0, 7);
    let empty = Ipv4Addr::new(10, 96, 0, 8);
    let own = Ipv4Addr::new(10, 96, 0, 9);
    let mut plane = open(&lab, &bpffs.0);
    let mut map = NetworkMap::default();
    plane.resync(&map).unwrap();
    for (name, vip, targets) in [
        ("web", web, vec![i1, i2]),
        ("empty", empty, vec![]),
        ("own", own, vec![i0]),
    ] {
        sync(
            &mut plane,
            &mut map,
            NetworkChange::Service(Arc::new(service(name, vip, &targets))),
        );
    }
    attach_veths(&lab, &plane);

    // From a container, TCP and UDP reach both backends and the answers
    // come back from the VIP (else the client's socket would drop them).
    let tcp = SocketAddr::from((web, 80));
    let udp = SocketAddr::from((web, 53));
    let answers = in_netns(&i0.netns, || tally((0..40).map(|_| ask_tcp(tcp).unwrap())));
    assert_eq!(
        answers.keys().collect::<Vec<_>>(),
        ["i1", "i2"],
        "{answers:?}"
    );
    let answers = in_netns(&i0.netns, || tally((0..40).map(|_| ask_udp(udp).unwrap())));
    assert_eq!(
        answers.keys().collect::<Vec<_>>(),
        ["i1", "i2"],
        "{answers:?}"
    );
    assert!(tc_stat(&plane, "tc_flows") >= 80);

    // The backend a flow gets is the one the seeded 5-tuple hash picks in
    // the planner's table: any node with the seed computes the same.
    for _ in 0..24 {
        let port = fastrand::u16(20_000..60_000);
        let client = SocketAddr::from((i0.address, port));
        let answer = in_netns(&i0.netns, || {
            let socket = UdpSocket::bind(client).unwrap();
            socket
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            socket.send_to(&7u64.to_be_bytes(), udp).unwrap();
            let mut buffer = [0u8; 64];
            let (n, from) = socket.recv_from(&mut buffer).unwrap();
            assert_eq!(from, udp, "the answer comes from the VIP");
            String::from_utf8_lossy(&buffer[..n]).into_owned()
        });
        assert_eq!(
            answer,
            predicted(&lab, &[i1, i2], client, udp),
            "client port {port}"
        );
    }

    // A VIP without backends refuses a container at once: a TCP reset,
    // an ICMP port unreachable for UDP.
    let (kind, took) = in_netns(&i0.netns, || ask_tcp(SocketAddr::from((empty, 80)))).unwrap_err();
    assert_eq!(kind, ErrorKind::ConnectionRefused);
    assert!(took < Duration::from_millis(500), "{took:?}");
    let refused = in_netns(&i0.netns, || ask_udp(SocketAddr::from((empty, 53)))).unwrap_err();
    assert_eq!(refused, ErrorKind::ConnectionRefused);
    assert!(tc_stat(&plane, "tc_reset") >= 1);
    assert!(tc_stat(&plane, "tc_unreachable") >= 1);

    // Hairpin: a container whose service picks itself gets its own answer.
    let to_own = SocketAddr::from((own, 80));
    assert_eq!(in_netns(&i0.netns, || ask_tcp(to_own)).unwrap(), "i0");
    assert_eq!(
        in_netns(&i0.netns, || ask_udp(SocketAddr::from((own, 53)))).unwrap(),
        "i0"
    );
    assert!(tc_stat(&plane, "tc_hairpin") >= 2);
    let peer = in_netns(&i0.netns, || {
        TcpStream::connect(to_own).unwrap().peer_addr().unwrap()
    });
    assert_eq!(peer, to_own);

    // Traffic between containers that is not to a VIP is untouched.
    let direct = SocketAddr::from((i1.address, lab::TCP_PORT));
    let flows = tc_stat(&plane, "tc_flows");
    assert_eq!(in_netns(&i0.netns, || ask_tcp(direct)).unwrap(), "i1");
    assert_eq!(tc_stat(&plane, "tc_flows"), flows);

    plane.remove().unwrap();
}

#[test]
fn refusals_are_limited_by_a_token_bucket_per_cpu() {
    if !lab::root_test("refusals_are_limited_by_a_token_bucket_per_cpu") {
        return;
    }
    let lab = Lab::new(1);
    let bpffs = Bpffs::new();
    let empty = Ipv4Addr::new(10, 96, 0, 8);
    let mut plane = open(&lab, &bpffs.0);
    let mut map = NetworkMap::default();
    plane.resync(&map).unwrap();
    sync(
        &mut plane,
        &mut map,
        NetworkChange::Service(Arc::new(service("empty", empty, &[]))),
    );
    attach_veths(&lab, &plane);
    let sent = 400;
    let took = in_netns(&lab.instance("i0").netns, || {
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        let started = std::time::Instant::now();
        for _ in 0..sent {
            let _ = socket.send_to(b"x", (empty, 53));
        }
        started.elapsed()
    });
    let answered = tc_stat(&plane, "tc_unreachable");
    let limited = tc_stat(&plane, "tc_limited");
    assert_eq!(
        answered + limited,
        sent,
        "every datagram answered or dropped"
    );
    // Each CPU answers its burst (25) and 100 a second after it.
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    let budget = cpus * (25 + (took.as_secs_f64() * 100.0).ceil() as u64);
    assert!(answered >= 25, "{answered} answered");
    assert!(
        answered <= budget,
        "{answered} answered over {took:?}, budget {budget}"
    );
    assert!(limited > 0);
    plane.remove().unwrap();
}

#[test]
fn ipv6_fronts_are_balanced_and_refused_by_the_tc_programs() {
    if !lab::root_test("ipv6_fronts_are_balanced_and_refused_by_the_tc_programs") {
        return;
    }
    let lab = Lab::new(2);
    let bpffs = Bpffs::new();
    let (i0, i1) = (lab.instance("i0"), lab.instance("i1"));
    // The lab is IPv4: give the bridge and the instances IPv6 addresses.
    let v6 = |host: u16| Ipv6Addr::new(0xfd00, 0xcca, 0, 0, 0, 0, 0, host);
    lab::run(
        "ip",
        &[
            "-n",
            &lab.node,
            "addr",
            "add",
            &format!("{}/64", v6(1)),
            "dev",
            "br0",
            "nodad",
        ],
    );
    in_netns(&lab.node, || {
        std::fs::write("/proc/sys/net/ipv6/conf/all/forwarding", "1").unwrap();
    });
    for (index, instance) in [i0, i1].iter().enumerate() {
        let address = format!("{}/64", v6(0x10 + index as u16));
        lab::run(
            "ip",
            &[
                "-n",
                &instance.netns,
                "addr",
                "add",
                &address,
                "dev",
                "eth0",
                "nodad",
            ],
        );
        lab::run(
            "ip",
            &[
                "-n",
                &instance.netns,
                "-6",
                "route",
                "add",
                "default",
                "via",
                &v6(1).to_string(),
            ],
        );
    }
    // i1 answers on its IPv6 address with its name.
    let backend = SocketAddr::from((v6(0x11), lab::TCP_PORT));
    let listener = in_netns(&i1.netns, || std::net::TcpListener::bind(backend).unwrap());
    let server = std::thread::spawn(move || {
        for _ in 0..3 {
            let (mut stream, _) = listener.accept().unwrap();
            read_line(&mut stream).unwrap();
            stream.write_all(b"i1\n").unwrap();
        }
    });

    let config = AttachConfig {
        bpffs: bpffs.0.clone(),
        cgroup: None,
        seed: SEED,
    };
    let mut maps = in_netns(&lab.node, || Attached::open(&config)).unwrap();
    // No service range: IPv6 packets are looked up too.
    maps.set_service_range(None).unwrap();
    let front = SocketAddr::from((Ipv6Addr::new(0xfd00, 0xcca, 0xffff, 0, 0, 0, 0, 7), 80));
    let empty = SocketAddr::from((Ipv6Addr::new(0xfd00, 0xcca, 0xffff, 0, 0, 0, 0, 8), 80));
    let mut programmed = Programmed::new(SEED, Default::default(), &BTreeMap::new());
    let (mut plan, mut released) = (Plan::default(), Vec::new());
    for (address, protocol, backends) in [
        (front, 6, vec![backend]),
        (empty, 6, vec![]),
        (SocketAddr::new(empty.ip(), 53), 17, vec![]),
    ] {
        let state = FrontState {
            backends,
            affinity: false,
            instances: BTreeMap::new(),
        };
        programmed.update(
            FrontKey { address, protocol },
            Some(&state),
            &mut plan,
            &mut released,
        );
    }
    maps.apply(&plan.ops).unwrap();
    let veths = maps.veth_programs();
    in_netns(&lab.node, || veths.attach("v0").unwrap());

    for _ in 0..3 {
        let (answer, peer) = in_netns(&i0.netns, || {
            let mut stream = TcpStream::connect_timeout(&front, Duration::from_secs(3)).unwrap();
            stream.write_all(b"who\n").unwrap();
            (read_line(&mut stream).unwrap(), stream.peer_addr().unwrap())
        });
        assert_eq!((answer.as_str(), peer), ("i1", front));
    }
    server.join().unwrap();
    // Refused at once: a TCP reset and an ICMPv6 port unreachable.
    let (kind, took) = in_netns(&i0.netns, || ask_tcp(empty)).unwrap_err();
    assert_eq!(kind, ErrorKind::ConnectionRefused);
    assert!(took < Duration::from_millis(500), "{took:?}");
    let refused = in_netns(&i0.netns, || {
        let socket = UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 0)).unwrap();
        socket.connect(SocketAddr::new(empty.ip(), 53)).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        socket.send(b"x").unwrap();
        socket.recv(&mut [0u8; 8]).unwrap_err().kind()
    });
    assert_eq!(refused, ErrorKind::ConnectionRefused);
    let stats = maps.stats().unwrap();
    assert_eq!(
        (
            stats["tc_flows"],
            stats["tc_reset"],
            stats["tc_unreachable"]
        ),
        (3, 1, 1),
        "{stats:?}"
    );
    maps.remove().unwrap();
}

#[test]
fn container_flows_drain_survive_a_restart_and_are_swept() {
    if !lab::root_test("container_flows_drain_survive_a_restart_and_are_swept") {
        return;
    }
    let drain = Duration::from_secs(60);
    let lab = Lab::new(3);
    let bpffs = Bpffs::new();
    let (i0, i1, i2) = (lab.instance("i0"), lab.instance("i1"), lab.instance("i2"));
    let web = Ipv4Addr::new(10, 96, 0, 7);
    let tcp = SocketAddr::from((web, 80));
    let mut plane = open(&lab, &bpffs.0).with_drain(drain);
    let mut map = NetworkMap::default();
    plane.resync(&map).unwrap();
    sync(
        &mut plane,
        &mut map,
        NetworkChange::Service(Arc::new(service("web", web, &[i1, i2]))),
    );
    attach_veths(&lab, &plane);
    let ask = |stream: &mut TcpStream| {
        stream.write_all(b"who\n")?;
        read_line(stream)
    };
    let mut established = in_netns(&i0.netns, || {
        loop {
            let mut stream = TcpStream::connect(tcp).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(3)))
                .unwrap();
            if ask(&mut stream).unwrap() == "i1" {
                break stream;
            }
        }
    });

    // i1 is not ready any more but still placed: it drains.
    let mut draining = service("web", web, &[i2]);
    draining.members = service("web", web, &[i1, i2]).members;
    sync(
        &mut plane,
        &mut map,
        NetworkChange::Service(Arc::new(draining)),
    );
    let only_i2 = |when: &str| {
        let answers = in_netns(&i0.netns, || tally((0..20).map(|_| ask_tcp(tcp).unwrap())));
        assert_eq!(
            answers.keys().collect::<Vec<_>>(),
            ["i2"],
            "{when}: {answers:?}"
        );
    };
    only_i2("draining");
    assert_eq!(
        ask(&mut established).unwrap(),
        "i1",
        "the pinned flow goes on"
    );

    // An agent restart: the pinned links and maps keep the flow; the new
    // loader takes the draining backend over and swaps its programs into
    // the veths' links in place.
    drop(plane);
    assert_eq!(ask(&mut established).unwrap(), "i1", "while no agent runs");
    let mut plane = open(&lab, &bpffs.0).with_drain(drain);
    plane.resync(&map).unwrap();
    attach_veths(&lab, &plane);
    let tc_pins = std::fs::read_dir(plane.maps().pin_dir())
        .unwrap()
        .filter(|entry| {
            entry
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("tc-")
        })
        .count();
    assert_eq!(tc_pins, 6, "one link each way per veth");
    assert_eq!(ask(&mut established).unwrap(), "i1", "after the restart");
    only_i2("after the restart");

    // The drain ends: i1 goes, and the flows pinned to it (its two
    // entries) are swept; the flow's next packet is balanced afresh, to
    // i2, which knows no such connection.
    let report = plane.expire(std::time::Instant::now() + drain).unwrap();
    assert_eq!(report.swept, 2, "{report:?}");
    assert!(ask(&mut established).is_err(), "the swept flow was reset");
    only_i2("after the drain");
    plane.remove().unwrap();
    assert!(
        in_netns(&i0.netns, || ask_tcp(tcp)).is_err(),
        "the veths' programs went with the plane"
    );
}
