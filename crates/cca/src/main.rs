//! The `cca` binary: argument parsing and wiring only. Each subcommand's
//! logic lives in the crate that owns its concept; the modules here turn
//! arguments into calls and results into output and exit codes.

mod agent_cmd;
mod benchmark_cmd;
mod benchmark_gate_cmd;
mod cluster_cmd;
mod console;
mod dev_cmd;
mod dsl_cmd;
mod flags;
mod image_cmd;
mod init_cmd;
mod install_cmd;
mod readiness_cmd;
mod secret_keys;
mod server_cmd;
mod store_cmd;
mod whoami;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// mimalloc rather than glibc's allocator: a control plane allocates
/// small, short-lived buffers on every worker thread (requests, TLS
/// records, watch lines, store values), and glibc's arenas took a fifth
/// to a quarter of a loaded benchmark's CPU (server and agents) in
/// `malloc`, `free` and their consolidation, at the price of more
/// memory (docs/benchmarks.md, "Trust").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// CCattler: run services on a fleet of machines.
#[derive(Debug, Parser)]
#[command(name = "cca", version, about, propagate_version = true)]
struct Cli {
    /// How logs on stderr read: `text` for people, `json` for one object a
    /// line (a log shipper's input). Also from `CCA_LOG_FORMAT`.
    #[arg(long, global = true, value_enum, env = "CCA_LOG_FORMAT", default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Read and write the fact store directly (an operator's tool, like etcdctl).
    Store(store_cmd::StoreArgs),
    /// Rewrite .cca files in the canonical layout (--check: only list them).
    Fmt(dsl_cmd::FmtArgs),
    /// Check .cca files for errors and warnings without a cluster.
    Lint(dsl_cmd::LintArgs),
    /// Print a .cca template with its {{ values.KEY }} placeholders expanded.
    Render(dsl_cmd::RenderArgs),
    /// Create the cluster's CA, the server's certificate and the local admin's credential.
    Init(init_cmd::InitArgs),
    /// Run the control plane: the API server on the fact store.
    Server(server_cmd::ServerArgs),
    /// Write the systemd unit of `cca server` or `cca agent` with the
    /// flags after `--`, checked as the service would check them.
    Install(install_cmd::InstallArgs),
    /// Pre-flight a server or a node with the flags it would start with:
    /// store, certificates, secret key, runtime, ports, disk, clock.
    Readiness(readiness_cmd::ReadinessArgs),
    /// Run the node agent: register this node and run the instances placed on it.
    Agent(agent_cmd::AgentArgs),
    /// Enrol this node with a join token (without starting the agent).
    Join(agent_cmd::JoinArgs),
    /// Pull, list, remove and collect the images of a node's store (an operator's tool).
    #[command(subcommand_required = true)]
    Image(image_cmd::ImageArgs),
    /// A whole cluster in one process: apply FILES and run them here until Ctrl-C.
    Dev(dev_cmd::DevArgs),
    /// Benchmark the real control plane with N simulated nodes in this process.
    Benchmark(benchmark_cmd::BenchmarkArgs),
    /// Serve a tiny HTTP page saying who this instance is (a test workload).
    Whoami(whoami::WhoamiArgs),
    #[command(flatten)]
    Cluster(cluster_cmd::ClusterCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let outcome = match cli.command {
        Command::Store(args) => store_cmd::run(args),
        Command::Fmt(args) => dsl_cmd::fmt(&args),
        Command::Lint(args) => dsl_cmd::lint(&args),
        Command::Render(args) => dsl_cmd::render(&args),
        Command::Init(args) => init_cmd::run(args),
        Command::Server(args) => server_cmd::run(args),
        Command::Agent(args) => agent_cmd::run(args),
        Command::Readiness(args) => readiness_cmd::run(args),
        Command::Install(args) => {
            install_cmd::run(args, |line| Cli::try_parse_from(line).map(drop))
        }
        Command::Join(args) => agent_cmd::join(args),
        Command::Image(args) => image_cmd::run(args),
        Command::Dev(args) => dev_cmd::run(args),
        Command::Benchmark(args) => benchmark_cmd::run(args),
        Command::Whoami(args) => whoami::run(args),
        Command::Cluster(command) => cluster_cmd::run(command, Cli::command),
    };
    match outcome {
        Ok(code) => code,
        Err(error) => {
            report(&error);
            ExitCode::FAILURE
        }
    }
}

#[allow(clippy::print_stderr, reason = "the CLI reports its errors on stderr")]
fn report(error: &anyhow::Error) {
    eprintln!("error: {error:#}");
}

/// What is logged when `RUST_LOG` is unset: warnings, a gate's access
/// log, who leads the control plane (an operator reads leader changes
/// at the default level), and each MCP tool call of `cca mcp`.
const DEFAULT_LOG_FILTER: &str =
    "warn,cca_gate::access=info,cca_control::leader=info,cca_mcp::call=info";

/// Logs go to stderr, filtered by `RUST_LOG` (default
/// [`DEFAULT_LOG_FILTER`]), one JSON object a line with `--log-format json`.
fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == LogFormat::Json {
        logs.json().init();
    } else {
        logs.init();
    }
}
