//! Helpers shared by the store's integration tests: real etcd servers and
//! clusters on loopback ports that are always stopped, even when a test
//! panics.

#![allow(dead_code, unreachable_pub)]

pub mod etcd;
