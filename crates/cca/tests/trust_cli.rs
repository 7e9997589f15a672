//! The secure setup from the command line: `cca init` makes a config
//! directory, `cca server --config-dir` serves HTTPS from it after its
//! pre-flight checks, the CLI finds it and talks as the local admin, and
//! a caller without a client certificate is refused. Real clients:
//! `curl` and `openssl`.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use support::{CCA, Server};

fn cca(args: &[&str], config: &Path) -> Output {
    Command::new(CCA)
        .args(args)
        .env("CCA_CONFIG_DIR", config)
        .env_remove("CCA_SERVER")
        .output()
        .expect("cca runs")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn init(config: &Path) -> String {
    let output = cca(
        &["init", "--cluster", "test", "--server-name", "s1"],
        config,
    );
    assert!(output.status.success(), "cca init: {}", text(&output));
    text(&output)
}

fn serve(dir: &Path, config: &Path) -> Server {
    let store = format!("embedded:{}", dir.join("store").display());
    let config = config.display().to_string();
    Server::start_with([
        "--store",
        store.as_str(),
        "--listen",
        "127.0.0.1:0",
        "--config-dir",
        config.as_str(),
        "--dns-listen",
        "127.0.0.1:0",
    ])
}

#[test]
fn init_then_server_serves_https_and_the_cli_talks_as_the_admin() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("config");
    let printed = init(&config);
    assert!(printed.contains("CA fingerprint: sha256:"), "{printed}");
    assert!(printed.contains("cca server --config-dir"), "{printed}");
    let again = cca(&["init"], &config);
    assert!(!again.status.success());
    assert!(
        text(&again).contains("refusing to overwrite"),
        "{}",
        text(&again)
    );

    let server = serve(dir.path(), &config);
    assert!(server.url.starts_with("https://"), "{}", server.url);
    let address = server.url.trim_start_matches("https://").to_owned();

    // The CLI: CCA_CONFIG_DIR is enough (the default server turns https).
    let port = address.rsplit(':').next().expect("port");
    let status = cca(
        &["status", "--server", &format!("https://localhost:{port}")],
        &config,
    );
    assert!(status.status.success(), "cca status: {}", text(&status));

    // curl with the CA but no certificate: refused by the API, told why.
    let ca = config.join("ca.pem");
    let anonymous = Command::new("curl")
        .args(["-s", "--cacert"])
        .arg(&ca)
        .arg(format!("https://localhost:{port}/v1/services"))
        .output()
        .expect("curl runs");
    let body = String::from_utf8_lossy(&anonymous.stdout);
    assert!(body.contains("client certificate"), "{body}");
    // With the admin's certificate it reads.
    let admin = Command::new("curl")
        .args(["-s", "-f", "--cacert"])
        .arg(&ca)
        .arg("--cert")
        .arg(config.join("admin.pem"))
        .arg("--key")
        .arg(config.join("admin.key"))
        .arg(format!("https://localhost:{port}/v1/identity"))
        .output()
        .expect("curl runs");
    let body = String::from_utf8_lossy(&admin.stdout);
    assert!(body.contains(r#""kind":"user","name":"admin""#), "{body}");

    // The refusal is in the audit log, with where it came from.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let audit = loop {
        let audit = cca(
            &[
                "audit",
                "--denied",
                "--server",
                &format!("https://localhost:{port}"),
            ],
            &config,
        );
        let shown = text(&audit);
        if shown.contains("/v1/services") || std::time::Instant::now() > deadline {
            break audit;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let shown = text(&audit);
    assert!(audit.status.success(), "cca audit: {shown}");
    assert!(
        shown.contains("GET") && shown.contains("/v1/services") && shown.contains("401"),
        "{shown}"
    );

    // openssl sees the server's chain end at the cluster CA.
    let handshake = Command::new("openssl")
        .args(["s_client", "-connect", &address, "-CAfile"])
        .arg(&ca)
        .args(["-verify_return_error", "-showcerts"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl runs");
    let shown = text(&handshake);
    assert!(shown.contains("Verify return code: 0 (ok)"), "{shown}");
    assert!(shown.contains("cca cluster test CA"), "{shown}");
}

#[test]
fn a_server_refuses_to_start_on_keys_others_may_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("config");
    init(&config);
    let key = config.join("server.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let store = format!("embedded:{}", dir.path().join("store").display());
    let output = Command::new(CCA)
        .args(["server", "--store", &store, "--listen", "127.0.0.1:0"])
        .arg("--config-dir")
        .arg(&config)
        .output()
        .expect("cca server runs");
    assert!(!output.status.success());
    let said = text(&output);
    assert!(said.contains("chmod 600"), "{said}");
    assert!(said.contains("server.key"), "{said}");
}

#[test]
fn the_liveness_listener_serves_https_with_the_same_checks() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("config");
    init(&config);
    let store = format!("embedded:{}", dir.path().join("store").display());
    let mut child = Command::new(CCA)
        .args(["server", "--store", &store, "--listen", "127.0.0.1:0"])
        .args([
            "--liveness-listen",
            "127.0.0.1:0",
            "--dns-listen",
            "127.0.0.1:0",
        ])
        .arg("--config-dir")
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cca server starts");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut liveness = None;
    let mut line = String::new();
    while liveness.is_none() {
        line.clear();
        if stderr.read_line(&mut line).expect("reads stderr") == 0 {
            break;
        }
        liveness = line
            .trim()
            .strip_prefix("cca server serving registrations and heartbeats on ")
            .map(str::to_owned);
    }
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let liveness = liveness.expect("the liveness listener is announced");
    assert!(liveness.starts_with("https://"), "{liveness}");
    let curl = |with_admin: bool| {
        let mut command = Command::new("curl");
        command
            .args(["-s", "-X", "POST", "--cacert"])
            .arg(config.join("ca.pem"));
        if with_admin {
            command
                .arg("--cert")
                .arg(config.join("admin.pem"))
                .arg("--key")
                .arg(config.join("admin.key"));
        }
        let output = command
            .arg(format!("{liveness}/v1/agent/nodes/n1/heartbeat"))
            .output()
            .expect("curl runs");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let anonymous = curl(false);
    let admin = curl(true);
    let _ = child.kill();
    let _ = child.wait();
    assert!(anonymous.contains("client certificate"), "{anonymous}");
    assert!(admin.contains("agent routes are for nodes"), "{admin}");
}
