//! Whose is the TCP listener on a host port: the instance's own processes,
//! or something else on the machine. A health probe of an instance on the
//! host's network connects to its host port; when another program (another
//! cluster on a shared machine) bound that port first, the instance's own
//! bind failed, yet until it exits the probe reaches the other program and
//! would call the instance healthy. The supervisor asks once per run and
//! port, after the first probe that connects.
//!
//! Read from procfs: the listening sockets of `/proc/net/tcp` and
//! `/proc/net/tcp6` (their inodes), and the socket descriptors under
//! `/proc/PID/fd` of the instance's main process and its descendants
//! (`/proc/PID/task/TID/children`).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

/// Who holds the listener a connection to an address and port reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListenerOwner {
    /// One of the instance's processes.
    Instance,
    /// Something else: the port is held outside the instance.
    Other,
    /// No listener there, or it could not be read: nothing to conclude.
    Unknown,
}

/// The owner of the listener `address:port` reaches, as seen from the
/// process tree of `pid`.
pub fn owner(address: IpAddr, port: u16, pid: u32) -> ListenerOwner {
    let proc = Path::new("/proc");
    let inodes = listening_inodes(proc, address, port);
    if inodes.is_empty() {
        return ListenerOwner::Unknown;
    }
    let owned = process_tree(proc, pid).into_iter().any(|pid| {
        socket_inodes(proc, pid)
            .iter()
            .any(|inode| inodes.contains(inode))
    });
    if owned {
        ListenerOwner::Instance
    } else {
        ListenerOwner::Other
    }
}

/// The inodes of the listeners a connection to `address:port` could reach:
/// the ones bound to exactly that address, else those on every address.
fn listening_inodes(proc: &Path, address: IpAddr, port: u16) -> BTreeSet<u64> {
    let mut exact = BTreeSet::new();
    let mut wildcard = BTreeSet::new();
    for table in ["net/tcp", "net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(proc.join(table)) else {
            continue;
        };
        for listener in text.lines().skip(1).filter_map(parse_listener) {
            if listener.port != port {
                continue;
            }
            if same_address(listener.address, address) {
                exact.insert(listener.inode);
            } else if listener.address.is_unspecified() {
                wildcard.insert(listener.inode);
            }
        }
    }
    if exact.is_empty() { wildcard } else { exact }
}

/// An IPv4 address also matches its IPv4-mapped IPv6 form.
fn same_address(listening: IpAddr, wanted: IpAddr) -> bool {
    let canonical = |address: IpAddr| match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        v4 => v4,
    };
    canonical(listening) == canonical(wanted)
}

/// One listening socket of a `/proc/net/tcp*` table.
#[derive(Debug, PartialEq, Eq)]
struct Listening {
    address: IpAddr,
    port: u16,
    inode: u64,
}

/// `st` of a socket in the LISTEN state.
const LISTEN: &str = "0A";

/// A line of `/proc/net/tcp` or `tcp6` (`sl local rem st tx:rx tr:when
/// retrnsmt uid timeout inode ...`), when it is a listener.
fn parse_listener(line: &str) -> Option<Listening> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.get(3) != Some(&LISTEN) {
        return None;
    }
    let (address, port) = fields.get(1)?.split_once(':')?;
    Some(Listening {
        address: parse_address(address)?,
        port: u16::from_str_radix(port, 16).ok()?,
        inode: fields.get(9)?.parse().ok()?,
    })
}

/// The kernel prints an address as 32-bit words, each the hex of the
/// word's bytes read as a native integer.
fn parse_address(hex: &str) -> Option<IpAddr> {
    let word = |index: usize| {
        let chunk = hex.get(index * 8..index * 8 + 8)?;
        u32::from_str_radix(chunk, 16).ok().map(u32::to_ne_bytes)
    };
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut octets = [0u8; 16];
            for (index, chunk) in octets.chunks_mut(4).enumerate() {
                chunk.copy_from_slice(&word(index)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        _ => None,
    }
}

/// `pid` and every process descended from it.
fn process_tree(proc: &Path, pid: u32) -> Vec<u32> {
    let mut tree = vec![pid];
    let mut next = 0;
    while let Some(&parent) = tree.get(next) {
        next += 1;
        let Ok(tasks) = std::fs::read_dir(proc.join(format!("{parent}/task"))) else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(children) = std::fs::read_to_string(task.path().join("children")) else {
                continue;
            };
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                if !tree.contains(&child) {
                    tree.push(child);
                }
            }
        }
    }
    tree
}

/// The inodes of the sockets `pid` has open.
fn socket_inodes(proc: &Path, pid: u32) -> Vec<u64> {
    let Ok(descriptors) = std::fs::read_dir(proc.join(format!("{pid}/fd"))) else {
        return Vec::new();
    };
    descriptors
        .flatten()
        .filter_map(|descriptor| std::fs::read_link(descriptor.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?;
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_are_read_from_both_tables_and_others_skipped() {
        let v4 = "   0: 0200007F:4E20 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 31337 1 0000000000000000 100 0 0 10 0";
        assert_eq!(
            parse_listener(v4),
            Some(Listening {
                address: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
                port: 20000,
                inode: 31337,
            })
        );
        let established = v4.replace(" 0A ", " 01 ");
        assert_eq!(parse_listener(&established), None);
        let v6 = "   1: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0";
        assert_eq!(
            parse_listener(v6),
            Some(Listening {
                address: IpAddr::V6(Ipv6Addr::LOCALHOST),
                port: 8080,
                inode: 4242,
            })
        );
    }

    #[test]
    fn a_mapped_address_is_its_ipv4_address() {
        let mapped = IpAddr::V6(Ipv4Addr::new(127, 0, 0, 2).to_ipv6_mapped());
        assert!(same_address(
            mapped,
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))
        ));
        assert!(!same_address(mapped, IpAddr::V4(Ipv4Addr::LOCALHOST)));
    }

    #[test]
    fn our_listener_is_ours_and_not_another_process() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        let port = listener.local_addr().expect("address").port();
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert_eq!(
            owner(loopback, port, std::process::id()),
            ListenerOwner::Instance
        );
        // A process with no such socket (and no descendants).
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep runs");
        let seen = owner(loopback, port, other.id());
        let _ = other.kill();
        let _ = other.wait();
        assert_eq!(seen, ListenerOwner::Other);
        drop(listener);
        assert_eq!(
            owner(loopback, port, std::process::id()),
            ListenerOwner::Unknown
        );
    }

    #[test]
    fn a_listener_on_every_address_is_reached_by_any() {
        let listener = std::net::TcpListener::bind("0.0.0.0:0").expect("binds");
        let port = listener.local_addr().expect("address").port();
        let node = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9));
        assert_eq!(
            owner(node, port, std::process::id()),
            ListenerOwner::Instance
        );
    }

    #[test]
    fn a_descendants_listener_belongs_to_the_tree() {
        use std::os::unix::process::CommandExt;
        let port = {
            let free = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
            free.local_addr().expect("address").port()
        };
        // `; true` keeps the shell: the listener is its child's.
        let script = format!("busybox httpd -f -p 127.0.0.1:{port}; true");
        let mut shell = std::process::Command::new("sh")
            .args(["-c", &script])
            .process_group(0)
            .spawn()
            .expect("sh runs");
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut seen = ListenerOwner::Unknown;
        while std::time::Instant::now() < deadline && seen == ListenerOwner::Unknown {
            std::thread::sleep(std::time::Duration::from_millis(20));
            seen = owner(loopback, port, shell.id());
        }
        let group = format!("-{}", shell.id());
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &group])
            .status();
        let _ = shell.wait();
        assert_eq!(seen, ListenerOwner::Instance);
    }
}
