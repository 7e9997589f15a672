//! Users, roles, tenants and user tokens end to end, as attacks see them:
//! a server with a CA, one joined agent running two tenants' services,
//! users of each tenant with tokens. Each tenant sees and touches only its
//! own services and instances (reads, changes, deletes, logs, exec, takeover
//! by apply, prune) and its own gates, connections, network policies and
//! secret declarations, a viewer only reads, and every forged, expired,
//! foreign-key, unsigned, revoked or orphaned token is refused with 401 or
//! 403 by the real clients (`cca`, `curl`). Every process started here is
//! killed when the test ends, pass or fail.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use cca_trust::jwt::{Claims, SigningKey, sign};
use support::{CCA, Proc, Server, kill_processes_under};

struct Cluster {
    dir: tempfile::TempDir,
    config: PathBuf,
    server: Option<Server>,
    agent: Option<Proc>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.agent = None;
        self.server = None;
        kill_processes_under(self.dir.path());
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

impl Cluster {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("config");
        let init = Command::new(CCA)
            .args(["init", "--cluster", "users", "--server-name", "s1"])
            .env("CCA_CONFIG_DIR", &config)
            .output()
            .expect("cca init");
        assert!(init.status.success(), "{}", text(&init));
        let store = format!("embedded:{}", dir.path().join("store").display());
        let key = dir.path().join("secret.key");
        let server = Server::start_with([
            "--store",
            store.as_str(),
            "--listen",
            "127.0.0.1:0",
            "--config-dir",
            config.to_str().expect("utf-8"),
            "--dns-listen",
            "127.0.0.1:0",
            "--secret-key-file",
            key.to_str().expect("utf-8"),
        ]);
        Cluster {
            dir,
            config,
            server: Some(server),
            agent: None,
        }
    }

    fn url(&self) -> String {
        self.server.as_ref().expect("server").url.clone()
    }

    /// `cca ARGS` as the local admin (`token` None) or with a user's token.
    fn cca(&self, token: Option<&str>, args: &[&str]) -> Output {
        let mut command = Command::new(CCA);
        command
            .args(args)
            .current_dir(self.dir.path())
            .env("CCA_CONFIG_DIR", &self.config)
            .env("CCA_SERVER", self.url())
            .env("CCA_CREDENTIALS", self.dir.path().join("credentials.json"))
            .env_remove("CCA_TOKEN");
        if let Some(token) = token {
            command.env("CCA_TOKEN", token);
        }
        command.output().expect("cca runs")
    }

    fn ok(&self, token: Option<&str>, args: &[&str]) -> String {
        let output = self.cca(token, args);
        assert!(output.status.success(), "cca {args:?}: {}", text(&output));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `cca ARGS` must fail, saying `says`.
    fn refused(&self, token: Option<&str>, args: &[&str], says: &str) -> String {
        let output = self.cca(token, args);
        let shown = text(&output);
        assert!(
            !output.status.success(),
            "cca {args:?} was allowed: {shown}"
        );
        assert!(
            shown.contains(says),
            "cca {args:?} said:\n{shown}\nnot: {says}"
        );
        shown
    }

    fn write(&self, name: &str, body: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, body).expect("write program");
        path
    }

    fn join_agent(&mut self) {
        let token = self.ok(None, &["token", "create", "--uses", "1"]);
        let child = Command::new(CCA)
            .args(["agent", "--server", &self.url(), "--node", "n1"])
            .args(["--join", token.trim(), "--no-cluster-network"])
            .args(["--address", "127.0.0.1", "--listen", "127.0.0.1:0"])
            .args(["--cpu", "4", "--memory", "4Gi"])
            .arg("--data-dir")
            .arg(self.dir.path().join("n1"))
            .current_dir(self.dir.path())
            .env("CCA_CONFIG_DIR", support::NO_TRUST)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join("n1.log")).expect("log"))
            .spawn()
            .expect("agent starts");
        self.agent = Some(Proc(child));
    }

    fn eventually(&self, token: Option<&str>, args: &[&str], wanted: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let shown = text(&self.cca(token, args));
            if wanted.iter().all(|w| shown.contains(w)) {
                return shown;
            }
            assert!(Instant::now() < deadline, "never {wanted:?} in:\n{shown}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// curl `GET /v1/services` with `Authorization: Bearer token`:
    /// (status, body).
    fn curl_bearer(&self, token: &str) -> (u16, String) {
        let output = Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}", "--cacert"])
            .arg(self.config.join("ca.pem"))
            .args(["-H", &format!("authorization: Bearer {token}")])
            .arg(format!("{}/v1/services", self.url()))
            .output()
            .expect("curl runs");
        let shown = String::from_utf8_lossy(&output.stdout).into_owned();
        let (body, status) = shown.rsplit_once('\n').expect("status");
        (status.trim().parse().expect("status"), body.to_owned())
    }
}

/// The id of the one instance of `service` in `cca get instances` output.
fn instance_of(listing: &str, service: &str) -> String {
    listing
        .lines()
        .find(|line| line.split_whitespace().nth(1) == Some(service))
        .and_then(|line| line.split_whitespace().next())
        .unwrap_or_else(|| panic!("no instance of {service} in:\n{listing}"))
        .to_owned()
}

fn program(service: &str) -> String {
    format!("service {service} {{\n  run = \"sleep 600\"\n  replicas = 1\n}}\n")
}

#[test]
fn tenants_see_and_touch_only_their_own_and_bad_tokens_are_refused() {
    let mut cluster = Cluster::start();
    cluster.ok(
        None,
        &[
            "user",
            "create",
            "alice",
            "--role",
            "developer",
            "--tenant",
            "a",
        ],
    );
    cluster.ok(
        None,
        &[
            "user",
            "create",
            "bob",
            "--role",
            "developer",
            "--tenant",
            "b",
        ],
    );
    cluster.ok(None, &["user", "create", "vic", "--role", "viewer"]);
    let token = |user: &str| cluster.ok(None, &["user", "token", user]).trim().to_owned();
    let (alice, bob, vic) = (token("alice"), token("bob"), token("vic"));
    let (alice, bob, vic) = (Some(alice.as_str()), Some(bob.as_str()), Some(vic.as_str()));
    cluster.join_agent();

    let web_a = cluster.write("a.cca", &program("web-a"));
    let web_b = cluster.write("b.cca", &program("web-b"));
    cluster.ok(alice, &["apply", web_a.to_str().expect("utf-8")]);
    cluster.ok(bob, &["apply", web_b.to_str().expect("utf-8")]);
    let listing = cluster.eventually(None, &["get", "instances"], &["web-a", "web-b", "running"]);
    let (a_id, b_id) = (
        instance_of(&listing, "web-a"),
        instance_of(&listing, "web-b"),
    );
    cluster.eventually(None, &["get", "instances"], &["running"]);

    // Each tenant sees its own only; the viewer (cluster-wide) both.
    let seen = cluster.ok(alice, &["get", "services"]);
    assert!(seen.contains("web-a") && !seen.contains("web-b"), "{seen}");
    let seen = cluster.ok(bob, &["get", "instances"]);
    assert!(seen.contains("web-b") && !seen.contains("web-a"), "{seen}");
    let seen = cluster.ok(vic, &["get", "services"]);
    assert!(seen.contains("web-a") && seen.contains("web-b"), "{seen}");
    let events = cluster.ok(alice, &["events"]);
    assert!(
        !events.contains("web-b") && !events.contains(&b_id),
        "{events}"
    );

    // Cross-tenant reads, writes, deletes, logs and exec: 403, and the
    // other tenant's name is never told.
    let other = "of another tenant";
    for args in [
        vec!["describe", "service", "web-b"],
        vec!["scale", "web-b", "3"],
        vec!["delete", "service", "web-b"],
        vec!["logs", &b_id],
        vec!["exec", &b_id, "--", "true"],
        vec!["describe", "instance", &b_id],
    ] {
        let shown = cluster.refused(alice, &args, "403");
        assert!(shown.contains(other) && !shown.contains("`b`"), "{shown}");
    }
    let own = cluster.cca(alice, &["exec", &a_id, "--", "true"]);
    assert!(
        own.status.success(),
        "alice execs in her own: {}",
        text(&own)
    );

    // Applying: no takeover, no applying for another tenant, and pruning
    // stays in the tenant.
    cluster.refused(
        alice,
        &["apply", web_b.to_str().expect("utf-8")],
        "belongs to another tenant",
    );
    cluster.refused(
        alice,
        &["apply", "--tenant", "b", web_a.to_str().expect("utf-8")],
        "only for it",
    );
    cluster.ok(alice, &["apply", "--prune", web_a.to_str().expect("utf-8")]);
    let seen = cluster.ok(None, &["get", "services"]);
    assert!(
        seen.contains("web-b"),
        "alice's prune kept bob's service: {seen}"
    );

    // Secret values are their setter's tenant's.
    let set = |token: Option<&str>, name: &str| {
        Command::new(CCA)
            .args(["secret", "set", name, "--from-file"])
            .arg(cluster.write("value", "hunter2"))
            .env("CCA_CONFIG_DIR", &cluster.config)
            .env("CCA_SERVER", cluster.url())
            .env("CCA_TOKEN", token.unwrap_or_default())
            .output()
            .expect("cca runs")
    };
    let made = set(alice, "db-a");
    assert!(made.status.success(), "{}", text(&made));
    let stolen = set(bob, "db-a");
    assert!(!stolen.status.success(), "bob replaced alice's secret");
    assert!(
        text(&stolen).contains("of another tenant"),
        "{}",
        text(&stolen)
    );
    let listed = cluster.ok(bob, &["secret", "ls"]);
    assert!(!listed.contains("db-a"), "{listed}");
    cluster.refused(bob, &["secret", "rm", "db-a"], "403");

    // The viewer reads and does nothing else.
    cluster.refused(
        vic,
        &["delete", "service", "web-a"],
        "may not delete service",
    );
    cluster.refused(
        vic,
        &["exec", &a_id, "--", "true"],
        "may not exec into instance",
    );
    // Nobody but an admin manages users and tokens.
    cluster.refused(
        bob,
        &["user", "create", "mallory", "--role", "admin"],
        "may not write user",
    );
    cluster.refused(bob, &["token", "create"], "may not write token");

    // Tokens: forged, expired, another key, unsigned, another cluster.
    let real = alice.expect("token");
    let parts: Vec<&str> = real.split('.').collect();
    let admin_payload = URL_SAFE_NO_PAD.encode(
        String::from_utf8(URL_SAFE_NO_PAD.decode(parts[1]).expect("payload"))
            .expect("json")
            .replace("\"alice\"", "\"admin\""),
    );
    let forged = format!("{}.{admin_payload}.{}", parts[0], parts[2]);
    let (status, body) = cluster.curl_bearer(&forged);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("does not verify"), "{body}");

    let key_pem = std::fs::read_to_string(cluster.config.join("token.key")).expect("token key");
    let key = SigningKey::from_pkcs8_pem(&key_pem).expect("key");
    let ca =
        cca_trust::pki::CertInfo::parse(std::fs::read(cluster.config.join("ca.pem")).expect("ca"))
            .expect("ca parses");
    let issuer = format!("cca:{}", ca.fingerprint);
    let long_ago = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let expired = sign(
        &key,
        &Claims::new(
            &issuer,
            "alice",
            "ccattler-api",
            long_ago,
            Duration::from_secs(60),
        ),
    );
    let (status, body) = cluster.curl_bearer(&expired);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("expired"), "{body}");

    let now = cca_model::clock::system_now();
    let stranger = SigningKey::generate().expect("key");
    let foreign = sign(
        &stranger,
        &Claims::new(
            &issuer,
            "alice",
            "ccattler-api",
            now,
            Duration::from_secs(600),
        ),
    );
    let (status, body) = cluster.curl_bearer(&foreign);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("not trusted here"), "{body}");

    let other_cluster = sign(
        &key,
        &Claims::new(
            "cca:0000",
            "alice",
            "ccattler-api",
            now,
            Duration::from_secs(600),
        ),
    );
    let (status, body) = cluster.curl_bearer(&other_cluster);
    assert_eq!(status, 401, "{body}");

    let unsigned = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
        parts[1]
    );
    let (status, body) = cluster.curl_bearer(&unsigned);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("unsigned"), "{body}");

    // Revoked by logging out; orphaned by removing the user.
    let login = cluster.ok(
        None,
        &[
            "login",
            "--token",
            real,
            "--ca-file",
            cluster.config.join("ca.pem").to_str().expect("utf-8"),
        ],
    );
    assert!(login.contains("as user:alice"), "{login}");
    let logout = cluster.cca(None, &["logout"]);
    assert!(text(&logout).contains("token revoked"), "{}", text(&logout));
    cluster.refused(alice, &["get", "services"], "revoked");
    cluster.ok(None, &["user", "rm", "vic"]);
    cluster.refused(vic, &["get", "services"], "is not a user of this cluster");

    // Every refusal is in the audit log; no token is.
    let audit = cluster.ok(None, &["audit", "--denied"]);
    assert!(
        audit.contains("user:alice") && audit.contains("403"),
        "{audit}"
    );
    assert!(!audit.contains(parts[2]), "no signature in the log");
}

/// Tenant a's program with one object of every kind around `web-a`; its
/// gate serves `host`.
fn program_of_a(host: &str) -> String {
    format!(
        r#"service web-a {{
  run = "sleep 600"
  port http 8080
  connection db-a
}}

secret pw-a

connection db-a {{
  driver = "postgresql"
  secret = pw-a
  host = "db.internal"
  port = 5432
}}

gate shop-a {{
  host "{host}"
  service web-a port http
}}

network net-a {{
  allow * -> web-a port 8080
  deny * -> web-a
}}
"#
    )
}

/// Tenant b's service `web-b`, with `more` after it.
fn program_of_b(more: &str) -> String {
    format!("service web-b {{\n  run = \"sleep 600\"\n  port http 8080\n}}\n{more}")
}

#[test]
fn tenants_own_their_gates_connections_network_policies_and_secret_declarations() {
    let cluster = Cluster::start();
    for (user, role, tenant) in [
        ("alice", "developer", "a"),
        ("bob", "developer", "b"),
        ("carol", "services-only", "a"),
    ] {
        if role == "services-only" {
            cluster.ok(
                None,
                &[
                    "role",
                    "create",
                    role,
                    "--allow",
                    "read:service",
                    "--allow",
                    "write:service",
                ],
            );
        }
        cluster.ok(
            None,
            &["user", "create", user, "--role", role, "--tenant", tenant],
        );
    }
    let token = |user: &str| cluster.ok(None, &["user", "token", user]).trim().to_owned();
    let (alice, bob, carol) = (token("alice"), token("bob"), token("carol"));
    let (alice, bob, carol) = (
        Some(alice.as_str()),
        Some(bob.as_str()),
        Some(carol.as_str()),
    );
    let path = |file: &PathBuf| file.to_str().expect("utf-8").to_owned();

    // Tenant a's user applies a gate, a connection, a network policy and a
    // secret declaration with their service.
    let of_a = path(&cluster.write("a.cca", &program_of_a("shop-a.example")));
    let applied = cluster.ok(alice, &["apply", &of_a]);
    for object in [
        "gate/shop-a",
        "connection/db-a",
        "network/policy/net-a",
        "secret-decl/pw-a",
    ] {
        assert!(applied.contains(&format!("{object} created")), "{applied}");
    }
    // A tenant's user whose roles grant services only may not add the rest.
    cluster.refused(carol, &["apply", &of_a], "may not write gate");

    // b does not see them: not among its secrets, not in a pruning diff.
    assert!(cluster.ok(alice, &["secret", "ls"]).contains("pw-a"));
    let listed = cluster.ok(bob, &["secret", "ls"]);
    assert!(!listed.contains("pw-a"), "{listed}");
    let of_b = path(&cluster.write("b.cca", &program_of_b("")));
    cluster.ok(bob, &["apply", &of_b]);
    let diff = cluster.ok(bob, &["diff", "--prune", &of_b]);
    assert!(
        !diff.contains("-a") && diff.contains("0 deleted"),
        "b's prune would touch a's: {diff}"
    );

    // b can neither change them nor route to a's service, nor claim a's
    // host, nor write a rule deciding every tenant's flows, nor set the
    // value of a's secret; no refusal names tenant a.
    let refusals = [
        (
            "gate shop-a {\n  host \"b.example\"\n  service web-b port http\n}\n",
            "gate `shop-a` exists and belongs to another tenant",
        ),
        (
            "connection db-a {\n  driver = \"postgresql\"\n  host = \"x\"\n  port = 1\n}\n",
            "connection `db-a` exists and belongs to another tenant",
        ),
        (
            "network net-a {\n  allow * -> web-b\n}\n",
            "network policy `net-a` exists and belongs to another tenant",
        ),
        (
            "secret pw-a\n",
            "secret `pw-a` exists and belongs to another tenant",
        ),
        (
            "gate mine {\n  host \"mine.example\"\n  service web-a port http\n}\n",
            "undefined service `web-a`",
        ),
        (
            "gate mine {\n  host \"shop-a.example\"\n  service web-b port http\n}\n",
            "host `shop-a.example` is already served by a gate of another tenant",
        ),
        (
            "network lockdown {\n  deny * -> *\n}\n",
            "would decide flows to other tenants' services",
        ),
    ];
    for (index, (more, says)) in refusals.into_iter().enumerate() {
        let file = path(&cluster.write(&format!("b{index}.cca"), &program_of_b(more)));
        let shown = cluster.refused(bob, &["apply", &file], says);
        assert!(!shown.contains("`a`"), "{shown}");
    }
    // Routing to a's service by defining it too is a takeover.
    let web_a = program_of_b(
        "service web-a {\n  run = \"true\"\n  port http 80\n}\n\
         gate mine {\n  host \"mine.example\"\n  service web-a port http\n}\n",
    );
    let web_a = path(&cluster.write("b-web-a.cca", &web_a));
    cluster.refused(
        bob,
        &["apply", &web_a],
        "service `web-a` exists and belongs to another tenant",
    );
    cluster.refused(bob, &["secret", "set", "pw-a", "--from-file", &of_b], "403");

    // b's pruning apply leaves a's objects; a's unchanged program finds
    // every one of them as it left them.
    cluster.ok(bob, &["apply", "--prune", &of_b]);
    let diff = cluster.ok(alice, &["diff", &of_a]);
    assert!(
        diff.contains("diff: 0 created, 0 changed, 0 deleted"),
        "{diff}"
    );

    // A cluster-wide user changes them for tenant a, and only for a.
    let moved = path(&cluster.write("a2.cca", &program_of_a("shop-a2.example")));
    cluster.refused(
        None,
        &["apply", &moved],
        "service `web-a` exists and belongs to another tenant (or is cluster-wide)",
    );
    let changed = cluster.ok(None, &["apply", "--tenant", "a", &moved]);
    assert!(changed.contains("gate/shop-a changed"), "{changed}");
    let diff = cluster.ok(alice, &["diff", &moved]);
    assert!(diff.contains("0 changed"), "a holds the change: {diff}");
    // A value it sets for a's declared secret is a's: alice may remove it.
    cluster.ok(None, &["secret", "set", "pw-a", "--from-file", &of_b]);
    cluster.ok(alice, &["secret", "rm", "pw-a"]);
    // The host a's gate left is free for b now.
    let freed =
        program_of_b("gate mine {\n  host \"shop-a.example\"\n  service web-b port http\n}\n");
    let freed = path(&cluster.write("b-freed.cca", &freed));
    cluster.ok(bob, &["apply", &freed]);

    // a's own prune deletes a's.
    let bare = path(&cluster.write(
        "a-bare.cca",
        "service web-a {\n  run = \"sleep 600\"\n  port http 8080\n}\n",
    ));
    let pruned = cluster.ok(alice, &["apply", "--prune", &bare]);
    for object in [
        "gate/shop-a",
        "connection/db-a",
        "network/policy/net-a",
        "secret-decl/pw-a",
    ] {
        assert!(pruned.contains(&format!("{object} deleted")), "{pruned}");
    }
    assert!(
        !pruned.contains("web-b") && !pruned.contains("mine"),
        "{pruned}"
    );
}

/// Serves `issuer`'s discovery document and JWKS on `listener` from a
/// thread of its own (it ends with the test process).
fn serve_issuer(listener: std::net::TcpListener, issuer: &cca_trust::jwt::testing::TestIssuer) {
    let discovery = issuer.discovery_document();
    let jwks = issuer.jwks_document();
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let app = axum::Router::new()
                .route(
                    "/.well-known/openid-configuration",
                    axum::routing::get(move || async move { discovery }),
                )
                .route(
                    cca_trust::jwt::testing::JWKS_PATH,
                    axum::routing::get(move || async move { jwks }),
                );
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let _ = axum::serve(listener, app).await;
        });
    });
}

#[test]
fn an_oidc_issuers_id_token_logs_a_user_in() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let issuer = cca_trust::jwt::testing::TestIssuer::new(url.clone());
    serve_issuer(listener, &issuer);

    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("config");
    let init = Command::new(CCA)
        .args(["init", "--cluster", "oidc"])
        .env("CCA_CONFIG_DIR", &config)
        .output()
        .expect("cca init");
    assert!(init.status.success(), "{}", text(&init));
    let store = format!("embedded:{}", dir.path().join("store").display());
    let server = Server::start_with([
        "--store",
        store.as_str(),
        "--listen",
        "127.0.0.1:0",
        "--config-dir",
        config.to_str().expect("utf-8"),
        "--dns-listen",
        "127.0.0.1:0",
        "--oidc-issuer",
        url.as_str(),
        "--oidc-audience",
        "cca-cli",
    ]);
    let cluster = Cluster {
        dir,
        config,
        server: Some(server),
        agent: None,
    };
    cluster.ok(None, &["user", "create", "carol-42", "--role", "viewer"]);
    let now = cca_model::clock::system_now();
    let ten_minutes = Duration::from_secs(600);
    let id_token = issuer.token("carol-42", "cca-cli", now, ten_minutes);
    let ca = cluster.config.join("ca.pem");
    let login = cluster.ok(
        None,
        &[
            "login",
            "--token",
            &id_token,
            "--ca-file",
            ca.to_str().expect("utf-8"),
        ],
    );
    assert!(login.contains("as user:carol-42"), "{login}");
    let who = cluster.ok(Some(&id_token), &["identity"]);
    assert!(
        who.contains("user:carol-42 (by oidc)") && who.contains("viewer"),
        "{who}"
    );
    cluster.ok(Some(&id_token), &["get", "services"]);
    cluster.refused(Some(&id_token), &["token", "create"], "may not write token");

    // For another client, or a subject with no user here: refused.
    let other_audience = issuer.token("carol-42", "another-app", now, ten_minutes);
    cluster.refused(Some(&other_audience), &["get", "services"], "audience");
    let stranger = issuer.token("dave", "cca-cli", now, ten_minutes);
    cluster.refused(
        Some(&stranger),
        &["get", "services"],
        "is not a user of this cluster",
    );
}
