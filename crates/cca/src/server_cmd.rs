//! `cca server`: opens the store, starts the watch-fed cache, the API on
//! it and the controller runner (leader election + controllers); stops
//! gracefully on Ctrl-C or SIGTERM. Wiring only — the API lives in `cca-api`, the cache and the
//! runner in `cca-control`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cca_api::{ApiConfig, ControlPlane, ControlPlaneConfig, Lane, LaneLimits, SecretKey};
use cca_control::controllers::{DisruptionConfig, NetworkConfig, SchedulerConfig};
use cca_control::runner::RunnerConfig;
use cca_model::net::Ipv4Net;
use cca_store::{Store, StoreUrl};
use clap::Args;

use cca_agent::preflight::{self, Check, Verdict};

use crate::flags;

/// `cca server [--store URL] [--listen ADDR [--insecure]]`
#[derive(Debug, Args)]
pub(crate) struct ServerArgs {
    /// The store: `embedded:DIR` (one server) or `etcd://host:port[,host:port...]` (HA).
    #[arg(long, env = "CCA_STORE", default_value = "embedded:.cca-dev/store")]
    store: StoreUrl,
    #[command(flatten)]
    etcd_tls: flags::EtcdTlsArgs,
    /// The cluster's trust (`cca init`): with a CA there, the API serves
    /// HTTPS and every caller needs a client certificate of that CA;
    /// without one, plain HTTP on loopback only.
    #[arg(long, env = "CCA_CONFIG_DIR", default_value = cca_trust::config_dir::DEFAULT_DIR)]
    config_dir: PathBuf,
    /// Also accept ID tokens of this OIDC issuer (its discovery document
    /// and keys are fetched at start and every 10 minutes); the user is the
    /// token's `sub`. Needs a cluster CA and --oidc-audience.
    #[arg(long, value_name = "URL", requires = "oidc_audience")]
    oidc_issuer: Option<String>,
    /// The audience (client id) the issuer's ID tokens must carry.
    #[arg(long, value_name = "ID", requires = "oidc_issuer")]
    oidc_audience: Option<String>,
    /// Address the API listens on (port 0 picks a free port; the address
    /// is printed on stderr).
    #[arg(long, env = "CCA_LISTEN", default_value = cca_wire::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Without a cluster CA in --config-dir, listen on an address other
    /// than loopback anyway: plain HTTP has no authentication, so anyone
    /// who reaches it controls the cluster. (With a CA the server serves
    /// HTTPS and listens anywhere.)
    #[arg(long)]
    insecure: bool,
    /// How long events are kept (`30m`, `1h`, `1d`).
    #[arg(long, default_value = "1h", value_name = "DURATION", value_parser = flags::duration)]
    event_retention: Duration,
    /// This server's name in the leader record (default: hostname-pid).
    #[arg(long)]
    server_id: Option<String>,
    /// Leadership lapses this long after the leader stops renewing it;
    /// a standby server takes over then.
    #[arg(long, default_value = "8s", value_name = "DURATION", value_parser = flags::duration)]
    leader_ttl: Duration,
    /// A node whose agent stops heartbeating is unreachable after this
    /// long, while the fleet's heartbeats fit --heartbeats-per-second.
    #[arg(long, default_value = "6s", value_name = "DURATION", value_parser = flags::duration)]
    node_ttl: Duration,
    /// The heartbeats a second the whole fleet may send: past what
    /// --node-ttl leases would send, leases last longer, in steps of 1.5×
    /// (docs/operations.md "Node leases").
    #[arg(long, default_value = "1500", value_name = "N")]
    heartbeats_per_second: std::num::NonZeroU32,
    /// Nothing is placed for this long after becoming leader, so agents of
    /// a (re)starting cluster can report in first.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = flags::duration)]
    startup_grace: Duration,
    /// Instances on a node unreachable this long (after its lease
    /// expired) are replaced elsewhere.
    #[arg(long, default_value = "2s", value_name = "DURATION", value_parser = flags::duration)]
    lost_grace: Duration,
    /// An autoscaled service scales down only to the highest replica count
    /// recommended within this long.
    #[arg(long, default_value = "5m", value_name = "DURATION", value_parser = flags::duration)]
    scale_down_window: Duration,
    /// Vertical autoscaling recommends from the usage of this long (one
    /// sample per sixtieth of it).
    #[arg(long, default_value = "1h", value_name = "DURATION", value_parser = flags::duration)]
    vertical_window: Duration,
    /// The host ports the scheduler hands out to instances, per node,
    /// lowest free first (ports a node's agent finds held by something
    /// outside the cluster are skipped on that node).
    #[arg(long, default_value = "20000-32767", value_name = "FIRST-LAST", value_parser = flags::port_range)]
    host_ports: std::ops::RangeInclusive<u16>,
    /// Also serve agents' registrations and heartbeats on this address,
    /// on a thread of its own, so that they never wait behind the rest of
    /// the API's work; agents reach it with `cca agent --liveness-server`.
    /// The same loopback rule as `--listen` applies.
    #[arg(long, value_name = "ADDR")]
    liveness_listen: Option<SocketAddr>,
    /// Pause lost-node replacement when more than this percentage of the
    /// nodes miss their leases within one node TTL: so many at once points
    /// at the control plane, the store or the network, not at the nodes.
    #[arg(long, default_value_t = 33, value_name = "PERCENT",
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pause_replacement_above: u32,
    /// Pause it also when more than this many nodes miss their leases
    /// within one node TTL (default: the percentage alone decides).
    #[arg(long, value_name = "NODES")]
    pause_replacement_nodes: Option<u32>,
    /// End a pause on its own once no further node went missing for this
    /// long (the control plane is then healthy, so the missing nodes are
    /// gone); `never`: only returning heartbeats or
    /// `cca nodes resume-replacement` end it.
    #[arg(long, default_value = "60s", value_name = "DURATION|never",
          value_parser = flags::duration_or_never)]
    resume_replacement_after: flags::SpanOrNever,
    /// One admission lane's limits, `LANE=IN_FLIGHT,QUEUED,TIMEOUT`
    /// (repeatable; lanes: liveness, reports, user, bulk): requests served
    /// at once, requests waiting, and how long one waits before a 429.
    /// A cluster of N nodes wants at least N in flight and queued in
    /// `liveness` and `reports`. Default: see docs/api.md.
    #[arg(long = "api-lane", value_name = "LANE=IN_FLIGHT,QUEUED,TIMEOUT", value_parser = flags::api_lane)]
    api_lanes: Vec<(Lane, LaneLimits)>,
    #[command(flatten)]
    secret_keys: crate::secret_keys::SecretKeyArgs,
    #[command(flatten)]
    network: NetworkArgs,
    /// Where the server answers DNS for the cluster (`{svc}.cca.local`,
    /// other names forwarded to this host's resolvers). A port already
    /// taken is a warning, not a failure: the API matters more.
    #[arg(long, default_value = "127.0.0.1:15353", value_name = "ADDR")]
    dns_listen: SocketAddr,
}

/// The address plan: where node subnets and service VIPs come from.
#[derive(Debug, Args)]
pub(crate) struct NetworkArgs {
    /// Every node gets a subnet of this range for its instances.
    #[arg(long, default_value = "10.42.0.0/16", value_name = "CIDR")]
    cluster_cidr: Ipv4Net,
    /// The prefix length of each node's subnet (24: 254 instance
    /// addresses per node, 256 nodes in a /16).
    #[arg(long, default_value_t = 24, value_name = "LENGTH",
          value_parser = clap::value_parser!(u8).range(1..=30))]
    node_subnet_size: u8,
    /// Every service with ports gets a virtual IP from this range.
    #[arg(long, default_value = "10.43.0.0/16", value_name = "CIDR")]
    service_cidr: Ipv4Net,
}

impl NetworkArgs {
    /// The plan, checked: the ranges must be usable and disjoint.
    pub(crate) fn config(&self) -> Result<NetworkConfig> {
        let config = NetworkConfig {
            cluster_cidr: self.cluster_cidr,
            node_prefix: self.node_subnet_size,
            service_cidr: self.service_cidr,
            ..NetworkConfig::default()
        };
        config.validate()?;
        Ok(config)
    }
}

/// Refuses an API address other than loopback unless `insecure` says the
/// operator accepts the risk; for plain HTTP only (a server with a
/// cluster CA serves HTTPS with certificates and listens anywhere): plain
/// HTTP has no authentication, so whoever reaches it can run commands on
/// every node.
/// With `insecure`, it says so on stderr and allows it.
pub(crate) fn check_listen(address: SocketAddr, insecure: bool) -> Result<()> {
    if address.ip().to_canonical().is_loopback() {
        return Ok(());
    }
    if !insecure {
        anyhow::bail!(
            "refusing to listen on {address}: without a cluster CA (run `cca init`, then pass its \
             --config-dir) the API serves plain HTTP without authentication, so anyone who can \
             reach that address could run commands on this cluster's nodes; listen on loopback \
             (--listen 127.0.0.1:{port} or [::1]:{port}), or pass --insecure to serve on \
             {address} anyway",
            port = address.port()
        );
    }
    warn_insecure(address);
    Ok(())
}

#[allow(
    clippy::print_stderr,
    reason = "the operator must see this whatever RUST_LOG says"
)]
fn warn_insecure(address: SocketAddr) {
    eprintln!(
        "warning: --insecure: the API listens on {address} without TLS or authentication; anyone who can reach it controls the cluster"
    );
}

pub(crate) fn run(args: ServerArgs) -> Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(serve(args))?;
    Ok(ExitCode::SUCCESS)
}

async fn serve(args: ServerArgs) -> Result<()> {
    // Pre-flight: the certificates and keys, before anything else.
    let mut trust = load_trust(&args.config_dir)?;
    let mut tokens = trust.as_mut().and_then(|trust| trust.tokens.take());
    if let (Some(issuer), Some(audience)) = (&args.oidc_issuer, &args.oidc_audience) {
        let Some(ours) = tokens.take() else {
            bail!(
                "--oidc-issuer needs a cluster CA in {} (`cca init`): tokens are only accepted over HTTPS",
                args.config_dir.display()
            );
        };
        let issuer = cca_api::oidc::OidcIssuer {
            issuer: issuer.trim_end_matches('/').to_owned(),
            audience: audience.clone(),
        };
        let verifier = issuer
            .verifier()
            .await
            .with_context(|| format!("trusting the OIDC issuer {}", issuer.issuer))?;
        tokens = Some(ours.with_oidc(issuer, verifier));
    }
    // Dropped when `serve` returns, which stops the renewal.
    let (_renewing, renewal_stopping) = tokio::sync::watch::channel(false);
    if let Some(renewal) = trust.as_mut().and_then(|trust| trust.renewal.take()) {
        announce_certificate(&renewal.current);
        tokio::spawn(cca_api::renewal::keep_renewed(renewal, renewal_stopping));
    }
    if trust.is_none() {
        check_listen(args.listen, args.insecure)?;
    }
    if let Some(liveness) = args.liveness_listen
        && trust.is_none()
    {
        check_listen(liveness, args.insecure)?;
    }
    let network = args.network.config()?;
    // Before the store: a bad key must not cost a store open.
    let secret_key = args.secret_keys.load(&args.store)?;
    let store = args
        .etcd_tls
        .open(&args.store)
        .await
        .with_context(|| format!("opening the store {:?}", args.store))?;
    let scheduler = SchedulerConfig {
        startup_grace: args.startup_grace,
        lost_grace: args.lost_grace,
        host_ports: args.host_ports.clone(),
        ..SchedulerConfig::default()
    };
    let setup = ControlPlaneConfig {
        runner: runner_config(&args),
        scheduler,
        lifecycle: cca_control::controllers::LifecycleConfig {
            scale_down_window: args.scale_down_window,
            vertical_window: args.vertical_window,
        },
        disruption: DisruptionConfig {
            max_missing_percent: args.pause_replacement_above,
            max_missing_nodes: args.pause_replacement_nodes,
            resume_after: args.resume_replacement_after.0,
        },
        network,
        api: api_config(&args, trust.is_some()),
        secret_key: Some(secret_key),
        authority: trust.as_ref().map(|trust| Arc::clone(&trust.authority)),
        tokens,
        agent_tls: trust.as_ref().map(|trust| trust.agent_tls.clone()),
        compiler: Some(Arc::new(crate::console::DslCompiler)),
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let address = listener
        .local_addr()
        .context("reading the listen address")?;
    let listener = match &trust {
        Some(trust) => cca_api::ApiListener::Tls(
            cca_api::TlsListener::new(listener, &trust.tls)
                .context("preparing the TLS listener")?,
        ),
        None => cca_api::ApiListener::Plain(listener),
    };
    announce(address, trust.is_some());
    let liveness = match args.liveness_listen {
        Some(address) => {
            let listener = std::net::TcpListener::bind(address)
                .with_context(|| format!("listening on {address}"))?;
            listener
                .set_nonblocking(true)
                .context("preparing the liveness listener")?;
            Some(Liveness {
                listener,
                tls: trust.as_ref().map(|trust| trust.tls.clone()),
            })
        }
        None => None,
    };
    let dns = Some(args.dns_listen);
    run_control_plane(store, setup, listener, liveness, dns, shutdown_signal()).await
}

/// Serves the liveness routes on `listener` on a thread and runtime of
/// their own until `stop` turns true.
/// The liveness listener and, when the API serves HTTPS, its TLS (the
/// same certificate and client-certificate checks as the main listener).
pub(crate) struct Liveness {
    listener: std::net::TcpListener,
    tls: Option<cca_api::ServerTls>,
}

fn spawn_liveness(
    liveness: Liveness,
    state: cca_api::ApiState,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<std::thread::JoinHandle<()>> {
    let Liveness { listener, tls } = liveness;
    let address = listener
        .local_addr()
        .context("reading the liveness address")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the liveness runtime")?;
    announce_liveness(address, tls.is_some());
    std::thread::Builder::new()
        .name("cca-liveness".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match liveness_listener(listener, tls.as_ref()) {
                    Ok(listener) => listener,
                    Err(error) => {
                        tracing::error!(%error, "the liveness listener failed");
                        return;
                    }
                };
                let stopped = async move {
                    let _ = stop.wait_for(|stop| *stop).await;
                };
                if let Err(error) = cca_api::serve_liveness(listener, state, stopped).await {
                    tracing::error!(%error, "serving liveness failed");
                }
            });
        })
        .context("starting the liveness thread")
}

#[allow(
    clippy::print_stderr,
    reason = "tells the operator (and tests) where agents send heartbeats"
)]
fn announce_liveness(address: SocketAddr, tls: bool) {
    tracing::info!(%address, tls, "liveness listener");
    let scheme = if tls { "https" } else { "http" };
    eprintln!("cca server serving registrations and heartbeats on {scheme}://{address}");
}

/// The liveness listener on this thread's runtime, with TLS when given.
fn liveness_listener(
    listener: std::net::TcpListener,
    tls: Option<&cca_api::ServerTls>,
) -> std::io::Result<cca_api::ApiListener> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    Ok(match tls {
        Some(tls) => cca_api::ApiListener::Tls(cca_api::TlsListener::new(listener, tls)?),
        None => cca_api::ApiListener::Plain(listener),
    })
}

/// The API's settings: the defaults and what the flags change.
fn api_config(args: &ServerArgs, tls: bool) -> ApiConfig {
    let mut config = ApiConfig {
        event_retention: args.event_retention,
        node_leases: cca_model::node_lease::NodeLeases {
            shortest: args.node_ttl,
            heartbeats_per_s: args.heartbeats_per_second,
        },
        authentication: if tls {
            cca_api::auth::Authentication::Certificates
        } else {
            cca_api::auth::Authentication::Open
        },
        ..ApiConfig::default()
    };
    for (lane, limits) in &args.api_lanes {
        *config.lanes.get_mut(*lane) = *limits;
    }
    config
}

/// Reads the cluster's secret key, creating it when absent.
pub(crate) fn load_secret_key(path: &Path) -> Result<SecretKey> {
    let (key, created) = SecretKey::load_or_create(path)?;
    if created {
        tracing::info!(path = %path.display(), key = key.id(), "created a new secret key");
    }
    Ok(key)
}

/// Runs cache, runner and API on `listener` until `shutdown` resolves,
/// then stops the runner (which resigns leadership).
/// Runs the control plane over `store` and serves its API on `listener`
/// until `shutdown`; then stops the controllers (resigning leadership).
pub(crate) async fn run_control_plane(
    store: Arc<dyn Store>,
    setup: ControlPlaneConfig,
    listener: impl Into<cca_api::ApiListener>,
    liveness: Option<Liveness>,
    dns: Option<SocketAddr>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let plane = ControlPlane::start(store, setup)
        .await
        .context("reading the store into the cache")?;
    let (stop_dns, dns_stopping) = tokio::sync::watch::channel(false);
    if let Some(address) = dns {
        tokio::spawn(serve_dns(address, plane.state().clone(), dns_stopping));
    }
    let (stop_liveness, liveness_stopping) = tokio::sync::watch::channel(false);
    let liveness = match liveness {
        Some(listener) => Some(spawn_liveness(
            listener,
            plane.state().clone(),
            liveness_stopping,
        )?),
        None => None,
    };
    let served = plane.serve(listener, shutdown).await;
    stop_liveness.send_replace(true);
    if let Some(thread) = liveness {
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
    stop_dns.send_replace(true);
    served.context("serving the API")?;
    plane.stop().await;
    Ok(())
}

/// Answers the cluster's names on `address` from the server's own network
/// map until `stop`. Failing to bind is logged, not fatal.
async fn serve_dns(
    address: SocketAddr,
    state: cca_api::ApiState,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut maps = state.network_maps().await;
    let first = Arc::new(maps.borrow_and_update().clone());
    let server = match cca_dns::DnsServer::bind(cca_dns::DnsConfig::new(vec![address]), first).await
    {
        Ok(server) => server,
        Err(error) => {
            tracing::warn!(%address, %error, "not serving cluster DNS");
            return;
        }
    };
    tracing::info!(%address, "cluster DNS listening");
    let dns = server.handle();
    let mut stopping = stop.clone();
    let running = tokio::spawn(server.run(async move {
        let _ = stopping.wait_for(|stop| *stop).await;
    }));
    loop {
        tokio::select! {
            changed = maps.changed() => if changed.is_err() { break },
            _ = stop.wait_for(|stop| *stop) => break,
        }
        dns.set_map(Arc::new(maps.borrow_and_update().clone()));
    }
    if let Ok(Err(error)) = running.await {
        tracing::warn!(%error, "the cluster DNS server stopped");
    }
}

#[allow(
    clippy::print_stderr,
    reason = "tells the operator (and tests) where the server listens"
)]
fn announce(address: SocketAddr, tls: bool) {
    tracing::info!(%address, tls, "API server listening");
    let scheme = if tls { "https" } else { "http" };
    eprintln!("cca server listening on {scheme}://{address}");
}

/// Says how long the server's certificate has left and when it renews.
fn announce_certificate(certificate: &cca_trust::pki::CertInfo) {
    let now = cca_model::clock::system_now();
    let left = certificate
        .not_after
        .duration_since(now)
        .unwrap_or_default();
    tracing::info!(
        serial = %certificate.serial,
        expires = %humantime::format_rfc3339_seconds(certificate.not_after),
        days_left = left.as_secs() / 86_400,
        renews = %humantime::format_rfc3339_seconds(certificate.renew_at()),
        "the server's certificate (renewed by this server, with the CA key in its config directory)"
    );
}

/// The TLS settings from `config_dir` when `cca init` made a CA there,
/// checked (certificate chain and validity, key permissions and fit),
/// and the renewal of the server's certificate; `None` when it holds no
/// CA.
pub(crate) fn load_trust(config_dir: &std::path::Path) -> Result<Option<Trust>> {
    let config = cca_trust::config_dir::ConfigDir::new(config_dir);
    if !config.has_ca() {
        return Ok(None);
    }
    let files = config
        .load_server(cca_model::clock::system_now())
        .context("checking the server's certificates")?;
    let certificate = Arc::new(cca_api::ServerCertificate::from_pem(
        &files.chain_pem,
        &files.key_pem,
    )?);
    let tls = cca_api::ServerTls::new(files.ca.cert_pem(), Arc::clone(&certificate))?;
    // Server certificates carry clientAuth: the same one calls agents.
    let agent_tls = cca_wire::tls::ClientTls::new(files.ca.cert_pem())
        .with_certificate(Arc::clone(&certificate));
    let token_key = config
        .load_token_key()
        .context("loading the user-token signing key")?;
    // The CA's fingerprint names the issuer: another cluster's tokens
    // are refused even before their signature is.
    let tokens =
        cca_api::auth::TokenAuthority::new(token_key, format!("cca:{}", files.ca.fingerprint()));
    let authority = Arc::new(files.ca);
    let renewal = cca_api::renewal::ServerRenewal {
        dir: config,
        ca: Arc::clone(&authority),
        key_pem: files.key_pem,
        presented: certificate,
        current: files.certificate,
        clock: Arc::new(cca_model::clock::system_now),
    };
    Ok(Some(Trust {
        tls,
        agent_tls,
        authority,
        tokens: Some(tokens),
        renewal: Some(renewal),
    }))
}

/// What a server with a cluster CA serves with: HTTPS, the TLS it calls
/// agents with, and the CA that enrols nodes.
pub(crate) struct Trust {
    pub(crate) tls: cca_api::ServerTls,
    pub(crate) agent_tls: cca_wire::tls::ClientTls,
    pub(crate) authority: Arc<cca_trust::pki::ClusterCa>,
    /// Taken by the control plane's setup.
    pub(crate) tokens: Option<cca_api::auth::TokenAuthority>,
    /// Keeps the server's certificate fresh; taken by `cca server`.
    pub(crate) renewal: Option<cca_api::renewal::ServerRenewal>,
}

/// What the control plane runs beside the API.
fn runner_config(args: &ServerArgs) -> RunnerConfig {
    let id = match &args.server_id {
        Some(id) => id.clone(),
        None => format!("{}-{}", hostname(), std::process::id()),
    };
    let mut config = RunnerConfig::new(id);
    config.leader.ttl = args.leader_ttl;
    config
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "cca-server".to_owned())
}

/// Resolves on Ctrl-C or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
    tracing::info!("shutting down");
}

/// `cca readiness server …`: what starting `cca server` with these flags
/// needs, checked without starting it: the certificates, the secret key,
/// the store (reachable; an embedded one not held by a running server),
/// its disk, and the ports it would listen on.
pub(crate) async fn readiness(args: &ServerArgs) -> Vec<Check> {
    let now = cca_model::clock::system_now();
    let mut checks = trust_readiness(args, now);
    checks.push(args.secret_keys.readiness(&args.store));
    if let StoreUrl::Embedded(dir) = &args.store {
        checks.push(preflight::data_dir("store directory", dir));
        checks.push(preflight::disk_space("disk", dir));
    }
    checks.push(store_readiness(args).await);
    checks.push(preflight::tcp_port_free("API port", args.listen));
    if let Some(liveness) = args.liveness_listen {
        checks.push(preflight::tcp_port_free("liveness port", liveness));
    }
    checks.push(preflight::udp_port_free("DNS port", args.dns_listen));
    checks
}

/// The cluster CA and the server's certificate, or what serving without
/// them means.
fn trust_readiness(args: &ServerArgs, now: std::time::SystemTime) -> Vec<Check> {
    let config = cca_trust::config_dir::ConfigDir::new(&args.config_dir);
    if !config.has_ca() {
        let listen = match check_listen(args.listen, true) {
            Ok(()) if args.listen.ip().to_canonical().is_loopback() || args.insecure => Check::new(
                "certificates",
                Verdict::Warn,
                format!(
                    "no cluster CA in {}: the API serves plain HTTP without authentication \
                         (`cca init` makes one)",
                    args.config_dir.display()
                ),
            ),
            _ => Check::new(
                "certificates",
                Verdict::Fail,
                format!(
                    "no cluster CA in {} and --listen {} is not loopback: the server refuses \
                     to serve plain HTTP there (run `cca init`, or pass --insecure)",
                    args.config_dir.display(),
                    args.listen
                ),
            ),
        };
        return vec![listen];
    }
    let files = match config.load_server(now) {
        Ok(files) => files,
        Err(error) => return vec![Check::new("certificates", Verdict::Fail, error.to_string())],
    };
    let mut checks = vec![preflight::certificate(
        "server certificate",
        "the server's certificate",
        &files.certificate,
        now,
    )];
    match cca_trust::pki::CertInfo::parse(files.ca.cert_pem()) {
        Ok(ca) => checks.push(preflight::certificate(
            "cluster CA",
            "the cluster CA",
            &ca,
            now,
        )),
        Err(error) => checks.push(Check::new("cluster CA", Verdict::Fail, error.to_string())),
    }
    checks
}

/// How long the store has to answer.
const STORE_READINESS_TIMEOUT: Duration = Duration::from_secs(5);

/// The store answers (etcd), or opens (an embedded one that exists: it
/// fails while a running server holds it); a missing embedded store is
/// not created.
async fn store_readiness(args: &ServerArgs) -> Check {
    const NAME: &str = "store";
    if let StoreUrl::Embedded(dir) = &args.store
        && !dir.join(cca_store::embedded::FILE_NAME).exists()
    {
        return Check::new(
            NAME,
            Verdict::Pass,
            format!("a new embedded store will be created in {}", dir.display()),
        );
    }
    let probed = tokio::time::timeout(STORE_READINESS_TIMEOUT, async {
        let store = args.etcd_tls.open(&args.store).await?;
        let identity = store.get(&cca_model::keys::store_identity()).await?;
        let revision = store.current_revision().await?;
        anyhow::Ok((identity, revision))
    })
    .await;
    match probed {
        Ok(Ok((identity, revision))) => {
            let id = identity
                .and_then(|kv| {
                    serde_json::from_slice::<cca_model::recovery::StoreIdentity>(&kv.value).ok()
                })
                .map_or_else(|| "no identity yet".to_owned(), |identity| identity.id);
            Check::new(
                NAME,
                Verdict::Pass,
                format!("{} answers at revision {revision} ({id})", args.store),
            )
        }
        Ok(Err(error)) => Check::new(NAME, Verdict::Fail, format!("{}: {error:#}", args.store)),
        Err(_) => Check::new(
            NAME,
            Verdict::Fail,
            format!(
                "{} did not answer within {} s",
                args.store,
                STORE_READINESS_TIMEOUT.as_secs()
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses_are_allowed_without_insecure() {
        for address in [
            "127.0.0.1:9770",
            "127.0.0.2:0",
            "[::1]:9770",
            "[::ffff:127.0.0.1]:1",
        ] {
            let address: SocketAddr = address.parse().expect("an address");
            check_listen(address, false).unwrap_or_else(|e| panic!("{address}: {e}"));
        }
    }

    #[test]
    fn other_addresses_need_insecure() {
        for address in [
            "0.0.0.0:9770",
            "10.0.0.5:9770",
            "[::]:9770",
            "[2001:db8::1]:80",
        ] {
            let address: SocketAddr = address.parse().expect("an address");
            let error = check_listen(address, false)
                .expect_err("refused")
                .to_string();
            assert!(
                error.starts_with(&format!(
                    "refusing to listen on {address}: without a cluster CA"
                )) && error.contains("cca init"),
                "{error}"
            );
            assert!(error.contains("pass --insecure"), "{error}");
            check_listen(address, true).unwrap_or_else(|e| panic!("{address}: {e}"));
        }
    }

    #[test]
    fn the_leader_lease_flag_defaults_to_the_control_planes_default() {
        #[derive(clap::Parser)]
        struct Server {
            #[command(flatten)]
            args: ServerArgs,
        }
        let server = <Server as clap::Parser>::try_parse_from(["cca-server"]).expect("defaults");
        assert_eq!(
            server.args.leader_ttl,
            cca_control::leader::LeaderConfig::DEFAULT_TTL
        );
    }

    #[test]
    fn the_node_lease_flags_default_to_the_apis_defaults() {
        #[derive(clap::Parser)]
        struct Server {
            #[command(flatten)]
            args: ServerArgs,
        }
        let server = <Server as clap::Parser>::try_parse_from(["cca-server"]).expect("defaults");
        let defaults = cca_model::node_lease::NodeLeases::default();
        assert_eq!(server.args.node_ttl, defaults.shortest);
        assert_eq!(server.args.heartbeats_per_second, defaults.heartbeats_per_s);
        let refused = <Server as clap::Parser>::try_parse_from([
            "cca-server",
            "--heartbeats-per-second",
            "0",
        ]);
        assert!(refused.is_err(), "a budget of 0 is refused");
    }
}
