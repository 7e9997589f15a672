//! Lifecycle automation end to end through `cca dev` (its agent runs
//! processes) and the CLI.
//!
//! Rollouts: a version whose instances crash loop is rolled back by itself
//! (rollback_after's default, 3) within 30 s of the third failure, and the
//! previous version serves again within 60 s of the decision; `cca rollout
//! status` fails saying so, `why`, `history` and `describe` show the
//! signals. Then `undo` returns to the previous version, and `pause` holds
//! a new apply until `resume`.
//!
//! Autoscaling: a service whose instances burn their whole CPU request
//! against a 50% target grows to its `max` from the agent's usage reports;
//! `cca scale` is refused for it and `cca scale why` shows the signals.
//!
//! Vertical autoscaling: a busy service with `mode = "auto"` gets a
//! recommendation from its usage and its running instance is resized to
//! it in place: same process, new reservation and limits.
//!
//! Init probes: an instance whose init step probes a connection nothing
//! answers on waits, `cca describe instance` saying for what, and starts
//! once something listens there.

mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use support::dev::Dev;
use support::{CCA, NO_TRUST, text};

/// Service `web` whose instances print `version` and run; `crash` makes
/// them exit at once instead.
fn program(version: &str, crash: bool) -> String {
    let run = if crash {
        format!("echo {version}; exit 3")
    } else {
        format!("echo {version}; exec sleep 1000")
    };
    format!("service web {{\n  run = \"{run}\"\n  replicas = 3\n}}\n")
}

/// A service whose instances each burn a whole core, held to their 100m
/// request, autoscaled 1..3 on a 50% CPU target.
const BUSY: &str = r#"
service busy {
  run = "exec perl -e '1 while 1'"
  resources {
    cpu = 100m
    memory = 64Mi
  }
  autoscale {
    min = 1
    max = 3
    cpu = 50%
  }
}
"#;

const SIZED: &str = r#"
service sized {
  run = "exec perl -e '1 while 1'"
  resources {
    cpu = 100m
    memory = 64Mi
  }
  autoscale {
    vertical {
      min_cpu = 50m
      max_cpu = 500m
      min_memory = 64Mi
      mode = "auto"
    }
  }
}
"#;

/// `cca dev` in `dir` serving `file` (written with `text`), with
/// `extra` flags before it.
fn dev_serving(dir: &Path, file: &str, text: &str, extra: &[&str]) -> Dev {
    std::fs::write(dir.join(file), text).expect("writes the program");
    let mut args = vec!["--data-dir", "data", "--insecure"];
    args.extend_from_slice(extra);
    args.push(file);
    Dev::start(dir, &args)
}

struct Cli<'a> {
    dir: &'a Path,
    url: String,
}

impl Cli<'_> {
    fn run(&self, args: &[&str]) -> Output {
        Command::new(CCA)
            .args(args)
            .current_dir(self.dir)
            .env("CCA_SERVER", &self.url)
            .env("CCA_CONFIG_DIR", NO_TRUST)
            .env_remove("CCA_TOKEN")
            .output()
            .expect("cca runs")
    }

    fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(output.status.success(), "cca {args:?}: {}", text(&output));
        text(&output)
    }

    fn apply(&self, version: &str, crash: bool) {
        let file = self.dir.join(format!("{version}.cca"));
        std::fs::write(&file, program(version, crash)).expect("writes the program");
        self.ok(&["apply", file.to_str().expect("utf-8")]);
    }

    /// `rollout status --no-wait -o json`.
    fn status(&self) -> serde_json::Value {
        self.json(&["rollout", "status", "web", "--no-wait", "-o", "json"])
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let output = self.run(args);
        assert!(output.status.success(), "{}", text(&output));
        serde_json::from_slice(&output.stdout).expect("json")
    }

    /// Polls the status until `done` holds, for at most `within`.
    fn until(
        &self,
        within: Duration,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + within;
        loop {
            let status = self.status();
            if done(&status) {
                return status;
            }
            assert!(Instant::now() < deadline, "never reached: {status:#}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn millis(value: &serde_json::Value) -> i64 {
    let text = value.as_str().expect("an RFC 3339 time");
    let at = humantime::parse_rfc3339(text).expect("parses");
    let since = at
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    i64::try_from(since.as_millis()).expect("fits")
}

fn now() -> i64 {
    let since = std::time::SystemTime::UNIX_EPOCH
        .elapsed()
        .expect("after 1970");
    i64::try_from(since.as_millis()).expect("fits")
}

/// Every instance runs the placed version and is ready.
fn settled(status: &serde_json::Value) -> bool {
    let progress = &status["progress"];
    progress["ready"] == 3 && progress["old"] == 0 && progress["updated"] == 3
}

#[test]
fn a_crash_looping_version_is_rolled_back_by_itself_and_undo_and_pause_act() {
    let dir = tempfile::tempdir().expect("temp dir");
    let dev = dev_serving(dir.path(), "web.cca", &program("v1", false), &[]);
    let cli = Cli {
        dir: dir.path(),
        url: dev.api_url().0,
    };
    let first = cli.until(Duration::from_secs(60), |s| {
        s["rollout"]["phase"] == "complete" && settled(s)
    });
    let v1 = first["spec_version"].as_str().expect("hash").to_owned();

    cli.apply("v2", true);
    let followed = cli.run(&["rollout", "status", "web", "--timeout", "3m"]);
    assert!(!followed.status.success(), "a rollback fails the status");
    assert!(
        text(&followed).contains("was rolled back to"),
        "{}",
        text(&followed)
    );
    let back = cli.status();
    let rollout = &back["rollout"];
    assert_eq!(rollout["target"], v1.as_str(), "{back:#}");
    assert_eq!(rollout["cause"]["reason"], "rollback", "{back:#}");
    let decided_by = rollout["decided_by"].as_array().expect("failures");
    // rollback_after's default; a pass may see more than one fail at once.
    assert!(decided_by.len() >= 3, "{back:#}");
    let breach = millis(&decided_by[2]["at"]);
    let decided = millis(&rollout["started_at"]);
    assert!(
        decided - breach <= 30_000,
        "decided {} ms after the third failure",
        decided - breach
    );
    let serving = cli.until(Duration::from_secs(90), |s| {
        s["placing"] == v1.as_str() && settled(s)
    });
    let serving_after = now() - decided;
    assert!(
        serving_after <= 60_000,
        "v1 served again {serving_after} ms after the decision: {serving:#}"
    );

    let why = cli.ok(&["rollout", "why", "web"]);
    assert!(why.contains("automatic rollback: "), "{why}");
    assert!(why.contains("rollback_after = 3"), "{why}");
    for failure in decided_by {
        let id = failure["id"].as_str().expect("id");
        assert!(why.contains(id), "{why}");
    }
    assert!(
        why.contains("crash looping") || why.contains("failed"),
        "{why}"
    );
    let history = cli.ok(&["rollout", "history", "web"]);
    assert!(history.contains("rollback from"), "{history}");
    assert!(history.contains("rolled back"), "{history}");
    let described = cli.ok(&["describe", "service", "web"]);
    assert!(
        described
            .lines()
            .any(|line| line.starts_with("Rollout:") && line.contains("rolled back")),
        "{described}"
    );
    let events = cli.ok(&["events"]);
    assert!(events.contains("rolling back from version"), "{events}");

    // A good version, then undo: back to the one before it.
    cli.apply("v3", false);
    cli.ok(&["rollout", "status", "web", "--timeout", "2m"]);
    let undone = cli.ok(&["rollout", "undo", "web"]);
    assert!(
        undone.contains(&format!("rolling back to version {v1}")),
        "{undone}"
    );
    cli.ok(&["rollout", "status", "web", "--timeout", "2m"]);
    let status = cli.until(Duration::from_secs(60), settled);
    assert_eq!(status["placing"], v1.as_str(), "{status:#}");
    assert_eq!(status["rollout"]["cause"]["reason"], "undo", "{status:#}");

    // Paused, a new apply rolls nothing until resumed.
    cli.ok(&["rollout", "pause", "web"]);
    cli.apply("v4", false);
    std::thread::sleep(Duration::from_secs(3));
    let held = cli.status();
    assert_eq!(held["placing"], v1.as_str(), "{held:#}");
    assert!(settled(&held), "nothing stopped or started: {held:#}");
    let paused = cli.ok(&["rollout", "status", "web", "--no-wait"]);
    assert!(paused.contains("paused"), "{paused}");
    cli.ok(&["rollout", "resume", "web"]);
    cli.ok(&["rollout", "status", "web", "--timeout", "2m"]);
    let done = cli.until(Duration::from_secs(60), settled);
    assert_eq!(done["placing"], done["spec_version"], "{done:#}");
    assert_ne!(done["placing"], v1.as_str());
    dev.stop();
}

#[test]
fn a_busy_service_is_autoscaled_to_its_max_from_its_usage() {
    let dir = tempfile::tempdir().expect("temp dir");
    let dev = dev_serving(dir.path(), "busy.cca", BUSY, &["--usage-every", "1s"]);
    let cli = Cli {
        dir: dir.path(),
        url: dev.api_url().0,
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        let status = cli.json(&["scale", "why", "busy", "-o", "json"]);
        let ready = cli.json(&["rollout", "status", "busy", "--no-wait", "-o", "json"]);
        if status["replicas"] == 3 && ready["progress"]["ready"] == 3 {
            break status;
        }
        assert!(Instant::now() < deadline, "never scaled to 3: {status:#}");
        std::thread::sleep(Duration::from_millis(500));
    };
    let change = &status["autoscaled"]["last_change"];
    assert_eq!(change["to"], 3, "{status:#}");
    let signal = &change["signals"][0];
    assert_eq!(signal["metric"], "cpu", "{status:#}");
    assert!(
        signal["utilization"].as_u64().is_some_and(|u| u >= 60),
        "a busy instance near its whole request: {status:#}"
    );
    let refused = cli.run(&["scale", "busy", "5"]);
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("is autoscaled (min 1, max 3)"),
        "{}",
        text(&refused)
    );
    let why = cli.ok(&["scale", "why", "busy"]);
    assert!(
        why.contains("set by the autoscaler within min 1 .. max 3"),
        "{why}"
    );
    assert!(why.contains("cpu: "), "{why}");
    let described = cli.ok(&["describe", "service", "busy"]);
    assert!(
        described.contains("3 desired (autoscaled 1..3"),
        "{described}"
    );
    dev.stop();
}

/// The CFS quota of `pid`'s cgroup v1 `cpu` controller; `None` where
/// there is none to read (not root, another cgroup layout).
fn cpu_quota_us(pid: u64) -> Option<u64> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = cgroups.lines().find_map(|line| {
        let (_, rest) = line.split_once(':')?;
        let (controllers, path) = rest.split_once(':')?;
        controllers.split(',').any(|c| c == "cpu").then_some(path)
    })?;
    let file = format!("/sys/fs/cgroup/cpu{path}/cpu.cfs_quota_us");
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

#[test]
fn a_busy_service_with_vertical_auto_is_resized_in_place() {
    let dir = tempfile::tempdir().expect("temp dir");
    let flags = ["--usage-every", "1s", "--vertical-window", "12s"];
    let dev = dev_serving(dir.path(), "sized.cca", SIZED, &flags);
    let cli = Cli {
        dir: dir.path(),
        url: dev.api_url().0,
    };
    let instance = |cli: &Cli<'_>| {
        let rows = cli.json(&["get", "instances", "--running", "-o", "json"]);
        match rows[0]["id"].as_str() {
            Some(id) => cli.json(&["describe", "instance", id, "-o", "json"]),
            None => serde_json::Value::Null,
        }
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let (first_pid, described) = loop {
        let described = instance(&cli);
        if let Some(pid) = described["status"]["pid"].as_u64() {
            break (pid, described);
        }
        assert!(Instant::now() < deadline, "never ran: {described:#}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(described["placement"]["cpu"], 100, "{described:#}");
    let resized = loop {
        let described = instance(&cli);
        if described["placement"]["resized"].is_object() {
            break described;
        }
        let why = cli.json(&["scale", "why", "sized", "-o", "json"]);
        assert!(
            Instant::now() < deadline,
            "never resized: {described:#} {why:#}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let why = cli.json(&["scale", "why", "sized", "-o", "json"]);
    let applied = &why["vertical"]["applied"];
    assert_eq!(&resized["placement"]["resized"], applied, "{why:#}");
    let cpu = applied["cpu"].as_u64().expect("a cpu size");
    assert!((50..=500).contains(&cpu), "within the bounds: {why:#}");
    assert_ne!(
        cpu, 100,
        "a busy instance at its 100m limit is sized up: {why:#}"
    );
    assert_eq!(resized["placement"]["cpu"], cpu, "{resized:#}");
    // In place: the same process, its CPU cgroup's quota rewritten.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let described = instance(&cli);
        assert_eq!(
            described["status"]["pid"].as_u64(),
            Some(first_pid),
            "not restarted: {described:#}"
        );
        let quota = cpu_quota_us(first_pid);
        // As root on cgroup v1 (how scripts/test runs) the quota is read.
        let readable = std::path::Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists()
            && std::os::unix::fs::MetadataExt::uid(
                &std::fs::metadata("/proc/self").expect("/proc/self"),
            ) == 0;
        assert!(
            quota.is_some() || !readable,
            "no cpu cgroup for {first_pid}"
        );
        if quota.is_none_or(|quota| quota == cpu * 100) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "quota {quota:?}, not {}: {described:#}",
            cpu * 100
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let text = cli.ok(&["describe", "service", "sized"]);
    assert!(text.contains("mode auto: sized to"), "{text}");
    dev.stop();
}

#[test]
fn an_init_probe_holds_the_start_until_the_connection_answers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spare = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    let port = spare.local_addr().expect("address").port();
    drop(spare);
    let program = format!(
        "connection db {{\n  driver = \"postgres\"\n  host = \"127.0.0.1\"\n  port = {port}\n}}\n\
         service waits {{\n  run = \"exec sleep 1000\"\n  init ready {{\n    probe = db\n    timeout = 5m\n  }}\n}}\n"
    );
    let dev = dev_serving(dir.path(), "waits.cca", &program, &[]);
    let cli = Cli {
        dir: dir.path(),
        url: dev.api_url().0,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let id = loop {
        let rows = cli.json(&["get", "instances", "-o", "json"]);
        if let Some(id) = rows[0]["id"].as_str().filter(|_| rows[0]["placed"] == true) {
            let described = cli.ok(&["describe", "instance", id]);
            if described.contains("waiting for connection `db` (127.0.0.1:") {
                assert!(described.contains("starting"), "{described}");
                break id.to_owned();
            }
        }
        assert!(Instant::now() < deadline, "never waited for db: {rows:#}");
        std::thread::sleep(Duration::from_millis(300));
    };
    let _db = std::net::TcpListener::bind(("127.0.0.1", port)).expect("binds the port again");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = cli.json(&["get", "instances", "-o", "json"]);
        if rows[0]["id"] == id.as_str() && rows[0]["state"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "never started: {rows:#}");
        std::thread::sleep(Duration::from_millis(300));
    }
    dev.stop();
}
