//! End to end: the built `cca` binary runs `cca server` on a loopback port
//! with an embedded store in a temp dir, and the cluster commands talk to
//! it — apply (with a compiler warning), diff, get (tables and `-o json|yaml`), describe, scale,
//! history, status, events, delete, exit codes, completions. The server process is
//! killed when the test ends, pass or fail.

mod support;

use std::path::Path;
use std::process::Command;

use support::{CCA, Server};

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

const IDLE: &str = r#"
service idle {
  run = "sleep 1000"
  volume data "/data" 1Gi
}
"#;

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

    // A setting this version does not enforce warns, and is applied anyway.
    let idle = dir.path().join("idle.cca");
    std::fs::write(&idle, IDLE).expect("writes idle.cca");
    let applied_idle = server.cca(&["apply", &idle.display().to_string()]);
    assert_eq!(applied_idle.status.code(), Some(0));
    let warned = String::from_utf8_lossy(&applied_idle.stderr);
    assert!(warned.contains("cca::W008"), "{warned}");
    assert!(
        warned.contains("`volume size` is accepted but not enforced by this version"),
        "{warned}"
    );
    let stdout = String::from_utf8_lossy(&applied_idle.stdout);
    assert!(stdout.contains("service/idle created"), "{stdout}");
    server.ok(&["delete", "service", "idle"]);

    let table = server.ok(&["get", "services"]);
    let header = table.lines().next().unwrap_or_default();
    assert!(header.starts_with("NAME"), "{table}");
    assert!(header.trim_end().ends_with("AGE"), "{table}");
    assert!(table.contains("team=web"), "{table}");

    let json: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "services", "--tag", "team=web", "-o", "json"]))
            .expect("JSON");
    assert_eq!(json[0]["name"], "hello");
    // Times read as RFC 3339 in UTC (the API itself answers epoch millis).
    let created = json[0]["created_at"].as_str().unwrap_or_default();
    assert!(
        created.len() == 24 && created.as_bytes()[10] == b'T' && created.ends_with('Z'),
        "{json}"
    );
    assert_eq!(json.as_array().map(Vec::len), Some(1));
    let yaml = server.ok(&["get", "services", "-o", "yaml"]);
    assert!(yaml.contains("name: hello"), "{yaml}");
    assert!(yaml.contains(&format!("created_at: {created}")), "{yaml}");
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

    // One version per spec an apply wrote; scaling makes none.
    let history = server.ok(&["history", "service", "hello"]);
    let mut lines = history.lines();
    let header = lines.next().unwrap_or_default();
    assert!(header.starts_with("VERSION"), "{history}");
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 1, "{history}");
    assert!(
        rows[0].contains(" * "),
        "the current one is marked: {history}"
    );
    let versions: serde_json::Value =
        serde_json::from_str(&server.ok(&["history", "svc", "hello", "-o", "json"])).expect("JSON");
    assert_eq!(versions["service"], "hello");
    assert_eq!(versions["versions"][0]["current"], true);
    assert_eq!(versions["versions"][0]["spec"]["replicas"], 3);
    let no_history = server.cca(&["history", "service", "ghost"]);
    assert_eq!(no_history.status.code(), Some(1));

    let deleted = server.ok(&["delete", "service", "db"]);
    assert!(deleted.contains("service/db deleted"), "{deleted}");
    let missing = server.cca(&["describe", "service", "db"]);
    assert_eq!(missing.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("service `db` not found"), "{stderr}");
    let unknown_node = server.cca(&["drain", "nowhere"]);
    assert_eq!(unknown_node.status.code(), Some(1));
}

/// A node registered with what `/proc/meminfo` reports for a 23.5 GiB
/// machine (24683652 kB) shows it in binary units with one decimal, in the
/// table and the description alike.
#[test]
fn node_memory_reads_in_binary_units() {
    let server = Server::start();
    let register = Command::new("curl")
        .args([
            "-sS",
            "--fail-with-body",
            "-H",
            "content-type: application/json",
        ])
        .args([
            "--data",
            &format!(
                r#"{{"name":"n1","cpu":4000,"memory":{},"arch":"x86_64"}}"#,
                24_683_652u64 << 10
            ),
        ])
        .arg(format!("{}/v1/agent/register", server.url))
        .output()
        .expect("curl runs");
    assert!(
        register.status.success(),
        "{}",
        String::from_utf8_lossy(&register.stdout)
    );
    let table = server.ok(&["get", "nodes"]);
    assert!(table.contains("   0B/23.5Gi   "), "{table}");
    let described = server.ok(&["describe", "node", "n1"]);
    assert!(described.contains("0B of 23.5Gi allocated"), "{described}");
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
    for hint in [
        "`cca dev FILE`",
        "`cca server`",
        "--server URL",
        "CCA_SERVER=URL",
    ] {
        assert!(stderr.contains(hint), "{hint} missing in {stderr}");
    }
}

/// A missing file is named once with the OS's reason once, whichever
/// command reads it (the error's message carries its cause and is not also
/// its `source`, so the printed chain does not repeat it).
#[test]
fn a_missing_file_is_reported_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("x.cca");
    let missing = missing.to_str().expect("UTF-8 path");
    for command in ["apply", "diff", "lint", "fmt", "render"] {
        let output = Command::new(CCA)
            .args([command, missing])
            .env("CCA_SERVER", "http://127.0.0.1:1")
            .output()
            .expect("runs");
        assert!(!output.status.success(), "{command}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            stderr.matches("No such file or directory").count(),
            1,
            "{command}: {stderr}"
        );
        assert_eq!(stderr.matches(missing).count(), 1, "{command}: {stderr}");
    }
}

/// Every duration flag is parsed by clap: a bad value is a usage error
/// (exit 2) naming the flag and the accepted forms, before anything runs.
#[test]
fn a_bad_duration_is_a_usage_error_naming_the_flag() {
    for (args, flag) in [
        (&["server", "--node-ttl", "5"][..], "--node-ttl <DURATION>"),
        (&["events", "--since", "10x"][..], "--since <DURATION>"),
        (
            &["agent", "--restart-backoff", "soon"][..],
            "--restart-backoff <DURATION>",
        ),
        (
            &["benchmark", "--start-latency", "uniform:5ms"][..],
            "--start-latency <START_LATENCY>",
        ),
        (
            &["server", "--resume-replacement-after", "soon"][..],
            "--resume-replacement-after <DURATION|never>",
        ),
    ] {
        let output = Command::new(CCA).args(args).output().expect("runs");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("for '{flag}'")),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains("500ms"), "{args:?}: {stderr}");
    }
}

/// The pause's share is a percentage of the nodes: 0 or over 100 is a
/// usage error naming the flag, before anything runs.
#[test]
fn a_pause_share_out_of_range_is_a_usage_error() {
    for value in ["0", "101", "a third"] {
        let output = Command::new(CCA)
            .args(["server", "--pause-replacement-above", value])
            .output()
            .expect("runs");
        assert_eq!(output.status.code(), Some(2), "{value}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("--pause-replacement-above <PERCENT>"),
            "{value}: {stderr}"
        );
    }
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

/// Runs `cca ARGS`, which must fail with exit 1; its stderr.
fn refused(args: &[&str]) -> String {
    let output = Command::new(CCA)
        .args(args)
        .env("CCA_CONFIG_DIR", support::NO_TRUST)
        .output()
        .expect("cca runs");
    assert_eq!(output.status.code(), Some(1), "{args:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Without a cluster CA the API serves plain HTTP: `cca server` and `cca
/// dev` refuse an address other than loopback (before opening any store)
/// unless `--insecure`.
#[test]
fn listening_beyond_loopback_needs_insecure() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("store");
    let store_url = format!("embedded:{}", store.display());
    let stderr = refused(&["server", "--store", &store_url, "--listen", "0.0.0.0:0"]);
    assert!(
        stderr.starts_with("error: refusing to listen on 0.0.0.0:0: without a cluster CA"),
        "{stderr}"
    );
    assert!(stderr.contains("pass --insecure"), "{stderr}");
    assert!(!store.exists(), "nothing may be opened before the check");

    let stderr = refused(&[
        "server",
        "--store",
        &store_url,
        "--listen",
        "127.0.0.1:0",
        "--liveness-listen",
        "0.0.0.0:0",
    ]);
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0"),
        "the liveness listener too: {stderr}"
    );
    assert!(!store.exists(), "nothing may be opened before the check");

    let data_dir = dir.path().join("dev");
    let data_dir_text = data_dir.display().to_string();
    let stderr = refused(&["dev", "--listen", "0.0.0.0:0", "--data-dir", &data_dir_text]);
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0"),
        "{stderr}"
    );
    assert!(
        !data_dir.exists(),
        "nothing may be created before the check"
    );

    let server = Server::start_with(["--store", &store_url, "--listen", "0.0.0.0:0", "--insecure"]);
    assert!(server.url.starts_with("http://0.0.0.0:"), "{}", server.url);
    let status = server.ok(&["status"]);
    assert!(!status.is_empty());
}

/// `cca readiness` run with the flags a server or an agent would start
/// with: a store a running server holds and its port fail (exit 1); a node
/// pointed at that server passes, with the server and the clock checked;
/// a node without a certificate for an HTTPS server fails.
#[test]
fn readiness_checks_a_server_and_a_node_with_their_own_flags() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = format!("embedded:{}", dir.path().join("store").display());
    let server = Server::start_with(["--store", &store, "--listen", "127.0.0.1:0"]);
    let port = server.url.rsplit(':').next().expect("a port").to_owned();
    let readiness = |args: &[&str]| {
        let output = Command::new(CCA)
            .args(["readiness", "-o", "json"])
            .args(args)
            .env_remove("CCA_SERVER")
            .env_remove("CCA_STORE")
            .output()
            .expect("cca readiness runs");
        let checks: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("JSON checks");
        let verdict = |name: &str| {
            checks
                .as_array()
                .and_then(|checks| checks.iter().find(|check| check["name"] == name))
                .map(|check| (check["verdict"].clone(), check["detail"].clone()))
                .unwrap_or_default()
        };
        (
            output.status.code(),
            verdict("store"),
            verdict("API port"),
            verdict("server"),
            verdict("clock"),
            verdict("node certificate"),
        )
    };
    let none = dir.path().join("no-config");
    let listen = format!("127.0.0.1:{port}");
    let (code, store_check, port_check, ..) = readiness(&[
        "server",
        "--store",
        &store,
        "--listen",
        &listen,
        "--config-dir",
        none.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, Some(1));
    assert_eq!(store_check.0, "fail", "{store_check:?}");
    assert!(
        store_check
            .1
            .as_str()
            .is_some_and(|d| d.contains("already open in another process")),
        "{store_check:?}"
    );
    assert_eq!(port_check.0, "fail", "{port_check:?}");

    let agent_dir = dir.path().join("agent");
    let (code, _, _, server_check, clock, certificate) = readiness(&[
        "agent",
        "--server",
        &server.url,
        "--data-dir",
        agent_dir.to_str().expect("utf-8"),
        "--no-cluster-network",
    ]);
    assert_eq!(code, Some(0), "{server_check:?} {clock:?} {certificate:?}");
    assert_eq!(server_check.0, "pass", "{server_check:?}");
    assert_eq!(clock.0, "pass", "{clock:?}");
    assert!(!agent_dir.exists(), "a pre-flight creates nothing");

    let (code, _, _, _, _, certificate) = readiness(&[
        "agent",
        "--server",
        "https://127.0.0.1:9",
        "--data-dir",
        agent_dir.to_str().expect("utf-8"),
        "--no-cluster-network",
    ]);
    assert_eq!(code, Some(1));
    assert_eq!(certificate.0, "fail", "{certificate:?}");
    assert!(
        certificate
            .1
            .as_str()
            .is_some_and(|d| d.contains("--join TOKEN")),
        "{certificate:?}"
    );
}

/// `cca install` writes units that `systemd-analyze verify` accepts, with
/// the flags checked as the service would check them: a bad flag and a
/// join token are refused and nothing is written, a different unit is
/// replaced only with --force.
#[test]
fn install_writes_units_systemd_accepts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let units = dir.path().to_str().expect("utf-8").to_owned();
    let install = |role: &str, extra: &[&str], flags: &[&str]| {
        Command::new(CCA)
            .args(["install", role, "--unit-dir", &units])
            .args(extra)
            .arg("--")
            .args(flags)
            .output()
            .expect("cca install runs")
    };
    let server = install(
        "server",
        &[],
        &[
            "--store",
            "etcd://10.0.0.5:2379",
            "--listen",
            "0.0.0.0:9770",
            "--secret-key-file",
            "/etc/ccattler/secret key",
        ],
    );
    assert!(server.status.success(), "{}", support::text(&server));
    let agent = install(
        "agent",
        &[],
        &[
            "--server",
            "https://10.0.0.5:9770",
            "--data-dir",
            "/var/lib/cca",
            "--label",
            "disk=ssd",
        ],
    );
    assert!(agent.status.success(), "{}", support::text(&agent));
    for unit in ["cca-server.service", "cca-agent.service"] {
        let path = dir.path().join(unit);
        let verified = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&path)
            .output()
            .expect("systemd-analyze runs");
        let said = support::text(&verified);
        assert!(verified.status.success(), "{unit}: {said}");
        assert!(
            !said.contains(unit),
            "systemd-analyze warns about {unit}: {said}"
        );
    }
    let agent_unit = std::fs::read_to_string(dir.path().join("cca-agent.service")).expect("unit");
    assert!(agent_unit.contains("KillMode=process"), "{agent_unit}");
    let server_unit = std::fs::read_to_string(dir.path().join("cca-server.service")).expect("unit");
    assert!(
        server_unit.contains("--secret-key-file \"/etc/ccattler/secret key\""),
        "{server_unit}"
    );

    let bogus = install("agent", &[], &["--bogus"]);
    assert_eq!(bogus.status.code(), Some(1));
    assert!(
        support::text(&bogus).contains("would not start"),
        "{}",
        support::text(&bogus)
    );
    let token = install("agent", &[], &["--join", "secret"]);
    assert!(
        support::text(&token).contains("CCA_JOIN_TOKEN"),
        "{}",
        support::text(&token)
    );
    let other = install("agent", &[], &["--server", "https://10.0.0.6:9770"]);
    assert!(
        support::text(&other).contains("--force"),
        "{}",
        support::text(&other)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("cca-agent.service")).expect("unit"),
        agent_unit,
        "refused installs change nothing"
    );
    let forced = install(
        "agent",
        &["--force"],
        &["--server", "https://10.0.0.6:9770"],
    );
    assert!(forced.status.success(), "{}", support::text(&forced));
}
