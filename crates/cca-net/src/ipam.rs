//! Address management for one node subnet. [`Subnet`] is an IPv4 network
//! with the gateway at its first host address (the node bridge); [`Ipam`]
//! leases the remaining host addresses to instances. Allocation is pure —
//! no IO — so it is tested exhaustively here; the node service persists
//! the whole [`Ipam`] as JSON so a restarted agent keeps every assignment.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// An IPv4 node subnet such as `10.88.3.0/24`: network address and prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Subnet {
    network: Ipv4Addr,
    prefix: u8,
}

impl Subnet {
    /// A subnet from its network address and prefix length. Host bits must
    /// be zero and the prefix must leave room for a gateway and at least one
    /// instance (/30 or larger).
    pub fn new(network: Ipv4Addr, prefix: u8) -> Result<Self> {
        let text = format!("{network}/{prefix}");
        let invalid = |reason: &str| Error::InvalidSubnet {
            subnet: text.clone(),
            reason: reason.into(),
        };
        if prefix > 30 {
            return Err(invalid(
                "the prefix must be /30 or shorter to hold a gateway and an instance",
            ));
        }
        if prefix < 8 {
            return Err(invalid("a node subnet shorter than /8 is not supported"));
        }
        if u32::from(network) & !mask(prefix) != 0 {
            return Err(invalid("host bits are set"));
        }
        Ok(Self { network, prefix })
    }

    /// The network address.
    pub fn network(&self) -> Ipv4Addr {
        self.network
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// The gateway: the first host address, held by the node bridge.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) + 1)
    }

    /// Whether `address` lies in this subnet.
    pub fn contains(&self, address: Ipv4Addr) -> bool {
        u32::from(address) & mask(self.prefix) == u32::from(self.network)
    }

    /// The addresses instances may get: after the gateway, before broadcast.
    fn instance_range(&self) -> (u32, u32) {
        let first = u32::from(self.network) + 2;
        let broadcast = u32::from(self.network) | !mask(self.prefix);
        (first, broadcast - 1)
    }
}

fn mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix))
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl FromStr for Subnet {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let invalid = |reason: &str| Error::InvalidSubnet {
            subnet: text.into(),
            reason: reason.into(),
        };
        let (network, prefix) = text
            .split_once('/')
            .ok_or_else(|| invalid("expected ADDRESS/PREFIX"))?;
        let network: Ipv4Addr = network
            .parse()
            .map_err(|_| invalid("the address is not IPv4"))?;
        let prefix: u8 = prefix
            .parse()
            .map_err(|_| invalid("the prefix is not a number"))?;
        Self::new(network, prefix)
    }
}

impl Serialize for Subnet {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Subnet {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Leases of a subnet's instance addresses, keyed by instance id.
///
/// Allocation walks forward from the last address handed out instead of
/// reusing the lowest free one, so an address just released (whose
/// conntrack entries and peers' ARP caches may still point at the old
/// instance) is reused as late as possible.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ipam {
    subnet: Subnet,
    leases: BTreeMap<String, Ipv4Addr>,
    /// The last address handed out; the next search starts after it.
    last: Option<Ipv4Addr>,
}

impl Ipam {
    /// An empty lease table for `subnet`.
    pub fn new(subnet: Subnet) -> Self {
        Self {
            subnet,
            leases: BTreeMap::new(),
            last: None,
        }
    }

    /// The subnet the leases are in.
    pub fn subnet(&self) -> Subnet {
        self.subnet
    }

    /// The address leased to `instance`, if any.
    pub fn get(&self, instance: &str) -> Option<Ipv4Addr> {
        self.leases.get(instance).copied()
    }

    /// Every lease, by instance id.
    pub fn leases(&self) -> &BTreeMap<String, Ipv4Addr> {
        &self.leases
    }

    /// The address of `instance`, leasing a free one if it has none. Asking
    /// again returns the same address, so a retried attach is harmless.
    pub fn allocate(&mut self, instance: &str) -> Result<Ipv4Addr> {
        if let Some(address) = self.get(instance) {
            return Ok(address);
        }
        let (first, last) = self.subnet.instance_range();
        let start = match self.last {
            Some(previous) if u32::from(previous) >= first && u32::from(previous) < last => {
                u32::from(previous) + 1
            }
            _ => first,
        };
        let used: std::collections::BTreeSet<u32> =
            self.leases.values().map(|a| u32::from(*a)).collect();
        let candidate = (start..=last)
            .chain(first..start)
            .find(|candidate| !used.contains(candidate))
            .ok_or_else(|| Error::Exhausted {
                subnet: self.subnet.to_string(),
                instance: instance.into(),
            })?;
        let address = Ipv4Addr::from(candidate);
        self.leases.insert(instance.into(), address);
        self.last = Some(address);
        Ok(address)
    }

    /// Releases the lease of `instance`, returning its address if it had one.
    pub fn release(&mut self, instance: &str) -> Option<Ipv4Addr> {
        self.leases.remove(instance)
    }

    /// Checks a table read from disk: every address inside the subnet,
    /// outside the gateway, and no address leased twice.
    pub fn validate(&self) -> Result<()> {
        let (first, last) = self.subnet.instance_range();
        let mut seen = std::collections::BTreeSet::new();
        for (instance, address) in &self.leases {
            let value = u32::from(*address);
            if value < first || value > last || !seen.insert(value) {
                return Err(Error::OutsideSubnet {
                    address: *address,
                    instance: instance.clone(),
                    subnet: self.subnet.to_string(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subnet(text: &str) -> Subnet {
        text.parse().unwrap()
    }

    #[test]
    fn parses_and_displays() {
        let s = subnet("10.88.3.0/24");
        assert_eq!(s.to_string(), "10.88.3.0/24");
        assert_eq!(s.gateway(), Ipv4Addr::new(10, 88, 3, 1));
        assert!(s.contains(Ipv4Addr::new(10, 88, 3, 200)));
        assert!(!s.contains(Ipv4Addr::new(10, 88, 4, 1)));
    }

    #[test]
    fn rejects_bad_subnets() {
        for (text, reason) in [
            ("10.88.3.1/24", "host bits"),
            ("10.88.3.0/31", "/30 or shorter"),
            ("10.88.3.0", "ADDRESS/PREFIX"),
            ("fd00::/64", "not IPv4"),
            ("10.0.0.0/x", "not a number"),
            ("10.0.0.0/4", "shorter than /8"),
        ] {
            let error = text.parse::<Subnet>().unwrap_err().to_string();
            assert!(error.contains(reason), "{text}: {error}");
            assert!(error.contains(text), "{text}: {error}");
        }
    }

    #[test]
    fn allocates_after_the_gateway_and_is_idempotent() {
        let mut ipam = Ipam::new(subnet("10.88.0.0/24"));
        assert_eq!(ipam.allocate("a").unwrap(), Ipv4Addr::new(10, 88, 0, 2));
        assert_eq!(ipam.allocate("b").unwrap(), Ipv4Addr::new(10, 88, 0, 3));
        assert_eq!(ipam.allocate("a").unwrap(), Ipv4Addr::new(10, 88, 0, 2));
        assert_eq!(ipam.leases().len(), 2);
    }

    #[test]
    fn released_addresses_are_reused_last() {
        let mut ipam = Ipam::new(subnet("10.88.0.0/24"));
        let a = ipam.allocate("a").unwrap();
        assert_eq!(ipam.release("a"), Some(a));
        assert_eq!(ipam.release("a"), None);
        // The next lease moves on instead of handing `a`'s address out again.
        assert_eq!(ipam.allocate("b").unwrap(), Ipv4Addr::new(10, 88, 0, 3));
    }

    #[test]
    fn wraps_around_and_exhausts() {
        // A /29 has .2 to .6 for instances: five addresses.
        let mut ipam = Ipam::new(subnet("10.88.0.0/29"));
        for i in 0..5 {
            ipam.allocate(&format!("i{i}")).unwrap();
        }
        let error = ipam.allocate("extra").unwrap_err().to_string();
        assert_eq!(
            error,
            "subnet 10.88.0.0/29 has no free address for instance extra"
        );
        ipam.release("i1");
        // After .6 the search wraps to the start and finds the freed .3.
        assert_eq!(ipam.allocate("extra").unwrap(), Ipv4Addr::new(10, 88, 0, 3));
        ipam.validate().unwrap();
    }

    #[test]
    fn every_address_is_unique_under_churn() {
        let mut ipam = Ipam::new(subnet("10.88.0.0/28"));
        let mut rng = 7u64;
        for step in 0..2000 {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let id = format!("i{}", (rng >> 33) % 20);
            if step % 3 == 0 {
                ipam.release(&id);
            } else if let Ok(address) = ipam.allocate(&id) {
                assert!(ipam.subnet().contains(address));
                assert_ne!(address, ipam.subnet().gateway());
            }
            ipam.validate().unwrap();
        }
    }

    #[test]
    fn round_trips_through_json_and_validates() {
        let mut ipam = Ipam::new(subnet("10.88.0.0/24"));
        ipam.allocate("a").unwrap();
        let json = serde_json::to_string(&ipam).unwrap();
        assert!(json.contains("\"10.88.0.0/24\""), "{json}");
        let back: Ipam = serde_json::from_str(&json).unwrap();
        assert_eq!(back, ipam);

        let bad = json.replace("10.88.0.2", "10.88.0.1");
        let bad: Ipam = serde_json::from_str(&bad).unwrap();
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "address 10.88.0.1 of instance a is outside subnet 10.88.0.0/24"
        );
    }
}
