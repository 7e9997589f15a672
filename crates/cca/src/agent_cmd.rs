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

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use cca_agent::enrol::{self, NodeTrust};
use cca_agent::node::{self, ClusterNetwork, NodeOptions, NodeParts};
use cca_agent::preflight::{self, Check, Verdict};
use cca_agent::{AgentConfig, SupervisorConfig};
use cca_model::spec::{Cpu, Memory};
use cca_trust::config_dir::NodeCredentials;
use cca_trust::join::JoinToken;
use clap::Args;
use tokio::sync::watch;

/// `cca agent [--server URL] [--node NAME] [--data-dir DIR] …`
#[derive(Debug, Args)]
pub(crate) struct AgentArgs {
    /// The API server (`https://…` for a cluster with a CA: the node then
    /// needs a join token the first time, see --join).
    #[arg(long, env = "CCA_SERVER", default_value = "http://127.0.0.1:9770")]
    server: String,
    /// A join token (`cca token create`): on the first start, the node
    /// makes its key, checks the server's CA against the token and gets
    /// its certificate (kept in DATA/tls and renewed by the agent). Once
    /// joined, the token is not used again.
    #[arg(long, env = "CCA_JOIN_TOKEN", value_name = "TOKEN")]
    join: Option<String>,
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
    /// After a resync with another store (a new, restored or rewound one),
    /// how long an instance the store does not place here keeps running
    /// once the store knows its service, for the scheduler to adopt it.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = crate::flags::duration)]
    claim_grace: Duration,
    /// …and how long while the store does not know its service (the
    /// desired state is yet to be applied again).
    #[arg(long, default_value = "10m", value_name = "DURATION", value_parser = crate::flags::duration)]
    adopt_window: Duration,
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
    /// How often a node with a certificate asks the server for the
    /// cluster's certificate revocations, which its own API refuses from
    /// the next handshake on (the last list is kept while the server is
    /// away).
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = crate::flags::duration)]
    revocation_refresh: Duration,
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
    /// How VIPs are balanced: `nftables` rules for every flow; `ebpf`
    /// balances with eBPF programs (socket hooks for the node's own
    /// processes, tc on instances' veths for containers), the nftables
    /// rules kept for what they do not see, and fails if they cannot load;
    /// `auto` is `ebpf` where the kernel lets the programs load, else
    /// `nftables` (docs/network.md).
    #[arg(long, value_enum, default_value_t = DataPlaneFlag::Nftables)]
    dataplane: DataPlaneFlag,
    /// Make this node a gate node: serve the cluster's gates, plain HTTP on
    /// the first address and HTTPS on the second (`0.0.0.0:80,0.0.0.0:443`;
    /// port 0 picks a free one).
    #[arg(long, value_name = "HTTP[,HTTPS]", value_delimiter = ',', num_args = 1..=2)]
    pub(crate) gate_listen: Vec<SocketAddr>,
    /// Log every request a gate serves (JSON fields: gate, client, method,
    /// host, path, status, ms, backend) under the target `cca_gate::access`.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    gate_access_log: bool,
    /// Serve the gate's Prometheus metrics (plain HTTP, `/metrics`) here.
    #[arg(long, value_name = "ADDR")]
    pub(crate) gate_metrics_listen: Option<SocketAddr>,
    /// Client connections a gate node keeps open at most; past it, new
    /// ones wait to be accepted.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    gate_max_connections: usize,
    /// How long a client may take to send a request's headers (and a TLS
    /// handshake) to the gate.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = crate::flags::duration)]
    gate_header_timeout: Duration,
    /// How long a gate keeps a client connection with no request open
    /// before a request names a gate (then that gate's `timeouts.idle`).
    #[arg(long, default_value = "60s", value_name = "DURATION", value_parser = crate::flags::duration)]
    gate_idle_timeout: Duration,
    /// How long a stopping gate node waits for requests in flight.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = crate::flags::duration)]
    gate_drain: Duration,
    /// Threads serving a gate node's client connections, each a
    /// single-threaded runtime that keeps its connections (default: one
    /// per core).
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    gate_workers: Option<usize>,
    /// Keep each gate worker to a CPU of its own, when the agent may use
    /// as many CPUs as there are workers (docs/gates.md, "Worker threads").
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    gate_pin_workers: bool,
    /// How often the node reports what it and its instances used (read
    /// every 5 s, or a third of this when shorter; at least 1s).
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = crate::flags::duration)]
    pub(crate) usage_every: Duration,
}

impl AgentArgs {
    /// The agent of `cca dev`: this machine, on loopback.
    pub(crate) fn for_dev(server: String, data_dir: PathBuf) -> Self {
        Self {
            server,
            join: None,
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
            claim_grace: Duration::from_secs(30),
            adopt_window: Duration::from_secs(600),
            insecure_registries: Vec::new(),
            registry_config: None,
            oci_runtime: None,
            no_cluster_network: false,
            revocation_refresh: cca_agent::revocations::DEFAULT_REFRESH,
            vxlan_id: 42,
            vxlan_port: 4789,
            dns_port: cca_model::net::DNS_PORT,
            dataplane: DataPlaneFlag::Nftables,
            gate_listen: Vec::new(),
            gate_access_log: true,
            gate_metrics_listen: None,
            gate_max_connections: 100_000,
            gate_header_timeout: Duration::from_secs(30),
            gate_idle_timeout: Duration::from_secs(60),
            gate_drain: Duration::from_secs(30),
            gate_workers: None,
            gate_pin_workers: true,
            usage_every: Duration::from_secs(30),
        }
    }

    /// The gate role these flags ask for; `None` without `--gate-listen`.
    fn gate_config(&self) -> Option<cca_agent::gate::GateConfig> {
        let (http, https) = match self.gate_listen.as_slice() {
            [] => return None,
            [http] => (Some(*http), None),
            [http, https, ..] => (Some(*http), Some(*https)),
        };
        Some(cca_agent::gate::GateConfig {
            http,
            https,
            server: cca_gate::ServerOptions {
                header_timeout: self.gate_header_timeout,
                idle_timeout: self.gate_idle_timeout,
                max_connections: self.gate_max_connections.max(1),
                drain: self.gate_drain,
                workers: self
                    .gate_workers
                    .unwrap_or(cca_gate::ServerOptions::default().workers),
                pin_workers: self.gate_pin_workers,
                ..cca_gate::ServerOptions::default()
            },
            access_log: self.gate_access_log,
            metrics_listen: self.gate_metrics_listen,
        })
    }
}

pub(crate) fn run(args: AgentArgs) -> Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let mut config = agent_config(&args, &args.data_dir)?;
        config.trust = node_trust(&args, &config.node).await?.map(Arc::new);
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

/// The node's mTLS credentials: joined now with --join if the data
/// directory holds none, loaded from it otherwise; `None` for a plain
/// `http://` server.
async fn node_trust(args: &AgentArgs, node: &str) -> Result<Option<NodeTrust>> {
    let credentials = NodeCredentials::in_data_dir(&args.data_dir);
    let names = enrol::node_names(node, args.address.parse().ok())?;
    let files = if credentials.exist() {
        if args.join.is_some() {
            tracing::info!("the node has joined already; --join is not used again");
        }
        credentials
            .load(node, cca_model::clock::system_now())
            .with_context(|| {
                format!(
                    "loading the node's certificate (if it expired while the node was away, \
                     remove {} and start the agent with a new --join token)",
                    args.data_dir.join("tls").display()
                )
            })?
    } else if let Some(token) = &args.join {
        join_now(&args.server, token, node, &names, &credentials).await?
    } else if args.server.starts_with("https://") {
        bail!(
            "{} speaks HTTPS and this node has no certificate in {}: run `cca token create` \
             where the cluster's admin credentials are, and start the agent with --join TOKEN",
            args.server,
            args.data_dir.display()
        );
    } else {
        return Ok(None);
    };
    let mut trust = NodeTrust::new(node, names, credentials, &files)?;
    trust.revocation_refresh = args.revocation_refresh;
    Ok(Some(trust))
}

/// Enrols the node with `token` and reports it.
async fn join_now(
    server: &str,
    token: &str,
    node: &str,
    names: &cca_trust::pki::Names,
    credentials: &NodeCredentials,
) -> Result<cca_trust::config_dir::ClientFiles> {
    if !server.starts_with("https://") {
        bail!("--join needs the server's https:// URL, not {server}");
    }
    let token: JoinToken = token.parse().context("the join token")?;
    let started = std::time::Instant::now();
    let files = enrol::join(
        server,
        &token,
        node,
        names,
        credentials,
        cca_model::clock::system_now(),
    )
    .await?;
    tracing::info!(
        node,
        serial = %files.certificate.serial,
        took = ?started.elapsed(),
        "joined the cluster"
    );
    Ok(files)
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
            dataplane: match self.dataplane {
                DataPlaneFlag::Nftables => node::VipDataPlane::Nftables,
                DataPlaneFlag::Ebpf => node::VipDataPlane::Ebpf,
                DataPlaneFlag::Auto => node::VipDataPlane::Auto,
            },
        }))
    }
}

/// `--dataplane`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DataPlaneFlag {
    Nftables,
    Ebpf,
    Auto,
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
            claim_grace: args.claim_grace,
            adopt_window: args.adopt_window,
            ..SupervisorConfig::default()
        },
        tick: Duration::from_millis(500),
        base_env: BTreeMap::new(),
        stop_instances_on_exit: false,
        link: Default::default(),
        network: None,
        trust: None,
        gate: args.gate_config(),
        port_probe: Some(std::sync::Arc::new(cca_agent::host_ports::BindProbe)),
        usage: Some(usage_options(args.usage_every)?),
    })
}

fn usage_options(every: Duration) -> Result<cca_agent::usage::UsageOptions> {
    if every < Duration::from_secs(1) {
        bail!(
            "--usage-every {every:?} is under 1s: a report a second is already more than autoscaling needs"
        );
    }
    Ok(cca_agent::usage::UsageOptions::reporting_every(every))
}

/// `cca join SERVER TOKEN [--node NAME] [--data-dir DIR] [--address IP]`
#[derive(Debug, Args)]
pub(crate) struct JoinArgs {
    /// The API server's https:// URL.
    server: String,
    /// The join token `cca token create` printed.
    token: String,
    /// This node's name (default: the hostname).
    #[arg(long)]
    node: Option<String>,
    /// The agent's data directory; the credentials go to DIR/tls.
    #[arg(long, default_value = ".cca-agent")]
    data_dir: PathBuf,
    /// The address this node is reached at (in its certificate).
    #[arg(long, default_value = "127.0.0.1")]
    address: String,
}

/// Enrols this node without starting the agent.
pub(crate) fn join(args: JoinArgs) -> Result<ExitCode> {
    let node = args
        .node
        .clone()
        .unwrap_or_else(crate::server_cmd::hostname);
    let credentials = NodeCredentials::in_data_dir(&args.data_dir);
    if credentials.exist() {
        bail!(
            "{} holds a node certificate already: this node has joined (remove that \
             directory to join again)",
            credentials.node_file().display()
        );
    }
    let address: std::net::IpAddr = args
        .address
        .parse()
        .with_context(|| format!("--address `{}` is not an IP address", args.address))?;
    let names = enrol::node_names(&node, Some(address))?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let files = runtime.block_on(join_now(
        &args.server,
        &args.token,
        &node,
        &names,
        &credentials,
    ))?;
    report_join(&args, &node, &files);
    Ok(ExitCode::SUCCESS)
}

#[allow(clippy::print_stdout, reason = "the command's report")]
fn report_join(args: &JoinArgs, node: &str, files: &cca_trust::config_dir::ClientFiles) {
    let until = humantime::format_rfc3339_seconds(files.certificate.not_after);
    println!(
        "joined as node:{node}; certificate in {} valid until {until} (the agent renews it)",
        NodeCredentials::in_data_dir(&args.data_dir)
            .node_file()
            .display()
    );
    println!(
        "start the agent: cca agent --server {} --node {node} --data-dir {} --address {}",
        args.server,
        args.data_dir.display(),
        args.address
    );
}

/// `cca readiness agent …`: what starting `cca agent` with these flags
/// needs, checked without starting it: the flags, the data directory and
/// its disk, the node's certificate, the server and the clock against
/// it, the ports it would listen on, the container runtime.
pub(crate) async fn readiness(args: &AgentArgs) -> Vec<Check> {
    let mut checks = vec![
        preflight::data_dir("data directory", &args.data_dir),
        preflight::disk_space("disk", &args.data_dir),
    ];
    let config = match agent_config(args, &args.data_dir) {
        Ok(config) => config,
        Err(error) => {
            checks.push(Check::new("flags", Verdict::Fail, format!("{error:#}")));
            return checks;
        }
    };
    let (certificate, client) = node_credentials(args, &config.node);
    checks.push(certificate);
    if let Some(client) = client {
        checks.extend(server_checks(&client, &args.server, &config.node).await);
    }
    if let Some(listen) = args.listen.filter(|listen| listen.port() != 0) {
        checks.push(preflight::tcp_port_free("agent API port", listen));
    }
    for (listen, role) in args
        .gate_listen
        .iter()
        .zip(["gate HTTP port", "gate HTTPS port"])
    {
        if listen.port() != 0 {
            checks.push(preflight::tcp_port_free(role, *listen));
        }
    }
    if !args.no_cluster_network && rustix::process::geteuid().is_root() {
        let tunnels = SocketAddr::from((Ipv4Addr::UNSPECIFIED, args.vxlan_port));
        checks.push(overlay_port(tunnels));
    }
    checks.push(preflight::container_runtime(args.oci_runtime.as_deref()));
    checks
}

/// The node's certificate, and a client of the server to check it with
/// (`None` when the server cannot be called yet: HTTPS before a join).
fn node_credentials(args: &AgentArgs, node: &str) -> (Check, Option<cca_wire::Client>) {
    const NAME: &str = "node certificate";
    let credentials = NodeCredentials::in_data_dir(&args.data_dir);
    let https = args.server.starts_with("https://");
    if !credentials.exist() {
        return match (https, &args.join) {
            (false, _) => (
                Check::new(
                    NAME,
                    Verdict::Pass,
                    "none needed: the server speaks plain HTTP",
                ),
                Some(cca_wire::Client::new(&args.server)),
            ),
            (true, Some(_)) => (
                Check::new(
                    NAME,
                    Verdict::Pass,
                    "none yet: the node joins with its --join token at start (the token \
                     proves the server's CA, so the server is checked then)",
                ),
                None,
            ),
            (true, None) => (
                Check::new(
                    NAME,
                    Verdict::Fail,
                    format!(
                        "{} speaks HTTPS and {} holds no certificate: start the agent with \
                         --join TOKEN (`cca token create`)",
                        args.server,
                        args.data_dir.join("tls").display()
                    ),
                ),
                None,
            ),
        };
    }
    let now = cca_model::clock::system_now();
    let files = match credentials.load(node, now) {
        Ok(files) => files,
        Err(error) => return (Check::new(NAME, Verdict::Fail, error.to_string()), None),
    };
    let check = preflight::certificate(NAME, "the node's certificate", &files.certificate, now);
    let client = enrol::client_tls(&files)
        .ok()
        .and_then(|(tls, _)| cca_wire::Client::with_tls(&args.server, &tls).ok());
    (check, client)
}

/// The server answers, takes this node for itself, and agrees on the time.
async fn server_checks(client: &cca_wire::Client, server: &str, node: &str) -> Vec<Check> {
    match client.identity_and_clock().await {
        Ok((identity, clock)) => {
            let (who, verdict) = match identity.identity {
                None => ("nobody (plain HTTP)".to_owned(), Verdict::Pass),
                Some(who) if who.kind == "node" && who.name == node => {
                    (format!("node {node}"), Verdict::Pass)
                }
                Some(who) => (
                    format!("{} {}, not node {node}", who.kind, who.name),
                    Verdict::Fail,
                ),
            };
            vec![
                Check::new(
                    "server",
                    verdict,
                    format!("{server} answers and takes this host for {who}"),
                ),
                preflight::clock_skew(&clock),
            ]
        }
        Err(error) => vec![Check::new(
            "server",
            Verdict::Fail,
            format!("{server} does not answer: {error}"),
        )],
    }
}

/// The overlay's UDP port: free, or held by this node's own VXLAN device
/// (an agent ran here before and left its tunnel up, as it does).
fn overlay_port(address: SocketAddr) -> Check {
    let check = preflight::udp_port_free("overlay port", address);
    if check.verdict == Verdict::Fail && std::path::Path::new("/sys/class/net/cca-vxlan").exists() {
        return Check::new(
            "overlay port",
            Verdict::Pass,
            format!("UDP {address} is held by this node's own tunnel device (cca-vxlan)"),
        );
    }
    check
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: AgentArgs,
    }

    fn gate_of(flags: &[&str]) -> Result<Option<cca_agent::gate::GateConfig>, clap::Error> {
        let argv = ["cca", "--gate-listen", "127.0.0.1:0,127.0.0.1:0"]
            .into_iter()
            .chain(flags.iter().copied());
        Cli::try_parse_from(argv).map(|cli| cli.args.gate_config())
    }

    #[test]
    fn gate_workers_default_to_the_cores_and_none_is_refused() {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let default = gate_of(&[]).expect("parses").expect("a gate node");
        assert_eq!(default.server.workers, cores);
        let three = gate_of(&["--gate-workers", "3"])
            .expect("parses")
            .expect("a gate node");
        assert_eq!(three.server.workers, 3);
        let error = gate_of(&["--gate-workers", "0"]).expect_err("zero workers");
        assert!(error.to_string().contains("--gate-workers <N>"), "{error}");
    }

    #[test]
    fn gate_workers_are_kept_to_cpus_unless_asked_not_to() {
        let default = gate_of(&[]).expect("parses").expect("a gate node");
        assert!(default.server.pin_workers);
        let unpinned = gate_of(&["--gate-pin-workers", "false"])
            .expect("parses")
            .expect("a gate node");
        assert!(!unpinned.server.pin_workers);
        let error = gate_of(&["--gate-pin-workers", "maybe"]).expect_err("not a bool");
        assert!(error.to_string().contains("--gate-pin-workers"), "{error}");
    }

    #[test]
    fn usage_reports_every_30s_by_default_and_no_more_than_every_second() {
        let usage_of = |flags: &[&str]| {
            let cli = Cli::try_parse_from(["cca"].into_iter().chain(flags.iter().copied()))
                .expect("parses");
            usage_options(cli.args.usage_every)
        };
        let default = usage_of(&[]).expect("the default");
        assert_eq!(
            (default.report_every, default.sample_every),
            (Duration::from_secs(30), Duration::from_secs(5))
        );
        let quick = usage_of(&["--usage-every", "3s"]).expect("3s");
        assert_eq!(quick.sample_every, Duration::from_secs(1));
        let error = usage_of(&["--usage-every", "500ms"]).expect_err("under a second");
        assert!(error.to_string().contains("--usage-every"), "{error}");
    }
}
