//! What the binary's end-to-end tests share: a `cca server` child process
//! (an embedded store in a temp dir, or any flags), found by the address it
//! announces on stderr and killed when dropped, pass or fail; and running
//! `cca` commands against it.

#![allow(dead_code, reason = "each test file uses a different part")]

pub(crate) mod cluster;
pub(crate) mod dev;
pub(crate) mod tenants;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStderr, Command, Output, Stdio};

pub(crate) const CCA: &str = env!("CARGO_BIN_EXE_cca");

/// A config directory that holds no cluster CA: servers and clients of
/// tests that do not ask for one talk plain HTTP whatever the machine's
/// `/etc/ccattler` holds (an explicit `--config-dir` still wins).
pub(crate) const NO_TRUST: &str = "/nonexistent/cca-test-without-a-ca";

/// A running `cca server`; killed on drop.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) url: String,
    /// The config directory commands run with (its CA and local admin);
    /// `None`: [`NO_TRUST`].
    pub(crate) config: Option<std::path::PathBuf>,
    /// What the server logged on stderr after it said where it listens.
    pub(crate) log: std::sync::Arc<std::sync::Mutex<String>>,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// A server on a loopback port with an embedded store in a temp dir.
    pub(crate) fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = format!("embedded:{}", dir.path().join("store").display());
        let mut server = Self::start_with(["--store", &store, "--listen", "127.0.0.1:0"]);
        server._dir = Some(dir);
        server
    }

    /// `cca init` in `dir/config` (cluster `cluster`, server `s1`), then a
    /// server with that config directory on a loopback port over HTTPS,
    /// its store in `dir/store`. Returns the config directory too.
    pub(crate) fn start_with_ca(dir: &Path, cluster: &str) -> (Self, std::path::PathBuf) {
        let config = dir.join("config");
        let init = Command::new(CCA)
            .args(["init", "--cluster", cluster, "--server-name", "s1"])
            .env("CCA_CONFIG_DIR", &config)
            .env_remove("CCA_SERVER")
            .output()
            .expect("cca init runs");
        assert!(
            init.status.success(),
            "cca init: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        let store = format!("embedded:{}", dir.join("store").display());
        let mut server = Self::start_with([
            "--store",
            store.as_str(),
            "--listen",
            "127.0.0.1:0",
            "--config-dir",
            config.to_str().expect("utf-8 path"),
            "--dns-listen",
            "127.0.0.1:0",
        ]);
        assert!(server.url.starts_with("https://"), "{}", server.url);
        server.config = Some(config.clone());
        (server, config)
    }

    /// `cca server ARGS`, once it announces where it listens.
    pub(crate) fn start_with<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut child = Command::new(CCA)
            .arg("server")
            .args(args)
            .env("CCA_CONFIG_DIR", NO_TRUST)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cca server starts");
        let stderr = child.stderr.take().expect("stderr piped");
        let log = std::sync::Arc::default();
        let url = listen_url(BufReader::new(stderr), std::sync::Arc::clone(&log));
        Server {
            child,
            url,
            log,
            config: None,
            _dir: None,
        }
    }

    /// Runs `cca ARGS` against this server (as the local admin when it
    /// has a config directory).
    pub(crate) fn cca(&self, args: &[&str]) -> Output {
        let config = self
            .config
            .as_deref()
            .unwrap_or_else(|| Path::new(NO_TRUST));
        Command::new(CCA)
            .args(args)
            .env("CCA_SERVER", &self.url)
            .env("CCA_CONFIG_DIR", config)
            .output()
            .expect("cca runs")
    }

    /// Runs `cca ARGS` and returns stdout, asserting success.
    pub(crate) fn ok(&self, args: &[&str]) -> String {
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

/// A command's stdout, then its stderr.
pub(crate) fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Reads the server's stderr until it says where it listens, then keeps
/// draining it in the background into `log` (everything it logged, the
/// lines before the address included) so the server never blocks on a
/// full pipe.
fn listen_url(
    mut stderr: BufReader<ChildStderr>,
    log: std::sync::Arc<std::sync::Mutex<String>>,
) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        let read = stderr.read_line(&mut line).expect("reads stderr");
        assert!(read > 0, "cca server exited before listening");
        if let Some(url) = line.trim().strip_prefix("cca server listening on ") {
            let url = url.to_owned();
            std::thread::spawn(move || drain_into(stderr, &log));
            return url;
        }
        log.lock().expect("log lock").push_str(&line);
    }
}

/// Appends the lines of `from` to `log` until it ends.
fn drain_into(mut from: BufReader<ChildStderr>, log: &std::sync::Mutex<String>) {
    let mut line = String::new();
    while from.read_line(&mut line).is_ok_and(|read| read > 0) {
        log.lock().expect("log lock").push_str(&line);
        line.clear();
    }
}

/// A child process killed (and reaped) on drop.
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    pub(crate) fn pid(&self) -> i32 {
        i32::try_from(self.0.id()).expect("pid fits")
    }

    /// SIGTERM and wait (a graceful stop).
    pub(crate) fn terminate(mut self) {
        signal(self.pid(), "TERM");
        let _ = self.0.wait();
    }
}

pub(crate) fn signal(pid: i32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{name} {pid}");
}

/// Kills every process whose working directory is inside `dir` (the
/// workloads, which outlive their agents by design).
pub(crate) fn kill_processes_under(dir: &Path) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
        else {
            continue;
        };
        if std::fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(dir)) {
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .status();
        }
    }
}
