//! `cca mcp`: serves the cluster's state to an AI assistant over MCP on
//! standard input and output (`cca_mcp`), with the caller's credentials as
//! every other cluster command finds them.

use anyhow::{Context, Result};
use clap::Args;

use super::ServerAddr;

/// `cca mcp [--token-budget N] [--allow-writes]`
#[derive(Debug, Args)]
pub(crate) struct McpArgs {
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
    /// About how many tokens an answer may take: lists page and long lists
    /// are cut to fit (at least 500).
    #[arg(long, default_value_t = cca_mcp::budget::DEFAULT_TOKEN_BUDGET, value_name = "TOKENS")]
    pub(crate) token_budget: usize,
    /// Offer the tools that change the cluster too (apply, scale, roll
    /// back): each answers a plan first and acts only when called again
    /// with that plan's confirm token.
    #[arg(long)]
    pub(crate) allow_writes: bool,
}

pub(crate) async fn run(args: McpArgs) -> Result<()> {
    if args.token_budget < cca_mcp::budget::MIN_TOKEN_BUDGET {
        anyhow::bail!(
            "--token-budget {}: an answer needs at least {} tokens",
            args.token_budget,
            cca_mcp::budget::MIN_TOKEN_BUDGET
        );
    }
    let client = super::commands::client(&args.addr)?;
    let mut mcp = cca_mcp::CcaMcp::new(client, args.token_budget);
    if args.allow_writes {
        mcp = mcp.allowing_writes()?;
    }
    cca_mcp::serve_stdio(mcp)
        .await
        .context("the MCP session on standard input and output")
}
