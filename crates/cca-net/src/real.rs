//! [`KernelNetwork`]: the real [`HostNetwork`] and [`OverlayHost`]. Links,
//! addresses, routes, neighbour and forwarding entries go over netlink
//! (`rtnetlink`, see [`crate::netlink`]); named namespaces are bind mounts
//! made with `unshare(2)` ([`crate::netns`]); the nftables table is still
//! driven by the `nft` command (its JSON and its atomic `-f` transactions
//! are the reference interface; a data plane of its own replaces these
//! functions).
//!
//! A `KernelNetwork` works in one network namespace: the calling thread's
//! ([`KernelNetwork::new`], the agent's case) or a named one
//! ([`KernelNetwork::in_netns`]: every call runs on a thread that joined
//! it, so tests can run a whole node — bridge, instances, nftables table,
//! overlay — inside a namespace of their own). Instance namespaces are
//! named and global either way; work inside one runs on a thread that
//! joined it.

use std::fs;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rtnetlink::packet_route::link::{InfoData, InfoVeth};
use rtnetlink::packet_route::route::RouteScope;
use rtnetlink::{LinkBridge, LinkBridgePort, LinkUnspec, LinkVeth, RouteMessageBuilder};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::host::{BridgeSpec, HostNetwork, NatSpec, PortMapping, Proto, RangeRoute, VethSpec};
use crate::netlink::{Netlink, link_name, session};
use crate::netns;

/// The conntrack mark bit of flows DNATed to a published port: only they
/// are masqueraded back onto the bridge (a VIP flow between two
/// instances of the node keeps its client's address; the data plane does
/// its own hairpin).
const PUBLISHED_MARK: &str = "0x00c0ca00";
/// The name of the published-port map in the node's table.
const PORTS_MAP: &str = "ports";

/// The real host network, in one network namespace.
#[derive(Clone, Debug, Default)]
pub struct KernelNetwork {
    /// `None`: the calling thread's namespace.
    netns: Option<PathBuf>,
}

impl KernelNetwork {
    /// The network of the calling thread's namespace (the host's, for the
    /// agent).
    pub fn new() -> Self {
        Self::default()
    }

    /// The network inside the namespace at `path` (`/run/netns/NAME`, or
    /// any `/proc/PID/ns/net`): every call runs on a thread that joined it.
    pub fn in_netns(path: impl Into<PathBuf>) -> Self {
        Self {
            netns: Some(path.into()),
        }
    }

    /// The namespace this network works in (`None`: the caller's).
    pub fn netns(&self) -> Option<&Path> {
        self.netns.as_deref()
    }

    /// " in network namespace PATH", or nothing for the caller's own.
    pub(crate) fn place(&self) -> String {
        match &self.netns {
            Some(path) => format!(" in network namespace {}", path.display()),
            None => String::new(),
        }
    }

    /// Runs `work` in this network's namespace. In the caller's own, it
    /// runs right here unless the caller is inside an async runtime (a
    /// netlink session starts a runtime of its own, which cannot nest): a
    /// plain thread, which shares the caller's namespace, runs it then.
    pub(crate) fn enter<T: Send>(&self, work: impl FnOnce() -> Result<T> + Send) -> Result<T> {
        match &self.netns {
            Some(path) => netns::enter(path, work)?,
            None if tokio::runtime::Handle::try_current().is_ok() => {
                std::thread::scope(|scope| match scope.spawn(work).join() {
                    Ok(result) => result,
                    Err(panic) => std::panic::resume_unwind(panic),
                })
            }
            None => work(),
        }
    }

    /// Runs `work` with a netlink connection in this network's namespace.
    pub(crate) fn netlink<T: Send>(
        &self,
        work: impl AsyncFnOnce(&Netlink) -> Result<T> + Send,
    ) -> Result<T> {
        let place = self.place();
        self.enter(move || session(&place, work))
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

/// Runs a teardown command, treating "already gone" as success: `nft`
/// says "No such file or directory" (nft 1.0.6 has no `destroy` command
/// yet).
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

impl HostNetwork for KernelNetwork {
    fn ensure_bridge(&self, bridge: &BridgeSpec) -> Result<()> {
        let name = bridge.name.as_str();
        let (gateway, prefix) = (bridge.subnet.gateway(), bridge.subnet.prefix());
        self.enter(|| {
            session(&self.place(), async |nl| {
                // An existing one is the bridge of an earlier agent run.
                if nl.link(name).await?.is_none() {
                    nl.add_link(&format!("bridge {name}"), LinkBridge::new(name).build())
                        .await?;
                }
                let index = nl
                    .index(name, "it was just created: is something else deleting it?")
                    .await?;
                nl.replace_address(index, name, gateway, prefix).await?;
                let mut up = LinkUnspec::new_with_index(index).up();
                if let Some(mtu) = bridge.mtu {
                    up = up.mtu(mtu);
                }
                nl.set_link(&format!("bring bridge {name} up"), up.build())
                    .await
            })?;
            // Outbound NAT and published ports both route between the
            // bridge and other interfaces.
            write_sysctl(Path::new("/proc/sys/net/ipv4/ip_forward"), "1")?;
            // DNAT of 127.0.0.1:PORT to an instance sends a packet with a
            // loopback source out of the bridge; the kernel drops such
            // packets as martians unless route_localnet is on for that
            // interface (the postrouting masquerade then rewrites the
            // source).
            write_sysctl(
                &Path::new("/proc/sys/net/ipv4/conf")
                    .join(name)
                    .join("route_localnet"),
                "1",
            )
        })
    }

    fn delete_bridge(&self, name: &str) -> Result<()> {
        self.netlink(async |nl| nl.delete_link(name).await)
    }

    fn create_netns(&self, name: &str) -> Result<()> {
        netns::create(name).map(drop)
    }

    fn delete_netns(&self, name: &str) -> Result<()> {
        netns::delete(name)
    }

    fn netns_path(&self, name: &str) -> PathBuf {
        netns::path(name)
    }

    fn list_netns(&self) -> Result<Vec<String>> {
        netns::list()
    }

    fn create_veth(&self, veth: &VethSpec) -> Result<()> {
        let host = veth.host_name.as_str();
        let peer = veth.peer_name.as_str();
        let netns_path = self.netns_path(&veth.netns);
        // A host end left by an interrupted attach would make the add fail
        // with "File exists"; the pair is recreated from scratch instead.
        self.delete_link(host)?;
        let target = fs::File::open(&netns_path).map_err(|error| Error::Netns {
            action: "open",
            path: netns_path.clone(),
            error,
        })?;
        self.netlink(async |nl| {
            let bridge = nl
                .index(
                    &veth.bridge,
                    "the node bridge is missing: open the node network first",
                )
                .await?;
            // The peer is born in the instance's namespace, so its name
            // ("eth0") never meets the host's links.
            let mut peer_end = LinkUnspec::new_with_name(peer).setns_by_fd(target.as_raw_fd());
            let mut pair = LinkVeth::new(host, peer);
            if let Some(mtu) = veth.mtu {
                peer_end = peer_end.mtu(mtu);
                pair = pair.mtu(mtu);
            }
            let pair = pair.set_info_data(InfoData::Veth(InfoVeth::Peer(peer_end.build())));
            let what = format!("veth pair {host} (peer {peer} in namespace {})", veth.netns);
            if !nl.add_link(&what, pair.build()).await? {
                return Err(Error::Netlink {
                    action: format!("create {what}{}", nl.place()),
                    reason: "a link of that name exists".into(),
                });
            }
            let index = nl
                .index(host, "it was just created: is something else deleting it?")
                .await?;
            let attach = LinkUnspec::new_with_index(index).controller(bridge).up();
            nl.set_link(
                &format!("put {host} on bridge {} and bring it up", veth.bridge),
                attach.build(),
            )
            .await?;
            // An instance reaching its own service through the VIP is
            // DNATed back to itself: the frame leaves by the port it came
            // in on (the bridge passes it through the IP hooks first), which
            // a bridge allows only in hairpin mode.
            nl.set_port(
                &format!("let {host} hairpin on bridge {}", veth.bridge),
                LinkBridgePort::new(index).hairpin(true).build(),
            )
            .await
        })?;
        let inside = format!(" in network namespace {}", netns_path.display());
        let (address, prefix, gateway) =
            (veth.address, veth.subnet.prefix(), veth.subnet.gateway());
        netns::enter(&netns_path, || {
            session(&inside, async |nl| {
                let lo = nl.index("lo", "every network namespace has one").await?;
                nl.set_link("bring lo up", LinkUnspec::new_with_index(lo).up().build())
                    .await?;
                let index = nl
                    .index(peer, "it was just created: is something else deleting it?")
                    .await?;
                nl.replace_address(index, peer, address, prefix).await?;
                nl.set_link(
                    &format!("bring {peer} up"),
                    LinkUnspec::new_with_index(index).up().build(),
                )
                .await?;
                let default = RouteMessageBuilder::<Ipv4Addr>::new()
                    .gateway(gateway)
                    .output_interface(index)
                    .build();
                nl.replace_route(&format!("default via {gateway} dev {peer}"), default)
                    .await
            })
        })?
    }

    fn delete_link(&self, name: &str) -> Result<()> {
        self.netlink(async |nl| nl.delete_link(name).await)
    }

    fn ensure_range_route(&self, route: &RangeRoute) -> Result<()> {
        self.netlink(async |nl| {
            let index = nl
                .index(
                    &route.bridge,
                    "the node bridge is missing: open the node network first",
                )
                .await?;
            let message = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(route.range.network(), route.range.prefix())
                .output_interface(index)
                .pref_source(route.source)
                .scope(RouteScope::Link)
                .build();
            let what = format!("{} dev {} src {}", route.range, route.bridge, route.source);
            nl.replace_route(&what, message).await
        })
    }

    fn list_links(&self) -> Result<Vec<String>> {
        self.netlink(async |nl| {
            Ok(nl
                .links()
                .await?
                .iter()
                .filter_map(|link| link_name(link).map(str::to_owned))
                .collect())
        })
    }

    fn ensure_nat(&self, nat: &NatSpec) -> Result<()> {
        self.enter(|| run("nft", &["-f", "-"], Some(&nat_script(nat))).map(drop))
    }

    fn delete_nat(&self, table: &str) -> Result<()> {
        self.enter(|| run_absent_ok("nft", &["delete", "table", "ip", table], None))
    }

    fn add_port(&self, table: &str, port: &PortMapping) -> Result<()> {
        let script = format!(
            "add element ip {table} {PORTS_MAP} {{ {} . {} : {} . {} }}\n",
            port.proto, port.host_port, port.address, port.container_port
        );
        self.enter(|| run("nft", &["-f", "-"], Some(&script)).map(drop))
    }

    fn delete_port(&self, table: &str, port: &PortMapping) -> Result<()> {
        let script = format!(
            "delete element ip {table} {PORTS_MAP} {{ {} . {} }}\n",
            port.proto, port.host_port
        );
        self.enter(|| run_absent_ok("nft", &["-f", "-"], Some(&script)))
    }

    fn list_ports(&self, table: &str) -> Result<Vec<PortMapping>> {
        let args = ["-j", "list", "map", "ip", table, PORTS_MAP];
        let out = match self.enter(|| run("nft", &args, None)) {
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
        overlay,
        dns_port,
    } = nat;
    let dns = match dns_port {
        Some(port) => {
            let gateway = subnet.gateway();
            format!(
                "add rule ip {table} prerouting ip daddr {gateway} meta l4proto {{ tcp, udp }} th dport 53 dnat ip to {gateway}:{port} comment \"cluster DNS\"
add rule ip {table} output ip daddr {gateway} meta l4proto {{ tcp, udp }} th dport 53 dnat ip to {gateway}:{port} comment \"cluster DNS, locally originated\"
"
            )
        }
        None => String::new(),
    };
    let local = match overlay {
        Some(overlay) => format!("{{ \"{bridge}\", \"{overlay}\" }}"),
        None => format!("\"{bridge}\""),
    };
    format!(
        "add table ip {table}
add map ip {table} {PORTS_MAP} {{ type inet_proto . inet_service : ipv4_addr . inet_service; }}
add chain ip {table} prerouting {{ type nat hook prerouting priority dstnat; policy accept; }}
add chain ip {table} output {{ type nat hook output priority -100; policy accept; }}
add chain ip {table} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}
flush chain ip {table} prerouting
flush chain ip {table} output
flush chain ip {table} postrouting
add rule ip {table} prerouting fib daddr type local meta l4proto {{ tcp, udp }} meta l4proto . th dport @{PORTS_MAP} ct mark set ct mark or {PUBLISHED_MARK} dnat ip to meta l4proto . th dport map @{PORTS_MAP} comment \"published ports\"
add rule ip {table} output fib daddr type local meta l4proto {{ tcp, udp }} meta l4proto . th dport @{PORTS_MAP} ct mark set ct mark or {PUBLISHED_MARK} dnat ip to meta l4proto . th dport map @{PORTS_MAP} comment \"published ports, locally originated\"
add rule ip {table} postrouting ip saddr {subnet} oifname != {local} masquerade comment \"outbound NAT\"
add rule ip {table} postrouting ip saddr 127.0.0.0/8 oifname \"{bridge}\" masquerade comment \"published ports on loopback\"
add rule ip {table} postrouting ct status dnat ct mark and {PUBLISHED_MARK} == {PUBLISHED_MARK} ip saddr {subnet} oifname \"{bridge}\" masquerade comment \"hairpin to a published port\"
{dns}"
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
            overlay: None,
            dns_port: None,
        });
        assert!(script.contains("ip saddr 10.88.0.0/24 oifname != \"cca0\" masquerade"));
        let script = nat_script(&NatSpec {
            table: "cca".into(),
            bridge: "cca0".into(),
            subnet: "10.88.0.0/24".parse().unwrap(),
            overlay: Some("cca-vxlan".into()),
            dns_port: Some(15353),
        });
        assert!(
            script.contains("ip daddr 10.88.0.1 meta l4proto { tcp, udp } th dport 53 dnat ip to 10.88.0.1:15353"),
            "{script}"
        );
        assert!(
            script.contains(
                "ip saddr 10.88.0.0/24 oifname != { \"cca0\", \"cca-vxlan\" } masquerade"
            ),
            "{script}"
        );
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
