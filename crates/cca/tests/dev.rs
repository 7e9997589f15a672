//! `cca dev` as a process: it starts its own agent and applies the files
//! once that agent's node is ready, so its start logs no "no nodes are
//! registered" warning; SIGTERM stops its instances and the process. It
//! serves HTTPS with a CA of its own in `DATA/trust`, which the CLI finds
//! from the directory `cca dev` ran in, and which a restart reuses; its
//! agent serves logs over mTLS; `--insecure` serves plain HTTP.

mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use support::dev::Dev;
use support::{CCA, NO_TRUST, text};

const PROGRAM: &str =
    "service hello {\n  run = \"echo dev-hello; exec sleep 1000\"\n  replicas = 2\n}\n";

/// `cca ARGS` in `dir` against `url`, with `config` as CCA_CONFIG_DIR
/// (`None`: unset, so the CLI picks the config directory itself).
fn cca(dir: &Path, url: &str, config: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(CCA);
    command.args(args).current_dir(dir).env("CCA_SERVER", url);
    match config {
        Some(config) => command.env("CCA_CONFIG_DIR", config),
        None => command.env_remove("CCA_CONFIG_DIR"),
    };
    command
        .env_remove("CCA_TOKEN")
        .env("HOME", dir)
        .output()
        .expect("cca runs")
}

/// Polls `cca ARGS` (config directory picked by the CLI) until it
/// succeeds showing `wanted`.
fn eventually(dir: &Path, url: &str, args: &[&str], wanted: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let output = cca(dir, url, None, args);
        let shown = text(&output);
        if output.status.success() && shown.contains(wanted) {
            return shown;
        }
        assert!(
            Instant::now() < deadline,
            "cca {args:?} never showed {wanted:?}; last:\n{shown}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn dev_starts_without_warning_that_no_nodes_are_registered() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("app.cca"), PROGRAM).expect("writes the program");
    let dev = Dev::start(dir.path(), &["--data-dir", "data", "app.cca"]);
    // The status screen lists both instances running once they are placed
    // and started.
    let shown = dev.read_until(|_, shown| shown.matches(" running ").count() >= 2);
    assert!(
        shown.contains("cca dev: API on https://127.0.0.1:"),
        "{shown}"
    );
    assert!(
        shown.contains("its CA and admin certificate are in data/trust"),
        "{shown}"
    );
    let errors = dev.stop();
    assert!(
        !errors.contains("no nodes are registered"),
        "cca dev warned about its own start:\n{errors}"
    );
}

#[test]
fn the_cli_finds_the_dev_ca_and_a_restart_reuses_it() {
    if Path::new("/etc/ccattler/ca.pem").exists() {
        eprintln!("skipped: /etc/ccattler holds a CA, which the CLI prefers to cca dev's");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let here = dir.path();
    std::fs::write(here.join("app.cca"), PROGRAM).expect("writes the program");
    // The default data directory, `.cca-dev` in the current directory.
    let dev = Dev::start(here, &["app.cca"]);
    let (url, _) = dev.api_url();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let ca = here.join(".cca-dev/trust/ca.pem");
    let first_ca = std::fs::read_to_string(&ca).expect("the dev CA");

    // No --config-dir, no CCA_CONFIG_DIR: the CLI takes ./.cca-dev/trust
    // and talks HTTPS as its local admin. `logs` goes through the server
    // to the agent, which serves it over mTLS on its node certificate.
    eventually(here, &url, &["get", "nodes"], "ready");
    eventually(here, &url, &["logs", "hello"], "dev-hello");
    // An explicit config directory wins, even one without a CA.
    let explicit = cca(here, &url, Some(NO_TRUST), &["get", "nodes"]);
    assert!(!explicit.status.success(), "{}", text(&explicit));
    assert!(
        text(&explicit).contains("holds no cluster CA"),
        "{}",
        text(&explicit)
    );
    // Without a client certificate the API answers 401.
    let anonymous = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(&ca)
        .arg(format!("{url}/v1/nodes"))
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&anonymous.stdout), "401");
    dev.stop();

    // A second start reuses the CA rather than refusing or replacing it.
    let dev = Dev::start(here, &["app.cca"]);
    let (url, _) = dev.api_url();
    assert_eq!(std::fs::read_to_string(&ca).expect("the dev CA"), first_ca);
    eventually(here, &url, &["get", "nodes"], "ready");
    dev.stop();
}

#[test]
fn dev_insecure_serves_plain_http() {
    let dir = tempfile::tempdir().expect("temp dir");
    let dev = Dev::start(dir.path(), &["--data-dir", "data", "--insecure"]);
    let (url, shown) = dev.api_url();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert!(!shown.contains("CA"), "{shown}");
    let nodes = cca(dir.path(), &url, Some(NO_TRUST), &["get", "nodes"]);
    assert!(nodes.status.success(), "{}", text(&nodes));
    assert!(!dir.path().join("data/trust").exists());
    dev.stop();
}

const WHOAMI: &str = r#"
service hello {
  run = "exec cca whoami --port $PORT"
  port http 8080
  health {
    http "/"
    interval = 1s
    timeout = 500ms
  }
}
"#;

/// A listener on `127.0.0.1:PORT` (a free port the OS picks) answering
/// every request 200 with `not the service`: a process outside the
/// cluster whose answer a health check would take for the instance's.
/// It serves until the test process ends.
fn impostor() -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds a free port");
    let port = listener.local_addr().expect("its address").port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
            let _ = stream.read(&mut [0; 4096]);
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 16\r\nConnection: close\r\n\r\nnot the service\n",
            );
        }
    });
    port
}

/// `GET /` on `127.0.0.1:port`, the whole answer.
fn get(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connects");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("sets a timeout");
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .expect("sends");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

/// Something outside the cluster holds the first host port the scheduler
/// would hand out (and answers HTTP 200 there): the agent does not start
/// the instance on it, says why, the scheduler places it again on the next
/// port, and the service comes up healthy there, answering itself.
#[test]
fn a_service_comes_up_on_another_port_when_something_else_holds_the_first() {
    let held = impostor();
    let last = held.saturating_add(20);
    let range = format!("{held}-{last}");
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("app.cca"), WHOAMI).expect("writes the program");
    let dev = Dev::start(
        dir.path(),
        // The default data directory, where the CLI finds the dev CA.
        &["--host-ports", &range, "app.cca"],
    );
    let (url, _) = dev.api_url();
    let shown = dev.read_until(|line, _| line.contains(" running ") && line.ends_with("healthy"));
    let shown = format!(
        "{shown}{}",
        dev.read_until(|line, _| line.contains("hello/http"))
    );
    let port: u16 = shown
        .lines()
        .filter(|line| line.contains("hello/http"))
        .filter_map(|line| line.trim().strip_prefix("http://127.0.0.1:"))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .next_back()
        .unwrap_or_else(|| panic!("no URL of hello/http in:\n{shown}"));
    assert_ne!(port, held, "placed on the held port:\n{shown}");
    assert!((held..=last).contains(&port), "{port} outside {range}");
    let answer = get(port);
    assert!(answer.contains("service: hello"), "{answer}");
    assert!(
        get(held).contains("not the service"),
        "the impostor still holds its port"
    );
    let events = eventually(
        dir.path(),
        &url,
        &["events", "--subject", "instance/"],
        "by something outside the cluster",
    );
    assert!(
        events.contains(&format!("host port {held} is held on node")),
        "{events}"
    );
    dev.stop();
}

/// A service that keeps half a core busy (its CPU limit) and holds 48 MiB,
/// and one that idles (first by name).
const BUSY: &str = r#"
service anchor {
  run = "exec sleep 1000"
}
service busy {
  run = "exec perl -e '$held = \"x\" x (48 << 20); 1 while 1'"
  resources {
    cpu = 500m
    memory = 256Mi
  }
}
"#;

/// The agent's usage reports reach `cca top`: a busy instance's CPU
/// against its request and the memory it holds, and the node's.
#[test]
fn cca_top_shows_what_the_node_and_its_workloads_use() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("busy.cca"), BUSY).expect("writes the program");
    let dev = Dev::start(
        dir.path(),
        &[
            "--data-dir",
            "data",
            "--insecure",
            "--usage-every",
            "1s",
            "busy.cca",
        ],
    );
    let (url, _) = dev.api_url();
    let json = |args: &[&str]| -> serde_json::Value {
        let output = cca(dir.path(), &url, Some(NO_TRUST), args);
        assert!(output.status.success(), "cca {args:?}: {}", text(&output));
        serde_json::from_slice(&output.stdout).expect("json rows")
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let row = loop {
        let rows = json(&["top", "workloads", "-o", "json"]);
        let row = rows
            .as_array()
            .and_then(|rows| rows.iter().find(|row| row["service"] == "busy"))
            .cloned();
        if let Some(row) = row
            && row["usage"]["cpu_millis"]
                .as_u64()
                .is_some_and(|cpu| cpu > 200)
        {
            break row;
        }
        assert!(Instant::now() < deadline, "no busy usage reported: {rows}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(row["cpu_request"], 500, "{row}");
    let cpu = row["usage"]["cpu_millis"].as_u64().expect("cpu");
    assert!(cpu <= 650, "held to its 500m limit: {row}");
    let memory = row["usage"]["memory_bytes"].as_u64().expect("memory");
    assert!(
        (48 << 20..256 << 20).contains(&memory),
        "the 48 MiB it holds: {row}"
    );
    let table = cca(dir.path(), &url, Some(NO_TRUST), &["top", "workloads"]);
    let shown = text(&table);
    assert!(table.status.success(), "{shown}");
    assert!(shown.contains("busy") && shown.contains("500m"), "{shown}");
    let nodes = json(&["top", "nodes", "-o", "json"]);
    let node = &nodes[0];
    assert!(
        node["usage"]["cpu_millis"]
            .as_u64()
            .is_some_and(|cpu| cpu >= 200),
        "the node's use includes the busy instance: {node}"
    );
    assert_eq!(
        node["cpu_requested"], 600,
        "busy's 500m and anchor's default 100m: {node}"
    );
    let sorted = json(&["top", "workloads", "--sort", "cpu", "-o", "json"]);
    assert_eq!(sorted[0]["service"], "busy", "the busiest first: {sorted}");
    let by_name = json(&["top", "workloads", "-o", "json"]);
    assert_eq!(by_name[0]["service"], "anchor", "by name: {by_name}");
    let id = row["instance"].as_str().expect("instance id");
    let described = text(&cca(
        dir.path(),
        &url,
        Some(NO_TRUST),
        &["describe", "instance", id],
    ));
    let usage = described
        .lines()
        .find(|line| line.starts_with("Usage"))
        .unwrap_or_else(|| panic!("describe instance shows its usage:\n{described}"));
    assert!(
        usage.contains("of 500m") && usage.contains("of 256Mi"),
        "{usage}"
    );
    let service = text(&cca(
        dir.path(),
        &url,
        Some(NO_TRUST),
        &["describe", "service", "busy"],
    ));
    assert!(
        service.contains("Usage (each instance's last report):"),
        "{service}"
    );
    let node = node["node"].as_str().expect("node name");
    let described = text(&cca(
        dir.path(),
        &url,
        Some(NO_TRUST),
        &["describe", "node", node],
    ));
    assert!(
        described
            .lines()
            .any(|line| line.starts_with("Usage") && line.contains("cpu ")),
        "{described}"
    );
    let refused = cca(
        dir.path(),
        &url,
        Some(NO_TRUST),
        &["top", "nodes", "--tag", "a=b"],
    );
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("--tag selects workloads"),
        "{}",
        text(&refused)
    );
    dev.stop();
}
