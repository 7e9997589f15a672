//! The vocabulary of CCattler: where every fact lives in the store and who
//! may write it. This crate does no IO and knows nothing of tokio, HTTP or
//! any store backend; every other crate builds on it. It reads the wall
//! clock in one place, [`clock::now_millis`], for everyone.

pub mod access;
pub mod autoscale;
pub mod clock;
pub mod cluster;
pub mod exposition;
pub mod facts;
pub mod hex;
pub mod keys;
pub mod net;
pub mod node_lease;
pub mod ownership;
pub mod recovery;
pub mod rollout;
pub mod scale;
pub mod spec;
pub mod usage;
pub mod validity;
pub mod vertical;

pub use facts::{Key, Kind, Value};
pub use ownership::{Owner, OwnershipError, owner_of};

/// A store-wide logical clock. Every committed change bumps it by one; a
/// transaction that changes nothing leaves it alone. Starts at 1 on an
/// empty store, like etcd. Agents and clients see it too (assignment
/// streams resume from one), which is why it lives here and not in the store.
pub type Revision = i64;

/// Identifies a store lease. Never 0.
pub type LeaseId = i64;
