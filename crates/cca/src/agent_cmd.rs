//! `cca agent`: runs the node agent with the node's runtimes — host
//! processes, and containers (runc or crun, images pulled into
//! `DATA/images`) where the host can run them. Wiring only — the agent
//! lives in `cca-agent`, the runtimes in `cca-runtime`, images in
//! `cca-image`. Defaults describe this machine (cpus, memory, arch,
//! hostname).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cca_agent::node::{self, ClusterNetwork, NodeOptions, NodeParts};
use cca_agent::{AgentConfig, SupervisorConfig};
use cca_model::spec::{Cpu, Memory};
use clap::Args;
use tokio::sync::watch;

/// `cca agent [--server URL] [--node NAME] [--data-dir DIR] …`
#[derive(Debug, Args)]
pub(crate) struct AgentArgs {
    /// The API server.
    #[arg(long, env = "CCA_SERVER", default_value = "http://127.0.0.1:9770")]
    server: String,
    /// Where registrations and heartbeats go, when the server serves them
    /// on a listener of their own (`cca server --liveness-listen`).
    #[arg(long, env = "CCA_LIVENESS_SERVER", value_name = "URL")]
    liveness_server: Option<String>,
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
    /// Stay out of the cluster network: no overlay, no service VIPs or
    /// cluster DNS on this node, and containers share the host's network.
    /// (Without root the agent stays out anyway, and says so.)
    #[arg(long)]
    pub(crate) no_cluster_network: bool,
    /// The VXLAN network identifier of the overlay (the same on every node).
    #[arg(long, default_value_t = 42, value_name = "VNI")]
    vxlan_id: u32,
    /// The UDP port of the overlay's tunnels (the same on every node).
    #[arg(long, default_value_t = 4789, value_name = "PORT")]
    vxlan_port: u16,
    /// The port of the node's DNS server on its bridge address (instances
    /// reach it on port 53 there).
    #[arg(long, default_value_t = cca_model::net::DNS_PORT, value_name = "PORT")]
    dns_port: u16,
}

impl AgentArgs {
    /// The agent of `cca dev`: this machine, on loopback.
    pub(crate) fn for_dev(server: String, data_dir: PathBuf) -> Self {
        Self {
            server,
            liveness_server: None,
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
            no_cluster_network: false,
            vxlan_id: 42,
            vxlan_port: 4789,
            dns_port: cca_model::net::DNS_PORT,
        }
    }
}

pub(crate) fn run(args: AgentArgs) -> Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let mut config = agent_config(&args, &args.data_dir)?;
        let node = node_runtime(&args, &config).await?;
        config.network = node.network;
        let runtime = node.runtime;
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
impl AgentArgs {
    /// What the node's runtimes are built with.
    pub(crate) fn node_options(&self, config: &AgentConfig) -> Result<NodeOptions> {
        Ok(NodeOptions {
            data_dir: self.data_dir.clone(),
            registry_config: self.registry_config.clone(),
            insecure_registries: self.insecure_registries.clone(),
            oci_runtime: self.oci_runtime.clone(),
            cluster_network: self.cluster_network(config)?,
            // `run = "cca whoami"` finds this very binary.
            path_first: std::env::current_exe()
                .ok()
                .and_then(|exe| exe.parent().map(Path::to_path_buf)),
        })
    }

    /// How the node joins the cluster network, unless told not to.
    fn cluster_network(&self, config: &AgentConfig) -> Result<Option<ClusterNetwork>> {
        if self.no_cluster_network {
            return Ok(None);
        }
        let underlay: Ipv4Addr = self.address.parse().with_context(|| {
            format!(
                "--address `{}`: the cluster network tunnels to an IPv4 address; give one, \
                 or pass --no-cluster-network",
                self.address
            )
        })?;
        Ok(Some(ClusterNetwork {
            node: config.node.clone(),
            underlay,
            overlay: node::OverlayConfig {
                vni: self.vxlan_id,
                port: self.vxlan_port,
                ..node::OverlayConfig::default()
            },
            dns_port: self.dns_port,
        }))
    }
}

pub(crate) async fn node_runtime(args: &AgentArgs, config: &AgentConfig) -> Result<NodeParts> {
    Ok(node::node_runtime(&args.node_options(config)?).await?)
}

pub(crate) fn agent_config(args: &AgentArgs, data_dir: &Path) -> Result<AgentConfig> {
    let cpu = match &args.cpu {
        Some(text) => Cpu::parse(text).with_context(|| format!("--cpu `{text}`"))?,
        None => node::host_cpu(),
    };
    let memory = match &args.memory {
        Some(text) => Memory::parse(text).with_context(|| format!("--memory `{text}`"))?,
        None => node::host_memory()?,
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
        liveness_server: args.liveness_server.clone(),
        data_dir: data_dir.to_owned(),
        cpu,
        memory,
        arch: node::host_arch().to_owned(),
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
        network: None,
    })
}
