//! The agent API over mTLS, from the command line: `cca init`, `cca
//! server --config-dir`, a token, and `cca agent --join` (real processes,
//! loopback). The agent serves its logs/exec API over HTTPS with its node
//! certificate to API servers alone: `curl` without a certificate, with
//! the node's own, or with the local admin's is refused at the handshake;
//! with the server's it is served. `cca logs` and `cca exec` go through
//! the server to the agent, and a plain-HTTP request to the agent's port
//! gets nothing. The agent follows the cluster's revocations: once the
//! server's certificate is revoked, the agent refuses it at the next
//! handshake. Every process started here is killed when the test ends,
//! pass or fail.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{CCA, Proc, Server, kill_processes_under, text};

const PROGRAM: &str = r#"
service hello {
  run = "echo hello-over-tls; exec sleep 1000"
  replicas = 1
}
"#;

/// The server, one joined agent, and their files; all killed on drop.
struct Cluster {
    dir: tempfile::TempDir,
    config: PathBuf,
    server: Option<Server>,
    agent: Option<Proc>,
    /// Where the agent's API listens.
    agent_port: u16,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.agent = None;
        self.server = None;
        kill_processes_under(self.dir.path());
    }
}

impl Cluster {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (server, config) = Server::start_with_ca(dir.path(), "agenttls");
        let mut cluster = Cluster {
            dir,
            config,
            server: Some(server),
            agent: None,
            agent_port: free_port(),
        };
        let token = cluster.ok(&["token", "create"]).trim().to_owned();
        cluster.start_agent("n1", &token);
        cluster
    }

    fn url(&self) -> String {
        self.server.as_ref().expect("server").url.clone()
    }

    fn node_dir(&self) -> PathBuf {
        self.dir.path().join("n1")
    }

    fn start_agent(&mut self, node: &str, token: &str) {
        let listen = format!("127.0.0.1:{}", self.agent_port);
        let child = Command::new(CCA)
            .args(["agent", "--server", &self.url(), "--node", node])
            .args(["--join", token])
            .args(["--no-cluster-network", "--address", "127.0.0.1"])
            .args(["--listen", &listen, "--cpu", "2", "--memory", "2Gi"])
            .args(["--revocation-refresh", "200ms"])
            .arg("--data-dir")
            .arg(self.node_dir())
            .env("CCA_CONFIG_DIR", support::NO_TRUST)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join("agent.log")).expect("agent log"))
            .spawn()
            .expect("cca agent starts");
        self.agent = Some(Proc(child));
    }

    /// `cca ARGS` as the local admin.
    fn cca(&self, args: &[&str]) -> Output {
        self.server.as_ref().expect("server").cca(args)
    }

    fn ok(&self, args: &[&str]) -> String {
        self.server.as_ref().expect("server").ok(args)
    }

    /// Polls `cca ARGS` until it succeeds with output containing `wanted`.
    fn eventually(&self, args: &[&str], wanted: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let output = self.cca(args);
            let shown = text(&output);
            if output.status.success() && shown.contains(wanted) {
                return shown;
            }
            assert!(
                Instant::now() < deadline,
                "cca {args:?} never showed {wanted:?}; last:\n{shown}\nagent log:\n{}",
                std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `curl` to the agent's API with `credentials` (curl's own flags):
    /// `Some(status)` when it answered, `None` when the connection failed.
    fn curl_agent(&self, scheme: &str, credentials: &[&Path]) -> Option<u16> {
        let mut curl = Command::new("curl");
        curl.args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .args(["--max-time", "10", "--cacert"])
            .arg(self.config.join("ca.pem"));
        for (flag, path) in ["--cert", "--key"].iter().zip(credentials) {
            curl.arg(flag).arg(path);
        }
        let output = curl
            .arg(format!(
                "{scheme}://127.0.0.1:{}/v1/instances/nothing/logs",
                self.agent_port
            ))
            .output()
            .expect("curl runs");
        let status = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        (output.status.success() && status != "000").then(|| status.parse().expect("a status"))
    }
}

/// Polls `probe` for up to 30 s until it gives `wanted`.
fn wait_for<T: PartialEq + std::fmt::Debug>(what: &str, wanted: T, mut probe: impl FnMut() -> T) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = probe();
        if found == wanted {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: still {found:?}, not {wanted:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A loopback port nothing listens on now (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

#[test]
fn the_agent_api_serves_the_api_server_alone_over_mtls() {
    let cluster = Cluster::start();
    cluster.eventually(&["get", "nodes"], "ready");
    let file = cluster.dir.path().join("app.cca");
    std::fs::write(&file, PROGRAM).expect("writes the program");
    cluster.ok(&["apply", file.to_str().expect("utf-8 path")]);
    let instances = cluster.eventually(&["get", "instances", "-o", "json"], "running");
    let rows: serde_json::Value = serde_json::from_str(&instances).expect("json");
    let id = rows[0]["id"].as_str().expect("an instance id").to_owned();

    // Through the API server, which calls the agent with its certificate.
    cluster.eventually(&["logs", &id], "hello-over-tls");
    let echoed = cluster.cca(&["exec", &id, "--", "echo", "via", "mtls"]);
    assert_eq!(echoed.status.code(), Some(0), "{}", text(&echoed));
    assert_eq!(String::from_utf8_lossy(&echoed.stdout), "via mtls\n");

    // Directly: only a server's certificate gets an answer (the agent's
    // 404 for an instance it does not have).
    let config = &cluster.config;
    let server = [config.join("server.pem"), config.join("server.key")];
    assert_eq!(
        cluster.curl_agent("https", &[&server[0], &server[1]]),
        Some(404)
    );
    let node = cluster.node_dir().join("tls/node.pem");
    let admin = [config.join("admin.pem"), config.join("admin.key")];
    for (who, credentials) in [
        ("no certificate", vec![]),
        ("the node's own certificate", vec![node.as_path()]),
        ("the local admin's certificate", vec![&admin[0], &admin[1]]),
    ] {
        assert_eq!(
            cluster.curl_agent("https", &credentials),
            None,
            "the agent answered a client with {who}"
        );
    }
    assert_eq!(
        cluster.curl_agent("http", &[]),
        None,
        "the agent answered plain HTTP"
    );
    let log = std::fs::read_to_string(cluster.dir.path().join("agent.log")).unwrap_or_default();
    assert!(
        log.contains("not an API server"),
        "the agent logs why it refused:\n{log}"
    );
}

#[test]
fn the_agent_refuses_a_certificate_the_cluster_revoked() {
    let cluster = Cluster::start();
    cluster.eventually(&["get", "nodes"], "ready");
    let config = &cluster.config;
    let server = [config.join("server.pem"), config.join("server.key")];
    let with_server_certificate = || cluster.curl_agent("https", &[&server[0], &server[1]]);
    wait_for(
        "the agent API with the server's certificate",
        Some(404),
        with_server_certificate,
    );

    let pem = std::fs::read(&server[0]).expect("server.pem");
    let serial = cca_trust::pki::CertInfo::parse(pem)
        .expect("the server's certificate")
        .serial;
    cluster.ok(&["cert", "revoke", "--serial", &serial, "--reason", "test"]);
    wait_for(
        "the agent API with the revoked server certificate",
        None,
        with_server_certificate,
    );
    let log = std::fs::read_to_string(cluster.dir.path().join("agent.log")).unwrap_or_default();
    assert!(
        log.contains("follows the cluster's revocations"),
        "the agent says it took the list:\n{log}"
    );
}
