//! The answering logic, pure: one query packet and a [`NetworkMap`] in, a
//! decision out ([`Action`]): a response written into the caller's buffer,
//! "forward this, it is not ours", or "drop this, it is not a query". No
//! socket, clock or randomness here, so every rule of the zone is tested
//! without a network; the server's loops only move packets.
//!
//! The zone's names (all under [`DNS_ZONE`], case-insensitive):
//! - `{svc}` — A: the service's VIP. A service's names exist only while it
//!   has a VIP: before the network controller allocates one (or while the
//!   service CIDR is exhausted) they are NXDOMAIN, as is a deleted service.
//! - `{svc}-{k}.{svc}` — A: the address of every member with ordinal `k`.
//! - `_{port}._{tcp|udp}.{svc}` — SRV `0 0 PORT {svc}.cca.local.` for each
//!   named port, with the service's A record as additional data.
//! - the apex — SOA (also in the authority section of every NXDOMAIN and
//!   NODATA answer, its minimum being the negative-caching TTL).
//!
//! A name that exists but has no record of the asked type is NODATA
//! (NOERROR, no answers); `_tcp.{svc}` exists (empty) when a named TCP port
//! does. Every record has the TTL [`TTL`]: VIPs and members change.

use std::net::Ipv4Addr;
use std::sync::LazyLock;

use cca_model::net::{DNS_ZONE, NetworkMap, ServiceNet, service_name};
use cca_model::spec::Protocol;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, SOA, SRV};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder};

/// The TTL of every answer, and the negative-caching TTL: VIPs and members
/// change, so resolvers must ask again soon.
pub const TTL: u32 = 5;
/// The UDP payload this server offers and sends at most (the size DNS
/// flag day 2020 settled on: no IP fragmentation on common paths).
pub const MAX_UDP_PAYLOAD: u16 = 1232;
/// What a client without EDNS accepts over UDP (RFC 1035).
const CLASSIC_UDP_PAYLOAD: u16 = 512;
/// The DNS header's size; shorter packets are dropped unanswered.
const HEADER_LEN: usize = 12;

/// How the query arrived: UDP answers are cut to the client's payload size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// What to do with one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// The buffer holds the response, which says `rcode`.
    Reply { rcode: ResponseCode },
    /// The name is outside the zone: send the packet, as it is, upstream.
    Forward,
    /// Not a query (a response, or shorter than a header): no answer, so
    /// that two servers can never bounce packets between them.
    Drop,
}

/// Answers `packet` from `map` into `out` (cleared first). Never panics,
/// whatever the bytes.
pub fn answer(packet: &[u8], map: &NetworkMap, transport: Transport, out: &mut Vec<u8>) -> Action {
    out.clear();
    if packet.len() < HEADER_LEN || packet[2] & 0x80 != 0 {
        return Action::Drop;
    }
    let Ok(request) = Message::from_vec(packet) else {
        return raw_error(packet, ResponseCode::FormErr, out);
    };
    if request.op_code != OpCode::Query {
        return reply_error(&request, ResponseCode::NotImp, out);
    }
    let [query] = request.queries.as_slice() else {
        return reply_error(&request, ResponseCode::FormErr, out);
    };
    if request.edns.as_ref().is_some_and(|edns| edns.version() > 0) {
        return reply_error(&request, ResponseCode::BADVERS, out);
    }
    let Some(relative) = zone_relative(query.name()) else {
        return Action::Forward;
    };
    if !matches!(query.query_class(), DNSClass::IN | DNSClass::ANY)
        || matches!(query.query_type(), RecordType::AXFR | RecordType::IXFR)
    {
        return reply_error(&request, ResponseCode::Refused, out);
    }

    let mut found = Found::default();
    let exists = lookup(map, query, &relative, &mut found);
    let mut response = response_to(&request);
    response.metadata.authoritative = true;
    if exists {
        response.answers = found.answers;
        response.additionals = found.additionals;
    } else {
        response.metadata.response_code = ResponseCode::NXDomain;
    }
    if response.answers.is_empty() {
        response.authorities.push(soa_record(apex()));
    }
    let rcode = response.metadata.response_code;
    emit(&mut response, udp_limit(&request, transport), out);
    Action::Reply { rcode }
}

/// A response with `rcode` to `packet` (already judged a query, e.g. when
/// its forward failed), in `out`; nothing (and `false`) when the packet
/// does not parse as far as its header.
pub fn error_reply(packet: &[u8], rcode: ResponseCode, out: &mut Vec<u8>) -> bool {
    out.clear();
    if packet.len() < HEADER_LEN {
        return false;
    }
    match Message::from_vec(packet) {
        Ok(request) => reply_error(&request, rcode, out),
        Err(_) => raw_error(packet, rcode, out),
    };
    true
}

/// The records found for a name.
#[derive(Default)]
struct Found {
    answers: Vec<Record>,
    additionals: Vec<Record>,
}

/// The query name's labels below the zone apex, outermost last (`[b"web"]`
/// for `web.cca.local`), or `None` when the name is not in the zone.
fn zone_relative(name: &Name) -> Option<Vec<&[u8]>> {
    let mut labels: Vec<&[u8]> = name.iter().collect();
    for zone_label in DNS_ZONE.rsplit('.') {
        let label = labels.pop()?;
        if !label.eq_ignore_ascii_case(zone_label.as_bytes()) {
            return None;
        }
    }
    Some(labels)
}

/// Whether the name exists in the zone; its records of the asked type go
/// into `found`.
fn lookup(map: &NetworkMap, query: &Query, relative: &[&[u8]], found: &mut Found) -> bool {
    let qname = query.name();
    let qtype = query.query_type();
    let wants = |rtype: RecordType| qtype == rtype || qtype == RecordType::ANY;
    let Some((&service_label, below)) = relative.split_last() else {
        if wants(RecordType::SOA) {
            found.answers.push(soa_record(qname.clone()));
        }
        return true;
    };
    let mut lower = [0u8; 63];
    let Some(service) = service_by_label(map, service_label, &mut lower) else {
        return false;
    };
    // A service's names exist only while its VIP does (see the module doc).
    let Some(vip) = service.vip else {
        return false;
    };
    match below {
        [] => {
            if wants(RecordType::A) {
                found.answers.push(a_record(qname.clone(), vip));
            }
            true
        }
        [label] if label.first() == Some(&b'_') => {
            let protocol = protocol_label(label);
            protocol.is_some_and(|protocol| {
                service
                    .ports
                    .iter()
                    .any(|port| port.protocol == protocol && port.name.is_some())
            })
        }
        [label] => {
            let Some(ordinal) = ordinal_label(label, &service.name) else {
                return false;
            };
            let mut addresses: Vec<Ipv4Addr> = service
                .members
                .iter()
                .filter(|member| member.ordinal == Some(ordinal))
                .map(|member| member.address)
                .collect();
            if addresses.is_empty() {
                return false;
            }
            addresses.sort_unstable();
            addresses.dedup();
            if wants(RecordType::A) {
                for address in addresses {
                    found.answers.push(a_record(qname.clone(), address));
                }
            }
            true
        }
        [port_label, protocol_label_bytes] => {
            let (Some(port_name), Some(protocol)) = (
                port_label.strip_prefix(b"_"),
                protocol_label(protocol_label_bytes),
            ) else {
                return false;
            };
            let Some(port) = service.ports.iter().find(|port| {
                port.protocol == protocol
                    && port
                        .name
                        .as_deref()
                        .is_some_and(|name| name.as_bytes().eq_ignore_ascii_case(port_name))
            }) else {
                return false;
            };
            if wants(RecordType::SRV) {
                // The service name is a DNS label (validity checks it), so
                // the target always parses; a name that does not is simply
                // not answered.
                if let Ok(target) = Name::from_ascii(format!("{}.", service_name(&service.name))) {
                    found.answers.push(Record::from_rdata(
                        qname.clone(),
                        TTL,
                        RData::SRV(SRV::new(0, 0, port.number, target.clone())),
                    ));
                    found.additionals.push(a_record(target, vip));
                }
            }
            true
        }
        _ => false,
    }
}

/// The service named by a query label, compared in lowercase (service
/// names are lowercase DNS labels).
fn service_by_label<'m>(
    map: &'m NetworkMap,
    label: &[u8],
    lower: &mut [u8; 63],
) -> Option<&'m ServiceNet> {
    let lower = lower.get_mut(..label.len())?;
    for (to, from) in lower.iter_mut().zip(label) {
        *to = from.to_ascii_lowercase();
    }
    let name = std::str::from_utf8(lower).ok()?;
    map.services.get(name).map(|service| &**service)
}

/// `_tcp` or `_udp`, any case.
fn protocol_label(label: &[u8]) -> Option<Protocol> {
    if label.eq_ignore_ascii_case(b"_tcp") {
        Some(Protocol::Tcp)
    } else if label.eq_ignore_ascii_case(b"_udp") {
        Some(Protocol::Udp)
    } else {
        None
    }
}

/// The `k` of `{svc}-{k}`, written as `k` prints (no sign, no leading zero).
fn ordinal_label(label: &[u8], service: &str) -> Option<u32> {
    let prefix = label.get(..service.len())?;
    if !prefix.eq_ignore_ascii_case(service.as_bytes()) {
        return None;
    }
    let digits = label.get(service.len()..)?.strip_prefix(b"-")?;
    let text = std::str::from_utf8(digits).ok()?;
    let ordinal: u32 = text.parse().ok()?;
    (ordinal.to_string() == text).then_some(ordinal)
}

fn a_record(name: Name, address: Ipv4Addr) -> Record {
    Record::from_rdata(name, TTL, RData::A(A(address)))
}

/// The zone's fixed names and its SOA data, built once.
struct Zone {
    apex: Name,
    soa: SOA,
}

static ZONE: LazyLock<Zone> = LazyLock::new(|| Zone {
    apex: zone_name(""),
    soa: SOA::new(
        zone_name("ns."),
        zone_name("hostmaster."),
        1,
        3600,
        600,
        86400,
        TTL,
    ),
});

/// The zone apex, `cca.local.`.
fn apex() -> Name {
    ZONE.apex.clone()
}

/// `{prefix}cca.local.` (prefix empty or ending in a dot).
fn zone_name(prefix: &str) -> Name {
    // DNS_ZONE is a constant valid name; `Name::root` only if it ever is not.
    Name::from_ascii(format!("{prefix}{DNS_ZONE}.")).unwrap_or_else(|_| Name::root())
}

fn soa_record(owner: Name) -> Record {
    Record::from_rdata(owner, TTL, RData::SOA(ZONE.soa.clone()))
}

/// The response skeleton: ID, opcode, flags and question of the request,
/// and an OPT record when the request had one.
fn response_to(request: &Message) -> Message {
    let mut response = Message::new(request.id, MessageType::Response, request.op_code);
    response.metadata.recursion_desired = request.recursion_desired;
    // Names outside the zone are forwarded to resolvers that recurse.
    response.metadata.recursion_available = true;
    response.metadata.checking_disabled = request.checking_disabled;
    response.queries = request.queries.clone();
    if request.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(MAX_UDP_PAYLOAD);
        edns.set_version(0);
        response.edns = Some(edns);
    }
    response
}

fn reply_error(request: &Message, rcode: ResponseCode, out: &mut Vec<u8>) -> Action {
    let mut response = response_to(request);
    response.metadata.response_code = rcode;
    emit(&mut response, usize::from(CLASSIC_UDP_PAYLOAD), out);
    Action::Reply { rcode }
}

/// An error response built from the header alone, for a packet whose rest
/// does not parse: the ID, the opcode and RD echoed, no sections.
fn raw_error(packet: &[u8], rcode: ResponseCode, out: &mut Vec<u8>) -> Action {
    out.clear();
    out.extend_from_slice(&packet[..2]);
    // QR set; opcode and RD kept; AA, TC cleared.
    out.push(0x80 | (packet[2] & 0x79));
    // RA set; Z, AD, CD cleared; the low four bits of the rcode.
    out.push(0x80 | (u16::from(rcode) & 0x0f) as u8);
    out.extend_from_slice(&[0; 8]);
    Action::Reply { rcode }
}

/// The most this client accepts in one response over `transport`.
fn udp_limit(request: &Message, transport: Transport) -> usize {
    match transport {
        Transport::Tcp => usize::from(u16::MAX),
        Transport::Udp => usize::from(request.edns.as_ref().map_or(CLASSIC_UDP_PAYLOAD, |edns| {
            edns.max_payload()
                .clamp(CLASSIC_UDP_PAYLOAD, MAX_UDP_PAYLOAD)
        })),
    }
}

/// Serializes `response` into `out`; when it is longer than `limit`, sends
/// the question alone with TC set instead, so the client asks over TCP.
fn emit(response: &mut Message, limit: usize, out: &mut Vec<u8>) {
    if encode(response, out) && out.len() <= limit {
        return;
    }
    response.answers.clear();
    response.authorities.clear();
    response.additionals.clear();
    response.metadata.truncation = true;
    if !encode(response, out) {
        // Nothing of ours fails to encode; answer like a parse failure
        // would rather than send half a message.
        let header = [response.id.to_be_bytes(), [0x80, 0x82]].concat();
        out.clear();
        out.extend_from_slice(&header);
        out.extend_from_slice(&[0; 8]);
    }
}

fn encode(response: &Message, out: &mut Vec<u8>) -> bool {
    out.clear();
    let mut encoder = BinEncoder::new(out);
    response.emit(&mut encoder).is_ok()
}

#[cfg(test)]
mod tests;
