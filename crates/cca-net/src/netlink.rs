//! The netlink client under [`crate::KernelNetwork`]: a [`session`] opens
//! one rtnetlink connection on a current-thread tokio runtime of its own
//! (the `HostNetwork` trait is synchronous and rtnetlink is async), and
//! [`Netlink`] wraps the requests the node needs, each turning the kernel's
//! answer into this crate's errors: what was asked, on which link, in which
//! namespace, and the kernel's reason. Teardown requests treat "already
//! gone" as success, as the trait requires.

use std::net::{IpAddr, Ipv4Addr};

use futures_util::TryStreamExt;
use rtnetlink::Handle;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::packet_route::link::{
    InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use rtnetlink::packet_route::neighbour::NeighbourMessage;
use rtnetlink::packet_route::route::RouteMessage;

use crate::error::{Error, Result};

/// Runs `work` with a fresh netlink connection, on a runtime owned by this
/// call. The socket lives in the calling thread's network namespace.
/// `place` (" in network namespace …", or empty) goes into every error.
pub(crate) fn session<T>(place: &str, work: impl AsyncFnOnce(&Netlink) -> Result<T>) -> Result<T> {
    let start = |reason: String| Error::Netlink {
        action: format!("open a netlink connection{place}"),
        reason,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|error| start(error.to_string()))?;
    runtime.block_on(async {
        let (connection, handle, _) =
            rtnetlink::new_connection().map_err(|error| start(error.to_string()))?;
        let driver = tokio::spawn(connection);
        let netlink = Netlink {
            handle,
            place: place.to_owned(),
        };
        let result = work(&netlink).await;
        driver.abort();
        result
    })
}

/// The errno of a kernel refusal (positive), if that is what `error` is.
fn errno(error: &rtnetlink::Error) -> Option<i32> {
    match error {
        rtnetlink::Error::NetlinkError(message) => Some(message.raw_code().abs()),
        _ => None,
    }
}

const ENOENT: i32 = 2;
const ESRCH: i32 = 3;
const EEXIST: i32 = 17;
const ENODEV: i32 = 19;
const EADDRNOTAVAIL: i32 = 99;

/// The kernel's reason in the words `ip` prints ("File exists (os error
/// 17)"), or the library's own description.
fn reason(error: &rtnetlink::Error) -> String {
    match error {
        rtnetlink::Error::NetlinkError(message) => message.to_io().to_string(),
        other => other.to_string(),
    }
}

/// One netlink connection's requests.
pub(crate) struct Netlink {
    handle: Handle,
    place: String,
}

impl Netlink {
    /// Where the connection is, for messages: " in network namespace …" or "".
    pub(crate) fn place(&self) -> &str {
        &self.place
    }

    /// The error of a failed `action`.
    pub(crate) fn failed(&self, action: impl std::fmt::Display, error: &rtnetlink::Error) -> Error {
        Error::Netlink {
            action: format!("{action}{}", self.place),
            reason: reason(error),
        }
    }

    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// The link named `name`, if there is one.
    pub(crate) async fn link(&self, name: &str) -> Result<Option<LinkMessage>> {
        let mut request = std::pin::pin!(self.handle.link().get().match_name(name).execute());
        match request.try_next().await {
            Ok(link) => Ok(link),
            Err(error) if errno(&error) == Some(ENODEV) => Ok(None),
            Err(error) => Err(self.failed(format_args!("look up link {name}"), &error)),
        }
    }

    /// The link with index `index`, if there is one.
    pub(crate) async fn link_by_index(&self, index: u32) -> Result<Option<LinkMessage>> {
        let mut request = std::pin::pin!(self.handle.link().get().match_index(index).execute());
        match request.try_next().await {
            Ok(link) => Ok(link),
            Err(error) if errno(&error) == Some(ENODEV) => Ok(None),
            Err(error) => Err(self.failed(format_args!("look up link #{index}"), &error)),
        }
    }

    /// The index of the link named `name`, or an error saying it is missing
    /// and `hint` (what to do about it).
    pub(crate) async fn index(&self, name: &str, hint: &str) -> Result<u32> {
        match self.link(name).await? {
            Some(link) => Ok(link.header.index),
            None => Err(Error::NoLink {
                name: name.to_owned(),
                place: self.place.clone(),
                hint: hint.to_owned(),
            }),
        }
    }

    /// Every link.
    pub(crate) async fn links(&self) -> Result<Vec<LinkMessage>> {
        self.handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|error| self.failed("list links", &error))
    }

    /// Creates a link; `Ok(false)` if one of that name exists already.
    pub(crate) async fn add_link(&self, what: &str, message: LinkMessage) -> Result<bool> {
        match self.handle.link().add(message).execute().await {
            Ok(()) => Ok(true),
            Err(error) if errno(&error) == Some(EEXIST) => Ok(false),
            Err(error) => Err(self.failed(format_args!("create {what}"), &error)),
        }
    }

    /// Changes a link (up, MTU, controller, address …).
    pub(crate) async fn set_link(&self, what: &str, message: LinkMessage) -> Result<()> {
        self.handle
            .link()
            .set(message)
            .execute()
            .await
            .map_err(|error| self.failed(what, &error))
    }

    /// Changes a bridge port's settings (`ip link set NAME type
    /// bridge_slave …`: RTM_NEWLINK, which carries port data, not
    /// RTM_SETLINK).
    pub(crate) async fn set_port(&self, what: &str, message: LinkMessage) -> Result<()> {
        self.handle
            .link()
            .set_port(message)
            .execute()
            .await
            .map_err(|error| self.failed(what, &error))
    }

    /// Deletes the link named `name`; gone already is fine.
    pub(crate) async fn delete_link(&self, name: &str) -> Result<()> {
        let Some(link) = self.link(name).await? else {
            return Ok(());
        };
        match self.handle.link().del(link.header.index).execute().await {
            Ok(()) => Ok(()),
            Err(error) if errno(&error) == Some(ENODEV) => Ok(()),
            Err(error) => Err(self.failed(format_args!("delete link {name}"), &error)),
        }
    }

    /// The IPv4 addresses (with prefix length) on link `index`.
    pub(crate) async fn addresses(&self, index: u32) -> Result<Vec<(Ipv4Addr, u8)>> {
        let messages: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .map_err(|error| {
                self.failed(format_args!("list the addresses of link #{index}"), &error)
            })?;
        Ok(messages
            .iter()
            .filter(|message| message.header.index == index)
            .filter_map(|message| Some((ipv4_of(message)?, message.header.prefix_len)))
            .collect())
    }

    /// Every IPv4 address and the index of the link holding it.
    pub(crate) async fn all_addresses(&self) -> Result<Vec<(Ipv4Addr, u32)>> {
        let messages: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|error| self.failed("list addresses", &error))?;
        Ok(messages
            .iter()
            .filter_map(|message| Some((ipv4_of(message)?, message.header.index)))
            .collect())
    }

    /// Gives link `index` (named `name`) `address/prefix`, as `ip addr
    /// replace` does: present already is fine.
    pub(crate) async fn replace_address(
        &self,
        index: u32,
        name: &str,
        address: Ipv4Addr,
        prefix: u8,
    ) -> Result<()> {
        self.handle
            .address()
            .add(index, IpAddr::V4(address), prefix)
            .replace()
            .execute()
            .await
            .map_err(|error| {
                self.failed(
                    format_args!("add address {address}/{prefix} to link {name}"),
                    &error,
                )
            })
    }

    /// Removes `address/prefix` from link `index`; gone already is fine.
    pub(crate) async fn delete_address(
        &self,
        index: u32,
        name: &str,
        address: Ipv4Addr,
        prefix: u8,
    ) -> Result<()> {
        let mut message = AddressMessage::default();
        message.header.family = AddressFamily::Inet;
        message.header.index = index;
        message.header.prefix_len = prefix;
        message
            .attributes
            .push(AddressAttribute::Local(IpAddr::V4(address)));
        message
            .attributes
            .push(AddressAttribute::Address(IpAddr::V4(address)));
        match self.handle.address().del(message).execute().await {
            Ok(()) => Ok(()),
            // EADDRNOTAVAIL: the address is not on the link.
            Err(error) if matches!(errno(&error), Some(ENOENT | ENODEV | EADDRNOTAVAIL)) => Ok(()),
            Err(error) => Err(self.failed(
                format_args!("remove address {address}/{prefix} from link {name}"),
                &error,
            )),
        }
    }

    /// Every IPv4 route of every table.
    pub(crate) async fn routes(&self) -> Result<Vec<RouteMessage>> {
        let query = rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new().build();
        self.handle
            .route()
            .get(query)
            .execute()
            .try_collect()
            .await
            .map_err(|error| self.failed("list routes", &error))
    }

    /// Adds or replaces a route (`ip route replace`).
    pub(crate) async fn replace_route(&self, what: &str, route: RouteMessage) -> Result<()> {
        self.handle
            .route()
            .add(route)
            .replace()
            .execute()
            .await
            .map_err(|error| self.failed(format_args!("set route {what}"), &error))
    }

    /// Deletes a route; gone already is fine.
    pub(crate) async fn delete_route(&self, what: &str, route: RouteMessage) -> Result<()> {
        match self.handle.route().del(route).execute().await {
            Ok(()) => Ok(()),
            Err(error) if matches!(errno(&error), Some(ESRCH | ENOENT | ENODEV)) => Ok(()),
            Err(error) => Err(self.failed(format_args!("delete route {what}"), &error)),
        }
    }

    /// Every neighbour entry of `family` (`Inet`: ARP; `Bridge`: FDB).
    pub(crate) async fn neighbours(&self, family: AddressFamily) -> Result<Vec<NeighbourMessage>> {
        let what = match family {
            AddressFamily::Bridge => "list forwarding (FDB) entries",
            _ => "list neighbour (ARP) entries",
        };
        self.handle
            .neighbours()
            .get()
            .set_address_family(family)
            .execute()
            .try_collect()
            .await
            .map_err(|error| self.failed(what, &error))
    }

    /// Deletes a neighbour or FDB entry; gone already is fine.
    pub(crate) async fn delete_neighbour(&self, what: &str, entry: NeighbourMessage) -> Result<()> {
        match self.handle.neighbours().del(entry).execute().await {
            Ok(()) => Ok(()),
            Err(error) if matches!(errno(&error), Some(ENOENT | ENODEV)) => Ok(()),
            Err(error) => Err(self.failed(format_args!("delete {what}"), &error)),
        }
    }
}

fn ipv4_of(message: &AddressMessage) -> Option<Ipv4Addr> {
    // IFA_LOCAL is the interface's own address; IFA_ADDRESS the peer's on
    // point-to-point links, else the same.
    let local = message
        .attributes
        .iter()
        .find_map(|attribute| match attribute {
            AddressAttribute::Local(IpAddr::V4(address)) => Some(*address),
            _ => None,
        });
    local.or_else(|| {
        message
            .attributes
            .iter()
            .find_map(|attribute| match attribute {
                AddressAttribute::Address(IpAddr::V4(address)) => Some(*address),
                _ => None,
            })
    })
}

/// A link's name.
pub(crate) fn link_name(link: &LinkMessage) -> Option<&str> {
    link.attributes
        .iter()
        .find_map(|attribute| match attribute {
            LinkAttribute::IfName(name) => Some(name.as_str()),
            _ => None,
        })
}

/// A link's MTU.
pub(crate) fn link_mtu(link: &LinkMessage) -> Option<u32> {
    link.attributes
        .iter()
        .find_map(|attribute| match attribute {
            LinkAttribute::Mtu(mtu) => Some(*mtu),
            _ => None,
        })
}

/// A link's hardware address.
pub(crate) fn link_address(link: &LinkMessage) -> Option<&[u8]> {
    link.attributes
        .iter()
        .find_map(|attribute| match attribute {
            LinkAttribute::Address(address) => Some(address.as_slice()),
            _ => None,
        })
}

/// Whether the link is administratively up.
pub(crate) fn link_up(link: &LinkMessage) -> bool {
    link.header.flags.contains(LinkFlags::Up)
}

/// A link's kind and, for VXLAN, its settings.
pub(crate) fn link_kind(link: &LinkMessage) -> (Option<&InfoKind>, Option<&[InfoVxlan]>) {
    let mut kind = None;
    let mut vxlan = None;
    for attribute in &link.attributes {
        if let LinkAttribute::LinkInfo(infos) = attribute {
            for info in infos {
                match info {
                    LinkInfo::Kind(k) => kind = Some(k),
                    LinkInfo::Data(InfoData::Vxlan(settings)) => vxlan = Some(settings.as_slice()),
                    _ => {}
                }
            }
        }
    }
    (kind, vxlan)
}
