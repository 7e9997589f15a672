//! Root-only conformance tests of the real node network on this kernel:
//! two instances on a throwaway bridge and subnet, an HTTP server in one
//! namespace reached from the other, from the host and through a published
//! port, and nothing of ours left after detach; a published port carries
//! only its own protocol (TCP or UDP). Every name carries a random
//! suffix and a guard removes bridge, table and namespaces even when an
//! assertion fails. Without root the tests skip (and say so); as root
//! (how `scripts/test` runs them) a missing `ip` or `nft` fails them: the
//! library talks netlink, but `nft` drives the table and the tests read the
//! kernel through `ip` as an independent client. Named namespaces made
//! without `ip`, a whole node network inside a namespace of its own, error
//! texts naming link and namespace, and calls from inside an async runtime
//! are checked too.

use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use cca_net::{HostNetwork, KernelNetwork, NetConfig, NodeNetwork, Proto};

/// Whether `test` can run: skipped (saying why) when not root; as root,
/// `ip` and `nft` must be installed or the test fails.
#[allow(clippy::print_stderr, reason = "a skipped test says why")]
fn root_test(test: &str) -> bool {
    // /proc/self belongs to the effective uid.
    if !fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        eprintln!("skipping {test}: the node network needs root (scripts/test runs as root)");
        return false;
    }
    for tool in ["ip", "nft"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
        assert!(
            found,
            "{test} runs as root, so it must run, but `{tool}` is not on PATH: install it (scripts/test does)"
        );
    }
    true
}

/// Throwaway names and the processes started in them; dropping removes all.
struct Guard {
    config: NetConfig,
    children: Vec<Child>,
    _dir: tempfile::TempDir,
}

impl Guard {
    fn new() -> Self {
        let tag = format!("{:04x}", fastrand::u16(..));
        let dir = tempfile::tempdir().expect("a temporary state dir");
        let subnet = format!("10.199.{}.0/24", fastrand::u8(1..=254));
        let mut config = NetConfig::new(subnet.parse().expect("a valid test subnet"), dir.path());
        config.bridge = format!("ccat{tag}");
        config.table = format!("ccat_{tag}");
        config.netns_prefix = format!("ccat{tag}-");
        config.veth_prefix = format!("vt{tag}");
        Self {
            config,
            children: Vec::new(),
            _dir: dir,
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let host = KernelNetwork::new();
        for netns in host.list_netns().unwrap_or_default() {
            if netns.starts_with(&self.config.netns_prefix) {
                let _ = host.delete_netns(&netns);
            }
        }
        for link in host.list_links().unwrap_or_default() {
            if link.starts_with(&self.config.veth_prefix) {
                let _ = host.delete_link(&link);
            }
        }
        let _ = host.delete_nat(&self.config.table);
        let _ = host.delete_bridge(&self.config.bridge);
    }
}

fn output(program: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("running {program}: {error}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// GETs `url`, from inside `netns` if given, retrying while the server
/// starts; returns the body.
fn get(netns: Option<&str>, url: &str) -> String {
    let curl = ["curl", "-sS", "--max-time", "2", url];
    let mut command: Vec<&str> = match netns {
        Some(netns) => vec!["ip", "netns", "exec", netns],
        None => Vec::new(),
    };
    command.extend(curl);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = Command::new(command[0])
            .args(&command[1..])
            .output()
            .unwrap_or_else(|error| panic!("running {command:?}: {error}"));
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(
            Instant::now() < deadline,
            "GET {url} from {netns:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        sleep(Duration::from_millis(100));
    }
}

fn links() -> Vec<String> {
    KernelNetwork::new().list_links().expect("ip -j link show")
}

#[test]
fn two_instances_talk_publish_and_leave_nothing_behind() {
    if !root_test("two_instances_talk_publish_and_leave_nothing_behind") {
        return;
    }
    let mut guard = Guard::new();
    let config = guard.config.clone();
    let net = NodeNetwork::open(config.clone(), KernelNetwork::new()).unwrap();

    let a = net.attach("a").unwrap();
    let b = net.attach("b").unwrap();
    assert_eq!(a.gateway, config.subnet.gateway());
    assert_ne!(a.address, b.address);
    assert!(a.netns_path.exists());
    let (ns_a, ns_b) = (config.netns_name("a"), config.netns_name("b"));

    // The instance side: address, lo up, default route via the gateway.
    let (_, routes) = output("ip", &["-n", &ns_a, "route", "show", "default"]);
    assert!(
        routes.contains(&format!("default via {}", a.gateway)),
        "{routes}"
    );
    let (_, addrs) = output("ip", &["-n", &ns_a, "-br", "addr"]);
    assert!(addrs.contains(&format!("{}/24", a.address)), "{addrs}");
    assert!(addrs.contains("lo "), "{addrs}");
    // The host side is a bridge port in hairpin mode (an instance DNATed
    // back to itself through a VIP is sent out the port it came in on).
    let hairpin = fs::read_to_string(format!(
        "/sys/class/net/{}/brport/hairpin_mode",
        config.veth_name("a")
    ))
    .expect("the veth is a bridge port");
    assert_eq!(hairpin.trim(), "1");

    let www = tempfile::tempdir().unwrap();
    fs::write(www.path().join("index.html"), "hello from a\n").unwrap();
    let server = Command::new("ip")
        .args([
            "netns", "exec", &ns_a, "busybox", "httpd", "-f", "-p", "8080",
        ])
        .arg("-h")
        .arg(www.path())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    guard.children.push(server);

    let direct = format!("http://{}:8080/", a.address);
    assert_eq!(get(Some(&ns_a), "http://127.0.0.1:8080/"), "hello from a\n");
    assert_eq!(get(Some(&ns_b), &direct), "hello from a\n", "b -> a");
    assert_eq!(get(None, &direct), "hello from a\n", "host -> a");

    let host_port = fastrand::u16(20000..40000);
    net.publish("a", host_port, 8080, Proto::Tcp).unwrap();
    let gateway_url = format!("http://{}:{host_port}/", a.gateway);
    let loopback_url = format!("http://127.0.0.1:{host_port}/");
    assert_eq!(
        get(None, &loopback_url),
        "hello from a\n",
        "published on 127.0.0.1"
    );
    assert_eq!(
        get(None, &gateway_url),
        "hello from a\n",
        "published on the gateway"
    );
    assert_eq!(
        get(Some(&ns_b), &gateway_url),
        "hello from a\n",
        "hairpin from b"
    );

    // Outbound NAT: the masquerade rule for the subnet is in our table.
    let (ok, table) = output("nft", &["-j", "list", "table", "ip", &config.table]);
    assert!(ok);
    assert!(table.contains("\"masquerade\""), "{table}");
    assert!(
        table.contains(&format!("\"addr\": \"{}\"", config.subnet.network())),
        "{table}"
    );
    assert_eq!(
        fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
            .unwrap()
            .trim(),
        "1"
    );

    net.detach("a").unwrap();
    net.detach("b").unwrap();
    assert!(!a.netns_path.exists());
    assert!(!b.netns_path.exists());
    let remaining = links();
    assert!(
        !remaining.iter().any(|l| l.starts_with(&config.veth_prefix)),
        "{remaining:?}"
    );
    assert!(
        KernelNetwork::new()
            .list_ports(&config.table)
            .unwrap()
            .is_empty()
    );
    assert!(net.leases().is_empty());
    // The bridge is the node's and outlives its last instance.
    assert!(remaining.contains(&config.bridge));

    drop(guard);
    assert!(!links().contains(&config.bridge));
    let (exists, _) = output("nft", &["list", "table", "ip", &config.table]);
    assert!(!exists, "table {} left behind", config.table);
}

#[test]
fn restart_keeps_addresses_and_cleanup_removes_orphans() {
    if !root_test("restart_keeps_addresses_and_cleanup_removes_orphans") {
        return;
    }
    let guard = Guard::new();
    let config = guard.config.clone();
    let net = NodeNetwork::open(config.clone(), KernelNetwork::new()).unwrap();
    let keep = net.attach("keep").unwrap();
    let gone = net.attach("gone").unwrap();
    net.publish("gone", fastrand::u16(40001..60000), 80, Proto::Udp)
        .unwrap();
    drop(net);

    // The restarted agent finds its leases, namespaces and ports again.
    let net = NodeNetwork::open(config.clone(), KernelNetwork::new()).unwrap();
    assert_eq!(net.attach("keep").unwrap(), keep);
    assert_eq!(net.attachment_of("gone"), Some(gone.clone()));
    assert_eq!(
        KernelNetwork::new()
            .list_ports(&config.table)
            .unwrap()
            .len(),
        1
    );

    // A namespace from a crashed attach that never got a lease.
    KernelNetwork::new()
        .create_netns(&config.netns_name("crashed"))
        .unwrap();
    let report = net.cleanup_orphans(["keep"]).unwrap();
    assert_eq!(report.instances, vec!["gone".to_owned()]);
    assert_eq!(report.netns, vec![config.netns_name("crashed")]);
    assert!(!gone.netns_path.exists());
    assert!(keep.netns_path.exists());
    assert!(
        !Path::new("/run/netns")
            .join(config.netns_name("crashed"))
            .exists()
    );
    assert!(
        KernelNetwork::new()
            .list_ports(&config.table)
            .unwrap()
            .is_empty()
    );
    assert!(!links().contains(&config.veth_name("gone")));
    assert!(links().contains(&config.veth_name("keep")));

    net.destroy().unwrap();
    assert!(!links().contains(&config.bridge));
    assert!(!keep.netns_path.exists());
}

/// TCP and UDP sockets bound inside a namespace, on the same two ports.
struct Listeners {
    tcp: [TcpListener; 2],
    udp: [UdpSocket; 2],
}

/// Binds TCP listeners and UDP sockets on `ports` inside the namespace at
/// `netns_path`: a thread joins it (setns affects the calling thread only),
/// binds, and hands the sockets back — they stay in that namespace.
fn listen_in(netns_path: &Path, ports: [u16; 2]) -> Listeners {
    let path = netns_path.to_owned();
    std::thread::spawn(move || {
        let netns = fs::File::open(&path).expect("the namespace file opens");
        rustix::thread::move_into_link_name_space(
            netns.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .expect("setns into the instance namespace");
        let any = |port| SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
        let tcp = ports.map(|port| {
            let listener = TcpListener::bind(any(port)).expect("tcp bind in the namespace");
            listener.set_nonblocking(true).expect("nonblocking");
            listener
        });
        let udp = ports.map(|port| {
            let socket = UdpSocket::bind(any(port)).expect("udp bind in the namespace");
            socket
                .set_read_timeout(Some(Duration::from_millis(500)))
                .expect("read timeout");
            socket
        });
        Listeners { tcp, udp }
    })
    .join()
    .expect("the namespace thread")
}

/// Accepts a connection within `timeout`, if one comes.
fn accept_within(listener: &TcpListener, timeout: Duration) -> Option<TcpStream> {
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((stream, _)) => return Some(stream),
            Err(error) if error.kind() == ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return None;
                }
                sleep(Duration::from_millis(20));
            }
            Err(error) => panic!("accept: {error}"),
        }
    }
}

/// Sends datagrams to 127.0.0.1:`host_port` until `socket` receives one
/// (the first may race the DNAT rule's conntrack entry), up to `tries`.
fn udp_reaches(host_port: u16, socket: &UdpSocket, tries: u32) -> Option<Vec<u8>> {
    let sender = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("udp sender");
    let mut buffer = [0u8; 64];
    for _ in 0..tries {
        sender
            .send_to(b"ping", (Ipv4Addr::LOCALHOST, host_port))
            .expect("udp send");
        if let Ok((n, _)) = socket.recv_from(&mut buffer) {
            return Some(buffer[..n].to_vec());
        }
    }
    None
}

#[test]
fn a_published_port_carries_only_its_protocol() {
    if !root_test("a_published_port_carries_only_its_protocol") {
        return;
    }
    let guard = Guard::new();
    let config = guard.config.clone();
    let net = NodeNetwork::open(config.clone(), KernelNetwork::new()).unwrap();
    let a = net.attach("a").unwrap();
    let tcp_port = fastrand::u16(20000..30000);
    let udp_port = fastrand::u16(30001..40000);
    net.publish("a", tcp_port, 8080, Proto::Tcp).unwrap();
    net.publish("a", udp_port, 5353, Proto::Udp).unwrap();

    // The ruleset: one element per published port, of its protocol only.
    let (ok, listing) = output("nft", &["list", "map", "ip", &config.table, "ports"]);
    assert!(ok, "nft list map");
    let address = a.address;
    assert!(
        listing.contains(&format!("tcp . {tcp_port} : {address} . 8080")),
        "{listing}"
    );
    assert!(
        listing.contains(&format!("udp . {udp_port} : {address} . 5353")),
        "{listing}"
    );
    assert!(
        !listing.contains(&format!("udp . {tcp_port} ")),
        "no udp rule for the tcp port: {listing}"
    );
    assert!(
        !listing.contains(&format!("tcp . {udp_port} ")),
        "no tcp rule for the udp port: {listing}"
    );
    assert_eq!(
        KernelNetwork::new()
            .list_ports(&config.table)
            .unwrap()
            .len(),
        2
    );

    // The traffic: both protocols listen on both ports inside, yet each
    // host port reaches only its own protocol's socket.
    let inside = listen_in(&a.netns_path, [8080, 5353]);
    let [tcp_8080, tcp_5353] = &inside.tcp;
    let [udp_8080, udp_5353] = &inside.udp;

    let mut client = TcpStream::connect_timeout(
        &SocketAddr::from((Ipv4Addr::LOCALHOST, tcp_port)),
        Duration::from_secs(2),
    )
    .expect("tcp reaches the published tcp port");
    let mut server =
        accept_within(tcp_8080, Duration::from_secs(5)).expect("the tcp connection arrives");
    server.write_all(b"pong").unwrap();
    let mut reply = [0u8; 4];
    client.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"pong");

    assert_eq!(
        udp_reaches(udp_port, udp_5353, 10).as_deref(),
        Some(&b"ping"[..]),
        "udp reaches the published udp port"
    );

    let refused = TcpStream::connect_timeout(
        &SocketAddr::from((Ipv4Addr::LOCALHOST, udp_port)),
        Duration::from_secs(2),
    );
    assert!(
        refused.is_err(),
        "tcp to the udp-only port is not forwarded"
    );
    assert!(
        accept_within(tcp_5353, Duration::from_millis(300)).is_none(),
        "nothing arrives at tcp 5353"
    );
    assert_eq!(
        udp_reaches(tcp_port, udp_8080, 3),
        None,
        "udp to the tcp-only port is not forwarded"
    );

    drop(inside);
    net.detach("a").unwrap();
    assert!(
        KernelNetwork::new()
            .list_ports(&config.table)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn named_namespaces_are_made_and_removed_without_ip() {
    if !root_test("named_namespaces_are_made_and_removed_without_ip") {
        return;
    }
    let guard = Guard::new();
    let name = format!("{}ns", guard.config.netns_prefix);
    let path = cca_net::netns::create(&name).unwrap();
    assert_eq!(path, Path::new("/run/netns").join(&name));
    // iproute2 sees ours, and it is a namespace of its own: only `lo`.
    let (_, listed) = output("ip", &["netns", "list"]);
    assert!(listed.lines().any(|l| l.starts_with(&name)), "{listed}");
    let (ok, inside) = output("ip", &["-n", &name, "-br", "link"]);
    assert!(ok);
    assert_eq!(
        inside
            .lines()
            .map(|l| l.split_whitespace().next())
            .collect::<Vec<_>>(),
        vec![Some("lo")]
    );
    // Creating again is fine and keeps the same namespace.
    cca_net::netns::create(&name).unwrap();
    assert!(KernelNetwork::new().list_netns().unwrap().contains(&name));

    // A mount point left by a crash before the mount becomes a namespace.
    let leftover = format!("{}crashed", guard.config.netns_prefix);
    fs::write(Path::new("/run/netns").join(&leftover), "").unwrap();
    cca_net::netns::create(&leftover).unwrap();
    assert!(
        output("ip", &["-n", &leftover, "link"]).0,
        "usable after create"
    );

    for gone in [&name, &leftover] {
        cca_net::netns::delete(gone).unwrap();
        assert!(!Path::new("/run/netns").join(gone).exists());
        cca_net::netns::delete(gone).unwrap();
    }
    let error = cca_net::netns::enter(&path, || ()).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "could not open network namespace {}: No such file or directory (os error 2)",
            path.display()
        )
    );
}

#[test]
fn a_node_network_runs_inside_a_namespace_of_its_own() {
    if !root_test("a_node_network_runs_inside_a_namespace_of_its_own") {
        return;
    }
    let guard = Guard::new();
    let node_ns = format!("{}node", guard.config.netns_prefix);
    let node_path = cca_net::netns::create(&node_ns).unwrap();
    let mut config = guard.config.clone();
    config.mtu = Some(1400);
    let host = KernelNetwork::in_netns(&node_path);
    let net = NodeNetwork::open(config.clone(), host.clone()).unwrap();
    let a = net.attach("a").unwrap();

    // Bridge, veth host end and nftables table are the node namespace's.
    let (_, bridge) = output("ip", &["-n", &node_ns, "link", "show", &config.bridge]);
    assert!(bridge.contains("mtu 1400"), "{bridge}");
    assert!(!links().contains(&config.bridge), "not on the host");
    assert!(!links().contains(&config.veth_name("a")), "not on the host");
    assert!(host.list_links().unwrap().contains(&config.veth_name("a")));
    let (in_node, _) = output(
        "ip",
        &[
            "netns",
            "exec",
            &node_ns,
            "nft",
            "list",
            "table",
            "ip",
            &config.table,
        ],
    );
    assert!(in_node, "the table is in the node namespace");
    let (on_host, _) = output("nft", &["list", "table", "ip", &config.table]);
    assert!(!on_host, "and not on the host");
    let (_, forwarding) = output(
        "ip",
        &[
            "netns",
            "exec",
            &node_ns,
            "cat",
            "/proc/sys/net/ipv4/ip_forward",
        ],
    );
    assert_eq!(forwarding.trim(), "1");

    // The instance: the MTU on both ends, address and route as on a host.
    let instance_ns = config.netns_name("a");
    let (_, eth0) = output("ip", &["-n", &instance_ns, "link", "show", "eth0"]);
    assert!(eth0.contains("mtu 1400"), "{eth0}");
    let (_, routes) = output("ip", &["-n", &instance_ns, "route", "show", "default"]);
    assert!(
        routes.contains(&format!("default via {}", a.gateway)),
        "{routes}"
    );
    let (ok, _) = output(
        "ip",
        &[
            "netns",
            "exec",
            &instance_ns,
            "busybox",
            "ping",
            "-c",
            "1",
            "-W",
            "2",
            &a.gateway.to_string(),
        ],
    );
    assert!(
        ok,
        "the instance reaches its gateway inside the node namespace"
    );

    net.destroy().unwrap();
    assert!(!a.netns_path.exists());
    assert!(!host.list_links().unwrap().contains(&config.bridge));
    cca_net::netns::delete(&node_ns).unwrap();
}

#[test]
fn errors_name_the_link_and_the_namespace() {
    if !root_test("errors_name_the_link_and_the_namespace") {
        return;
    }
    let guard = Guard::new();
    let node_ns = format!("{}errs", guard.config.netns_prefix);
    let node_path = cca_net::netns::create(&node_ns).unwrap();
    let instance_ns = format!("{}errs-i", guard.config.netns_prefix);
    KernelNetwork::new().create_netns(&instance_ns).unwrap();
    let host = KernelNetwork::in_netns(&node_path);
    let error = host
        .create_veth(&cca_net::VethSpec {
            host_name: format!("{}x", guard.config.veth_prefix),
            netns: instance_ns.clone(),
            peer_name: "eth0".into(),
            bridge: "nobridge".into(),
            address: Ipv4Addr::new(10, 199, 0, 2),
            subnet: "10.199.0.0/24".parse().unwrap(),
            mtu: None,
        })
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "no link named nobridge in network namespace {}: the node bridge is missing: open the node network first",
            node_path.display()
        )
    );
    // Removing what is not there is fine, in a namespace as on the host.
    host.delete_link("nolink").unwrap();
    host.delete_bridge("nobridge").unwrap();
    KernelNetwork::new().delete_netns(&instance_ns).unwrap();
    cca_net::netns::delete(&node_ns).unwrap();
}

#[test]
fn calls_from_inside_an_async_runtime_work() {
    if !root_test("calls_from_inside_an_async_runtime_work") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // The netlink session's own runtime cannot nest in the caller's: the
    // call moves to a plain thread of the same namespace.
    let links = runtime
        .block_on(async { KernelNetwork::new().list_links() })
        .unwrap();
    assert!(links.contains(&"lo".to_owned()), "{links:?}");
}
