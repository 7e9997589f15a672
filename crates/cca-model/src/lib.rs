//! The vocabulary of CCattler: where every fact lives in the store and who
//! may write it. This crate does no IO and knows nothing of tokio, HTTP or
//! any store backend; every other crate builds on it.

pub mod cluster;
pub mod keys;
pub mod ownership;
pub mod spec;

pub use ownership::{Owner, OwnershipError, owner_of};
