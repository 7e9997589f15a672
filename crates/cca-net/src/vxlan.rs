//! [`OverlayHost`] for [`KernelNetwork`]: the VXLAN device and its
//! forwarding (FDB), neighbour and route entries over netlink, in the
//! network's namespace. What is on the device is ours alone (learning is
//! off), so listing the device's entries lists exactly what the overlay
//! put there.

use std::net::{IpAddr, Ipv4Addr};

use cca_model::net::Ipv4Net;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::link::{InfoKind, InfoVxlan};
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage};
use rtnetlink::{LinkUnspec, LinkVxlan, RouteMessageBuilder};

use crate::error::{Error, Result};
use crate::host::{FdbEntry, Mac, NeighbourEntry, OverlayHost, PeerRoute, VxlanSpec};
use crate::netlink::{Netlink, link_address, link_kind, link_mtu, link_up};
use crate::real::KernelNetwork;

/// The index of the link holding `address`.
async fn underlay_index(nl: &Netlink, address: Ipv4Addr) -> Result<u32> {
    nl.all_addresses()
        .await?
        .into_iter()
        .find_map(|(held, index)| (held == address).then_some(index))
        .ok_or_else(|| Error::NoUnderlay {
            address,
            place: nl.place().to_owned(),
        })
}

/// The index of `device`, or `None` when it does not exist (lists are
/// empty then, deletes have nothing to do).
async fn device_index(nl: &Netlink, device: &str) -> Result<Option<u32>> {
    Ok(nl.link(device).await?.map(|link| link.header.index))
}

const DEVICE_HINT: &str = "the overlay device is missing: sync the overlay (it creates the device)";

/// Whether an existing VXLAN device's fixed settings are `vxlan`'s (the
/// kernel cannot change a device's VNI, port or underlay in place).
fn same_tunnel(settings: &[InfoVxlan], vxlan: &VxlanSpec, underlay: u32) -> bool {
    let has = |wanted: &InfoVxlan| settings.contains(wanted);
    has(&InfoVxlan::Id(vxlan.vni))
        && has(&InfoVxlan::Port(vxlan.port))
        && has(&InfoVxlan::Local(vxlan.local))
        && has(&InfoVxlan::Link(underlay))
        && has(&InfoVxlan::Learning(false))
}

fn mac_of(bytes: &[u8]) -> Option<Mac> {
    Some(Mac(bytes.try_into().ok()?))
}

fn fdb_message(index: u32, entry: &FdbEntry) -> NeighbourMessage {
    let mut message = NeighbourMessage::default();
    message.header.family = AddressFamily::Bridge;
    message.header.ifindex = index;
    message.header.flags = NeighbourFlags::Own;
    message.header.state = NeighbourState::Permanent;
    message
        .attributes
        .push(NeighbourAttribute::LinkLayerAddress(entry.mac.0.to_vec()));
    message
        .attributes
        .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(
            entry.underlay,
        )));
    message
}

fn neighbour_message(index: u32, entry: &NeighbourEntry) -> NeighbourMessage {
    let mut message = NeighbourMessage::default();
    message.header.family = AddressFamily::Inet;
    message.header.ifindex = index;
    message.header.state = NeighbourState::Permanent;
    message
        .attributes
        .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(
            entry.address,
        )));
    message
}

fn route_message(index: u32, route: &PeerRoute) -> RouteMessage {
    RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(route.subnet.network(), route.subnet.prefix())
        .gateway(route.via)
        .output_interface(index)
        .onlink()
        .build()
}

fn neighbour_parts(message: &NeighbourMessage) -> (Option<Ipv4Addr>, Option<Mac>) {
    let mut address = None;
    let mut mac = None;
    for attribute in &message.attributes {
        match attribute {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => address = Some(*ip),
            // An FDB entry's (AF_BRIDGE) destination is not parsed by
            // family: it arrives as four raw bytes.
            NeighbourAttribute::Destination(NeighbourAddress::Other(bytes)) => {
                address = <[u8; 4]>::try_from(bytes.as_slice())
                    .ok()
                    .map(Ipv4Addr::from);
            }
            NeighbourAttribute::LinkLayerAddress(bytes) => mac = mac_of(bytes),
            _ => {}
        }
    }
    (address, mac)
}

fn peer_route(message: &RouteMessage, index: u32) -> Option<PeerRoute> {
    let table = message
        .attributes
        .iter()
        .find_map(|attribute| match attribute {
            RouteAttribute::Table(table) => Some(*table),
            _ => None,
        })
        .unwrap_or(u32::from(message.header.table));
    if table != u32::from(RouteHeader::RT_TABLE_MAIN) {
        return None;
    }
    let mut oif = None;
    let mut destination = Ipv4Addr::UNSPECIFIED;
    let mut via = None;
    for attribute in &message.attributes {
        match attribute {
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Destination(RouteAddress::Inet(address)) => destination = *address,
            RouteAttribute::Gateway(RouteAddress::Inet(address)) => via = Some(*address),
            _ => {}
        }
    }
    if oif != Some(index) {
        return None;
    }
    let subnet = Ipv4Net::new(destination, message.header.destination_prefix_length).ok()?;
    Some(PeerRoute { subnet, via: via? })
}

impl OverlayHost for KernelNetwork {
    fn underlay_mtu(&self, address: Ipv4Addr) -> Result<u32> {
        self.netlink(async |nl| {
            let index = underlay_index(nl, address).await?;
            let link = nl.link_by_index(index).await?;
            link.as_ref()
                .and_then(link_mtu)
                .ok_or_else(|| Error::Netlink {
                    action: format!("read the MTU of the link holding {address}{}", nl.place()),
                    reason: "the kernel's answer has no MTU".into(),
                })
        })
    }

    fn ensure_vxlan(&self, vxlan: &VxlanSpec) -> Result<()> {
        let name = vxlan.name.as_str();
        self.netlink(async |nl| {
            let underlay = underlay_index(nl, vxlan.local).await?;
            let mut existing = nl.link(name).await?;
            if let Some(link) = &existing {
                let (kind, settings) = link_kind(link);
                if kind != Some(&InfoKind::Vxlan) {
                    return Err(Error::InvalidConfig(format!(
                        "link {name}{} exists and is not a VXLAN device: configure another overlay device name or remove that link",
                        nl.place()
                    )));
                }
                if !same_tunnel(settings.unwrap_or_default(), vxlan, underlay) {
                    tracing::info!(device = name, vni = vxlan.vni, port = vxlan.port, local = %vxlan.local, "recreating the overlay device with new tunnel settings");
                    nl.delete_link(name).await?;
                    existing = None;
                }
            }
            if existing.is_none() {
                let device = LinkVxlan::new(name, vxlan.vni)
                    .dev(underlay)
                    .port(vxlan.port)
                    .local(vxlan.local)
                    .learning(false)
                    .mtu(vxlan.mtu)
                    .address(vxlan.mac.0.to_vec())
                    .up()
                    .build();
                let what = format!("VXLAN device {name} (VNI {}, port {})", vxlan.vni, vxlan.port);
                nl.add_link(&what, device).await?;
            }
            let link = nl.link(name).await?.ok_or_else(|| Error::NoLink {
                name: name.to_owned(),
                place: nl.place().to_owned(),
                hint: "it was just created: is something else deleting it?".into(),
            })?;
            let index = link.header.index;
            if link_address(&link).and_then(mac_of) != Some(vxlan.mac) {
                let down = LinkUnspec::new_with_index(index).down().build();
                nl.set_link(&format!("bring {name} down"), down).await?;
                let mac = LinkUnspec::new_with_index(index)
                    .address(vxlan.mac.0.to_vec())
                    .build();
                nl.set_link(&format!("set the MAC of {name} to {}", vxlan.mac), mac)
                    .await?;
            }
            let fresh = nl.link_by_index(index).await?;
            let settled = fresh
                .as_ref()
                .is_some_and(|link| link_mtu(link) == Some(vxlan.mtu) && link_up(link));
            if !settled {
                let up = LinkUnspec::new_with_index(index).mtu(vxlan.mtu).up().build();
                nl.set_link(&format!("set the MTU of {name} to {} and bring it up", vxlan.mtu), up)
                    .await?;
            }
            let mut has_address = false;
            for (address, prefix) in nl.addresses(index).await? {
                if (address, prefix) == (vxlan.address, 32) {
                    has_address = true;
                } else {
                    nl.delete_address(index, name, address, prefix).await?;
                }
            }
            if !has_address {
                nl.replace_address(index, name, vxlan.address, 32).await?;
            }
            Ok(())
        })
    }

    fn delete_vxlan(&self, name: &str) -> Result<()> {
        self.netlink(async |nl| nl.delete_link(name).await)
    }

    fn set_mtu(&self, link: &str, mtu: u32) -> Result<()> {
        self.netlink(async |nl| {
            let current = nl.link(link).await?.ok_or_else(|| Error::NoLink {
                name: link.to_owned(),
                place: nl.place().to_owned(),
                hint: "create it first".into(),
            })?;
            if link_mtu(&current) == Some(mtu) {
                return Ok(());
            }
            let message = LinkUnspec::new_with_index(current.header.index)
                .mtu(mtu)
                .build();
            nl.set_link(&format!("set the MTU of {link} to {mtu}"), message)
                .await
        })
    }

    fn list_fdb(&self, device: &str) -> Result<Vec<FdbEntry>> {
        self.netlink(async |nl| {
            let Some(index) = device_index(nl, device).await? else {
                return Ok(Vec::new());
            };
            let mut entries: Vec<FdbEntry> = nl
                .neighbours(AddressFamily::Bridge)
                .await?
                .iter()
                .filter(|message| message.header.ifindex == index)
                .filter_map(|message| match neighbour_parts(message) {
                    (Some(underlay), Some(mac)) => Some(FdbEntry { mac, underlay }),
                    _ => None,
                })
                .collect();
            entries.sort();
            Ok(entries)
        })
    }

    fn add_fdb(&self, device: &str, entry: &FdbEntry) -> Result<()> {
        self.netlink(async |nl| {
            let index = nl.index(device, DEVICE_HINT).await?;
            nl.handle()
                .neighbours()
                .add_bridge(index, &entry.mac.0)
                .destination(IpAddr::V4(entry.underlay))
                .flags(NeighbourFlags::Own)
                .state(NeighbourState::Permanent)
                .replace()
                .execute()
                .await
                .map_err(|error| {
                    nl.failed(
                        format_args!(
                            "add forwarding entry {} dst {} on {device}",
                            entry.mac, entry.underlay
                        ),
                        &error,
                    )
                })
        })
    }

    fn delete_fdb(&self, device: &str, entry: &FdbEntry) -> Result<()> {
        self.netlink(async |nl| {
            let Some(index) = device_index(nl, device).await? else {
                return Ok(());
            };
            let what = format!(
                "forwarding entry {} dst {} on {device}",
                entry.mac, entry.underlay
            );
            nl.delete_neighbour(&what, fdb_message(index, entry)).await
        })
    }

    fn list_neighbours(&self, device: &str) -> Result<Vec<NeighbourEntry>> {
        self.netlink(async |nl| {
            let Some(index) = device_index(nl, device).await? else {
                return Ok(Vec::new());
            };
            let mut entries: Vec<NeighbourEntry> = nl
                .neighbours(AddressFamily::Inet)
                .await?
                .iter()
                .filter(|message| {
                    message.header.ifindex == index
                        && message.header.state == NeighbourState::Permanent
                })
                .filter_map(|message| match neighbour_parts(message) {
                    (Some(address), Some(mac)) => Some(NeighbourEntry { address, mac }),
                    _ => None,
                })
                .collect();
            entries.sort();
            Ok(entries)
        })
    }

    fn add_neighbour(&self, device: &str, entry: &NeighbourEntry) -> Result<()> {
        self.netlink(async |nl| {
            let index = nl.index(device, DEVICE_HINT).await?;
            nl.handle()
                .neighbours()
                .add(index, IpAddr::V4(entry.address))
                .link_layer_address(&entry.mac.0)
                .state(NeighbourState::Permanent)
                .replace()
                .execute()
                .await
                .map_err(|error| {
                    nl.failed(
                        format_args!(
                            "add neighbour entry {} lladdr {} on {device}",
                            entry.address, entry.mac
                        ),
                        &error,
                    )
                })
        })
    }

    fn delete_neighbour(&self, device: &str, entry: &NeighbourEntry) -> Result<()> {
        self.netlink(async |nl| {
            let Some(index) = device_index(nl, device).await? else {
                return Ok(());
            };
            let what = format!("neighbour entry {} on {device}", entry.address);
            nl.delete_neighbour(&what, neighbour_message(index, entry))
                .await
        })
    }

    fn list_routes(&self, device: &str) -> Result<Vec<PeerRoute>> {
        self.netlink(async |nl| {
            let Some(index) = device_index(nl, device).await? else {
                return Ok(Vec::new());
            };
            let mut routes: Vec<PeerRoute> = nl
                .routes()
                .await?
                .iter()
                .filter_map(|message| peer_route(message, index))
                .collect();
            routes.sort();
            Ok(routes)
        })
    }

    fn add_route(&self, device: &str, route: &PeerRoute) -> Result<()> {
        self.netlink(async |nl| {
            let index = nl.index(device, DEVICE_HINT).await?;
            let what = format!("{} via {} dev {device} onlink", route.subnet, route.via);
            nl.replace_route(&what, route_message(index, route)).await
        })
    }

    fn delete_route(&self, device: &str, route: &PeerRoute) -> Result<()> {
        self.netlink(async |nl| {
            let Some(index) = device_index(nl, device).await? else {
                return Ok(());
            };
            let what = format!("{} via {} dev {device}", route.subnet, route.via);
            nl.delete_route(&what, route_message(index, route)).await
        })
    }
}
