//! `cca readiness server|agent [FLAGS]`: the pre-flight of a server or a
//! node, given the very flags it would start with. Each check prints a
//! verdict and what to do; the command exits 1 when any check fails, so
//! a deployment script stops before a start that would not work. The
//! checks live in `cca_agent::preflight` and beside each command's flags.

use std::process::ExitCode;

use anyhow::{Context, Result};
use cca_agent::preflight::{Check, Verdict};
use clap::{Args, Subcommand};

use crate::cluster_cmd::output::{self, Format};

/// `cca readiness [-o json] server|agent …`
#[derive(Debug, Args)]
pub(crate) struct ReadinessArgs {
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Table, global = true)]
    output: Format,
    #[command(subcommand)]
    role: Role,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// Check what `cca server` with these flags needs.
    Server(Box<crate::server_cmd::ServerArgs>),
    /// Check what `cca agent` with these flags needs.
    Agent(Box<crate::agent_cmd::AgentArgs>),
}

pub(crate) fn run(args: ReadinessArgs) -> Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let checks = runtime.block_on(async {
        match &args.role {
            Role::Server(server) => crate::server_cmd::readiness(server).await,
            Role::Agent(agent) => crate::agent_cmd::readiness(agent).await,
        }
    });
    if !output::structured(args.output, &checks)? {
        print(&checks);
    }
    Ok(if ready(&checks) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn ready(checks: &[Check]) -> bool {
    checks.iter().all(|check| check.verdict != Verdict::Fail)
}

fn print(checks: &[Check]) {
    let rows = checks
        .iter()
        .map(|check| {
            let verdict = match check.verdict {
                Verdict::Pass => "ok",
                Verdict::Warn => "warn",
                Verdict::Fail => "FAIL",
            };
            vec![check.name.clone(), verdict.to_owned(), check.detail.clone()]
        })
        .collect();
    output::table(&["check", "result", "detail"], rows);
    let failed = checks.iter().filter(|c| c.verdict == Verdict::Fail).count();
    let warned = checks.iter().filter(|c| c.verdict == Verdict::Warn).count();
    output::line("");
    output::line(&if failed == 0 {
        format!("ready ({warned} warning(s))")
    } else {
        format!("NOT ready: {failed} check(s) failed, {warned} warning(s)")
    });
}
