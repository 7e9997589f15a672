//! Node enrolment from the command line, as an operator does it: `cca
//! init`, `cca server --config-dir`, `cca token create`, then `cca agent
//! --join TOKEN` on each node. Three agents (processes with their own data
//! directories, on loopback) join and run over mTLS; each acts only as
//! itself (checked with `curl` and the node's own certificate); every bad
//! token — tampered, expired, used up, revoked, for another node, for
//! another cluster — is refused with a clear message, and the reason is in
//! the audit log. Every process started here is killed when the test
//! ends, pass or fail.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use cca_trust::identity::Identity;
use cca_trust::pki::{ClusterCa, Issue, Names};
use support::{CCA, Proc, Server, kill_processes_under, text};

/// A cluster with a CA: the server and the agents joined to it.
struct Cluster {
    dir: tempfile::TempDir,
    config: PathBuf,
    server: Option<Server>,
    agents: Vec<Proc>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.agents.clear();
        self.server = None;
        kill_processes_under(self.dir.path());
    }
}

impl Cluster {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (server, config) = Server::start_with_ca(dir.path(), "enrol");
        Cluster {
            dir,
            config,
            server: Some(server),
            agents: Vec::new(),
        }
    }

    fn url(&self) -> String {
        self.server.as_ref().expect("server").url.clone()
    }

    /// `cca ARGS` as the local admin.
    fn cca(&self, args: &[&str]) -> Output {
        self.server.as_ref().expect("server").cca(args)
    }

    fn ok(&self, args: &[&str]) -> String {
        self.server.as_ref().expect("server").ok(args)
    }

    fn token(&self, extra: &[&str]) -> String {
        let mut args = vec!["token", "create"];
        args.extend_from_slice(extra);
        self.ok(&args).trim().to_owned()
    }

    fn data_dir(&self, node: &str) -> PathBuf {
        self.dir.path().join(node)
    }

    /// `cca agent --join TOKEN` for `node`, in the background.
    fn start_agent(&mut self, node: &str, token: &str) {
        let child = Command::new(CCA)
            .args([
                "agent",
                "--server",
                &self.url(),
                "--node",
                node,
                "--join",
                token,
            ])
            .args(["--no-cluster-network", "--address", "127.0.0.1"])
            .args(["--listen", "127.0.0.1:0", "--cpu", "2", "--memory", "2Gi"])
            .arg("--data-dir")
            .arg(self.data_dir(node))
            .env("CCA_CONFIG_DIR", support::NO_TRUST)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(self.dir.path().join(format!("{node}.log")))
                    .expect("agent log"),
            )
            .spawn()
            .expect("cca agent starts");
        self.agents.push(Proc(child));
    }

    /// `cca join URL TOKEN` for `node`.
    fn join(&self, node: &str, token: &str) -> Output {
        Command::new(CCA)
            .args(["join", &self.url(), token, "--node", node])
            .arg("--data-dir")
            .arg(self.data_dir(node))
            .env("CCA_CONFIG_DIR", support::NO_TRUST)
            .output()
            .expect("cca join runs")
    }

    /// Polls `cca ARGS` until its output contains every one of `wanted`.
    fn eventually(&self, args: &[&str], wanted: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let shown = text(&self.cca(args));
            if wanted.iter().all(|w| shown.contains(w)) {
                return shown;
            }
            assert!(
                Instant::now() < deadline,
                "cca {args:?} never showed {wanted:?}; last:\n{shown}\nagent logs:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn logs(&self) -> String {
        ["n1", "n2", "n3"]
            .iter()
            .filter_map(|node| {
                std::fs::read_to_string(self.dir.path().join(format!("{node}.log"))).ok()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// curl as `node` (its certificate and key are one file) to `path`:
    /// (HTTP status, body).
    fn curl_as_node(&self, node: &str, method: &str, path: &str) -> (u16, String) {
        self.curl_with(&self.data_dir(node).join("tls/node.pem"), method, path)
    }

    /// curl presenting the certificate and key in `credentials` (one PEM file).
    fn curl_with(&self, credentials: &Path, method: &str, path: &str) -> (u16, String) {
        let output = Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}", "-X", method, "--cacert"])
            .arg(self.config.join("ca.pem"))
            .arg("--cert")
            .arg(credentials)
            .args(["-H", "content-type: application/json", "-d", "{}"])
            .arg(format!("{}{path}", self.url()))
            .output()
            .expect("curl runs");
        let shown = String::from_utf8_lossy(&output.stdout).into_owned();
        let (body, status) = shown.rsplit_once('\n').expect("status line");
        (status.trim().parse().expect("status"), body.to_owned())
    }
}

#[test]
fn three_nodes_join_with_tokens_and_each_acts_only_as_itself() {
    let mut cluster = Cluster::start();
    let token = cluster.token(&["--uses", "3", "--description", "rack 1"]);
    assert!(token.starts_with("K10"), "{token}");
    for node in ["n1", "n2", "n3"] {
        cluster.start_agent(node, &token);
    }
    let nodes = cluster.eventually(&["get", "nodes"], &["n1", "n2", "n3"]);
    assert_eq!(nodes.matches("ready").count(), 3, "{nodes}");
    let tokens = cluster.ok(&["token", "ls"]);
    assert!(
        tokens.contains("used up") && tokens.contains("rack 1"),
        "{tokens}"
    );
    assert!(
        !tokens.contains(token.rsplit('.').next().expect("secret")),
        "{tokens}"
    );

    // The key never left the node, and only the node may read it.
    let node_file = cluster.data_dir("n1").join("tls/node.pem");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&node_file)
            .expect("node.pem")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    // A node acts only as itself.
    let (status, _) = cluster.curl_as_node("n1", "POST", "/v1/agent/nodes/n1/heartbeat");
    assert_ne!(status, 403, "n1 may beat for itself");
    for path in [
        "/v1/agent/nodes/n2/heartbeat",
        "/v1/agent/nodes/n2/reports",
        "/v1/agent/nodes/n2/certificate",
    ] {
        let (status, body) = cluster.curl_as_node("n1", "POST", path);
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains("may act only as itself"), "{body}");
    }
    let (status, body) = cluster.curl_as_node("n1", "GET", "/v1/agent/nodes/n2/instances/x/files");
    assert_eq!(status, 403, "{body}");
    let (status, body) = cluster.curl_as_node("n1", "GET", "/v1/services");
    assert_eq!(status, 403, "{body}");

    // An expired certificate of n1, and one for n1 from another CA: the
    // handshake fails (curl gets no HTTP status at all).
    let read = |file: &str| std::fs::read_to_string(cluster.config.join(file)).expect("ca file");
    let ca = ClusterCa::load(&read("ca.pem"), &read("ca.key")).expect("the cluster CA");
    let two_days_ago = cca_model::clock::system_now() - Duration::from_secs(2 * 86_400);
    let n1 = Issue::new(Identity::Node("n1".into()), Names::none());
    let expired = ca.issue(&n1, two_days_ago).expect("issued");
    let stranger = ClusterCa::generate("other", two_days_ago, Duration::from_secs(86_400 * 30))
        .expect("another CA")
        .issue(&n1, cca_model::clock::system_now())
        .expect("issued");
    for (what, issued) in [("expired", expired), ("another CA's", stranger)] {
        let file = cluster.dir.path().join("forged.pem");
        std::fs::write(&file, format!("{}{}", issued.cert_pem, issued.key_pem)).expect("write");
        let (status, body) = cluster.curl_with(&file, "POST", "/v1/agent/nodes/n1/heartbeat");
        assert_eq!(status, 0, "an {what} certificate was served: {body}");
    }
    // The joins are in the audit log, with the token that admitted them.
    let audit = cluster.ok(&["audit"]);
    for node in ["n1", "n2", "n3"] {
        assert!(
            audit.contains(&format!("node `{node}` joined with token")),
            "{audit}"
        );
    }
}

#[test]
fn bad_join_tokens_are_refused_and_the_reason_is_audited() {
    let cluster = Cluster::start();
    let refused = |node: &str, token: &str| {
        let output = cluster.join(node, token);
        assert!(!output.status.success(), "{node} joined with a bad token");
        assert!(!cluster.data_dir(node).join("tls/node.pem").exists());
        text(&output)
    };
    let invalid = "invalid join token";

    // Tampered: one character of the secret changed.
    let good = cluster.token(&[]);
    let mut tampered = good.clone();
    let last = tampered.pop().expect("a character");
    tampered.push(if last == 'a' { 'b' } else { 'a' });
    assert!(refused("t1", &tampered).contains(invalid));

    // Used up: one use, then again.
    let once = cluster.token(&["--uses", "1"]);
    let first = cluster.join("u1", &once);
    assert!(first.status.success(), "{}", text(&first));
    assert!(refused("u2", &once).contains(invalid));

    // For another node.
    let pinned = cluster.token(&["--node", "p1"]);
    assert!(refused("p2", &pinned).contains(invalid));

    // Revoked.
    let revoked = cluster.token(&[]);
    let id = revoked
        .split("::")
        .nth(1)
        .and_then(|rest| rest.split('.').next())
        .expect("id");
    cluster.ok(&["token", "revoke", id]);
    assert!(refused("r1", &revoked).contains(invalid));

    // Expired.
    let brief = cluster.token(&["--ttl", "1s"]);
    std::thread::sleep(Duration::from_millis(1100));
    assert!(refused("e1", &brief).contains(invalid));

    // Another cluster's CA: refused by the node itself, before it sends
    // the secret.
    let (_, credentials) = good.split_once("::").expect("shape");
    let other_cluster = format!("K10{}::{credentials}", "ab".repeat(32));
    let shown = refused("o1", &other_cluster);
    assert!(
        shown.contains("not the cluster the join token is for"),
        "{shown}"
    );

    // Not a token at all.
    let shown = refused("x1", "K10nonsense");
    assert!(
        shown.contains("`::` after the fingerprint is missing"),
        "{shown}"
    );

    // Each refusal the server saw is audited with its reason; the one for
    // another cluster never reached it.
    let audit = cluster.eventually(
        &["audit", "--denied"],
        &[
            "wrong secret for join token",
            "is used up",
            "enrols node `p1` only, not `p2`",
            "is revoked",
            "expired at",
        ],
    );
    assert!(!audit.contains("node `o1`"), "{audit}");
    assert!(!audit.contains(&tampered), "secrets stay out of the log");
    assert!(audit.contains("401"), "{audit}");
}
