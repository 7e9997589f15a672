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

use crate::network::{CleanupReport, node_network};
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
    #[error("--pod-subnet: {0}")]
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
    /// Containers get addresses from this subnet on a node bridge.
    pub pod_subnet: Option<String>,
    /// Put first on host processes' PATH (where `cca` itself lives, so that
    /// `run = "cca whoami"` works).
    pub path_first: Option<PathBuf>,
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
    let kib = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .ok_or_else(|| NodeError::Memory("no MemTotal line".into()))?;
    Ok(Memory(kib * 1024))
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
/// when the host can run them (else image workloads fail with the reason).
/// Leftovers of the node network from gone containers are removed.
pub async fn node_runtime(options: &NodeOptions) -> Result<Arc<dyn Runtime>, NodeError> {
    let registries = registry_settings(
        options.registry_config.as_deref(),
        &options.insecure_registries,
    )?;
    let process = process_runtime(options).await?;
    let set = match containers(options, registries).await {
        Ok(containers) => match &options.pod_subnet {
            // An explicit subnet that cannot be set up stops the agent:
            // running containers on the host network instead would be a
            // silent change of what was asked for.
            Some(subnet) => {
                let subnet = subnet.clone();
                let state_dir = options.data_dir.clone();
                let network = tokio::task::spawn_blocking(move || node_network(&subnet, state_dir))
                    .await
                    .map_err(|error| NodeError::Network(error.to_string()))?
                    .map_err(NodeError::Network)?;
                RuntimeSet::new(process, containers.with_network(network))
            }
            None => RuntimeSet::new(process, containers),
        },
        Err(reason) => {
            tracing::warn!(%reason, "no container runtime: image workloads will fail");
            if options.pod_subnet.is_some() {
                tracing::warn!("--pod-subnet is unused: this node runs no containers");
            }
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
    Ok(Arc::new(set))
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
    let oci = OciRuntime::new(config).await.map_err(|e| e.to_string())?;
    Ok(Containers::new(Arc::new(oci), images, registries))
}

async fn process_runtime(options: &NodeOptions) -> Result<Arc<dyn Runtime>, NodeError> {
    let mut config = ProcessConfig::new(process_dir(&options.data_dir));
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
