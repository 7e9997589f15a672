//! Unit tests of the compiler and of `sync`/`resync` against the modelling
//! fake: the table a map builds, how small one endpoint change is, that
//! any sequence of incremental changes leaves exactly what a rebuild
//! would, policy order, UDP conntrack cleanup and recovery after a failure.
#![allow(clippy::unwrap_used)]

use std::net::Ipv4Addr;
use std::sync::Arc;

use nftables::schema::{FlushObject, NfCmd, NfListObject};
use serde_json::json;

use cca_model::net::{Affinity, Member, NetworkChange, NetworkMap, ServiceNet, Target, Touched};
use cca_model::spec::{NetworkPolicy, NetworkRule, Peer, PortSpec, Protocol, RuleAction};

use super::fake::{FakeFilter, FakeFlow, FakeTable};
use super::*;

const NODE: &str = "n1";

fn ip(text: &str) -> Ipv4Addr {
    text.parse().unwrap()
}

/// A service on `ports` whose every port balances over `targets`
/// (instance, address, port), each also a member on node n1.
pub(crate) fn service(
    name: &str,
    vip: Option<&str>,
    ports: &[(u16, Protocol)],
    targets: &[(&str, &str, u16)],
) -> ServiceNet {
    let ports: Vec<PortSpec> = ports
        .iter()
        .map(|&(number, protocol)| PortSpec {
            name: None,
            number,
            protocol,
        })
        .collect();
    let targets: Vec<Target> = targets
        .iter()
        .map(|&(instance, address, port)| Target {
            instance: instance.into(),
            node: NODE.into(),
            address: ip(address),
            port,
        })
        .collect();
    ServiceNet {
        name: name.into(),
        vip: vip.map(ip),
        endpoints: ports
            .iter()
            .map(|port| (port.number.to_string(), targets.clone()))
            .collect(),
        ports,
        affinity: Affinity::None,
        members: targets
            .iter()
            .map(|target| Member {
                instance: target.instance.clone(),
                node: NODE.into(),
                address: target.address,
                ordinal: None,
                host_network: false,
            })
            .collect(),
        asleep: false,
        scale_to_zero: None,
    }
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

fn svc(name: &str) -> Peer {
    Peer::Service(name.into())
}

pub(crate) fn put(map: &mut NetworkMap, service: ServiceNet) -> Touched {
    let mut touched = Touched::default();
    map.apply(NetworkChange::Service(Arc::new(service)), &mut touched);
    touched
}

fn data_plane() -> DataPlane<FakeFilter> {
    DataPlane::new(
        DataPlaneConfig {
            table: "cca-svc".into(),
            node: NODE.into(),
        },
        FakeFilter::new(),
    )
    .unwrap()
}

/// The table a fresh data plane builds from `map`.
fn rebuilt(map: &NetworkMap) -> FakeTable {
    let mut fresh = data_plane();
    fresh.resync(map).unwrap();
    fresh.filter().table("cca-svc").unwrap()
}

fn table(plane: &DataPlane<FakeFilter>) -> FakeTable {
    plane.filter().table("cca-svc").unwrap()
}

fn elements(table: &FakeTable, set: &str) -> Vec<String> {
    table.sets[set].elements.keys().cloned().collect()
}

fn two_services() -> NetworkMap {
    let mut map = NetworkMap::default();
    put(
        &mut map,
        service(
            "web",
            Some("10.43.0.1"),
            &[(80, Protocol::Tcp), (53, Protocol::Udp)],
            &[("w1", "10.42.0.2", 8080), ("w2", "10.42.0.3", 8080)],
        ),
    );
    let mut db = service("db", Some("10.43.0.2"), &[(5432, Protocol::Tcp)], &[]);
    db.members = vec![
        Member {
            instance: "db-0".into(),
            node: "n2".into(),
            address: ip("10.42.1.2"),
            ordinal: Some(0),
            host_network: false,
        },
        Member {
            instance: "db-1".into(),
            node: NODE.into(),
            address: ip("192.168.0.10"),
            ordinal: Some(1),
            host_network: true,
        },
    ];
    put(&mut map, db);
    map
}

#[test]
fn a_resync_builds_the_table_the_map_describes() {
    let map = two_services();
    let mut plane = data_plane();
    let report = plane.resync(&map).unwrap();
    assert!(report.resynced);
    let built = table(&plane);

    assert_eq!(
        elements(&built, "services"),
        vec![
            json!({"concat": ["10.43.0.1", "tcp", 80]}).to_string(),
            json!({"concat": ["10.43.0.1", "udp", 53]}).to_string(),
            json!({"concat": ["10.43.0.2", "tcp", 5432]}).to_string(),
        ]
    );
    // Each port goes to the chain for its number of backends (none: refused).
    let goes_to = |vip: &str, proto: &str, port: u16| {
        let key = json!({"concat": [vip, proto, port]}).to_string();
        built.sets["services"].elements[&key].clone()
    };
    assert_eq!(
        goes_to("10.43.0.1", "tcp", 80),
        Some(json!({"goto": {"target": "pick-tcp-2"}}))
    );
    assert_eq!(
        goes_to("10.43.0.1", "udp", 53),
        Some(json!({"goto": {"target": "pick-udp-2"}}))
    );
    assert_eq!(
        goes_to("10.43.0.2", "tcp", 5432),
        Some(json!({"goto": {"target": "refuse-tcp"}}))
    );
    // Two backends: a random pick of two slots, each a DNAT through the
    // maps of its index.
    assert_eq!(
        built.chains["pick-tcp-2"].rules,
        vec![json!([{"vmap": {
            "key": {"numgen": {"mode": "random", "mod": 2}},
            "data": {"set": [[0, {"goto": {"target": "slot-tcp-0"}}], [1, {"goto": {"target": "slot-tcp-1"}}]]},
        }}])]
    );
    let key = json!({"concat": [{"payload": {"protocol": "ip", "field": "daddr"}}, {"meta": {"key": "l4proto"}}, {"payload": {"protocol": "th", "field": "dport"}}]});
    assert_eq!(
        built.chains["slot-tcp-1"].rules,
        vec![json!([
            {"match": {"left": {"meta": {"key": "l4proto"}}, "right": "tcp", "op": "=="}},
            {"dnat": {"family": "ip",
                "addr": {"map": {"key": key, "data": "@addr-1"}},
                "port": {"map": {"key": key, "data": "@port-1"}}}},
        ])]
    );
    let web_http = json!({"concat": ["10.43.0.1", "tcp", 80]}).to_string();
    assert_eq!(
        built.sets["addr-0"].elements[&web_http],
        Some(json!("10.42.0.2"))
    );
    assert_eq!(
        built.sets["addr-1"].elements[&web_http],
        Some(json!("10.42.0.3"))
    );
    assert_eq!(built.sets["port-1"].elements[&web_http], Some(json!(8080)));
    assert!(
        !built.chains.contains_key("slot-tcp-2"),
        "no slot no port needs"
    );
    // No backends: refused at once.
    assert_eq!(
        built.chains["refuse-tcp"].rules,
        vec![json!([
            {"match": {"left": {"meta": {"key": "l4proto"}}, "right": "tcp", "op": "=="}},
            {"reject": {"type": "tcp reset"}},
        ])]
    );
    assert_eq!(
        elements(&built, "vips"),
        vec!["\"10.43.0.1\"", "\"10.43.0.2\""]
    );
    // Every VIP and member: db-0 lives on n2, db-1 shares its node's
    // address and is in no set.
    assert_eq!(
        elements(&built, "members"),
        vec![
            "\"10.42.0.2\"",
            "\"10.42.0.3\"",
            "\"10.42.1.2\"",
            "\"10.43.0.1\"",
            "\"10.43.0.2\""
        ]
    );
    assert_eq!(
        elements(&built, "local"),
        vec!["\"10.42.0.2\"", "\"10.42.0.3\""]
    );
    assert_eq!(
        elements(&built, "hairpin"),
        vec![
            json!({"concat": ["10.42.0.2", "10.42.0.2"]}).to_string(),
            json!({"concat": ["10.42.0.3", "10.42.0.3"]}).to_string(),
        ]
    );
    for base in [
        "nat-prerouting",
        "nat-output",
        "nat-postrouting",
        "policy-prerouting",
        "policy-output",
    ] {
        assert!(built.chains[base].base, "{base}");
    }
    assert!(
        built.chains["policy"].rules.is_empty(),
        "no policies, no rules"
    );
}

#[test]
fn the_resync_batch_reads_as_expected() {
    let mut map = NetworkMap::default();
    let mut web = service(
        "web",
        Some("10.43.0.1"),
        &[(80, Protocol::Tcp)],
        &[("w1", "10.42.0.2", 8080), ("w2", "10.42.0.3", 8080)],
    );
    web.affinity = Affinity::ClientIp;
    put(&mut map, web);
    let mut touched = Touched::default();
    map.apply(
        NetworkChange::Policy(Arc::new(NetworkPolicy {
            name: "default".into(),
            tenant: None,
            rules: vec![rule(
                RuleAction::Deny,
                Peer::Any,
                svc("web"),
                &[22, 80],
                None,
            )],
        })),
        &mut touched,
    );
    let mut plane = data_plane();
    plane.resync(&map).unwrap();
    let batch = &plane.filter().batches()[0];
    let pretty: serde_json::Value = serde_json::from_str(&batch.to_json()).unwrap();
    insta::assert_snapshot!(serde_json::to_string_pretty(&pretty).unwrap());
}

#[test]
fn one_endpoint_change_is_one_small_transaction() {
    let mut map = NetworkMap::default();
    for i in 0..100 {
        put(
            &mut map,
            service(
                &format!("s{i}"),
                Some(&format!("10.43.0.{}", i + 1)),
                &[(80, Protocol::Tcp)],
                &[
                    ("a", &format!("10.42.{i}.2"), 8080),
                    ("b", &format!("10.42.{i}.3"), 8080),
                ],
            ),
        );
    }
    // One service with one backend: every dispatch chain the change
    // needs exists already.
    put(
        &mut map,
        service(
            "one",
            Some("10.43.1.1"),
            &[(80, Protocol::Tcp)],
            &[("o", "10.42.200.2", 8080)],
        ),
    );
    let mut plane = data_plane();
    plane.resync(&map).unwrap();
    plane.filter().clear_calls();

    // s42's second backend turns unready: an endpoint leaves, the member stays.
    let mut s42 = (*map.services["s42"]).clone();
    s42.endpoints
        .insert("80".into(), s42.endpoints["80"][..1].to_vec());
    let touched = put(&mut map, s42);
    let report = plane.sync(&map, &touched).unwrap();
    assert!(!report.resynced);
    let batches = plane.filter().batches();
    assert_eq!(batches.len(), 1, "one transaction");
    let commands = batches[0].commands();
    // Out of addr-1 and port-1, and from pick-tcp-2 to pick-tcp-1: element
    // changes only, no rule or chain.
    assert_eq!(commands.len(), 4, "{commands:#?}");
    assert!(
        commands.iter().all(|c| matches!(
            c,
            Command::Nft(
                NfCmd::Add(NfListObject::Element(_)) | NfCmd::Delete(NfListObject::Element(_))
            )
        )),
        "{commands:#?}"
    );
    assert_eq!(table(&plane), rebuilt(&map));

    // The same map again changes nothing and applies nothing.
    plane.filter().clear_calls();
    let report = plane.sync(&map, &touched).unwrap();
    assert_eq!(report, SyncReport::default());
    assert!(plane.filter().batches().is_empty());
}

#[test]
fn policies_keep_their_order_and_follow_members() {
    let mut map = two_services();
    let mut touched = Touched::default();
    // Policies are judged in name order: "a" before "b".
    map.apply(
        NetworkChange::Policy(Arc::new(NetworkPolicy {
            name: "b".into(),
            tenant: None,
            rules: vec![rule(RuleAction::Deny, Peer::Any, svc("db"), &[], None)],
        })),
        &mut touched,
    );
    map.apply(
        NetworkChange::Policy(Arc::new(NetworkPolicy {
            name: "a".into(),
            tenant: None,
            rules: vec![
                rule(
                    RuleAction::Allow,
                    svc("web"),
                    svc("db"),
                    &[5432],
                    Some(Protocol::Tcp),
                ),
                rule(RuleAction::Deny, svc("web"), Peer::Any, &[53], None),
            ],
        })),
        &mut touched,
    );
    let mut plane = data_plane();
    plane.resync(&two_services()).unwrap();
    plane.sync(&map, &touched).unwrap();
    let built = table(&plane);
    assert_eq!(built, rebuilt(&map));
    let rules = &built.chains["policy"].rules;
    assert_eq!(
        rules[0],
        json!([
            {"match": {"left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "@m-web", "op": "=="}},
            {"match": {"left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "@m-db", "op": "=="}},
            {"match": {"left": {"meta": {"key": "l4proto"}}, "right": "tcp", "op": "=="}},
            {"match": {"left": {"payload": {"protocol": "th", "field": "dport"}}, "right": 5432, "op": "=="}},
            {"accept": null},
        ])
    );
    assert_eq!(
        rules[1],
        json!([
            {"match": {"left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "@m-web", "op": "=="}},
            {"match": {"left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "@members", "op": "=="}},
            {"match": {"left": {"meta": {"key": "l4proto"}}, "right": {"set": ["tcp", "udp"]}, "op": "=="}},
            {"match": {"left": {"payload": {"protocol": "th", "field": "dport"}}, "right": 53, "op": "=="}},
            {"goto": {"target": "policy-deny"}},
        ])
    );
    assert_eq!(
        rules[2],
        json!([
            {"match": {"left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "@m-db", "op": "=="}},
            {"goto": {"target": "policy-deny"}},
        ])
    );
    // A service is its VIP and members; host-network members are in no set.
    assert_eq!(
        elements(&built, "m-db"),
        vec!["\"10.42.1.2\"", "\"10.43.0.2\""]
    );
    assert_eq!(
        elements(&built, "m-web"),
        vec!["\"10.42.0.2\"", "\"10.42.0.3\"", "\"10.43.0.1\""]
    );

    // Rules follow instances: web moves to a new address.
    let touched = put(
        &mut map,
        service(
            "web",
            Some("10.43.0.1"),
            &[(80, Protocol::Tcp), (53, Protocol::Udp)],
            &[("w1", "10.42.0.2", 8080), ("w3", "10.42.0.9", 8080)],
        ),
    );
    plane.filter().clear_calls();
    plane.sync(&map, &touched).unwrap();
    assert_eq!(
        elements(&table(&plane), "m-web"),
        vec!["\"10.42.0.2\"", "\"10.42.0.9\"", "\"10.43.0.1\""]
    );
    assert_eq!(table(&plane), rebuilt(&map));
    let commands = plane.filter().batches()[0].commands();
    assert!(
        !commands.iter().any(|c| matches!(c, Command::Nft(NfCmd::Flush(FlushObject::Chain(chain))) if chain.name == "policy")),
        "a member change leaves the policy chain alone: {commands:#?}"
    );

    // A policy that goes takes its member sets along.
    let mut touched = Touched::default();
    map.apply(
        NetworkChange::PolicyGone { policy: "a".into() },
        &mut touched,
    );
    plane.sync(&map, &touched).unwrap();
    let built = table(&plane);
    assert!(!built.sets.contains_key("m-web"));
    assert_eq!(built.chains["policy"].rules.len(), 1);
    assert_eq!(built, rebuilt(&map));
}

#[test]
fn udp_flows_to_a_backend_that_left_are_cleared() {
    let mut map = NetworkMap::default();
    let targets = [("a", "10.42.0.2", 5353), ("b", "10.42.0.3", 5353)];
    put(
        &mut map,
        service(
            "dns",
            Some("10.43.0.5"),
            &[(53, Protocol::Udp), (53, Protocol::Tcp)],
            &targets,
        ),
    );
    let mut plane = data_plane();
    plane.resync(&map).unwrap();
    let vip = (ip("10.43.0.5"), 53);
    let via_a = FakeFlow {
        destination: vip,
        reply_source: (ip("10.42.0.2"), 5353),
    };
    let via_b = FakeFlow {
        destination: vip,
        reply_source: (ip("10.42.0.3"), 5353),
    };
    let elsewhere = FakeFlow {
        destination: (ip("10.43.0.6"), 53),
        reply_source: (ip("10.42.0.3"), 5353),
    };
    for flow in [via_a, via_b, elsewhere] {
        plane.filter().add_flow(flow);
    }

    let touched = put(
        &mut map,
        service(
            "dns",
            Some("10.43.0.5"),
            &[(53, Protocol::Udp), (53, Protocol::Tcp)],
            &targets[..1],
        ),
    );
    let report = plane.sync(&map, &touched).unwrap();
    assert_eq!(report.conntrack_deleted, 1);
    assert_eq!(
        plane.filter().flows(),
        [via_a, elsewhere].into_iter().collect(),
        "only the flow through the backend that left goes"
    );
    let cleanup = plane
        .filter()
        .calls()
        .into_iter()
        .rev()
        .find_map(|call| match call {
            fake::Call::DeleteConntrack(cleanup) => Some(cleanup),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        cleanup.ports.keys().collect::<Vec<_>>(),
        vec![&vip],
        "the TCP port's flows are left to drain"
    );

    // The service goes: every UDP flow through its VIP goes too.
    let mut touched = Touched::default();
    map.apply(
        NetworkChange::ServiceGone {
            service: "dns".into(),
        },
        &mut touched,
    );
    plane.sync(&map, &touched).unwrap();
    assert_eq!(plane.filter().flows(), [elsewhere].into_iter().collect());
    assert_eq!(table(&plane), rebuilt(&map));
}

#[test]
fn a_failed_change_is_followed_by_a_rebuild() {
    let mut map = two_services();
    let mut plane = data_plane();
    plane.resync(&map).unwrap();
    plane.filter().fail("apply");
    let touched = put(
        &mut map,
        service("new", Some("10.43.0.9"), &[(80, Protocol::Tcp)], &[]),
    );
    let error = plane.sync(&map, &touched).unwrap_err();
    assert!(matches!(error, Error::Injected { .. }), "{error}");
    plane.filter().heal("apply");
    let report = plane.sync(&map, &Touched::default()).unwrap();
    assert!(report.resynced, "the next sync rebuilds");
    assert_eq!(table(&plane), rebuilt(&map));
}

#[test]
fn a_table_name_the_kernel_would_refuse_is_refused_here() {
    for bad in ["", "has space", &"x".repeat(65)] {
        let config = DataPlaneConfig {
            table: bad.to_owned(),
            node: NODE.into(),
        };
        let error = DataPlane::new(config, FakeFilter::new()).unwrap_err();
        assert!(error.to_string().contains("table name"), "{error}");
    }
}

#[test]
fn remove_deletes_the_table() {
    let mut plane = data_plane();
    plane.resync(&two_services()).unwrap();
    plane.remove().unwrap();
    assert!(plane.filter().table("cca-svc").is_none());
}

/// A random service among a few names, VIPs, ports and addresses
/// (addresses may repeat across services: the shared sets count them).
pub(crate) fn random_service(rng: &mut fastrand::Rng, index: usize) -> ServiceNet {
    let name = format!("s{index}");
    let vip = match rng.u8(0..4) {
        0 => None,
        1 => Some(format!("10.43.1.{index}")),
        _ => Some(format!("10.43.0.{index}")),
    };
    let all_ports = [
        (80, Protocol::Tcp),
        (53, Protocol::Udp),
        (8080, Protocol::Tcp),
    ];
    let ports: Vec<(u16, Protocol)> = all_ports.iter().copied().filter(|_| rng.bool()).collect();
    let mut service = service(&name, vip.as_deref(), &ports, &[]);
    for port in &service.ports {
        let targets = (0..rng.usize(0..4))
            .map(|_| Target {
                instance: format!("i{}", rng.u8(0..10)),
                node: NODE.into(),
                address: Ipv4Addr::new(10, 42, 0, rng.u8(1..12)),
                port: [8080, 9090][rng.usize(0..2)],
            })
            .collect();
        service.endpoints.insert(port.number.to_string(), targets);
    }
    service.affinity = if rng.bool() {
        Affinity::ClientIp
    } else {
        Affinity::None
    };
    service.members = (0..rng.usize(0..4))
        .map(|_| Member {
            instance: format!("m{}", rng.u8(0..10)),
            node: ["n1", "n2"][rng.usize(0..2)].into(),
            address: Ipv4Addr::new(10, 42, 0, rng.u8(1..12)),
            ordinal: None,
            host_network: rng.u8(0..5) == 0,
        })
        .collect();
    service
}

fn random_policy(rng: &mut fastrand::Rng) -> NetworkPolicy {
    let peer = |rng: &mut fastrand::Rng| match rng.u8(0..4) {
        0 => Peer::Any,
        n => svc(&format!("s{n}")),
    };
    NetworkPolicy {
        name: ["a", "b"][rng.usize(0..2)].into(),
        tenant: None,
        rules: (0..rng.usize(0..4))
            .map(|_| {
                let action = if rng.bool() {
                    RuleAction::Allow
                } else {
                    RuleAction::Deny
                };
                let (from, to) = (peer(rng), peer(rng));
                let ports: Vec<u16> = [80, 53].into_iter().filter(|_| rng.bool()).collect();
                let protocol = [None, Some(Protocol::Tcp), Some(Protocol::Udp)][rng.usize(0..3)];
                rule(action, from, to, &ports, protocol)
            })
            .collect(),
    }
}

#[test]
fn incremental_syncs_leave_exactly_what_a_rebuild_would() {
    for seed in 0..40 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut map = NetworkMap::default();
        let mut plane = data_plane();
        plane.resync(&map).unwrap();
        for step in 0..25 {
            let mut touched = Touched::default();
            for _ in 0..rng.usize(1..4) {
                let index = rng.usize(0..6);
                let change = match rng.u8(0..10) {
                    0 => NetworkChange::ServiceGone {
                        service: format!("s{index}"),
                    },
                    1 => NetworkChange::PolicyGone {
                        policy: ["a", "b"][rng.usize(0..2)].into(),
                    },
                    2 | 3 => NetworkChange::Policy(Arc::new(random_policy(&mut rng))),
                    _ => NetworkChange::Service(Arc::new(random_service(&mut rng, index))),
                };
                map.apply(change, &mut touched);
            }
            plane
                .sync(&map, &touched)
                .unwrap_or_else(|error| panic!("seed {seed} step {step}: {error}"));
            assert_eq!(table(&plane), rebuilt(&map), "seed {seed} step {step}");
        }
    }
}

#[test]
fn ports_and_endpoints_keep_a_stable_order() {
    // The endpoint controller's order does not matter: backends are sorted.
    let mut map = NetworkMap::default();
    let forward = [("a", "10.42.0.2", 80), ("b", "10.42.0.3", 80)];
    let backward = [("b", "10.42.0.3", 80), ("a", "10.42.0.2", 80)];
    put(
        &mut map,
        service("web", Some("10.43.0.1"), &[(80, Protocol::Tcp)], &forward),
    );
    let mut plane = data_plane();
    plane.resync(&map).unwrap();
    plane.filter().clear_calls();
    let touched = put(
        &mut map,
        service("web", Some("10.43.0.1"), &[(80, Protocol::Tcp)], &backward),
    );
    let report = plane.sync(&map, &touched).unwrap();
    assert_eq!(report.commands, 0, "{:?}", plane.filter().batches());
}
