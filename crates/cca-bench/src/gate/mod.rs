//! `cca benchmark gate`: the gate proxy against nginx (Debian's package)
//! configured as a reverse proxy to the same backends, side by side in
//! one run. Every party is a process of its own, so they compete for the
//! same CPUs the same way and each one's memory is its own:
//!
//! - the backends: one nginx with a `return 200` server block per port
//!   (a small fixed body, no access log), measured directly too
//!   ("direct": the ceiling a proxy in front of them cannot pass);
//! - the gate: `cca benchmark gate --serve-gate` ([`BenchGate`]), the
//!   same `cca_gate::Gate::serve` a gate node runs, access log off, with
//!   as many tokio worker threads as nginx has worker processes;
//! - the peer: nginx with an upstream of those backends kept alive, the
//!   forwarding headers the gate adds, access log off; once as Debian's
//!   nginx runs by default (`nginx`, the figure the gate is held to) and
//!   once tuned for many cores (`nginx-tuned`: `reuseport` and
//!   `worker_cpu_affinity auto`, see [`nginx::Tuning`]);
//! - the load: h2load with 64 keep-alive connections, HTTP/1.1 and (with
//!   `http2`) HTTP/2 without TLS, alternating gate, nginx, tuned nginx
//!   and direct runs round after round (each round starting one further
//!   along), so drift in the machine's load spreads over all; a run during
//!   which processes outside the benchmark kept more than
//!   [`DISTURBED_CORES`] busy (a neighbour on a shared machine) is kept
//!   in the report but left out of the figures;
//! - idle memory: this process opens N keep-alive connections to a proxy,
//!   sends one request on each and holds them, and reads the proxy's RSS
//!   and PSS before and after (nginx: its workers summed).
//!
//! The processes are stopped however the run ends ([`procs::Process`]).

mod h2load;
mod nginx;
mod procs;
mod serve;

use std::io::{BufRead, Read};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

pub use h2load::Load;
pub use serve::BenchGate;

use crate::BenchError;
use crate::scenario::Progress;
use h2load::Protocol;
use nginx::{ProxyAt, Tuning};
use procs::{Memory, Process};

/// What the gate process prints on stdout once it listens.
pub const GATE_LISTENING: &str = "gate listening on ";
/// Longest wait for a process of the benchmark to answer its first request.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long idle connections sit before the memory is read (the proxies
/// free what a request needed once it is answered).
const SETTLE: Duration = Duration::from_secs(1);

/// How `cca benchmark gate` runs.
#[derive(Clone, Debug)]
pub struct GateBenchConfig {
    /// The `cca` binary whose `benchmark gate --serve-gate` serves the gate.
    pub cca: PathBuf,
    /// Backend servers (ports of the backends' nginx).
    pub backends: usize,
    /// nginx's `worker_processes` and the gate's worker threads (both
    /// proxies and the backends).
    pub workers: usize,
    /// h2load's concurrent keep-alive connections.
    pub connections: usize,
    pub load: Load,
    /// Runs of each target (per protocol).
    pub rounds: usize,
    /// HTTP/2 (cleartext) runs as well as HTTP/1.1.
    pub http2: bool,
    /// Idle keep-alive connections held for the memory figure.
    pub idle_connections: usize,
    /// The gate keeps each worker to a CPU of its own (its default).
    pub pin_workers: bool,
}

impl GateBenchConfig {
    /// The defaults of `cca benchmark gate`: 2 backends, a worker per
    /// core, 64 connections, 10 s measured after 2 s of warm-up, 7
    /// rounds, HTTP/1.1 and HTTP/2, 10,000 idle connections.
    pub fn new(cca: PathBuf) -> Self {
        Self {
            cca,
            backends: 2,
            workers: cores(),
            connections: 64,
            load: Load::For {
                measured: Duration::from_secs(10),
                warm_up: Duration::from_secs(2),
            },
            rounds: 7,
            http2: true,
            idle_connections: 10_000,
            pin_workers: true,
        }
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, std::num::NonZero::get)
}

/// What `cca benchmark gate` measured.
#[derive(Clone, Debug, Serialize)]
pub struct GateReport {
    pub cores: usize,
    /// `nginx -v` and `h2load --version`.
    pub nginx: String,
    pub h2load: String,
    pub backends: usize,
    pub workers: usize,
    /// The gate's workers were each kept to a CPU of their own.
    pub gate_pinned: bool,
    pub connections: usize,
    pub rounds: usize,
    /// Neither proxy writes an access log.
    pub access_log: bool,
    pub load: Vec<LoadFigures>,
    pub idle: Vec<IdleFigures>,
    /// The gate's medians over each nginx's, per protocol.
    pub compared: Vec<Comparison>,
}

/// One target's runs under one protocol.
#[derive(Clone, Debug, Serialize)]
pub struct LoadFigures {
    pub protocol: String,
    /// `gate`, `nginx`, `nginx-tuned` or `direct` (the first backend, no
    /// proxy).
    pub target: String,
    /// Over the runs counted (see [`counted`]).
    pub rps: Spread,
    pub p99_ms: Spread,
    /// How many runs the spreads are over.
    pub counted: usize,
    pub runs: Vec<LoadRun>,
}

impl LoadFigures {
    /// A target's figures over its runs that count (see [`counted`]).
    pub fn of(protocol: &str, target: &str, runs: Vec<LoadRun>) -> Self {
        let chosen = counted(&runs);
        Self {
            protocol: protocol.into(),
            target: target.into(),
            rps: Spread::of(chosen.iter().map(|run| run.rps).collect()),
            p99_ms: Spread::of(chosen.iter().map(|run| run.p99_ms).collect()),
            counted: chosen.len(),
            runs,
        }
    }
}

/// The runs a target's figures are made of: the undisturbed ones, or all
/// of them when every one was disturbed (the figures then say so by
/// their spread, and the report by its note).
pub fn counted(runs: &[LoadRun]) -> Vec<&LoadRun> {
    let quiet: Vec<&LoadRun> = runs.iter().filter(|run| !run.disturbed).collect();
    if quiet.is_empty() {
        runs.iter().collect()
    } else {
        quiet
    }
}

/// One h2load run.
#[derive(Clone, Debug, Serialize)]
pub struct LoadRun {
    pub round: usize,
    /// Measured (warm-up excluded).
    pub seconds: f64,
    pub rps: f64,
    pub requests: u64,
    pub succeeded: u64,
    /// Requests answered with a status other than 2xx.
    pub non_2xx: u64,
    /// Failed, errored or timed out in h2load's count.
    pub failed: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Cores each party used on average over the run (warm-up included).
    pub cpu: CpuShare,
    /// Processes outside the benchmark kept more than [`DISTURBED_CORES`]
    /// busy: the run is left out of its target's figures.
    pub disturbed: bool,
}

/// Cores that processes outside the benchmark (another tenant of the
/// machine) may keep busy before a run counts as disturbed: on two cores
/// the parties use nearly all of, such a run measures the neighbour as
/// much as the proxy. Quiet runs show under 0.1 (the benchmark's own
/// sampling, kernel threads).
pub const DISTURBED_CORES: f64 = 0.2;

/// CPU in cores (CPU seconds per second of the run).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CpuShare {
    /// The gate, or nginx's workers (nothing for `direct`).
    pub proxy: f64,
    /// The backends' nginx workers.
    pub backends: f64,
    /// h2load (sampled every 100 ms: the last sample before it exits).
    pub client: f64,
    /// The whole machine, every process included.
    pub machine: f64,
}

impl CpuShare {
    /// Cores processes outside the benchmark used.
    pub fn elsewhere(&self) -> f64 {
        (self.machine - self.proxy - self.backends - self.client).max(0.0)
    }

    /// Whether processes outside the benchmark used more than
    /// [`DISTURBED_CORES`] (the machine's share measured at all).
    pub fn disturbed(&self) -> bool {
        self.machine > 0.0 && self.elsewhere() > DISTURBED_CORES
    }
}

/// Smallest, median and largest of a figure over the rounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    fn of(mut values: Vec<f64>) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        values.sort_by(f64::total_cmp);
        let middle = values.len() / 2;
        let median = if values.len() % 2 == 1 {
            values[middle]
        } else {
            (values[middle - 1] + values[middle]) / 2.0
        };
        Self {
            min: values[0],
            median,
            max: values[values.len() - 1],
        }
    }
}

/// A proxy's memory with idle keep-alive connections open.
#[derive(Clone, Debug, Serialize)]
pub struct IdleFigures {
    /// `gate` or `nginx` (its workers summed).
    pub target: String,
    pub connections: usize,
    pub answered_2xx: usize,
    pub failed: usize,
    pub rss_before: u64,
    pub rss_after: u64,
    pub pss_before: Option<u64>,
    pub pss_after: Option<u64>,
    pub rss_per_connection: f64,
    pub pss_per_connection: Option<f64>,
}

/// The gate against one nginx under one protocol.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub protocol: String,
    /// `nginx` (Debian's defaults) or `nginx-tuned`.
    pub peer: String,
    /// The gate's median requests per second over nginx's (≥ 1: the gate
    /// is at least as fast).
    pub rps_ratio: f64,
    /// The gate's median p99 over nginx's (≤ 1: the gate's tail is no
    /// longer).
    pub p99_ratio: f64,
    /// The same figures round by round: each round's gate run over the
    /// same round's nginx run, which ran within seconds of it. Drift of a
    /// shared machine (its ceiling moves by a quarter from one minute to
    /// the next) moves both runs of a round alike, so these spread less
    /// than the runs themselves and say more than a ratio of medians.
    pub paired: PairedRatios,
}

/// Per-round ratios of the gate's figures over nginx's (rounds where both
/// runs count, see [`counted`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PairedRatios {
    pub rounds: usize,
    /// Gate req/s over nginx req/s.
    pub rps: Spread,
    /// Gate p99 over nginx p99.
    pub p99: Spread,
    /// Rounds where the gate answered at least as many requests a second.
    pub rps_at_least_nginx: usize,
    /// Rounds where the gate's p99 was no longer than nginx's.
    pub p99_at_most_nginx: usize,
    /// CPU each proxy spent a request, in microseconds (its cores over
    /// its req/s, median over the rounds): what a proxy costs, apart from
    /// how much of the machine it got.
    pub gate_cpu_us_per_request: f64,
    pub nginx_cpu_us_per_request: f64,
}

impl Comparison {
    /// The gate's runs against an nginx's under one protocol.
    pub fn of(protocol: &str, gate: &LoadFigures, nginx: &LoadFigures) -> Self {
        Self {
            protocol: protocol.into(),
            peer: nginx.target.clone(),
            rps_ratio: gate.rps.median / nginx.rps.median.max(f64::MIN_POSITIVE),
            p99_ratio: gate.p99_ms.median / nginx.p99_ms.median.max(f64::MIN_POSITIVE),
            paired: PairedRatios::of(&counted(&gate.runs), &counted(&nginx.runs)),
        }
    }
}

impl PairedRatios {
    fn of(gate: &[&LoadRun], nginx: &[&LoadRun]) -> Self {
        let pairs: Vec<(&LoadRun, &LoadRun)> = gate
            .iter()
            .filter_map(|g| Some((*g, *nginx.iter().find(|n| n.round == g.round)?)))
            .filter(|(g, n)| g.rps > 0.0 && n.rps > 0.0 && g.p99_ms > 0.0 && n.p99_ms > 0.0)
            .collect();
        let cpu_us = |runs: &mut dyn Iterator<Item = &LoadRun>| {
            Spread::of(runs.map(|run| run.cpu.proxy / run.rps * 1e6).collect()).median
        };
        Self {
            rounds: pairs.len(),
            rps: Spread::of(pairs.iter().map(|(g, n)| g.rps / n.rps).collect()),
            p99: Spread::of(pairs.iter().map(|(g, n)| g.p99_ms / n.p99_ms).collect()),
            rps_at_least_nginx: pairs.iter().filter(|(g, n)| g.rps >= n.rps).count(),
            p99_at_most_nginx: pairs.iter().filter(|(g, n)| g.p99_ms <= n.p99_ms).count(),
            gate_cpu_us_per_request: cpu_us(&mut pairs.iter().map(|(g, _)| *g)),
            nginx_cpu_us_per_request: cpu_us(&mut pairs.iter().map(|(_, n)| *n)),
        }
    }
}

impl GateReport {
    /// The gate's requests (and the backends' own, run directly) that did
    /// not get a 2xx, and idle connections the gate did not open and
    /// answer: any is a failed run.
    pub fn problems(&self) -> Vec<String> {
        self.shortfalls(|target| !is_peer(target))
    }

    /// The same of the peer proxies: reported, but no failure of the gate
    /// (nginx answered a request in about a million with an error in some
    /// runs; its req/s counts those).
    pub fn peer_errors(&self) -> Vec<String> {
        self.shortfalls(is_peer)
    }

    fn shortfalls(&self, of: impl Fn(&str) -> bool) -> Vec<String> {
        let mut problems = Vec::new();
        for figures in self.load.iter().filter(|figures| of(&figures.target)) {
            for run in &figures.runs {
                if run.non_2xx > 0 || run.failed > 0 || run.succeeded < run.requests {
                    problems.push(format!(
                        "{} {} round {}: {} of {} requests succeeded ({} not 2xx, {} failed)",
                        figures.target,
                        figures.protocol,
                        run.round,
                        run.succeeded,
                        run.requests,
                        run.non_2xx,
                        run.failed
                    ));
                }
            }
        }
        for idle in self.idle.iter().filter(|idle| of(&idle.target)) {
            if idle.answered_2xx < idle.connections {
                problems.push(format!(
                    "{}: {} of {} idle connections answered 2xx ({} failed)",
                    idle.target, idle.answered_2xx, idle.connections, idle.failed
                ));
            }
        }
        problems
    }
}

/// Whether a target is one of the nginx peers.
fn is_peer(target: &str) -> bool {
    Target::ALL
        .iter()
        .any(|peer| matches!(peer, Target::Nginx(_)) && peer.name() == target)
}

/// The parties of a run: where each listens and which processes are it.
struct Parties {
    dir: tempfile::TempDir,
    backends: Process,
    backend_addresses: Vec<SocketAddr>,
    gate: Process,
    gate_address: SocketAddr,
    nginx: PeerProxy,
    tuned: PeerProxy,
}

/// One nginx in front of the backends.
struct PeerProxy {
    process: Process,
    at: ProxyAt,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Gate,
    Nginx(Tuning),
    Direct,
}

impl Target {
    const ALL: [Target; 4] = [
        Target::Gate,
        Target::Nginx(Tuning::Defaults),
        Target::Nginx(Tuning::ManyCores),
        Target::Direct,
    ];

    fn name(self) -> &'static str {
        match self {
            Target::Gate => "gate",
            Target::Nginx(tuning) => tuning.name(),
            Target::Direct => "direct",
        }
    }
}

impl Parties {
    fn peer(&self, tuning: Tuning) -> &PeerProxy {
        match tuning {
            Tuning::Defaults => &self.nginx,
            Tuning::ManyCores => &self.tuned,
        }
    }

    fn address(&self, target: Target, protocol: Protocol) -> Option<SocketAddr> {
        match (target, protocol) {
            (Target::Gate, _) => Some(self.gate_address),
            (Target::Nginx(tuning), Protocol::Http1) => Some(self.peer(tuning).at.http1),
            (Target::Nginx(tuning), Protocol::Http2) => self.peer(tuning).at.http2,
            // The backends speak HTTP/1.1 only, as the proxies talk to them.
            (Target::Direct, Protocol::Http1) => self.backend_addresses.first().copied(),
            (Target::Direct, Protocol::Http2) => None,
        }
    }

    /// The processes that do a target's work.
    fn workers(&self, target: Target) -> Vec<u32> {
        match target {
            Target::Gate => vec![self.gate.id()],
            Target::Nginx(tuning) => procs::children(self.peer(tuning).process.id()),
            Target::Direct => Vec::new(),
        }
    }
}

/// Runs the benchmark; see the module documentation.
pub async fn run_gate_bench(
    config: &GateBenchConfig,
    progress: &dyn Progress,
) -> Result<GateReport, BenchError> {
    if config.backends == 0 || config.workers == 0 || config.connections == 0 || config.rounds == 0
    {
        return Err(BenchError::Config(
            "--backends, --workers, --connections and --rounds must be at least 1".into(),
        ));
    }
    let nginx = program("nginx", "nginx")?;
    let h2load = program("h2load", "nghttp2-client")?;
    // The idle connections' two ends are here and in the proxy; every
    // process started inherits the limit.
    let wanted = config.idle_connections as u64 + 2 * config.connections as u64 + 1024;
    let limit = crate::raise_open_file_limit(wanted);
    if limit < wanted {
        return Err(BenchError::Config(format!(
            "{} idle connections need an open-file limit of {wanted}, and this process may \
             raise it to {limit} only; ask for fewer with --idle-connections or raise the hard \
             limit (ulimit -Hn)",
            config.idle_connections
        )));
    }
    let versions = (version(&nginx, "-v")?, version(&h2load, "--version")?);
    progress.phase("starting the backends, the gate and nginx", 0);
    let parties = start(config, &nginx, limit).await?;
    progress.phase("idle connections", 2);
    let mut idle = Vec::new();
    for (done, target) in [Target::Gate, Target::Nginx(Tuning::Defaults)]
        .into_iter()
        .enumerate()
    {
        idle.push(idle_figures(&parties, target, config.idle_connections).await);
        progress.advance(done as u64 + 1);
    }
    let protocols: Vec<Protocol> = if config.http2 {
        vec![Protocol::Http1, Protocol::Http2]
    } else {
        vec![Protocol::Http1]
    };
    let mut runs: Vec<(Protocol, Target, LoadRun)> = Vec::new();
    let planned: Vec<(Protocol, Target)> = protocols
        .iter()
        .flat_map(|&protocol| Target::ALL.map(|target| (protocol, target)))
        .filter(|&(protocol, target)| parties.address(target, protocol).is_some())
        .collect();
    progress.phase("load runs", (planned.len() * config.rounds) as u64);
    for round in 0..config.rounds {
        for &protocol in &protocols {
            for offset in 0..Target::ALL.len() {
                let target = Target::ALL[(round + offset) % Target::ALL.len()];
                let Some(at) = parties.address(target, protocol) else {
                    continue;
                };
                let run = load_run(&parties, &h2load, config, protocol, target, at, round).await?;
                runs.push((protocol, target, run));
                progress.advance(runs.len() as u64);
            }
        }
    }
    let load: Vec<LoadFigures> = planned
        .iter()
        .map(|&(protocol, target)| {
            let mine: Vec<LoadRun> = runs
                .iter()
                .filter(|(p, t, _)| *p == protocol && *t == target)
                .map(|(_, _, run)| run.clone())
                .collect();
            LoadFigures::of(protocol.name(), target.name(), mine)
        })
        .collect();
    let compared = protocols
        .iter()
        .flat_map(|&protocol| [Tuning::Defaults, Tuning::ManyCores].map(|t| (protocol, t)))
        .filter_map(|(protocol, tuning)| {
            let find = |target: Target| {
                load.iter()
                    .find(|f| f.protocol == protocol.name() && f.target == target.name())
            };
            Some(Comparison::of(
                protocol.name(),
                find(Target::Gate)?,
                find(Target::Nginx(tuning))?,
            ))
        })
        .collect();
    drop(parties);
    Ok(GateReport {
        cores: cores(),
        nginx: versions.0,
        h2load: versions.1,
        backends: config.backends,
        workers: config.workers,
        gate_pinned: config.pin_workers,
        connections: config.connections,
        rounds: config.rounds,
        access_log: false,
        load,
        idle,
        compared,
    })
}

fn program(name: &str, package: &str) -> Result<PathBuf, BenchError> {
    procs::find_program(name).ok_or_else(|| BenchError::MissingProgram {
        program: name.into(),
        package: package.into(),
    })
}

/// The first line a program prints about its version (nginx prints it on
/// stderr).
fn version(program: &Path, flag: &str) -> Result<String, BenchError> {
    let output = Command::new(program)
        .arg(flag)
        .output()
        .map_err(BenchError::io(format!(
            "running {} {flag}",
            program.display()
        )))?;
    let text = [output.stdout, output.stderr].concat();
    Ok(String::from_utf8_lossy(&text)
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned())
}

/// `count` distinct free loopback ports (held together while chosen).
fn free_addresses(count: usize) -> Result<Vec<SocketAddr>, BenchError> {
    let held: Vec<std::net::TcpListener> = (0..count)
        .map(|_| std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<Result<_, _>>()
        .map_err(BenchError::io("choosing free loopback ports"))?;
    held.iter()
        .map(std::net::TcpListener::local_addr)
        .collect::<Result<_, _>>()
        .map_err(BenchError::io("choosing free loopback ports"))
}

async fn start(
    config: &GateBenchConfig,
    nginx_program: &Path,
    open_files: u64,
) -> Result<Parties, BenchError> {
    let dir = tempfile::Builder::new()
        .prefix("cca-bench-gate-")
        .tempdir()
        .map_err(BenchError::io(
            "creating the benchmark's temporary directory",
        ))?;
    // nginx's workers run as `nobody` when it starts as root: they must
    // reach their temp paths under this directory.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).map_err(
            BenchError::io("opening the temporary directory to nginx's workers"),
        )?;
    }
    let worker_connections = usize::try_from(open_files)
        .unwrap_or(usize::MAX)
        .min(65_536);
    // Ports are chosen just before the process that binds them starts,
    // each after the previous one listens: the gate binds port 0, and
    // the kernel could hand it a port chosen (and let go) for nginx.
    let backend_addresses = free_addresses(config.backends)?;

    let backends_text = nginx::backends(
        dir.path(),
        config.workers,
        worker_connections,
        &backend_addresses,
    );
    let mut backends = start_nginx(nginx_program, dir.path(), "backends", &backends_text)?;
    for &address in &backend_addresses {
        wait_ready(
            &mut backends,
            address,
            &dir.path().join("backends-error.log"),
        )
        .await?;
    }

    let mut gate = start_gate(config, dir.path(), &backend_addresses)?;
    let gate_address = gate_address(&mut gate)?;
    wait_ready(&mut gate, gate_address, &dir.path().join("gate-stderr.log")).await?;

    let peer = |tuning| {
        start_peer(
            config,
            nginx_program,
            dir.path(),
            worker_connections,
            &backend_addresses,
            tuning,
        )
    };
    let nginx = peer(Tuning::Defaults).await?;
    let tuned = peer(Tuning::ManyCores).await?;
    Ok(Parties {
        dir,
        backends,
        backend_addresses,
        gate,
        gate_address,
        nginx,
        tuned,
    })
}

/// Starts nginx (`program`, its files in `dir`) set up as `tuning` says
/// on free ports, in front of `backends`, once it answers.
async fn start_peer(
    config: &GateBenchConfig,
    program: &Path,
    dir: &Path,
    worker_connections: usize,
    backends: &[SocketAddr],
    tuning: Tuning,
) -> Result<PeerProxy, BenchError> {
    let mut front = free_addresses(if config.http2 { 2 } else { 1 })?;
    let at = ProxyAt {
        http2: config.http2.then(|| front.pop()).flatten(),
        http1: front
            .pop()
            .ok_or_else(|| BenchError::Config("no free port for nginx".into()))?,
    };
    let text = nginx::proxy(
        dir,
        config.workers,
        worker_connections,
        at,
        tuning,
        backends,
    );
    let name = tuning.name();
    let mut process = start_nginx(program, dir, name, &text)?;
    wait_ready(
        &mut process,
        at.http1,
        &dir.join(format!("{name}-error.log")),
    )
    .await?;
    Ok(PeerProxy { process, at })
}

fn start_nginx(
    program: &Path,
    dir: &Path,
    name: &str,
    config: &str,
) -> Result<Process, BenchError> {
    let file = dir.join(format!("{name}.conf"));
    std::fs::write(&file, config).map_err(BenchError::io(format!("writing {}", file.display())))?;
    let stderr = std::fs::File::create(dir.join(format!("{name}-error.log")))
        .map_err(BenchError::io("creating nginx's error log"))?;
    Process::spawn(
        &format!("nginx ({name})"),
        Command::new(program)
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&file)
            .arg("-e")
            .arg(dir.join(format!("{name}-error.log")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr),
    )
}

fn start_gate(
    config: &GateBenchConfig,
    dir: &Path,
    backends: &[SocketAddr],
) -> Result<Process, BenchError> {
    let stderr = std::fs::File::create(dir.join("gate-stderr.log"))
        .map_err(BenchError::io("creating the gate's log"))?;
    let mut command = Command::new(&config.cca);
    command
        .args(["benchmark", "gate", "--serve-gate", "127.0.0.1:0"])
        .args(["--workers", &config.workers.to_string()])
        .args(["--pin-workers", &config.pin_workers.to_string()]);
    for backend in backends {
        command.args(["--backend", &backend.to_string()]);
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr);
    Process::spawn("the gate (cca benchmark gate --serve-gate)", &mut command)
}

/// Reads where the gate listens from its first line of output.
fn gate_address(gate: &mut Process) -> Result<SocketAddr, BenchError> {
    let stdout = gate
        .child()
        .stdout
        .take()
        .ok_or_else(|| BenchError::Config("the gate's stdout is not piped".into()))?;
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = sender.send(line);
    });
    let line = receiver
        .recv_timeout(READY_TIMEOUT)
        .map_err(|_| BenchError::Timeout {
            what: "the gate saying where it listens".into(),
            timeout: READY_TIMEOUT,
        })?;
    line.trim()
        .strip_prefix(GATE_LISTENING)
        .and_then(|address| address.parse().ok())
        .ok_or_else(|| {
            BenchError::Config(format!(
                "the gate printed {line:?} instead of `{GATE_LISTENING}ADDRESS` ({})",
                gate.name
            ))
        })
}

/// Waits until `process` answers `GET /` at `at` with a 2xx.
async fn wait_ready(process: &mut Process, at: SocketAddr, log: &Path) -> Result<(), BenchError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        process.check_running(Some(log))?;
        let last = match serve::connect_and_get(at).await {
            Ok((_, status)) if (200..300).contains(&status) => {
                // Still running: the answer was its own, not another
                // listener's on a port it then failed to bind.
                tokio::time::sleep(Duration::from_millis(100)).await;
                return process.check_running(Some(log));
            }
            Ok((_, status)) => format!("it answered {status}"),
            Err(error) => error,
        };
        if Instant::now() >= deadline {
            return Err(BenchError::Timeout {
                what: format!("{} answering at {at} (last: {last})", process.name),
                timeout: READY_TIMEOUT,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn idle_figures(parties: &Parties, target: Target, count: usize) -> IdleFigures {
    let at = match target {
        Target::Nginx(tuning) => parties.peer(tuning).at.http1,
        _ => parties.gate_address,
    };
    let pids = parties.workers(target);
    let before = procs::memory(&pids);
    let held = serve::hold(at, count).await;
    tokio::time::sleep(SETTLE).await;
    let after = procs::memory(&pids);
    if let (failed, Some(first)) = &held.failures {
        tracing::warn!(target = target.name(), failed, first = %first, "idle connections failed");
    }
    let opened = held.streams.len();
    drop(held.streams);
    // Let the proxy see the closes before the next figure.
    tokio::time::sleep(SETTLE).await;
    per_connection(
        target,
        count,
        held.answered_2xx,
        held.failures.0,
        before,
        after,
        opened,
    )
}

fn per_connection(
    target: Target,
    count: usize,
    answered_2xx: usize,
    failed: usize,
    before: Memory,
    after: Memory,
    opened: usize,
) -> IdleFigures {
    let per = |before: u64, after: u64| after.saturating_sub(before) as f64 / opened.max(1) as f64;
    IdleFigures {
        target: target.name().into(),
        connections: count,
        answered_2xx,
        failed,
        rss_before: before.rss,
        rss_after: after.rss,
        pss_before: before.pss,
        pss_after: after.pss,
        rss_per_connection: per(before.rss, after.rss),
        pss_per_connection: before.pss.zip(after.pss).map(|(b, a)| per(b, a)),
    }
}

async fn load_run(
    parties: &Parties,
    h2load: &Path,
    config: &GateBenchConfig,
    protocol: Protocol,
    target: Target,
    at: SocketAddr,
    round: usize,
) -> Result<LoadRun, BenchError> {
    let log = parties
        .dir
        .path()
        .join(format!("h2load-{}-{round}.log", target.name()));
    let proxy_pids = parties.workers(target);
    let backend_pids = procs::children(parties.backends.id());
    let proxy_cpu = procs::cpu(&proxy_pids);
    let backend_cpu = procs::cpu(&backend_pids);
    let machine = procs::machine_ticks();
    let started = Instant::now();
    let mut command = h2load::command(h2load, protocol, at, config.connections, config.load, &log);
    let mut client = Process::spawn("h2load", &mut command)?;
    let stdout = read_in_background(client.child().stdout.take());
    let stderr = read_in_background(client.child().stderr.take());
    let mut client_cpu = Duration::ZERO;
    let status = loop {
        client_cpu = procs::cpu(&[client.id()]).max(client_cpu);
        match client.child().try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(error) => {
                return Err(BenchError::Io {
                    what: "waiting for h2load".into(),
                    error,
                });
            }
        }
    };
    let wall = started.elapsed().as_secs_f64().max(1e-9);
    let share = |spent: Duration| spent.as_secs_f64() / wall;
    let machine_cores = match (machine, procs::machine_ticks()) {
        (Some((busy0, total0)), Some((busy1, total1))) if total1 > total0 => {
            (busy1 - busy0) as f64 / (total1 - total0) as f64 * cores() as f64
        }
        _ => 0.0,
    };
    let cpu = CpuShare {
        proxy: share(procs::cpu(&proxy_pids).saturating_sub(proxy_cpu)),
        backends: share(procs::cpu(&backend_pids).saturating_sub(backend_cpu)),
        client: share(client_cpu),
        machine: machine_cores,
    };
    let stdout = stdout.join().unwrap_or_default();
    if !status.success() {
        let stderr = stderr.join().unwrap_or_default();
        return Err(BenchError::Config(format!(
            "h2load against {} ({}) failed ({status}): {stdout}{stderr}",
            target.name(),
            protocol.name()
        )));
    }
    let log_text = std::fs::read_to_string(&log).map_err(BenchError::io("reading h2load's log"))?;
    let _ = std::fs::remove_file(&log);
    let outcome = h2load::outcome(&stdout, &log_text)?;
    let ms = |micros: u64| micros as f64 / 1000.0;
    Ok(LoadRun {
        round,
        seconds: if outcome.rps > 0.0 {
            outcome.requests as f64 / outcome.rps
        } else {
            0.0
        },
        rps: outcome.rps,
        requests: outcome.requests,
        succeeded: outcome.succeeded,
        non_2xx: outcome
            .succeeded
            .saturating_sub(outcome.status_2xx)
            .max(outcome.logged_non_2xx),
        failed: outcome.failed + outcome.errored + outcome.timeouts,
        p50_ms: ms(h2load::percentile(&outcome.latencies_us, 50.0)),
        p99_ms: ms(h2load::percentile(&outcome.latencies_us, 99.0)),
        max_ms: ms(outcome.latencies_us.last().copied().unwrap_or(0)),
        disturbed: cpu.disturbed(),
        cpu,
    })
}

/// A pipe read to its end on a thread of its own (so a chatty child never
/// blocks on a full pipe).
fn read_in_background<R: Read + Send + 'static>(
    pipe: Option<R>,
) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_are_min_median_max() {
        assert_eq!(
            Spread::of(vec![3.0, 1.0, 2.0]),
            Spread {
                min: 1.0,
                median: 2.0,
                max: 3.0
            }
        );
        assert_eq!(Spread::of(vec![4.0, 1.0, 2.0, 3.0]).median, 2.5);
        assert_eq!(Spread::of(Vec::new()), Spread::default());
    }

    fn run(round: usize, rps: f64, elsewhere: f64) -> LoadRun {
        let cpu = CpuShare {
            proxy: 0.9,
            backends: 0.45,
            client: 0.45,
            machine: 1.8 + elsewhere,
        };
        LoadRun {
            round,
            seconds: 10.0,
            rps,
            requests: 1,
            succeeded: 1,
            non_2xx: 0,
            failed: 0,
            p50_ms: 1.0,
            p99_ms: 3.0,
            max_ms: 9.0,
            disturbed: cpu.disturbed(),
            cpu,
        }
    }

    #[test]
    fn a_run_a_neighbour_disturbed_is_left_out_unless_all_were() {
        let quiet = run(0, 40_000.0, 0.05);
        assert!((quiet.cpu.elsewhere() - 0.05).abs() < 1e-9);
        assert!(!quiet.disturbed);
        let noisy = run(1, 17_000.0, 0.5);
        assert!(noisy.disturbed);
        let runs = vec![quiet.clone(), noisy.clone(), run(2, 42_000.0, 0.0)];
        let rounds: Vec<usize> = counted(&runs).iter().map(|run| run.round).collect();
        assert_eq!(rounds, [0, 2]);
        let unmeasured = CpuShare {
            machine: 0.0,
            ..quiet.cpu
        };
        assert!(!unmeasured.disturbed(), "no machine figure: nothing said");
        let all_noisy = vec![noisy.clone(), run(3, 20_000.0, 0.7)];
        assert_eq!(counted(&all_noisy).len(), 2, "nothing quiet: all count");
    }

    fn figures(runs: Vec<LoadRun>) -> LoadFigures {
        LoadFigures::of("http/1.1", "t", runs)
    }

    #[test]
    fn paired_ratios_compare_runs_of_the_same_round_and_skip_disturbed_ones() {
        // The machine slows down from round to round and nginx alone had a
        // quiet round: the medians put the gate behind, every round it
        // shares with nginx puts it ahead.
        let gate = figures(vec![
            run(0, 44_000.0, 0.0),
            run(1, 33_000.0, 0.0),
            run(2, 99_000.0, 0.9),
            run(3, 22_000.0, 0.0),
        ]);
        let nginx = figures(vec![
            run(0, 40_000.0, 0.0),
            run(1, 30_000.0, 0.0),
            run(2, 90_000.0, 0.0),
            run(3, 20_000.0, 0.0),
        ]);
        let compared = Comparison::of("http/1.1", &gate, &nginx);
        assert!(compared.rps_ratio < 1.0, "{compared:?}");
        let paired = &compared.paired;
        assert_eq!(paired.rounds, 3, "the disturbed round 2 is no pair");
        assert!((paired.rps.min - 1.1).abs() < 1e-9, "{paired:?}");
        assert!((paired.rps.max - 1.1).abs() < 1e-9, "{paired:?}");
        assert_eq!(paired.rps_at_least_nginx, 3);
        assert_eq!(paired.p99_at_most_nginx, 3, "equal tails count");
        assert!((paired.gate_cpu_us_per_request - 0.9 / 33_000.0 * 1e6).abs() < 1e-6);
        assert!((paired.nginx_cpu_us_per_request - 0.9 / 30_000.0 * 1e6).abs() < 1e-6);
        let unpaired = figures(vec![run(7, 1.0, 0.0)]);
        assert_eq!(
            Comparison::of("http/1.1", &unpaired, &nginx).paired,
            PairedRatios::default()
        );
    }

    #[test]
    fn a_peers_errors_are_told_apart_from_the_gates() {
        let failing = |target: &str| {
            let mut erred = run(0, 1.0, 0.0);
            erred.non_2xx = 1;
            LoadFigures::of("h2c", target, vec![erred])
        };
        let report = GateReport {
            cores: 2,
            nginx: String::new(),
            h2load: String::new(),
            backends: 2,
            workers: 2,
            gate_pinned: true,
            connections: 64,
            rounds: 1,
            access_log: false,
            load: vec![
                figures(vec![run(0, 1.0, 0.0)]),
                failing("nginx-tuned"),
                failing("gate"),
            ],
            idle: Vec::new(),
            compared: Vec::new(),
        };
        let problems = report.problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("gate h2c round 0"), "{problems:?}");
        let noted = report.peer_errors();
        assert_eq!(noted.len(), 1, "{noted:?}");
        assert!(noted[0].starts_with("nginx-tuned h2c"), "{noted:?}");
    }

    #[test]
    fn memory_per_connection_is_the_growth_over_the_connections_opened() {
        let figures = per_connection(
            Target::Gate,
            100,
            100,
            0,
            Memory {
                rss: 1000,
                pss: Some(500),
            },
            Memory {
                rss: 101_000,
                pss: None,
            },
            100,
        );
        assert_eq!(figures.rss_per_connection, 1000.0);
        assert_eq!(figures.pss_per_connection, None);
    }
}
