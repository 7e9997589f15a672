//! A cluster of real processes for end-to-end tests: one `cca server`
//! (embedded store under the cluster's temp dir, at [`Cluster::store_dir`])
//! and `cca agent`s, each a separate process with its own data directory
//! and loopback address, running host processes (no cluster network: the
//! host's network is not theirs to change). Registrations and heartbeats
//! travel the server's liveness listener, kept at its address across the
//! server's restarts. Everything it started, workloads included, is killed
//! when it drops.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cca_wire::Client;
use cca_wire::client::InstanceQuery;
use cca_wire::types::InstanceSummary;

use super::{CCA, Proc, kill_processes_under};

/// Everything the test started lives under one temp dir; on drop, every
/// process whose working directory is inside it (the workloads, which
/// outlive their agents by design) is killed too.
pub(crate) struct Cluster {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) server: Option<Proc>,
    pub(crate) url: String,
    /// Where agents send registrations and heartbeats.
    pub(crate) liveness_url: String,
    pub(crate) agents: BTreeMap<String, Proc>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_agent_logs();
        }
        self.agents.clear();
        self.server = None;
        kill_processes_under(self.dir.path());
    }
}

impl Cluster {
    /// The last lines of every agent's log, for a failing test's output.
    #[allow(
        clippy::print_stderr,
        reason = "a failed test shows what the agents said"
    )]
    fn print_agent_logs(&self) {
        for node in self.agents.keys() {
            let log = std::fs::read_to_string(self.dir.path().join(format!("{node}.log")))
                .unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            eprintln!("--- agent {node}, last lines:\n{}", tail.join("\n"));
        }
    }

    pub(crate) fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
            server: None,
            url: String::new(),
            liveness_url: String::new(),
            agents: BTreeMap::new(),
        }
    }

    pub(crate) fn start_server(&mut self) {
        let store = format!("embedded:{}", self.store_dir().display());
        let address = |url: &str| match url {
            "" => "127.0.0.1:0".to_owned(),
            url => url.trim_start_matches("http://").to_owned(),
        };
        let (listen, liveness) = (address(&self.url), address(&self.liveness_url));
        let mut child = Command::new(CCA)
            .args(["server", "--store", &store, "--listen", &listen])
            .args(["--liveness-listen", &liveness])
            .args([
                "--startup-grace",
                "0s",
                "--lost-grace",
                "2s",
                "--node-ttl",
                "2s",
                "--leader-ttl",
                "2s",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cca server starts");
        let stderr = child.stderr.take().expect("stderr");
        (self.url, self.liveness_url) = announced_urls(stderr);
        // For the diagnostics `eventually` prints when it gives up.
        // SAFETY-free: tests in this file run one at a time in their process.
        unsafe_free_set_server(&self.url);
        self.server = Some(Proc(child));
    }

    pub(crate) fn agent_dir(&self, node: &str) -> PathBuf {
        self.dir.path().join(node)
    }

    /// Where the server's embedded store lives (swap it while the server
    /// is stopped to play a lost or rewound store).
    pub(crate) fn store_dir(&self) -> PathBuf {
        self.dir.path().join("server")
    }

    /// Kills the server (SIGKILL: the embedded store is crash-safe).
    pub(crate) fn stop_server(&mut self) {
        self.server = None;
    }

    pub(crate) fn start_agent(&mut self, node: &str, address: &str) {
        self.start_agent_with(node, address, &[]);
    }

    /// An agent with `extra` flags besides the usual ones.
    pub(crate) fn start_agent_with(&mut self, node: &str, address: &str, extra: &[&str]) {
        let child = Command::new(CCA)
            .args([
                "agent",
                "--server",
                &self.url,
                "--liveness-server",
                &self.liveness_url,
                "--node",
                node,
                "--address",
                address,
                // Agents share this host: its network is not theirs to
                // change (the cluster network has tests in namespaces).
                "--no-cluster-network",
            ])
            .arg("--data-dir")
            .arg(self.agent_dir(node))
            .args([
                "--cpu",
                "4",
                "--memory",
                "4Gi",
                "--restart-backoff",
                "100ms",
                "--restart-threshold",
                "3",
            ])
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("CCA_TEST_AGENT_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(self.dir.path().join(format!("{node}.log")))
                    .expect("agent log"),
            )
            .spawn()
            .expect("cca agent starts");
        self.agents.insert(node.to_owned(), Proc(child));
    }

    /// Writes `program` as `name` in the cluster's dir and applies it.
    pub(crate) fn apply(&self, name: &str, program: &str) {
        let file = self.dir.path().join(name);
        std::fs::write(&file, program).expect("writes the program");
        self.cca(&["apply", file.to_str().expect("utf-8 path")]);
    }

    pub(crate) fn client(&self) -> Client {
        Client::new(&self.url)
    }

    pub(crate) fn cca(&self, args: &[&str]) -> String {
        let output = Command::new(CCA)
            .args(args)
            .env("CCA_SERVER", &self.url)
            .output()
            .expect("cca runs");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "cca {args:?}: {}{stdout}",
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    }
}

pub(crate) fn unsafe_free_set_server(url: &str) {
    let _ = SERVER_URL.set(url.to_owned());
}

static SERVER_URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Reads `cca server listening on http://ADDR` from stderr, then keeps
/// draining stderr so the server never blocks on a full pipe.
/// The API's and the liveness listener's URLs, as the server announces
/// them on stderr.
pub(crate) fn announced_urls(stderr: std::process::ChildStderr) -> (String, String) {
    let mut lines = BufReader::new(stderr).lines();
    let (mut api, mut liveness) = (None, None);
    while api.is_none() || liveness.is_none() {
        let line = lines
            .next()
            .expect("server announces its addresses")
            .expect("stderr line");
        if let Some(url) = line.strip_prefix("cca server listening on ") {
            api = Some(url.trim().to_owned());
        }
        if let Some(url) = line.strip_prefix("cca server serving registrations and heartbeats on ")
        {
            liveness = Some(url.trim().to_owned());
        }
    }
    std::thread::spawn(move || for _ in lines {});
    (api.unwrap_or_default(), liveness.unwrap_or_default())
}

pub(crate) async fn eventually<T>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if Instant::now() >= deadline {
            let server = SERVER_URL.get().cloned().unwrap_or_default();
            let listing = Command::new(CCA)
                .args(["get", "instances", "--all"])
                .env("CCA_SERVER", server)
                .output()
                .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
                .unwrap_or_default();
            panic!("timed out after {timeout:?} waiting for {what}; instances:\n{listing}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) async fn instances(client: &Client, service: &str) -> Vec<InstanceSummary> {
    let query = InstanceQuery {
        service: Some(service.to_owned()),
        ..InstanceQuery::default()
    };
    client.instances(&query).await.unwrap_or_default()
}

/// The running instances of `web` when exactly `count` exist and all run
/// and answer health checks.
pub(crate) async fn all_running(client: &Client, count: usize) -> Option<Vec<InstanceSummary>> {
    let web = instances(client, "web").await;
    let ready = web.len() == count
        && web
            .iter()
            .all(|i| i.state == "running" && i.healthy == Some(true) && !i.stopping);
    ready.then_some(web)
}

/// The pid and URL of an instance, from its reported status (`None`
/// while it has no process).
pub(crate) async fn running_at(client: &Client, id: &str) -> Option<(u32, String)> {
    let status = client.instance(id).await.ok()?.status?;
    let port = status.host_ports.get("http").copied()?;
    Some((status.pid?, format!("http://{}:{port}/", status.address?)))
}

pub(crate) async fn pid_and_url(client: &Client, id: &str) -> (u32, String) {
    running_at(client, id)
        .await
        .unwrap_or_else(|| panic!("{id} has no running process"))
}

/// The port of `http://ADDRESS:PORT/`.
pub(crate) fn url_port(url: &str) -> &str {
    url.trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap_or_default()
}

pub(crate) async fn answers(url: &str, id: &str) -> bool {
    let body = reqwest::get(url).await.ok().map(|response| response.text());
    match body {
        Some(text) => text
            .await
            .is_ok_and(|text| text.contains(&format!("instance: {id}"))),
        None => false,
    }
}

pub(crate) async fn assert_all_answer(client: &Client, web: &[InstanceSummary]) {
    for instance in web {
        let (_, url) = pid_and_url(client, &instance.id).await;
        assert!(
            answers(&url, &instance.id).await,
            "{} does not answer at {url}",
            instance.id
        );
    }
}
