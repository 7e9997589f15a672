//! Root-only test of the VXLAN overlay on this kernel: three "nodes", each
//! a network namespace on an underlay bridge (in a namespace of its own),
//! each running the real node network (`NodeNetwork` and `Overlay` over
//! `KernelNetwork::in_netns`, so bridge, nftables table, VXLAN device and
//! entries are the node namespace's) with one instance. An instance on
//! node 1 reaches one on node 3 over TCP; the entries are checked with
//! iproute2 (`ip`, `bridge`) as an independent reader; node 3 leaving the
//! map removes its entries on nodes 1 and 2 and connections to it then fail
//! at once. Every namespace carries a random tag and a guard deletes them
//! all, also when an assertion fails; nothing is made in the host's own
//! namespace.

use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{JoinHandle, sleep};
use std::time::{Duration, Instant};

use cca_model::net::{Ipv4Net, NetworkChange, NetworkMap, NodeRoute, Touched};
use cca_net::overlay::vtep_mac;
use cca_net::{
    BridgeSpec, HostNetwork, KernelNetwork, LocalNode, NetConfig, NodeNetwork, Overlay,
    OverlayConfig, OverlayHost, VethSpec, netns,
};

/// Whether the test can run: skipped (saying why) when not root; as root,
/// `ip` and `bridge` (iproute2, the independent reader) must be there.
#[allow(clippy::print_stderr, reason = "a skipped test says why")]
fn root_test(test: &str) -> bool {
    if !fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        eprintln!("skipping {test}: the overlay needs root (scripts/test runs as root)");
        return false;
    }
    for tool in ["ip", "bridge"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
        assert!(
            found,
            "{test} runs as root, so it must run, but `{tool}` is not on PATH: install iproute2 (scripts/test does)"
        );
    }
    true
}

/// Every namespace of one test run starts with `prefix`; dropping deletes
/// them all, and with them every link, address, route and table inside.
struct Lab {
    prefix: String,
    servers: Vec<JoinHandle<()>>,
    /// Tells the echo servers to stop.
    stop: Arc<AtomicBool>,
    _state: tempfile::TempDir,
}

impl Lab {
    fn new() -> Self {
        Self {
            prefix: format!("ccao{:04x}", fastrand::u16(..)),
            servers: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            _state: tempfile::tempdir().expect("a state dir"),
        }
    }

    fn name(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.prefix)
    }

    fn state_dir(&self, node: &str) -> PathBuf {
        self._state.path().join(node)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for server in self.servers.drain(..) {
            let _ = server.join();
        }
        for name in netns::list().unwrap_or_default() {
            if name.starts_with(&self.prefix) {
                let _ = netns::delete(&name);
            }
        }
    }
}

/// One node: its namespace's network, node network, overlay and instance.
struct Node {
    name: String,
    netns: String,
    subnet: Ipv4Net,
    underlay: Ipv4Addr,
    network: NodeNetwork<KernelNetwork>,
    overlay: Overlay<KernelNetwork>,
    instance: cca_net::Attachment,
}

/// Runs `program args` and returns its stdout, failing the test if it fails.
fn stdout(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("running {program}: {error}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Connects from inside `from` (an instance namespace) to `to`, sends a
/// line and returns the echo, or the connect error and how long it took.
fn echo_from(from: &Path, to: SocketAddr) -> Result<String, (std::io::Error, Duration)> {
    netns::enter(from, || {
        let start = Instant::now();
        let mut stream = TcpStream::connect_timeout(&to, Duration::from_secs(5))
            .map_err(|error| (error, start.elapsed()))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("read timeout");
        stream
            .write_all(b"hello over the overlay\n")
            .expect("send the line");
        let mut echo = String::new();
        stream.read_to_string(&mut echo).expect("read the echo");
        Ok(echo)
    })
    .expect("enter the client's namespace")
}

/// An echo server inside `netns` on `port`: answers each connection with
/// what it sent, until `stop` is set (or a minute passed).
fn echo_server(netns: &Path, port: u16, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    let until = Instant::now() + Duration::from_secs(60);
    let listener = netns::enter(netns, || {
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).expect("bind in the instance namespace")
    })
    .expect("enter the server's namespace");
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    stream.set_nonblocking(false).expect("blocking");
                    stream
                        .set_read_timeout(Some(Duration::from_secs(2)))
                        .expect("read timeout");
                    let mut line = [0u8; 64];
                    let n = stream.read(&mut line).unwrap_or(0);
                    let _ = stream.write_all(&line[..n]);
                }
                Err(error) if error.kind() == ErrorKind::WouldBlock => {
                    sleep(Duration::from_millis(20));
                }
                Err(error) => panic!("accept: {error}"),
            }
        }
    })
}

fn map_of(nodes: &[&Node]) -> NetworkMap {
    let mut map = NetworkMap::default();
    for node in nodes {
        map.apply(
            NetworkChange::Node(NodeRoute {
                node: node.name.clone(),
                subnet: node.subnet,
                underlay: node.underlay,
                ready: true,
            }),
            &mut Touched::default(),
        );
    }
    map
}

#[test]
fn three_nodes_talk_over_the_overlay_and_a_leaving_node_is_unrouted() {
    if !root_test("three_nodes_talk_over_the_overlay_and_a_leaving_node_is_unrouted") {
        return;
    }
    let mut lab = Lab::new();

    // The underlay: a bridge in a namespace of its own, 192.168.77.0/24,
    // and one veth into each node namespace.
    let underlay_ns = lab.name("ul");
    let underlay_net = KernelNetwork::in_netns(netns::create(&underlay_ns).unwrap());
    let underlay_subnet: cca_net::Subnet = "192.168.77.0/24".parse().unwrap();
    underlay_net
        .ensure_bridge(&BridgeSpec {
            name: "ul0".into(),
            subnet: underlay_subnet,
            mtu: None,
        })
        .unwrap();

    let mut nodes = Vec::new();
    for i in 1..=3u8 {
        let name = format!("n{i}");
        let node_ns = lab.name(&name);
        let node_path = netns::create(&node_ns).unwrap();
        let underlay = Ipv4Addr::new(192, 168, 77, 10 + i);
        underlay_net
            .create_veth(&VethSpec {
                host_name: format!("ul-{name}"),
                netns: node_ns.clone(),
                peer_name: "eth0".into(),
                bridge: "ul0".into(),
                address: underlay,
                subnet: underlay_subnet,
                mtu: None,
            })
            .unwrap();

        // The node, as an agent would set it up: the overlay first (its
        // MTU is the node network's), then the node network, then an
        // instance.
        let host = KernelNetwork::in_netns(&node_path);
        let subnet: Ipv4Net = format!("10.42.{i}.0/24").parse().unwrap();
        let local = LocalNode {
            name: name.clone(),
            subnet,
            underlay,
        };
        let overlay = Overlay::open(local, OverlayConfig::default(), host.clone()).unwrap();
        assert_eq!(overlay.mtu(), 1450, "the underlay veth's 1500 less 50");
        let mut config = NetConfig::new(subnet.to_string().parse().unwrap(), lab.state_dir(&name));
        config.netns_prefix = format!("{node_ns}-");
        config.mtu = Some(overlay.mtu());
        let network = NodeNetwork::open(config, host).unwrap();
        let instance = network.attach("i").unwrap();
        nodes.push(Node {
            name,
            netns: node_ns,
            subnet,
            underlay,
            network,
            overlay,
            instance,
        });
    }
    let map = map_of(&nodes.iter().collect::<Vec<_>>());
    for node in &nodes {
        let report = node.overlay.sync(map.nodes.values()).unwrap();
        assert_eq!(report.routes_set.len(), 2, "{}: {report:?}", node.name);
        assert!(report.skipped.is_empty());
    }
    // What the kernel lists is what was written: a second sync changes
    // nothing.
    for node in &nodes {
        let again = node.overlay.sync(map.nodes.values()).unwrap();
        assert!(again.unchanged(), "{}: {again:?}", node.name);
    }

    // iproute2 reads what netlink wrote, on node 1.
    let n1 = &nodes[0].netns;
    let link = stdout("ip", &["-d", "-n", n1, "link", "show", "cca-vxlan"]);
    for wanted in [
        "mtu 1450",
        "vxlan id 42",
        "dstport 4789",
        "nolearning",
        "0e:ca:0a:2a:01:00",
    ] {
        assert!(link.contains(wanted), "{wanted} in {link}");
    }
    assert!(link.contains("local 192.168.77.11"), "{link}");
    let address = stdout("ip", &["-n", n1, "-br", "addr", "show", "cca-vxlan"]);
    assert!(address.contains("10.42.1.0/32"), "{address}");
    let bridge = stdout("ip", &["-n", n1, "link", "show", "cca0"]);
    assert!(bridge.contains("mtu 1450"), "{bridge}");
    let instance_link = stdout("ip", &["-n", &format!("{n1}-i"), "link", "show", "eth0"]);
    assert!(instance_link.contains("mtu 1450"), "{instance_link}");
    let routes = stdout("ip", &["-n", n1, "route", "show", "dev", "cca-vxlan"]);
    assert!(
        routes.contains("10.42.3.0/24 via 10.42.3.0 proto static onlink"),
        "{routes}"
    );
    assert!(
        routes.contains("10.42.2.0/24 via 10.42.2.0 proto static onlink"),
        "{routes}"
    );
    let fdb = stdout("bridge", &["-n", n1, "fdb", "show", "dev", "cca-vxlan"]);
    assert!(
        fdb.contains("0e:ca:0a:2a:03:00 dst 192.168.77.13 self permanent"),
        "{fdb}"
    );
    let neighbours = stdout("ip", &["-n", n1, "neigh", "show", "dev", "cca-vxlan"]);
    assert!(
        neighbours.contains("10.42.3.0 lladdr 0e:ca:0a:2a:03:00 PERMANENT"),
        "{neighbours}"
    );

    // TCP from node 1's instance to node 3's, across the overlay.
    let port = fastrand::u16(20000..60000);
    let n3_instance = nodes[2].instance.clone();
    let target = SocketAddr::from((n3_instance.address, port));
    let server = echo_server(&n3_instance.netns_path, port, lab.stop.clone());
    lab.servers.push(server);
    let from = nodes[0].instance.netns_path.clone();
    assert_eq!(
        echo_from(&from, target).expect("node 1's instance reaches node 3's"),
        "hello over the overlay\n"
    );

    // An unready node keeps its routes: nothing changes.
    let mut unready = map.clone();
    let mut route = unready.nodes["n3"].clone();
    route.ready = false;
    unready.apply(NetworkChange::Node(route), &mut Touched::default());
    let report = nodes[0].overlay.sync(unready.nodes.values()).unwrap();
    assert!(report.unchanged(), "{report:?}");
    assert!(
        echo_from(&from, target).is_ok(),
        "still reachable while unready"
    );

    // Node 3 leaves the map: nodes 1 and 2 drop every entry of it.
    let mut gone = map.clone();
    gone.apply(
        NetworkChange::NodeGone { node: "n3".into() },
        &mut Touched::default(),
    );
    let n3_mac = vtep_mac(nodes[2].subnet);
    for node in &nodes[..2] {
        let report = node.overlay.sync(gone.nodes.values()).unwrap();
        assert_eq!(report.routes_deleted.len(), 1, "{}: {report:?}", node.name);
        let host = node.overlay.host();
        assert!(
            !host
                .list_routes("cca-vxlan")
                .unwrap()
                .iter()
                .any(|r| r.subnet == nodes[2].subnet)
        );
        assert!(
            !host
                .list_fdb("cca-vxlan")
                .unwrap()
                .iter()
                .any(|e| e.mac == n3_mac)
        );
        assert!(
            !host
                .list_neighbours("cca-vxlan")
                .unwrap()
                .iter()
                .any(|e| e.mac == n3_mac)
        );
        let routes = stdout(
            "ip",
            &["-n", &node.netns, "route", "show", "dev", "cca-vxlan"],
        );
        assert!(!routes.contains("10.42.3.0/24"), "{}: {routes}", node.name);
        assert!(routes.contains(if node.name == "n1" {
            "10.42.2.0/24"
        } else {
            "10.42.1.0/24"
        }));
        let fdb = stdout(
            "bridge",
            &["-n", &node.netns, "fdb", "show", "dev", "cca-vxlan"],
        );
        assert!(!fdb.contains("0e:ca:0a:2a:03:00"), "{}: {fdb}", node.name);
    }
    let (error, took) = echo_from(&from, target).expect_err("node 3 is no longer routed");
    assert!(
        took < Duration::from_secs(3),
        "the connection fails at once ({error}), not after {took:?}"
    );

    // Node 1 and node 2 still talk.
    let n2_instance = nodes[1].instance.clone();
    let port2 = port.wrapping_add(1).max(20000);
    let server = echo_server(&n2_instance.netns_path, port2, lab.stop.clone());
    lab.servers.push(server);
    assert!(echo_from(&from, SocketAddr::from((n2_instance.address, port2))).is_ok());

    // The node leaves the overlay: its device goes with every entry.
    nodes[0].overlay.destroy().unwrap();
    assert!(
        nodes[0]
            .overlay
            .host()
            .list_routes("cca-vxlan")
            .unwrap()
            .is_empty()
    );
    let links = nodes[0].overlay.host().list_links().unwrap();
    assert!(!links.contains(&"cca-vxlan".to_owned()), "{links:?}");
    for node in &nodes {
        node.network.destroy().unwrap();
    }

    let prefix = lab.prefix.clone();
    drop(nodes);
    drop(lab);
    let left: Vec<String> = netns::list()
        .unwrap()
        .into_iter()
        .filter(|name| name.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
    let host_links = KernelNetwork::new().list_links().unwrap();
    assert!(
        !host_links
            .iter()
            .any(|l| l.starts_with("ul-n") || l == "cca-vxlan"),
        "nothing was made on the host: {host_links:?}"
    );
}
