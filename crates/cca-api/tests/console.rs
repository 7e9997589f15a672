//! The web console's routes: each page's view (the verdict first, one
//! page of rows, worst first), the live feed of a view as server-sent
//! events, the diff and apply of a pasted program, and the page and
//! assets under `/ui`.

mod support;

use std::time::Duration;

use axum::http::StatusCode;
use cca_model::cluster::{InstanceState, InstanceStatus, Unplaced, UnplacedReason};
use cca_model::spec::Program;
use cca_store::{Op, Txn};
use serde_json::{Value, json};
use support::{Harness, harness, json as to_json, program};

/// Registers `n1`, applies `program` and places `placed` (instance,
/// service) on it, each reported in the given state.
async fn cluster(h: &Harness, program: &Program, placed: &[(&str, &str, InstanceState)]) {
    let register = json!({"name": "n1", "cpu": 4000, "memory": 8_589_934_592_u64, "arch": "amd64"});
    let (status, body) = h.call("POST", "/v1/agent/register", Some(register)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = h.call("POST", "/v1/apply", Some(to_json(program))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut txn = Txn::new();
    for (id, service, state) in placed {
        let instance = support::instance(id, service, "n1");
        let report = InstanceStatus {
            id: (*id).into(),
            service: (*service).into(),
            node: "n1".into(),
            state: *state,
            healthy: None,
            pid: Some(4242),
            address: None,
            own_network: false,
            host_ports: Default::default(),
            restarts: u32::from(*state == InstanceState::Failed) * 5,
            last_exit: None,
            message: (*state == InstanceState::Failed).then(|| "gave up after 5 restarts".into()),
            updated_at: 1,
        };
        txn = txn
            .then(Op::put(
                cca_model::keys::derived_instance(service, id),
                serde_json::to_vec(&instance).expect("encodes"),
            ))
            .then(Op::put(
                cca_model::keys::observed_instance(id),
                serde_json::to_vec(&report).expect("encodes"),
            ));
    }
    h.store.txn(txn).await.expect("writes");
}

async fn unplace(h: &Harness, service: &str, count: u32) {
    let unplaced = Unplaced {
        service: service.into(),
        count,
        reason: UnplacedReason::InsufficientCapacity,
        constraint: "memory: needs 64Gi, at most 8Gi free".into(),
        nearest_node: Some("n1".into()),
        since: 1,
    };
    h.store
        .txn(Txn::new().then(Op::put(
            cca_model::keys::derived_unplaced(service),
            serde_json::to_vec(&unplaced).expect("encodes"),
        )))
        .await
        .expect("writes");
}

fn health_of<'a>(problems: &'a Value, subject: &str) -> &'a Value {
    problems
        .as_array()
        .and_then(|all| all.iter().find(|p| p["subject"] == subject))
        .map_or(&Value::Null, |p| &p["health"])
}

#[tokio::test]
async fn the_overview_answers_whether_the_cluster_is_healthy_and_why_not() {
    let h = harness().await;
    let program = program(&[("web", 2), ("db", 1), ("cache", 1)]);
    cluster(
        &h,
        &program,
        &[
            ("web-1", "web", InstanceState::Running),
            ("web-2", "web", InstanceState::Failed),
            ("cache-1", "cache", InstanceState::Running),
        ],
    )
    .await;
    unplace(&h, "db", 1).await;
    let (status, body) = h.call("GET", "/v1/console/overview", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let view = &body["view"];
    assert_eq!(view["verdict"]["health"], "degraded", "{view}");
    let reasons = view["verdict"]["reasons"].to_string();
    assert!(reasons.contains("1 service down"), "{reasons}");
    assert!(reasons.contains("1 service degraded"), "{reasons}");
    assert!(reasons.contains("demand no node can take"), "{reasons}");
    assert_eq!(view["nodes"]["ready"], 1);
    assert_eq!(
        view["services"],
        json!({"down": 1, "degraded": 1, "healthy": 1})
    );
    assert_eq!(view["instances"], json!({"running": 2, "failed": 1}));
    // Worst first: the service with nothing ready, then the failing one.
    assert_eq!(view["problems"][0]["subject"], "service/db");
    assert_eq!(health_of(&view["problems"], "service/web"), "degraded");
    assert_eq!(health_of(&view["problems"], "service/cache"), &Value::Null);
    let web = view["problems"][1]["reasons"].to_string();
    assert!(web.contains("1 of 2 instances ready"), "{web}");
    assert!(web.contains("1 failed (gave up restarting)"), "{web}");
    assert!(web.contains("web-2: gave up after 5 restarts"), "{web}");
    let db = view["problems"][0]["reasons"].to_string();
    assert!(db.contains("1 unplaced: memory: needs 64Gi"), "{db}");
    assert_eq!(view["unplaced"][0]["service"], "db");
    assert!(body["events"].is_array(), "{body}");
}

#[tokio::test]
async fn lists_come_a_page_at_a_time_worst_first_and_filtered_by_name() {
    let h = harness().await;
    let names: Vec<String> = (0..120).map(|n| format!("svc-{n:03}")).collect();
    let sized: Vec<(&str, u32)> = names
        .iter()
        .enumerate()
        .map(|(n, name)| (name.as_str(), u32::from(n == 117)))
        .collect();
    cluster(&h, &program(&sized), &[]).await;
    let (status, page) = h.call("GET", "/v1/console/services", None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let view = &page["view"];
    assert_eq!(
        (view["total"].as_u64(), view["pages"].as_u64()),
        (Some(120), Some(3))
    );
    assert_eq!(view["rows"].as_array().map(Vec::len), Some(50));
    // The one service with nothing ready comes first, whatever its name.
    assert_eq!(view["rows"][0]["name"], "svc-117");
    assert_eq!(view["rows"][0]["verdict"]["health"], "down");
    assert_eq!(view["rows"][1]["name"], "svc-000");
    let (_, last) = h.call("GET", "/v1/console/services?page=2", None).await;
    assert_eq!(last["view"]["rows"].as_array().map(Vec::len), Some(20));
    let (_, past) = h.call("GET", "/v1/console/services?page=9", None).await;
    assert_eq!(past["view"]["page"], 2, "a page past the end is the last");
    let (_, found) = h.call("GET", "/v1/console/services?q=svc-11", None).await;
    assert_eq!(found["view"]["total"], 10, "{found}");
    let (_, nodes) = h.call("GET", "/v1/console/nodes?q=n", None).await;
    assert_eq!(nodes["view"]["rows"][0]["name"], "n1");
    assert_eq!(nodes["view"]["rows"][0]["verdict"]["health"], "healthy");
}

#[tokio::test]
async fn pages_of_one_object_say_what_is_wrong_with_it() {
    let h = harness().await;
    cluster(
        &h,
        &program(&[("web", 2)]),
        &[
            ("web-1", "web", InstanceState::Running),
            ("web-2", "web", InstanceState::Failed),
        ],
    )
    .await;
    let (status, service) = h.call("GET", "/v1/console/services/web", None).await;
    assert_eq!(status, StatusCode::OK, "{service}");
    let view = &service["view"];
    assert_eq!(view["row"]["verdict"]["health"], "degraded");
    assert_eq!(view["spec"]["name"], "web");
    // The failed instance first.
    assert_eq!(view["instances"]["rows"][0]["id"], "web-2");
    assert_eq!(view["instances"]["rows"][0]["verdict"]["health"], "down");
    let (_, instance) = h.call("GET", "/v1/console/instances/web-2", None).await;
    let reasons = instance["view"]["row"]["verdict"]["reasons"].to_string();
    assert!(
        reasons.contains("failed: gave up after 5 restarts"),
        "{reasons}"
    );
    assert_eq!(instance["view"]["status"]["pid"], 4242);
    let (_, node) = h.call("GET", "/v1/console/nodes/n1", None).await;
    assert_eq!(node["view"]["instances"]["total"], 2, "{node}");
    for (path, named) in [
        ("/v1/console/services/nope", "no service named `nope`"),
        ("/v1/console/nodes/nope", "no node named `nope`"),
        ("/v1/console/instances/nope", "no instance `nope`"),
    ] {
        let (status, body) = h.call("GET", path, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert_eq!(body["error"], named);
    }
    for path in [
        "/v1/console/services?page=first",
        "/v1/console/services?sort=name",
    ] {
        let (status, body) = h.call("GET", path, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert!(body["error"].is_string(), "{body}");
    }
}

/// Reads server-sent events from a live response until one named `name`
/// arrives; returns its data.
async fn next_event(response: &mut reqwest::Response, buffer: &mut String, name: &str) -> Value {
    let wanted = format!("event: {name}\n");
    loop {
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            if block.starts_with(&wanted) {
                let data = block
                    .lines()
                    .find_map(|line| line.strip_prefix("data: "))
                    .expect("an event has data");
                return serde_json::from_str(data).expect("data is JSON");
            }
        }
        let chunk = tokio::time::timeout(Duration::from_secs(10), response.chunk())
            .await
            .expect("the next event in time")
            .expect("the stream reads")
            .expect("the stream goes on");
        buffer.push_str(&String::from_utf8_lossy(&chunk));
    }
}

#[tokio::test]
async fn a_live_view_is_sent_again_when_it_changes_and_a_gone_object_is_a_problem() {
    let h = harness().await;
    cluster(&h, &program(&[("web", 1)]), &[]).await;
    let (address, _stop) = h.listen().await;
    let mut response = reqwest::get(format!(
        "http://{address}/v1/console/services/web?live=true"
    ))
    .await
    .expect("opens");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "text/event-stream",
        "server-sent events"
    );
    let mut buffer = String::new();
    let first = next_event(&mut response, &mut buffer, "view").await;
    assert_eq!(first["view"]["row"]["replicas"], 1);
    let (status, body) = h
        .call(
            "POST",
            "/v1/services/web/scale",
            Some(json!({"replicas": 3})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let scaled = next_event(&mut response, &mut buffer, "view").await;
    assert_eq!(scaled["view"]["row"]["replicas"], 3, "{scaled}");
    let messages = scaled["events"].to_string();
    assert!(
        messages.contains("to 3"),
        "the events come with the view: {messages}"
    );
    let (status, body) = h.call("DELETE", "/v1/services/web", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let gone = next_event(&mut response, &mut buffer, "problem").await;
    assert_eq!(gone["status"], 404);
    assert_eq!(gone["error"], "no service named `web`");
}

#[derive(Debug)]
struct FakeCompiler;

impl cca_api::console::Compiler for FakeCompiler {
    /// A program of one service per line (`name replicas`), or the line
    /// that is not.
    fn compile(&self, source: &str) -> Result<Program, String> {
        let mut services = Vec::new();
        for (n, line) in source.lines().enumerate() {
            let mut words = line.split_whitespace();
            match (words.next(), words.next().and_then(|r| r.parse().ok())) {
                (Some(name), Some(replicas)) => services.push((name.to_owned(), replicas)),
                _ => return Err(format!("error: line {}: expected `name replicas`", n + 1)),
            }
        }
        let sized: Vec<(&str, u32)> = services.iter().map(|(n, r)| (n.as_str(), *r)).collect();
        Ok(program(&sized))
    }
}

#[tokio::test]
async fn a_pasted_program_is_diffed_then_applied_and_its_errors_shown_with_their_lines() {
    let h = harness().await;
    let (status, body) = h
        .call("POST", "/v1/console/diff", Some(json!({"source": "web 2"})))
        .await;
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "{body}");
    let _ = h
        .state
        .clone()
        .with_compiler(std::sync::Arc::new(FakeCompiler));
    // Refusals are audited; nothing else may be written.
    let facts = || async {
        let mut keys = h.keys().await;
        keys.retain(|key| !key.starts_with("audit/"));
        keys
    };
    let before = facts().await;
    let (status, body) = h
        .call(
            "POST",
            "/v1/console/diff",
            Some(json!({"source": "web 2\napi two"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(error.contains("nothing was applied"), "{error}");
    assert!(
        error.contains("line 2: expected `name replicas`"),
        "{error}"
    );
    let (status, diff) = h
        .call("POST", "/v1/console/diff", Some(json!({"source": "web 2"})))
        .await;
    assert_eq!(status, StatusCode::OK, "{diff}");
    assert_eq!(diff["dry_run"], true);
    assert!(
        diff["created"].to_string().contains("service/web"),
        "{diff}"
    );
    assert_eq!(facts().await, before, "a diff writes nothing");
    let (status, applied) = h
        .call(
            "POST",
            "/v1/console/apply",
            Some(json!({"source": "web 2"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{applied}");
    assert_eq!(applied["dry_run"], false);
    let (_, service) = h.call("GET", "/v1/services/web", None).await;
    assert_eq!(service["spec"]["replicas"], 2);
    let (status, body) = h
        .call("POST", "/v1/console/diff", Some(json!({"text": "web 2"})))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"].to_string().contains("unknown field `text`"),
        "{body}"
    );
}

#[tokio::test]
async fn the_page_and_its_assets_are_served_with_a_strict_policy_to_anyone() {
    let config = cca_api::ApiConfig {
        authentication: cca_api::auth::Authentication::Certificates,
        ..cca_api::ApiConfig::default()
    };
    let h = support::harness_with(config).await;
    let (address, _stop) = h.listen().await;
    let client = reqwest::Client::new();
    for (path, kind, holds) in [
        ("/ui", "text/html", "/ui/app.js"),
        ("/ui/app.js", "text/javascript", "/v1/console/"),
        ("/ui/app.css", "text/css", ".verdict"),
    ] {
        let response = client
            .get(format!("http://{address}{path}"))
            .send()
            .await
            .expect("answers");
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers().clone();
        assert!(
            headers["content-type"]
                .to_str()
                .unwrap_or("")
                .starts_with(kind)
        );
        let policy = headers["content-security-policy"].to_str().unwrap_or("");
        assert!(policy.contains("script-src 'self'"), "{policy}");
        assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        let body = response.text().await.expect("reads");
        assert!(body.contains(holds), "{path} holds {holds}");
    }
    let missing = client
        .get(format!("http://{address}/ui/secrets.txt"))
        .send()
        .await
        .expect("answers");
    assert_eq!(missing.status(), 404);
    // The data behind the page is the API's: it asks who calls.
    let data = client
        .get(format!("http://{address}/v1/console/overview"))
        .send()
        .await
        .expect("answers");
    assert_eq!(data.status(), 401);
}
