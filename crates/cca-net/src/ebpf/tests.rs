//! Unit tests of the eBPF plane against the modelling fake, which checks
//! after every single map operation that the programs could read the maps
//! (no front without its table, no table slot without its backend): what a
//! map builds, how one endpoint change is ordered, that flows of staying
//! backends keep them, that any sequence of syncs leaves what a rebuild
//! would, a restart over a previous agent's maps, the selective sweep, and
//! recovery after a failure.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use cca_model::net::{Affinity, NetworkChange, NetworkMap, Touched};
use cca_model::spec::Protocol;

use super::fake::{FakeMaps, Verdict};
use super::layout::FrontKey;
use super::plan::Op;
use super::*;
use crate::dataplane::tests::{put, random_service, service};

const SEED: u64 = 0x5eed;

fn plane() -> EbpfPlane<FakeMaps> {
    EbpfPlane::new(FakeMaps::default(), SEED)
}

fn tcp(address: &str) -> FrontKey {
    FrontKey {
        address: address.parse().unwrap(),
        protocol: 6,
    }
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// Instances `i{n}` at `{network}.{n}` for each `n` of `range`.
fn numbered(network: &str, range: std::ops::Range<u8>) -> Vec<(String, String)> {
    range
        .map(|n| (format!("i{n}"), format!("{network}.{n}")))
        .collect()
}

/// `targets` as the shared `service` helper takes them, on port 80.
fn borrowed(targets: &[(String, String)]) -> Vec<(&str, &str, u16)> {
    targets
        .iter()
        .map(|(name, address)| (name.as_str(), address.as_str(), 80))
        .collect()
}

/// A map of one service, "web" at 10.43.0.7, TCP port 80 over `targets`.
fn web_over(targets: &[(&str, &str, u16)]) -> NetworkMap {
    let mut map = NetworkMap::default();
    put(
        &mut map,
        service("web", Some("10.43.0.7"), &[(80, Protocol::Tcp)], targets),
    );
    map
}

/// Where each of `flows` flows to `key` go.
fn routes(maps: &FakeMaps, key: &FrontKey, flows: u64) -> Vec<Verdict> {
    (0..flows)
        .map(|flow| maps.lookup(key, SEED, flow))
        .collect()
}

/// What the programs can observe: each front's count, flags and the
/// backend address in each slot.
fn observed(maps: &FakeMaps) -> BTreeMap<FrontKey, (u16, u8, Vec<SocketAddr>)> {
    maps.fronts
        .iter()
        .map(|(key, front)| {
            let slots = maps
                .tables
                .get(&super::fake::table_of(front))
                .map(|table| table.iter().map(|id| maps.backends[id]).collect())
                .unwrap_or_default();
            (*key, (front.count, front.flags, slots))
        })
        .collect()
}

fn rebuilt(map: &NetworkMap) -> BTreeMap<FrontKey, (u16, u8, Vec<SocketAddr>)> {
    let mut fresh = plane();
    fresh.resync(map).unwrap();
    observed(fresh.maps())
}

#[test]
fn a_resync_makes_a_front_per_vip_port() {
    let mut map = NetworkMap::default();
    put(
        &mut map,
        service(
            "web",
            Some("10.43.0.7"),
            &[(80, Protocol::Tcp), (53, Protocol::Udp)],
            &[("a", "10.42.0.2", 8080), ("b", "10.42.0.3", 8080)],
        ),
    );
    put(
        &mut map,
        service("idle", Some("10.43.0.8"), &[(80, Protocol::Tcp)], &[]),
    );
    put(
        &mut map,
        service(
            "novip",
            None,
            &[(80, Protocol::Tcp)],
            &[("c", "10.42.0.4", 80)],
        ),
    );
    let mut plane = plane();
    let report = plane.resync(&map).unwrap();
    assert!(report.resynced);
    let maps = plane.maps();
    assert_eq!(maps.fronts.len(), 3, "{:?}", maps.fronts);
    let web = tcp("10.43.0.7:80");
    let sent: std::collections::BTreeSet<_> = routes(maps, &web, 200).into_iter().collect();
    assert_eq!(
        sent,
        [
            Verdict::Sent(addr("10.42.0.2:8080")),
            Verdict::Sent(addr("10.42.0.3:8080"))
        ]
        .into()
    );
    let udp = FrontKey {
        address: addr("10.43.0.7:53"),
        protocol: 17,
    };
    assert!(matches!(maps.lookup(&udp, SEED, 1), Verdict::Sent(_)));
    assert_eq!(maps.lookup(&tcp("10.43.0.8:80"), SEED, 1), Verdict::Refused);
    assert_eq!(maps.lookup(&tcp("10.43.0.9:80"), SEED, 1), Verdict::Pass);
    assert_eq!(
        maps.backends.len(),
        2,
        "one entry per backend, shared by fronts"
    );
}

#[test]
fn an_endpoint_change_swaps_the_table_generation_then_drops_the_old() {
    let two = [("a", "10.42.0.2", 8080), ("b", "10.42.0.3", 8080)];
    let mut map = web_over(&two);
    let mut plane = plane();
    plane.resync(&map).unwrap();
    let before = plane.maps().fronts[&tcp("10.43.0.7:80")];
    let touched = put(
        &mut map,
        service("web", Some("10.43.0.7"), &[(80, Protocol::Tcp)], &two[..1]),
    );
    let report = plane.sync(&map, &touched).unwrap();
    let ops = plane.maps().applied.last().unwrap().clone();
    let kinds: Vec<&str> = ops
        .iter()
        .map(|op| match op {
            Op::PutTable { .. } => "put table",
            Op::PutFront { .. } => "put front",
            Op::DeleteTable { .. } => "delete table",
            Op::DeleteBackend { .. } => "delete backend",
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        ["put table", "put front", "delete table", "delete backend"]
    );
    assert_eq!(report.ops, 4);
    let after = plane.maps().fronts[&tcp("10.43.0.7:80")];
    assert_eq!(after.id, before.id);
    assert_eq!(after.generation, before.generation ^ 1);
    assert_eq!(after.count, 1);
    // The same map again changes nothing.
    let again = plane.sync(&map, &touched).unwrap();
    assert_eq!(again.ops, 0);
}

#[test]
fn flows_of_staying_backends_keep_them_when_one_leaves() {
    let mut map = NetworkMap::default();
    let targets = numbered("10.42.0", 2..12);
    let all = borrowed(&targets);
    put(
        &mut map,
        service("web", Some("10.43.0.7"), &[(80, Protocol::Tcp)], &all),
    );
    let mut plane = plane();
    plane.resync(&map).unwrap();
    let key = tcp("10.43.0.7:80");
    let before = routes(plane.maps(), &key, 5000);
    let gone = Verdict::Sent(addr("10.42.0.5:80"));
    let rest: Vec<_> = all.iter().copied().filter(|t| t.1 != "10.42.0.5").collect();
    let touched = put(
        &mut map,
        service("web", Some("10.43.0.7"), &[(80, Protocol::Tcp)], &rest),
    );
    plane.sync(&map, &touched).unwrap();
    let after = routes(plane.maps(), &key, 5000);
    let staying = before.iter().filter(|verdict| **verdict != gone).count();
    let moved = before
        .iter()
        .zip(&after)
        .filter(|(old, new)| **old != gone && old != new)
        .count();
    assert!(!after.contains(&gone));
    assert!(
        moved * 20 < staying,
        "{moved} of {staying} flows of staying backends moved"
    );
}

#[test]
fn incremental_syncs_leave_exactly_what_a_rebuild_would() {
    for seed in 0..40 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut map = NetworkMap::default();
        let mut plane = plane();
        plane.resync(&map).unwrap();
        for step in 0..25 {
            let mut touched = Touched::default();
            for _ in 0..rng.usize(1..4) {
                let index = rng.usize(0..6);
                let change = if rng.u8(0..6) == 0 {
                    NetworkChange::ServiceGone {
                        service: format!("s{index}"),
                    }
                } else {
                    NetworkChange::Service(Arc::new(random_service(&mut rng, index)))
                };
                map.apply(change, &mut touched);
            }
            plane
                .sync(&map, &touched)
                .unwrap_or_else(|error| panic!("seed {seed} step {step}: {error}"));
            assert_eq!(
                observed(plane.maps()),
                rebuilt(&map),
                "seed {seed} step {step}"
            );
            let programmed = plane.programmed.as_ref().unwrap();
            assert_eq!(
                programmed.backends(),
                plane.maps().backends.len(),
                "seed {seed} step {step}"
            );
        }
    }
}

#[test]
fn a_restart_takes_over_the_previous_agents_maps_without_a_gap() {
    let two = [("a", "10.42.0.2", 8080), ("b", "10.42.0.3", 8080)];
    let mut map = web_over(&two);
    put(
        &mut map,
        service(
            "old",
            Some("10.43.0.9"),
            &[(80, Protocol::Tcp)],
            &[("c", "10.42.0.4", 80)],
        ),
    );
    let mut first = plane();
    first.resync(&map).unwrap();
    let mut inherited = first.maps().clone();
    inherited.applied.clear();
    inherited
        .sock_rev
        .insert((1, addr("10.42.0.4:80")), addr("10.43.0.9:80"));
    inherited
        .sock_rev
        .insert((2, addr("10.42.0.2:8080")), addr("10.43.0.7:80"));
    // While the agent was down, "old" went away.
    let mut touched = Touched::default();
    map.apply(
        NetworkChange::ServiceGone {
            service: "old".into(),
        },
        &mut touched,
    );
    let mut second = EbpfPlane::new(inherited, SEED);
    let report = second.resync(&map).unwrap();
    assert_eq!(report.swept, 1, "only the socket to the backend that left");
    assert_eq!(observed(second.maps()), rebuilt(&map));
    assert!(
        second
            .maps()
            .sock_rev
            .contains_key(&(2, addr("10.42.0.2:8080")))
    );
    // The fake checked every step; the web front was never missing.
    let ops = &second.maps().applied[0];
    let first_delete = ops.iter().position(|op| {
        matches!(
            op,
            Op::DeleteFront { .. } | Op::DeleteTable { .. } | Op::DeleteBackend { .. }
        )
    });
    let last_put = ops.iter().rposition(|op| matches!(op, Op::PutFront { .. }));
    assert!(first_delete > last_put, "{ops:?}");
}

#[test]
fn a_failed_change_is_followed_by_a_rebuild() {
    let mut map = web_over(&[("a", "10.42.0.2", 80)]);
    let mut plane = plane();
    plane.resync(&map).unwrap();
    let touched = put(
        &mut map,
        service(
            "web",
            Some("10.43.0.7"),
            &[(80, Protocol::Tcp)],
            &[("b", "10.42.0.3", 80)],
        ),
    );
    plane.maps.fail_after = Some(1);
    assert!(plane.sync(&map, &touched).is_err());
    let report = plane.sync(&map, &Touched::default()).unwrap();
    assert!(report.resynced);
    assert_eq!(observed(plane.maps()), rebuilt(&map));
}

#[test]
fn flags_say_affinity_and_the_table_size() {
    let mut map = NetworkMap::default();
    let mut web = service(
        "web",
        Some("10.43.0.7"),
        &[(80, Protocol::Tcp)],
        &[("a", "10.42.0.2", 80)],
    );
    web.affinity = Affinity::ClientIp;
    put(&mut map, web);
    let names = numbered("10.42.1", 2..11);
    let nine = borrowed(&names);
    put(
        &mut map,
        service("big", Some("10.43.0.8"), &[(80, Protocol::Tcp)], &nine),
    );
    let mut plane = plane();
    plane.resync(&map).unwrap();
    let maps = plane.maps();
    let web = maps.fronts[&tcp("10.43.0.7:80")];
    assert_eq!(web.flags, layout::FRONT_AFFINITY | layout::FRONT_SMALL);
    assert_eq!(
        maps.tables[&super::fake::table_of(&web)].len(),
        maglev::SMALL_TABLE_SIZE
    );
    let big = maps.fronts[&tcp("10.43.0.8:80")];
    assert_eq!(big.flags, 0);
    assert_eq!(
        maps.tables[&super::fake::table_of(&big)].len(),
        maglev::TABLE_SIZE
    );
}

#[test]
fn remove_clears_the_maps() {
    let mut plane = plane();
    plane.resync(&NetworkMap::default()).unwrap();
    plane.remove().unwrap();
    assert!(plane.maps().removed);
}

/// "web" over `ready` with `members` (instance, address) placed.
fn web_with_members(ready: &[(&str, &str, u16)], members: &[(&str, &str)]) -> NetworkMap {
    let mut web = service("web", Some("10.43.0.7"), &[(80, Protocol::Tcp)], ready);
    web.members = members
        .iter()
        .map(|(instance, address)| cca_model::net::Member {
            instance: (*instance).into(),
            node: "n1".into(),
            address: address.parse().unwrap(),
            ordinal: None,
            host_network: false,
        })
        .collect();
    let mut map = NetworkMap::default();
    put(&mut map, web);
    map
}

fn everything(map: &NetworkMap) -> Touched {
    Touched {
        services: map.services.keys().cloned().collect(),
        ..Touched::default()
    }
}

const DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

#[test]
fn a_backend_that_leaves_drains_its_pinned_flows_then_goes() {
    let start = Instant::now();
    let both = [("a", "10.42.0.2", 80), ("b", "10.42.0.3", 80)];
    let members = [("a", "10.42.0.2"), ("b", "10.42.0.3")];
    let mut plane = plane().with_drain(DRAIN);
    plane
        .resync_at(&web_with_members(&both, &members), start)
        .unwrap();
    let front = tcp("10.43.0.7:80");
    let pinned = (addr("10.42.9.9:40000"), addr("10.43.0.7:80"));
    plane.maps.flows.insert(pinned, addr("10.42.0.2:80"));

    // "a" is not ready any more but still placed: it gets no new flow,
    // and stays in the backend map for the flow pinned to it.
    let left = start + std::time::Duration::from_secs(1);
    let map = web_with_members(&both[1..], &members);
    let report = plane.sync_at(&map, &everything(&map), left).unwrap();
    assert_eq!(report.swept, 0);
    assert!(
        plane
            .maps
            .backends
            .values()
            .any(|backend| *backend == addr("10.42.0.2:80"))
    );
    assert!(
        routes(plane.maps(), &front, 200)
            .iter()
            .all(|verdict| *verdict == Verdict::Sent(addr("10.42.0.3:80")))
    );
    assert_eq!(plane.next_drain_end(), Some(left + DRAIN));

    // Before the drain window ends nothing goes; after, the backend and
    // its flows do, and only its.
    assert_eq!(plane.expire(left + DRAIN / 2).unwrap().ops, 0);
    let report = plane.expire(left + DRAIN).unwrap();
    assert_eq!((report.ops, report.swept), (1, 1));
    assert!(
        !plane
            .maps
            .backends
            .values()
            .any(|backend| *backend == addr("10.42.0.2:80"))
    );
    assert_eq!(plane.next_drain_end(), None);
}

#[test]
fn a_draining_backend_that_is_ready_again_keeps_its_id() {
    let start = Instant::now();
    let both = [("a", "10.42.0.2", 80), ("b", "10.42.0.3", 80)];
    let members = [("a", "10.42.0.2"), ("b", "10.42.0.3")];
    let mut plane = plane().with_drain(DRAIN);
    let map = web_with_members(&both, &members);
    plane.resync_at(&map, start).unwrap();
    let id_of = |plane: &EbpfPlane<FakeMaps>| {
        plane
            .maps
            .backends
            .iter()
            .find(|(_, backend)| **backend == addr("10.42.0.2:80"))
            .map(|(id, _)| *id)
    };
    let before = id_of(&plane);
    let flapped = web_with_members(&both[1..], &members);
    plane
        .sync_at(&flapped, &everything(&flapped), start)
        .unwrap();
    plane.maps.applied.clear();
    plane.sync_at(&map, &everything(&map), start).unwrap();
    assert_eq!(id_of(&plane), before);
    assert!(
        !plane
            .maps
            .applied
            .concat()
            .iter()
            .any(|op| matches!(op, Op::PutBackend { .. })),
        "{:?}",
        plane.maps.applied
    );
    assert_eq!(plane.next_drain_end(), None);
}

#[test]
fn a_reused_address_ends_the_drain_at_once() {
    let start = Instant::now();
    let mut plane = plane().with_drain(DRAIN);
    let map = web_with_members(&[("a", "10.42.0.2", 80)], &[("a", "10.42.0.2")]);
    plane.resync_at(&map, start).unwrap();
    let pinned = (addr("10.42.9.9:40000"), addr("10.43.0.7:80"));
    plane.maps.flows.insert(pinned, addr("10.42.0.2:80"));
    // "a" is gone; "c" got its address and is not ready yet.
    let reused = web_with_members(&[], &[("c", "10.42.0.2")]);
    let report = plane.sync_at(&reused, &everything(&reused), start).unwrap();
    assert_eq!(report.swept, 1, "the flow pinned to a's address is cleared");
    assert!(plane.maps.backends.is_empty());
    assert_eq!(plane.next_drain_end(), None);
}

#[test]
fn a_restart_drains_the_previous_agents_backends_that_left() {
    let start = Instant::now();
    let both = [("a", "10.42.0.2", 80), ("b", "10.42.0.3", 80)];
    let members = [("a", "10.42.0.2"), ("b", "10.42.0.3")];
    let mut first = plane();
    first
        .resync_at(&web_with_members(&both, &members), start)
        .unwrap();
    let mut inherited = first.maps().clone();
    let ids = inherited.backends.clone();
    inherited.flows.insert(
        (addr("10.42.9.9:40000"), addr("10.43.0.7:80")),
        addr("10.42.0.2:80"),
    );
    // While the agent was down, "a" stopped being ready.
    let mut second = EbpfPlane::new(inherited, SEED).with_drain(DRAIN);
    let map = web_with_members(&both[1..], &members);
    let report = second.resync_at(&map, start).unwrap();
    assert_eq!(report.swept, 0);
    assert_eq!(
        second.maps().backends,
        ids,
        "both keep their ids: b is taken over, a drains"
    );
    let report = second.expire(start + DRAIN).unwrap();
    assert_eq!(report.swept, 1);
    assert_eq!(second.maps().backends.len(), 1);
}
