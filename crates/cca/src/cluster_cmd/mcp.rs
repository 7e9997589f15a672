//! `cca mcp`: serves the cluster's state to an AI assistant over MCP
//! (`cca_mcp`): on standard input and output with the caller's credentials
//! as every other cluster command finds them, or with `--listen` over HTTP
//! on loopback, each request with its own bearer token.

use anyhow::{Context, Result};
use clap::Args;

use super::ServerAddr;

/// `cca mcp [--token-budget N] [--allow-writes] [--listen ADDR]`
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
    /// Serve MCP over HTTP at `http://ADDR/mcp` instead of standard input
    /// and output, each request acting as its `Authorization: Bearer`
    /// token's user (required when the cluster has a CA). Loopback
    /// addresses only: tokens cross it in the clear.
    #[arg(long, value_name = "ADDR")]
    pub(crate) listen: Option<std::net::SocketAddr>,
}

pub(crate) async fn run(args: McpArgs) -> Result<()> {
    if args.token_budget < cca_mcp::budget::MIN_TOKEN_BUDGET {
        anyhow::bail!(
            "--token-budget {}: an answer needs at least {} tokens",
            args.token_budget,
            cca_mcp::budget::MIN_TOKEN_BUDGET
        );
    }
    if let Some(listen) = args.listen {
        return serve_http(&args, listen).await;
    }
    let client = super::commands::client(&args.addr)?;
    let mcp = server(client, &args)?;
    cca_mcp::serve_stdio(mcp)
        .await
        .context("the MCP session on standard input and output")
}

fn server(client: cca_wire::Client, args: &McpArgs) -> Result<cca_mcp::CcaMcp> {
    let mcp = cca_mcp::CcaMcp::new(client, args.token_budget);
    Ok(if args.allow_writes {
        mcp.allowing_writes()?
    } else {
        mcp
    })
}

/// MCP over HTTP on `listen` until Ctrl-C or SIGTERM.
#[allow(
    clippy::print_stderr,
    reason = "says where it serves, as `cca server` does"
)]
async fn serve_http(args: &McpArgs, listen: std::net::SocketAddr) -> Result<()> {
    if !listen.ip().is_loopback() {
        anyhow::bail!(
            "--listen {listen}: `cca mcp` serves plain HTTP, and each request carries its \
             caller's token: listen on loopback (127.0.0.1 or [::1]) and reach it from \
             elsewhere through a TLS proxy"
        );
    }
    // The server's own credentials are never used: each request brings its
    // caller's.
    let (client, secure) = super::commands::anonymous_client(&args.addr)?;
    let mcp = server(client, args)?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let bound = listener.local_addr().context("the listener's address")?;
    eprintln!(
        "cca mcp: serving MCP at http://{bound}{}{}",
        cca_mcp::http::MCP_PATH,
        if secure {
            " (each request as its `Authorization: Bearer` token's user)"
        } else {
            " (the cluster has no CA: no tokens)"
        }
    );
    let options = cca_mcp::http::HttpOptions {
        bearer_required: secure,
    };
    cca_mcp::http::serve_http(listener, mcp, options, crate::server_cmd::shutdown_signal())
        .await
        .context("serving MCP over HTTP")
}
