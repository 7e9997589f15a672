//! Service versions through the API on a loopback socket: the assignment
//! stream sends each instance the spec it was placed with while two
//! versions are placed at once (a rolling update), apply keeps and prunes
//! versions (never one an instance runs), a deleted service's versions go
//! with its last instance, a spec written before versions existed gets its
//! version when it changes, and `GET /v1/services/{name}/history` lists
//! them. Instances are placed by hand, as the scheduler would: with the
//! spec hash of the spec current at the time.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use cca_model::cluster::Instance;
use cca_model::keys;
use cca_model::spec::{Program, ServiceSpec, spec_hash};
use cca_store::{Op, Store, Txn};
use cca_wire::Client;
use cca_wire::types::{Assignment, AssignmentLine};
use support::{Harness, harness, service};

const WAIT: Duration = Duration::from_secs(10);

/// Service `web` whose instances see `VERSION=version`.
fn web(version: &str) -> ServiceSpec {
    let mut spec = service("web", 2);
    spec.env.insert("VERSION".into(), version.into());
    spec
}

fn program(specs: &[ServiceSpec]) -> Program {
    let mut program = Program::default();
    for spec in specs {
        program.services.insert(spec.name.clone(), spec.clone());
    }
    program
}

/// Instance `id` of `spec`'s service on `n1`, stamped with its hash.
fn placed(id: &str, spec: &ServiceSpec) -> Instance {
    Instance {
        spec_hash: spec_hash(spec),
        ..support::instance(id, &spec.name, "n1")
    }
}

async fn place(store: &dyn Store, instance: &Instance) {
    let key = keys::derived_instance(&instance.service, &instance.id);
    let value = serde_json::to_vec(instance).expect("encodes");
    store
        .txn(Txn::new().then(Op::put(key, value)))
        .await
        .expect("placed");
}

async fn unplace(store: &dyn Store, instance: &Instance) {
    let key = keys::derived_instance(&instance.service, &instance.id);
    store
        .txn(Txn::new().then(Op::delete(key)))
        .await
        .expect("deleted");
}

async fn apply(client: &Client, specs: &[ServiceSpec]) -> i64 {
    client
        .apply(&program(specs), false)
        .await
        .expect("applies")
        .revision
        .expect("something was written")
}

async fn next(stream: &mut cca_wire::LineStream<AssignmentLine>) -> AssignmentLine {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("a line in time")
        .expect("stream open")
        .expect("line decodes")
}

/// The snapshot of `n1`'s assignments, by instance id.
async fn snapshot(client: &Client) -> BTreeMap<String, Assignment> {
    let mut stream = client
        .assignments("n1", &cca_wire::types::Resume::SNAPSHOT)
        .await
        .expect("stream");
    let AssignmentLine::Snapshot { assignments, .. } = next(&mut stream).await else {
        panic!("the stream starts with a snapshot");
    };
    assignments
        .into_iter()
        .map(|assignment| (assignment.instance.id.clone(), assignment))
        .collect()
}

fn version_of(assignment: &Assignment) -> Option<&str> {
    let spec = assignment.spec.as_ref()?;
    spec.env.get("VERSION").map(String::as_str)
}

/// The versions `GET /v1/services/web/history` lists, newest first:
/// (VERSION, instances, current).
async fn history(client: &Client) -> Vec<(String, usize, bool)> {
    let history = client.service_history("web").await.expect("history");
    history
        .versions
        .iter()
        .map(|version| {
            assert_eq!(spec_hash(&version.spec), version.version, "keyed by hash");
            let label = version.spec.env.get("VERSION").cloned().unwrap_or_default();
            (label, version.instances, version.current)
        })
        .collect()
}

async fn serve() -> (Harness, Client, tokio::sync::oneshot::Sender<()>) {
    let h = harness().await;
    let (client, stop) = h.serve().await;
    client
        .register(&support::node_request("n1"))
        .await
        .expect("registers");
    (h, client, stop)
}

#[tokio::test]
async fn during_a_rolling_update_each_instance_is_sent_its_own_version() {
    let (h, client, _stop) = serve().await;
    let first = apply(&client, &[web("1")]).await;
    let old = placed("web-a", &web("1"));
    place(h.store.as_ref(), &old).await;
    let second = apply(&client, &[web("2")]).await;
    let new = placed("web-b", &web("2"));
    place(h.store.as_ref(), &new).await;

    let assignments = snapshot(&client).await;
    assert_eq!(assignments.len(), 2);
    for assignment in assignments.values() {
        let spec = assignment.spec.as_ref().expect("a spec");
        assert_eq!(
            spec_hash(spec),
            assignment.instance.spec_hash,
            "{assignment:?}"
        );
    }
    assert_eq!(version_of(&assignments["web-a"]), Some("1"));
    assert_eq!(version_of(&assignments["web-b"]), Some("2"));

    // A later line about the old instance (its record changed) still
    // carries its own version.
    let mut stream = client
        .assignments("n1", &cca_wire::types::Resume::SNAPSHOT)
        .await
        .expect("stream");
    next(&mut stream).await;
    let mut moved = old.clone();
    moved.failures = vec![5];
    place(h.store.as_ref(), &moved).await;
    let AssignmentLine::Put { assignment, .. } = next(&mut stream).await else {
        panic!("a put line");
    };
    assert_eq!(assignment.instance.id, "web-a");
    assert_eq!(version_of(&assignment), Some("1"));

    let listed = client.service_history("web").await.expect("history");
    let revisions: Vec<i64> = listed.versions.iter().map(|v| v.revision).collect();
    assert_eq!(
        revisions,
        [second, first],
        "newest first, by the apply that wrote it"
    );
    assert_eq!(
        history(&client).await,
        [("2".into(), 1, true), ("1".into(), 1, false)]
    );
    let missing = client
        .service_history("nope")
        .await
        .expect_err("no such service");
    assert_eq!(missing.status(), Some(404));
}

#[tokio::test]
async fn apply_keeps_ten_versions_and_every_version_an_instance_runs() {
    let (h, client, _stop) = serve().await;
    apply(&client, &[web("0")]).await;
    let pinned = placed("web-a", &web("0"));
    place(h.store.as_ref(), &pinned).await;
    for version in 1..=11 {
        apply(&client, &[web(&version.to_string())]).await;
    }
    let kept: Vec<String> = history(&client).await.into_iter().map(|v| v.0).collect();
    assert_eq!(
        kept,
        ["11", "10", "9", "8", "7", "6", "5", "4", "3", "2", "0"]
    );

    // A change that makes no new version (replicas) prunes nothing new...
    let mut scaled = web("11");
    scaled.replicas = 5;
    apply(&client, &[scaled]).await;
    assert_eq!(history(&client).await.len(), 11);
    // ...and once no instance runs version 0, the next apply drops it.
    unplace(h.store.as_ref(), &pinned).await;
    apply(&client, &[web("12")]).await;
    let kept: Vec<String> = history(&client).await.into_iter().map(|v| v.0).collect();
    assert_eq!(kept, ["12", "11", "10", "9", "8", "7", "6", "5", "4", "3"]);

    // Going back to an old version makes it the newest again.
    apply(&client, &[web("5")]).await;
    let top = history(&client).await.remove(0);
    assert_eq!(top, ("5".into(), 0, true));
    assert_eq!(history(&client).await.len(), 10);
}

#[tokio::test]
async fn a_deleted_service_keeps_the_versions_its_instances_run_until_they_are_gone() {
    let (h, client, _stop) = serve().await;
    apply(&client, &[web("1")]).await;
    let old = placed("web-a", &web("1"));
    place(h.store.as_ref(), &old).await;
    apply(&client, &[web("2")]).await;
    client.delete_service("web").await.expect("deleted");
    assert_eq!(
        history(&client).await,
        [("2".into(), 0, false), ("1".into(), 1, false)],
        "deleting the service leaves its versions"
    );
    assert_eq!(
        version_of(&snapshot(&client).await["web-a"]),
        None,
        "a deleted service's instances are sent no spec (they stop)"
    );

    let mut db = service("db", 1);
    apply(&client, std::slice::from_ref(&db)).await;
    assert_eq!(
        history(&client).await,
        [("1".into(), 1, false)],
        "the next apply drops the versions no instance runs"
    );
    unplace(h.store.as_ref(), &old).await;
    db.replicas = 2;
    apply(&client, &[db]).await;
    let gone = client
        .service_history("web")
        .await
        .expect_err("no spec and no version left");
    assert_eq!(gone.status(), Some(404));
}

#[tokio::test]
async fn a_spec_written_before_versions_existed_gets_its_version_when_it_changes() {
    let (h, client, _stop) = serve().await;
    let spec = serde_json::to_vec(&web("1")).expect("encodes");
    h.store
        .txn(Txn::new().then(Op::put(keys::desired_service("web"), spec)))
        .await
        .expect("written around apply");
    place(h.store.as_ref(), &placed("web-a", &web("1"))).await;
    assert_eq!(
        version_of(&snapshot(&client).await["web-a"]),
        Some("1"),
        "without versions, the current spec"
    );
    assert_eq!(history(&client).await, []);

    apply(&client, &[web("2")]).await;
    assert_eq!(
        history(&client).await,
        [("2".into(), 0, true), ("1".into(), 1, false)]
    );
    assert_eq!(version_of(&snapshot(&client).await["web-a"]), Some("1"));
}
