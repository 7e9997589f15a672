//! The API through its router, without a socket, on an embedded store:
//! apply/diff semantics (created/changed/deleted, sub-facts, prune, one
//! transaction), get/describe/status, scale, delete, node controls,
//! events and their retention, metrics — and bad input, which must get a
//! 4xx with a JSON error and write nothing.

mod support;

use std::io::Write as _;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use cca_model::keys;
use cca_model::spec::spec_hash;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use support::{harness, harness_with_metrics, json as to_json, program, service};
use tower::ServiceExt;

#[tokio::test]
async fn apply_reports_created_changed_and_deleted_in_one_revision() {
    let h = harness().await;
    let mut first = program(&[("web", 2), ("db", 1)]);
    let (status, report) = h.call("POST", "/v1/apply", Some(to_json(&first))).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(
        report["created"],
        json!([
            "desired/service/db",
            "desired/service/db/tag/team",
            "desired/service/web",
            "desired/service/web/tag/team"
        ])
    );
    let revision = report["revision"].as_i64().expect("written");
    // One transaction: every key carries the same revision (the audit
    // record of the apply comes after it).
    let written = h
        .store
        .range(cca_store::RangeRequest::prefix("desired/"))
        .await
        .expect("range");
    assert!(
        written.kvs.iter().all(|kv| kv.mod_revision == revision),
        "{:?}",
        written
            .kvs
            .iter()
            .map(|kv| (&kv.key, kv.mod_revision))
            .collect::<Vec<_>>()
    );

    let (_, again) = h.call("POST", "/v1/apply", Some(to_json(&first))).await;
    assert_eq!(again["revision"], Value::Null);
    assert_eq!(again["unchanged"], 4);

    first.services.get_mut("web").expect("web").replicas = 3;
    first.tags.remove("web");
    let (_, changed) = h.call("POST", "/v1/apply", Some(to_json(&first))).await;
    assert_eq!(changed["changed"], json!(["desired/service/web"]));
    assert_eq!(changed["deleted"], json!(["desired/service/web/tag/team"]));
    assert_eq!(changed["created"], json!([]));
}

#[tokio::test]
async fn services_outside_the_program_stay_unless_pruned() {
    let h = harness().await;
    h.call(
        "POST",
        "/v1/apply",
        Some(to_json(&program(&[("web", 1), ("db", 1)]))),
    )
    .await;
    let only_web = to_json(&program(&[("web", 1)]));
    let (_, kept) = h.call("POST", "/v1/apply", Some(only_web.clone())).await;
    assert_eq!(kept["deleted"], json!([]));
    let (_, diff) = h
        .call("POST", "/v1/diff?prune=true", Some(only_web.clone()))
        .await;
    assert_eq!(diff["dry_run"], true);
    assert_eq!(
        diff["deleted"],
        json!(["desired/service/db", "desired/service/db/tag/team"])
    );
    assert!(
        h.keys().await.contains(&keys::desired_service("db")),
        "diff wrote nothing"
    );
    let (_, pruned) = h.call("POST", "/v1/apply?prune=true", Some(only_web)).await;
    assert_eq!(pruned["deleted"], diff["deleted"]);
    assert!(!h.keys().await.contains(&keys::desired_service("db")));
}

#[tokio::test]
async fn get_and_describe_services_with_tag_filter_and_age() {
    let h = harness().await;
    h.call(
        "POST",
        "/v1/apply",
        Some(to_json(&program(&[("web", 2), ("db", 1)]))),
    )
    .await;
    let (status, rows) = h.call("GET", "/v1/services?tag=team=web", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(rows.as_array().map(Vec::len), Some(1));
    assert_eq!(rows[0]["name"], "web");
    assert_eq!(rows[0]["replicas"], 2);
    assert!(rows[0]["created_at"].is_i64());
    let (status, detail) = h.call("GET", "/v1/services/web", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(detail["spec"]["name"], "web");
    assert_eq!(detail["instances"], json!([]));
    assert_eq!(detail["unplaced"], Value::Null);
}

#[tokio::test]
async fn scale_writes_replicas_and_delete_removes_sub_facts() {
    let h = harness().await;
    h.call("POST", "/v1/apply", Some(to_json(&program(&[("web", 2)]))))
        .await;
    let (status, report) = h
        .call(
            "POST",
            "/v1/services/web/scale",
            Some(json!({"replicas": 5})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(
        (report["previous"].clone(), report["replicas"].clone()),
        (json!(2), json!(5))
    );
    let (_, detail) = h.call("GET", "/v1/services/web", None).await;
    assert_eq!(detail["spec"]["replicas"], 5);
    assert_eq!(
        detail["events"][0]["message"],
        "scaled from 2 to 5 replicas"
    );

    let (status, deleted) = h.call("DELETE", "/v1/services/web", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        deleted["deleted"],
        json!(["desired/service/web", "desired/service/web/tag/team"])
    );
    let left: Vec<String> = h
        .keys()
        .await
        .into_iter()
        .filter(|k| k.starts_with("desired/"))
        .collect();
    // Only its version stays, until the next apply finds no instance runs it.
    let version = keys::desired_service_version("web", &spec_hash(&service("web", 2)));
    assert_eq!(left, [version]);
}

#[tokio::test]
async fn bad_input_gets_a_json_4xx_and_writes_nothing() {
    let h = harness().await;
    h.call("POST", "/v1/apply", Some(to_json(&program(&[("web", 1)]))))
        .await;
    let before = h.keys().await;
    let revision = h.revision().await;
    let mut ghost_tags = to_json(&program(&[("web", 1)]));
    ghost_tags["tags"]["ghost"] = json!({"team": "x"});
    let mut slash = to_json(&program(&[]));
    slash["services"]["a/b"] = to_json(&support::service("a/b", 1));
    let cases: Vec<(&str, &str, Option<Vec<u8>>, StatusCode)> = vec![
        (
            "POST",
            "/v1/apply",
            Some(b"{not json".to_vec()),
            StatusCode::BAD_REQUEST,
        ),
        (
            "POST",
            "/v1/apply",
            Some(br#"{"services": 3}"#.to_vec()),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "POST",
            "/v1/apply",
            Some(ghost_tags.to_string().into_bytes()),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "POST",
            "/v1/apply",
            Some(slash.to_string().into_bytes()),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "POST",
            "/v1/apply?prune=maybe",
            Some(b"{}".to_vec()),
            StatusCode::BAD_REQUEST,
        ),
        (
            "POST",
            "/v1/services/web/scale",
            Some(br#"{"replicas": -1}"#.to_vec()),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "POST",
            "/v1/services/web/scale",
            Some(br#"{"replicas": "two"}"#.to_vec()),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "POST",
            "/v1/services/nope/scale",
            Some(br#"{"replicas": 1}"#.to_vec()),
            StatusCode::NOT_FOUND,
        ),
        ("DELETE", "/v1/services/nope", None, StatusCode::NOT_FOUND),
        ("GET", "/v1/services/nope", None, StatusCode::NOT_FOUND),
        ("GET", "/v1/instances/nope", None, StatusCode::NOT_FOUND),
        ("GET", "/v1/nodes/nope", None, StatusCode::NOT_FOUND),
        ("POST", "/v1/nodes/nope/drain", None, StatusCode::NOT_FOUND),
        (
            "GET",
            "/v1/instances?color=red",
            None,
            StatusCode::BAD_REQUEST,
        ),
        (
            "GET",
            "/v1/services?tag=novalue",
            None,
            StatusCode::BAD_REQUEST,
        ),
        ("GET", "/v1/nowhere", None, StatusCode::NOT_FOUND),
        ("PATCH", "/v1/status", None, StatusCode::METHOD_NOT_ALLOWED),
        (
            "POST",
            "/v1/agent/register",
            Some(br#"{"name": "n/1", "cpu": 1, "memory": 1, "arch": "amd64"}"#.to_vec()),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ];
    for (method, uri, body, expected) in cases {
        let (status, answer) = h.raw(method, uri, body, "application/json").await;
        assert_eq!(status, expected, "{method} {uri}: {answer}");
        let message = answer["error"].as_str().unwrap_or_default();
        assert!(
            !message.is_empty(),
            "{method} {uri}: no JSON error in {answer}"
        );
    }
    let (status, answer) = h
        .raw("POST", "/v1/apply", Some(b"{}".to_vec()), "text/plain")
        .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{answer}");
    assert!(answer["error"].is_string());
    assert_eq!(h.keys().await, before);
    assert_eq!(h.revision().await, revision);
}

#[tokio::test]
async fn oversized_bodies_are_refused_with_413() {
    let h = support::harness_with(cca_api::ApiConfig {
        max_body_bytes: 1024,
        ..cca_api::ApiConfig::default()
    })
    .await;
    let mut big = to_json(&program(&[("web", 1)]));
    big["services"]["web"]["env"]["PAD"] = json!("x".repeat(4096));
    let (status, answer) = h.call("POST", "/v1/apply", Some(big)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        answer["error"],
        "request body is larger than the server accepts"
    );
    assert!(h.keys().await.is_empty());
}

#[tokio::test]
async fn node_controls_need_a_registered_node() {
    let h = harness().await;
    let register = json!({"name": "n1", "cpu": 4000, "memory": 8_589_934_592_u64, "arch": "amd64"});
    let (status, reply) = h.call("POST", "/v1/agent/register", Some(register)).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let (status, drained) = h.call("POST", "/v1/nodes/n1/drain", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        drained["control"],
        json!({"drain": true, "disabled": false})
    );
    h.call("POST", "/v1/nodes/n1/disable", None).await;
    let (_, rows) = h.call("GET", "/v1/nodes", None).await;
    assert_eq!(rows[0]["status"], "ready");
    assert_eq!(
        (rows[0]["draining"].clone(), rows[0]["disabled"].clone()),
        (json!(true), json!(true))
    );
    let (_, enabled) = h.call("POST", "/v1/nodes/n1/enable", None).await;
    assert_eq!(
        enabled["control"],
        json!({"drain": false, "disabled": false})
    );
    let (_, status) = h.call("GET", "/v1/status", None).await;
    assert_eq!(status["nodes"]["ready"], 1);
}

/// A drain that a zero budget holds says so in the node's detail.
#[tokio::test]
async fn a_node_detail_names_the_services_holding_its_drain() {
    let h = harness().await;
    let register = json!({"name": "n1", "cpu": 4000, "memory": 8_589_934_592_u64, "arch": "amd64"});
    h.call("POST", "/v1/agent/register", Some(register)).await;
    let mut held = program(&[("db", 1), ("web", 1)]);
    if let Some(db) = held.services.get_mut("db") {
        db.budget = Some(cca_model::spec::DisruptionBudget { max_unavailable: 0 });
    }
    let (status, _) = h.call("POST", "/v1/apply", Some(to_json(&held))).await;
    assert_eq!(status, StatusCode::OK);
    let mut txn = cca_store::Txn::new();
    for service in ["db", "web"] {
        let instance = support::instance(&format!("{service}-0"), service, "n1");
        let key = cca_model::keys::derived_instance(service, &instance.id);
        txn = txn.then(cca_store::Op::put(
            &key,
            serde_json::to_vec(&instance).expect("encodes"),
        ));
    }
    h.store.txn(txn).await.expect("writes");
    let (_, before) = h.call("GET", "/v1/nodes/n1", None).await;
    assert!(before.get("drain_held_by").is_none(), "{before}");
    h.call("POST", "/v1/nodes/n1/drain", None).await;
    let (status, detail) = h.call("GET", "/v1/nodes/n1", None).await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert_eq!(detail["drain_held_by"], json!(["db"]));
}

/// `cca resume-replacement`: refused while nothing is paused; during a
/// pause it records the operator's word (dated no earlier than the pause)
/// and an event, and `status` shows the pause.
#[tokio::test]
async fn resuming_replacement_needs_a_pause_and_records_the_word() {
    let h = harness().await;
    let (status, body) = h.call("POST", "/v1/cluster/resume-replacement", None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not paused"),
        "{body}"
    );

    let far_future = cca_model::clock::now_millis() + 3_600_000;
    let pause = cca_model::cluster::Disruption {
        paused: true,
        since: far_future,
        missing: 4,
        nodes: 9,
        resumed_by: None,
    };
    let put = cca_store::Txn::new().then(cca_store::Op::put(
        cca_model::keys::derived_disruption(),
        serde_json::to_vec(&pause).expect("encodes"),
    ));
    h.store.txn(put).await.expect("writes");
    let (status, shown) = h.call("GET", "/v1/status", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(shown["disruption"]["paused"], json!(true), "{shown}");
    assert_eq!(shown["disruption"]["missing"], json!(4), "{shown}");

    let (status, resumed) = h.call("POST", "/v1/cluster/resume-replacement", None).await;
    assert_eq!(status, StatusCode::OK, "{resumed}");
    assert_eq!(resumed["missing"], json!(4));
    assert_eq!(resumed["nodes"], json!(9));
    let word = h
        .store
        .get(&cca_model::keys::desired_replacement_resume())
        .await
        .expect("reads")
        .expect("the word is recorded");
    let word: cca_model::cluster::ReplacementResume =
        serde_json::from_slice(&word.value).expect("decodes");
    assert!(word.at >= far_future, "dated no earlier than the pause");
    let (_, events) = h.call("GET", "/v1/events", None).await;
    assert!(
        events
            .as_array()
            .expect("a list")
            .iter()
            .any(|event| event["message"]
                .as_str()
                .is_some_and(|m| m.contains("resumed lost-node replacement"))),
        "{events}"
    );
}

/// The liveness listener's router (`cca server --liveness-listen`) serves
/// registration and heartbeats against the same state, and nothing else.
#[tokio::test]
async fn the_liveness_router_serves_registration_and_heartbeats_only() {
    let h = harness().await;
    let liveness = cca_api::liveness_app(h.state.clone());
    let register = json!({"name": "n1", "cpu": 4000, "memory": 8_589_934_592_u64, "arch": "amd64"});
    let (status, registered) =
        support::call(&liveness, "POST", "/v1/agent/register", Some(register)).await;
    assert_eq!(status, StatusCode::OK, "{registered}");
    let beat = json!({"lease_id": registered["lease_id"]});
    let (status, renewed) = support::call(
        &liveness,
        "POST",
        "/v1/agent/nodes/n1/heartbeat",
        Some(beat),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{renewed}");
    let (status, _) = h.call("GET", "/v1/nodes/n1", None).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the main router sees the registration"
    );
    for (method, path) in [("GET", "/v1/status"), ("POST", "/v1/apply")] {
        let (status, body) = support::call(&liveness, method, path, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {body}");
    }
}

#[tokio::test]
async fn events_are_listed_filtered_and_pruned() {
    let h = harness().await;
    h.call("POST", "/v1/apply", Some(to_json(&program(&[("web", 1)]))))
        .await;
    h.call(
        "POST",
        "/v1/services/web/scale",
        Some(json!({"replicas": 2})),
    )
    .await;
    let (_, all) = h.call("GET", "/v1/events", None).await;
    assert_eq!(all.as_array().map(Vec::len), Some(2));
    let (_, about_web) = h.call("GET", "/v1/events?subject=service/web", None).await;
    assert_eq!(about_web.as_array().map(Vec::len), Some(1));
    let (_, newest) = h.call("GET", "/v1/events?limit=1", None).await;
    assert_eq!(newest[0]["subject"], "service/web");

    let kept_one = cca_api::prune_events_now(h.store.as_ref(), 0, 1)
        .await
        .expect("prunes");
    assert_eq!(kept_one, 1);
    let far_future = i64::MAX / 2;
    cca_api::prune_events_now(h.store.as_ref(), far_future, 10)
        .await
        .expect("prunes");
    let (_, none) = h.call("GET", "/v1/events", None).await;
    assert_eq!(none, json!([]));
}

/// A store that refuses transactions of more than two operations, as etcd
/// refuses more than its `--max-txn-ops`.
#[derive(Debug)]
struct TwoOpsAtMost;

#[async_trait::async_trait]
impl cca_store::decorate::Hook for TwoOpsAtMost {
    async fn before(&self, call: cca_store::decorate::Call<'_>) -> cca_store::Result<()> {
        match call {
            cca_store::decorate::Call::Txn { txn } if txn.ops.len() > 2 => Err(
                cca_store::StoreError::InvalidRequest(format!("{} ops", txn.ops.len())),
            ),
            _ => Ok(()),
        }
    }

    fn max_txn_ops(&self, _inner: usize) -> usize {
        2
    }
}

#[tokio::test]
async fn retention_deletes_in_transactions_the_store_takes() {
    let h = harness().await;
    h.call("POST", "/v1/apply", Some(to_json(&program(&[("web", 1)]))))
        .await;
    for replicas in 2..=6 {
        h.call(
            "POST",
            "/v1/services/web/scale",
            Some(json!({"replicas": replicas})),
        )
        .await;
    }
    let (_, all) = h.call("GET", "/v1/events", None).await;
    assert_eq!(all.as_array().map(Vec::len), Some(6));
    let limited = cca_store::decorate::Decorated::wrap(Arc::clone(&h.store), TwoOpsAtMost);
    let deleted = cca_api::prune_events_now(&limited, i64::MAX / 2, 100)
        .await
        .expect("prunes in transactions of two");
    assert_eq!(deleted, 6);
    let (_, none) = h.call("GET", "/v1/events", None).await;
    assert_eq!(none, json!([]));
}

/// `follow` sends the listed events, then each new one about the subject
/// asked for, as it is logged.
#[tokio::test]
async fn followed_events_stream_the_new_ones_about_their_subject() {
    let h = harness().await;
    h.call(
        "POST",
        "/v1/apply",
        Some(to_json(&program(&[("web", 1), ("api", 1)]))),
    )
    .await;
    let (client, _stop) = h.serve().await;
    let query = cca_wire::client::EventQuery {
        subject: Some("service/web".into()),
        ..Default::default()
    };
    let mut stream = client.follow_events(&query).await.expect("follows");
    for (service, replicas) in [("api", 3), ("web", 2)] {
        let (status, body) = h
            .call(
                "POST",
                &format!("/v1/services/{service}/scale"),
                Some(json!({"replicas": replicas})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let next = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
        .await
        .expect("an event in time")
        .expect("the stream goes on")
        .expect("a record");
    assert_eq!(next.event.subject, "service/web");
    assert!(next.event.message.contains("to 2"), "{:?}", next.event);
}

#[tokio::test]
async fn metrics_count_requests_and_include_the_plugged_in_renderer() {
    let h = harness().await;
    h.call("GET", "/v1/status", None).await;
    let (status, text) = h.call("GET", "/metrics", None).await;
    assert_eq!(status, StatusCode::OK);
    let text = text.as_str().unwrap_or_default().to_owned();
    assert!(
        text.contains(r#"cca_api_requests_total{route="/v1/status",method="GET",status="200"} 1"#),
        "{text}"
    );
    assert!(text.contains("runner_cycles_total 7"), "{text}");
}

/// `/metrics` with the control plane's real metrics is what Prometheus
/// scrapes: its content type names the text format 0.0.4 and `promtool
/// check metrics` (Prometheus' own linter) finds nothing to report, in the
/// request metrics, the admission lanes' gauges and shed counters (the
/// scrape itself in flight in `bulk`) and the control plane's.
#[tokio::test]
async fn metrics_pass_promtool_check_metrics() {
    let Some(promtool) = promtool() else {
        return;
    };
    let control = Arc::new(cca_control::metrics::Metrics::new());
    let label = cca_control::metrics::Metrics::label("scheduler");
    control.cycles.get_or_create(&label).inc();
    control.cycle_seconds.get_or_create(&label).observe(0.002);
    control.placements.inc();
    control.store_txn_seconds.observe(0.001);
    let render = Arc::clone(&control);
    let h = harness_with_metrics(
        cca_api::ApiConfig::default(),
        Arc::new(move || render.render()),
    )
    .await;
    h.call("GET", "/v1/status", None).await;

    let response = h
        .app
        .clone()
        .oneshot(
            Request::get("/metrics")
                .body(Body::empty())
                .expect("request builds"),
        )
        .await
        .expect("answers");
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body reads")
        .to_bytes();
    let text = String::from_utf8(body.to_vec()).expect("utf-8");
    assert!(text.contains("reconciliation_cycle_total"), "{text}");
    for admission in [
        "cca_api_lane_in_flight{lane=\"liveness\"} 0",
        "cca_api_lane_in_flight{lane=\"bulk\"} 1",
        "cca_api_lane_queued{lane=\"user\"} 0",
        "cca_api_requests_shed_total{lane=\"reports\",reason=\"queue_full\"} 0",
        "cca_api_requests_shed_total{lane=\"user\",reason=\"timed_out\"} 0",
    ] {
        assert!(text.contains(admission), "{admission} in:\n{text}");
    }

    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool starts");
    child
        .stdin
        .take()
        .expect("stdin piped")
        .write_all(text.as_bytes())
        .expect("promtool reads the text");
    let output = child.wait_with_output().expect("promtool ends");
    assert!(
        output.status.success() && output.stdout.is_empty() && output.stderr.is_empty(),
        "promtool check metrics: {}\n{}{}\non:\n{text}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
}

/// `promtool` on the PATH. scripts/test installs it as root, so only a
/// non-root run may go without (and says so).
fn promtool() -> Option<&'static str> {
    let found = std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    if found {
        return Some("promtool");
    }
    assert!(
        !rustix::process::geteuid().is_root(),
        "promtool is missing: scripts/test installs it (Debian package prometheus)"
    );
    #[allow(clippy::print_stderr, reason = "a skipped test says why")]
    {
        eprintln!("skipped: promtool is missing and not root (scripts/test installs it as root)");
    }
    None
}

/// Posts `body` as raw HTTP/1.1 on a socket; returns the status and the
/// JSON body.
async fn post_by_hand(address: std::net::SocketAddr, path: &str, body: &[u8]) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connects");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("writes");
    stream.write_all(body).await.expect("writes");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("reads");
    let response = String::from_utf8(response).expect("UTF-8 answer");
    let (head, body) = response.split_once("\r\n\r\n").expect("head and body");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    let body = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()));
    (status, body)
}

/// A program written by hand (no compiler: JSON built here, posted on a
/// socket) that `cca lint` would refuse: a bad service name, two gates with
/// one host, a connection to an undefined secret. The server answers 422
/// listing every problem, writes nothing, and the typed client (what the
/// CLI prints) shows each one.
#[tokio::test]
async fn a_program_the_compiler_would_refuse_gets_422_with_every_problem() {
    let h = harness().await;
    h.call("POST", "/v1/apply", Some(to_json(&program(&[("web", 1)]))))
        .await;
    let before = h.keys().await;
    let revision = h.revision().await;
    let (address, _stop) = h.listen().await;

    let mut web = to_json(&support::service("web", 2));
    web["connections"] = json!(["db"]);
    let gate = |name: &str| {
        json!({"name": name, "hosts": ["shop.example.com"], "service": "web", "port": 8080,
               "sticky": null, "tls": null})
    };
    let posted = json!({
        "services": {"web": web, "Bad_Name": to_json(&support::service("Bad_Name", 1))},
        "tags": {},
        "grants": {},
        "gates": {"a": gate("a"), "b": gate("b")},
        "connections": {"db": {
            "name": "db", "driver": "postgresql", "user": "app", "secret": "db-password",
            "host": "db.internal", "port": 5432, "database": null, "params": {}
        }},
        "secrets": {},
        "networks": {},
    });
    let (status, answer) = post_by_hand(address, "/v1/apply", posted.to_string().as_bytes()).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(
        answer["error"],
        "the program has 3 problems (the rules `cca lint` checks); nothing was written"
    );
    let problems: Vec<String> = answer["problems"]
        .as_array()
        .expect("a list of problems")
        .iter()
        .map(|p| {
            format!(
                "{} {} {} {}: {}",
                p["code"].as_str().unwrap_or("?"),
                p["subject"]["kind"].as_str().unwrap_or("?"),
                p["subject"]["name"].as_str().unwrap_or("?"),
                p["subject"]["field"].as_str().unwrap_or(""),
                p["message"].as_str().unwrap_or("?"),
            )
        })
        .collect();
    assert_eq!(
        problems,
        [
            "cca::E021 service Bad_Name name: `Bad_Name` is not a valid service name",
            "cca::E016 gate b hosts[0]: host `shop.example.com` is already served by gate `a`",
            "cca::E018 connection db secret: undefined secret `db-password`",
        ]
    );
    assert_eq!(h.keys().await, before, "nothing was written");
    assert_eq!(h.revision().await, revision);

    // The same program through the typed client: its error, as the CLI
    // prints it, lists the problems.
    let (client, _stop) = h.serve().await;
    let program: cca_model::spec::Program = serde_json::from_value(posted).expect("a program");
    let error = client.apply(&program, false).await.expect_err("refused");
    assert_eq!(error.status(), Some(422));
    assert_eq!(
        error.to_string(),
        "the program has 3 problems (the rules `cca lint` checks); nothing was written \
         (HTTP 422)\n  \
         cca::E021 service `Bad_Name` name: `Bad_Name` is not a valid service name \
         (service names are DNS labels: lowercase letters, digits and `-`, at most 63 \
         characters)\n  \
         cca::E016 gate `b` hosts[0]: host `shop.example.com` is already served by gate `a` \
         (a host is served by one gate: remove it from all but one)\n  \
         cca::E018 connection `db` secret: undefined secret `db-password` \
         (declare it: `secret db-password { ... }`)"
    );
    assert_eq!(h.keys().await, before);
}
