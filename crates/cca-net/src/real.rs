//! [`IpNft`]: the real [`HostNetwork`], driving the `ip` (iproute2) and
//! `nft` (nftables) commands.
//!
//! Why commands and not netlink crates: the node needs a handful of
//! operations, each run once per instance start or stop, so a fork/exec per
//! step costs nothing measurable; the commands are the reference
//! implementations of the kernel interfaces (nft's JSON and its atomic
//! `-f` transactions especially have no mature Rust equivalent — the
//! `nftables` crate itself shells out to `nft`), their errors are the
//! messages operators already know, and every step can be replayed by hand
//! from the error text. `rtnetlink` would pull an async netlink stack in
//! for the same result. The trait keeps a netlink backend possible later.

use std::fs;
use std::io;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::host::{BridgeSpec, HostNetwork, NatSpec, PortMapping, Proto, VethSpec};

/// Where `ip netns add` bind-mounts named namespaces.
const NETNS_DIR: &str = "/run/netns";
/// The name of the published-port map in the node's table.
const PORTS_MAP: &str = "ports";

/// The real host network: `ip` and `nft` on this machine's kernel.
#[derive(Clone, Debug, Default)]
pub struct IpNft {
    _private: (),
}

impl IpNft {
    /// The real host network.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Runs a command with optional stdin, returning its stdout.
fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let command = format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| Error::Spawn {
            command: command.clone(),
            error: source,
        })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|source| Error::Spawn {
                command: command.clone(),
                error: source,
            })?;
    }
    let output = child.wait_with_output().map_err(|source| Error::Spawn {
        command: command.clone(),
        error: source,
    })?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    Err(Error::Command {
        command,
        status: output.status.to_string(),
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    })
}

/// Runs a teardown command, treating "already gone" as success. `ip` says
/// "Cannot find device" / "No such file or directory", `nft` says "No such
/// file or directory" (nft 1.0.6 has no `destroy` command yet).
fn run_absent_ok(program: &str, args: &[&str], stdin: Option<&str>) -> Result<()> {
    match run(program, args, stdin) {
        Ok(_) => Ok(()),
        Err(Error::Command { stderr, .. })
            if stderr.contains("Cannot find device")
                || stderr.contains("No such file or directory") =>
        {
            Ok(())
        }
        Err(error) => Err(error),
    }
}

fn write_sysctl(path: &Path, value: &str) -> Result<()> {
    // Skip the write when it already holds the value: /proc/sys may be
    // read-only in a container that was nonetheless set up right.
    if fs::read_to_string(path).is_ok_and(|current| current.trim() == value) {
        return Ok(());
    }
    fs::write(path, value).map_err(|source| Error::Sysctl {
        path: path.to_owned(),
        value: value.into(),
        error: source,
    })
}

impl HostNetwork for IpNft {
    fn ensure_bridge(&self, bridge: &BridgeSpec) -> Result<()> {
        let name = bridge.name.as_str();
        if let Err(error) = run("ip", &["link", "add", name, "type", "bridge"], None) {
            // "File exists" is the bridge from an earlier agent run.
            let exists =
                matches!(&error, Error::Command { stderr, .. } if stderr.contains("File exists"));
            if !exists {
                return Err(error);
            }
        }
        let gateway = format!("{}/{}", bridge.subnet.gateway(), bridge.subnet.prefix());
        run("ip", &["addr", "replace", &gateway, "dev", name], None)?;
        run("ip", &["link", "set", name, "up"], None)?;
        // Outbound NAT and published ports both route between the bridge
        // and other interfaces.
        write_sysctl(Path::new("/proc/sys/net/ipv4/ip_forward"), "1")?;
        // DNAT of 127.0.0.1:PORT to an instance sends a packet with a
        // loopback source out of the bridge; the kernel drops such packets
        // as martians unless route_localnet is on for that interface (the
        // postrouting masquerade then rewrites the source).
        write_sysctl(
            &Path::new("/proc/sys/net/ipv4/conf")
                .join(name)
                .join("route_localnet"),
            "1",
        )
    }

    fn delete_bridge(&self, name: &str) -> Result<()> {
        run_absent_ok("ip", &["link", "del", name], None)
    }

    fn create_netns(&self, name: &str) -> Result<()> {
        if self.netns_path(name).exists() {
            return Ok(());
        }
        run("ip", &["netns", "add", name], None).map(drop)
    }

    fn delete_netns(&self, name: &str) -> Result<()> {
        run_absent_ok("ip", &["netns", "del", name], None)
    }

    fn netns_path(&self, name: &str) -> PathBuf {
        Path::new(NETNS_DIR).join(name)
    }

    fn list_netns(&self) -> Result<Vec<String>> {
        let entries = match fs::read_dir(NETNS_DIR) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(Error::Spawn {
                    command: format!("read_dir {NETNS_DIR}"),
                    error: source,
                });
            }
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| Error::Spawn {
                command: format!("read_dir {NETNS_DIR}"),
                error: source,
            })?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    fn create_veth(&self, veth: &VethSpec) -> Result<()> {
        let host = veth.host_name.as_str();
        let netns = veth.netns.as_str();
        let peer = veth.peer_name.as_str();
        // A host end left by an interrupted attach would make `add` fail
        // with "File exists"; the pair is recreated from scratch instead.
        self.delete_link(host)?;
        run(
            "ip",
            &[
                "link", "add", host, "type", "veth", "peer", "name", peer, "netns", netns,
            ],
            None,
        )?;
        run(
            "ip",
            &["link", "set", host, "master", &veth.bridge, "up"],
            None,
        )?;
        let address = format!("{}/{}", veth.address, veth.subnet.prefix());
        run(
            "ip",
            &["-n", netns, "addr", "replace", &address, "dev", peer],
            None,
        )?;
        run("ip", &["-n", netns, "link", "set", "lo", "up"], None)?;
        run("ip", &["-n", netns, "link", "set", peer, "up"], None)?;
        let gateway = veth.subnet.gateway().to_string();
        run(
            "ip",
            &["-n", netns, "route", "replace", "default", "via", &gateway],
            None,
        )
        .map(drop)
    }

    fn delete_link(&self, name: &str) -> Result<()> {
        run_absent_ok("ip", &["link", "del", name], None)
    }

    fn list_links(&self) -> Result<Vec<String>> {
        let command = "ip -j link show";
        let out = run("ip", &["-j", "link", "show"], None)?;
        let links: Vec<Value> = serde_json::from_str(&out).map_err(|error| Error::Output {
            command: command.into(),
            reason: error.to_string(),
        })?;
        Ok(links
            .iter()
            .filter_map(|link| link.get("ifname")?.as_str().map(str::to_owned))
            .collect())
    }

    fn ensure_nat(&self, nat: &NatSpec) -> Result<()> {
        run("nft", &["-f", "-"], Some(&nat_script(nat))).map(drop)
    }

    fn delete_nat(&self, table: &str) -> Result<()> {
        run_absent_ok("nft", &["delete", "table", "ip", table], None)
    }

    fn add_port(&self, table: &str, port: &PortMapping) -> Result<()> {
        let script = format!(
            "add element ip {table} {PORTS_MAP} {{ {} . {} : {} . {} }}\n",
            port.proto, port.host_port, port.address, port.container_port
        );
        run("nft", &["-f", "-"], Some(&script)).map(drop)
    }

    fn delete_port(&self, table: &str, port: &PortMapping) -> Result<()> {
        let script = format!(
            "delete element ip {table} {PORTS_MAP} {{ {} . {} }}\n",
            port.proto, port.host_port
        );
        run_absent_ok("nft", &["-f", "-"], Some(&script))
    }

    fn list_ports(&self, table: &str) -> Result<Vec<PortMapping>> {
        let args = ["-j", "list", "map", "ip", table, PORTS_MAP];
        let out = match run("nft", &args, None) {
            Ok(out) => out,
            Err(Error::Command { stderr, .. }) if stderr.contains("No such file or directory") => {
                return Ok(Vec::new());
            }
            Err(error) => return Err(error),
        };
        parse_ports(&out).map_err(|reason| Error::Output {
            command: format!("nft {}", args.join(" ")),
            reason,
        })
    }
}

/// The node table as one `nft -f` transaction. `add` of the table, map and
/// chains is a no-op when they exist, so the map's elements (published
/// ports) survive; each chain is flushed and refilled so the rules are
/// exactly these, however often the agent restarts. nft 1.0.6 accepts the
/// `dstnat` priority keyword only on the prerouting hook, so the output
/// chain spells its value, -100.
fn nat_script(nat: &NatSpec) -> String {
    let NatSpec {
        table,
        bridge,
        subnet,
    } = nat;
    format!(
        "add table ip {table}
add map ip {table} {PORTS_MAP} {{ type inet_proto . inet_service : ipv4_addr . inet_service; }}
add chain ip {table} prerouting {{ type nat hook prerouting priority dstnat; policy accept; }}
add chain ip {table} output {{ type nat hook output priority -100; policy accept; }}
add chain ip {table} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}
flush chain ip {table} prerouting
flush chain ip {table} output
flush chain ip {table} postrouting
add rule ip {table} prerouting fib daddr type local meta l4proto {{ tcp, udp }} dnat ip to meta l4proto . th dport map @{PORTS_MAP} comment \"published ports\"
add rule ip {table} output fib daddr type local meta l4proto {{ tcp, udp }} dnat ip to meta l4proto . th dport map @{PORTS_MAP} comment \"published ports, locally originated\"
add rule ip {table} postrouting ip saddr {subnet} oifname != \"{bridge}\" masquerade comment \"outbound NAT\"
add rule ip {table} postrouting ip saddr 127.0.0.0/8 oifname \"{bridge}\" masquerade comment \"published ports on loopback\"
add rule ip {table} postrouting ct status dnat ip saddr {subnet} oifname \"{bridge}\" masquerade comment \"hairpin to a published port\"
"
    )
}

/// Parses `nft -j list map` output: elements are
/// `[{"concat": [proto, port]}, {"concat": [address, port]}]`.
fn parse_ports(json: &str) -> std::result::Result<Vec<PortMapping>, String> {
    let value: Value = serde_json::from_str(json).map_err(|error| error.to_string())?;
    let mut ports = Vec::new();
    let objects = value
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or("no \"nftables\" array")?;
    for object in objects {
        let Some(elements) = object.get("map").and_then(|map| map.get("elem")) else {
            continue;
        };
        for element in elements.as_array().ok_or("\"elem\" is not an array")? {
            ports.push(
                parse_element(element).ok_or_else(|| format!("unexpected element {element}"))?,
            );
        }
    }
    ports.sort();
    Ok(ports)
}

fn parse_element(element: &Value) -> Option<PortMapping> {
    let key = element.get(0)?.get("concat")?;
    let value = element.get(1)?.get("concat")?;
    let proto = match key.get(0)?.as_str()? {
        "tcp" => Proto::Tcp,
        "udp" => Proto::Udp,
        _ => return None,
    };
    Some(PortMapping {
        proto,
        host_port: u16::try_from(key.get(1)?.as_u64()?).ok()?,
        address: value.get(0)?.as_str()?.parse::<Ipv4Addr>().ok()?,
        container_port: u16::try_from(value.get(1)?.as_u64()?).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nft_map_json() {
        // Captured from nft 1.0.6.
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"map": {"family": "ip", "name": "ports", "table": "ccaprobe", "type": ["inet_proto", "inet_service"], "handle": 1, "map": "ipv4_addr . inet_service", "elem": [[{"concat": ["udp", 53]}, {"concat": ["10.1.1.3", 5353]}], [{"concat": ["tcp", 8080]}, {"concat": ["10.1.1.2", 80]}]]}}]}"#;
        assert_eq!(
            parse_ports(json).unwrap(),
            vec![
                PortMapping {
                    proto: Proto::Tcp,
                    host_port: 8080,
                    address: Ipv4Addr::new(10, 1, 1, 2),
                    container_port: 80,
                },
                PortMapping {
                    proto: Proto::Udp,
                    host_port: 53,
                    address: Ipv4Addr::new(10, 1, 1, 3),
                    container_port: 5353,
                },
            ]
        );
        let empty = r#"{"nftables": [{"metainfo": {}}, {"map": {"name": "ports"}}]}"#;
        assert_eq!(parse_ports(empty).unwrap(), vec![]);
        assert!(parse_ports("{}").unwrap_err().contains("nftables"));
    }

    #[test]
    fn nat_script_names_table_subnet_and_bridge() {
        let script = nat_script(&NatSpec {
            table: "cca".into(),
            bridge: "cca0".into(),
            subnet: "10.88.0.0/24".parse().unwrap(),
        });
        assert!(script.contains("ip saddr 10.88.0.0/24 oifname != \"cca0\" masquerade"));
        assert!(script.contains("flush chain ip cca postrouting"));
        assert!(script.contains("dnat ip to meta l4proto . th dport map @ports"));
    }

    #[test]
    fn missing_binary_is_a_spawn_error() {
        let error = run("cca-net-no-such-binary", &["x"], None).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("could not run `cca-net-no-such-binary x`"),
            "{error}"
        );
    }
}
