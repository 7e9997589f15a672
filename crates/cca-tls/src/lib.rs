//! TLS as the cluster speaks it, for both ends of every connection: the
//! API server and its clients, and the agent's own API and the server
//! calling it. One CA (the cluster's) is the only root on either side, and
//! a valid chain is not enough: each end names whom it expects at the
//! other ([`ExpectedPeer`], checked on the `cca://{kind}/{name}` identity
//! of the peer's certificate). A [`Certificate`] is replaceable while in
//! use, so a renewal is presented from the next handshake on, whether the
//! certificate serves or authenticates a client (the API server's does
//! both: it serves the API and calls agents with it).
//!
//! [`client`] holds the clients' side ([`ClientTls`]), [`server`] the
//! servers' ([`ServerTls`], the [`TlsListener`] that handshakes off the
//! accept loop, the [`RevocationList`] every handshake checks), [`sni`]
//! a gate's certificates by host name ([`HostCertificates`]). No IO of
//! its own beyond the listener's sockets; no routes: those are the API's
//! and the agent's.

pub mod client;
mod pem;
pub mod server;
pub mod sni;

pub use client::{ClientTls, ExpectedPeer};
pub use pem::Certificate;
pub use server::{RevocationList, ServerTls, TlsConnection, TlsListener};
pub use sni::{HostCertificates, HostPair};

/// What went wrong setting up TLS.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("the {what} is not usable PEM: {reason}")]
    Pem { what: &'static str, reason: String },
    #[error("the certificate and key do not fit together: {0}")]
    KeyMismatch(String),
    #[error("cannot build the TLS configuration: {0}")]
    Config(String),
}
