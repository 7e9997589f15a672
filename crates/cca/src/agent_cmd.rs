//! `cca agent`: runs the node agent with the node's runtimes — host
//! processes, and containers (runc or crun, images pulled into
//! `DATA/images`) where the host can run them. Wiring only — the agent
//! lives in `cca-agent`, the runtimes in `cca-runtime`, images in
//! `cca-image`. Defaults describe this machine (cpus, memory, arch,
//! hostname).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cca_agent::network::{CleanupReport, node_network};
use cca_agent::{AgentConfig, Containers, RuntimeSet, SupervisorConfig};
use cca_image::{ImageStore, RegistrySettings};
use cca_model::spec::{Cpu, Memory};
use cca_runtime::{OciConfig, OciRuntime, ProcessConfig, ProcessRuntime, Runtime};
use clap::Args;
use tokio::sync::watch;

/// `cca agent [--server URL] [--node NAME] [--data-dir DIR] …`
#[derive(Debug, Args)]
pub(crate) struct AgentArgs {
    /// The API server.
    #[arg(long, env = "CCA_SERVER", default_value = "http://127.0.0.1:9770")]
    server: String,
    /// This node's name (default: the hostname).
    #[arg(long)]
    node: Option<String>,
    /// Where the agent keeps its desired-state cache and its instances.
    #[arg(long, default_value = ".cca-agent")]
    data_dir: PathBuf,
    /// Allocatable CPU (`2`, `1500m`; default: every core).
    #[arg(long)]
    cpu: Option<String>,
    /// Allocatable memory (`4Gi`; default: all of it).
    #[arg(long)]
    memory: Option<String>,
    /// The node's zone, for placement.
    #[arg(long)]
    zone: Option<String>,
    /// A node label for placement (`disk=ssd`); may repeat.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// The address this node's instances are reached at.
    #[arg(long, default_value = "127.0.0.1")]
    address: String,
    /// Where the agent's logs/exec API listens (port 0: any).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Consecutive quick crashes after which an instance is reported failed.
    #[arg(long, default_value_t = 5)]
    restart_threshold: u32,
    /// First restart delay after a crash; doubles per crash, up to 30 s.
    #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = crate::flags::duration)]
    restart_backoff: Duration,
    /// A registry (`HOST:PORT`, as written in image references) reached
    /// over plain HTTP instead of HTTPS; may repeat. Others: HTTPS only.
    #[arg(long = "insecure-registry", value_name = "HOST:PORT")]
    insecure_registries: Vec<String>,
    /// A JSON file of per-registry settings: plain HTTP and credentials
    /// (`username`, `password_file` or `password`), so no password goes on
    /// the command line. Checked at startup. See docs/agent.md.
    #[arg(long, value_name = "FILE")]
    registry_config: Option<PathBuf>,
    /// The OCI runtime binary for containers (default: runc, else crun,
    /// from PATH).
    #[arg(long, value_name = "PATH")]
    oci_runtime: Option<PathBuf>,
    /// Give each container its own network namespace and an address from
    /// this node subnet (`10.88.0.0/24`) on the bridge `cca0`, with
    /// outbound NAT and its host ports published to its declared ports.
    /// Default: containers share the host's network.
    #[arg(long, value_name = "CIDR")]
    pod_subnet: Option<String>,
}

impl AgentArgs {
    /// The agent of `cca dev`: this machine, on loopback.
    pub(crate) fn for_dev(server: String, data_dir: PathBuf) -> Self {
        Self {
            server,
            node: None,
            data_dir,
            cpu: None,
            memory: None,
            zone: None,
            labels: Vec::new(),
            address: "127.0.0.1".to_owned(),
            listen: None,
            restart_threshold: 5,
            restart_backoff: Duration::from_secs(1),
            insecure_registries: Vec::new(),
            registry_config: None,
            oci_runtime: None,
            pod_subnet: None,
        }
    }
}

pub(crate) fn run(args: AgentArgs) -> Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let config = agent_config(&args, &args.data_dir)?;
        let runtime = node_runtime(&args).await?;
        let (stop, stopping) = watch::channel(false);
        tokio::spawn(async move {
            crate::server_cmd::shutdown_signal().await;
            let _ = stop.send(true);
        });
        cca_agent::run(config, runtime, stopping).await?;
        Ok(ExitCode::SUCCESS)
    })
}

/// The node's image store: `DATA/images`.
pub(crate) fn images_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("images")
}

/// The container runtime's directory: `DATA/oci`.
pub(crate) fn oci_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("oci")
}

/// The registry settings of `--registry-config FILE` (read and checked
/// now, so a bad file stops the command before it does anything; its
/// warnings logged) with plain HTTP allowed to the `--insecure-registry`
/// hosts.
pub(crate) fn registry_settings(
    config: Option<&Path>,
    insecure: &[String],
) -> Result<RegistrySettings> {
    let mut settings = match config {
        Some(path) => {
            let loaded = RegistrySettings::load(path)?;
            for warning in &loaded.warnings {
                tracing::warn!("{warning}");
            }
            loaded.settings
        }
        None => RegistrySettings::default(),
    };
    settings
        .allow_plain_http(insecure)
        .context("--insecure-registry")?;
    Ok(settings)
}

/// The process runtime and, when this host can run containers, the `oci`
/// runtime with its image store; otherwise image workloads fail with the
/// reason (logged once here too).
pub(crate) async fn node_runtime(args: &AgentArgs) -> Result<Arc<dyn Runtime>> {
    let registries = registry_settings(args.registry_config.as_deref(), &args.insecure_registries)?;
    let process = process_runtime(&args.data_dir).await?;
    let set = match containers(args, registries).await {
        Ok(containers) => match &args.pod_subnet {
            // An explicit subnet that cannot be set up stops the agent:
            // running containers on the host network instead would be a
            // silent change of what the flag asked for.
            Some(subnet) => {
                let subnet = subnet.clone();
                let state_dir = args.data_dir.clone();
                let network = tokio::task::spawn_blocking(move || node_network(&subnet, state_dir))
                    .await
                    .context("opening the node network")?
                    .map_err(anyhow::Error::msg)
                    .context("--pod-subnet")?;
                RuntimeSet::new(process, containers.with_network(network))
            }
            None => RuntimeSet::new(process, containers),
        },
        Err(reason) => {
            tracing::warn!(%reason, "no container runtime: image workloads will fail");
            if args.pod_subnet.is_some() {
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
    args: &AgentArgs,
    registries: RegistrySettings,
) -> std::result::Result<Containers, String> {
    let uid = rustix::process::geteuid();
    if !uid.is_root() {
        return Err(format!(
            "containers need root (mounts, cgroups, namespaces); the agent runs as uid {}",
            uid.as_raw()
        ));
    }
    let images_dir = images_dir(&args.data_dir);
    let images = ImageStore::open(&images_dir).map_err(|e| e.to_string())?;
    let mut config = OciConfig::new(oci_dir(&args.data_dir), images.clone());
    config.binary.clone_from(&args.oci_runtime);
    let oci = OciRuntime::new(config).await.map_err(|e| e.to_string())?;
    Ok(Containers::new(Arc::new(oci), images, registries))
}

/// The host-process runtime with its instances under `DIR/runtime`, and
/// this binary's directory on the instances' PATH (so `cca whoami` runs).
pub(crate) async fn process_runtime(data_dir: &Path) -> Result<Arc<dyn Runtime>> {
    let mut config = ProcessConfig::new(data_dir.join("runtime"));
    if let Some(path) = path_with_this_binary(config.base_env.get("PATH").map(String::as_str)) {
        config.base_env.insert("PATH".to_owned(), path);
    }
    let runtime = ProcessRuntime::new(config)
        .await
        .with_context(|| format!("opening the process runtime in {}", data_dir.display()))?;
    Ok(Arc::new(runtime))
}

fn path_with_this_binary(path: Option<&str>) -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.to_str()?.to_owned();
    Some(match path {
        Some(path) if !path.is_empty() => format!("{dir}:{path}"),
        _ => dir,
    })
}

pub(crate) fn agent_config(args: &AgentArgs, data_dir: &Path) -> Result<AgentConfig> {
    let cpu = match &args.cpu {
        Some(text) => Cpu::parse(text).with_context(|| format!("--cpu `{text}`"))?,
        None => Cpu(1000 * std::thread::available_parallelism().map_or(1, |n| n.get() as u64)),
    };
    let memory = match &args.memory {
        Some(text) => Memory::parse(text).with_context(|| format!("--memory `{text}`"))?,
        None => Memory(total_memory().context("reading /proc/meminfo (pass --memory)")?),
    };
    let mut labels = BTreeMap::new();
    for label in &args.labels {
        let Some((key, value)) = label.split_once('=') else {
            bail!("--label `{label}` must be KEY=VALUE");
        };
        labels.insert(key.to_owned(), value.to_owned());
    }
    let listen = match args.listen {
        Some(listen) => listen,
        None => format!("{}:0", args.address)
            .parse()
            .with_context(|| format!("--address `{}` is not an IP address", args.address))?,
    };
    Ok(AgentConfig {
        node: args
            .node
            .clone()
            .unwrap_or_else(crate::server_cmd::hostname),
        server: args.server.clone(),
        data_dir: data_dir.to_owned(),
        cpu,
        memory,
        arch: arch().to_owned(),
        zone: args.zone.clone(),
        labels,
        address: args.address.clone(),
        listen,
        supervisor: SupervisorConfig {
            restart_threshold: args.restart_threshold.max(1),
            backoff_base: args.restart_backoff,
            ..SupervisorConfig::default()
        },
        tick: Duration::from_millis(500),
        base_env: BTreeMap::new(),
        stop_instances_on_exit: false,
        link: Default::default(),
    })
}

/// Go/OCI spelling of this machine's architecture.
fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn total_memory() -> Result<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
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
        .context("no MemTotal line")?;
    Ok(kib * 1024)
}
