//! `cca dev [FILES…]`: a whole cluster in one process for development —
//! embedded store, controllers, API and one agent running instances as
//! host processes (and containers, when run as root with runc or crun),
//! data under `--data-dir`. Applies the files once its agent's node is
//! ready (so the scheduler has somewhere to place them), prints the
//! instances and the URL of every running service port, keeps the status
//! live until Ctrl-C, then stops its instances cleanly. Wiring only.
//!
//! It runs the secure setup on loopback: a cluster CA of its own in
//! `DATA/trust` (made by `cca init`'s code on the first start, reused
//! after), HTTPS with client certificates required, and its agent on a
//! node certificate the CA issues directly (no join), serving its logs and
//! exec API over mTLS. The CLI finds `./.cca-dev/trust` by itself (see
//! `cluster_cmd::ServerAddr`). `--insecure` serves plain HTTP without any
//! of it, as before.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use cca_agent::enrol::{NodeTrust, node_names};
use cca_api::ControlPlaneConfig;
use cca_dsl::commands::ValueOptions;
use cca_store::embedded::{Config as StoreConfig, EmbeddedStore};
use cca_trust::config_dir::{ConfigDir, InitOptions, NodeCredentials};
use cca_trust::identity::Identity;
use cca_trust::pki::{ClusterCa, Issue, Names};
use cca_wire::Client;
use cca_wire::client::InstanceQuery;
use clap::Args;
use tokio::sync::watch;

use crate::cluster_cmd::{commands::compile_files, output};
use crate::server_cmd::{Trust, check_listen, load_trust, run_control_plane, shutdown_signal};

/// `cca dev [--data-dir DIR] [--listen ADDR [--insecure]] [FILES…]`
#[derive(Debug, Args)]
pub(crate) struct DevArgs {
    /// Where the store and the instances live.
    #[arg(long, default_value = ".cca-dev")]
    data_dir: PathBuf,
    /// Where the API listens (the CLI's default server address); a
    /// loopback address unless --insecure.
    #[arg(long, default_value = cca_wire::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Serve plain HTTP without a CA or authentication (on any address:
    /// anyone who reaches it controls the cluster), and run the agent
    /// without a certificate. Without it `cca dev` serves HTTPS on
    /// loopback with a CA of its own in DATA/trust.
    #[arg(long)]
    insecure: bool,
    /// A `.ccv` values file; may repeat, later files win.
    #[arg(long = "values", value_name = "FILE")]
    values: Vec<PathBuf>,
    /// Set one value; overrides values files.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Stay out of the cluster network (as root it is on): containers
    /// share the host's network, and services get no VIP routes or
    /// cluster DNS on this machine.
    #[arg(long)]
    no_cluster_network: bool,
    /// How often the dev node reports what it and its instances used
    /// (`cca top`; at least 1s).
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = crate::flags::duration)]
    usage_every: std::time::Duration,
    /// Vertical autoscaling recommends from the usage of this long (as
    /// `cca server --vertical-window`).
    #[arg(long, default_value = "1h", value_name = "DURATION", value_parser = crate::flags::duration)]
    vertical_window: std::time::Duration,
    /// Where the dev node's gate proxy serves the program's gates: plain
    /// HTTP, then HTTPS (port 0: a free one, printed at start).
    #[arg(
        long,
        value_name = "HTTP[,HTTPS]",
        value_delimiter = ',',
        num_args = 1..=2,
        default_value = "127.0.0.1:0,127.0.0.1:0"
    )]
    gate_listen: Vec<SocketAddr>,
    /// The host ports the scheduler hands out to instances (its node's
    /// agent skips ports something else on this machine holds).
    #[arg(long, default_value = "20000-32767", value_name = "FIRST-LAST", value_parser = crate::flags::port_range)]
    host_ports: std::ops::RangeInclusive<u16>,
    /// `.cca` files to apply on start.
    #[arg(value_name = "FILE")]
    files: Vec<PathBuf>,
}

pub(crate) fn run(args: DevArgs) -> Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(dev(args))?;
    Ok(ExitCode::SUCCESS)
}

async fn dev(args: DevArgs) -> Result<()> {
    if args.insecure {
        check_listen(args.listen, true)?;
    } else if !args.listen.ip().to_canonical().is_loopback() {
        anyhow::bail!(
            "refusing to listen on {}: `cca dev` serves its own CA's certificates on loopback \
             only; listen on 127.0.0.1, or serve a cluster other machines reach with `cca init` \
             and `cca server` (or pass --insecure for plain HTTP without authentication)",
            args.listen
        );
    }
    let options = ValueOptions {
        files: args.values.clone(),
        set: args.set.clone(),
        set_from_env: Vec::new(),
    };
    // Compile first: a typo should not cost a cluster start.
    let program = compile_files(&args.files, &options)?;
    let secret_key = crate::server_cmd::load_secret_key(&args.data_dir.join("secret.key"))?;
    let trust_dir = args.data_dir.join("trust");
    let trust = if args.insecure {
        None
    } else {
        Some(dev_trust(&trust_dir)?)
    };
    let store = EmbeddedStore::open(StoreConfig::new(args.data_dir.join("store")))
        .await
        .with_context(|| format!("opening the store in {}", args.data_dir.display()))?;
    let listener = tokio::net::TcpListener::bind(args.listen).await.with_context(|| {
        format!("listening on {} (is another `cca dev` or `cca server` running? pick another --listen)", args.listen)
    })?;
    let address = listener
        .local_addr()
        .context("reading the listen address")?;
    let scheme = if trust.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{address}");
    let (listener, client, node_ca) = match trust.as_ref() {
        Some(trust) => (
            cca_api::ApiListener::Tls(
                cca_api::TlsListener::new(listener, &trust.tls)
                    .context("preparing the TLS listener")?,
            ),
            crate::cluster_cmd::commands::admin_client(&ConfigDir::new(&trust_dir), &url)?,
            Some(Arc::clone(&trust.authority)),
        ),
        None => (
            cca_api::ApiListener::Plain(listener),
            Client::new(&url),
            None,
        ),
    };
    let (stop, stopping) = watch::channel(false);
    let mut setup = dev_setup(secret_key, trust, args.host_ports.clone());
    setup.lifecycle.vertical_window = args.vertical_window;
    let plane = tokio::spawn(run_control_plane(
        Arc::new(store),
        setup,
        listener,
        None,
        Some(SocketAddr::from(([127, 0, 0, 1], cca_model::net::DNS_PORT))),
        stopped(stopping.clone()),
    ));
    if args.no_cluster_network {
        say(
            "cca dev: cluster network off (--no-cluster-network): containers share the host's network",
        );
    } else if let Some(reason) = cca_agent::node::cluster_network_unavailable() {
        say(&format!(
            "cca dev: cluster network off: {reason}. Services still run, but get no VIP \
             routes or cluster DNS on this node, and containers share the host's network \
             (run as root to have them)."
        ));
    }
    let agent = start_agent(&args, &url, node_ca.as_deref(), stopping).await?;
    // Apply once the agent's node is ready: the scheduler places at once
    // (no startup grace here), and would otherwise warn that no nodes are
    // registered about a node that is a moment away.
    wait_for_a_ready_node(&client, NODE_WAIT).await;
    let report = client
        .apply(&program, false)
        .await
        .context("applying the files")?;
    say(&format!(
        "cca dev: API on {url}; applied {} created, {} changed, {} deleted. Ctrl-C stops everything.",
        report.created.len(),
        report.changed.len(),
        report.deleted.len()
    ));
    if !args.insecure {
        say(&format!(
            "cca dev: its CA and admin certificate are in {dir}; cca commands run from this \
             directory find them (elsewhere: --config-dir {dir})",
            dir = trust_dir.display()
        ));
    }
    match console_link(&client, &url, args.insecure).await {
        Ok(link) => say(&link),
        Err(error) => say(&format!(
            "cca dev: the web console is at {url}/ui; {error:#}"
        )),
    }
    if let Some(gates) = gate_lines(&client, &program, &trust_dir).await {
        say(&gates);
    }
    tokio::select! {
        () = live_status(&client) => {}
        () = shutdown_signal() => {}
    }
    say("cca dev: stopping instances…");
    stop.send_replace(true);
    agent.await.context("the agent task")??;
    plane.await.context("the control plane task")??;
    say("cca dev: stopped");
    Ok(())
}

/// The web console's address. On the secure setup, a link that signs the
/// browser in, as a notebook server's does: the dev cluster's user
/// `console` (an admin, made here if missing) and a token of its own in
/// the link's fragment, which the browser never sends to a server.
async fn console_link(client: &Client, url: &str, insecure: bool) -> Result<String> {
    if insecure {
        return Ok(format!("cca dev: the web console is at {url}/ui"));
    }
    let user = cca_wire::types::UserRequest {
        roles: vec!["admin".into()],
        tenant: None,
    };
    client
        .put_user(CONSOLE_USER, &user)
        .await
        .context("making the console's user")?;
    let token = client
        .user_token(
            CONSOLE_USER,
            &cca_wire::types::UserTokenRequest {
                ttl_secs: Some(CONSOLE_TOKEN_TTL.as_secs()),
            },
        )
        .await
        .context("issuing the console's token")?;
    Ok(format!(
        "cca dev: the web console, signed in as user `{CONSOLE_USER}` for {} hours (the browser \
         warns once about the dev CA's certificate): {url}/ui#token={}",
        CONSOLE_TOKEN_TTL.as_secs() / 3600,
        token.token
    ))
}

/// The dev cluster's console user, and how long its link signs in for.
const CONSOLE_USER: &str = "console";
const CONSOLE_TOKEN_TTL: Duration = Duration::from_secs(12 * 3600);

/// Where the dev node's gate listens and a `curl` for each gate's first
/// host; `None` when the node serves no gates.
async fn gate_lines(
    client: &Client,
    program: &cca_model::spec::Program,
    trust_dir: &Path,
) -> Option<String> {
    let nodes = client.nodes().await.ok()?;
    let node = client.node(&nodes.first()?.name).await.ok()?;
    let listen = node.info.gate;
    let http = listen.http.as_deref();
    let https = listen.https.as_deref();
    let shown: Vec<String> = [
        http.map(|a| format!("http://{a}")),
        https.map(|a| format!("https://{a}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if shown.is_empty() {
        return None;
    }
    let mut lines = format!("cca dev: gates on {}", shown.join(" and "));
    for gate in program.gates.values() {
        let Some(host) = gate.hosts.first() else {
            continue;
        };
        let host = host.replace("*.", "www.");
        let (scheme, address, ca) = match (https, &gate.tls) {
            (Some(address), Some(_)) => (
                "https",
                address,
                format!(" --cacert {}", trust_dir.join("ca.pem").display()),
            ),
            _ => ("http", http.or(https)?, String::new()),
        };
        let port = address.rsplit_once(':').map_or("", |(_, port)| port);
        lines.push_str(&format!(
            "\n  gate {}: curl{ca} --resolve {host}:{port}:127.0.0.1 {scheme}://{host}:{port}/",
            gate.name
        ));
    }
    Some(lines)
}

/// How long `cca dev` waits for its own agent's node before applying
/// anyway (the scheduler's warning then says something true).
const NODE_WAIT: Duration = Duration::from_secs(10);

/// Returns once the API lists a ready node, or after `patience`.
async fn wait_for_a_ready_node(client: &Client, patience: Duration) {
    let deadline = tokio::time::Instant::now() + patience;
    while tokio::time::Instant::now() < deadline {
        let ready = client
            .nodes()
            .await
            .is_ok_and(|nodes| nodes.iter().any(|node| node.status == "ready"));
        if ready {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn stopped(mut stopping: watch::Receiver<bool>) {
    let _ = stopping.wait_for(|stop| *stop).await;
}

/// The usual controllers, but placing at once: a dev cluster has no
/// agents still arriving, so the startup grace would only make you wait.
/// With `trust`, certificates are required as by `cca server` with a CA.
fn dev_setup(
    secret_key: cca_api::SecretKey,
    trust: Option<Trust>,
    host_ports: std::ops::RangeInclusive<u16>,
) -> ControlPlaneConfig {
    let mut config = ControlPlaneConfig::new("cca-dev");
    config.scheduler.startup_grace = Duration::ZERO;
    config.scheduler.host_ports = host_ports;
    config.runner.leader.ttl = Duration::from_secs(5);
    config.secret_key = Some(secret_key);
    config.compiler = Some(std::sync::Arc::new(crate::console::DslCompiler));
    if let Some(trust) = trust {
        config.api.authentication = cca_api::auth::Authentication::Certificates;
        config.authority = Some(trust.authority);
        config.tokens = trust.tokens;
        config.agent_tls = Some(trust.agent_tls);
    }
    config
}

/// The dev cluster's CA, server and admin certificates in `dir`: made on
/// the first start (as `cca init` makes them, for loopback), reused after.
fn dev_trust(dir: &Path) -> Result<Trust> {
    let config = ConfigDir::new(dir);
    if !config.has_ca() {
        let options = InitOptions {
            cluster: "dev".to_owned(),
            server: "cca-dev".to_owned(),
            hosts: Names::from_hosts(["localhost", "127.0.0.1", "::1"])?,
        };
        config.init(&options, cca_model::clock::system_now())?;
    }
    load_trust(dir)?.with_context(|| format!("{} holds no cluster CA", dir.display()))
}

/// The agent's certificate, issued by the dev CA directly (the agent is in
/// this process: no join), saved where `cca agent` keeps one so renewals
/// work as on any node.
fn dev_node_trust(ca: &ClusterCa, node: &str, data_dir: &Path) -> Result<NodeTrust> {
    let now = cca_model::clock::system_now();
    let names = node_names(node, Some(std::net::Ipv4Addr::LOCALHOST.into()))?;
    let issued = ca.issue(
        &Issue::new(Identity::Node(node.to_owned()), names.clone()),
        now,
    )?;
    let credentials = NodeCredentials::in_data_dir(data_dir);
    credentials.save(ca.cert_pem(), &issued.cert_pem, &issued.key_pem)?;
    let files = credentials.load(node, now)?;
    Ok(NodeTrust::new(node, names, credentials, &files)?)
}

async fn start_agent(
    args: &DevArgs,
    api: &str,
    ca: Option<&ClusterCa>,
    stopping: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<Result<(), cca_agent::AgentError>>> {
    let data_dir = args.data_dir.join("agent");
    let mut agent_args = crate::agent_cmd::AgentArgs::for_dev(api.to_owned(), data_dir.clone());
    agent_args.no_cluster_network = args.no_cluster_network;
    agent_args.usage_every = args.usage_every;
    agent_args.gate_listen = args.gate_listen.clone();
    let mut config = crate::agent_cmd::agent_config(&agent_args, &data_dir)?;
    config.stop_instances_on_exit = true;
    if let Some(ca) = ca {
        let trust = dev_node_trust(ca, &config.node, &data_dir)
            .context("issuing the dev agent's certificate")?;
        config.trust = Some(Arc::new(trust));
    }
    let node = crate::agent_cmd::node_runtime(&agent_args, &config).await?;
    config.network = node.network;
    Ok(tokio::spawn(cca_agent::run(config, node.runtime, stopping)))
}

/// Prints the instances and the URLs of running ports whenever they change.
async fn live_status(client: &Client) {
    let mut shown = String::new();
    loop {
        if let Ok(screen) = status_screen(client).await
            && screen != shown
        {
            say(&screen);
            shown = screen;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn status_screen(client: &Client) -> Result<String> {
    let query = InstanceQuery::default();
    let instances = client.instances(&query).await?;
    if instances.is_empty() {
        // Nothing placed yet: print nothing rather than an empty table.
        return Ok(String::new());
    }
    let mut rows = Vec::new();
    let mut urls = BTreeMap::new();
    for instance in &instances {
        rows.push(format!(
            "{:<20} {:<14} {:<12} {}",
            instance.id,
            instance.service,
            instance.state,
            instance
                .healthy
                .map_or("-", |healthy| if healthy { "healthy" } else { "unhealthy" })
        ));
        if instance.state == "running" {
            let detail = client.instance(&instance.id).await?;
            for (port, host_port) in detail.placement.map(|p| p.host_ports).unwrap_or_default() {
                urls.insert(
                    format!("{}/{port} ({})", instance.service, instance.id),
                    format!("http://127.0.0.1:{host_port}"),
                );
            }
        }
    }
    let mut screen = format!(
        "{:<20} {:<14} {:<12} HEALTH\n",
        "INSTANCE", "SERVICE", "STATE"
    );
    for row in rows {
        screen.push_str(&row);
        screen.push('\n');
    }
    for (what, url) in urls {
        screen.push_str(&format!("  {url}   {what}\n"));
    }
    Ok(screen)
}

fn say(text: &str) {
    output::line(text.trim_end());
}
