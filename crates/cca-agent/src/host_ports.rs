//! Host ports something outside the cluster holds. The scheduler hands out
//! host ports from its range knowing only the cluster's own instances; on a
//! machine another cluster or any other program shares, a port may already
//! be bound. Before an instance on the host's network starts (first start
//! or restart) the supervisor asks a [`PortProbe`] whether each of its host
//! ports is free, by binding it on the address the instance will bind — the
//! node's address, or every address for a container whose host ports are
//! published to its own namespace. A held port fails that start with the
//! port and the reason; the agent reports the port in
//! `observed/held-ports/{node}` (before the failed status, so the scheduler
//! sees both) and the scheduler places the instance again on other ports.
//! [`HeldPorts`] keeps the node's set and looks at each port again every
//! [`RECHECK`], dropping the ones freed since.
//!
//! The same holds while an instance runs: another program may have bound
//! its host port first, and a health probe would reach that program. After
//! the first probe of a run that connects, the supervisor asks whose the
//! listener is ([`PortProbe::listener_owner`]); another's fails the probe
//! naming the port.
//!
//! The probe is the one host side effect here, behind the trait: the real
//! [`BindProbe`] binds and closes a socket (with `SO_REUSEADDR` for TCP, so
//! connections of an instance that ended, lingering in `TIME_WAIT`, do not
//! count as held; a listener does) and reads procfs for a listener's owner,
//! and tests give a fake.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use cca_runtime::Protocol;

pub use crate::listeners::ListenerOwner;
use tokio::time::Instant;

/// How often ports found held are looked at again.
pub const RECHECK: Duration = Duration::from_secs(10);

/// Whether a host port is free to bind.
pub trait PortProbe: std::fmt::Debug + Send + Sync {
    /// True when `port` cannot be bound on `address` for `protocol`
    /// because something holds it. Any other failure (an address this host
    /// does not have, no permission) is not a held port: the instance's own
    /// bind will say what is wrong.
    fn is_held(&self, address: IpAddr, port: u16, protocol: Protocol) -> bool;

    /// Whose is the TCP listener a connection to `address:port` reaches:
    /// the process tree of `pid` (the instance's main process), or
    /// something else (see [`crate::listeners`]).
    fn listener_owner(&self, address: IpAddr, port: u16, pid: u32) -> ListenerOwner;
}

/// Binds the port and lets it go at once.
#[derive(Clone, Copy, Debug, Default)]
pub struct BindProbe;

impl PortProbe for BindProbe {
    fn is_held(&self, address: IpAddr, port: u16, protocol: Protocol) -> bool {
        let at = SocketAddr::new(address, port);
        let bound = match protocol {
            Protocol::Tcp => bind_tcp(at),
            Protocol::Udp => std::net::UdpSocket::bind(at).map(drop),
        };
        match bound {
            Ok(()) => false,
            Err(error) if error.kind() == ErrorKind::AddrInUse => true,
            Err(error) => {
                tracing::debug!(%at, %protocol, %error, "probing a host port failed");
                false
            }
        }
    }

    fn listener_owner(&self, address: IpAddr, port: u16, pid: u32) -> ListenerOwner {
        crate::listeners::owner(address, port, pid)
    }
}

fn bind_tcp(at: SocketAddr) -> std::io::Result<()> {
    let socket = match at {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(at)
}

/// Where an instance binds its host ports: the node's address when it is
/// one (instances bind `CCA_ADDRESS`), else every address.
pub fn probe_address(node_address: &str, every_address: bool) -> IpAddr {
    match node_address.parse() {
        Ok(address) if !every_address => address,
        _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    }
}

/// One port found held: where and how it was probed, to probe it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    address: IpAddr,
    protocol: Protocol,
}

/// The node's host ports found held, kept fresh.
#[derive(Debug)]
pub struct HeldPorts {
    ports: BTreeMap<u16, Held>,
    checked_at: Instant,
}

impl HeldPorts {
    pub fn new(now: Instant) -> Self {
        Self {
            ports: BTreeMap::new(),
            checked_at: now,
        }
    }

    /// Records `port` as held on `address` for `protocol`.
    pub fn insert(&mut self, port: u16, address: IpAddr, protocol: Protocol) {
        self.ports.insert(port, Held { address, protocol });
    }

    /// The ports held now.
    pub fn ports(&self) -> std::collections::BTreeSet<u16> {
        self.ports.keys().copied().collect()
    }

    /// Every [`RECHECK`], probes each held port again and forgets those
    /// freed since.
    pub fn recheck(&mut self, probe: &dyn PortProbe, now: Instant) {
        if now.duration_since(self.checked_at) < RECHECK {
            return;
        }
        self.checked_at = now;
        self.ports.retain(|port, held| {
            let still = probe.is_held(held.address, *port, held.protocol);
            if !still {
                tracing::info!(port, "a host port held outside the cluster is free again");
            }
            still
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_holds_its_port_and_a_closed_one_does_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        let port = listener.local_addr().expect("address").port();
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert!(BindProbe.is_held(loopback, port, Protocol::Tcp));
        assert!(
            BindProbe.is_held(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port, Protocol::Tcp),
            "every address includes loopback"
        );
        drop(listener);
        assert!(!BindProbe.is_held(loopback, port, Protocol::Tcp));
    }

    #[test]
    fn a_bound_udp_socket_holds_its_port() {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("binds");
        let port = socket.local_addr().expect("address").port();
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert!(BindProbe.is_held(loopback, port, Protocol::Udp));
        drop(socket);
        assert!(!BindProbe.is_held(loopback, port, Protocol::Udp));
    }

    #[test]
    fn an_address_the_host_lacks_is_not_a_held_port() {
        // TEST-NET-1: never a local address.
        let elsewhere = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        assert!(!BindProbe.is_held(elsewhere, 20_000, Protocol::Tcp));
    }

    #[test]
    fn instances_bind_the_node_address_unless_published_on_every_address() {
        assert_eq!(probe_address("127.0.0.2", false).to_string(), "127.0.0.2");
        assert_eq!(probe_address("127.0.0.2", true).to_string(), "0.0.0.0");
        assert_eq!(
            probe_address("node-1.example", false).to_string(),
            "0.0.0.0"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn held_ports_are_looked_at_again_and_freed_ones_forgotten() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        let port = listener.local_addr().expect("address").port();
        let start = Instant::now();
        let mut held = HeldPorts::new(start);
        held.insert(port, IpAddr::V4(Ipv4Addr::LOCALHOST), Protocol::Tcp);
        drop(listener);
        held.recheck(&BindProbe, start + RECHECK / 2);
        assert_eq!(held.ports().len(), 1, "not yet looked at again");
        held.recheck(&BindProbe, start + RECHECK);
        assert!(held.ports().is_empty(), "free again: forgotten");
    }
}
