//! The programs' map layout (`bpf/lb.h`, layout 1) as bytes: each key and
//! value is encoded here field by field, in the order, widths and byte
//! orders of the C structs (addresses and ports in network order, ids and
//! counts in the host's), so the loader needs no unsafe casts.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use super::maglev::{SMALL_TABLE_SIZE, TABLE_SIZE};

/// `LB_LAYOUT`: bumped, with the maps' `_v1` suffix, by any change here.
pub const LAYOUT: u32 = 1;

/// Map names (`SEC(".maps")` in `sock_lb.bpf.c`) and their pins.
pub const CONFIG_MAP: &str = "cca_cfg_v1";
pub const FRONT_MAP: &str = "cca_front_v1";
pub const TABLE_MAP: &str = "cca_table_v1";
pub const SMALL_TABLE_MAP: &str = "cca_tsmall_v1";
pub const BACKEND_MAP: &str = "cca_backend_v1";
pub const SOCK_REV_MAP: &str = "cca_sockrev_v1";
pub const STATS_MAP: &str = "cca_stats_v1";
pub const CT_MAP: &str = "cca_ct_v1";
pub const TC_CONFIG_MAP: &str = "cca_tccfg_v1";
pub const TC_STATS_MAP: &str = "cca_tcstats_v1";
pub const REJECT_MAP: &str = "cca_rejbkt_v1";

/// `front.flags`: the same client goes to the same backend.
pub const FRONT_AFFINITY: u8 = 1;
/// `front.flags`: the front's table is a small one (`cca_tsmall_v1`).
pub const FRONT_SMALL: u8 = 2;

/// `enum lb_stat`, in order.
pub const STATS: [&str; 5] = [
    "translated",
    "rejected",
    "no_table",
    "no_backend",
    "reversed",
];

/// `enum lb_tc_stat`, in order: the tc programs' counters.
pub const TC_STATS: [&str; 9] = [
    "tc_flows",
    "tc_hairpin",
    "tc_reset",
    "tc_unreachable",
    "tc_limited",
    "tc_reselected",
    "tc_no_table",
    "tc_no_backend",
    "tc_passed",
];

/// `ct_key.dir` of an entry for the way back from a backend.
pub const CT_REVERSE: u8 = 1;

pub type FrontKeyBytes = [u8; 20];
pub type FrontBytes = [u8; 8];
pub type TableKeyBytes = [u8; 8];
pub type TableBytes = [u32; TABLE_SIZE];
pub type SmallTableBytes = [u32; SMALL_TABLE_SIZE];
pub type BackendBytes = [u8; 20];
pub type SockRevKeyBytes = [u8; 32];
pub type ConfigBytes = [u8; 48];
pub type CtKeyBytes = [u8; 40];
pub type CtEntryBytes = [u8; 32];
pub type TcConfigBytes = [u8; 64];

/// IPv4 as IPv4-mapped IPv6: one key for both families.
pub fn address_bytes(address: IpAddr) -> [u8; 16] {
    match address {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The address and port a key or value holds (IPv4 when mapped).
pub fn socket_of(bytes: &[u8]) -> SocketAddr {
    let mut octets = [0; 16];
    octets.copy_from_slice(&bytes[..16]);
    let v6 = Ipv6Addr::from(octets);
    let port = u16::from_be_bytes([bytes[16], bytes[17]]);
    let address = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
    SocketAddr::new(address, port)
}

/// `struct front_key`: a service's address, port and protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FrontKey {
    pub address: SocketAddr,
    /// `IPPROTO_TCP` or `IPPROTO_UDP`.
    pub protocol: u8,
}

impl FrontKey {
    pub fn bytes(&self) -> FrontKeyBytes {
        let mut out = [0; 20];
        out[..16].copy_from_slice(&address_bytes(self.address.ip()));
        out[16..18].copy_from_slice(&self.address.port().to_be_bytes());
        out[18] = self.protocol;
        out
    }

    pub fn from_bytes(bytes: &FrontKeyBytes) -> Self {
        Self {
            address: socket_of(bytes),
            protocol: bytes[18],
        }
    }
}

/// `struct front`: which table of the front is live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Front {
    pub id: u32,
    pub count: u16,
    pub generation: u8,
    pub flags: u8,
}

impl Front {
    pub fn bytes(&self) -> FrontBytes {
        let mut out = [0; 8];
        out[..4].copy_from_slice(&self.id.to_ne_bytes());
        out[4..6].copy_from_slice(&self.count.to_ne_bytes());
        out[6] = self.generation;
        out[7] = self.flags;
        out
    }

    pub fn from_bytes(bytes: &FrontBytes) -> Self {
        Self {
            id: u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            count: u16::from_ne_bytes([bytes[4], bytes[5]]),
            generation: bytes[6],
            flags: bytes[7],
        }
    }
}

/// A table: `struct table_key` and which map it is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TableKey {
    pub front: u32,
    pub generation: u8,
    /// In the small-table map (`FRONT_SMALL`).
    pub small: bool,
}

impl TableKey {
    pub fn bytes(&self) -> TableKeyBytes {
        let mut out = [0; 8];
        out[..4].copy_from_slice(&self.front.to_ne_bytes());
        out[4..].copy_from_slice(&u32::from(self.generation).to_ne_bytes());
        out
    }

    pub fn from_bytes(bytes: &TableKeyBytes, small: bool) -> Self {
        Self {
            front: u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            generation: bytes[4],
            small,
        }
    }
}

/// `struct backend`.
pub fn backend_bytes(address: SocketAddr) -> BackendBytes {
    let mut out = [0; 20];
    out[..16].copy_from_slice(&address_bytes(address.ip()));
    out[16..18].copy_from_slice(&address.port().to_be_bytes());
    out
}

/// The backend address a `struct sock_rev_key` names (its socket is in the
/// first 8 bytes).
pub fn sock_rev_backend(key: &SockRevKeyBytes) -> SocketAddr {
    socket_of(&key[8..])
}

/// The backend a flow-table entry leads to or comes from: a forward
/// entry's value names it, a reverse entry's key starts with it.
pub fn ct_backend(key: &CtKeyBytes, entry: &CtEntryBytes) -> SocketAddr {
    if key[37] == CT_REVERSE {
        let mut backend = [0; 18];
        backend[..16].copy_from_slice(&key[..16]);
        backend[16..].copy_from_slice(&key[32..34]);
        socket_of(&backend)
    } else {
        socket_of(entry)
    }
}

/// `struct tc_config`: the service range the tc programs look flows up
/// in (`None`: every address); no IPv6 range yet, so IPv6 packets only
/// when there is no range at all.
pub fn tc_config_bytes(services: Option<(std::net::Ipv4Addr, u8)>) -> TcConfigBytes {
    let mut out = [0; 64];
    let Some((network, prefix)) = services else {
        return out;
    };
    out[..16].copy_from_slice(&network.to_ipv6_mapped().octets());
    // The mapped prefix (::ffff:0:0/96) and the range's own bits.
    let mask = u128::MAX << (32 - u32::from(prefix.min(32)));
    out[16..32].copy_from_slice(&mask.to_be_bytes());
    // A range that matches nothing: a net outside its own mask.
    out[32..48].copy_from_slice(&[0xff; 16]);
    out
}

/// `struct lb_config`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    pub netns_cookie: u64,
    pub seed: u64,
    pub learn: [u8; 16],
    pub learned: u64,
}

impl Config {
    pub fn bytes(&self) -> ConfigBytes {
        let mut out = [0; 48];
        out[..8].copy_from_slice(&self.netns_cookie.to_ne_bytes());
        out[8..16].copy_from_slice(&self.seed.to_ne_bytes());
        out[16..20].copy_from_slice(&LAYOUT.to_ne_bytes());
        out[24..40].copy_from_slice(&self.learn);
        out[40..48].copy_from_slice(&self.learned.to_ne_bytes());
        out
    }

    pub fn from_bytes(bytes: &ConfigBytes) -> Self {
        let word = |at: usize| {
            let mut eight = [0; 8];
            eight.copy_from_slice(&bytes[at..at + 8]);
            u64::from_ne_bytes(eight)
        };
        let mut learn = [0; 16];
        learn.copy_from_slice(&bytes[24..40]);
        Self {
            netns_cookie: word(0),
            seed: word(8),
            learn,
            learned: word(40),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_read_back_as_written() {
        let key = FrontKey {
            address: "10.43.0.7:80".parse().expect("address"),
            protocol: 6,
        };
        assert_eq!(FrontKey::from_bytes(&key.bytes()), key);
        let v6 = FrontKey {
            address: "[fd00::7]:53".parse().expect("address"),
            protocol: 17,
        };
        assert_eq!(FrontKey::from_bytes(&v6.bytes()), v6);
        let front = Front {
            id: 70_000,
            count: 3,
            generation: 1,
            flags: FRONT_AFFINITY,
        };
        assert_eq!(Front::from_bytes(&front.bytes()), front);
        let config = Config {
            netns_cookie: 4097,
            seed: u64::MAX - 5,
            learn: [7; 16],
            learned: 12,
        };
        assert_eq!(Config::from_bytes(&config.bytes()), config);
    }

    #[test]
    fn flow_entries_name_their_backend_both_ways() {
        let backend: SocketAddr = "10.42.1.5:8080".parse().expect("address");
        let mut forward_key = [0u8; 40];
        forward_key[37] = 0;
        let mut entry = [0u8; 32];
        entry[..20].copy_from_slice(&backend_bytes(backend));
        assert_eq!(ct_backend(&forward_key, &entry), backend);
        let mut reverse_key = [0u8; 40];
        reverse_key[..16].copy_from_slice(&address_bytes(backend.ip()));
        reverse_key[32..34].copy_from_slice(&backend.port().to_be_bytes());
        reverse_key[37] = CT_REVERSE;
        assert_eq!(ct_backend(&reverse_key, &[0; 32]), backend);
    }

    #[test]
    fn the_service_range_is_a_mapped_prefix() {
        let bytes = tc_config_bytes(Some((std::net::Ipv4Addr::new(10, 43, 0, 0), 16)));
        assert_eq!(
            &bytes[..16],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 43, 0, 0]
        );
        assert_eq!(
            &bytes[16..32],
            &[0xff; 12]
                .iter()
                .chain(&[0xff, 0xff, 0, 0])
                .copied()
                .collect::<Vec<_>>()[..]
        );
        assert_eq!(&bytes[48..], &[0; 16], "the IPv6 range's mask is empty");
        assert_eq!(tc_config_bytes(None), [0; 64]);
    }

    #[test]
    fn ipv4_is_mapped_and_ports_are_in_network_order() {
        let key = FrontKey {
            address: "10.43.0.7:80".parse().expect("address"),
            protocol: 6,
        };
        let bytes = key.bytes();
        assert_eq!(
            &bytes[..16],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 43, 0, 7]
        );
        assert_eq!(&bytes[16..], &[0, 80, 6, 0]);
        let backend: SocketAddr = "10.42.1.5:8080".parse().expect("address");
        let mut rev_key = [0u8; 32];
        rev_key[8..28].copy_from_slice(&backend_bytes(backend));
        assert_eq!(sock_rev_backend(&rev_key), backend);
    }
}
