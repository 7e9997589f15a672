//! A network namespace of the test's own with an address on its loopback,
//! and a tiny DNS responder bound to that address on port 53: fixed A
//! records, an empty answer for other types of a known name, NXDOMAIN for
//! the rest, and a log of the names asked. Hand-built packets (RFC 1035
//! header, one question, one answer with a compression pointer): enough
//! for glibc's stub resolver, nothing more. The guard stops the responder
//! and deletes the namespace, also when the test fails.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A named network namespace (`ip netns add`), deleted on drop.
pub(crate) struct TestNetns {
    pub(crate) name: String,
    pub(crate) path: PathBuf,
}

impl TestNetns {
    /// Creates `cca-rt-{tag}-{pid}` with `lo` up and `address/32` on it.
    pub(crate) fn new(tag: &str, address: Ipv4Addr) -> Self {
        let name = format!("cca-rt-{tag}-{}", std::process::id());
        // A namespace left by a crashed run of this pid: start clean.
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let netns = Self {
            path: PathBuf::from("/run/netns").join(&name),
            name,
        };
        netns.ip(&["netns", "add", &netns.name]);
        netns.ip(&["-n", &netns.name, "link", "set", "lo", "up"]);
        netns.ip(&[
            "-n",
            &netns.name,
            "addr",
            "add",
            &format!("{address}/32"),
            "dev",
            "lo",
        ]);
        netns
    }

    fn ip(&self, args: &[&str]) {
        let output = Command::new("ip").args(args).output().expect("ip runs");
        assert!(
            output.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// The responder's thread, stopped and joined on drop.
pub(crate) struct DnsResponder {
    stop: Arc<AtomicBool>,
    asked: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DnsResponder {
    /// Serves `records` (lower-case names without the final dot) on
    /// `address:53` inside `netns`, from a thread that moved into it.
    pub(crate) fn start(
        netns: &TestNetns,
        address: Ipv4Addr,
        records: BTreeMap<String, Ipv4Addr>,
    ) -> Self {
        let namespace = std::fs::File::open(&netns.path).expect("open the netns");
        let stop = Arc::new(AtomicBool::new(false));
        let asked = Arc::new(Mutex::new(Vec::new()));
        let (ready, bound) = std::sync::mpsc::channel();
        let thread = {
            let (stop, asked) = (stop.clone(), asked.clone());
            std::thread::spawn(move || {
                let socket = rustix::thread::move_into_link_name_space(
                    namespace.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .map_err(std::io::Error::from)
                .and_then(|()| UdpSocket::bind(SocketAddr::from((address, 53))))
                .and_then(|socket| {
                    socket.set_read_timeout(Some(Duration::from_millis(50)))?;
                    Ok(socket)
                });
                let socket = match socket {
                    Ok(socket) => {
                        let _ = ready.send(Ok(()));
                        socket
                    }
                    Err(error) => {
                        let _ = ready.send(Err(error));
                        return;
                    }
                };
                serve(&socket, &records, &stop, &asked);
            })
        };
        bound
            .recv()
            .expect("the responder thread answers")
            .expect("the responder binds port 53 in the namespace");
        Self {
            stop,
            asked,
            thread: Some(thread),
        }
    }

    /// The names asked so far, in order, as `NAME TYPE`.
    pub(crate) fn asked(&self) -> Vec<String> {
        self.asked.lock().expect("lock").clone()
    }
}

impl Drop for DnsResponder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(
    socket: &UdpSocket,
    records: &BTreeMap<String, Ipv4Addr>,
    stop: &AtomicBool,
    asked: &Mutex<Vec<String>>,
) {
    let mut buffer = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        let Ok((length, peer)) = socket.recv_from(&mut buffer) else {
            continue;
        };
        let Some((question, answer)) = respond(&buffer[..length], records) else {
            continue;
        };
        asked.lock().expect("lock").push(question);
        let _ = socket.send_to(&answer, peer);
    }
}

const TYPE_A: u16 = 1;
const NXDOMAIN: u8 = 3;

/// The question (`name TYPE`) and the reply to one query; `None` for
/// what is not a one-question query.
fn respond(query: &[u8], records: &BTreeMap<String, Ipv4Addr>) -> Option<(String, Vec<u8>)> {
    let header = query.get(..12)?;
    if header[2] & 0x80 != 0 || u16::from_be_bytes([header[4], header[5]]) != 1 {
        return None;
    }
    let mut labels = Vec::new();
    let mut at = 12;
    loop {
        let length = usize::from(*query.get(at)?);
        at += 1;
        if length == 0 {
            break;
        }
        if length > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + length)?).to_lowercase());
        at += length;
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    let question_end = at + 4;
    let question = query.get(12..question_end)?;
    let name = labels.join(".");
    let found = records.get(&name);
    let mut reply = Vec::with_capacity(question_end + 16);
    reply.extend_from_slice(&header[..2]);
    // QR, the query's RD; RA; NOERROR or NXDOMAIN.
    reply.push(0x80 | (header[2] & 0x01));
    reply.push(0x80 | if found.is_some() { 0 } else { NXDOMAIN });
    let answers: u16 = if found.is_some() && qtype == TYPE_A {
        1
    } else {
        0
    };
    for count in [1, answers, 0, 0] {
        reply.extend_from_slice(&u16::to_be_bytes(count));
    }
    reply.extend_from_slice(question);
    if let (Some(address), 1) = (found, answers) {
        reply.extend_from_slice(&[0xc0, 0x0c]); // the name: the question's
        reply.extend_from_slice(&TYPE_A.to_be_bytes());
        reply.extend_from_slice(&1u16.to_be_bytes()); // IN
        reply.extend_from_slice(&60u32.to_be_bytes());
        reply.extend_from_slice(&4u16.to_be_bytes());
        reply.extend_from_slice(&address.octets());
    }
    Some((format!("{name} {qtype}"), reply))
}
