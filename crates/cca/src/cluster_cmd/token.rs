//! `cca token create|ls|revoke`: join tokens for new nodes. `create`
//! prints the token once (the server keeps only its hash) with the
//! command a new node runs; `ls` shows every token's state without
//! secrets; `revoke` stops a token from admitting anyone.

use std::time::Duration;

use anyhow::Result;
use cca_wire::types::{CreateTokenRequest, TokenInfo};
use clap::{Args, Subcommand};

use super::commands::client;
use super::output::{self, age, now_millis, or_dash};
use super::{OutputArgs, ServerAddr};

/// `cca token create|ls|revoke`
#[derive(Debug, Args)]
pub(crate) struct TokenArgs {
    #[command(subcommand)]
    pub(crate) command: TokenCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Make a join token for new nodes (printed once; the server keeps a hash).
    Create(CreateArgs),
    /// List join tokens and their state, never their secrets.
    #[command(alias = "list")]
    Ls(LsArgs),
    /// Revoke a join token: it admits no node from now on.
    Revoke(RevokeArgs),
}

/// `cca token create [--ttl 1h] [--node NAME] [--uses N]`
#[derive(Debug, Args)]
pub(crate) struct CreateArgs {
    #[command(flatten)]
    addr: ServerAddr,
    #[command(flatten)]
    out: OutputArgs,
    /// How long the token admits nodes (at most 30d).
    #[arg(long, default_value = "1h", value_name = "DURATION", value_parser = crate::flags::duration)]
    ttl: Duration,
    /// The only node the token may enrol.
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// How many nodes it may enrol (default: any number until it expires).
    #[arg(long, value_name = "N")]
    uses: Option<u32>,
    /// What the token is for, shown by `cca token ls`.
    #[arg(long, default_value = "")]
    description: String,
}

/// `cca token ls`
#[derive(Debug, Args)]
pub(crate) struct LsArgs {
    #[command(flatten)]
    addr: ServerAddr,
    #[command(flatten)]
    out: OutputArgs,
}

/// `cca token revoke ID`
#[derive(Debug, Args)]
pub(crate) struct RevokeArgs {
    #[command(flatten)]
    addr: ServerAddr,
    /// The token's id (the part between `::` and `.`; `cca token ls` lists them).
    id: String,
}

pub(super) async fn run(args: TokenArgs) -> Result<()> {
    match args.command {
        TokenCommand::Create(args) => {
            let api = client(&args.addr)?;
            let request = CreateTokenRequest {
                ttl_secs: Some(args.ttl.as_secs().max(1)),
                node: args.node.clone(),
                uses: args.uses,
                description: args.description.clone(),
            };
            let created = api.create_token(&request).await?;
            if !output::structured(args.out.output, &created)? {
                output::line(&created.token);
                hint(api.base_url(), &created.token, args.node.as_deref());
            }
        }
        TokenCommand::Ls(args) => {
            let tokens = client(&args.addr)?.tokens().await?;
            if !output::structured(args.out.output, &tokens)? {
                print_tokens(&tokens);
            }
        }
        TokenCommand::Revoke(args) => {
            let token = client(&args.addr)?.revoke_token(&args.id).await?;
            output::line(&format!("token/{} revoked", token.id));
        }
    }
    Ok(())
}

#[allow(
    clippy::print_stderr,
    reason = "advice beside the token, which alone goes to stdout"
)]
fn hint(server: &str, token: &str, node: Option<&str>) {
    let node = node.map_or_else(String::new, |node| format!(" --node {node}"));
    eprintln!(
        "On the new node, run (the token is shown only now):\n  \
         cca agent --server {server} --join {token}{node}"
    );
}

fn print_tokens(tokens: &[TokenInfo]) {
    let now = now_millis();
    let rows = tokens
        .iter()
        .map(|token| {
            let expires = if token.expires_at > now {
                format!("in {}", age(Some(now), token.expires_at))
            } else {
                format!("{} ago", age(Some(token.expires_at), now))
            };
            vec![
                token.id.clone(),
                token.state.clone(),
                age(Some(token.created_at), now),
                expires,
                or_dash(token.node.clone()),
                token
                    .uses_left
                    .map_or_else(|| "any".to_owned(), |uses| uses.to_string()),
                or_dash(Some(token.created_by.clone())),
                or_dash(Some(token.description.clone())),
            ]
        })
        .collect();
    output::table(
        &[
            "id",
            "state",
            "age",
            "expires",
            "node",
            "uses left",
            "created by",
            "description",
        ],
        rows,
    );
}
