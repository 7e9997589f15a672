//! Deleting stale UDP conntrack entries over netlink (`NETLINK_NETFILTER`,
//! ctnetlink): for each VIP port a [`UdpCleanup`] names, dump the UDP
//! entries to it (filtered in the kernel, `CTA_FILTER`, so the answer does
//! not grow with the node's other flows; one unfiltered dump when many
//! ports are judged at once), and delete each whose backend is no longer
//! allowed, by its original tuple. The messages are
//! `netlink-packet-netfilter`'s typed `ConntrackMessage`s on a
//! `netlink-sys` socket — the same interface `conntrack -D` uses, without
//! the tool. An entry that vanished between dump and delete (it expired)
//! counts as gone, not as an error.

use std::io;
use std::net::{IpAddr, Ipv4Addr};

use netlink_packet_core::{
    DefaultNla, NLA_F_NESTED, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, Nla,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, ConntrackMessageType, IPTuple, ProtoTuple, Protocol,
    Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use super::error::{Error, Result};
use super::kernel::UdpCleanup;

/// One direction of a conntrack entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Flow {
    pub protocol: u8,
    pub source: (Ipv4Addr, u16),
    pub destination: (Ipv4Addr, u16),
}

const UDP: u8 = 17;

/// Up to this many VIP ports, one filtered dump each; more (a rebuild
/// judges every UDP VIP port) share one dump of the whole table: each
/// dump walks the kernel's whole conntrack hash, filtered or not.
const FILTERED_PORTS: usize = 8;

/// Deletes the UDP entries `cleanup` calls stale; returns how many went.
pub(crate) fn delete_stale_udp(cleanup: &UdpCleanup) -> Result<usize> {
    let socket = open()?;
    let everything = || ConntrackMessage::Get(Vec::new());
    let requests: Vec<ConntrackMessage> = if cleanup.ports.len() <= FILTERED_PORTS {
        cleanup
            .ports
            .keys()
            .map(|&(vip, port)| to_vip_port(vip, port))
            .collect()
    } else {
        vec![everything()]
    };
    let mut deleted = 0;
    for request in requests {
        let flows = match dump(&socket, request) {
            // A kernel without dump filters (before 5.8): every entry,
            // judged here.
            Err(Error::Conntrack { error, .. })
                if matches!(error.raw_os_error(), Some(EINVAL | EOPNOTSUPP)) =>
            {
                dump(&socket, everything())?
            }
            other => other?,
        };
        for (original, reply) in flows {
            if original.protocol == UDP
                && cleanup.is_stale(original.destination, reply.source)
                && delete(&socket, &original)?
            {
                deleted += 1;
            }
        }
    }
    Ok(deleted)
}

/// `CTA_TUPLE_ORIG`, `CTA_FILTER` and its `CTA_FILTER_ORIG_FLAGS`
/// (linux/netfilter/nfnetlink_conntrack.h).
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_FILTER: u16 = 25;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
/// The original-tuple fields the filter compares: destination address,
/// protocol, destination port.
const FILTER_IP_DST: u32 = 1 << 1;
const FILTER_PROTO_NUM: u32 = 1 << 3;
const FILTER_PROTO_DST_PORT: u32 = 1 << 5;

/// A dump request for the UDP entries whose original destination is
/// `vip:port`. Raw attributes: the kernel parses `CTA_FILTER` strictly and
/// wants it flagged nested, which the crate's typed attribute cannot say.
fn to_vip_port(vip: Ipv4Addr, port: u16) -> ConntrackMessage {
    let tuple = ConntrackAttribute::CtaTupleOrig(vec![
        Tuple::Ip(vec![IPTuple::DestinationAddress(IpAddr::V4(vip))]),
        Tuple::Proto(vec![
            ProtoTuple::Protocol(Protocol::Udp),
            ProtoTuple::DestinationPort(port),
        ]),
    ]);
    let mut tuple_value = vec![0; tuple.value_len()];
    tuple.emit_value(&mut tuple_value);
    let flags = FILTER_IP_DST | FILTER_PROTO_NUM | FILTER_PROTO_DST_PORT;
    // One attribute holding one u32 (host byte order, NLA_U32).
    let mut filter = Vec::with_capacity(8);
    filter.extend_from_slice(&8u16.to_ne_bytes());
    filter.extend_from_slice(&CTA_FILTER_ORIG_FLAGS.to_ne_bytes());
    filter.extend_from_slice(&flags.to_ne_bytes());
    ConntrackMessage::Other {
        message_type: u8::from(ConntrackMessageType::Get),
        attributes: vec![
            DefaultNla::new(CTA_TUPLE_ORIG | NLA_F_NESTED, tuple_value),
            DefaultNla::new(CTA_FILTER | NLA_F_NESTED, filter),
        ],
    }
}

fn open() -> Result<Socket> {
    let failed = |error: io::Error| Error::Conntrack {
        action: "socket",
        error,
    };
    let mut socket = Socket::new(NETLINK_NETFILTER).map_err(failed)?;
    socket.bind_auto().map_err(failed)?;
    socket.connect(&SocketAddr::new(0, 0)).map_err(failed)?;
    Ok(socket)
}

fn send(
    socket: &Socket,
    flags: u16,
    message: ConntrackMessage,
    action: &'static str,
) -> Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::IPv4, 0, 0),
            message,
        )),
    );
    packet.finalize();
    let mut buffer = vec![0; packet.buffer_len()];
    packet.serialize(&mut buffer);
    socket
        .send(&buffer, 0)
        .map_err(|error| Error::Conntrack { action, error })?;
    Ok(())
}

/// The IPv4 entries `request` selects, as (original, reply) flows; entries
/// that are not TCP/UDP-shaped (no ports) are skipped.
fn dump(socket: &Socket, request: ConntrackMessage) -> Result<Vec<(Flow, Flow)>> {
    const ACTION: &str = "dump";
    send(socket, NLM_F_REQUEST | NLM_F_DUMP, request, ACTION)?;
    let mut flows = Vec::new();
    loop {
        let (datagram, _) = socket.recv_from_full().map_err(|error| Error::Conntrack {
            action: ACTION,
            error,
        })?;
        let mut offset = 0;
        while offset < datagram.len() {
            let bytes = &datagram[offset..];
            let message =
                NetlinkMessage::<NetfilterMessage>::deserialize(bytes).map_err(|error| {
                    Error::ConntrackDecode {
                        action: ACTION,
                        reason: error.to_string(),
                    }
                })?;
            let length = message.header.length as usize;
            match message.payload {
                NetlinkPayload::Done(_) => return Ok(flows),
                NetlinkPayload::Error(error) if error.code.is_some() => {
                    return Err(Error::Conntrack {
                        action: ACTION,
                        error: error.to_io(),
                    });
                }
                NetlinkPayload::InnerMessage(NetfilterMessage {
                    inner: NetfilterMessageInner::Conntrack(ConntrackMessage::New(attributes)),
                    ..
                }) => flows.extend(entry(&attributes)),
                _ => {}
            }
            if length == 0 {
                break;
            }
            // Messages are 4-byte aligned in a datagram.
            offset += (length + 3) & !3;
        }
    }
}

/// Deletes the entry whose original direction is `original`; false when
/// it was already gone.
fn delete(socket: &Socket, original: &Flow) -> Result<bool> {
    const ACTION: &str = "delete";
    let tuple = vec![
        Tuple::Ip(vec![
            IPTuple::SourceAddress(IpAddr::V4(original.source.0)),
            IPTuple::DestinationAddress(IpAddr::V4(original.destination.0)),
        ]),
        Tuple::Proto(vec![
            ProtoTuple::Protocol(Protocol::from(original.protocol)),
            ProtoTuple::SourcePort(original.source.1),
            ProtoTuple::DestinationPort(original.destination.1),
        ]),
    ];
    send(
        socket,
        NLM_F_REQUEST | NLM_F_ACK,
        ConntrackMessage::Delete(vec![ConntrackAttribute::CtaTupleOrig(tuple)]),
        ACTION,
    )?;
    loop {
        let (datagram, _) = socket.recv_from_full().map_err(|error| Error::Conntrack {
            action: ACTION,
            error,
        })?;
        let message =
            NetlinkMessage::<NetfilterMessage>::deserialize(&datagram).map_err(|error| {
                Error::ConntrackDecode {
                    action: ACTION,
                    reason: error.to_string(),
                }
            })?;
        if let NetlinkPayload::Error(error) = message.payload {
            return match error.code {
                None => Ok(true),
                Some(code) if code.get() == -ENOENT => Ok(false),
                Some(_) => Err(Error::Conntrack {
                    action: ACTION,
                    error: error.to_io(),
                }),
            };
        }
    }
}

/// Linux's errnos: the entry is gone already; a request this kernel
/// does not take.
const ENOENT: i32 = 2;
const EINVAL: i32 = 22;
const EOPNOTSUPP: i32 = 95;

/// The (original, reply) flows of one dumped entry.
fn entry(attributes: &[ConntrackAttribute]) -> Option<(Flow, Flow)> {
    let mut original = None;
    let mut reply = None;
    for attribute in attributes {
        match attribute {
            ConntrackAttribute::CtaTupleOrig(tuple) => original = flow(tuple),
            ConntrackAttribute::CtaTupleReply(tuple) => reply = flow(tuple),
            _ => {}
        }
    }
    Some((original?, reply?))
}

fn flow(tuple: &[Tuple]) -> Option<Flow> {
    let (mut source, mut destination) = (None, None);
    let (mut protocol, mut source_port, mut destination_port) = (None, None, None);
    for part in tuple {
        match part {
            Tuple::Ip(addresses) => {
                for address in addresses {
                    match address {
                        IPTuple::SourceAddress(IpAddr::V4(a)) => source = Some(*a),
                        IPTuple::DestinationAddress(IpAddr::V4(a)) => destination = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(parts) => {
                for part in parts {
                    match part {
                        ProtoTuple::Protocol(p) => protocol = Some(u8::from(*p)),
                        ProtoTuple::SourcePort(p) => source_port = Some(*p),
                        ProtoTuple::DestinationPort(p) => destination_port = Some(*p),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(Flow {
        protocol: protocol?,
        source: (source?, source_port?),
        destination: (destination?, destination_port?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_both_directions() {
        let tuple = |src: [u8; 4], sport, dst: [u8; 4], dport| {
            vec![
                Tuple::Ip(vec![
                    IPTuple::SourceAddress(IpAddr::V4(src.into())),
                    IPTuple::DestinationAddress(IpAddr::V4(dst.into())),
                ]),
                Tuple::Proto(vec![
                    ProtoTuple::Protocol(Protocol::Udp),
                    ProtoTuple::SourcePort(sport),
                    ProtoTuple::DestinationPort(dport),
                ]),
            ]
        };
        let attributes = vec![
            ConntrackAttribute::CtaTupleOrig(tuple([10, 42, 0, 2], 40000, [10, 43, 0, 1], 53)),
            ConntrackAttribute::CtaTupleReply(tuple([10, 42, 0, 3], 5353, [10, 42, 0, 2], 40000)),
            ConntrackAttribute::CtaMark(0),
        ];
        let (original, reply) = entry(&attributes).expect("both directions");
        assert_eq!(original.protocol, UDP);
        assert_eq!(original.destination, (Ipv4Addr::new(10, 43, 0, 1), 53));
        assert_eq!(reply.source, (Ipv4Addr::new(10, 42, 0, 3), 5353));
        // An ICMP-like entry without ports is not a flow we judge.
        let icmp = vec![ConntrackAttribute::CtaTupleOrig(vec![Tuple::Ip(vec![])])];
        assert_eq!(entry(&icmp), None);
    }
}
