//! Test fixtures other crates' tests and benchmarks share (feature
//! `testing`): real etcd processes on loopback that are always stopped,
//! and a store that simulates its writer crashing.
//! Not part of the store's production API.

pub mod crash;
pub mod etcd;

pub use crash::{CrashAfter, CrashBudget};
