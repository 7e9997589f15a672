//! End to end for `cca logs` and `cca exec`: the built binary runs `cca
//! server` (embedded store in a temp dir); a fake agent (a tiny axum
//! server in this test process) registers as node `n1` with its
//! `agent_url` and keeps its lease; the scheduler places a service's
//! instance on it; the CLI then reads logs and runs commands through the
//! API, and its output and exit codes are checked.

mod support;

use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use cca_model::spec::{Cpu, Memory};
use cca_wire::Client;
use cca_wire::types::{ExecCommand, ExecResult, RegisterRequest};

use support::Server;

const PROGRAM: &str = r#"
service hello {
  run = "sleep 1000"
  replicas = 1
  tags {
    team = "web"
  }
}
"#;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn fake_logs(Path(id): Path<String>) -> String {
    format!("{id} started\n{id} serving\n")
}

/// `fail` exits 3, `kill` dies of signal 9, `slow` times out; anything
/// else echoes its arguments.
async fn fake_exec(Path(id): Path<String>, Json(command): Json<ExecCommand>) -> Response {
    let mut result = ExecResult {
        code: Some(0),
        stdout: format!("{id}: {}\n", command.argv.join(" ")),
        stderr: "note from stderr\n".into(),
        ..ExecResult::default()
    };
    match command.argv.first().map(String::as_str) {
        Some("fail") => result.code = Some(3),
        Some("kill") => (result.code, result.signal) = (None, Some(9)),
        Some("slow") => (result.code, result.timed_out) = (None, true),
        Some("refuse") => {
            let body = serde_json::json!({"error": format!("instance `{id}` is not running")});
            return (StatusCode::CONFLICT, Json(body)).into_response();
        }
        _ => {}
    }
    Json(result).into_response()
}

/// Serves the fake agent and registers it as node `n1`, renewing its
/// lease for as long as the runtime lives.
async fn start_agent(server: &str) {
    let app = axum::Router::new()
        .route("/v1/instances/{id}/logs", get(fake_logs))
        .route("/v1/instances/{id}/exec", post(fake_exec));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let client = Client::new(server);
    let registered = client
        .register(&RegisterRequest {
            name: "n1".into(),
            cpu: Cpu(4000),
            memory: Memory(8 << 30),
            arch: "amd64".into(),
            zone: None,
            labels: Default::default(),
            addresses: vec!["127.0.0.1".into()],
            agent_url: Some(format!("http://{address}")),
            gate: Default::default(),
        })
        .await
        .expect("registers");
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let _ = client.heartbeat("n1", registered.lease_id).await;
        }
    });
}

/// The id of the service's instance once the scheduler placed it.
fn placed_instance(server: &Server) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let output = server.cca(&["get", "instances", "--service", "hello", "-o", "json"]);
        let rows: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        if let Some(id) = rows[0]["id"].as_str().filter(|_| rows[0]["placed"] == true) {
            return id.to_owned();
        }
        assert!(Instant::now() < deadline, "no instance placed: {rows}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn logs_and_exec_through_the_api() {
    let server = Server::start();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(start_agent(&server.url));
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("app.cca");
    std::fs::write(&file, PROGRAM).expect("writes program");
    let applied = server.cca(&["apply", &file.display().to_string()]);
    assert!(applied.status.success(), "{}", text(&applied.stderr));
    let id = placed_instance(&server);

    let instance = server.cca(&["logs", &id]);
    assert!(instance.status.success(), "{}", text(&instance.stderr));
    assert_eq!(
        text(&instance.stdout),
        format!("{id} started\n{id} serving\n")
    );
    let service = server.cca(&["logs", "hello", "-f"]);
    assert_eq!(
        text(&service.stdout),
        format!("[{id}] {id} started\n[{id}] {id} serving\n")
    );
    let tagged = server.cca(&["logs", "--tag", "team=web"]);
    assert_eq!(text(&tagged.stdout), text(&service.stdout));
    let unknown = server.cca(&["logs", "nothing"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(text(&unknown.stderr).contains("no instance or service is named `nothing`"));

    let echoed = server.cca(&["exec", &id, "--", "echo", "hi"]);
    assert_eq!(echoed.status.code(), Some(0), "{}", text(&echoed.stderr));
    assert_eq!(text(&echoed.stdout), format!("{id}: echo hi\n"));
    assert_eq!(text(&echoed.stderr), "note from stderr\n");
    for (command, code) in [("fail", 3), ("kill", 137), ("slow", 124), ("refuse", 1)] {
        let ran = server.cca(&["exec", &id, "--", command]);
        assert_eq!(
            ran.status.code(),
            Some(code),
            "{command}: {}",
            text(&ran.stderr)
        );
    }
    let refused = server.cca(&["exec", &id, "--", "refuse"]);
    assert!(text(&refused.stderr).contains("is not running"));
    drop(runtime);
}
