//! End to end: the built `cca` binary runs `cca server` on a loopback port
//! with an embedded store in a temp dir, and the cluster commands talk to
//! it — apply, diff, get (tables and `-o json|yaml`), describe, scale,
//! status, events, delete, exit codes, completions. The server process is
//! killed when the test ends, pass or fail.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

const CCA: &str = env!("CARGO_BIN_EXE_cca");

const PROGRAM: &str = r#"
service hello {
  run = "sleep 1000"
  replicas = 3
  port http 8080
  tags {
    team = "web"
  }
}

service db {
  run = "sleep 1000"
  replicas = 1
}
"#;

/// A running `cca server`; killed on drop.
struct Server {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = format!("embedded:{}", dir.path().join("store").display());
        let mut child = Command::new(CCA)
            .args(["server", "--store", &store, "--listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cca server starts");
        let stderr = child.stderr.take().expect("stderr piped");
        let mut server = Server {
            child,
            url: String::new(),
            _dir: dir,
        };
        server.url = listen_url(BufReader::new(stderr));
        server
    }

    fn cca(&self, args: &[&str]) -> Output {
        Command::new(CCA)
            .args(args)
            .env("CCA_SERVER", &self.url)
            .output()
            .expect("cca runs")
    }

    /// Runs `cca ARGS` and returns stdout, asserting success.
    fn ok(&self, args: &[&str]) -> String {
        let output = self.cca(args);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "cca {args:?} failed: {}{stdout}",
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    }
}

/// Reads the server's stderr until it says where it listens, then keeps
/// draining it in the background so the server never blocks on a full pipe.
fn listen_url(mut stderr: BufReader<std::process::ChildStderr>) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        let read = stderr.read_line(&mut line).expect("reads stderr");
        assert!(read > 0, "cca server exited before listening");
        if let Some(url) = line.trim().strip_prefix("cca server listening on ") {
            let url = url.to_owned();
            std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
            return url;
        }
    }
}

fn write_program(dir: &Path) -> String {
    let path = dir.join("app.cca");
    std::fs::write(&path, PROGRAM).expect("writes program");
    path.display().to_string()
}

#[test]
fn cluster_commands_against_a_real_server() {
    let server = Server::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = write_program(dir.path());

    let diff = server.ok(&["diff", &file]);
    assert!(diff.contains("service/hello would be created"), "{diff}");
    let applied = server.ok(&["apply", &file]);
    assert!(applied.contains("service/hello created"), "{applied}");
    assert!(applied.contains("applied at revision"), "{applied}");
    let again = server.ok(&["apply", &file]);
    assert!(again.contains("nothing to apply"), "{again}");

    let table = server.ok(&["get", "services"]);
    let header = table.lines().next().unwrap_or_default();
    assert!(header.starts_with("NAME"), "{table}");
    assert!(header.trim_end().ends_with("AGE"), "{table}");
    assert!(table.contains("team=web"), "{table}");

    let json: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "services", "--tag", "team=web", "-o", "json"]))
            .expect("JSON");
    assert_eq!(json[0]["name"], "hello");
    assert_eq!(json.as_array().map(Vec::len), Some(1));
    let yaml = server.ok(&["get", "services", "-o", "yaml"]);
    assert!(yaml.contains("name: hello"), "{yaml}");
    let instances: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "instances", "--all", "-o", "json"]))
            .expect("JSON");
    assert_eq!(instances, serde_json::json!([]));

    let scaled = server.ok(&["scale", "hello", "5"]);
    assert!(scaled.contains("scaled from 3 to 5"), "{scaled}");
    let described = server.ok(&["describe", "service", "hello"]);
    assert!(described.contains("5 desired"), "{described}");
    let status = server.ok(&["status", "-o", "json"]);
    assert!(status.contains("\"services\": 2"), "{status}");
    let events = server.ok(&["events"]);
    assert!(events.contains("scaled from 3 to 5"), "{events}");

    let deleted = server.ok(&["delete", "service", "db"]);
    assert!(deleted.contains("service/db deleted"), "{deleted}");
    let missing = server.cca(&["describe", "service", "db"]);
    assert_eq!(missing.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("service `db` not found"), "{stderr}");
    let unknown_node = server.cca(&["drain", "nowhere"]);
    assert_eq!(unknown_node.status.code(), Some(1));
}

#[test]
fn usage_errors_exit_2_and_an_absent_server_exits_1() {
    let usage = Command::new(CCA)
        .args(["get", "everything"])
        .output()
        .expect("runs");
    assert_eq!(usage.status.code(), Some(2));
    let absent = Command::new(CCA)
        .args(["status", "--server", "http://127.0.0.1:1"])
        .output()
        .expect("runs");
    assert_eq!(absent.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&absent.stderr);
    assert!(stderr.contains("cannot reach the API server"), "{stderr}");
}

#[test]
fn completions_are_generated_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let output = Command::new(CCA)
            .args(["completions", shell])
            .output()
            .expect("runs");
        assert!(output.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&output.stdout);
        assert!(script.contains("describe"), "{shell}: {script}");
    }
}
