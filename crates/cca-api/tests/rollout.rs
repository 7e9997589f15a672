//! A service's rollout through the API on a loopback socket: `GET
//! /v1/services/{name}/rollout` counts instances of the version placed and
//! names what the roll waits for; `pause`, `resume` and `undo` write the
//! operator's word (`desired/rollout/{name}`) once, answer "unchanged"
//! after, and refuse what cannot be (no such service, no such version, no
//! previous one); deleting the service takes the word with it. No
//! controller runs here: the rollout fact is written by hand, as the
//! lifecycle controller would.

mod support;

use cca_model::cluster::{Instance, InstanceState, InstanceStatus};
use cca_model::keys;
use cca_model::rollout::{Rollout, RolloutCause, RolloutControl};
use cca_model::spec::{Program, ServiceSpec, spec_hash};
use cca_store::{Op, Store, Txn};
use cca_wire::Client;
use support::{Harness, harness, service};

fn web(version: &str) -> ServiceSpec {
    let mut spec = service("web", 2);
    spec.env.insert("VERSION".into(), version.into());
    spec
}

async fn apply(client: &Client, spec: &ServiceSpec) {
    let mut program = Program::default();
    program.services.insert(spec.name.clone(), spec.clone());
    client.apply(&program, false).await.expect("applies");
}

async fn put<T: serde::Serialize>(store: &dyn Store, key: String, value: &T) {
    let value = serde_json::to_vec(value).expect("encodes");
    store
        .txn(Txn::new().then(Op::put(key, value)))
        .await
        .expect("written");
}

/// Instance `id` of `spec` on `n1`, reported in `state` when given.
async fn place(h: &Harness, id: &str, spec: &ServiceSpec, state: Option<InstanceState>) {
    let instance = Instance {
        spec_hash: spec_hash(spec),
        ..support::instance(id, &spec.name, "n1")
    };
    put(
        h.store.as_ref(),
        keys::derived_instance(&spec.name, id),
        &instance,
    )
    .await;
    let Some(state) = state else { return };
    let status = InstanceStatus {
        id: id.into(),
        service: spec.name.clone(),
        node: "n1".into(),
        state,
        healthy: None,
        pid: None,
        address: None,
        own_network: false,
        host_ports: Default::default(),
        restarts: 1,
        last_exit: None,
        message: Some("health check: connection refused".into()),
        updated_at: 0,
    };
    put(h.store.as_ref(), keys::observed_instance(id), &status).await;
}

async fn serve() -> (Harness, Client, tokio::sync::oneshot::Sender<()>) {
    let h = harness().await;
    let (client, stop) = h.serve().await;
    (h, client, stop)
}

#[tokio::test]
async fn the_status_counts_the_version_placed_and_names_what_the_roll_waits_for() {
    let (h, client, _stop) = serve().await;
    apply(&client, &web("1")).await;
    apply(&client, &web("2")).await;
    place(&h, "web-a", &web("1"), Some(InstanceState::Running)).await;
    place(&h, "web-b", &web("2"), Some(InstanceState::Running)).await;
    place(&h, "web-c", &web("2"), Some(InstanceState::Starting)).await;
    place(&h, "web-d", &web("2"), None).await;
    let status = client.rollout("web").await.expect("a status");
    assert_eq!(status.spec_version, spec_hash(&web("2")));
    assert_eq!(status.placing, spec_hash(&web("2")));
    assert_eq!(status.rollout, None, "no controller here");
    assert_eq!(
        (
            status.progress.wanted,
            status.progress.updated,
            status.progress.ready,
            status.progress.old
        ),
        (2, 3, 1, 1)
    );
    assert_eq!(
        status.waiting,
        [
            "web-c on n1: starting, 1 restarts (health check: connection refused)",
            "web-d on n1: no report from its agent yet"
        ]
    );
    assert_eq!(
        (
            status.max_surge,
            status.max_unavailable,
            status.rollback_after
        ),
        (1, 1, 3)
    );
    let detail = client.service("web").await.expect("describe");
    assert_eq!(detail.rollout.as_ref(), Some(&status));
    let missing = client.rollout("nope").await.expect_err("no such service");
    assert_eq!(missing.status(), Some(404));
}

#[tokio::test]
async fn pause_and_resume_write_once_and_answer_unchanged_after() {
    let (_h, client, _stop) = serve().await;
    apply(&client, &web("1")).await;
    let paused = client.pause_rollout("web", true).await.expect("pauses");
    assert!(paused.changed && paused.control.paused);
    let again = client.pause_rollout("web", true).await.expect("pauses");
    assert!(!again.changed, "already paused: nothing written");
    assert!(client.rollout("web").await.expect("status").paused);
    let resumed = client.pause_rollout("web", false).await.expect("resumes");
    assert!(resumed.changed && !resumed.control.paused);
    assert!(!client.rollout("web").await.expect("status").paused);
    let missing = client.pause_rollout("nope", true).await.expect_err("none");
    assert_eq!(missing.status(), Some(404));
}

#[tokio::test]
async fn undo_asks_for_the_previous_or_a_named_version_and_refuses_what_cannot_be() {
    let (h, client, _stop) = serve().await;
    apply(&client, &web("1")).await;
    apply(&client, &web("2")).await;
    let (one, two) = (spec_hash(&web("1")), spec_hash(&web("2")));
    let nothing = client.undo_rollout("web", None).await.expect_err("none");
    assert_eq!(
        nothing.status(),
        Some(409),
        "no rollout, so no previous version"
    );
    assert!(nothing.to_string().contains("--to"), "{nothing}");

    let mut rollout = Rollout::start(&two, &two, RolloutCause::Apply, 0);
    rollout.previous = Some(one.clone());
    put(h.store.as_ref(), keys::derived_rollout("web"), &rollout).await;
    let undone = client.undo_rollout("web", None).await.expect("undoes");
    assert!(undone.changed);
    let undo = undone.control.undo.expect("an undo");
    assert_eq!(
        (undo.to.as_str(), undo.from.as_str()),
        (one.as_str(), two.as_str())
    );
    let again = client.undo_rollout("web", None).await.expect("undoes");
    assert!(!again.changed, "asked already");

    let unknown = client
        .undo_rollout("web", Some("zzzz"))
        .await
        .expect_err("no such");
    assert_eq!(unknown.status(), Some(422));
    assert!(
        unknown.to_string().contains(&one),
        "lists what is kept: {unknown}"
    );
    let by_prefix = client
        .undo_rollout("web", Some(&two[..6]))
        .await
        .expect("a unique prefix names it");
    assert_eq!(by_prefix.control.undo.expect("an undo").to, two);

    let stored: RolloutControl = serde_json::from_slice(
        &h.store
            .get(&keys::desired_rollout("web"))
            .await
            .expect("reads")
            .expect("written")
            .value,
    )
    .expect("decodes");
    assert_eq!(stored.undo.expect("kept").to, two);
    client.delete_service("web").await.expect("deletes");
    assert!(
        h.store
            .get(&keys::desired_rollout("web"))
            .await
            .expect("reads")
            .is_none(),
        "the operator's word goes with the service"
    );
}
