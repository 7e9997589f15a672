//! What the agent asks a runtime to run: [`InstanceSpec`], its validation,
//! and the environment every instance sees (`CCA_INSTANCE`, `CCA_SERVICE`,
//! `CCA_NODE`, `PORT`, `CCA_PORT_{NAME}`, then the spec's own variables).
//! An instance with a [`NetworkAttachment`] runs in its own network
//! namespace: its ports are its service's declared ports and its
//! `CCA_ADDRESS` is its own address, and each [`PortBinding`] carries its
//! [`Protocol`] so only that protocol is published. [`Mount`]s bind host paths into a
//! container (volumes read-write, secret and connection files read-only);
//! only runtimes with their own filesystem view (`oci`) accept them.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Log files rotate at this size unless the spec says otherwise.
pub const DEFAULT_LOG_LIMIT_BYTES: u64 = 10 * 1024 * 1024;

/// One instance to run, as the agent describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceSpec {
    /// Unique on the node; letters, digits, `-`, `_` and `.` (it names a
    /// directory and a cgroup).
    pub id: String,
    pub service: String,
    /// The node's name, handed to the workload as `CCA_NODE`.
    pub node: String,
    /// Run through `sh -c`. May be empty when `image` is set: the image's
    /// entrypoint and cmd run instead.
    pub command: String,
    /// The container image (`oci` runtime), as a reference the node's image
    /// store knows; `None` for host processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Extra variables; they override the ones the runtime sets.
    pub env: BTreeMap<String, String>,
    /// Where the command runs; `None`: a private directory the runtime
    /// creates (for processes `DIR/instances/{id}/work`).
    pub working_dir: Option<PathBuf>,
    /// Host ports the agent picked, in declaration order: the first is
    /// `PORT`, each is `CCA_PORT_{NAME}`.
    pub ports: Vec<PortBinding>,
    /// CPU limit in millicores (1000 = one core); `None`: unlimited.
    pub cpu_millis: Option<u64>,
    /// Memory limit in bytes; `None`: unlimited.
    pub memory_bytes: Option<u64>,
    /// A log file rotates when it grows past this many bytes.
    pub log_limit_bytes: u64,
    /// The instance's own network namespace and address (containers on a
    /// node with a pod subnet); `None`: the host's network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkAttachment>,
    /// Host paths bound into the instance's filesystem, in order (a later
    /// target may sit inside an earlier one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// The service asked for the node's network (`network = "host"`): no
    /// namespace of its own even on a node that gives containers one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_network: bool,
    /// The resolver the instance's `/etc/resolv.conf` names: the node's
    /// cluster DNS, which answers `{svc}.cca.local` and forwards the
    /// rest. `None`: the host's resolv.conf, unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<DnsConfig>,
}

/// The `/etc/resolv.conf` an instance sees.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsConfig {
    /// Nameservers, on port 53 (the resolv.conf format has no port); 1 to
    /// 3 (glibc reads no more).
    pub nameservers: Vec<Ipv4Addr>,
    /// Search domains, so `postgres` resolves as `postgres.cca.local`.
    pub search: Vec<String>,
    /// `options ndots:N`, at most 15 (glibc's cap): a name with fewer dots
    /// is tried with the search domains first. 1 suits `{svc}.cca.local`:
    /// a bare service name gets the search, any dotted name goes out as
    /// written without first costing a failed query per search domain.
    pub ndots: u8,
}

/// glibc's `MAXNS`: further `nameserver` lines are ignored silently.
const MAX_NAMESERVERS: usize = 3;
/// glibc's `RES_MAXNDOTS`: a higher `ndots` is cut to it silently.
const MAX_NDOTS: u8 = 15;

impl DnsConfig {
    /// Why this cannot be written as a `resolv.conf` a resolver reads as
    /// meant, if it cannot: no nameserver would make glibc ask
    /// 127.0.0.1, and what glibc would drop silently is refused instead.
    pub fn problem(&self) -> Option<String> {
        if self.nameservers.is_empty() {
            return Some("the DNS config names no nameserver".to_owned());
        }
        if self.nameservers.len() > MAX_NAMESERVERS {
            return Some(format!(
                "the DNS config names {} nameservers; resolvers read at most {MAX_NAMESERVERS}",
                self.nameservers.len()
            ));
        }
        if self.ndots > MAX_NDOTS {
            return Some(format!(
                "ndots {} is above {MAX_NDOTS}, the most resolvers honour",
                self.ndots
            ));
        }
        let bad_domain = |domain: &&String| {
            domain.is_empty()
                || domain.len() > 253
                || !domain
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        };
        if let Some(domain) = self.search.iter().find(bad_domain) {
            return Some(format!(
                "search domain {domain:?} must be 1-253 letters, digits, '-', '_' or '.'"
            ));
        }
        None
    }
}

/// A host file or directory bound at `target` inside the instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// Must exist when the instance is created: a runtime never creates it
    /// (a typo would otherwise become an empty directory silently mounted).
    pub source: PathBuf,
    /// Absolute, without `..`, inside the instance's root.
    pub target: String,
    /// Mounted `ro`: the workload cannot change it (secrets, connection
    /// files).
    pub read_only: bool,
    /// Handed to the user the workload runs as before it is created: the
    /// source and everything in it (symlinks not followed) are chowned to
    /// the uid:gid the instance runs as (an image's `User`), so files kept
    /// private on the host — a root-only `0700` dir of `0400` secrets —
    /// are readable inside by a workload that is not root. Only for
    /// sources made for this one instance; the process runtime takes no
    /// mounts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub owned_by_workload: bool,
}

impl Mount {
    /// Why `target` cannot be a mount point, if it cannot: a relative path
    /// would depend on the runtime's working directory and `..` could climb
    /// out of the container's root onto the host.
    pub fn target_problem(&self) -> Option<String> {
        if !self.target.starts_with('/') {
            return Some(format!(
                "mount target {:?} (from {}) is not an absolute path",
                self.target,
                self.source.display()
            ));
        }
        if self.target.split('/').any(|part| part == "..") {
            return Some(format!(
                "mount target {:?} (from {}) contains '..'",
                self.target,
                self.source.display()
            ));
        }
        None
    }
}

/// A named port and the host port the agent picked for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortBinding {
    pub name: String,
    pub host_port: u16,
    /// The port the service declares (what the workload listens on inside
    /// its own network namespace; the host port is published to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_port: Option<u16>,
    /// The protocol the service declares for the port: only it is
    /// published. Records written before the field existed read as TCP.
    #[serde(default)]
    pub protocol: Protocol,
}

/// The transport protocol of a port (TCP unless the service says UDP).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        })
    }
}

impl PortBinding {
    /// The port the workload listens on: the declared one inside its own
    /// namespace, the host port on the host's network.
    pub fn listen_port(&self, own_network: bool) -> u16 {
        match self.container_port {
            Some(port) if own_network => port,
            _ => self.host_port,
        }
    }
}

/// Where an instance with its own network runs: the namespace to join and
/// the address it has there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkAttachment {
    /// The network namespace (`/run/netns/…`) the OCI spec joins.
    pub netns_path: PathBuf,
    pub address: Ipv4Addr,
}

impl InstanceSpec {
    /// A spec with no ports, limits or extra environment.
    pub fn new(
        id: impl Into<String>,
        service: impl Into<String>,
        command: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            service: service.into(),
            node: String::new(),
            command: command.into(),
            image: None,
            env: BTreeMap::new(),
            working_dir: None,
            ports: Vec::new(),
            cpu_millis: None,
            memory_bytes: None,
            log_limit_bytes: DEFAULT_LOG_LIMIT_BYTES,
            network: None,
            mounts: Vec::new(),
            host_network: false,
            dns: None,
        }
    }

    /// Checks what every runtime relies on: a usable id, a command, sane
    /// limits, distinct port names and mount targets inside the instance.
    pub fn validate(&self) -> Result<()> {
        let invalid = |reason: String| Error::InvalidSpec {
            id: self.id.clone(),
            reason,
        };
        if !is_valid_id(&self.id) {
            return Err(invalid(format!(
                "id {:?} must be 1-128 letters, digits, '-', '_' or '.', not starting with '.'",
                self.id
            )));
        }
        if self.command.trim().is_empty() && self.image.is_none() {
            return Err(invalid("the command is empty".into()));
        }
        if self.memory_bytes == Some(0) || self.cpu_millis == Some(0) {
            return Err(invalid(
                "a limit of 0 would never let the command run".into(),
            ));
        }
        if self.log_limit_bytes < 1024 {
            return Err(invalid("the log size limit must be at least 1 KiB".into()));
        }
        let mut names = std::collections::BTreeSet::new();
        for port in &self.ports {
            if !names.insert(env_name_for_port(&port.name)) {
                return Err(invalid(format!("port name {:?} is used twice", port.name)));
            }
        }
        if let Some(problem) = self.mounts.iter().find_map(Mount::target_problem) {
            return Err(invalid(problem));
        }
        if let Some(problem) = self.dns.as_ref().and_then(DnsConfig::problem) {
            return Err(invalid(problem));
        }
        Ok(())
    }

    /// The variables the runtime sets for this instance, before the spec's
    /// own `env` (which overrides them).
    pub fn runtime_env(&self) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        env.insert("CCA_INSTANCE".to_owned(), self.id.clone());
        env.insert("CCA_SERVICE".to_owned(), self.service.clone());
        env.insert("CCA_NODE".to_owned(), self.node.clone());
        let own_network = self.network.is_some();
        if let Some(first) = self.ports.first() {
            env.insert(
                "PORT".to_owned(),
                first.listen_port(own_network).to_string(),
            );
        }
        for port in &self.ports {
            env.insert(
                env_name_for_port(&port.name),
                port.listen_port(own_network).to_string(),
            );
        }
        env
    }

    /// The complete environment: runtime variables, then the spec's. With
    /// its own network the instance's `CCA_ADDRESS` is its own address,
    /// whatever the spec says: the node's address (which the agent puts in
    /// the spec) cannot be bound inside the namespace.
    pub fn full_env(&self) -> BTreeMap<String, String> {
        let mut env = self.runtime_env();
        env.extend(self.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        if let Some(network) = &self.network {
            env.insert("CCA_ADDRESS".to_owned(), network.address.to_string());
        }
        env
    }
}

/// `CCA_PORT_{NAME}`: the port name upper-cased, other characters as `_`.
pub fn env_name_for_port(name: &str) -> String {
    format!("CCA_PORT_{}", env_name_part(name))
}

/// A name as a part of an environment variable's name: ASCII letters and
/// digits upper-cased, every other character `_` (ports, volumes, secret
/// and connection files are named this way).
pub fn env_name_part(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

fn is_valid_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_invalid(spec: &InstanceSpec, expected: &str) {
        let error = spec
            .validate()
            .expect_err("spec should be rejected")
            .to_string();
        assert!(error.contains(expected), "{error:?} lacks {expected:?}");
    }

    #[test]
    fn ids_that_would_escape_the_directory_are_rejected() {
        for id in ["", "..", "a/b", ".hidden", "a b"] {
            check_invalid(&InstanceSpec::new(id, "svc", "true"), "must be");
        }
        assert!(
            InstanceSpec::new("web-1.a_b", "svc", "true")
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn empty_commands_zero_limits_and_duplicate_ports_are_rejected() {
        check_invalid(&InstanceSpec::new("a", "s", "  "), "command is empty");
        let mut from_image = InstanceSpec::new("a", "s", "");
        from_image.image = Some("busybox".into());
        assert!(from_image.validate().is_ok(), "an image's own command runs");
        let mut spec = InstanceSpec::new("a", "s", "true");
        spec.memory_bytes = Some(0);
        check_invalid(&spec, "limit of 0");
        let mut spec = InstanceSpec::new("a", "s", "true");
        spec.ports = vec![
            PortBinding {
                name: "http-alt".into(),
                host_port: 1,
                container_port: None,
                protocol: Protocol::Tcp,
            },
            PortBinding {
                name: "HTTP_ALT".into(),
                host_port: 2,
                container_port: None,
                protocol: Protocol::Tcp,
            },
        ];
        check_invalid(&spec, "used twice");
    }

    #[test]
    fn environment_has_identity_ports_and_spec_overrides() {
        let mut spec = InstanceSpec::new("web-1", "web", "true");
        spec.node = "n1".into();
        spec.ports = vec![
            PortBinding {
                name: "http".into(),
                host_port: 31000,
                container_port: Some(8080),
                protocol: Protocol::Tcp,
            },
            PortBinding {
                name: "admin-ui".into(),
                host_port: 31001,
                container_port: None,
                protocol: Protocol::Tcp,
            },
        ];
        spec.env.insert("CCA_NODE".into(), "override".into());
        let env = spec.full_env();
        assert_eq!(env["CCA_INSTANCE"], "web-1");
        assert_eq!(env["CCA_SERVICE"], "web");
        assert_eq!(env["CCA_NODE"], "override");
        assert_eq!(env["PORT"], "31000");
        assert_eq!(env["CCA_PORT_HTTP"], "31000");
        assert_eq!(env["CCA_PORT_ADMIN_UI"], "31001");
        assert!(!env.contains_key("CCA_ADDRESS"));
    }

    #[test]
    fn an_own_network_gives_declared_ports_and_the_own_address() {
        let mut spec = InstanceSpec::new("web-1", "web", "true");
        spec.ports = vec![
            PortBinding {
                name: "http".into(),
                host_port: 31000,
                container_port: Some(8080),
                protocol: Protocol::Tcp,
            },
            PortBinding {
                name: "admin".into(),
                host_port: 31001,
                container_port: None,
                protocol: Protocol::Tcp,
            },
        ];
        spec.env.insert("CCA_ADDRESS".into(), "192.0.2.1".into());
        spec.network = Some(NetworkAttachment {
            netns_path: "/run/netns/cca-web-1".into(),
            address: Ipv4Addr::new(10, 88, 0, 2),
        });
        let env = spec.full_env();
        assert_eq!(env["PORT"], "8080");
        assert_eq!(env["CCA_PORT_HTTP"], "8080");
        assert_eq!(
            env["CCA_PORT_ADMIN"], "31001",
            "no declared port: the host's"
        );
        assert_eq!(env["CCA_ADDRESS"], "10.88.0.2");
        let json = serde_json::to_value(&spec).expect("serialises");
        assert_eq!(json["network"]["address"], "10.88.0.2");
        let back: InstanceSpec = serde_json::from_value(json).expect("parses");
        assert_eq!(back, spec);
        let mut old = serde_json::to_value(InstanceSpec::new("a", "s", "true")).expect("json");
        assert!(old.get("network").is_none(), "None is not written");
        old.as_object_mut().expect("object").remove("network");
        assert!(serde_json::from_value::<InstanceSpec>(old).is_ok());
    }

    #[test]
    fn a_port_carries_its_protocol_and_old_records_read_as_tcp() {
        let port = PortBinding {
            name: "dns".into(),
            host_port: 31053,
            container_port: Some(53),
            protocol: Protocol::Udp,
        };
        let json = serde_json::to_value(&port).expect("serialises");
        assert_eq!(json["protocol"], "udp");
        let back: PortBinding = serde_json::from_value(json).expect("parses");
        assert_eq!(back, port);
        let old = serde_json::json!({"name": "http", "host_port": 31000, "container_port": 80});
        let old: PortBinding = serde_json::from_value(old).expect("an older record parses");
        assert_eq!(old.protocol, Protocol::Tcp);
        assert_eq!(Protocol::Udp.to_string(), "udp");
        let bad = serde_json::json!({"name": "x", "host_port": 1, "protocol": "sctp"});
        let error = serde_json::from_value::<PortBinding>(bad).expect_err("unknown protocol");
        assert!(error.to_string().contains("sctp"), "{error}");
    }

    #[test]
    fn dns_configs_a_resolver_would_misread_are_refused() {
        let mut spec = InstanceSpec::new("web-1", "web", "true");
        let good = DnsConfig {
            nameservers: vec![Ipv4Addr::new(10, 42, 3, 1)],
            search: vec!["cca.local".into()],
            ndots: 1,
        };
        spec.dns = Some(good.clone());
        assert!(spec.validate().is_ok());
        spec.dns = Some(DnsConfig {
            nameservers: Vec::new(),
            ..good.clone()
        });
        check_invalid(&spec, "names no nameserver");
        spec.dns = Some(DnsConfig {
            nameservers: vec![Ipv4Addr::LOCALHOST; 4],
            ..good.clone()
        });
        check_invalid(&spec, "4 nameservers; resolvers read at most 3");
        spec.dns = Some(DnsConfig {
            ndots: 16,
            ..good.clone()
        });
        check_invalid(&spec, "ndots 16 is above 15");
        spec.dns = Some(DnsConfig {
            search: vec!["cca.local other".into()],
            ..good.clone()
        });
        check_invalid(&spec, "search domain \"cca.local other\"");
        spec.dns = Some(good);
        let json = serde_json::to_value(&spec).expect("serialises");
        assert_eq!(json["dns"]["nameservers"][0], "10.42.3.1");
        let back: InstanceSpec = serde_json::from_value(json).expect("parses");
        assert_eq!(back, spec);
        let none = serde_json::to_value(InstanceSpec::new("a", "s", "true")).expect("json");
        assert!(none.get("dns").is_none(), "no dns is not written");
    }

    #[test]
    fn mount_targets_must_be_absolute_without_dot_dot() {
        let mount = |target: &str| Mount {
            source: "/var/lib/cca/volumes/db/data".into(),
            target: target.into(),
            read_only: false,
            owned_by_workload: false,
        };
        let mut spec = InstanceSpec::new("db-0", "db", "true");
        spec.mounts = vec![mount("/data"), mount("relative")];
        check_invalid(
            &spec,
            "\"relative\" (from /var/lib/cca/volumes/db/data) is not an absolute",
        );
        spec.mounts = vec![mount("/data/../../etc")];
        check_invalid(&spec, "contains '..'");
        spec.mounts = vec![mount("/data/..hidden"), mount("/run/secrets/db")];
        assert!(spec.validate().is_ok(), "'..' only as a whole component");
        let json = serde_json::to_value(&spec).expect("serialises");
        assert_eq!(json["mounts"][1]["target"], "/run/secrets/db");
        let back: InstanceSpec = serde_json::from_value(json).expect("parses");
        assert_eq!(back, spec);
        let none = serde_json::to_value(InstanceSpec::new("a", "s", "true")).expect("json");
        assert!(none.get("mounts").is_none(), "no mounts are not written");
    }
}
