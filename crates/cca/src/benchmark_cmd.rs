//! `cca benchmark`: the synthetic cluster benchmark — the real control
//! plane with N simulated agents in this process (`cca-bench`). Wiring
//! only: parses the flags, runs each scenario with a progress bar, prints
//! a table (or one JSON object per scenario) and fails when a scenario's
//! checks fail or it does not fully converge. `cca benchmark gate` is
//! `benchmark_gate_cmd`.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cca_bench::{BenchConfig, Progress, Report, Scenario, StoreTarget, run_scenario};
use cca_runtime::sim::StartLatency;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use crate::benchmark_gate_cmd;
use crate::cluster_cmd::output;
use crate::flags;

/// `cca benchmark --nodes N --instances M --store S --scenario NAME [--tls] [--json]`
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct BenchmarkArgs {
    #[command(subcommand)]
    command: Option<BenchmarkCommand>,
    /// Simulated nodes (one agent each).
    #[arg(long, default_value_t = 50)]
    nodes: usize,
    /// Instances deployed (scale-up grows them by --scale-factor).
    #[arg(long, default_value_t = 1000)]
    instances: usize,
    /// `embedded` (a temporary directory), `embedded:DIR` (fresh
    /// directories under DIR) or `etcd://host:port[,…]` (a running etcd;
    /// each scenario uses a fresh key namespace).
    #[arg(long, default_value = "embedded")]
    store: String,
    /// deploy, placement, node-failure, scale-up, controller-restart,
    /// store-latency, overload-slow-store, overload-freeze,
    /// overload-mass-kill, rollout, autoscale; overload (every overload
    /// scenario) or all; network (root only, not in all: endpoint change
    /// → every observer node's nftables rules updated).
    #[arg(long, default_value = "deploy")]
    scenario: String,
    /// `network`: services deployed, each with one port (instead of
    /// --instances).
    #[arg(long, default_value_t = 1000)]
    services: usize,
    /// `network`: instances per service.
    #[arg(long, default_value_t = 3)]
    service_replicas: u32,
    /// `network`: observer nodes following the map into real nftables
    /// tables, each in a network namespace of its own.
    #[arg(long, default_value_t = 3)]
    observers: usize,
    /// `network`: endpoint changes made (one instance stopped each).
    #[arg(long, default_value_t = 100)]
    changes: usize,
    /// One JSON object per scenario instead of a table.
    #[arg(long)]
    json: bool,
    /// Production security: a fresh cluster CA, the API and its liveness
    /// listener over HTTPS with client certificates required, every
    /// simulated agent with its own node certificate (one connection of
    /// its own to each listener), the harness as the local admin. Certificates are
    /// issued before the cluster starts.
    #[arg(long)]
    tls: bool,
    /// Agents send registrations and heartbeats over their API
    /// connection to the main listener (its liveness lane), as with a
    /// `cca server` without --liveness-listen, instead of to a liveness
    /// listener of their own: one connection per node fewer (with --tls,
    /// 5,000 nodes then fit under a 20,000 open-file limit).
    #[arg(long)]
    liveness_over_api: bool,
    /// Without --tls too, every simulated agent holds connections of its
    /// own, as agents on machines of their own do, instead of 60 agents
    /// sharing one HTTP/2 connection: the baseline to compare a --tls run
    /// with (TLS needs a connection per node, its certificate being its
    /// identity).
    #[arg(long)]
    connection_per_node: bool,
    /// The agents' shortest heartbeat lease TTL (`cca server --node-ttl`).
    #[arg(long, default_value = "6s", value_name = "DURATION", value_parser = flags::duration)]
    node_ttl: Duration,
    /// The fleet's heartbeat budget (`cca server --heartbeats-per-second`):
    /// past it, leases last longer.
    #[arg(long, default_value = "1500", value_name = "N")]
    heartbeats_per_second: std::num::NonZeroU32,
    /// How long a node stays unreachable before its instances are replaced.
    #[arg(long, default_value = "2s", value_name = "DURATION", value_parser = flags::duration)]
    lost_grace: Duration,
    /// Share of the nodes `overload-mass-kill` kills at once.
    #[arg(long, default_value_t = 40, value_name = "PERCENT",
          value_parser = clap::value_parser!(u32).range(1..=99))]
    mass_kill_percent: u32,
    /// End a pause of lost-node replacement on its own after this long
    /// with no further node lost; `never` (the default here):
    /// `overload-mass-kill` resumes it as an operator would.
    #[arg(long, default_value = "never", value_name = "DURATION|never",
          value_parser = flags::duration_or_never)]
    resume_replacement_after: flags::SpanOrNever,
    /// No placement this long after the controllers become leader.
    #[arg(long, default_value = "0s", value_name = "DURATION", value_parser = flags::duration)]
    startup_grace: Duration,
    /// Simulated start time: `50ms`, `uniform:10ms..100ms`, `normal:50ms,20ms`.
    #[arg(long, default_value = "uniform:5ms..50ms", value_parser = flags::start_latency)]
    start_latency: StartLatency,
    /// Delay added to every store operation in `store-latency`.
    #[arg(long, default_value = "5ms", value_name = "DURATION", value_parser = flags::duration)]
    store_latency: Duration,
    /// Pace the control plane's store to this share of the raw commit
    /// rate measured first (0 < FRACTION ≤ 1; commits wait for a slot,
    /// reads, watches and lease keep-alives do not). Every scenario;
    /// `overload-slow-store` uses 0.5 without it.
    #[arg(long, value_name = "FRACTION", value_parser = rate_fraction)]
    store_rate_fraction: Option<f64>,
    /// Nodes killed in `node-failure` (default: 10%, at least one).
    #[arg(long)]
    kill: Option<usize>,
    /// `scale-up` multiplies every service's replicas by this.
    #[arg(long, default_value_t = 1.5)]
    scale_factor: f64,
    /// How often agents report usage [default: 30s; 2s in rollout and
    /// autoscale].
    #[arg(long, value_name = "DURATION", value_parser = flags::duration)]
    usage_every: Option<Duration>,
    /// The autoscaler's scale-down window [default: 5m; 30s in autoscale].
    #[arg(long, value_name = "DURATION", value_parser = flags::duration)]
    scale_down_window: Option<Duration>,
    /// `rollout`: max_surge as a share of each service's replicas.
    #[arg(long, default_value_t = 25, value_name = "PERCENT",
          value_parser = clap::value_parser!(u32).range(1..=100))]
    surge_percent: u32,
    /// `rollout`: the share (per mille) of the bad version's instances
    /// that crash loop.
    #[arg(long, default_value_t = 100, value_name = "PER_MILLE",
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    bad_per_mille: u32,
    /// `chaos`: rounds of churn, each with one random fault.
    #[arg(long, default_value_t = 12, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    chaos_rounds: u32,
    /// Longest wait for one convergence.
    #[arg(long, default_value = "10m", value_name = "DURATION", value_parser = flags::duration)]
    timeout: Duration,
    /// Seed of the simulated start latencies.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Benchmarks other than the cluster's.
#[derive(Debug, Subcommand)]
enum BenchmarkCommand {
    /// The gate proxy against nginx in front of the same backends
    /// (needs nginx and h2load).
    Gate(benchmark_gate_cmd::GateArgs),
}

pub(crate) fn run(args: BenchmarkArgs) -> Result<ExitCode> {
    if let Some(BenchmarkCommand::Gate(gate)) = args.command {
        return benchmark_gate_cmd::run(gate);
    }
    let config = bench_config(&args)?;
    let scenarios = scenarios(&args.scenario)?;
    // Every simulated node holds a few connections (with --tls, two of
    // its own: four descriptors here with the server's ends).
    cca_bench::raise_open_file_limit(((args.nodes as u64) * 8).max(4096));
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let mut reports = Vec::new();
    for scenario in scenarios {
        let bar = Bar::new(args.json);
        let report = runtime
            .block_on(run_scenario(scenario, &config, &bar))
            .with_context(|| format!("scenario {}", scenario.name()))?;
        bar.finish();
        if args.json {
            output::json_line(&report)?;
        }
        reports.push(report);
    }
    if !args.json {
        print_table(&reports);
    }
    Ok(outcome(&reports))
}

fn bench_config(args: &BenchmarkArgs) -> Result<BenchConfig> {
    if args.nodes == 0 || args.instances == 0 {
        bail!("--nodes and --instances must be at least 1");
    }
    let mut config = BenchConfig::new(args.nodes, args.instances, store_target(&args.store)?);
    config.node_leases = cca_model::node_lease::NodeLeases {
        shortest: args.node_ttl,
        heartbeats_per_s: args.heartbeats_per_second,
    };
    config.lost_grace = args.lost_grace;
    config.startup_grace = args.startup_grace;
    config.start_latency = args.start_latency;
    config.store_latency = args.store_latency;
    config.store_rate_fraction = args.store_rate_fraction;
    config.mass_kill_percent = args.mass_kill_percent;
    config.resume_replacement_after = args.resume_replacement_after.0;
    config.scale_factor = args.scale_factor;
    config.timeout = args.timeout;
    config.seed = args.seed;
    config.tls = args.tls;
    config.liveness_over_api = args.liveness_over_api;
    config.connection_per_node = args.connection_per_node;
    config.usage_every = args.usage_every;
    config.scale_down_window = args.scale_down_window;
    config.surge_percent = args.surge_percent;
    config.bad_per_mille = args.bad_per_mille;
    config.chaos_rounds = args.chaos_rounds;
    if let Some(kill) = args.kill {
        config.killed_nodes = kill;
    }
    if args.services == 0 || args.service_replicas == 0 || args.observers == 0 || args.changes == 0
    {
        bail!("--services, --service-replicas, --observers and --changes must be at least 1");
    }
    config.services = args.services;
    config.service_replicas = args.service_replicas;
    config.observers = args.observers;
    config.endpoint_changes = args.changes;
    Ok(config)
}

/// `--store-rate-fraction`: a share of the store's raw commit rate.
fn rate_fraction(text: &str) -> Result<f64, String> {
    let share = "a share of the store's raw commit rate: more than 0 and at most 1 \
                 (0.5 paces the store to half its rate)";
    match text.trim().parse::<f64>() {
        Ok(fraction) if fraction > 0.0 && fraction <= 1.0 => Ok(fraction),
        Ok(_) => Err(format!("`{text}` is out of range; expected {share}")),
        Err(_) => Err(format!("`{text}` is not a number; expected {share}")),
    }
}

fn store_target(text: &str) -> Result<StoreTarget> {
    if text == "embedded" {
        return Ok(StoreTarget::Embedded(None));
    }
    match text.parse::<cca_store::StoreUrl>() {
        Ok(cca_store::StoreUrl::Embedded(dir)) => Ok(StoreTarget::Embedded(Some(dir))),
        Ok(cca_store::StoreUrl::Etcd(endpoints)) => Ok(StoreTarget::Etcd(endpoints)),
        Err(error) => bail!("--store `{text}`: {error}"),
    }
}

fn scenarios(name: &str) -> Result<Vec<Scenario>> {
    match Scenario::select(name) {
        Some(scenarios) => Ok(scenarios),
        None => bail!(
            "--scenario `{name}`: expected one of {}",
            Scenario::choices()
        ),
    }
}

/// Success unless a scenario failed a check or did not fully converge.
fn outcome(reports: &[Report]) -> ExitCode {
    let failed: Vec<&Report> = reports.iter().filter(|report| !report.passed()).collect();
    for report in &failed {
        for violation in &report.violations {
            output::line(&format!("{}: violation: {violation}", report.scenario));
        }
        output::line(&format!(
            "{}: FAILED (success rate {:.4}, {} false lease expiries, {} leadership losses)",
            report.scenario,
            report.success_rate,
            report.false_lease_expiries,
            report.false_leadership_losses
        ));
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn print_table(reports: &[Report]) {
    let (network, others): (Vec<&Report>, Vec<&Report>) =
        reports.iter().partition(|report| report.network.is_some());
    if !network.is_empty() {
        print_network_table(&network);
    }
    let (lifecycle, others): (Vec<&Report>, Vec<&Report>) = others
        .into_iter()
        .partition(|report| report.lifecycle.is_some());
    if !lifecycle.is_empty() {
        print_lifecycle_table(&lifecycle);
    }
    let (chaos, others): (Vec<&Report>, Vec<&Report>) = others
        .into_iter()
        .partition(|report| report.chaos.is_some());
    if !chaos.is_empty() {
        print_chaos_table(&chaos);
    }
    for report in others.iter().filter(|report| report.console.is_some()) {
        print_console_table(report);
    }
    if others.is_empty() {
        return;
    }
    let rows = others.into_iter().map(table_row).collect();
    output::table(
        &[
            "scenario",
            "nodes",
            "instances",
            "seconds",
            "mean",
            "p50",
            "p95",
            "p99",
            "max",
            "success",
            "placed/s",
            "store txn/s",
            "total",
            "leases expired (false)",
            "re-registered",
            "peak rss",
        ],
        rows,
    );
}

/// The `rollout` and `autoscale` scenarios' figures, in seconds.
fn print_lifecycle_table(reports: &[&Report]) {
    let seconds = |value: Option<f64>| value.map_or("-".to_owned(), |value| format!("{value:.1}"));
    let rows = reports
        .iter()
        .filter_map(|report| report.lifecycle.as_ref().map(|figures| (report, figures)))
        .map(|(report, figures)| {
            vec![
                report.scenario.clone(),
                report.nodes.to_string(),
                report.instances.to_string(),
                seconds(figures.rollout_seconds),
                seconds(figures.rollback_seconds),
                seconds(figures.breach_to_decision_seconds),
                seconds(figures.restored_seconds),
                seconds(figures.scale_up_seconds),
                seconds(figures.scale_down_seconds),
                seconds(figures.scale_down_window_seconds),
                format!("{:.0}", report.store_txn_per_s),
            ]
        })
        .collect();
    output::table(
        &[
            "scenario",
            "nodes",
            "instances",
            "rollout s",
            "rollback decided s",
            "breach→decision s",
            "previous serving s",
            "scale up s",
            "scale down s",
            "window s",
            "store txn/s",
        ],
        rows,
    );
}

/// The `console` scenario's figures: one row per page, then the live
/// feed's and the tab's.
fn print_console_table(report: &Report) {
    let Some(figures) = &report.console else {
        return;
    };
    let mut rows: Vec<Vec<String>> = figures
        .first_view_ms
        .iter()
        .map(|(page, ms)| {
            let bytes = figures.view_bytes.get(page).copied().unwrap_or(0);
            vec![
                page.clone(),
                format!("{ms:.0} ms"),
                format!("{:.1} KiB", bytes as f64 / 1024.0),
            ]
        })
        .collect();
    let update = &figures.update_seconds;
    rows.push(vec![
        "live update after a scale (p50 / max)".into(),
        format!("{:.0} / {:.0} ms", update.p50 * 1000.0, update.max * 1000.0),
        String::new(),
    ]);
    rows.push(vec![
        "overview's feed under churn".into(),
        String::new(),
        format!("{:.1} KiB/min", figures.feed_bytes_per_minute / 1024.0),
    ]);
    rows.push(vec![
        "the tab: private / PSS / JS heap (an empty tab: private)".into(),
        format!(
            "{:.0} / {:.0} / {:.0} MiB ({:.0} MiB)",
            figures.tab_private_mib,
            figures.tab_pss_mib,
            figures.js_heap_mib,
            figures.blank_tab_private_mib
        ),
        String::new(),
    ]);
    rows.insert(
        0,
        vec![
            "cluster".into(),
            format!("{} nodes", report.nodes),
            format!("{} instances", report.instances),
        ],
    );
    output::table(&["console", "first view", "view size"], rows);
}

/// The `chaos` scenario's figures: per-round convergence in seconds.
fn print_chaos_table(reports: &[&Report]) {
    let rows = reports
        .iter()
        .filter_map(|report| report.chaos.as_ref().map(|figures| (report, figures)))
        .map(|(report, figures)| {
            let faults: Vec<String> = figures
                .faults
                .iter()
                .map(|(fault, count)| format!("{count} {fault}"))
                .collect();
            vec![
                report.nodes.to_string(),
                report.instances.to_string(),
                figures.rounds.to_string(),
                faults.join(", "),
                format!("{:.2}", report.p50),
                format!("{:.2}", report.p95),
                format!("{:.2}", report.p99),
                figures.max_duplicates.to_string(),
                format!(
                    "{} ({})",
                    report.lease_expiries, report.false_lease_expiries
                ),
                if report.passed() { "yes" } else { "NO" }.to_owned(),
            ]
        })
        .collect();
    output::table(
        &[
            "nodes",
            "instances",
            "rounds",
            "faults",
            "p50 s",
            "p95 s",
            "p99 s",
            "max duplicates",
            "leases expired (false)",
            "passed",
        ],
        rows,
    );
}

/// The `network` scenario's figures, in milliseconds.
fn print_network_table(reports: &[&Report]) {
    let ms = |seconds: f64| format!("{:.1}", seconds * 1000.0);
    let rows = reports
        .iter()
        .filter_map(|report| report.network.as_ref().map(|network| (report, network)))
        .map(|(report, network)| {
            vec![
                network.services.to_string(),
                report.instances.to_string(),
                network.observers.to_string(),
                format!("{} ({} missed)", network.changes, network.missed),
                format!(
                    "{} / {} / {}",
                    ms(network.every_node.p50),
                    ms(network.every_node.p99),
                    ms(network.every_node.max)
                ),
                format!(
                    "{} / {}",
                    ms(network.map_taken.p50),
                    ms(network.map_taken.p99)
                ),
                format!("{} / {}", ms(network.sync.p50), ms(network.sync.p99)),
                network.sync_commands_p50.to_string(),
                ms(network.first_build_seconds),
                report.peak_rss_bytes.map_or("-".to_owned(), |bytes| {
                    format!("{} MiB", bytes / (1024 * 1024))
                }),
            ]
        })
        .collect();
    output::table(
        &[
            "services",
            "instances",
            "observers",
            "changes",
            "every node p50/p99/max ms",
            "map taken p50/p99 ms",
            "node sync p50/p99 ms",
            "commands",
            "first build ms",
            "peak rss",
        ],
        rows,
    );
}

fn table_row(report: &Report) -> Vec<String> {
    let seconds = |value: f64| format!("{value:.3}");
    vec![
        report.scenario.clone(),
        report.nodes.to_string(),
        report.instances.to_string(),
        seconds(report.seconds),
        seconds(report.mean),
        seconds(report.p50),
        seconds(report.p95),
        seconds(report.p99),
        seconds(report.max),
        format!("{:.4}", report.success_rate),
        format!("{:.0}", report.placements_per_s),
        match report.store_paced_txn_per_s {
            Some(paced) => format!("{:.0} (paced {paced:.0})", report.store_txn_per_s),
            None => format!("{:.0}", report.store_txn_per_s),
        },
        report.total_seconds.map_or("-".to_owned(), seconds),
        format!(
            "{} ({})",
            report.lease_expiries, report.false_lease_expiries
        ),
        report.re_registrations.to_string(),
        report.peak_rss_bytes.map_or("-".to_owned(), |bytes| {
            format!("{} MiB", bytes / (1024 * 1024))
        }),
    ]
}

/// A progress bar on stderr (hidden for `--json` and off a terminal).
pub(crate) struct Bar {
    bar: ProgressBar,
}

impl Bar {
    pub(crate) fn new(quiet: bool) -> Self {
        let bar = if quiet {
            ProgressBar::hidden()
        } else {
            ProgressBar::new(0)
        };
        let style = ProgressStyle::with_template("{spinner} {msg} [{elapsed}] {pos}/{len}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(200));
        Self { bar }
    }

    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Progress for Bar {
    fn phase(&self, what: &str, total: u64) {
        self.bar.set_message(what.to_owned());
        self.bar.set_length(total);
        self.bar.set_position(0);
    }

    fn advance(&self, done: u64) {
        self.bar.set_position(done);
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchmarkArgs,
    }

    #[test]
    fn overload_names_its_scenarios_and_an_unknown_name_lists_the_choices() {
        assert_eq!(
            scenarios("overload").expect("a group"),
            Scenario::OVERLOAD.to_vec()
        );
        assert_eq!(scenarios("all").expect("a group"), Scenario::ALL.to_vec());
        let error = scenarios("overlaod").expect_err("unknown").to_string();
        assert!(
            error.contains("overload-freeze") && error.contains("overload, all"),
            "{error}"
        );
    }

    #[test]
    fn the_benchmark_runs_the_production_node_leases_by_default() {
        let args = Cli::try_parse_from(["cca"]).expect("no flag").args;
        let config = bench_config(&args).expect("a config");
        assert_eq!(
            config.node_leases,
            cca_model::node_lease::NodeLeases::default()
        );
    }

    #[test]
    fn the_store_rate_fraction_is_a_share_from_above_0_to_1() {
        let parse = |value: &str| {
            Cli::try_parse_from(["cca".to_owned(), format!("--store-rate-fraction={value}")])
        };
        let args = parse("0.5").expect("half").args;
        let config = bench_config(&args).expect("a config");
        assert_eq!(config.store_rate_fraction, Some(0.5));
        assert_eq!(parse("1").expect("all").args.store_rate_fraction, Some(1.0));
        for (bad, why) in [
            ("0", "out of range"),
            ("1.5", "out of range"),
            ("-0.5", "out of range"),
            ("NaN", "out of range"),
            ("half", "not a number"),
        ] {
            let error = parse(bad).expect_err(bad).to_string();
            assert!(
                error.contains("--store-rate-fraction <FRACTION>") && error.contains(why),
                "{bad}: {error}"
            );
        }
        let without = Cli::try_parse_from(["cca"]).expect("no flag").args;
        assert_eq!(
            bench_config(&without)
                .expect("a config")
                .store_rate_fraction,
            None
        );
    }
}
