//! Arguments of the cluster commands (`apply`, `diff`, `get`, `describe`,
//! `history`, `status`, `scale`, `rollout`, `delete`, `drain`, `disable-node`, `enable-node`,
//! `events`, `watch`, `logs`, `exec`, `secret`, `token`, `cert`, `completions`) and their
//! dispatch.
//! Each command is a call of the typed API client ([`cca_wire::Client`]);
//! [`commands`] holds the calls, [`describe`] the long views, [`io`] logs
//! and exec, [`secret`] secret values, [`token`] join tokens, [`cert`] revocations, [`output`]
//! the printing.
//!
//! Exit codes: 0 success, 1 any error (the server's message is printed),
//! 2 usage errors (from clap); `exec` exits with the remote command's code.

mod backup;
mod cert;
pub(crate) mod commands;
mod describe;
mod inspect;
mod io;
mod login;
mod mcp;
pub(crate) mod output;
mod rollout;
mod scale;
mod secret;
mod token;
mod user;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Subcommand, ValueEnum};

pub(crate) use output::Format;

/// The default API server address (`https://` when the config directory
/// holds a cluster CA).
const DEFAULT_SERVER: &str = "http://127.0.0.1:9770";

/// Where the API server is (`--server`, then `CCA_SERVER`, then the
/// default) and how to prove who we are to it (the config directory's
/// cluster CA and local admin certificate, when `cca init` made them).
#[derive(Debug, Clone, Args)]
pub(crate) struct ServerAddr {
    /// The API server's base URL [default: https://127.0.0.1:9770 when the
    /// config directory holds a cluster CA, else http://127.0.0.1:9770].
    #[arg(long, env = "CCA_SERVER", value_name = "URL")]
    pub(crate) server: Option<String>,
    /// The cluster's trust (`cca init`): its CA and the local admin's
    /// certificate, for an `https://` server [default: /etc/ccattler; when
    /// it holds no CA, ./.cca-dev/trust if `cca dev` made one there].
    #[arg(long = "config-dir", env = "CCA_CONFIG_DIR", value_name = "DIR")]
    pub(crate) config_dir_arg: Option<std::path::PathBuf>,
}

/// Where `cca dev` keeps its CA when run with its default data directory.
const DEV_CONFIG_DIR: &str = ".cca-dev/trust";

impl ServerAddr {
    /// The config directory: the one given, else `/etc/ccattler` when it
    /// holds a CA, else the `cca dev` CA of the current directory when
    /// there is one (so the quick start needs no flags), else
    /// `/etc/ccattler`.
    pub(crate) fn config_dir(&self) -> std::path::PathBuf {
        use cca_trust::config_dir::{ConfigDir, DEFAULT_DIR};
        if let Some(dir) = &self.config_dir_arg {
            return dir.clone();
        }
        if !ConfigDir::new(DEFAULT_DIR).has_ca() && ConfigDir::new(DEV_CONFIG_DIR).has_ca() {
            return DEV_CONFIG_DIR.into();
        }
        DEFAULT_DIR.into()
    }
}

/// How a read command prints.
#[derive(Debug, Clone, Args)]
pub(crate) struct OutputArgs {
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    pub(crate) output: Format,
}

/// The cluster commands, flattened into `cca`'s top level.
#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCommand {
    /// Compile .cca files and apply them to the cluster.
    Apply(ApplyArgs),
    /// Show what `apply` would change, without changing anything.
    Diff(ApplyArgs),
    /// List services, instances or nodes.
    Get(GetArgs),
    /// Show one service, instance or node in detail.
    Describe(DescribeArgs),
    /// List the kept versions of a service's spec: when and by which apply
    /// each was made, how many instances run it, which is current.
    History(HistoryArgs),
    /// Summarise the cluster: nodes, instances by state, unplaced demand.
    Status(ReadArgs),
    /// Show a node's agent's own view: its cached assignments, what its
    /// runtime runs, the drift between them and from the store, its reports.
    NodeInspect(inspect::NodeInspectArgs),
    /// Show what nodes or workloads use of CPU and memory (their agents'
    /// last 30 s) against what they have or requested.
    Top(TopArgs),
    /// Set a service's replica count; `scale why SERVICE` shows what sets it.
    Scale(ScaleArgs),
    /// Follow, list, explain, undo, pause and resume a service's rollouts.
    #[command(subcommand_required = true)]
    Rollout(rollout::RolloutArgs),
    /// Delete a service.
    Delete(DeleteArgs),
    /// Move every instance off a node and place nothing new there.
    Drain(NodeArgs),
    /// Place nothing new on a node; running instances stay.
    DisableNode(NodeArgs),
    /// Undo drain and disable-node.
    EnableNode(NodeArgs),
    /// End a pause of lost-node replacement: the nodes that went missing
    /// at once are really gone, replace what ran there.
    ResumeReplacement(ServerArgs),
    /// Back the cluster up into one sealed file: the store (a consistent
    /// snapshot, taken while it runs), the cluster CA and the secret key.
    Backup(backup::BackupArgs),
    /// Restore a backup into a new embedded data directory or an empty
    /// etcd, with a new store identity; `--check` only proves it.
    Restore(backup::RestoreArgs),
    /// Print the event log.
    Events(EventsArgs),
    /// List the audit log: who changed what, and who was refused.
    Audit(AuditArgs),
    /// Stream changes of the cluster's facts (until Ctrl-C).
    Watch(WatchArgs),
    /// Print the output of an instance, of a service's instances, or of
    /// every service with a tag.
    Logs(LogsArgs),
    /// Run a command in an instance and exit with its exit code.
    Exec(ExecArgs),
    /// Serve the cluster's state to an AI assistant over MCP on standard
    /// input and output (read-only, as the caller; docs/mcp.md).
    Mcp(mcp::McpArgs),
    /// Set, list and remove secret values; re-wrap them under a new key (rotate-key).
    Secret(secret::SecretArgs),
    /// Make, list and revoke join tokens for new nodes.
    Token(token::TokenArgs),
    /// Revoke certificates (one, or a node's or user's) and list revocations.
    Cert(cert::CertArgs),
    /// Make, list and remove users; print a user's token.
    User(user::UserArgs),
    /// Make, list and remove custom roles.
    Role(user::RoleArgs),
    /// Keep a user token (from `cca user token` or an OIDC issuer) for the CLI.
    Login(login::LoginArgs),
    /// Revoke the kept token and forget it.
    Logout(login::LogoutArgs),
    /// Show who the server takes you for (user, roles, tenant).
    Identity(login::SessionArgs),
    /// Print a shell completion script.
    Completions(CompletionsArgs),
}

/// `cca apply|diff [--prune] [--values F] [--set k=v] FILES…`
#[derive(Debug, Args)]
pub(crate) struct ApplyArgs {
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
    #[command(flatten)]
    pub(crate) out: OutputArgs,
    /// Also delete services, gates, … that none of the files define (of
    /// the program's tenant only).
    #[arg(long)]
    pub(crate) prune: bool,
    /// Apply for this tenant (a cluster-wide user's choice; a tenant's
    /// users always apply for their own).
    #[arg(long)]
    pub(crate) tenant: Option<String>,
    /// A `.ccv` values file; may repeat, later files win.
    #[arg(long = "values", value_name = "FILE")]
    pub(crate) values: Vec<PathBuf>,
    /// Set one value; overrides values files.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub(crate) set: Vec<String>,
    /// Set one value from an environment variable.
    #[arg(long = "set-from-env", value_name = "KEY=ENV_VAR")]
    pub(crate) set_from_env: Vec<String>,
    /// The `.cca` files (each with its inclusions).
    #[arg(required = true, value_name = "FILE")]
    pub(crate) files: Vec<PathBuf>,
}

/// What `get` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Kind {
    #[value(alias = "service", alias = "svc")]
    Services,
    #[value(alias = "instance", alias = "inst")]
    Instances,
    #[value(alias = "node", alias = "no")]
    Nodes,
}

/// `cca get services|instances|nodes [--tag k=v] [--node N] [--all]`
#[derive(Debug, Args)]
pub(crate) struct GetArgs {
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
    #[command(flatten)]
    pub(crate) out: OutputArgs,
    pub(crate) kind: Kind,
    /// Only services (or instances of services) with this tag; may repeat.
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    pub(crate) tags: Vec<String>,
    /// Only instances on this node.
    #[arg(long)]
    pub(crate) node: Option<String>,
    /// Only instances of this service.
    #[arg(long)]
    pub(crate) service: Option<String>,
    /// Also stopped instances and reports whose placement is gone.
    #[arg(long, conflicts_with = "running")]
    pub(crate) all: bool,
    /// Only running instances (no failed, starting or pending rows).
    #[arg(long)]
    pub(crate) running: bool,
}

/// What `top` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TopKind {
    #[value(alias = "node", alias = "no")]
    Nodes,
    #[value(alias = "workload", alias = "instances", alias = "instance")]
    Workloads,
}

/// `cca top nodes|workloads [--tag k=v]`
#[derive(Debug, Args)]
pub(crate) struct TopArgs {
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
    #[command(flatten)]
    pub(crate) out: OutputArgs,
    pub(crate) kind: TopKind,
    /// Only instances of services with this tag; may repeat.
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    pub(crate) tags: Vec<String>,
    /// The busiest first, by CPU or memory (default: by name; rows
    /// without a report last).
    #[arg(long, value_enum)]
    pub(crate) sort: Option<TopSort>,
}

/// What `top --sort` orders by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TopSort {
    Cpu,
    Memory,
}

/// What `describe` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DescribeKind {
    #[value(alias = "services", alias = "svc")]
    Service,
    #[value(alias = "instances", alias = "inst")]
    Instance,
    #[value(alias = "nodes", alias = "no")]
    Node,
    #[value(alias = "gates")]
    Gate,
}

/// `cca describe service|instance|node|gate NAME`
#[derive(Debug, Args)]
pub(crate) struct DescribeArgs {
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
    #[command(flatten)]
    pub(crate) out: OutputArgs,
    pub(crate) kind: DescribeKind,
    pub(crate) name: String,
}

/// What `history` lists the versions of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum HistoryKind {
    #[value(alias = "services", alias = "svc")]
    Service,
}

/// `cca history service NAME`
#[derive(Debug, Args)]
pub(crate) struct HistoryArgs {
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
    #[command(flatten)]
    pub(crate) out: OutputArgs,
    pub(crate) kind: HistoryKind,
    pub(crate) name: String,
}

/// A read command with no arguments of its own.
#[derive(Debug, Args)]
pub(crate) struct ReadArgs {
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
    #[command(flatten)]
    pub(crate) out: OutputArgs,
}

/// A command that needs only the server.
#[derive(Debug, Args)]
pub(crate) struct ServerArgs {
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
}

/// `cca scale SERVICE N`, or `cca scale why SERVICE`
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct ScaleArgs {
    #[command(subcommand)]
    pub(crate) why: Option<scale::ScaleCommand>,
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
    #[arg(required = true)]
    pub(crate) service: Option<String>,
    #[arg(required = true)]
    pub(crate) replicas: Option<u32>,
}

/// What `delete` deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DeleteKind {
    #[value(alias = "services", alias = "svc")]
    Service,
}

/// `cca delete service NAME`
#[derive(Debug, Args)]
pub(crate) struct DeleteArgs {
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
    pub(crate) kind: DeleteKind,
    pub(crate) name: String,
}

/// `cca drain|disable-node|enable-node NODE`
#[derive(Debug, Args)]
pub(crate) struct NodeArgs {
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
    pub(crate) node: String,
}

/// `cca audit [--who PREFIX] [--denied] [--since 10m] [--limit N]`
#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
    #[command(flatten)]
    pub(crate) out: OutputArgs,
    /// Only records of callers whose identity starts with this
    /// (`user:alice`, `node:`).
    #[arg(long)]
    pub(crate) who: Option<String>,
    /// Only refused requests.
    #[arg(long)]
    pub(crate) denied: bool,
    /// Only records of the last DURATION (`30s`, `10m`, `2h`, `1d`).
    #[arg(long, value_name = "DURATION", value_parser = crate::flags::duration)]
    pub(crate) since: Option<std::time::Duration>,
    /// At most this many, the newest.
    #[arg(long, default_value_t = 100)]
    pub(crate) limit: usize,
}

/// `cca events [--subject S] [--since 10m] [--limit N] [--follow]`
#[derive(Debug, Args)]
pub(crate) struct EventsArgs {
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
    #[command(flatten)]
    pub(crate) out: OutputArgs,
    /// Only events whose subject starts with this (`service/web`, `node/`).
    #[arg(long)]
    pub(crate) subject: Option<String>,
    /// Only events of the last DURATION (`30s`, `10m`, `2h`, `1d`).
    #[arg(long, value_name = "DURATION", value_parser = crate::flags::duration)]
    pub(crate) since: Option<std::time::Duration>,
    /// At most this many, the newest.
    #[arg(long, default_value_t = 100)]
    pub(crate) limit: usize,
    /// Then print each new event as it is logged, until Ctrl-C (`-o json`:
    /// one object a line).
    #[arg(short, long)]
    pub(crate) follow: bool,
}

/// `cca watch [PREFIX] [--from REV]`
#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
    /// `-o json` prints the API's NDJSON lines as they come.
    #[command(flatten)]
    pub(crate) out: OutputArgs,
    /// Only keys under this prefix (`desired/`, `derived/instance/web/`).
    #[arg(default_value = "")]
    pub(crate) prefix: String,
    /// Replay from this revision on, to resume (0: only new changes).
    #[arg(long, default_value_t = 0)]
    pub(crate) from: i64,
}

/// `cca logs TARGET [-f] [--tail N]` or `cca logs --tag k=v [-f] [--tail N]`
#[derive(Debug, Args)]
pub(crate) struct LogsArgs {
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
    /// An instance id or a service name (instances are tried first).
    #[arg(
        required_unless_present = "tags",
        conflicts_with = "tags",
        value_name = "INSTANCE|SERVICE"
    )]
    pub(crate) target: Option<String>,
    /// Keep printing new lines until the instances exit (or Ctrl-C).
    #[arg(short, long)]
    pub(crate) follow: bool,
    /// Only the last N lines of each instance (default: all it kept).
    #[arg(long, value_name = "N")]
    pub(crate) tail: Option<usize>,
    /// Instead of a TARGET: every service with this tag; may repeat.
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    pub(crate) tags: Vec<String>,
}

/// `cca exec INSTANCE [--timeout 30s] -- CMD ARGS…`
#[derive(Debug, Args)]
pub(crate) struct ExecArgs {
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
    /// The instance id (see `cca get instances`).
    pub(crate) instance: String,
    /// Kill the command after this long (`500ms`, `30s`, `5m`; at most 10m).
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = crate::flags::duration)]
    pub(crate) timeout: std::time::Duration,
    /// The program and its arguments, after `--` (run directly, no shell).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
}

/// `cca completions bash|zsh|fish`
#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    pub(crate) shell: clap_complete::Shell,
}

/// Runs a cluster command. `cli` builds the whole command tree (for completions).
pub(crate) fn run(command: ClusterCommand, cli: fn() -> clap::Command) -> Result<ExitCode> {
    if let ClusterCommand::Completions(args) = &command {
        let mut cli = cli();
        let name = cli.get_name().to_owned();
        clap_complete::generate(args.shell, &mut cli, name, &mut std::io::stdout());
        return Ok(ExitCode::SUCCESS);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime
        .block_on(dispatch(command))
        .map_err(hint_when_unreachable)
}

/// A new user's first command usually finds no server: say how to start
/// one and how to point the CLI elsewhere. Here, not in the client's
/// error, because agents share that error and start no servers.
fn hint_when_unreachable(error: anyhow::Error) -> anyhow::Error {
    let unreachable = error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<cca_wire::ClientError>(),
            Some(cca_wire::ClientError::Unreachable { .. })
        )
    });
    if !unreachable {
        return error;
    }
    anyhow::anyhow!(
        "{error:#}\nhint: start a server with `cca dev FILE` (a whole cluster in one process) \
         or `cca server`, or point the CLI at a running one with --server URL or \
         CCA_SERVER=URL (default {DEFAULT_SERVER})"
    )
}

/// `exec` ends with the remote command's code; every other command
/// succeeds or fails.
async fn dispatch(command: ClusterCommand) -> Result<ExitCode> {
    match command {
        ClusterCommand::Exec(args) => io::exec(&args).await,
        ClusterCommand::Mcp(args) => mcp::run(args).await.map(|()| ExitCode::SUCCESS),
        ClusterCommand::Secret(args) => secret::run(args).await.map(|()| ExitCode::SUCCESS),
        ClusterCommand::Rollout(args) => rollout::run(args).await.map(|()| ExitCode::SUCCESS),
        ClusterCommand::Backup(args) => backup::backup(args).await.map(|()| ExitCode::SUCCESS),
        ClusterCommand::Restore(args) => backup::restore(args).await.map(|()| ExitCode::SUCCESS),
        other => commands::execute(other).await.map(|()| ExitCode::SUCCESS),
    }
}
