//! Cluster DNS: the server every node (in the agent) and every server (in
//! `cca server`) runs on port [`DNS_PORT`](cca_model::net::DNS_PORT). It
//! answers the zone [`DNS_ZONE`](cca_model::net::DNS_ZONE) from the node's
//! [`NetworkMap`](cca_model::net::NetworkMap) — a snapshot its owner swaps
//! in with [`DnsHandle::set_map`] — and forwards every other name to the
//! host's resolvers (reference: `docs/dns.md`).
//!
//! [`answer`] is the zone, as a pure function of a query packet and a map;
//! [`upstream`] reads `resolv.conf` and relays what is not ours;
//! [`server`] holds the sockets and loops; [`metrics`] the counters.
//!
//! ```no_run
//! # async fn example(map: std::sync::Arc<cca_model::net::NetworkMap>) -> Result<(), cca_dns::DnsError> {
//! let server = cca_dns::DnsServer::bind(cca_dns::DnsConfig::default(), map.clone()).await?;
//! let handle = server.handle();
//! let task = tokio::spawn(server.run(async { /* the owner's shutdown signal */ }));
//! handle.set_map(map); // after every change to the node's map
//! let answered = handle.metrics().snapshot().queries;
//! # Ok(()) }
//! ```

pub mod answer;
pub mod metrics;
pub mod server;
pub mod upstream;

pub use answer::{Action, TTL, Transport};
pub use metrics::{Metrics, MetricsSnapshot};
pub use server::{DnsConfig, DnsError, DnsHandle, DnsServer};
pub use upstream::Upstreams;
