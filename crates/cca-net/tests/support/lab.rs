//! A throwaway node for data-plane tests and benchmarks: a "node" network
//! namespace with a bridge (the instances' gateway) and an underlay-like
//! veth carrying its default route, and instance namespaces on the bridge,
//! each with a TCP and a UDP server that answer with the instance's name.
//! Every name carries a random tag; dropping the [`Lab`] stops the servers
//! and deletes every namespace it made, also when a test fails. Traffic
//! never leaves these namespaces.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The TCP port every instance serves on.
pub const TCP_PORT: u16 = 8080;
/// A second TCP port, for rules that name one port and not the other.
pub const OTHER_TCP_PORT: u16 = 9090;
/// The UDP port every instance serves on.
pub const UDP_PORT: u16 = 5353;

/// Whether `test` can run: skipped (saying why) when not root; as root,
/// `ip` and `nft` must be installed or the test fails.
pub fn root_test(test: &str) -> bool {
    if !fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        eprintln!("skipping {test}: the data plane needs root (scripts/test runs as root)");
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

/// Runs a command, panicking with its stderr when it fails.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("running {program} {args:?}: {error}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `f` on a thread inside namespace `netns`: sockets it opens and
/// processes it starts live there.
pub fn in_netns<T: Send>(netns: &str, f: impl FnOnce() -> T + Send) -> T {
    let path = format!("/run/netns/{netns}");
    thread::scope(|scope| {
        scope
            .spawn(move || {
                let file = fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
                rustix::thread::move_into_link_name_space(
                    file.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .expect("setns into the namespace");
                f()
            })
            .join()
            .expect("the namespace thread")
    })
}

/// One instance: its namespace, address and what its servers saw.
#[derive(Debug)]
pub struct Instance {
    pub name: String,
    pub netns: String,
    pub address: Ipv4Addr,
    /// UDP datagrams received: sequence numbers (first 8 bytes).
    pub datagrams: Arc<Mutex<Vec<u64>>>,
}

/// The node and its instances.
#[derive(Debug)]
pub struct Lab {
    pub tag: String,
    pub node: String,
    pub gateway: Ipv4Addr,
    pub instances: Vec<Instance>,
    stop: Arc<AtomicBool>,
    servers: Vec<JoinHandle<()>>,
    namespaces: Vec<String>,
}

impl Lab {
    /// A node with `count` instances named `i0`, `i1`, …
    pub fn new(count: usize) -> Lab {
        let tag = format!("{:04x}", fastrand::u16(..));
        let (a, b) = (fastrand::u8(200..250), fastrand::u8(1..250));
        let gateway = Ipv4Addr::new(10, a, b, 1);
        let node = format!("cdp{tag}-node");
        let mut lab = Lab {
            tag: tag.clone(),
            node: node.clone(),
            gateway,
            instances: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            servers: Vec::new(),
            namespaces: Vec::new(),
        };
        lab.add_netns(&node);
        let ip_node = |args: &[&str]| {
            let mut full = vec!["-n", node.as_str()];
            full.extend_from_slice(args);
            run("ip", &full)
        };
        ip_node(&["link", "set", "lo", "up"]);
        ip_node(&["link", "add", "br0", "type", "bridge"]);
        ip_node(&["addr", "add", &format!("{gateway}/24"), "dev", "br0"]);
        ip_node(&["link", "set", "br0", "up"]);
        // The underlay: the node's default route, so its own processes
        // have a route (and a source address) for VIPs.
        ip_node(&["link", "add", "up0", "type", "veth", "peer", "name", "up1"]);
        ip_node(&["addr", "add", &format!("192.168.{b}.1/24"), "dev", "up0"]);
        ip_node(&["link", "set", "up0", "up"]);
        ip_node(&["link", "set", "up1", "up"]);
        ip_node(&["route", "add", "default", "dev", "up0"]);
        in_netns(&node, || {
            fs::write("/proc/sys/net/ipv4/ip_forward", "1").expect("ip_forward in the node");
        });
        for index in 0..count {
            lab.add_instance(index);
        }
        lab
    }

    fn add_netns(&mut self, name: &str) {
        run("ip", &["netns", "add", name]);
        self.namespaces.push(name.to_owned());
    }

    fn add_instance(&mut self, index: usize) {
        let name = format!("i{index}");
        let netns = format!("cdp{}-{name}", self.tag);
        self.add_netns(&netns);
        let octets = self.gateway.octets();
        let address = Ipv4Addr::new(octets[0], octets[1], octets[2], 10 + index as u8);
        let host_end = format!("v{index}");
        run(
            "ip",
            &[
                "-n", &self.node, "link", "add", &host_end, "type", "veth", "peer", "name", "eth0",
                "netns", &netns,
            ],
        );
        run(
            "ip",
            &[
                "-n", &self.node, "link", "set", &host_end, "master", "br0", "up",
            ],
        );
        // Hairpin mode, as a node network must set it: with bridged
        // traffic passing the IPv4 hooks (br_netfilter), a flow DNATed back
        // to its own source leaves by the bridge port it came in on.
        run(
            "ip",
            &[
                "-n",
                &self.node,
                "link",
                "set",
                &host_end,
                "type",
                "bridge_slave",
                "hairpin",
                "on",
            ],
        );
        run("ip", &["-n", &netns, "link", "set", "lo", "up"]);
        run(
            "ip",
            &[
                "-n",
                &netns,
                "addr",
                "add",
                &format!("{address}/24"),
                "dev",
                "eth0",
            ],
        );
        run("ip", &["-n", &netns, "link", "set", "eth0", "up"]);
        run(
            "ip",
            &[
                "-n",
                &netns,
                "route",
                "add",
                "default",
                "via",
                &self.gateway.to_string(),
            ],
        );
        let datagrams = Arc::new(Mutex::new(Vec::new()));
        let (tcp, other, udp) = in_netns(&netns, || {
            let any = |port| SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
            (
                TcpListener::bind(any(TCP_PORT)).expect("tcp bind"),
                TcpListener::bind(any(OTHER_TCP_PORT)).expect("tcp bind"),
                UdpSocket::bind(any(UDP_PORT)).expect("udp bind"),
            )
        });
        for listener in [tcp, other] {
            self.servers
                .push(serve_tcp(listener, name.clone(), self.stop.clone()));
        }
        self.servers.push(serve_udp(
            udp,
            name.clone(),
            datagrams.clone(),
            self.stop.clone(),
        ));
        self.instances.push(Instance {
            name,
            netns,
            address,
            datagrams,
        });
    }

    /// The instance named `name`.
    pub fn instance(&self, name: &str) -> &Instance {
        self.instances
            .iter()
            .find(|i| i.name == name)
            .unwrap_or_else(|| panic!("no instance {name}"))
    }

    /// Which instance has `address`.
    pub fn name_of(&self, address: Ipv4Addr) -> Option<&str> {
        self.instances
            .iter()
            .find(|i| i.address == address)
            .map(|i| i.name.as_str())
    }

    /// Every namespace this lab made.
    pub fn namespaces(&self) -> Vec<String> {
        self.namespaces.clone()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accepts: one last connection each.
        for instance in &self.instances {
            in_netns(&instance.netns, || {
                for port in [TCP_PORT, OTHER_TCP_PORT] {
                    let _ = TcpStream::connect_timeout(
                        &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
                        Duration::from_secs(1),
                    );
                }
            });
        }
        for server in self.servers.drain(..) {
            let _ = server.join();
        }
        for netns in self.namespaces.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", netns]).output();
        }
    }
}

/// Accepts until `stop` (blocking: a connection is answered at once; the
/// lab wakes it with one last connection); each connection answers every
/// line with `name`.
fn serve_tcp(listener: TcpListener, name: String, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut connections = Vec::new();
        for stream in listener.incoming() {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            if let Ok(stream) = stream {
                let (name, stop) = (name.clone(), stop.clone());
                connections.push(thread::spawn(move || answer(stream, &name, &stop)));
            }
            connections.retain(|c: &JoinHandle<()>| !c.is_finished());
        }
        for connection in connections {
            let _ = connection.join();
        }
    })
}

fn answer(stream: TcpStream, name: &str, stop: &AtomicBool) {
    stream.set_nonblocking(false).ok();
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .ok();
    let mut writer = match stream.try_clone() {
        Ok(writer) => writer,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    while !stop.load(Ordering::SeqCst) {
        match reader.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {
                // A request is a line; a line "bulk N" asks for N bytes.
                let reply = match line.trim().strip_prefix("bulk ") {
                    Some(size) => {
                        let size: usize = size.parse().unwrap_or(0);
                        let chunk = vec![b'x'; 64 * 1024];
                        let mut left = size;
                        while left > 0 {
                            let n = left.min(chunk.len());
                            if writer.write_all(&chunk[..n]).is_err() {
                                return;
                            }
                            left -= n;
                        }
                        line.clear();
                        continue;
                    }
                    None => format!("{name}\n"),
                };
                line.clear();
                if writer.write_all(reply.as_bytes()).is_err() {
                    return;
                }
            }
            Err(error)
                if error.kind() == ErrorKind::WouldBlock || error.kind() == ErrorKind::TimedOut => {
            }
            Err(_) => return,
        }
    }
}

/// Answers every datagram with `name`, noting its sequence number.
fn serve_udp(
    socket: UdpSocket,
    name: String,
    seen: Arc<Mutex<Vec<u64>>>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    socket
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    thread::spawn(move || {
        let mut buffer = [0u8; 1500];
        while !stop.load(Ordering::SeqCst) {
            if let Ok((n, from)) = socket.recv_from(&mut buffer) {
                if n >= 8 {
                    let seq = u64::from_be_bytes(buffer[..8].try_into().unwrap());
                    seen.lock().unwrap().push(seq);
                }
                let _ = socket.send_to(name.as_bytes(), from);
            }
        }
    })
}

/// Connects to `to` and asks once: the answering instance's name, or the
/// error and how long it took to come.
pub fn ask_tcp(to: SocketAddr) -> Result<String, (ErrorKind, Duration)> {
    let started = Instant::now();
    let mut stream = TcpStream::connect_timeout(&to, Duration::from_secs(3))
        .map_err(|e| (e.kind(), started.elapsed()))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    stream
        .write_all(b"who\n")
        .map_err(|e| (e.kind(), started.elapsed()))?;
    read_line(&mut stream).map_err(|e| (e.kind(), started.elapsed()))
}

/// Reads one line from `stream`.
pub fn read_line(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match stream.read(&mut byte)? {
            0 => return Err(ErrorKind::UnexpectedEof.into()),
            _ if byte[0] == b'\n' => break,
            _ => reply.push(byte[0]),
        }
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// Sends one datagram from a fresh socket (a fresh source port, so a fresh
/// conntrack entry) and returns the answer, or the error.
pub fn ask_udp(to: SocketAddr) -> Result<String, ErrorKind> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    socket.connect(to).map_err(|e| e.kind())?;
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    socket.send(&u64::MAX.to_be_bytes()).map_err(|e| e.kind())?;
    let mut buffer = [0u8; 64];
    let n = socket.recv(&mut buffer).map_err(|e| e.kind())?;
    Ok(String::from_utf8_lossy(&buffer[..n]).into_owned())
}

/// How many times each name answered.
pub fn tally(names: impl IntoIterator<Item = String>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for name in names {
        *counts.entry(name).or_default() += 1;
    }
    counts
}

/// A service at `vip` with ports TCP 80 and UDP 53 over `targets`
/// (instance name, address) on node `node`: TCP to their [`TCP_PORT`],
/// UDP to their [`UDP_PORT`]; each target is also a member.
pub fn http_dns_service(
    name: &str,
    vip: Ipv4Addr,
    node: &str,
    targets: &[(String, Ipv4Addr)],
) -> cca_model::net::ServiceNet {
    use cca_model::net::{Affinity, Member, ServiceNet, Target};
    use cca_model::spec::{PortSpec, Protocol};
    let port = |name: &str, number, protocol| PortSpec {
        name: Some(name.into()),
        number,
        protocol,
    };
    let to = |port| {
        targets
            .iter()
            .map(|(instance, address)| Target {
                instance: instance.clone(),
                node: node.into(),
                address: *address,
                port,
            })
            .collect::<Vec<_>>()
    };
    ServiceNet {
        name: name.into(),
        vip: Some(vip),
        ports: vec![
            port("http", 80, Protocol::Tcp),
            port("dns", 53, Protocol::Udp),
        ],
        affinity: Affinity::None,
        endpoints: BTreeMap::from([("http".into(), to(TCP_PORT)), ("dns".into(), to(UDP_PORT))]),
        members: targets
            .iter()
            .map(|(instance, address)| Member {
                instance: instance.clone(),
                node: node.into(),
                address: *address,
                ordinal: None,
                host_network: false,
            })
            .collect(),
        asleep: false,
        scale_to_zero: None,
    }
}
