//! Root-only tests of the data plane with real traffic in throwaway
//! namespaces (`support::lab`): a node namespace with a bridge and
//! instance namespaces whose servers answer with their names. TCP and UDP
//! through a VIP reach both targets, client-IP affinity sticks, an
//! instance reaches itself through its VIP (hairpin), the node's own
//! processes reach VIPs, an empty VIP refuses at once, a removed target
//! gets no new flows while established TCP continues and UDP moves to a
//! live target without a lost datagram, policy allows and denies by the
//! first matching rule, and nothing is left afterwards. Without root the
//! tests skip and say so.
#![allow(clippy::unwrap_used, reason = "a test's helpers fail the test")]

#[path = "support/lab.rs"]
mod lab;

use std::collections::BTreeMap;
use std::io::{ErrorKind, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use cca_model::net::{Affinity, Member, NetworkChange, NetworkMap, ServiceNet, Target, Touched};
use cca_model::spec::{NetworkPolicy, NetworkRule, Peer, PortSpec, Protocol, RuleAction};
use cca_net::dataplane::{DataPlane, DataPlaneConfig, Nft, PacketFilter};

use lab::{Instance, Lab, OTHER_TCP_PORT, TCP_PORT, UDP_PORT, ask_tcp, ask_udp, in_netns, tally};

const NODE: &str = "node-a";
/// The VIP ports: TCP 80 to the instances' 8080, UDP 53 to their 5353.
const VIP_TCP: u16 = 80;
const VIP_UDP: u16 = 53;

fn vip(lab: &Lab, last: u8) -> Ipv4Addr {
    let octets = lab.gateway.octets();
    Ipv4Addr::new(10, 96, octets[2], last)
}

/// A service with VIP ports TCP 80 and UDP 53 over `targets`, whose
/// members are `members` (all on this node).
fn service(
    name: &str,
    vip: Option<Ipv4Addr>,
    targets: &[&Instance],
    members: &[&Instance],
) -> ServiceNet {
    let ports = vec![
        PortSpec {
            name: Some("http".into()),
            number: VIP_TCP,
            protocol: Protocol::Tcp,
        },
        PortSpec {
            name: Some("dns".into()),
            number: VIP_UDP,
            protocol: Protocol::Udp,
        },
    ];
    let to = |port| {
        targets
            .iter()
            .map(|i| Target {
                instance: i.name.clone(),
                node: NODE.into(),
                address: i.address,
                port,
            })
            .collect::<Vec<_>>()
    };
    ServiceNet {
        name: name.into(),
        vip,
        ports,
        affinity: Affinity::None,
        endpoints: BTreeMap::from([("http".into(), to(TCP_PORT)), ("dns".into(), to(UDP_PORT))]),
        members: members
            .iter()
            .map(|i| Member {
                instance: i.name.clone(),
                node: NODE.into(),
                address: i.address,
                ordinal: None,
                host_network: false,
            })
            .collect(),
        asleep: false,
        scale_to_zero: None,
    }
}

/// The data plane of `lab`'s node, with its own table name.
struct Plane {
    plane: DataPlane<Nft>,
    node: String,
    map: NetworkMap,
}

impl Plane {
    fn new(lab: &Lab) -> Plane {
        let config = DataPlaneConfig {
            table: format!("cca-svc-{}", lab.tag),
            node: NODE.into(),
        };
        let mut plane = Plane {
            plane: DataPlane::new(config, Nft::new()).unwrap(),
            node: lab.node.clone(),
            map: NetworkMap::default(),
        };
        let map = plane.map.clone();
        let node = plane.node.clone();
        let dataplane = &mut plane.plane;
        in_netns(&node, || dataplane.resync(&map)).unwrap();
        plane
    }

    /// Applies `changes` to the map and syncs; returns how long `sync`
    /// took.
    fn change(&mut self, changes: Vec<NetworkChange>) -> Duration {
        let mut touched = Touched::default();
        for change in changes {
            self.map.apply(change, &mut touched);
        }
        let (map, plane) = (&self.map, &mut self.plane);
        let started = Instant::now();
        in_netns(&self.node, || plane.sync(map, &touched)).unwrap();
        started.elapsed()
    }

    fn put(&mut self, service: ServiceNet) -> Duration {
        self.change(vec![NetworkChange::Service(Arc::new(service))])
    }

    fn table(&self) -> Option<String> {
        let table = self.plane.config().table.clone();
        let filter = self.plane.filter();
        in_netns(&self.node, || filter.list_table(&table)).unwrap()
    }

    fn remove(&mut self) {
        let plane = &mut self.plane;
        in_netns(&self.node, || plane.remove()).unwrap();
    }
}

fn answers(netns: &str, to: SocketAddr, count: usize, udp: bool) -> BTreeMap<String, usize> {
    in_netns(netns, || {
        tally((0..count).map(|_| {
            if udp {
                ask_udp(to).unwrap_or_else(|e| panic!("udp to {to}: {e:?}"))
            } else {
                ask_tcp(to).unwrap_or_else(|e| panic!("tcp to {to}: {e:?}"))
            }
        }))
    })
}

#[test]
fn a_vip_balances_tcp_and_udp_from_instances_and_the_node() {
    if !lab::root_test("a_vip_balances_tcp_and_udp_from_instances_and_the_node") {
        return;
    }
    let lab = Lab::new(3);
    let (a, b, client) = (lab.instance("i0"), lab.instance("i1"), lab.instance("i2"));
    let mut plane = Plane::new(&lab);
    let web = vip(&lab, 1);
    plane.put(service("web", Some(web), &[a, b], &[a, b]));

    let both = ["i0", "i1"];
    for (who, netns) in [
        ("an instance", client.netns.as_str()),
        ("the node", lab.node.as_str()),
    ] {
        let tcp = answers(netns, SocketAddr::from((web, VIP_TCP)), 40, false);
        let udp = answers(netns, SocketAddr::from((web, VIP_UDP)), 40, true);
        for name in both {
            assert!(
                tcp.get(name).is_some_and(|&n| n > 0),
                "tcp from {who}: {tcp:?}"
            );
            assert!(
                udp.get(name).is_some_and(|&n| n > 0),
                "udp from {who}: {udp:?}"
            );
        }
    }

    // One map lookup: the VIP port is an element of the services map.
    let listing = plane.table().expect("the table exists");
    assert!(listing.contains("\"services\""), "{listing}");
    plane.remove();
    assert_eq!(plane.table(), None, "remove leaves no table");
}

#[test]
fn client_ip_affinity_sticks_and_hairpin_reaches_itself() {
    if !lab::root_test("client_ip_affinity_sticks_and_hairpin_reaches_itself") {
        return;
    }
    let lab = Lab::new(3);
    let (a, b, client) = (lab.instance("i0"), lab.instance("i1"), lab.instance("i2"));
    let mut plane = Plane::new(&lab);
    let sticky = vip(&lab, 2);
    let mut web = service("web", Some(sticky), &[a, b], &[a, b]);
    web.affinity = Affinity::ClientIp;
    plane.put(web);
    for netns in [client.netns.as_str(), lab.node.as_str()] {
        let tcp = answers(netns, SocketAddr::from((sticky, VIP_TCP)), 20, false);
        assert_eq!(tcp.len(), 1, "one client address, one backend: {tcp:?}");
        let udp = answers(netns, SocketAddr::from((sticky, VIP_UDP)), 20, true);
        assert_eq!(udp.len(), 1, "{udp:?}");
    }

    // Hairpin: the only target reaches its own service.
    let alone = vip(&lab, 3);
    plane.put(service("alone", Some(alone), &[a], &[a]));
    let own = answers(&a.netns, SocketAddr::from((alone, VIP_TCP)), 5, false);
    assert_eq!(own, BTreeMap::from([("i0".to_owned(), 5)]));
    let own = answers(&a.netns, SocketAddr::from((alone, VIP_UDP)), 5, true);
    assert_eq!(own, BTreeMap::from([("i0".to_owned(), 5)]));
}

#[test]
fn an_empty_vip_refuses_at_once() {
    if !lab::root_test("an_empty_vip_refuses_at_once") {
        return;
    }
    let lab = Lab::new(1);
    let client = lab.instance("i0");
    let mut plane = Plane::new(&lab);
    let empty = vip(&lab, 4);
    plane.put(service("empty", Some(empty), &[], &[]));
    for netns in [client.netns.as_str(), lab.node.as_str()] {
        let refused = in_netns(netns, || ask_tcp(SocketAddr::from((empty, VIP_TCP))));
        let (kind, took) = refused.expect_err("no backend, no connection");
        assert_eq!(kind, ErrorKind::ConnectionRefused, "a reset from {netns}");
        assert!(
            took < Duration::from_millis(500),
            "at once, not a timeout: {took:?}"
        );
        // An instance hears the ICMP port-unreachable; on the node itself
        // the datagram is refused on its way out, so `send` fails at once.
        let refused = in_netns(netns, || ask_udp(SocketAddr::from((empty, VIP_UDP))));
        let expected = if netns == lab.node {
            ErrorKind::PermissionDenied
        } else {
            ErrorKind::ConnectionRefused
        };
        assert_eq!(refused, Err(expected), "udp from {netns}");
    }
}

#[test]
fn a_removed_target_gets_no_new_flows_while_established_ones_live_on() {
    if !lab::root_test("a_removed_target_gets_no_new_flows_while_established_ones_live_on") {
        return;
    }
    let lab = Lab::new(3);
    let (a, b, client) = (lab.instance("i0"), lab.instance("i1"), lab.instance("i2"));
    let mut plane = Plane::new(&lab);
    let web = vip(&lab, 5);
    plane.put(service("web", Some(web), &[a, b], &[a, b]));

    // An established TCP connection and a steady UDP flow from one socket.
    let mut established = in_netns(&client.netns, || {
        TcpStream::connect_timeout(&SocketAddr::from((web, VIP_TCP)), Duration::from_secs(2))
    })
    .expect("tcp through the VIP");
    established
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    established.write_all(b"who\n").unwrap();
    let first = lab::read_line(&mut established).unwrap();
    let udp = in_netns(&client.netns, || {
        UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
    })
    .unwrap();
    udp.connect((web, VIP_UDP)).unwrap();
    let sent = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (sent, stop) = (sent.clone(), stop.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let seq = sent.load(Ordering::SeqCst);
                if udp.send(&seq.to_be_bytes()).is_ok() {
                    sent.fetch_add(1, Ordering::SeqCst);
                }
                thread::sleep(Duration::from_millis(2));
            }
        })
    };
    // Wait for the flow to settle on a backend.
    let deadline = Instant::now() + Duration::from_secs(5);
    let pinned = loop {
        if let Some(i) = [a, b]
            .into_iter()
            .find(|i| !i.datagrams.lock().unwrap().is_empty())
        {
            break i;
        }
        assert!(Instant::now() < deadline, "no datagram arrived");
        thread::sleep(Duration::from_millis(10));
    };
    let live = if pinned.name == "i0" { b } else { a };
    thread::sleep(Duration::from_millis(100));

    // The backend the UDP flow is pinned to leaves the endpoints (its
    // instance lives on, as a stopping one would while it drains).
    let took = plane.put(service("web", Some(web), &[live], &[a, b]));
    let after = sent.load(Ordering::SeqCst);
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    sender.join().unwrap();
    thread::sleep(Duration::from_millis(100));
    let total = sent.load(Ordering::SeqCst);

    let to_pinned: Vec<u64> = pinned.datagrams.lock().unwrap().clone();
    let to_live: Vec<u64> = live.datagrams.lock().unwrap().clone();
    assert!(
        to_pinned.iter().all(|&seq| seq <= after),
        "nothing sent after the sync reached the removed target (sync took {took:?})"
    );
    assert!(
        to_live.iter().any(|&seq| seq > after),
        "the flow moved to the live target"
    );
    let mut received: Vec<u64> = to_pinned.iter().chain(&to_live).copied().collect();
    received.sort_unstable();
    received.dedup();
    assert_eq!(
        received.len() as u64,
        total,
        "no datagram lost: {} sent, {} to {}, {} to {}",
        total,
        to_pinned.len(),
        pinned.name,
        to_live.len(),
        live.name
    );

    // TCP: the established connection still talks to its backend; new
    // connections all go to the one left.
    established.write_all(b"who\n").unwrap();
    assert_eq!(lab::read_line(&mut established).unwrap(), first);
    let fresh = answers(&client.netns, SocketAddr::from((web, VIP_TCP)), 20, false);
    assert_eq!(fresh, BTreeMap::from([(live.name.clone(), 20)]));
}

fn rule(
    action: RuleAction,
    from: Peer,
    to: Peer,
    ports: &[u16],
    protocol: Option<Protocol>,
) -> NetworkRule {
    NetworkRule {
        action,
        from,
        to,
        ports: ports.to_vec(),
        protocol,
    }
}

#[test]
fn policy_allows_and_denies_by_the_first_matching_rule() {
    if !lab::root_test("policy_allows_and_denies_by_the_first_matching_rule") {
        return;
    }
    let lab = Lab::new(3);
    let (web, db, other) = (lab.instance("i0"), lab.instance("i1"), lab.instance("i2"));
    let mut plane = Plane::new(&lab);
    let db_vip = vip(&lab, 6);
    plane.change(vec![
        NetworkChange::Service(Arc::new(service("web", None, &[], &[web]))),
        NetworkChange::Service(Arc::new(service("db", Some(db_vip), &[db], &[db]))),
        NetworkChange::Service(Arc::new(service("other", None, &[], &[other]))),
        NetworkChange::Policy(Arc::new(NetworkPolicy {
            name: "default".into(),
            tenant: None,
            rules: vec![
                rule(
                    RuleAction::Deny,
                    Peer::Service("web".into()),
                    Peer::Service("db".into()),
                    &[OTHER_TCP_PORT],
                    Some(Protocol::Tcp),
                ),
                rule(
                    RuleAction::Allow,
                    Peer::Service("web".into()),
                    Peer::Service("db".into()),
                    &[],
                    None,
                ),
                rule(
                    RuleAction::Deny,
                    Peer::Any,
                    Peer::Service("db".into()),
                    &[],
                    None,
                ),
            ],
        })),
    ]);
    let direct = SocketAddr::from((db.address, TCP_PORT));
    let other_port = SocketAddr::from((db.address, OTHER_TCP_PORT));
    let udp = SocketAddr::from((db.address, UDP_PORT));
    let through_vip = SocketAddr::from((db_vip, VIP_TCP));

    let refused_fast = |netns: &str, to: SocketAddr| {
        let (kind, took) = in_netns(netns, || ask_tcp(to)).expect_err("denied");
        assert_eq!(
            kind,
            ErrorKind::ConnectionRefused,
            "{netns} -> {to}: a reset"
        );
        assert!(
            took < Duration::from_millis(500),
            "{netns} -> {to}: at once ({took:?})"
        );
    };
    // web -> db: allowed, but its port 9090 is denied by the rule before.
    assert_eq!(
        in_netns(&web.netns, || ask_tcp(direct)),
        Ok("i1".to_owned())
    );
    assert_eq!(
        in_netns(&web.netns, || ask_tcp(through_vip)),
        Ok("i1".to_owned())
    );
    assert_eq!(in_netns(&web.netns, || ask_udp(udp)), Ok("i1".to_owned()));
    refused_fast(&web.netns, other_port);
    // other -> db: the catch-all deny, direct and through the VIP.
    refused_fast(&other.netns, direct);
    refused_fast(&other.netns, through_vip);
    assert_eq!(
        in_netns(&other.netns, || ask_udp(udp)),
        Err(ErrorKind::ConnectionRefused),
        "denied UDP gets an ICMP unreachable"
    );
    // No rule names web as a destination: open.
    assert_eq!(
        in_netns(&db.netns, || ask_tcp(SocketAddr::from((
            web.address,
            TCP_PORT
        )))),
        Ok("i0".to_owned())
    );
    // The node reaches its own instances whatever the rules say.
    assert_eq!(in_netns(&lab.node, || ask_tcp(direct)), Ok("i1".to_owned()));

    // Rules follow instances: `other` moves into web's set.
    plane.put(service("web", None, &[], &[web, other]));
    assert_eq!(
        in_netns(&other.netns, || ask_tcp(direct)),
        Ok("i1".to_owned())
    );
    // And policies change: without the policy everything is open.
    plane.change(vec![
        NetworkChange::Service(Arc::new(service("web", None, &[], &[web]))),
        NetworkChange::PolicyGone {
            policy: "default".into(),
        },
    ]);
    assert_eq!(
        in_netns(&other.netns, || ask_tcp(direct)),
        Ok("i1".to_owned())
    );
    assert_eq!(
        in_netns(&web.netns, || ask_tcp(other_port)),
        Ok("i1".to_owned())
    );
}

#[test]
fn nothing_is_left_behind() {
    if !lab::root_test("nothing_is_left_behind") {
        return;
    }
    let lab = Lab::new(2);
    let (a, b) = (lab.instance("i0"), lab.instance("i1"));
    let mut plane = Plane::new(&lab);
    plane.put(service("web", Some(vip(&lab, 7)), &[a, b], &[a, b]));
    assert!(plane.table().is_some());
    plane.remove();
    assert_eq!(plane.table(), None);
    let namespaces = lab.namespaces();
    drop(plane);
    drop(lab);
    let left = lab::run("ip", &["netns", "list"]);
    for netns in namespaces {
        assert!(!left.contains(&netns), "{netns} left behind: {left}");
    }
}
