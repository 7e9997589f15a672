//! The API over a loopback socket with the typed client: the agent cycle
//! (register, heartbeat, assignment stream, reports, re-register after a
//! lost lease), the node's held host ports, the resumable watch stream,
//! concurrent updates of one service, and errors carrying the server's
//! status and message.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use cca_model::cluster::{Instance, InstanceState, InstanceStatus};
use cca_model::{Key, keys};
use cca_store::{Op, Txn};
use cca_wire::types::{AssignmentLine, Resume, WatchLine};
use support::{harness, program};

const WAIT: Duration = Duration::from_secs(10);

fn placed(id: &str, node: &str) -> Instance {
    support::instance(id, "web", node)
}

fn report(id: &str, node: &str, state: InstanceState) -> InstanceStatus {
    InstanceStatus {
        id: id.into(),
        service: "web".into(),
        node: node.into(),
        state,
        healthy: None,
        pid: Some(42),
        address: None,
        own_network: false,
        host_ports: BTreeMap::new(),
        restarts: 0,
        last_exit: None,
        message: None,
        updated_at: 0,
    }
}

async fn place(store: &dyn cca_store::Store, instance: &Instance) -> i64 {
    let key = keys::derived_instance(&instance.service, &instance.id);
    let value = serde_json::to_vec(instance).expect("encodes");
    store
        .txn(Txn::new().then(Op::put(key, value)))
        .await
        .expect("placed")
        .revision()
}

async fn next<T: serde::de::DeserializeOwned>(stream: &mut cca_wire::LineStream<T>) -> T {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("a line in time")
        .expect("stream open")
        .expect("line decodes")
}

#[tokio::test]
async fn a_report_batch_writes_what_it_may_refuses_the_rest_one_by_one_and_skips_repeats() {
    let h = harness().await;
    let (plain, _stop) = h.serve().await;
    // Agents sharing a connection speak HTTP/2 without negotiation.
    let client = cca_wire::Client::http2(plain.base_url()).expect("client");
    client
        .apply(&program(&[("web", 3)]), false)
        .await
        .expect("applies");
    client
        .register(&support::node_request("n1"))
        .await
        .expect("registers");
    client
        .register(&support::node_request("n2"))
        .await
        .expect("registers");
    place(h.store.as_ref(), &placed("web-1", "n1")).await;
    place(h.store.as_ref(), &placed("web-2", "n1")).await;
    place(h.store.as_ref(), &placed("web-3", "n2")).await;

    let mut foreign = report("web-9", "n2", InstanceState::Running);
    foreign.service = "web".into();
    let batch = vec![
        report("web-1", "n1", InstanceState::Running),
        report("web-2", "n1", InstanceState::Starting),
        report("web-3", "n1", InstanceState::Running),
        foreign,
    ];
    let reply = client.report_batch("n1", batch).await.expect("answers");
    let mut refused: Vec<(&str, u16, &str)> = reply
        .refused
        .iter()
        .map(|refused| {
            (
                refused.id.as_str(),
                refused.status,
                refused.message.as_str(),
            )
        })
        .collect();
    refused.sort();
    assert_eq!(
        refused
            .iter()
            .map(|(id, status, _)| (*id, *status))
            .collect::<Vec<_>>(),
        [("web-3", 409), ("web-9", 422)],
        "{reply:?}"
    );
    assert!(
        refused[0].2.contains("not placed on node `n1`"),
        "{reply:?}"
    );
    let written = reply.revision.expect("something was written");
    let stored = |id: &'static str| {
        let store = std::sync::Arc::clone(&h.store);
        async move {
            store
                .get(&keys::observed_instance(id))
                .await
                .expect("reads")
                .map(|kv| serde_json::from_slice::<InstanceStatus>(&kv.value).expect("decodes"))
        }
    };
    assert_eq!(
        stored("web-1").await.map(|s| s.state),
        Some(InstanceState::Running)
    );
    assert_eq!(
        stored("web-2").await.map(|s| s.state),
        Some(InstanceState::Starting)
    );
    assert_eq!(stored("web-3").await, None);
    assert_eq!(stored("web-9").await, None);

    // Sent again later, unchanged but for the time: nothing is written.
    let mut again = report("web-1", "n1", InstanceState::Running);
    again.updated_at = 99;
    let reply = client
        .report_batch("n1", vec![again])
        .await
        .expect("answers");
    assert_eq!(reply.revision, None, "{reply:?}");
    assert_eq!(h.revision().await, written);
    // A change is.
    let reply = client
        .report_batch("n1", vec![report("web-2", "n1", InstanceState::Running)])
        .await
        .expect("answers");
    assert!(
        reply.refused.is_empty() && reply.revision > Some(written),
        "{reply:?}"
    );

    let before = h.keys().await;
    let too_many = vec![report("web-1", "n1", InstanceState::Running); 1_001];
    let error = client
        .report_batch("n1", too_many)
        .await
        .expect_err("over the limit");
    assert_eq!(error.status(), Some(422));
    assert!(error.to_string().contains("at most 1000"), "{error}");
    let error = client
        .report_batch("n7", vec![report("web-1", "n7", InstanceState::Running)])
        .await
        .expect_err("not registered");
    assert_eq!(error.status(), Some(404));
    assert_eq!(h.keys().await, before, "refused batches write nothing");
}

#[tokio::test]
async fn agent_registers_heartbeats_follows_assignments_and_reports() {
    let h = harness().await;
    let (client, _stop) = h.serve().await;
    client
        .apply(&program(&[("web", 2)]), false)
        .await
        .expect("applies");
    let registered = client
        .register(&support::node_request("n1"))
        .await
        .expect("registers");
    client
        .register(&support::node_request("n2"))
        .await
        .expect("registers");
    assert_eq!(
        registered.ttl_secs,
        cca_api::ApiConfig::default().node_leases.shortest.as_secs()
    );
    client
        .heartbeat("n1", registered.lease_id)
        .await
        .expect("heartbeat");

    place(h.store.as_ref(), &placed("web-1", "n1")).await;
    let mut stream = client
        .assignments("n1", &Resume::SNAPSHOT)
        .await
        .expect("stream");
    let AssignmentLine::Snapshot {
        assignments,
        revision,
        origin,
    } = next(&mut stream).await
    else {
        panic!("the stream starts with a snapshot");
    };
    let identity = h
        .store
        .get(&keys::store_identity())
        .await
        .expect("reads")
        .expect("the control plane made the store's identity");
    let identity: cca_model::recovery::StoreIdentity =
        serde_json::from_slice(&identity.value).expect("decodes");
    assert_eq!(origin.store, identity.id, "the snapshot names the store");
    assert!(!origin.epoch.is_empty());
    let resume = |from: i64| Resume {
        from,
        epoch: origin.epoch.clone(),
    };
    assert_eq!(assignments.len(), 1);
    assert_eq!(assignments[0].instance.id, "web-1");
    assert_eq!(assignments[0].spec.as_ref().map(|s| s.replicas), Some(2));

    place(h.store.as_ref(), &placed("web-2", "n2")).await;
    place(h.store.as_ref(), &placed("web-3", "n1")).await;
    let line = next(&mut stream).await;
    assert!(
        matches!(&line, AssignmentLine::Put { assignment, .. } if assignment.instance.id == "web-3"),
        "other nodes' placements are not shown: {line:?}"
    );
    // web-1 moves to n2: for n1 that is a delete.
    place(h.store.as_ref(), &placed("web-1", "n2")).await;
    let line = next(&mut stream).await;
    assert!(
        matches!(&line, AssignmentLine::Delete { id, .. } if id == "web-1"),
        "{line:?}"
    );

    // Resuming from the snapshot's revision replays the same changes.
    let mut resumed = client
        .assignments("n1", &resume(revision + 1))
        .await
        .expect("stream");
    let line = next(&mut resumed).await;
    assert!(
        matches!(&line, AssignmentLine::Put { assignment, .. } if assignment.instance.id == "web-3"),
        "{line:?}"
    );
    // The same revision in another epoch (another server, another store)
    // means nothing here: a snapshot.
    let foreign = Resume {
        from: 1_000_000,
        epoch: "another".into(),
    };
    let mut elsewhere = client.assignments("n1", &foreign).await.expect("stream");
    let line = next(&mut elsewhere).await;
    assert!(
        matches!(&line, AssignmentLine::Snapshot { origin: o, .. } if *o == origin),
        "{line:?}"
    );

    // One revision is several lines when placements commit together; a
    // stream cut after the first resumes at that revision and gets them all.
    let together = [placed("web-4", "n1"), placed("web-5", "n1")];
    let txn = together.iter().fold(Txn::new(), |txn, instance| {
        let key = keys::derived_instance(&instance.service, &instance.id);
        txn.then(Op::put(key, serde_json::to_vec(instance).expect("encodes")))
    });
    let both = h.store.txn(txn).await.expect("placed").revision();
    let first = next(&mut stream).await;
    assert!(
        matches!(&first, AssignmentLine::Put { revision, .. } if *revision == both),
        "{first:?}"
    );
    // The stream that started with a snapshot for a foreign resume point
    // gets every later line, whatever revision that point named.
    let later = next(&mut elsewhere).await;
    assert!(
        matches!(&later, AssignmentLine::Put { revision, .. } if *revision == both),
        "{later:?}"
    );
    drop(stream);
    let mut resumed = client
        .assignments("n1", &resume(both))
        .await
        .expect("stream");
    let mut ids = Vec::new();
    for _ in 0..2 {
        match next(&mut resumed).await {
            AssignmentLine::Put {
                revision,
                assignment,
            } if revision == both => {
                ids.push(assignment.instance.id);
            }
            other => panic!("revision {both}'s lines again: {other:?}"),
        }
    }
    ids.sort();
    assert_eq!(ids, ["web-4", "web-5"]);
    let txn = together.iter().fold(Txn::new(), |txn, instance| {
        txn.then(Op::delete(keys::derived_instance(
            &instance.service,
            &instance.id,
        )))
    });
    h.store.txn(txn).await.expect("removed");

    client
        .report("n1", &report("web-3", "n1", InstanceState::Running))
        .await
        .expect("own instance");
    let before = h.keys().await;
    let refused = client
        .report("n1", &report("web-2", "n1", InstanceState::Running))
        .await
        .expect_err("web-2 is placed on n2");
    assert_eq!(refused.status(), Some(409));
    assert!(
        refused.to_string().contains("not placed on node `n1`"),
        "{refused}"
    );
    assert_eq!(h.keys().await, before, "a refused report writes nothing");
    // After a move the old node may still say it stopped the instance.
    client
        .report("n1", &report("web-1", "n1", InstanceState::Stopped))
        .await
        .expect("stopped reports are accepted after a move");
    let refused = client
        .forget_instance("n2", "web-3")
        .await
        .expect_err("n2 did not write web-3's record");
    assert_eq!(refused.status(), Some(409));
    client
        .forget_instance("n1", "web-1")
        .await
        .expect("forgets");

    let rows = client
        .instances(&cca_wire::InstanceQuery {
            node: Some("n1".into()),
            ..Default::default()
        })
        .await
        .expect("lists");
    let states: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r.id.as_str(), r.state.as_str()))
        .collect();
    assert_eq!(states, [("web-3", "running")]);

    h.store
        .revoke_lease(registered.lease_id)
        .await
        .expect("revokes");
    let lost = client
        .heartbeat("n1", registered.lease_id)
        .await
        .expect_err("the lease is gone");
    assert_eq!(lost.status(), Some(409));
    assert!(lost.to_string().contains("register again"), "{lost}");
    let again = client
        .register(&support::node_request("n1"))
        .await
        .expect("re-registers");
    client
        .heartbeat("n1", again.lease_id)
        .await
        .expect("heartbeat");
}

#[tokio::test]
async fn watch_streams_changes_and_resumes_from_a_revision() {
    let h = harness().await;
    let (client, _stop) = h.serve().await;
    let first = client
        .apply(&program(&[("web", 1)]), false)
        .await
        .expect("applies");
    let from = first.revision.expect("written");
    client.scale("web", 3).await.expect("scales");
    let mut stream = client.watch("desired/service/", from).await.expect("watch");
    let mut keys = Vec::new();
    while keys.len() < 3 {
        // Apply also keeps the spec as a version: not what this is about.
        if let WatchLine::Put { key, .. } = next(&mut stream).await
            && !matches!(Key::parse(&key), Some(Key::ServiceVersion { .. }))
        {
            keys.push(key);
        }
    }
    assert_eq!(
        keys,
        [
            "desired/service/web",
            "desired/service/web/tag/team",
            "desired/service/web"
        ]
    );
}

#[tokio::test]
async fn client_errors_carry_the_status_and_message() {
    let h = harness().await;
    let (client, _stop) = h.serve().await;
    let error = client.service("ghost").await.expect_err("no such service");
    assert_eq!(error.status(), Some(404));
    assert_eq!(error.to_string(), "service `ghost` not found (HTTP 404)");
    let nowhere = cca_wire::Client::new("http://127.0.0.1:1");
    let error = nowhere.status().await.expect_err("nothing listens");
    assert!(
        error
            .to_string()
            .starts_with("cannot reach the API server at http://127.0.0.1:1"),
        "{error}"
    );
}

/// The API's cache frozen at its first listing (its watch never opens):
/// what a report batch checks against the view may be stale, and the
/// store must decide instead.
#[tokio::test]
async fn a_report_batch_is_not_misled_by_a_view_that_lags() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store: std::sync::Arc<dyn cca_store::Store> = std::sync::Arc::new(
        cca_store::embedded::EmbeddedStore::open(cca_store::embedded::Config::new(dir.path()))
            .await
            .expect("store opens"),
    );
    // Known to the view: web-2 placed on n1 and reported running.
    place(store.as_ref(), &placed("web-2", "n1")).await;
    let running = report("web-2", "n1", InstanceState::Running);
    store
        .txn(Txn::new().then(Op::put(
            keys::observed_instance("web-2"),
            serde_json::to_vec(&running).expect("encodes"),
        )))
        .await
        .expect("reported");
    let (_never_opened, gate) = tokio::sync::watch::channel(false);
    let gated = support::gated(std::sync::Arc::clone(&store), gate);
    let cache = std::sync::Arc::new(
        cca_control::Cache::start(std::sync::Arc::clone(&gated))
            .await
            .expect("cache starts"),
    );
    let state = cca_api::ApiState::new(
        gated,
        cache,
        cca_api::ApiConfig::default(),
        std::sync::Arc::new(String::new),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let address = listener.local_addr().expect("address");
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(cca_api::serve(listener, state, async {
        let _ = stopped.await;
    }));
    let client = cca_wire::Client::new(&format!("http://{address}"));
    client
        .register(&support::node_request("n1"))
        .await
        .expect("registers");

    // Unknown to the view: web-1's placement, and web-2 failing since.
    place(store.as_ref(), &placed("web-1", "n1")).await;
    let failed = report("web-2", "n1", InstanceState::Failed);
    store
        .txn(Txn::new().then(Op::put(
            keys::observed_instance("web-2"),
            serde_json::to_vec(&failed).expect("encodes"),
        )))
        .await
        .expect("reported");

    let batch = vec![
        report("web-1", "n1", InstanceState::Running),
        report("web-2", "n1", InstanceState::Running),
    ];
    let reply = client.report_batch("n1", batch).await.expect("answers");
    assert!(
        reply.refused.is_empty(),
        "placed on n1 in the store: {reply:?}"
    );
    for id in ["web-1", "web-2"] {
        let kv = store
            .get(&keys::observed_instance(id))
            .await
            .expect("reads")
            .expect("recorded");
        let status: InstanceStatus = serde_json::from_slice(&kv.value).expect("decodes");
        assert_eq!(
            status.state,
            InstanceState::Running,
            "{id}: the view's old record must not pass for the current one"
        );
    }
}

/// 32 clients scaling one service at once all succeed: each conflict is
/// re-read and re-applied. The committed updates form one chain (each
/// one's `previous` is the replicas of the one committed before it) and
/// the service ends with the last one's value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_scales_of_one_service_all_land() {
    let h = harness().await;
    let (client, _stop) = h.serve().await;
    client
        .apply(&program(&[("web", 1)]), false)
        .await
        .expect("applies");
    let tasks: Vec<_> = (2..34_u32)
        .map(|replicas| {
            let client = client.clone();
            tokio::spawn(async move { client.scale("web", replicas).await })
        })
        .collect();
    let mut reports = Vec::new();
    for task in tasks {
        reports.push(task.await.expect("task").expect("every scale lands"));
    }
    reports.sort_by_key(|report| report.revision);
    let mut expected_previous = 1;
    for report in &reports {
        assert_eq!(report.previous, expected_previous, "{reports:?}");
        expected_previous = report.replicas;
    }
    let mut requested: Vec<u32> = reports.iter().map(|report| report.replicas).collect();
    requested.sort_unstable();
    assert_eq!(requested, (2..34).collect::<Vec<_>>());
    let stored = h
        .store
        .get(&keys::desired_service("web"))
        .await
        .expect("get")
        .expect("the service is there");
    let spec: cca_model::spec::ServiceSpec =
        serde_json::from_slice(&stored.value).expect("decodes");
    assert_eq!(spec.replicas, expected_previous);
}

async fn put_fact<T: serde::Serialize>(
    store: &dyn cca_store::Store,
    key: String,
    value: &T,
) -> i64 {
    let value = serde_json::to_vec(value).expect("encodes");
    store
        .txn(Txn::new().then(Op::put(key, value)))
        .await
        .expect("written")
        .revision()
}

#[tokio::test]
async fn nodes_follow_the_network_map_from_a_snapshot_and_resume() {
    use cca_model::net::{Allocation, Ipv4Net, NetworkChange};
    use cca_wire::types::NetworkLine;
    use std::net::Ipv4Addr;

    let h = harness().await;
    let (client, _stop) = h.serve().await;
    client
        .apply(&program(&[("web", 2)]), false)
        .await
        .expect("applies");
    client
        .register(&support::node_request("n1"))
        .await
        .expect("registers");
    let subnet: Ipv4Net = "10.42.0.0/24".parse().expect("a prefix");
    put_fact(
        h.store.as_ref(),
        keys::derived_subnet("n1"),
        &Allocation::Held { address: subnet },
    )
    .await;
    let vip = |last: u8| Allocation::Held {
        address: Ipv4Addr::new(10, 43, 0, last),
    };
    let written = put_fact(h.store.as_ref(), keys::derived_vip("web"), &vip(1)).await;
    // The feed may start before the last write reached the cache: wait for
    // a snapshot that holds it.
    let (revision, changes, origin) = loop {
        let mut stream = client
            .network("n1", &Resume::SNAPSHOT)
            .await
            .expect("stream");
        let NetworkLine::Snapshot {
            revision,
            changes,
            origin,
        } = next(&mut stream).await
        else {
            panic!("the stream starts with a snapshot");
        };
        if revision >= written {
            break (revision, changes, origin);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let node = changes.iter().find_map(|change| match change {
        NetworkChange::Node(route) => Some(route),
        _ => None,
    });
    assert_eq!(node.map(|route| route.subnet), Some(subnet));
    let service = changes.iter().find_map(|change| match change {
        NetworkChange::Service(net) => Some(net),
        _ => None,
    });
    assert_eq!(
        service.and_then(|net| net.vip),
        Some(Ipv4Addr::new(10, 43, 0, 1))
    );

    let resume = Resume {
        from: revision + 1,
        epoch: origin.epoch.clone(),
    };
    let mut stream = client.network("n1", &resume).await.expect("stream");
    put_fact(h.store.as_ref(), keys::derived_vip("web"), &vip(2)).await;
    let line = next(&mut stream).await;
    let NetworkLine::Changes { changes, .. } = line else {
        panic!("a change line: {line:?}");
    };
    assert!(
        matches!(&changes[..], [NetworkChange::Service(net)] if net.vip == Some(Ipv4Addr::new(10, 43, 0, 2))),
        "{changes:?}"
    );
    let mut resumed = client.network("n1", &resume).await.expect("stream");
    assert!(matches!(
        next(&mut resumed).await,
        NetworkLine::Changes { .. }
    ));
    let foreign = Resume {
        from: revision + 1,
        epoch: String::new(),
    };
    let mut elsewhere = client.network("n1", &foreign).await.expect("stream");
    assert!(matches!(
        next(&mut elsewhere).await,
        NetworkLine::Snapshot { .. }
    ));
}

#[tokio::test]
async fn held_ports_replace_the_nodes_set_skip_repeats_and_refuse_port_zero() {
    let h = harness().await;
    let (plain, _stop) = h.serve().await;
    let client = cca_wire::Client::new(plain.base_url());
    let held = |ports: &[u16]| cca_model::cluster::HeldPorts {
        ports: ports.iter().copied().collect(),
    };
    let unknown = client
        .report_held_ports("n9", &held(&[20000]))
        .await
        .expect_err("n9 never registered");
    assert_eq!(unknown.status(), Some(404), "{unknown}");
    client
        .register(&support::node_request("n1"))
        .await
        .expect("registers");
    let stored = || async {
        let kv = h
            .store
            .get(&keys::observed_held_ports("n1"))
            .await
            .expect("reads")?;
        Some(serde_json::from_slice::<cca_model::cluster::HeldPorts>(&kv.value).expect("decodes"))
    };
    let first = client
        .report_held_ports("n1", &held(&[20000, 20002]))
        .await
        .expect("reports");
    assert!(first.revision.is_some());
    assert_eq!(stored().await, Some(held(&[20000, 20002])));
    let again = client
        .report_held_ports("n1", &held(&[20000, 20002]))
        .await
        .expect("reports");
    assert_eq!(again.revision, None, "a repeat writes nothing");
    client
        .report_held_ports("n1", &held(&[20002]))
        .await
        .expect("reports");
    assert_eq!(stored().await, Some(held(&[20002])), "replaced, not merged");
    let before = h.keys().await;
    let zero = client
        .report_held_ports("n1", &held(&[0, 20003]))
        .await
        .expect_err("port 0");
    assert_eq!(zero.status(), Some(422), "{zero}");
    assert!(
        zero.to_string().contains("port 0 is no host port"),
        "{zero}"
    );
    assert_eq!(h.keys().await, before, "a refused report writes nothing");
    client
        .report_held_ports("n1", &held(&[]))
        .await
        .expect("reports");
    assert_eq!(stored().await, None, "an empty set deletes the fact");
}

#[tokio::test]
async fn a_usage_report_replaces_the_nodes_last_and_bad_ones_write_nothing() {
    use cca_model::usage::{NodeUsage, UsageSummary};
    let h = harness().await;
    let (plain, _stop) = h.serve().await;
    let client = cca_wire::Client::new(plain.base_url());
    let summary = |cpu_millis| UsageSummary {
        cpu_millis,
        cpu_peak_millis: cpu_millis * 2,
        memory_bytes: 64 << 20,
        memory_peak_bytes: 80 << 20,
    };
    let report = |at, instances: &[(&str, u64)]| NodeUsage {
        at,
        period_ms: 30_000,
        node: summary(900),
        instances: instances
            .iter()
            .map(|(id, cpu)| ((*id).to_owned(), summary(*cpu)))
            .collect(),
        requests: Default::default(),
    };
    let unknown = client
        .report_usage("n9", &report(1, &[]))
        .await
        .expect_err("n9 never registered");
    assert_eq!(unknown.status(), Some(404), "{unknown}");
    client
        .register(&support::node_request("n1"))
        .await
        .expect("registers");
    let stored = || async {
        let kv = h
            .store
            .get(&keys::observed_usage("n1"))
            .await
            .expect("reads")?;
        Some(serde_json::from_slice::<NodeUsage>(&kv.value).expect("decodes"))
    };
    client
        .report_usage("n1", &report(1_000, &[("web-1", 250), ("web-2", 10)]))
        .await
        .expect("reports");
    client
        .report_usage("n1", &report(31_000, &[("web-1", 300)]))
        .await
        .expect("reports");
    assert_eq!(
        stored().await,
        Some(report(31_000, &[("web-1", 300)])),
        "replaced, not merged"
    );
    let before = h.keys().await;
    let mut no_period = report(61_000, &[]);
    no_period.period_ms = 0;
    let refused = client
        .report_usage("n1", &no_period)
        .await
        .expect_err("no period");
    assert_eq!(refused.status(), Some(422), "{refused}");
    assert!(refused.to_string().contains("period_ms is 0"), "{refused}");
    let bad_id = client
        .report_usage("n1", &report(61_000, &[("../etc", 1)]))
        .await
        .expect_err("a bad id");
    assert_eq!(bad_id.status(), Some(422), "{bad_id}");
    assert_eq!(h.keys().await, before, "a refused report writes nothing");
}

#[tokio::test]
async fn nodes_sum_what_is_placed_on_them_and_top_pairs_it_with_the_reports() {
    use cca_model::usage::{NodeUsage, UsageSummary};
    let h = harness().await;
    let (plain, _stop) = h.serve().await;
    let client = cca_wire::Client::new(plain.base_url());
    for node in ["n1", "n2"] {
        client
            .register(&support::node_request(node))
            .await
            .expect("registers");
    }
    place(h.store.as_ref(), &placed("web-1", "n1")).await;
    place(h.store.as_ref(), &placed("web-2", "n1")).await;
    let busy = UsageSummary {
        cpu_millis: 80,
        cpu_peak_millis: 120,
        memory_bytes: 30 << 20,
        memory_peak_bytes: 40 << 20,
    };
    let report = NodeUsage {
        at: 5_000,
        period_ms: 30_000,
        node: busy,
        instances: [("web-1".to_owned(), busy)].into(),
        requests: Default::default(),
    };
    // Reads answer from a view at least as new as the store: no wait.
    put_fact(h.store.as_ref(), keys::observed_usage("n1"), &report).await;

    let nodes = client.nodes().await.expect("nodes");
    let allocated: Vec<_> = nodes
        .iter()
        .map(|n| (n.name.as_str(), n.cpu_allocated.0, n.instances))
        .collect();
    assert_eq!(allocated, [("n1", 200, 2), ("n2", 0, 0)]);
    let detail = client.node("n1").await.expect("node");
    assert_eq!(detail.summary.memory_allocated.0, 128 << 20);
    assert_eq!(detail.usage.map(|u| u.summary), Some(busy));

    let top = client.top_nodes().await.expect("top nodes");
    assert_eq!(top[0].cpu_requested.0, 200);
    assert_eq!(top[0].usage.map(|u| (u.at, u.summary)), Some((5_000, busy)));
    assert_eq!(top[1].usage, None, "n2 never reported");
    let workloads = client.top_workloads(&[]).await.expect("top workloads");
    let rows: Vec<_> = workloads
        .iter()
        .map(|row| {
            (
                row.instance.as_str(),
                row.usage.map(|u| u.summary.cpu_millis),
            )
        })
        .collect();
    assert_eq!(rows, [("web-1", Some(80)), ("web-2", None)]);
    let instance = client.instance("web-1").await.expect("instance");
    assert_eq!(instance.usage.map(|u| u.summary), Some(busy));
}

/// A node's unclaimed instances replace its report, a repeat writes
/// nothing, the answer names the services the store knows, a bad name is
/// refused without a write, and none deletes the fact.
#[tokio::test]
async fn unclaimed_reports_replace_the_nodes_set_and_name_the_known_services() {
    use cca_model::recovery::{Unclaimed, UnclaimedInstance};
    let h = harness().await;
    let (plain, _stop) = h.serve().await;
    let client = cca_wire::Client::new(plain.base_url());
    client
        .register(&support::node_request("n1"))
        .await
        .expect("registers");
    put_fact(
        h.store.as_ref(),
        keys::desired_service("web"),
        &cca_model::spec::ServiceSpec::new(
            "web",
            cca_model::spec::Workload::Process {
                run: "sleep 100".into(),
            },
        ),
    )
    .await;
    let instance = |id: &str, service: &str| UnclaimedInstance {
        id: id.into(),
        service: service.into(),
        ordinal: None,
        spec_hash: "h1".into(),
        cpu: cca_model::spec::Cpu(100),
        memory: cca_model::spec::Memory(1 << 20),
        host_ports: BTreeMap::from([("http".to_owned(), 20_001)]),
    };
    let report = Unclaimed {
        instances: vec![instance("web-1", "web"), instance("db-1", "db")],
    };
    let stored = || async {
        let kv = h
            .store
            .get(&keys::observed_unclaimed("n1"))
            .await
            .expect("reads")?;
        Some(serde_json::from_slice::<Unclaimed>(&kv.value).expect("decodes"))
    };
    // The cache may not hold the service yet: ask until it does.
    let reply = loop {
        let reply = client
            .report_unclaimed("n1", &report)
            .await
            .expect("reports");
        if !reply.known_services.is_empty() {
            break reply;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(reply.known_services, ["web".to_owned()].into());
    assert_eq!(stored().await, Some(report.clone()));
    let again = client
        .report_unclaimed("n1", &report)
        .await
        .expect("reports");
    assert_eq!(again.revision, None, "a repeat writes nothing");
    let before = h.keys().await;
    let bad = Unclaimed {
        instances: vec![instance("web/1", "web")],
    };
    let refused = client
        .report_unclaimed("n1", &bad)
        .await
        .expect_err("a bad id");
    assert_eq!(refused.status(), Some(422), "{refused}");
    assert_eq!(h.keys().await, before, "a refused report writes nothing");
    client
        .report_unclaimed("n1", &Unclaimed::default())
        .await
        .expect("reports");
    assert_eq!(stored().await, None, "none deletes the fact");
}

/// Waits until the API's cache sees `count` live node leases.
async fn leases_seen(h: &support::Harness, count: usize) {
    tokio::time::timeout(WAIT, async {
        while h.state.cache().view().heartbeats.len() != count {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the cache sees the leases");
}

/// With a budget of one heartbeat a second, a second node makes the
/// first one's lease too short: its next heartbeat moves it to a lease of
/// the fleet's TTL, without the key ever being deleted (the node stays
/// ready); the old lease is revoked. A fleet shrunk by less than half
/// leaves the longer lease alone.
#[tokio::test]
async fn a_heartbeat_moves_a_node_to_a_lease_that_fits_the_grown_fleet() {
    let config = cca_api::ApiConfig {
        node_leases: cca_model::node_lease::NodeLeases {
            shortest: Duration::from_secs(2),
            heartbeats_per_s: std::num::NonZeroU32::MIN,
        },
        ..cca_api::ApiConfig::default()
    };
    let h = support::harness_with(config).await;
    let (client, _stop) = h.serve().await;
    // One node alone sends a heartbeat every 1.5 s of a 5 s lease
    // (2 s, 3 s, 4.5 s: the first step at or past 10/3 s).
    let n1 = client
        .register(&support::node_request("n1"))
        .await
        .expect("registers");
    assert_eq!(n1.ttl_secs, 5);
    leases_seen(&h, 1).await;
    let n2 = client
        .register(&support::node_request("n2"))
        .await
        .expect("registers");
    assert_eq!(n2.ttl_secs, 7, "two nodes: 6.75 s up");
    leases_seen(&h, 2).await;

    let key = keys::observed_heartbeat("n1");
    let before = h.store.get(&key).await.expect("reads").expect("held");
    let moved = client.heartbeat("n1", n1.lease_id).await.expect("renews");
    let to = moved.lease_id.expect("moved to another lease");
    assert_ne!(to, n1.lease_id);
    assert_eq!(moved.ttl_secs, 7);
    let after = h.store.get(&key).await.expect("reads").expect("still held");
    assert_eq!(after.lease, Some(to));
    assert_eq!(
        after.create_revision, before.create_revision,
        "never deleted"
    );
    let record: cca_model::cluster::Heartbeat =
        serde_json::from_slice(&after.value).expect("decodes");
    assert_eq!((record.lease, record.lease_ttl_secs), (to, 7));

    let old = client
        .heartbeat("n1", n1.lease_id)
        .await
        .expect_err("the old lease is revoked");
    assert_eq!(old.status(), Some(409));
    let again = client.heartbeat("n1", to).await.expect("renews");
    assert_eq!((again.lease_id, again.ttl_secs), (None, 7));

    // n2 leaves: one node would fit 5 s leases, but two would need 7 s.
    h.store.revoke_lease(n2.lease_id).await.expect("revokes");
    leases_seen(&h, 1).await;
    let kept = client.heartbeat("n1", to).await.expect("renews");
    assert_eq!((kept.lease_id, kept.ttl_secs), (None, 7));
}

/// Fails every lease grant while `failing` is set.
#[derive(Debug)]
struct GrantsFail {
    failing: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait::async_trait]
impl cca_store::decorate::Hook for GrantsFail {
    async fn before(&self, call: cca_store::decorate::Call<'_>) -> cca_store::Result<()> {
        let failing = self.failing.load(std::sync::atomic::Ordering::SeqCst);
        match call {
            cca_store::decorate::Call::GrantLease { .. } if failing => Err(
                cca_store::StoreError::Backend("grants refused by the test".into()),
            ),
            _ => Ok(()),
        }
    }
}

/// A move that fails (here: the new lease cannot be granted) leaves the
/// renewal standing: the heartbeat is answered, on the old lease, and the
/// next heartbeat moves the node once the store grants again.
#[tokio::test]
async fn a_failed_lease_move_still_renews_the_lease() {
    let config = cca_api::ApiConfig {
        node_leases: cca_model::node_lease::NodeLeases {
            shortest: Duration::from_secs(2),
            heartbeats_per_s: std::num::NonZeroU32::MIN,
        },
        ..cca_api::ApiConfig::default()
    };
    let failing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hook = GrantsFail {
        failing: std::sync::Arc::clone(&failing),
    };
    let h = support::harness_wrapping(config, move |store| {
        std::sync::Arc::new(cca_store::decorate::Decorated::wrap(store, hook))
    })
    .await;
    let (client, _stop) = h.serve().await;
    let n1 = client
        .register(&support::node_request("n1"))
        .await
        .expect("registers");
    leases_seen(&h, 1).await;
    client
        .register(&support::node_request("n2"))
        .await
        .expect("registers");
    leases_seen(&h, 2).await;

    failing.store(true, std::sync::atomic::Ordering::SeqCst);
    let renewed = client
        .heartbeat("n1", n1.lease_id)
        .await
        .expect("renewed though the move failed");
    assert_eq!((renewed.lease_id, renewed.ttl_secs), (None, 5));
    let held = h
        .store
        .get(&keys::observed_heartbeat("n1"))
        .await
        .expect("reads")
        .expect("held");
    assert_eq!(held.lease, Some(n1.lease_id), "still on the old lease");

    failing.store(false, std::sync::atomic::Ordering::SeqCst);
    let moved = client.heartbeat("n1", n1.lease_id).await.expect("renews");
    assert_eq!(moved.ttl_secs, 7);
    assert!(moved.lease_id.is_some_and(|to| to != n1.lease_id));
}
