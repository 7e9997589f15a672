//! The node assembled: what the machine offers (CPU, memory, architecture),
//! where the agent keeps things in its data directory, and the runtimes it
//! runs instances with — host processes always, containers (runc or crun,
//! images from registries, optionally on the node network) where the host
//! allows. `cca agent`, `cca dev` and `cca image` build them here, so they
//! agree on the layout and the checks.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cca_image::{ImageStore, RegistrySettings};
use cca_model::spec::{Cpu, Memory};
use cca_runtime::{OciConfig, OciRuntime, ProcessConfig, ProcessRuntime, Runtime};

pub use cca_net::OverlayConfig;

use crate::netmap::load_cached;
pub use crate::netplane::VipDataPlane;
use crate::netplane::{AgentNetwork, EbpfChoice, NodeNet, Plane, PlaneConfig};
use crate::network::CleanupReport;
use crate::{Containers, RuntimeSet};

/// Why the node could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("reading the host's memory from /proc/meminfo: {0} (pass --memory)")]
    Memory(String),
    #[error("{0}")]
    Registry(String),
    #[error("opening the process runtime in {dir}: {error}")]
    ProcessRuntime { dir: PathBuf, error: String },
    #[error("the cluster network: {0}")]
    Network(String),
}

/// What the node runs with, beyond its data directory.
#[derive(Clone, Debug, Default)]
pub struct NodeOptions {
    pub data_dir: PathBuf,
    /// Per-registry credentials and plain HTTP (`--registry-config`).
    pub registry_config: Option<PathBuf>,
    /// Registries reached over plain HTTP (`--insecure-registry`).
    pub insecure_registries: Vec<String>,
    /// The OCI runtime binary; found on PATH when `None`.
    pub oci_runtime: Option<PathBuf>,
    /// Join the cluster network (overlay, VIPs, DNS; containers with
    /// networks of their own on the node's subnet); needs root. `None`:
    /// instances share the host's network and resolver.
    pub cluster_network: Option<ClusterNetwork>,
    /// Put first on host processes' PATH (where `cca` itself lives, so that
    /// `run = "cca whoami"` works).
    pub path_first: Option<PathBuf>,
}

/// How the node joins the cluster network.
#[derive(Clone, Debug)]
pub struct ClusterNetwork {
    /// The node's name (its entry in the network map).
    pub node: String,
    /// Where other nodes' tunnels reach this node (its `--address`).
    pub underlay: std::net::Ipv4Addr,
    pub overlay: OverlayConfig,
    /// The node DNS server's port on the bridge's gateway address.
    pub dns_port: u16,
    /// nftables alone, or the eBPF socket programs besides (`--dataplane`).
    pub dataplane: VipDataPlane,
}

/// The node's runtimes, and its part of the cluster network when it has
/// one.
#[derive(Debug)]
pub struct NodeParts {
    pub runtime: Arc<dyn Runtime>,
    pub network: Option<AgentNetwork>,
}

/// Where pulled images live: `DATA/images`.
pub fn images_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("images")
}

/// The OCI runtime's containers: `DATA/oci`.
pub fn oci_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("oci")
}

/// Host processes' records and logs: `DATA/runtime`.
pub fn process_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("runtime")
}

/// The host's CPUs, in millicores.
pub fn host_cpu() -> Cpu {
    Cpu(1000 * std::thread::available_parallelism().map_or(1, |n| n.get() as u64))
}

/// The host's memory (`MemTotal`).
pub fn host_memory() -> Result<Memory, NodeError> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .map_err(|error| NodeError::Memory(error.to_string()))?;
    let bytes = meminfo_bytes(&meminfo, "MemTotal")
        .ok_or_else(|| NodeError::Memory("no MemTotal line".into()))?;
    Ok(Memory(bytes))
}

/// The value of field `name` (`MemTotal`, `MemAvailable`, …) in the text
/// of `/proc/meminfo`, in bytes.
pub(crate) fn meminfo_bytes(meminfo: &str, name: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let kib = line
            .strip_prefix(name)?
            .strip_prefix(':')?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<u64>()
            .ok()?;
        Some(kib * 1024)
    })
}

/// The host's architecture in Go/OCI spelling (`amd64`, `arm64`, …).
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Registry settings from `--registry-config` and `--insecure-registry`;
/// the file's warnings are logged.
pub fn registry_settings(
    config: Option<&Path>,
    insecure: &[String],
) -> Result<RegistrySettings, NodeError> {
    let mut settings = match config {
        Some(path) => {
            let loaded = RegistrySettings::load(path)
                .map_err(|error| NodeError::Registry(error.to_string()))?;
            for warning in &loaded.warnings {
                tracing::warn!("{warning}");
            }
            loaded.settings
        }
        None => RegistrySettings::default(),
    };
    settings
        .allow_plain_http(insecure)
        .map_err(|error| NodeError::Registry(format!("--insecure-registry: {error}")))?;
    Ok(settings)
}

/// The node's runtimes behind one [`Runtime`]: processes, and containers
/// when the host can run them (else image workloads fail with the reason);
/// with `cluster_network`, the node's network plane, brought up at once
/// from the cached network map when there is one. Leftovers of the node
/// network from gone containers are removed.
pub async fn node_runtime(options: &NodeOptions) -> Result<NodeParts, NodeError> {
    let registries = registry_settings(
        options.registry_config.as_deref(),
        &options.insecure_registries,
    )?;
    let process = process_runtime(options).await?;
    let network = match &options.cluster_network {
        Some(cluster) => cluster_network(cluster, &options.data_dir).await?,
        None => None,
    };
    let set = match containers(options, registries).await {
        Ok(containers) => match &network {
            Some(network) => RuntimeSet::new(
                process,
                containers.with_node_net(Arc::clone(&network.node_net)),
            ),
            None => RuntimeSet::new(process, containers),
        },
        Err(reason) => {
            tracing::warn!(%reason, "no container runtime: image workloads will fail");
            RuntimeSet::processes_only(process, reason)
        }
    };
    match set.cleanup_network_orphans().await {
        Ok(Some(report)) if report != CleanupReport::default() => {
            tracing::info!(?report, "removed node network leftovers of gone containers");
        }
        Ok(_) => {}
        Err(problem) => tracing::warn!(%problem, "cleaning up the node network failed"),
    }
    Ok(NodeParts {
        runtime: Arc::new(set),
        network,
    })
}

/// Why this process cannot join the cluster network, if it cannot.
pub fn cluster_network_unavailable() -> Option<String> {
    let uid = rustix::process::geteuid();
    (!uid.is_root()).then(|| {
        format!(
            "the cluster network (overlay, service VIPs, cluster DNS, containers' own \
             networks) needs root; the agent runs as uid {}",
            uid.as_raw()
        )
    })
}

/// The node's network plane on the real kernel, brought up from the
/// cached map when it holds this node's subnet (so instances restarted
/// before the control plane answers keep their network). `None` (with a
/// warning saying why) when this process cannot run it.
async fn cluster_network(
    cluster: &ClusterNetwork,
    data_dir: &Path,
) -> Result<Option<AgentNetwork>, NodeError> {
    if let Some(reason) = cluster_network_unavailable() {
        tracing::warn!(%reason, "cluster network off");
        return Ok(None);
    }
    let node_net = Arc::new(NodeNet::default());
    let config = PlaneConfig {
        node: cluster.node.clone(),
        underlay: cluster.underlay,
        state_dir: data_dir.to_owned(),
        overlay: cluster.overlay.clone(),
        dns_port: Some(cluster.dns_port),
    };
    let mut plane = Plane::new(
        config,
        cca_net::KernelNetwork::new(),
        cca_net::dataplane::Nft::new(),
        Arc::clone(&node_net),
    );
    if cluster.dataplane == VipDataPlane::Nftables {
        remove_earlier_programs();
    } else {
        plane = plane.with_ebpf(ebpf_programs(cluster.dataplane == VipDataPlane::Ebpf));
    }
    let network = AgentNetwork {
        node_net,
        plane: Arc::new(std::sync::Mutex::new(plane)),
    };
    if let Some(cached) = load_cached(data_dir) {
        let early = network.clone();
        let applied = tokio::task::spawn_blocking(move || early.apply_now(&cached))
            .await
            .map_err(|error| NodeError::Network(error.to_string()))?;
        if let Err(problem) = applied {
            tracing::warn!(%problem, "bringing the node network up from the cached map failed");
        }
    }
    Ok(Some(network))
}

/// Detaches and removes the eBPF programs and maps pinned for this
/// node's namespace: on nftables alone, an earlier `--dataplane ebpf`
/// run's programs would go on translating from maps nothing updates.
fn remove_earlier_programs() {
    match cca_net::ebpf::remove_pinned(Path::new(BPFFS)) {
        Ok(true) => tracing::info!("removed the eBPF programs of an earlier run"),
        Ok(false) => {}
        Err(error) => {
            tracing::warn!(%error, "could not remove the eBPF programs of an earlier run")
        }
    }
}

/// Where the eBPF data plane pins its maps and links.
const BPFFS: &str = "/sys/fs/bpf";

/// The eBPF programs for this node: loaded in the agent's network
/// namespace (the node's), pinned under `/sys/fs/bpf/cca/`. They start with
/// a seed of the node's own and take the cluster's from the network map
/// (before its first sync when the agent starts from a cached map).
/// Backends that leave drain for the agent's stop grace.
fn ebpf_programs(required: bool) -> EbpfChoice {
    let seed = fastrand::u64(..);
    let config = cca_net::ebpf::AttachConfig {
        bpffs: BPFFS.into(),
        cgroup: None,
        seed,
    };
    EbpfChoice {
        open: Arc::new(move || match cca_net::ebpf::Attached::open(&config) {
            Ok(attached) => Ok(Box::new(attached) as Box<dyn cca_net::ebpf::LbMaps + Send>),
            Err(error) => {
                if !required {
                    // `auto` goes on with nftables alone: nothing would
                    // update what an earlier run (or this try) pinned.
                    remove_earlier_programs();
                }
                Err(error)
            }
        }),
        seed,
        required,
        drain: crate::SupervisorConfig::default().stop_grace,
    }
}

async fn containers(
    options: &NodeOptions,
    registries: RegistrySettings,
) -> Result<Containers, String> {
    let uid = rustix::process::geteuid();
    if !uid.is_root() {
        return Err(format!(
            "containers need root (mounts, cgroups, namespaces); the agent runs as uid {}",
            uid.as_raw()
        ));
    }
    let images = ImageStore::open(images_dir(&options.data_dir)).map_err(|e| e.to_string())?;
    let mut config = OciConfig::new(oci_dir(&options.data_dir), images.clone());
    config.binary.clone_from(&options.oci_runtime);
    config.cgroup_parent = format!("cca-oci-{}", agent_tag(&options.data_dir));
    let oci = OciRuntime::new(config).await.map_err(|e| e.to_string())?;
    Ok(Containers::new(Arc::new(oci), images, registries))
}

/// Eight hex digits naming this agent among the agents of one host,
/// from its data directory: the parent of its instances' cgroups
/// (`cca-{tag}`, `cca-oci-{tag}`). Instance ids are unique within a
/// cluster only, so two agents on one host (two clusters, `cca dev`
/// beside an agent, a test's nodes) would otherwise share an instance's
/// cgroups — and removing one's instance kills every process in them.
/// FNV-1a of the absolute path: the same across restarts, for adoption.
pub fn agent_tag(data_dir: &Path) -> String {
    let path = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_owned());
    let hash = path
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    format!("{:08x}", hash >> 32)
}

async fn process_runtime(options: &NodeOptions) -> Result<Arc<dyn Runtime>, NodeError> {
    let mut config = ProcessConfig::new(process_dir(&options.data_dir));
    config.cgroup_parent = format!("cca-{}", agent_tag(&options.data_dir));
    if let Some(first) = options.path_first.as_deref().and_then(Path::to_str) {
        let path = match config.base_env.get("PATH") {
            Some(path) if !path.is_empty() => format!("{first}:{path}"),
            _ => first.to_owned(),
        };
        config.base_env.insert("PATH".to_owned(), path);
    }
    let runtime = ProcessRuntime::new(config)
        .await
        .map_err(|error| NodeError::ProcessRuntime {
            dir: options.data_dir.clone(),
            error: error.to_string(),
        })?;
    Ok(Arc::new(runtime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_with_other_data_directories_get_other_cgroup_tags() {
        let one = agent_tag(Path::new("/var/lib/cca"));
        assert_eq!(one.len(), 8);
        assert_eq!(one, agent_tag(Path::new("/var/lib/cca")), "stable");
        assert_ne!(one, agent_tag(Path::new("/var/lib/cca-2")));
    }

    #[test]
    fn the_data_dir_layout_is_one_place() {
        let data = Path::new("/var/lib/cca");
        assert_eq!(images_dir(data), Path::new("/var/lib/cca/images"));
        assert_eq!(oci_dir(data), Path::new("/var/lib/cca/oci"));
        assert_eq!(process_dir(data), Path::new("/var/lib/cca/runtime"));
    }

    #[test]
    fn the_host_is_described() {
        assert!(host_cpu().0 >= 1000);
        assert!(host_memory().expect("/proc/meminfo").0 > 0);
        assert!(!host_arch().is_empty());
    }

    #[test]
    fn a_bad_insecure_registry_names_the_flag() {
        let error = registry_settings(None, &["not a host".into()]).expect_err("refused");
        assert!(
            error.to_string().starts_with("--insecure-registry"),
            "{error}"
        );
    }
}
