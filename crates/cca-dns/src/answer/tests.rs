//! The zone's rules, one query at a time through [`answer`], without a
//! socket: names, types, case, errors, EDNS, truncation, and random bytes.

use std::sync::Arc;

use cca_model::net::{Member, NetworkMap, ServiceNet};
use cca_model::spec::{PortSpec, Protocol};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};

use super::*;

fn service(name: &str, vip: Option<[u8; 4]>) -> ServiceNet {
    ServiceNet {
        name: name.into(),
        vip: vip.map(Ipv4Addr::from),
        ports: Vec::new(),
        affinity: Default::default(),
        endpoints: Default::default(),
        members: Vec::new(),
        asleep: false,
        scale_to_zero: None,
    }
}

fn member(instance: &str, ordinal: Option<u32>, address: [u8; 4]) -> Member {
    Member {
        instance: instance.into(),
        node: "n1".into(),
        address: address.into(),
        ordinal,
        host_network: false,
    }
}

/// `web` (VIP, named ports), `db` (stateful: ordinals 0 and 1), `new`
/// (no VIP yet, a member with an ordinal all the same).
fn map() -> NetworkMap {
    let mut web = service("web", Some([10, 43, 0, 7]));
    web.ports = vec![
        PortSpec::tcp("http", 8080),
        PortSpec {
            name: Some("Metrics".into()),
            number: 9090,
            protocol: Protocol::Tcp,
        },
        PortSpec {
            name: Some("syslog".into()),
            number: 514,
            protocol: Protocol::Udp,
        },
        PortSpec {
            name: None,
            number: 7000,
            protocol: Protocol::Tcp,
        },
    ];
    let mut db = service("db", Some([10, 43, 0, 9]));
    db.members = vec![
        member("db-a", Some(0), [10, 42, 1, 5]),
        member("db-b", Some(1), [10, 42, 2, 6]),
        member("db-c", None, [10, 42, 2, 7]),
    ];
    let mut new = service("new", None);
    new.members = vec![member("new-a", Some(0), [10, 42, 1, 8])];
    let mut map = NetworkMap::default();
    for service in [web, db, new] {
        map.services.insert(service.name.clone(), Arc::new(service));
    }
    map
}

fn query_packet(name: &str, rtype: RecordType, edns: Option<u16>) -> Vec<u8> {
    let mut message = Message::new(0x4242, MessageType::Query, OpCode::Query);
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
    if let Some(payload) = edns {
        let mut opt = Edns::new();
        opt.set_max_payload(payload);
        message.set_edns(opt);
    }
    message.to_vec().unwrap()
}

/// The response to `packet`, parsed; fails the test if there is none.
fn respond(map: &NetworkMap, packet: &[u8], transport: Transport) -> Message {
    let mut out = Vec::new();
    let action = answer(packet, map, transport, &mut out);
    let Action::Reply { rcode } = action else {
        panic!("expected a reply, got {action:?}");
    };
    let response = Message::from_vec(&out).expect("the reply parses");
    // Compared as numbers: 16 reads back as BADSIG, the code it shares.
    assert_eq!(u16::from(response.response_code), u16::from(rcode));
    assert_eq!(response.message_type, MessageType::Response);
    response
}

fn ask(name: &str, rtype: RecordType) -> Message {
    respond(&map(), &query_packet(name, rtype, None), Transport::Udp)
}

/// The answer section as `(owner, type, data)` text.
fn answers(response: &Message) -> Vec<String> {
    response
        .answers
        .iter()
        .map(|record| format!("{} {} {}", record.name, record.ttl, record.data))
        .collect()
}

/// A negative answer: no records, the zone's SOA as authority.
fn assert_negative(response: &Message, rcode: ResponseCode) {
    assert_eq!(response.response_code, rcode);
    assert!(response.answers.is_empty(), "{:?}", response.answers);
    assert_eq!(response.authorities.len(), 1);
    assert_eq!(response.authorities[0].record_type(), RecordType::SOA);
    assert_eq!(response.authorities[0].name.to_ascii(), "cca.local.");
    assert!(response.authoritative);
}

#[test]
fn a_service_name_answers_its_vip_in_any_case() {
    let response = ask("web.cca.local.", RecordType::A);
    assert_eq!(response.response_code, ResponseCode::NoError);
    assert_eq!(answers(&response), ["web.cca.local. 5 10.43.0.7"]);
    assert!(response.authoritative && response.recursion_available);
    assert!(response.recursion_desired, "RD is copied");
    assert_eq!(response.id, 0x4242);
    assert_eq!(response.queries.len(), 1);

    let shouted = ask("WeB.CCA.Local.", RecordType::A);
    assert_eq!(answers(&shouted), ["WeB.CCA.Local. 5 10.43.0.7"]);
    assert_eq!(ask("web.cca.local.", RecordType::ANY).answers.len(), 1);
}

#[test]
fn names_that_do_not_exist_are_nxdomain_with_the_soa() {
    for name in [
        "nothing.cca.local.",
        // No VIP yet: none of the service's names exist.
        "new.cca.local.",
        "new-0.new.cca.local.",
        "web.web.cca.local.",
        "a.b.c.web.cca.local.",
        "_http._sctp.web.cca.local.",
        "_nope._tcp.web.cca.local.",
        "_syslog._tcp.web.cca.local.",
        "_7000._tcp.web.cca.local.",
        "_sctp.web.cca.local.",
        "db-2.db.cca.local.",
        "db-01.db.cca.local.",
        "db--1.db.cca.local.",
        "db-x.db.cca.local.",
        "web-0.db.cca.local.",
    ] {
        let response = ask(name, RecordType::A);
        assert_negative(&response, ResponseCode::NXDomain);
        let soa = &response.authorities[0];
        assert_eq!(soa.ttl, TTL, "{name}");
        let RData::SOA(soa) = &soa.data else {
            panic!("an SOA")
        };
        assert_eq!(soa.minimum, TTL, "negative answers are cached {TTL} s");
    }
}

#[test]
fn other_types_of_an_existing_name_are_nodata() {
    for (name, rtype) in [
        ("web.cca.local.", RecordType::AAAA),
        ("web.cca.local.", RecordType::SRV),
        ("web.cca.local.", RecordType::TXT),
        ("db-0.db.cca.local.", RecordType::AAAA),
        ("_http._tcp.web.cca.local.", RecordType::A),
        ("cca.local.", RecordType::A),
        // Empty non-terminals exist: a named TCP (and UDP) port is below.
        ("_tcp.web.cca.local.", RecordType::SRV),
        ("_udp.web.cca.local.", RecordType::A),
    ] {
        assert_negative(&ask(name, rtype), ResponseCode::NoError);
    }
}

#[test]
fn ordinal_names_answer_their_members() {
    let response = ask("db-1.db.cca.local.", RecordType::A);
    assert_eq!(answers(&response), ["db-1.db.cca.local. 5 10.42.2.6"]);
    let response = ask("DB-0.Db.cca.local.", RecordType::A);
    assert_eq!(answers(&response), ["DB-0.Db.cca.local. 5 10.42.1.5"]);
}

#[test]
fn two_members_with_one_ordinal_both_answer() {
    // During a replacement the old and the new instance may both be placed.
    let mut map = map();
    let mut db = (*map.services["db"]).clone();
    db.members.push(member("db-d", Some(1), [10, 42, 3, 3]));
    db.members.push(member("db-e", Some(1), [10, 42, 2, 6]));
    map.services.insert("db".into(), Arc::new(db));
    let packet = query_packet("db-1.db.cca.local.", RecordType::A, None);
    let response = respond(&map, &packet, Transport::Udp);
    assert_eq!(
        answers(&response),
        [
            "db-1.db.cca.local. 5 10.42.2.6",
            "db-1.db.cca.local. 5 10.42.3.3"
        ]
    );
}

#[test]
fn named_ports_have_srv_records_with_the_vip_as_additional() {
    let response = ask("_http._tcp.web.cca.local.", RecordType::SRV);
    assert_eq!(
        answers(&response),
        ["_http._tcp.web.cca.local. 5 0 0 8080 web.cca.local."]
    );
    let additional: Vec<String> = response
        .additionals
        .iter()
        .map(|record| format!("{} {}", record.name, record.data))
        .collect();
    assert_eq!(additional, ["web.cca.local. 10.43.0.7"]);

    let metrics = ask("_metrics._TCP.web.cca.local.", RecordType::SRV);
    assert_eq!(
        answers(&metrics),
        ["_metrics._TCP.web.cca.local. 5 0 0 9090 web.cca.local."]
    );
    let syslog = ask("_syslog._udp.web.cca.local.", RecordType::SRV);
    assert_eq!(
        answers(&syslog),
        ["_syslog._udp.web.cca.local. 5 0 0 514 web.cca.local."]
    );
}

#[test]
fn the_apex_has_an_soa() {
    let response = ask("cca.local.", RecordType::SOA);
    assert_eq!(response.answers.len(), 1);
    assert_eq!(response.answers[0].record_type(), RecordType::SOA);
    assert!(response.authorities.is_empty());
}

#[test]
fn names_outside_the_zone_are_forwarded() {
    let mut out = Vec::new();
    for name in [
        "example.com.",
        "cca.local.example.com.",
        "xcca.local.",
        "local.",
        "web.cca.",
        ".",
    ] {
        let packet = query_packet(name, RecordType::A, None);
        assert_eq!(
            answer(&packet, &map(), Transport::Udp, &mut out),
            Action::Forward,
            "{name}"
        );
    }
}

#[test]
fn responses_and_runts_are_dropped() {
    let mut out = Vec::new();
    let mut response = query_packet("web.cca.local.", RecordType::A, None);
    response[2] |= 0x80;
    assert_eq!(
        answer(&response, &map(), Transport::Udp, &mut out),
        Action::Drop
    );
    assert_eq!(
        answer(&[0; 11], &map(), Transport::Udp, &mut out),
        Action::Drop
    );
    assert!(out.is_empty());
}

#[test]
fn broken_and_unsupported_queries_get_an_error_with_their_id() {
    let map = map();
    // A header promising a question that is not there.
    let mut broken = query_packet("web.cca.local.", RecordType::A, None);
    broken.truncate(16);
    let response = respond(&map, &broken, Transport::Udp);
    assert_eq!(response.response_code, ResponseCode::FormErr);
    assert_eq!(response.id, 0x4242);
    assert!(response.recursion_desired);

    let mut two = Message::new(7, MessageType::Query, OpCode::Query);
    two.add_query(Query::query(
        Name::from_ascii("web.cca.local.").unwrap(),
        RecordType::A,
    ));
    two.add_query(Query::query(
        Name::from_ascii("db.cca.local.").unwrap(),
        RecordType::A,
    ));
    let response = respond(&map, &two.to_vec().unwrap(), Transport::Udp);
    assert_eq!(response.response_code, ResponseCode::FormErr);

    let mut notify = Message::new(8, MessageType::Query, OpCode::Notify);
    notify.add_query(Query::query(
        Name::from_ascii("cca.local.").unwrap(),
        RecordType::SOA,
    ));
    let response = respond(&map, &notify.to_vec().unwrap(), Transport::Udp);
    assert_eq!(response.response_code, ResponseCode::NotImp);

    let mut chaos = Query::query(Name::from_ascii("web.cca.local.").unwrap(), RecordType::TXT);
    chaos.set_query_class(DNSClass::CH);
    let mut message = Message::new(9, MessageType::Query, OpCode::Query);
    message.add_query(chaos);
    let response = respond(&map, &message.to_vec().unwrap(), Transport::Udp);
    assert_eq!(response.response_code, ResponseCode::Refused);

    let transfer = query_packet("cca.local.", RecordType::AXFR, None);
    let response = respond(&map, &transfer, Transport::Tcp);
    assert_eq!(response.response_code, ResponseCode::Refused);
}

#[test]
fn edns_is_answered_in_kind() {
    let map = map();
    let plain = respond(
        &map,
        &query_packet("web.cca.local.", RecordType::A, None),
        Transport::Udp,
    );
    assert!(plain.edns.is_none());

    let packet = query_packet("web.cca.local.", RecordType::A, Some(4096));
    let response = respond(&map, &packet, Transport::Udp);
    let edns = response.edns.as_ref().expect("an OPT record");
    assert_eq!(edns.max_payload(), MAX_UDP_PAYLOAD);
    assert_eq!(edns.version(), 0);
    assert_eq!(answers(&response).len(), 1);

    let mut future = Message::new(3, MessageType::Query, OpCode::Query);
    future.add_query(Query::query(
        Name::from_ascii("web.cca.local.").unwrap(),
        RecordType::A,
    ));
    let mut edns1 = Edns::new();
    edns1.set_version(1);
    future.set_edns(edns1);
    let response = respond(&map, &future.to_vec().unwrap(), Transport::Udp);
    assert_eq!(u16::from(response.response_code), 16, "BADVERS");
    assert!(response.edns.is_some(), "BADVERS travels in the OPT record");
}

#[test]
fn an_answer_too_long_for_udp_is_truncated_and_whole_over_tcp() {
    let mut map = map();
    let mut db = (*map.services["db"]).clone();
    for index in 0..60u8 {
        db.members
            .push(member(&format!("db-{index}"), Some(5), [10, 42, 9, index]));
    }
    map.services.insert("db".into(), Arc::new(db));
    let packet = query_packet("db-5.db.cca.local.", RecordType::A, None);

    let mut out = Vec::new();
    answer(&packet, &map, Transport::Udp, &mut out);
    assert!(out.len() <= 512, "{} bytes over classic UDP", out.len());
    let udp = Message::from_vec(&out).unwrap();
    assert!(udp.truncation);
    assert!(udp.answers.is_empty());
    assert_eq!(udp.queries.len(), 1, "the question stays");

    let with_edns = query_packet("db-5.db.cca.local.", RecordType::A, Some(4096));
    answer(&with_edns, &map, Transport::Udp, &mut out);
    assert!(out.len() <= usize::from(MAX_UDP_PAYLOAD));
    let edns = Message::from_vec(&out).unwrap();
    assert!(
        !edns.truncation,
        "60 A records fit in {MAX_UDP_PAYLOAD} bytes"
    );
    assert_eq!(edns.answers.len(), 60);

    let tcp = respond(&map, &packet, Transport::Tcp);
    assert!(!tcp.truncation);
    assert_eq!(tcp.answers.len(), 60);
}

#[test]
fn a_failed_forward_becomes_servfail_for_the_same_question() {
    let packet = query_packet("example.com.", RecordType::A, Some(1232));
    let mut out = Vec::new();
    assert!(error_reply(&packet, ResponseCode::ServFail, &mut out));
    let response = Message::from_vec(&out).unwrap();
    assert_eq!(response.response_code, ResponseCode::ServFail);
    assert_eq!(response.id, 0x4242);
    assert_eq!(response.queries[0].name().to_ascii(), "example.com.");
    assert!(!error_reply(&packet[..5], ResponseCode::ServFail, &mut out));
}

#[test]
fn random_bytes_never_panic_and_every_reply_parses() {
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let map = map();
    let seeds = [
        query_packet("web.cca.local.", RecordType::A, Some(1232)),
        query_packet("_http._tcp.web.cca.local.", RecordType::SRV, None),
        query_packet("db-1.db.cca.local.", RecordType::A, None),
    ];
    let mut out = Vec::new();
    let mut replies = 0;
    for round in 0..60_000 {
        let packet: Vec<u8> = if round % 2 == 0 {
            let len = rng.usize(..600);
            (0..len).map(|_| rng.u8(..)).collect()
        } else {
            // Valid queries with a few bytes changed: deeper into the parser.
            let mut packet = seeds[round % seeds.len()].clone();
            for _ in 0..rng.usize(1..4) {
                let at = rng.usize(..packet.len());
                packet[at] = rng.u8(..);
            }
            packet.truncate(rng.usize(12..=packet.len()));
            packet
        };
        for transport in [Transport::Udp, Transport::Tcp] {
            if let Action::Reply { .. } = answer(&packet, &map, transport, &mut out) {
                replies += 1;
                assert!(out.len() >= 12);
                assert_eq!(out[..2], packet[..2], "the reply keeps the ID");
                assert_ne!(out[2] & 0x80, 0, "the reply is a response");
                if transport == Transport::Udp {
                    assert!(out.len() <= usize::from(MAX_UDP_PAYLOAD));
                }
            }
        }
    }
    assert!(
        replies > 10_000,
        "only {replies} replies: the fuzzing is too shallow"
    );
}
