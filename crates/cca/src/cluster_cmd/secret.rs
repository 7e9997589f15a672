//! `cca secret set|ls|rm|rotate-key`: secret values through the API. A
//! value comes from stdin (one trailing newline dropped, so `echo pw | cca
//! secret set db` stores `pw`) or, as it is, from `--from-file`; it is
//! never printed, and `ls` shows names and states only. `rotate-key` has
//! the server re-wrap every secret under its primary key and fails when
//! any record could not be.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};

use super::commands::client;
use super::output::{self, age, now_millis};
use super::{OutputArgs, ServerAddr};

/// `cca secret set|ls|rm`
#[derive(Debug, Args)]
pub(crate) struct SecretArgs {
    #[command(subcommand)]
    pub(crate) command: SecretCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum SecretCommand {
    /// Set a secret's value from stdin (or --from-file); replaces an earlier one.
    Set(SetArgs),
    /// List secrets: declared, set, when, used by — never values.
    #[command(alias = "list")]
    Ls(LsArgs),
    /// Remove a secret's value (its declaration stays in the program).
    #[command(alias = "remove")]
    Rm(RmArgs),
    /// Re-wrap every secret's data key under the server's primary key (after
    /// starting the servers with a new key and the old one as an old key).
    RotateKey(RotateKeyArgs),
}

/// `cca secret set NAME [--from-file F]`
#[derive(Debug, Args)]
pub(crate) struct SetArgs {
    #[command(flatten)]
    addr: ServerAddr,
    name: String,
    /// Read the value from this file, as it is (default: stdin, one
    /// trailing newline dropped).
    #[arg(long, value_name = "FILE")]
    from_file: Option<PathBuf>,
}

/// `cca secret ls`
#[derive(Debug, Args)]
pub(crate) struct LsArgs {
    #[command(flatten)]
    addr: ServerAddr,
    #[command(flatten)]
    out: OutputArgs,
}

/// `cca secret rm NAME`
#[derive(Debug, Args)]
pub(crate) struct RmArgs {
    #[command(flatten)]
    addr: ServerAddr,
    name: String,
}

/// `cca secret rotate-key`
#[derive(Debug, Args)]
pub(crate) struct RotateKeyArgs {
    #[command(flatten)]
    addr: ServerAddr,
    #[command(flatten)]
    out: OutputArgs,
}

pub(super) async fn run(args: SecretArgs) -> Result<()> {
    match args.command {
        SecretCommand::Set(args) => {
            let value = read_value(&args)?;
            let reply = client(&args.addr)?.set_secret(&args.name, value).await?;
            let verb = if reply.created { "set" } else { "replaced" };
            output::line(&format!("secret/{} {verb}", reply.name));
        }
        SecretCommand::Ls(args) => {
            let secrets = client(&args.addr)?.secrets().await?;
            if !output::structured(args.out.output, &secrets)? {
                let now = now_millis();
                let yes_no = |flag: bool| if flag { "yes" } else { "no" }.to_owned();
                let rows = secrets
                    .into_iter()
                    .map(|secret| {
                        vec![
                            secret.name,
                            yes_no(secret.declared),
                            yes_no(secret.set),
                            if secret.set {
                                age(secret.set_at, now)
                            } else {
                                "-".to_owned()
                            },
                            if secret.used_by.is_empty() {
                                "-".to_owned()
                            } else {
                                secret.used_by.join(",")
                            },
                        ]
                    })
                    .collect();
                output::table(&["name", "declared", "set", "age", "used by"], rows);
            }
        }
        SecretCommand::Rm(args) => {
            let reply = client(&args.addr)?.delete_secret(&args.name).await?;
            output::line(&format!("secret/{} removed", reply.name));
        }
        SecretCommand::RotateKey(args) => {
            let reply = client(&args.addr)?.rotate_secret_key().await?;
            if !output::structured(args.out.output, &reply)? {
                output::line(&format!(
                    "secrets under key {}: {} re-wrapped, {} already current, {} failed",
                    reply.key_id,
                    reply.rewrapped,
                    reply.current,
                    reply.failed.len()
                ));
                for failure in &reply.failed {
                    output::line(&format!("  {}: {}", failure.name, failure.error));
                }
            }
            if !reply.failed.is_empty() {
                bail!(
                    "{} secret(s) were not re-wrapped: keep the old key until they are fixed (set them again, or start the servers with the key they name), then rotate again",
                    reply.failed.len()
                );
            }
        }
    }
    Ok(())
}

/// The value to set: the file's bytes, or stdin's without one trailing
/// newline; UTF-8 text either way.
fn read_value(args: &SetArgs) -> Result<String> {
    let bytes = match &args.from_file {
        Some(path) => std::fs::read(path).with_context(|| {
            format!(
                "reading the value of `{}` from {}",
                args.name,
                path.display()
            )
        })?,
        None => {
            let mut stdin = std::io::stdin();
            if stdin.is_terminal() {
                prompt(&args.name);
            }
            let mut bytes = Vec::new();
            stdin
                .read_to_end(&mut bytes)
                .context("reading the value from stdin")?;
            if bytes.ends_with(b"\n") {
                bytes.pop();
                if bytes.ends_with(b"\r") {
                    bytes.pop();
                }
            }
            bytes
        }
    };
    if bytes.is_empty() {
        bail!(
            "the value of `{}` is empty: pipe it in (`printf %s VALUE | cca secret set {}`) or pass --from-file",
            args.name,
            args.name
        );
    }
    String::from_utf8(bytes).map_err(|_| {
        anyhow::anyhow!(
            "the value of `{}` is not UTF-8 text: secrets hold text (encode binary values, e.g. with base64)",
            args.name
        )
    })
}

#[allow(clippy::print_stderr, reason = "a prompt, not output")]
fn prompt(name: &str) {
    eprintln!("value of `{name}` (end with Ctrl-D):");
}
