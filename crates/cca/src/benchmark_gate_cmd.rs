//! `cca benchmark gate`: the gate proxy against nginx in front of the same
//! backends (`cca_bench::gate`). Wiring only: parses the flags, runs the
//! benchmark with a progress bar, prints the figures as tables (or one
//! JSON object) and fails when a request did not get a 2xx. Its hidden
//! `--serve-gate` mode is the gate process the benchmark starts.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cca_bench::gate::{BenchGate, GATE_LISTENING, GateBenchConfig, GateReport, Load};
use clap::Args;

use crate::benchmark_cmd::Bar;
use crate::cluster_cmd::output;
use crate::flags;

/// `cca benchmark gate [--backends N] [--connections N] [--duration D]
/// [--rounds N] [--idle-connections N] [--json]`
#[derive(Debug, Args)]
pub(crate) struct GateArgs {
    /// Backend servers (one nginx answering a small fixed body on each port).
    #[arg(long, default_value_t = 2)]
    backends: usize,
    /// nginx's worker processes and the gate's worker threads (default:
    /// the machine's cores).
    #[arg(long)]
    workers: Option<usize>,
    /// Concurrent keep-alive connections of the load (h2load -c).
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// How long each run is measured (after --warm-up).
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = flags::duration)]
    duration: Duration,
    /// Load before each run's measurement starts.
    #[arg(long, default_value = "2s", value_name = "DURATION", value_parser = flags::duration)]
    warm_up: Duration,
    /// Send this many requests per run instead of --duration (short runs).
    #[arg(long)]
    requests: Option<u64>,
    /// Runs of each target (gate, nginx, nginx-tuned, direct), alternating.
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    /// HTTP/1.1 only (no HTTP/2 runs).
    #[arg(long)]
    no_http2: bool,
    /// Idle keep-alive connections held for the memory figure.
    #[arg(long, default_value_t = 10_000)]
    idle_connections: usize,
    /// Keep each of the gate's workers to a CPU of its own (the gate's
    /// default, `cca agent --gate-pin-workers`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pin_workers: bool,
    /// One JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Serve the benchmark's gate at ADDRESS (the process the benchmark
    /// starts; prints where it listens).
    #[arg(long, hide = true, value_name = "ADDRESS")]
    serve_gate: Option<SocketAddr>,
    /// With --serve-gate: a backend of the gate's service.
    #[arg(long = "backend", hide = true, value_name = "ADDRESS")]
    backend_addresses: Vec<SocketAddr>,
}

pub(crate) fn run(args: GateArgs) -> Result<ExitCode> {
    if let Some(listen) = args.serve_gate {
        return serve_gate(
            listen,
            &args.backend_addresses,
            args.workers,
            args.pin_workers,
        );
    }
    let cca = std::env::current_exe().context("finding this cca binary (it serves the gate)")?;
    let mut config = GateBenchConfig::new(cca);
    config.backends = args.backends;
    if let Some(workers) = args.workers {
        config.workers = workers;
    }
    config.connections = args.connections;
    config.load = match args.requests {
        Some(requests) => Load::Requests(requests),
        None => Load::For {
            measured: args.duration,
            warm_up: args.warm_up,
        },
    };
    config.rounds = args.rounds;
    config.http2 = !args.no_http2;
    config.idle_connections = args.idle_connections;
    config.pin_workers = args.pin_workers;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let bar = Bar::new(args.json);
    let report = runtime
        .block_on(cca_bench::gate::run_gate_bench(&config, &bar))
        .context("the gate benchmark")?;
    bar.finish();
    if args.json {
        output::json_line(&report)?;
    } else {
        print_report(&report);
    }
    for error in report.peer_errors() {
        output::line(&format!(
            "note (a peer's errors, counted in its figures): {error}"
        ));
    }
    let problems = report.problems();
    for problem in &problems {
        output::line(&format!("FAILED: {problem}"));
    }
    Ok(if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The hidden mode: the gate with `workers` worker threads (accepting on
/// this thread), until SIGTERM or Ctrl-C.
fn serve_gate(
    listen: SocketAddr,
    backends: &[SocketAddr],
    workers: Option<usize>,
    pin_workers: bool,
) -> Result<ExitCode> {
    if backends.is_empty() {
        bail!("--serve-gate needs at least one --backend ADDRESS");
    }
    let workers = workers.unwrap_or(cca_gate::ServerOptions::default().workers);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let gate = BenchGate::bind(listen, backends).await?;
        output::line(&format!("{GATE_LISTENING}{}", gate.address()?));
        gate.serve(
            workers.max(1),
            pin_workers,
            crate::server_cmd::shutdown_signal(),
        )
        .await?;
        Ok(ExitCode::SUCCESS)
    })
}

fn print_report(report: &GateReport) {
    output::line(&format!(
        "{} cores; {}; {}; {} backends; {} workers per proxy (the gate's {}); {} connections; \
         access logs off",
        report.cores,
        report.nginx,
        report.h2load,
        report.backends,
        report.workers,
        if report.gate_pinned {
            "each kept to a CPU"
        } else {
            "not kept to CPUs"
        },
        report.connections
    ));
    let rows = report
        .load
        .iter()
        .map(|figures| {
            let cores = |pick: fn(&cca_bench::gate::CpuShare) -> f64| {
                let values: Vec<f64> = cca_bench::gate::counted(&figures.runs)
                    .iter()
                    .map(|run| pick(&run.cpu))
                    .collect();
                format!(
                    "{:.2}",
                    values.iter().sum::<f64>() / values.len().max(1) as f64
                )
            };
            vec![
                figures.protocol.clone(),
                figures.target.clone(),
                format!(
                    "{:.0} / {:.0} / {:.0}",
                    figures.rps.min, figures.rps.median, figures.rps.max
                ),
                format!(
                    "{:.2} / {:.2} / {:.2}",
                    figures.p99_ms.min, figures.p99_ms.median, figures.p99_ms.max
                ),
                figures
                    .runs
                    .iter()
                    .map(|run| run.requests)
                    .sum::<u64>()
                    .to_string(),
                format!(
                    "{} / {} / {} / {}",
                    cores(|cpu| cpu.proxy),
                    cores(|cpu| cpu.backends),
                    cores(|cpu| cpu.client),
                    cores(cca_bench::gate::CpuShare::elsewhere)
                ),
            ]
        })
        .collect();
    output::table(
        &[
            "protocol",
            "target",
            "req/s min/median/max",
            "p99 ms min/median/max",
            "requests",
            "cores proxy/backends/h2load/elsewhere",
        ],
        rows,
    );
    for figures in &report.load {
        let left_out = figures.runs.len() - figures.counted;
        if left_out > 0 {
            output::line(&format!(
                "{} {}: {left_out} of {} runs left out of the figures: processes outside the \
                 benchmark kept more than {} cores busy during them",
                figures.protocol,
                figures.target,
                figures.runs.len(),
                cca_bench::gate::DISTURBED_CORES
            ));
        } else if figures.runs.iter().any(|run| run.disturbed) {
            output::line(&format!(
                "{} {}: every run was disturbed by processes outside the benchmark; the \
                 figures count them all",
                figures.protocol, figures.target
            ));
        }
    }
    let rows = report
        .idle
        .iter()
        .map(|idle| {
            vec![
                idle.target.clone(),
                format!("{}/{}", idle.answered_2xx, idle.connections),
                format!("{} MiB", idle.rss_before / (1024 * 1024)),
                format!("{} MiB", idle.rss_after / (1024 * 1024)),
                format!("{:.0}", idle.rss_per_connection),
                idle.pss_per_connection
                    .map_or("-".into(), |bytes| format!("{bytes:.0}")),
            ]
        })
        .collect();
    output::table(
        &[
            "idle",
            "answered",
            "rss before",
            "rss after",
            "rss bytes/conn",
            "pss bytes/conn",
        ],
        rows,
    );
    for compared in &report.compared {
        let paired = &compared.paired;
        output::line(&format!(
            "{} against {}: the gate's median req/s is {:.2}x its, the gate's median p99 {:.2}x \
             its; round by round ({} rounds) req/s {:.2}/{:.2}/{:.2}x (at least its in {}), \
             p99 {:.2}/{:.2}/{:.2}x (at most its in {}); CPU a request: gate {:.1} µs, \
             {} {:.1} µs",
            compared.protocol,
            compared.peer,
            compared.rps_ratio,
            compared.p99_ratio,
            paired.rounds,
            paired.rps.min,
            paired.rps.median,
            paired.rps.max,
            paired.rps_at_least_nginx,
            paired.p99.min,
            paired.p99.median,
            paired.p99.max,
            paired.p99_at_most_nginx,
            paired.gate_cpu_us_per_request,
            compared.peer,
            paired.nginx_cpu_us_per_request,
        ));
    }
}
