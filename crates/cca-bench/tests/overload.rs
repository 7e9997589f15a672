//! The overload scenarios in CI, at a size the 2-core machine can run in
//! under a minute each (500 nodes, 5,000 instances, the production 6 s
//! node TTL and 2 s lost grace): the deploy on a store paced to half its
//! raw commit rate loses no lease; a control plane frozen for twice the
//! TTL moves and duplicates nothing when it thaws; 40 % of the nodes
//! killed at once are replaced only once an operator or the safeguard
//! resumes, and no survivor's lease expires. Correctness only, never
//! timings; `cca benchmark --scenario overload` runs them at full size.
//! They run one at a time: each loads both cores, and two at once on a
//! busy CI machine measure the machine.

use std::time::Duration;

use cca_bench::{BenchConfig, Progress, Report, Scenario, StoreTarget, run_scenario};

/// Reports nothing: the test looks at the result only.
struct Quiet;

impl Progress for Quiet {
    fn phase(&self, _what: &str, _total: u64) {}
    fn advance(&self, _done: u64) {}
}

/// One overload scenario at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn overload_cluster() -> BenchConfig {
    let mut config = BenchConfig::new(500, 5_000, StoreTarget::Embedded(None));
    config.timeout = Duration::from_secs(60);
    config.probe_window = Duration::from_millis(500);
    config
}

async fn run(scenario: Scenario, config: &BenchConfig) -> Report {
    let _one_at_a_time = SERIAL.lock().await;
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

/// 40 % of the nodes killed at once: replacement pauses, nothing is
/// placed while it is paused and no survivor is declared lost; once an
/// operator resumes, every lost instance runs elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mass_kill_is_replaced_only_after_an_operator_resumes() {
    let config = overload_cluster();
    let report = run(Scenario::OverloadMassKill, &config).await;
    check(&report);
    assert_eq!(report.lease_expiries, 200, "{report:#?}");
    let (Some(detection), Some(total)) = (report.detection_seconds, report.total_seconds) else {
        panic!("no detection or total: {report:#?}");
    };
    assert!(
        detection > 0.0 && total > detection + report.seconds,
        "{report:#?}"
    );
}

/// The same with the safeguard instead of an operator: once no further
/// node went missing for its time, the pause ends on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mass_kill_is_replaced_once_the_safeguard_resumes() {
    let mut config = overload_cluster();
    config.resume_replacement_after = Some(Duration::from_secs(5));
    let report = run(Scenario::OverloadMassKill, &config).await;
    check(&report);
    assert_eq!(report.lease_expiries, 200, "{report:#?}");
}
