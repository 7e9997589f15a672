//! Test fixtures other crates' tests and benchmarks share (feature
//! `testing`): real etcd processes on loopback that are always stopped.
//! Not part of the store's production API.

pub mod etcd;
