//! The synthetic cluster benchmark behind `cca benchmark`: the real control
//! plane (store, cache, runner with leader election, the production
//! controllers, the HTTP API) and N real agents (`cca_agent::run`) talking
//! to it over loopback HTTP with the real `Client`, each driving a
//! [`cca_runtime::sim::SimRuntime`] instead of processes. Nothing bypasses
//! a production path: the harness only starts things, injects faults
//! (kills nodes, restarts the controllers, slows the store, freezes the
//! control plane on its own runtime) and watches the store to time what
//! happens.
//!
//! [`run_scenario`] runs one [`Scenario`] on a fresh cluster and returns a
//! [`Report`]: convergence time, per-instance latency percentiles, success
//! rate, the store's raw transaction rate measured in the same run and the
//! process's peak memory.
//!
//! [`gate`] is a benchmark of its own (`cca benchmark gate`): the gate
//! proxy against nginx in front of the same backends, each in a process
//! of its own.

pub mod browser;
mod chaos;
mod cluster;
mod console;
mod error;
pub mod gate;
mod lifecycle;
mod measure;
mod network;
mod plane_runtime;
mod scenario;
pub mod slow_store;
mod stats;
mod tracker;
mod trust;
mod verify;
pub mod workload;

pub use chaos::ChaosFigures;
pub use cluster::{Cluster, ClusterConfig};
pub use console::ConsoleFigures;
pub use error::BenchError;
pub use lifecycle::LifecycleFigures;
pub use measure::{peak_rss_bytes, raise_open_file_limit};
pub use network::NetworkFigures;
pub use scenario::{BenchConfig, Progress, Report, Scenario, StoreTarget, run_scenario};
pub use stats::Summary;
pub use workload::Workload;
