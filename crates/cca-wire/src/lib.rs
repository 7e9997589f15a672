//! The API as seen from outside the server: the request and response
//! shapes of every route (`types`) and the typed client (`client`). Agents
//! and the CLI depend on this crate, never on the server: nothing here
//! reaches axum or the store, so a node cannot touch the store by
//! construction (a test on `cargo metadata` in `cca-agent` keeps it so).

pub mod client;
pub mod tls;
pub mod types;

pub use client::{
    AuditQuery, Client, ClientError, ClientResult, EventQuery, InstanceQuery, LineStream, LogLines,
};

/// Where `cca server` and `cca dev` listen unless told otherwise, and where
/// the CLI looks for them.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9770";
