//! `cca dev` as a process: it starts its own agent and applies the files
//! once that agent's node is ready, so its start logs no "no nodes are
//! registered" warning; SIGTERM stops its instances and the process. It
//! serves HTTPS with a CA of its own in `DATA/trust`, which the CLI finds
//! from the directory `cca dev` ran in, and which a restart reuses; its
//! agent serves logs over mTLS; `--insecure` serves plain HTTP.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::{CCA, NO_TRUST, text};

const PROGRAM: &str =
    "service hello {\n  run = \"echo dev-hello; exec sleep 1000\"\n  replicas = 2\n}\n";

/// `cca dev`, stopped with SIGTERM (so it stops its instances) when the
/// test ends, pass or fail; SIGKILL if it does not stop. Its stdout lines
/// arrive on `lines`; its stderr is collected by `errors`.
struct Dev {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    errors: Option<std::thread::JoinHandle<String>>,
}

impl Drop for Dev {
    fn drop(&mut self) {
        terminate(&mut self.child);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Dev {
    /// `cca dev ARGS` in `dir` with its cluster network off (the host's
    /// own network is not a test's to change), on a free loopback port.
    fn start(dir: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(CCA)
            .arg("dev")
            .args(["--listen", "127.0.0.1:0", "--no-cluster-network"])
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cca dev starts");
        let stdout = child.stdout.take().expect("stdout piped");
        let mut stderr = child.stderr.take().expect("stderr piped");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        // A second reader keeps stderr from filling up.
        let errors = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        Dev {
            child,
            lines,
            errors: Some(errors),
        }
    }

    /// Everything printed until a line for which `done` holds (within a
    /// minute), that line included.
    fn read_until(&self, done: impl Fn(&str, &str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut shown = String::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let Ok(line) = self.lines.recv_timeout(left) else {
                break;
            };
            shown.push_str(&line);
            shown.push('\n');
            if done(&line, &shown) {
                return shown;
            }
        }
        panic!("cca dev never printed what was awaited:\n{shown}");
    }

    /// The API's URL, from the line announcing it.
    fn api_url(&self) -> (String, String) {
        let shown = self.read_until(|line, _| line.starts_with("cca dev: API on "));
        let url = shown
            .lines()
            .find_map(|line| line.strip_prefix("cca dev: API on "))
            .and_then(|rest| rest.split(';').next())
            .expect("the API line")
            .to_owned();
        (url, shown)
    }

    /// Stops it with SIGTERM and returns its stderr.
    fn stop(mut self) -> String {
        terminate(&mut self.child);
        self.errors
            .take()
            .expect("stderr reader")
            .join()
            .expect("stderr reader")
    }
}

fn terminate(child: &mut std::process::Child) {
    if let Some(pid) = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

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
