//! The MCP tools through rmcp's own client, against a real control plane
//! (embedded store, scheduler, API on a loopback port) with no nodes, so
//! every service's demand is pending for a reason the scheduler gives:
//! the tool list is read-only, pages stay within the token budget and
//! their cursors cover a list once, describe and explain answer from the
//! cluster's state, and bad arguments and unknown names are MCP errors
//! that say what is wrong. With writes allowed, each write is a plan
//! first and happens only with that plan's confirm token.

use std::sync::Arc;
use std::time::Duration;

use cca_api::control_plane::{ControlPlane, ControlPlaneConfig};
use cca_mcp::CcaMcp;
use cca_mcp::budget;
use cca_model::spec::{PortSpec, Program, ServiceSpec, Workload};
use cca_store::Store;
use cca_store::embedded::{Config, EmbeddedStore};
use cca_wire::Client;
use rmcp::ServiceExt as _;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService, ServiceError};
use serde_json::{Value, json};

/// The token budget of the server under test: small, so lists page.
const BUDGET: usize = 1_000;
const SERVICES: usize = 40;

struct Cluster {
    _dir: tempfile::TempDir,
    plane: ControlPlane,
    url: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn cluster() -> Cluster {
    let dir = tempfile::tempdir().expect("temp dir");
    let store: Arc<dyn Store> = Arc::new(
        EmbeddedStore::open(Config::new(dir.path()))
            .await
            .expect("store opens"),
    );
    let plane = ControlPlane::start(store, ControlPlaneConfig::new("mcp-test"))
        .await
        .expect("control plane starts");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let state = plane.state().clone();
    tokio::spawn(async move {
        let _ = cca_api::serve(listener, state, async {
            let _ = stopped.await;
        })
        .await;
    });
    let mut program = Program::default();
    for index in 0..SERVICES {
        let name = format!("svc-{index:02}");
        let spec = ServiceSpec {
            replicas: 2,
            ports: vec![PortSpec::tcp("http", 8080)],
            ..ServiceSpec::new(&name, Workload::process("sleep 1000"))
        };
        program.services.insert(name, spec);
    }
    Client::new(&url)
        .apply(&program, false)
        .await
        .expect("the program applies");
    Cluster {
        _dir: dir,
        plane,
        url,
        _stop: stop,
    }
}

async fn connect(url: &str) -> RunningService<RoleClient, ()> {
    serve(CcaMcp::new(Client::new(url), BUDGET)).await
}

async fn serve(server: CcaMcp) -> RunningService<RoleClient, ()> {
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_io).await.expect("the client connects")
}

/// Calls `tool` with `arguments`: the answer's JSON and its estimated
/// tokens, or the error (an MCP error, or a failed call's text).
async fn call(
    client: &RunningService<RoleClient, ()>,
    tool: &'static str,
    arguments: Value,
) -> Result<(Value, usize), rmcp::ErrorData> {
    let mut params = CallToolRequestParams::new(tool);
    if let Value::Object(arguments) = arguments {
        params = params.with_arguments(arguments);
    }
    match client.call_tool(params).await {
        Ok(result) => {
            let text = &result.content[0].as_text().expect("a text answer").text;
            if result.is_error == Some(true) {
                // The SDK answers arguments that do not decode as a
                // failed call, for the model to read.
                return Err(rmcp::ErrorData::invalid_params(text.clone(), None));
            }
            let tokens = text.len().div_ceil(budget::BYTES_PER_TOKEN);
            let value = serde_json::from_str(text)
                .unwrap_or_else(|error| panic!("{tool} answered no JSON ({error}): {text}"));
            Ok((value, tokens))
        }
        Err(ServiceError::McpError(error)) => Err(error),
        Err(other) => panic!("{tool}: {other}"),
    }
}

#[tokio::test]
async fn the_tools_read_the_cluster_within_the_budget_and_refuse_bad_arguments() {
    let cluster = cluster().await;
    let client = connect(&cluster.url).await;

    // Read-only: nothing that writes is offered.
    let tools: Vec<String> = client
        .list_all_tools()
        .await
        .expect("tools")
        .into_iter()
        .map(|tool| tool.name.to_string())
        .collect();
    for expected in [
        "cluster_status",
        "list_services",
        "describe_service",
        "list_instances",
        "describe_instance",
        "list_nodes",
        "describe_node",
        "explain_pending",
        "list_events",
        "tail_logs",
    ] {
        assert!(tools.contains(&expected.to_owned()), "{tools:?}");
    }
    assert!(
        !tools
            .iter()
            .any(|tool| ["apply", "scale", "rollback", "delete"]
                .iter()
                .any(|w| tool.contains(w))),
        "{tools:?}"
    );

    // Every service once over the pages, each page within the budget.
    let (mut names, mut cursor, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let arguments = match &cursor {
            Some(cursor) => json!({"cursor": cursor}),
            None => json!({}),
        };
        let (page, tokens) = call(&client, "list_services", arguments)
            .await
            .expect("a page");
        assert!(tokens <= BUDGET, "{tokens} tokens");
        assert_eq!(page["total"], SERVICES);
        assert_eq!(page["short_of_replicas"], SERVICES, "nothing runs");
        names.extend(
            page["items"]
                .as_array()
                .expect("items")
                .iter()
                .map(|row| row["name"].as_str().expect("name").to_owned()),
        );
        pages += 1;
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let expected: Vec<String> = (0..SERVICES).map(|i| format!("svc-{i:02}")).collect();
    assert_eq!(names, expected);
    assert!(pages > 1, "the budget pages the list");

    // The scheduler's reason, with no node to place on.
    let explained = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let (answer, _) = call(&client, "explain_pending", json!({"service": "svc-07"}))
                .await
                .expect("explained");
            if !answer["unplaced"].is_null() {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the scheduler records why svc-07 is pending");
    assert_eq!(explained["replicas"], 2);
    assert_eq!(explained["unplaced"]["instances"], 2);
    assert!(explained["unplaced"]["reason"].is_string(), "{explained}");
    let (all, tokens) = call(&client, "explain_pending", json!({}))
        .await
        .expect("explained");
    assert!(tokens <= BUDGET, "{tokens}");
    assert!(
        all["services_with_pending_demand"].as_u64() >= Some(1),
        "{all}"
    );

    let (status, _) = call(&client, "cluster_status", json!({}))
        .await
        .expect("status");
    assert_eq!(status["services"], SERVICES);
    assert_eq!(status["healthy"], false, "demand is pending: {status}");

    let (detail, tokens) = call(&client, "describe_service", json!({"name": "svc-03"}))
        .await
        .expect("described");
    assert_eq!(detail["summary"]["name"], "svc-03");
    assert!(tokens <= BUDGET, "{tokens}");

    // Bad input: MCP errors that name the problem.
    let unknown = call(&client, "describe_service", json!({"name": "nope"}))
        .await
        .expect_err("no such service");
    assert!(unknown.message.contains("nope"), "{}", unknown.message);
    let cursor = call(&client, "list_services", json!({"cursor": "tomorrow"}))
        .await
        .expect_err("not our cursor");
    assert!(cursor.message.contains("next_cursor"), "{}", cursor.message);
    let state = call(&client, "list_instances", json!({"state": "sleepy"}))
        .await
        .expect_err("no such state");
    assert!(
        state.message.contains("running, pending or all"),
        "{}",
        state.message
    );
    let both = call(
        &client,
        "tail_logs",
        json!({"instance": "a", "service": "b"}),
    )
    .await
    .expect_err("one source");
    assert!(both.message.contains("either"), "{}", both.message);
    let missing = call(&client, "describe_node", json!({}))
        .await
        .expect_err("name is required");
    assert!(missing.message.contains("name"), "{}", missing.message);

    client.cancel().await.expect("the session ends");
    cluster.plane.stop().await;
}

/// The tokens of a plan: the answer's `confirm`.
fn confirm_of(answer: &Value) -> String {
    answer["confirm"]
        .as_str()
        .expect("a confirm token")
        .to_owned()
}

#[tokio::test]
async fn writes_are_planned_and_carried_out_only_with_the_plans_token() {
    let cluster = cluster().await;
    let read_only = connect(&cluster.url).await;
    let scale = json!({"service": "svc-01", "replicas": 5});
    let refused = call(&read_only, "scale_service", scale.clone())
        .await
        .expect_err("no write tools without --allow-writes");
    assert!(refused.message.contains("not found"), "{}", refused.message);

    let server = CcaMcp::new(Client::new(&cluster.url), BUDGET)
        .allowing_writes()
        .expect("writes");
    let client = serve(server).await;
    let replicas = |detail: &Value| detail["summary"]["replicas"].clone();
    let describe = || call(&client, "describe_service", json!({"name": "svc-01"}));

    // A plan changes nothing.
    let (plan, _) = call(&client, "scale_service", scale.clone())
        .await
        .expect("a plan");
    assert_eq!(plan["plan"]["replicas_now"], 2, "{plan}");
    assert_eq!(plan["plan"]["replicas_after"], 5);
    assert_eq!(replicas(&describe().await.expect("described").0), 2);

    // A token that is not the plan's does nothing.
    let token = confirm_of(&plan);
    for (arguments, why) in [
        (
            json!({"service": "svc-01", "replicas": 5, "confirm": "00ff"}),
            "forged",
        ),
        (
            json!({"service": "svc-01", "replicas": 6, "confirm": token}),
            "other arguments",
        ),
        (
            json!({"service": "svc-02", "replicas": 5, "confirm": token}),
            "another service",
        ),
    ] {
        let error = call(&client, "scale_service", arguments)
            .await
            .expect_err(why);
        assert!(
            error.message.contains("not this plan's"),
            "{why}: {}",
            error.message
        );
    }
    assert_eq!(replicas(&describe().await.expect("described").0), 2);

    // The plan's token carries it out, once: the cluster then differs
    // from the plan.
    let confirmed = json!({"service": "svc-01", "replicas": 5, "confirm": token});
    let (done, _) = call(&client, "scale_service", confirmed.clone())
        .await
        .expect("scaled");
    assert_eq!(done["scaled"]["replicas"], 5, "{done}");
    assert_eq!(replicas(&describe().await.expect("described").0), 5);
    let stale = call(&client, "scale_service", confirmed)
        .await
        .expect_err("stale");
    assert!(stale.message.contains("changed"), "{}", stale.message);

    // A program: diffed, planned, applied with its token; one with errors
    // is answered with the compiler's diagnostics.
    let program = "service extra {\n  run = \"sleep 600\"\n}\n";
    let (diff, _) = call(&client, "diff_program", json!({"program": program}))
        .await
        .expect("a diff");
    assert_eq!(diff["created"], json!(["desired/service/extra"]), "{diff}");
    let (plan, _) = call(&client, "apply_program", json!({"program": program}))
        .await
        .expect("a plan");
    let token = confirm_of(&plan);
    let (applied, _) = call(
        &client,
        "apply_program",
        json!({"program": program, "confirm": token}),
    )
    .await
    .expect("applied");
    assert_eq!(
        applied["applied"]["created"],
        json!(["desired/service/extra"])
    );
    let broken = call(&client, "diff_program", json!({"program": "service {"}))
        .await
        .expect_err("a syntax error");
    assert!(broken.message.contains("main.cca"), "{}", broken.message);

    client.cancel().await.expect("the session ends");
    read_only.cancel().await.expect("the session ends");
    cluster.plane.stop().await;
}

/// Serves `mcp` over HTTP on a loopback port: its `/mcp` URL.
async fn serve_over_http(mcp: CcaMcp, bearer_required: bool) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let url = format!(
        "http://{}{}",
        listener.local_addr().expect("address"),
        cca_mcp::http::MCP_PATH
    );
    let options = cca_mcp::http::HttpOptions { bearer_required };
    tokio::spawn(cca_mcp::http::serve_http(
        listener,
        mcp,
        options,
        std::future::pending(),
    ));
    url
}

async fn http_client(url: &str, token: Option<&str>) -> RunningService<RoleClient, ()> {
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    if let Some(token) = token {
        config = config.auth_header(token);
    }
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("the HTTP client connects")
}

#[tokio::test]
async fn over_http_the_tools_answer_and_a_request_without_a_required_token_is_refused() {
    let cluster = cluster().await;
    let mcp = CcaMcp::new(Client::new(&cluster.url), BUDGET);

    // A cluster without users: no token needed, the API answers.
    let open = serve_over_http(mcp.clone(), false).await;
    let client = http_client(&open, None).await;
    let (page, _) = call(&client, "list_services", json!({"limit": 3}))
        .await
        .expect("a page over HTTP");
    assert_eq!(page["total"], SERVICES);
    client.cancel().await.expect("the session ends");

    // Tokens required: curl without one is refused before MCP, saying
    // what to send. (That each call presents its request's token to the
    // API is tested end to end in the `cca` crate, against users.)
    let guarded = serve_over_http(mcp, true).await;
    // On a thread of its own: the server answers on this test's runtime.
    let url = guarded.clone();
    let refused = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["-s", "-i", "--max-time", "10", "-X", "POST"])
            .args(["-H", "content-type: application/json"])
            .args(["-H", "accept: application/json, text/event-stream"])
            .args(["--data", r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#])
            .arg(&url)
            .output()
            .expect("curl runs (scripts/test installs it)")
    })
    .await
    .expect("curl's thread");
    let answer = String::from_utf8_lossy(&refused.stdout);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "{answer}"
    );
    assert!(answer.contains("Authorization: Bearer"), "{answer}");
    cluster.plane.stop().await;
}
