//! `cca logs` and `cca exec`: an instance's output and commands run in
//! it, both served by the agent of the instance's node and relayed by the
//! API. `logs` prints lines as they arrive and ends with the stream; `exec`
//! prints the remote stdout and stderr on ours and exits with the remote
//! exit code (128 + signal when killed by one, 124 on timeout).

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use cca_wire::types::{ExecCommand, ExecResult};
use cca_wire::{Client, LogLines};
use tokio::task::JoinSet;

use super::commands::client;
use super::output;
use super::{ExecArgs, LogsArgs};

/// Exit code of a command that ran past its timeout (as `timeout(1)`).
const TIMED_OUT: u8 = 124;
/// Added to the signal number of a command a signal ended (as shells do).
const SIGNALLED: i32 = 128;

/// `cca logs TARGET | --tag k=v`: an instance's or a service's lines, or
/// those of every service carrying the tags.
pub(super) async fn logs(args: &LogsArgs) -> Result<()> {
    let client = client(&args.addr)?;
    match &args.target {
        Some(target) => print_lines(target_logs(&client, args, target).await?).await,
        None => tagged_logs(&client, args).await,
    }
}

/// The logs of the instance named `target`, else of the service.
async fn target_logs(client: &Client, args: &LogsArgs, target: &str) -> Result<LogLines> {
    match client.instance(target).await {
        Ok(_) => client
            .instance_logs(target, args.tail, args.follow)
            .await
            .with_context(|| format!("reading the logs of instance `{target}`")),
        Err(error) if error.status() == Some(404) => service_logs(client, args, target).await,
        Err(error) => Err(error).with_context(|| format!("looking up instance `{target}`")),
    }
}

async fn service_logs(client: &Client, args: &LogsArgs, name: &str) -> Result<LogLines> {
    match client.service_logs(name, args.tail, args.follow).await {
        Ok(lines) => Ok(lines),
        Err(error) if error.status() == Some(404) => bail!(
            "no instance or service is named `{name}`; see `cca get instances --all` and \
             `cca get services`"
        ),
        Err(error) => Err(error).with_context(|| format!("reading the logs of service `{name}`")),
    }
}

/// Every service carrying all of `--tag`: one after the other, or all at
/// once when following.
async fn tagged_logs(client: &Client, args: &LogsArgs) -> Result<()> {
    let services = client.services(&args.tags).await?;
    if services.is_empty() {
        bail!("no service carries the tags {}", args.tags.join(", "));
    }
    let mut streams = Vec::with_capacity(services.len());
    for service in &services {
        let stream = client
            .service_logs(&service.name, args.tail, args.follow)
            .await
            .with_context(|| format!("reading the logs of service `{}`", service.name))?;
        streams.push(stream);
    }
    if !args.follow {
        for stream in streams {
            print_lines(stream).await?;
        }
        return Ok(());
    }
    let mut printers = JoinSet::new();
    for stream in streams {
        printers.spawn(print_lines(stream));
    }
    while let Some(printed) = printers.join_next().await {
        printed.context("a log printer failed")??;
    }
    Ok(())
}

/// Prints each line as it arrives, until the stream ends.
async fn print_lines(mut lines: LogLines) -> Result<()> {
    while let Some(line) = lines.next().await {
        output::line(&line?);
    }
    Ok(())
}

/// `cca exec INSTANCE [--timeout D] -- CMD ARGS…`
pub(super) async fn exec(args: &ExecArgs) -> Result<ExitCode> {
    let command = ExecCommand {
        argv: args.command.clone(),
        timeout_ms: u64::try_from(args.timeout.as_millis()).unwrap_or(u64::MAX),
    };
    let result = client(&args.addr)?
        .exec(&args.instance, &command)
        .await
        .with_context(|| {
            format!(
                "running `{}` in `{}`",
                args.command.join(" "),
                args.instance
            )
        })?;
    output::raw(&result.stdout);
    print_stderr(&result.stderr);
    if result.timed_out {
        print_stderr(&format!(
            "cca exec: the command ran past {:?} and was killed\n",
            args.timeout
        ));
    }
    Ok(ExitCode::from(exit_code(&result)))
}

#[allow(clippy::print_stderr, reason = "the remote stderr goes to ours")]
fn print_stderr(text: &str) {
    eprint!("{text}");
}

/// The exit code `exec` ends with, like a shell's `$?`.
fn exit_code(result: &ExecResult) -> u8 {
    if result.timed_out {
        return TIMED_OUT;
    }
    let code = match (result.code, result.signal) {
        (Some(code), _) => code,
        (None, Some(signal)) => SIGNALLED + signal,
        (None, None) => 1,
    };
    u8::try_from(code).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(code: Option<i32>, signal: Option<i32>, timed_out: bool) -> u8 {
        exit_code(&ExecResult {
            code,
            signal,
            timed_out,
            ..ExecResult::default()
        })
    }

    #[test]
    fn exit_codes_read_like_a_shells() {
        assert_eq!(ended(Some(0), None, false), 0);
        assert_eq!(ended(Some(3), None, false), 3);
        assert_eq!(ended(None, Some(9), false), 137);
        assert_eq!(ended(None, Some(9), true), 124);
        assert_eq!(ended(None, None, false), 1);
    }
}
