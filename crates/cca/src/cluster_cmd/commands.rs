//! The cluster commands themselves: compile locally where needed, call the
//! API through the typed client, print through [`output`](super::output).

use anyhow::{Context, Result, bail};
use cca_dsl::commands::{Style, ValueOptions, gather_values};
use cca_dsl::compile::compile_file;
use cca_dsl::source::RealFs;
use cca_model::spec::{Cpu, Memory, Program};
use cca_wire::types::{
    ApplyReport, EventRecord, InstanceSummary, InstanceTop, NodeSummary, NodeTop, ReportedUsage,
    ServiceHistory, ServiceSummary, WatchLine,
};
use cca_wire::{Client, EventQuery, InstanceQuery};
use std::cmp::Reverse;

use super::output::{self, Format, age, now_millis, or_dash};
use super::{
    ApplyArgs, AuditArgs, ClusterCommand, EventsArgs, GetArgs, HistoryArgs, HistoryKind, Kind,
    ServerAddr, TopArgs, TopKind, TopSort, WatchArgs, describe,
};

/// Runs one command against the API server.
pub(super) async fn execute(command: ClusterCommand) -> Result<()> {
    match command {
        ClusterCommand::Apply(args) => apply(&args, false).await,
        ClusterCommand::Diff(args) => apply(&args, true).await,
        ClusterCommand::Get(args) => get(&args).await,
        ClusterCommand::Top(args) => top(&args).await,
        ClusterCommand::NodeInspect(args) => super::inspect::run(&args).await,
        ClusterCommand::Describe(args) => describe::describe(&client(&args.addr)?, &args).await,
        ClusterCommand::History(args) => history(&args).await,
        ClusterCommand::Status(args) => {
            describe::status(&client(&args.addr)?, args.out.output).await
        }
        ClusterCommand::Scale(args) => super::scale::run(args).await,
        ClusterCommand::Delete(args) => {
            let report = client(&args.addr)?.delete_service(&args.name).await?;
            output::line(&format!("service/{} deleted", report.service));
            Ok(())
        }
        ClusterCommand::Drain(args) => {
            client(&args.addr)?.drain(&args.node).await?;
            output::line(&format!("node/{} draining", args.node));
            Ok(())
        }
        ClusterCommand::DisableNode(args) => {
            client(&args.addr)?.disable_node(&args.node).await?;
            output::line(&format!("node/{} disabled", args.node));
            Ok(())
        }
        ClusterCommand::EnableNode(args) => {
            client(&args.addr)?.enable_node(&args.node).await?;
            output::line(&format!("node/{} enabled", args.node));
            Ok(())
        }
        ClusterCommand::ResumeReplacement(args) => {
            let resumed = client(&args.addr)?.resume_replacement().await?;
            output::line(&format!(
                "lost-node replacement resumed: the {} of {} nodes missing since the pause ({} ago) \
                 are replaced once unreachable for the lost grace",
                resumed.missing,
                resumed.nodes,
                output::age(Some(resumed.since), output::now_millis())
            ));
            Ok(())
        }
        ClusterCommand::Events(args) => events(&args).await,
        ClusterCommand::Audit(args) => audit(&args).await,
        ClusterCommand::Watch(args) => watch(&args).await,
        ClusterCommand::Logs(args) => super::io::logs(&args).await,
        ClusterCommand::Token(args) => super::token::run(args).await,
        ClusterCommand::Cert(args) => super::cert::run(args).await,
        ClusterCommand::User(args) => super::user::run_user(args).await,
        ClusterCommand::Role(args) => super::user::run_role(args).await,
        ClusterCommand::Login(args) => super::login::login(args).await,
        ClusterCommand::Logout(args) => super::login::logout(args).await,
        ClusterCommand::Identity(args) => super::login::identity(args).await,
        // Answered by `run` (completions) and `dispatch` (exec's exit code).
        ClusterCommand::Exec(_)
        | ClusterCommand::Mcp(_)
        | ClusterCommand::Secret(_)
        | ClusterCommand::Rollout(_)
        | ClusterCommand::Backup(_)
        | ClusterCommand::Restore(_)
        | ClusterCommand::Completions(_) => Ok(()),
    }
}

/// A client of the server `addr` names, with the caller's credentials:
/// `$CCA_TOKEN` (with the config directory's CA), else what `cca login`
/// kept, else the config directory's local admin certificate over HTTPS,
/// else plain HTTP when there is no cluster CA.
pub(super) fn client(addr: &ServerAddr) -> Result<Client> {
    let config = cca_trust::config_dir::ConfigDir::new(addr.config_dir());
    let secure = config.has_ca();
    if let Some(token) = std::env::var("CCA_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        let ca_pem = std::fs::read_to_string(config.ca_cert()).with_context(|| {
            format!(
                "CCA_TOKEN is set, and {} holds no cluster CA to check the server with: pass \
                 --config-dir, or `cca login` with --ca-file",
                config.root().display()
            )
        })?;
        let server = addr
            .server
            .clone()
            .unwrap_or_else(|| super::DEFAULT_SERVER.replacen("http://", "https://", 1));
        return client_with(&super::login::Credentials {
            server,
            token: token.trim().to_owned(),
            ca_pem,
        });
    }
    if !secure && let Some(mut kept) = super::login::Credentials::load()? {
        if let Some(server) = &addr.server {
            kept.server.clone_from(server);
        }
        return client_with(&kept);
    }
    let server = match &addr.server {
        Some(server) => server.clone(),
        None if secure => super::DEFAULT_SERVER.replacen("http://", "https://", 1),
        None => super::DEFAULT_SERVER.to_owned(),
    };
    if !server.starts_with("https://") {
        return Ok(Client::new(&server));
    }
    if !secure {
        anyhow::bail!(
            "{server} is served over HTTPS, and {} holds no cluster CA to check it with: pass --config-dir (or set CCA_CONFIG_DIR) to the directory `cca init` made, or `cca login`",
            config.root().display()
        );
    }
    admin_client(&config, &server)
}

/// A client of the server `addr` names with no credentials of its own:
/// whoever uses it adds theirs to each request (`cca mcp --listen`). It
/// trusts the config directory's cluster CA when there is one (then the
/// server must be `https://`, and the second value is true).
pub(super) fn anonymous_client(addr: &ServerAddr) -> Result<(Client, bool)> {
    let config = cca_trust::config_dir::ConfigDir::new(addr.config_dir());
    if !config.has_ca() {
        let server = addr
            .server
            .clone()
            .unwrap_or_else(|| super::DEFAULT_SERVER.to_owned());
        return Ok((Client::new(&server), false));
    }
    let server = addr
        .server
        .clone()
        .unwrap_or_else(|| super::DEFAULT_SERVER.replacen("http://", "https://", 1));
    if !server.starts_with("https://") {
        anyhow::bail!(
            "{server}: a cluster with a CA ({}) is served over https://, and callers' tokens are \
             only sent there",
            config.root().display()
        );
    }
    let ca_pem = std::fs::read_to_string(config.ca_cert())
        .with_context(|| format!("reading the cluster CA {}", config.ca_cert().display()))?;
    let tls = cca_wire::tls::ClientTls::new(ca_pem);
    Ok((Client::with_tls(&server, &tls)?, true))
}

/// A client of `server` (`https://…`) as the local admin of `config`.
pub(crate) fn admin_client(
    config: &cca_trust::config_dir::ConfigDir,
    server: &str,
) -> Result<Client> {
    let admin = config
        .load_admin(cca_model::clock::system_now())
        .context("reading the local admin's certificate")?;
    let certificate = cca_wire::tls::ClientCertificate::from_pem(&admin.cert_pem, &admin.key_pem)?;
    let tls = cca_wire::tls::ClientTls::new(admin.ca_pem)
        .with_certificate(std::sync::Arc::new(certificate));
    Ok(Client::with_tls(server, &tls)?)
}

/// A client presenting a user's token over HTTPS checked against their CA.
pub(super) fn client_with(credentials: &super::login::Credentials) -> Result<Client> {
    if !credentials.server.starts_with("https://") {
        anyhow::bail!(
            "a token is only sent over HTTPS: {} is not an https:// URL",
            credentials.server
        );
    }
    let tls = cca_wire::tls::ClientTls::new(credentials.ca_pem.clone());
    Ok(Client::with_tls(&credentials.server, &tls)?.with_bearer(&credentials.token))
}

/// Compiles every file (reporting diagnostics on stderr) into one program.
fn compile(args: &ApplyArgs) -> Result<Program> {
    let options = ValueOptions {
        files: args.values.clone(),
        set: args.set.clone(),
        set_from_env: args.set_from_env.clone(),
    };
    let mut program = compile_files(&args.files, &options)?;
    program.tenant.clone_from(&args.tenant);
    Ok(program)
}

/// Compiles `files` with the given values into one program; diagnostics go
/// to stderr and any error fails the whole compile.
pub(crate) fn compile_files(
    files: &[std::path::PathBuf],
    options: &ValueOptions,
) -> Result<Program> {
    let env = |name: &str| std::env::var(name).ok();
    let mut program = Program::default();
    let mut failed = false;
    for path in files {
        let values = gather_values(&RealFs, path, options, &env)
            .map_err(|message| anyhow::anyhow!(message))?;
        // The load error names the file and the OS's reason already.
        let compilation = compile_file(&RealFs, path, &values)?;
        if !compilation.diagnostics.is_empty() {
            report_diagnostics(&compilation);
        }
        failed |= compilation.has_errors();
        program.merge(compilation.program)?;
    }
    if failed {
        bail!("the files have errors; nothing was sent to the server");
    }
    // Each file passed on its own; some rules span files (a host served
    // by gates in two of them). The server would refuse these too.
    let problems = program.problems();
    if !problems.is_empty() {
        let list: String = problems.iter().map(|p| format!("\n  {p}")).collect();
        bail!("the files together have problems; nothing was sent to the server:{list}");
    }
    Ok(program)
}

#[allow(clippy::print_stderr, reason = "compiler diagnostics go to stderr")]
fn report_diagnostics(compilation: &cca_dsl::compile::Compilation) {
    let style = Style {
        color: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        ..Style::default()
    };
    let text = cca_dsl::commands::report::render_human(
        &compilation.loaded.sources,
        &compilation.diagnostics,
        style,
    );
    eprint!("{text}");
}

async fn apply(args: &ApplyArgs, dry_run: bool) -> Result<()> {
    let program = compile(args)?;
    let client = client(&args.addr)?;
    let report = if dry_run {
        client.diff(&program, args.prune).await?
    } else {
        client.apply(&program, args.prune).await?
    };
    if output::structured(args.out.output, &report)? {
        return Ok(());
    }
    print_report(&report);
    Ok(())
}

/// `service/web created`, … then a summary line.
fn print_report(report: &ApplyReport) {
    let (created, changed, deleted) = if report.dry_run {
        ("would be created", "would change", "would be deleted")
    } else {
        ("created", "changed", "deleted")
    };
    for (keys, verb) in [
        (&report.created, created),
        (&report.changed, changed),
        (&report.deleted, deleted),
    ] {
        for key in keys {
            output::line(&format!("{} {verb}", short_key(key)));
        }
    }
    let summary = format!(
        "{} created, {} changed, {} deleted, {} unchanged",
        report.created.len(),
        report.changed.len(),
        report.deleted.len(),
        report.unchanged
    );
    match (report.dry_run, report.revision) {
        (true, _) => output::line(&format!("diff: {summary}")),
        (false, Some(revision)) => {
            output::line(&format!("applied at revision {revision}: {summary}"))
        }
        (false, None) => output::line(&format!("nothing to apply: {summary}")),
    }
}

/// `desired/service/web` → `service/web`.
fn short_key(key: &str) -> &str {
    key.strip_prefix(cca_model::keys::DESIRED).unwrap_or(key)
}

async fn history(args: &HistoryArgs) -> Result<()> {
    let HistoryKind::Service = args.kind;
    let history = client(&args.addr)?.service_history(&args.name).await?;
    if !output::structured(args.out.output, &history)? {
        history_table(&history);
    }
    Ok(())
}

/// Newest first; `*` marks the current version.
fn history_table(history: &ServiceHistory) {
    let now = now_millis();
    let rows = history
        .versions
        .iter()
        .map(|version| {
            vec![
                version.version.clone(),
                if version.current { "*" } else { "" }.into(),
                version.instances.to_string(),
                version.revision.to_string(),
                age(Some(version.applied_at), now),
                age(Some(version.created_at), now),
            ]
        })
        .collect();
    output::table(
        &[
            "version",
            "current",
            "instances",
            "revision",
            "applied",
            "created",
        ],
        rows,
    );
}

async fn get(args: &GetArgs) -> Result<()> {
    let client = client(&args.addr)?;
    let format = args.out.output;
    match args.kind {
        Kind::Services => {
            let rows = client.services(&args.tags).await?;
            if !output::structured(format, &rows)? {
                service_table(&rows);
            }
        }
        Kind::Instances => {
            let query = InstanceQuery {
                service: args.service.clone(),
                node: args.node.clone(),
                tags: args.tags.clone(),
                all: args.all,
                running: args.running,
                pending: !args.running,
            };
            let rows = client.instances(&query).await?;
            if !output::structured(format, &rows)? {
                instance_table(&rows);
            }
        }
        Kind::Nodes => {
            let rows = client.nodes().await?;
            if !output::structured(format, &rows)? {
                node_table(&rows);
            }
        }
    }
    Ok(())
}

async fn top(args: &TopArgs) -> Result<()> {
    let client = client(&args.addr)?;
    let format = args.out.output;
    match args.kind {
        TopKind::Nodes => {
            if !args.tags.is_empty() {
                bail!("--tag selects workloads: `cca top workloads --tag K=V`");
            }
            let mut rows = client.top_nodes().await?;
            if let Some(by) = args.sort {
                rows.sort_by_key(|row| Reverse(busiest(row.usage.as_ref(), by)));
            }
            if !output::structured(format, &rows)? {
                top_node_table(&rows);
            }
        }
        TopKind::Workloads => {
            let mut rows = client.top_workloads(&args.tags).await?;
            if let Some(by) = args.sort {
                rows.sort_by_key(|row| Reverse(busiest(row.usage.as_ref(), by)));
            }
            if !output::structured(format, &rows)? {
                top_instance_table(&rows);
            }
        }
    }
    Ok(())
}

/// The figure `top --sort` orders by; a row without a report sorts last.
fn busiest(usage: Option<&ReportedUsage>, by: TopSort) -> Option<u64> {
    usage.map(|usage| match by {
        TopSort::Cpu => usage.summary.cpu_millis,
        TopSort::Memory => usage.summary.memory_bytes,
    })
}

/// `used (share%)` of a whole, or `-` without a report.
fn used_of(used: Option<u64>, whole: u64, show: impl Fn(u64) -> String) -> String {
    match used {
        None => "-".into(),
        Some(used) if whole == 0 => show(used),
        Some(used) => format!("{} ({}%)", show(used), used * 100 / whole),
    }
}

fn top_node_table(rows: &[NodeTop]) {
    let now = now_millis();
    let cpu = |millis| output::cpu(Cpu(millis));
    let memory = |bytes| Memory(bytes).human();
    let rows = rows
        .iter()
        .map(|n| {
            let usage = n.usage.map(|usage| usage.summary);
            vec![
                n.node.clone(),
                n.status.clone(),
                used_of(usage.map(|u| u.cpu_millis), n.cpu.0, cpu),
                format!("{}/{}", cpu(n.cpu_requested.0), cpu(n.cpu.0)),
                used_of(usage.map(|u| u.memory_bytes), n.memory.0, memory),
                format!("{}/{}", memory(n.memory_requested.0), memory(n.memory.0)),
                age(n.usage.map(|usage| usage.at), now),
            ]
        })
        .collect();
    output::table(
        &[
            "node",
            "status",
            "cpu used",
            "cpu requested",
            "memory used",
            "memory requested",
            "reported",
        ],
        rows,
    );
}

pub(super) fn top_instance_table(rows: &[InstanceTop]) {
    let now = now_millis();
    let cpu = |millis| output::cpu(Cpu(millis));
    let memory = |bytes| Memory(bytes).human();
    let request = |value: u64, show: &dyn Fn(u64) -> String| {
        if value == 0 { "-".into() } else { show(value) }
    };
    let rows = rows
        .iter()
        .map(|i| {
            let usage = i.usage.map(|usage| usage.summary);
            vec![
                i.instance.clone(),
                i.service.clone(),
                i.node.clone(),
                used_of(usage.map(|u| u.cpu_millis), i.cpu_request.0, cpu),
                usage.map_or("-".into(), |u| cpu(u.cpu_peak_millis)),
                request(i.cpu_request.0, &cpu),
                used_of(usage.map(|u| u.memory_bytes), i.memory_request.0, memory),
                usage.map_or("-".into(), |u| memory(u.memory_peak_bytes)),
                request(i.memory_request.0, &memory),
                age(i.usage.map(|usage| usage.at), now),
            ]
        })
        .collect();
    output::table(
        &[
            "instance",
            "service",
            "node",
            "cpu",
            "cpu peak",
            "cpu request",
            "memory",
            "memory peak",
            "memory request",
            "reported",
        ],
        rows,
    );
}

fn service_table(rows: &[ServiceSummary]) {
    let now = now_millis();
    let rows = rows
        .iter()
        .map(|s| {
            let tags: Vec<String> = s.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
            vec![
                s.name.clone(),
                s.workload.clone(),
                output::running(s, now),
                s.instances.to_string(),
                s.unplaced.to_string(),
                output::vip(s.vip.as_ref()),
                or_dash(Some(tags.join(","))),
                age(s.created_at, now),
            ]
        })
        .collect();
    output::table(
        &[
            "name",
            "workload",
            "running",
            "instances",
            "unplaced",
            "vip",
            "tags",
            "age",
        ],
        rows,
    );
}

pub(super) fn instance_table(rows: &[InstanceSummary]) {
    let now = now_millis();
    let rows = rows
        .iter()
        .map(|i| {
            let state = if i.stopping {
                format!("{} (stopping)", i.state)
            } else {
                i.state.clone()
            };
            vec![
                i.id.clone(),
                i.service.clone(),
                i.node.clone(),
                state,
                i.healthy
                    .map_or("-".into(), |h| if h { "yes".into() } else { "no".into() }),
                i.restarts.to_string(),
                or_dash(i.address.clone()),
                age(i.created_at, now),
            ]
        })
        .collect();
    output::table(
        &[
            "id", "service", "node", "state", "healthy", "restarts", "address", "age",
        ],
        rows,
    );
}

/// `ready`, `ready,draining`, `unreachable,disabled`, …
pub(super) fn node_state(node: &NodeSummary) -> String {
    let mut state = node.status.clone();
    if node.draining {
        state.push_str(",draining");
    }
    if node.disabled {
        state.push_str(",disabled");
    }
    state
}

fn node_table(rows: &[NodeSummary]) {
    let now = now_millis();
    let rows = rows
        .iter()
        .map(|n| {
            vec![
                n.name.clone(),
                node_state(n),
                format!("{}/{}", output::cpu(n.cpu_allocated), output::cpu(n.cpu)),
                format!("{}/{}", n.memory_allocated.human(), n.memory.human()),
                n.instances.to_string(),
                n.arch.clone(),
                or_dash(n.zone.clone()),
                age(Some(n.registered_at), now),
            ]
        })
        .collect();
    output::table(
        &[
            "name",
            "status",
            "cpu",
            "memory",
            "instances",
            "arch",
            "zone",
            "age",
        ],
        rows,
    );
}

async fn events(args: &EventsArgs) -> Result<()> {
    let since = args
        .since
        .map(|span| now_millis().saturating_sub(cca_model::clock::span_millis(span)));
    let query = EventQuery {
        since,
        subject: args.subject.clone(),
        limit: Some(args.limit),
    };
    if args.follow {
        return follow_events(&client(&args.addr)?, &query, args.out.output).await;
    }
    let records = client(&args.addr)?.events(&query).await?;
    if !output::structured(args.out.output, &records)? {
        event_table(&records);
    }
    Ok(())
}

/// `cca events --follow`: one line per event as they come, its time in
/// full (an age goes stale on a terminal), until the server ends the
/// stream.
async fn follow_events(client: &Client, query: &EventQuery, format: Format) -> Result<()> {
    let mut stream = client.follow_events(query).await?;
    if format == Format::Table {
        output::line(&event_line("TIME", "LEVEL", "SOURCE", "SUBJECT", "MESSAGE"));
    }
    while let Some(record) = stream.next().await {
        let record = record?;
        if format != Format::Table {
            output::json_line(&record)?;
            continue;
        }
        let event = &record.event;
        output::line(&event_line(
            &output::rfc3339(event.at),
            event_level(event.level),
            &event.source,
            &event.subject,
            &event.message,
        ));
    }
    bail!(
        "the server ended the event stream (it stopped, or its history was compacted); run `cca events --follow` again"
    )
}

fn event_line(time: &str, level: &str, source: &str, subject: &str, message: &str) -> String {
    format!("{time:<24}   {level:<5}   {source:<10}   {subject:<24}   {message}")
}

fn event_level(level: cca_model::cluster::EventLevel) -> &'static str {
    match level {
        cca_model::cluster::EventLevel::Info => "info",
        cca_model::cluster::EventLevel::Warning => "warning",
    }
}

pub(super) fn event_table(records: &[EventRecord]) {
    let now = now_millis();
    let rows = records
        .iter()
        .map(|r| {
            vec![
                age(Some(r.event.at), now),
                event_level(r.event.level).to_owned(),
                r.event.source.clone(),
                r.event.subject.clone(),
                r.event.message.clone(),
            ]
        })
        .collect();
    output::table(&["age", "level", "source", "subject", "message"], rows);
}

async fn audit(args: &AuditArgs) -> Result<()> {
    let since = args
        .since
        .map(|span| now_millis().saturating_sub(cca_model::clock::span_millis(span)));
    let query = cca_wire::AuditQuery {
        since,
        who: args.who.clone(),
        denied: args.denied,
        limit: Some(args.limit),
    };
    let entries = client(&args.addr)?.audit(&query).await?;
    if !output::structured(args.out.output, &entries)? {
        let now = now_millis();
        let rows = entries
            .iter()
            .map(|entry| {
                let record = &entry.record;
                vec![
                    age(Some(record.at), now),
                    or_dash(record.who.clone()),
                    or_dash(Some(record.address.clone()).filter(|a| !a.is_empty())),
                    record.method.clone(),
                    record.path.clone(),
                    record.status.to_string(),
                    or_dash(record.detail.clone()),
                ]
            })
            .collect();
        output::table(
            &[
                "age", "who", "address", "method", "path", "status", "detail",
            ],
            rows,
        );
    }
    Ok(())
}

async fn watch(args: &WatchArgs) -> Result<()> {
    let mut stream = client(&args.addr)?.watch(&args.prefix, args.from).await?;
    while let Some(line) = stream.next().await {
        let line = line?;
        if args.out.output != Format::Table {
            output::json_line(&line)?;
            continue;
        }
        match line {
            WatchLine::Put {
                revision,
                key,
                value,
            } => {
                output::line(&format!("{revision}\tPUT\t{key}\t{value}"));
            }
            WatchLine::Delete { revision, key } => {
                output::line(&format!("{revision}\tDELETE\t{key}"));
            }
            WatchLine::Compacted { compact_revision } => bail!(
                "history up to revision {compact_revision} is compacted; watch again without --from"
            ),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each file is sound alone; together they serve one host from two
    /// gates, which the server would refuse: nothing is sent.
    #[test]
    fn files_are_checked_together_before_sending() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut files = Vec::new();
        for name in ["a", "b"] {
            let path = dir.path().join(format!("{name}.cca"));
            let text = format!(
                "service {name} {{\n  run = \"x\"\n  port 80\n}}\n\
                 gate {name} {{\n  host \"shop.example.com\"\n  service {name}\n}}\n"
            );
            std::fs::write(&path, text).expect("writes");
            files.push(path);
        }
        let alone = compile_files(&files[..1], &ValueOptions::default());
        assert!(alone.is_ok(), "{alone:?}");
        let error =
            compile_files(&files, &ValueOptions::default()).expect_err("one host, two gates");
        assert_eq!(
            error.to_string(),
            "the files together have problems; nothing was sent to the server:\n  \
             cca::E016 gate `b` hosts[0]: host `shop.example.com` is already served by gate \
             `a` (a host is served by one gate: remove it from all but one)"
        );
    }
}
