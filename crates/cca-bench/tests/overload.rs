//! The overload scenarios in CI, at a size the 2-core machine can run in
//! under a minute each (500 nodes, 5,000 instances, a 3 s node TTL, a 1 s
//! lost grace): the deploy on a store paced to half its raw commit rate
//! loses no lease, and a control plane frozen for twice the TTL moves and
//! duplicates nothing when it thaws. Correctness only, never timings;
//! `cca benchmark --scenario overload` runs them at full size.

use std::time::Duration;

use cca_bench::{BenchConfig, Progress, Report, Scenario, StoreTarget, run_scenario};

/// Reports nothing: the test looks at the result only.
struct Quiet;

impl Progress for Quiet {
    fn phase(&self, _what: &str, _total: u64) {}
    fn advance(&self, _done: u64) {}
}

fn overload_cluster() -> BenchConfig {
    let mut config = BenchConfig::new(500, 5_000, StoreTarget::Embedded(None));
    config.node_ttl = Duration::from_secs(3);
    config.lost_grace = Duration::from_secs(1);
    config.timeout = Duration::from_secs(60);
    config.probe_window = Duration::from_millis(500);
    config
}

async fn run(scenario: Scenario, config: &BenchConfig) -> Report {
    run_scenario(scenario, config, &Quiet)
        .await
        .unwrap_or_else(|error| panic!("{}: {error}", scenario.name()))
}

fn check(report: &Report) {
    assert!(report.violations.is_empty(), "{report:#?}");
    assert_eq!(report.false_lease_expiries, 0, "{report:#?}");
    assert_eq!(report.success_rate, 1.0, "{report:#?}");
    assert_eq!(report.instances, 5_000, "{report:#?}");
    assert!(report.passed(), "{report:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_on_a_store_at_half_its_rate_loses_no_lease() {
    let report = run(Scenario::OverloadSlowStore, &overload_cluster()).await;
    check(&report);
    assert_eq!(report.lease_expiries, 0, "{report:#?}");
    let paced = report.store_paced_txn_per_s.expect("the store was paced");
    assert!(
        (paced - report.store_txn_per_s / 2.0).abs() < 1e-6 * report.store_txn_per_s,
        "{report:#?}"
    );
}

/// The control plane frozen for twice the node TTL: every lease expires
/// meanwhile (the store is not frozen) and every agent must register
/// again; afterwards nothing may have moved, been replaced or been
/// duplicated, and no lease may expire once every node is ready again.
/// Only a node controller that takes a mass expiry for its own failure,
/// not the nodes', holds this: whether the agents register again before
/// the lost grace runs out is a race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_control_plane_moves_nothing_when_it_thaws() {
    let config = overload_cluster();
    let report = run(Scenario::OverloadFreeze, &config).await;
    assert!(
        report.lease_expiries >= config.nodes as u64,
        "the freeze did not expire every lease: {report:#?}"
    );
    assert!(
        report.re_registrations >= config.nodes as u64,
        "{report:#?}"
    );
    check(&report);
}
