//! `cca cert revoke|revoked`: take back certificates before they expire —
//! one by its serial, or every certificate of a node or a user issued
//! until now (a node that joins again later gets a new one that works) —
//! and list what is revoked. The server refuses a revoked certificate from
//! the next handshake on and closes connections that present one.

use anyhow::Result;
use cca_model::access::RevokedTarget;
use cca_wire::types::RevokeRequest;
use clap::{Args, Subcommand};

use super::commands::client;
use super::output::{self, age, now_millis, or_dash};
use super::{OutputArgs, ServerAddr};

/// `cca cert revoke|revoked`
#[derive(Debug, Args)]
pub(crate) struct CertArgs {
    #[command(subcommand)]
    pub(crate) command: CertCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum CertCommand {
    /// Revoke one certificate (--serial) or every certificate of a node or user issued until now.
    Revoke(RevokeArgs),
    /// List revoked certificates and identities.
    Revoked(RevokedArgs),
}

/// `cca cert revoke (--serial HEX | --node NAME | --user NAME) [--reason TEXT]`
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["serial", "node", "user"])))]
pub(crate) struct RevokeArgs {
    #[command(flatten)]
    addr: ServerAddr,
    /// One certificate's serial number (hex, as `openssl x509 -serial` prints it).
    #[arg(long)]
    serial: Option<String>,
    /// Every certificate of this node issued until now.
    #[arg(long)]
    node: Option<String>,
    /// Every certificate of this user issued until now.
    #[arg(long)]
    user: Option<String>,
    /// Why, for the record.
    #[arg(long, default_value = "")]
    reason: String,
}

/// `cca cert revoked`
#[derive(Debug, Args)]
pub(crate) struct RevokedArgs {
    #[command(flatten)]
    addr: ServerAddr,
    #[command(flatten)]
    out: OutputArgs,
}

pub(super) async fn run(args: CertArgs) -> Result<()> {
    match args.command {
        CertCommand::Revoke(args) => {
            let request = RevokeRequest {
                serial: args.serial.clone(),
                node: args.node.clone(),
                user: args.user.clone(),
                reason: args.reason.clone(),
            };
            let entry = client(&args.addr)?.revoke(&request).await?;
            output::line(&format!("revoked {}", describe(&entry.record.target)));
        }
        CertCommand::Revoked(args) => {
            let entries = client(&args.addr)?.revocations().await?;
            if !output::structured(args.out.output, &entries)? {
                let now = now_millis();
                let rows = entries
                    .iter()
                    .map(|entry| {
                        vec![
                            describe(&entry.record.target),
                            age(Some(entry.record.at), now),
                            or_dash(Some(entry.record.by.clone())),
                            or_dash(Some(entry.record.reason.clone())),
                        ]
                    })
                    .collect();
                output::table(&["revoked", "age", "by", "reason"], rows);
            }
        }
    }
    Ok(())
}

fn describe(target: &RevokedTarget) -> String {
    match target {
        RevokedTarget::Serial { serial } => format!("certificate {serial}"),
        RevokedTarget::Identity { kind, name } => format!("every certificate of {kind}:{name}"),
        RevokedTarget::Token { jti, .. } => format!("user token {jti}"),
    }
}
