//! CCattler's MCP server (`cca mcp`): the tools an AI assistant reads a
//! cluster with. It is a client of the API like the CLI, with the
//! caller's own credentials, so the API authorizes and audits every call
//! as the caller's. It reads only, unless started with writes allowed
//! (`writes`: each write planned, then carried out only with the plan's
//! confirmation token). Every answer fits a token budget
//! (`budget`): lists are paged with cursors, problems first, and a large
//! object has its long lists cut with a count of what was left out.
//! `server` holds the tools; [`serve_stdio`] runs them for one assistant
//! on standard input and output, [`http::serve_http`] for any number over
//! HTTP, each request as its bearer token's caller.

pub mod budget;
pub mod http;
mod server;
mod writes;

pub use server::CcaMcp;

/// Serves `mcp` on standard input and output until the assistant closes
/// them.
pub async fn serve_stdio(mcp: CcaMcp) -> Result<(), Error> {
    use rmcp::ServiceExt as _;
    let running = mcp
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|error| Error::Start(error.to_string()))?;
    running
        .waiting()
        .await
        .map_err(|error| Error::Serve(error.to_string()))?;
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("starting the MCP session on standard input and output: {0}")]
    Start(String),
    #[error("serving the MCP session: {0}")]
    Serve(String),
}
