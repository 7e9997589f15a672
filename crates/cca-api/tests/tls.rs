//! The API over HTTPS: the server presents its certificate, verifies
//! client certificates against the cluster CA alone, and tells each request
//! which identity its connection proved; clients trust the cluster CA
//! alone. Certificates are made here with rcgen, as `cca init` makes them.

mod support;

use std::sync::Arc;

use cca_api::{ServerCertificate, ServerTls, TlsListener};
use cca_trust::pki::CertAndKey;
use cca_wire::Client;
use cca_wire::tls::{ClientCertificate, ClientTls};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, SanType};
use support::harness;
use tokio::sync::oneshot;

struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

struct Issued {
    cert_pem: String,
    key_pem: String,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("key");
        Self {
            issuer: CertifiedIssuer::self_signed(params, key).expect("self-signed"),
        }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn issue(&self, hosts: &[&str], uri: Option<&str>) -> Issued {
        let hosts: Vec<String> = hosts.iter().map(|host| (*host).to_owned()).collect();
        let mut params = CertificateParams::new(hosts).expect("params");
        if let Some(uri) = uri {
            let uri = rcgen::string::Ia5String::try_from(uri.to_owned()).expect("ia5");
            params.subject_alt_names.push(SanType::URI(uri));
        }
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("signs");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// Serves the harness's API over TLS with `server` (chained to `ca`).
async fn serve_tls(
    h: &support::Harness,
    ca: &Ca,
    server: &Issued,
) -> (String, Arc<ServerCertificate>, oneshot::Sender<()>) {
    let chain = format!("{}{}", server.cert_pem, ca.pem());
    let served = serve_tls_pem(h, &ca.pem(), &chain, &server.key_pem).await;
    let certificate = Arc::clone(served.tls.certificate());
    (served.url, certificate, served.stop)
}

/// The harness's API served over TLS.
struct Served {
    url: String,
    port: u16,
    tls: ServerTls,
    stop: oneshot::Sender<()>,
}

/// Serves the harness's API over TLS with the certificate chain
/// `chain_pem` and its key, trusting client certificates of `ca_pem`.
async fn serve_tls_pem(
    h: &support::Harness,
    ca_pem: &str,
    chain_pem: &str,
    key_pem: &str,
) -> Served {
    let certificate =
        Arc::new(ServerCertificate::from_pem(chain_pem, key_pem).expect("server cert"));
    let tls = ServerTls::new(ca_pem, certificate).expect("tls");
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let port = tcp.local_addr().expect("address").port();
    let listener = TlsListener::new(tcp, &tls).expect("listener");
    let (stop, stopped) = oneshot::channel::<()>();
    let state = h.state.clone();
    tokio::spawn(async move {
        let _ = cca_api::serve(listener, state, async {
            let _ = stopped.await;
        })
        .await;
    });
    Served {
        url: format!("https://localhost:{port}"),
        port,
        tls,
        stop,
    }
}

fn client(url: &str, ca: &Ca, certificate: Option<&Issued>) -> Client {
    let mut tls = ClientTls::new(ca.pem());
    if let Some(issued) = certificate {
        let certificate =
            ClientCertificate::from_pem(&issued.cert_pem, &issued.key_pem).expect("client cert");
        tls = tls.with_certificate(Arc::new(certificate));
    }
    Client::with_tls(url, &tls).expect("client")
}

#[tokio::test]
async fn a_verified_client_certificate_names_the_caller() {
    let h = harness().await;
    let ca = Ca::new("cluster");
    let server = ca.issue(&["localhost", "127.0.0.1"], Some("cca://server/s1"));
    let (url, _, _stop) = serve_tls(&h, &ca, &server).await;

    let node = ca.issue(&[], Some("cca://node/n1"));
    let seen = client(&url, &ca, Some(&node))
        .identity()
        .await
        .expect("answers");
    let identity = seen.identity.expect("an identity");
    assert_eq!(
        (identity.kind.as_str(), identity.name.as_str()),
        ("node", "n1")
    );
    assert!(seen.address.starts_with("127.0.0.1:"), "{}", seen.address);

    let anonymous = client(&url, &ca, None).identity().await.expect("answers");
    assert_eq!(anonymous.identity, None, "no certificate, no identity");

    let unnamed = ca.issue(&[], None);
    let seen = client(&url, &ca, Some(&unnamed))
        .identity()
        .await
        .expect("answers");
    assert_eq!(seen.identity, None, "a certificate without an identity URI");
}

#[tokio::test]
async fn certificates_of_another_ca_are_refused_both_ways() {
    let h = harness().await;
    let ca = Ca::new("cluster");
    let other = Ca::new("elsewhere");
    let server = ca.issue(&["localhost"], Some("cca://server/s1"));
    let (url, _, _stop) = serve_tls(&h, &ca, &server).await;

    let error = client(&url, &other, None)
        .identity()
        .await
        .expect_err("the server's CA is not trusted");
    assert!(error.to_string().contains("cannot reach"), "{error}");

    let forged = other.issue(&[], Some("cca://node/n1"));
    let error = client(&url, &ca, Some(&forged))
        .identity()
        .await
        .expect_err("a node certificate from another CA");
    assert!(error.to_string().contains("cannot reach"), "{error}");
}

#[tokio::test]
async fn a_replaced_server_certificate_is_served_from_the_next_handshake() {
    let h = harness().await;
    let ca = Ca::new("cluster");
    let first = ca.issue(&["localhost"], Some("cca://server/s1"));
    let (url, certificate, _stop) = serve_tls(&h, &ca, &first).await;
    let before = client(&url, &ca, None);
    before.identity().await.expect("answers");

    // A certificate for another name only: clients asking for localhost
    // refuse it, which shows the server presents it.
    let renamed = ca.issue(&["elsewhere.example"], Some("cca://server/s1"));
    let chain = format!("{}{}", renamed.cert_pem, ca.pem());
    certificate
        .replace(&chain, &renamed.key_pem)
        .expect("replaced");
    let error = client(&url, &ca, None)
        .identity()
        .await
        .expect_err("the new certificate does not name localhost");
    assert!(error.to_string().contains("cannot reach"), "{error}");
    before.identity().await.expect("an open connection goes on");

    let error = certificate
        .replace(&first.cert_pem, &renamed.key_pem)
        .expect_err("a key of another certificate");
    assert!(error.to_string().contains("do not fit"), "{error}");
}

/// A server under certificate authentication and three callers: node
/// `n1`, user `admin`, and one without a certificate.
struct Guarded {
    _harness: support::Harness,
    _stop: oneshot::Sender<()>,
    n1: Client,
    admin: Client,
    nobody: Client,
}

impl Guarded {
    async fn serve(config: cca_api::ApiConfig) -> Self {
        let config = cca_api::ApiConfig {
            authentication: cca_api::auth::Authentication::Certificates,
            ..config
        };
        let h = support::harness_with(config).await;
        let ca = Ca::new("cluster");
        let server = ca.issue(&["localhost"], Some("cca://server/s1"));
        let (url, _, stop) = serve_tls(&h, &ca, &server).await;
        Self {
            n1: client(&url, &ca, Some(&ca.issue(&[], Some("cca://node/n1")))),
            admin: client(&url, &ca, Some(&ca.issue(&[], Some("cca://user/admin")))),
            nobody: client(&url, &ca, None),
            _harness: h,
            _stop: stop,
        }
    }
}

#[tokio::test]
async fn under_certificates_a_node_acts_only_as_itself_and_users_use_the_rest() {
    let config = cca_api::ApiConfig::default();
    let cluster = Guarded::serve(config).await;
    let (n1, admin, nobody) = (&cluster.n1, &cluster.admin, &cluster.nobody);

    let registered = n1
        .register(&support::node_request("n1"))
        .await
        .expect("n1 registers itself");
    n1.heartbeat("n1", registered.lease_id)
        .await
        .expect("and heartbeats");
    let error = n1
        .register(&support::node_request("n2"))
        .await
        .expect_err("n1 cannot register n2");
    assert_eq!(error.status(), Some(403));
    assert!(error.to_string().contains("only as itself"), "{error}");
    let error = n1
        .heartbeat("n2", registered.lease_id)
        .await
        .expect_err("nor heartbeat for it");
    assert_eq!(error.status(), Some(403));
    let error = n1
        .services(&[])
        .await
        .expect_err("nodes do not read services");
    assert_eq!(error.status(), Some(403));

    admin.services(&[]).await.expect("a user reads services");
    let error = admin
        .heartbeat("n1", registered.lease_id)
        .await
        .expect_err("users are not nodes");
    assert_eq!(error.status(), Some(403));

    let error = nobody.services(&[]).await.expect_err("no certificate");
    assert_eq!(error.status(), Some(401));
    assert!(error.to_string().contains("client certificate"), "{error}");
    let seen = nobody
        .identity()
        .await
        .expect("anyone may ask who they are");
    assert_eq!(seen.identity, None);
}

/// Polls the audit log until `done` holds for it (the writer commits in
/// the background).
async fn audit_until(
    client: &Client,
    done: impl Fn(&[cca_wire::types::AuditEntry]) -> bool,
) -> Vec<cca_wire::types::AuditEntry> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let entries = client
            .audit(&cca_wire::AuditQuery {
                limit: Some(1000),
                ..Default::default()
            })
            .await
            .expect("reads the audit log");
        if done(&entries) || tokio::time::Instant::now() > deadline {
            return entries;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn changes_and_refusals_are_audited_with_who_asked() {
    let config = cca_api::ApiConfig {
        retention_interval: std::time::Duration::from_millis(50),
        max_audit_records: 4,
        ..cca_api::ApiConfig::default()
    };
    let cluster = Guarded::serve(config).await;
    let (n1, admin, nobody) = (&cluster.n1, &cluster.admin, &cluster.nobody);

    let registered = n1
        .register(&support::node_request("n1"))
        .await
        .expect("registers");
    n1.heartbeat("n1", registered.lease_id)
        .await
        .expect("beats");
    let _ = n1.heartbeat("n2", registered.lease_id).await;
    admin.drain("n1").await.expect("an admin drains n1");
    let _ = nobody.services(&[]).await;

    let entries = audit_until(admin, |entries| entries.len() >= 3).await;
    let seen: Vec<(Option<&str>, &str, &str, u16)> = entries
        .iter()
        .map(|entry| {
            let record = &entry.record;
            (
                record.who.as_deref(),
                record.method.as_str(),
                record.path.as_str(),
                record.status,
            )
        })
        .collect();
    assert!(
        seen.contains(&(Some("node:n1"), "POST", "/v1/agent/nodes/n2/heartbeat", 403)),
        "{seen:?}"
    );
    assert!(
        seen.contains(&(Some("user:admin"), "POST", "/v1/nodes/n1/drain", 200)),
        "{seen:?}"
    );
    assert!(
        seen.contains(&(None, "GET", "/v1/services", 401)),
        "{seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|(_, _, path, _)| *path == "/v1/agent/register"
                || *path == "/v1/agent/nodes/n1/heartbeat"),
        "a node's own work is not audited: {seen:?}"
    );
    let denied = admin
        .audit(&cca_wire::AuditQuery {
            denied: true,
            who: Some("node:".into()),
            ..Default::default()
        })
        .await
        .expect("filters");
    assert_eq!(denied.len(), 1, "{denied:?}");

    // Retention keeps the newest 4.
    for _ in 0..6 {
        admin.drain("n1").await.expect("drains");
    }
    let kept = audit_until(admin, |entries| {
        entries.len() <= 4
            && entries
                .iter()
                .any(|e| e.record.path == "/v1/nodes/n1/drain")
    })
    .await;
    assert!(kept.len() <= 4, "{kept:?}");
}

/// Certificates of a [`ClusterCa`] made at fixed instants, the way the
/// cluster makes them, so that tests of revocation and rotation run on a
/// fake clock: "an hour later" is an argument, never a sleep. Every
/// validity brackets the test's real time, which rustls checks.
mod fixed {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use cca_trust::identity::Identity;
    use cca_trust::pki::{CertAndKey, CertInfo, ClusterCa, Issue, Names};

    const HOUR: Duration = Duration::from_secs(3600);
    /// Long enough to cover the wall clock of any run of these tests.
    const LIFE: Duration = Duration::from_secs(40 * 365 * 24 * 3600);

    /// 2025-06-15, the instant the test cluster's CA was made.
    pub(crate) fn at(hours: u32) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_750_000_000) + HOUR * hours
    }

    pub(crate) fn ca() -> ClusterCa {
        ClusterCa::generate("test", at(0), LIFE + HOUR * 24 * 365).expect("the CA")
    }

    /// A certificate for `identity` (`node:n1`) serving `hosts`, issued
    /// `hours` after the CA.
    pub(crate) fn issue(ca: &ClusterCa, identity: &str, hosts: &[&str], hours: u32) -> CertAndKey {
        let identity: Identity = identity.parse().expect("identity");
        let names = Names::from_hosts(hosts).expect("names");
        let request = Issue::new(identity, names).valid_for(LIFE);
        ca.issue(&request, at(hours)).expect("issues")
    }

    pub(crate) fn serial(issued: &CertAndKey) -> String {
        CertInfo::parse(&issued.cert_pem).expect("parses").serial
    }
}

fn client_of(url: &str, ca: &cca_trust::pki::ClusterCa, issued: &CertAndKey) -> Client {
    let certificate =
        ClientCertificate::from_pem(&issued.cert_pem, &issued.key_pem).expect("client cert");
    let tls = ClientTls::new(ca.cert_pem()).with_certificate(Arc::new(certificate));
    Client::with_tls(url, &tls).expect("client")
}

/// `openssl s_client` with `issued` as its certificate, asking for
/// `/v1/identity` over HTTP/1.1: what it printed, both streams.
async fn openssl_identity(
    port: u16,
    ca: &cca_trust::pki::ClusterCa,
    issued: &CertAndKey,
) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| dir.path().join(name);
    std::fs::write(path("ca.pem"), ca.cert_pem()).expect("writes");
    std::fs::write(path("cert.pem"), &issued.cert_pem).expect("writes");
    std::fs::write(path("key.pem"), &issued.key_pem).expect("writes");
    let mut child = tokio::process::Command::new("openssl")
        .arg("s_client")
        .args(["-connect", &format!("127.0.0.1:{port}")])
        .args(["-servername", "localhost", "-verify_return_error"])
        .arg("-CAfile")
        .arg(path("ca.pem"))
        .arg("-cert")
        .arg(path("cert.pem"))
        .arg("-key")
        .arg(path("key.pem"))
        .args(["-alpn", "http/1.1", "-ign_eof"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("openssl runs (scripts/test installs it)");
    let mut stdin = child.stdin.take().expect("stdin");
    tokio::io::AsyncWriteExt::write_all(
        &mut stdin,
        b"GET /v1/identity HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await
    .expect("writes the request");
    drop(stdin);
    let output = tokio::time::timeout(std::time::Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("openssl ends")
        .expect("openssl runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A handshake and a `GET /v1/identity` with rustls alone, presenting
/// `issued` over TLS `version`: the error, the alert among it, as text.
async fn rustls_request(
    port: u16,
    ca: &cca_trust::pki::ClusterCa,
    issued: &CertAndKey,
    version: &'static rustls::SupportedProtocolVersion,
) -> Result<(), String> {
    request_with(port, rustls_config(ca, issued, version)).await
}

/// A rustls client configuration presenting `issued` over TLS `version`;
/// it keeps the sessions it may resume, as any long-lived client does.
fn rustls_config(
    ca: &cca_trust::pki::ClusterCa,
    issued: &CertAndKey,
    version: &'static rustls::SupportedProtocolVersion,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der().clone()).expect("a root");
    let certificate =
        ClientCertificate::from_pem(&issued.cert_pem, &issued.key_pem).expect("client cert");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[version])
        .expect("versions")
        .with_root_certificates(roots)
        .with_client_cert_resolver(Arc::new(certificate));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// A handshake and a `GET /v1/identity` with `config`.
async fn request_with(port: u16, config: Arc<rustls::ClientConfig>) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let connector = tokio_rustls::TlsConnector::from(config);
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|error| error.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut stream = connector
        .connect(name, tcp)
        .await
        .map_err(|error| format!("handshake: {error}"))?;
    stream
        .write_all(b"GET /v1/identity HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|error| format!("writing: {error}"))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .map_err(|error| format!("reading: {error}"))?;
    let answer = String::from_utf8_lossy(&answer);
    if answer.starts_with("HTTP/1.1 200") {
        Ok(())
    } else {
        Err(format!("answered: {answer}"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_certificate_is_refused_from_the_next_handshake() {
    use cca_trust::identity::Identity;
    use cca_trust::revocation::{Revocations, RevokedEntry};

    let h = harness().await;
    let ca = fixed::ca();
    let server = fixed::issue(&ca, "server:s1", &["localhost"], 0);
    let chain = format!("{}{}", server.cert_pem, ca.cert_pem());
    let served = serve_tls_pem(&h, ca.cert_pem(), &chain, &server.key_pem).await;
    let n1 = fixed::issue(&ca, "node:n1", &[], 1);
    let n2 = fixed::issue(&ca, "node:n2", &[], 1);

    let open = client_of(&served.url, &ca, &n1);
    let seen = open.identity().await.expect("n1 connects");
    assert_eq!(seen.identity.expect("an identity").name, "n1");
    client_of(&served.url, &ca, &n2)
        .identity()
        .await
        .expect("n2 connects");

    // n1's key leaked: its certificate is revoked by serial.
    served
        .tls
        .revocations()
        .replace(Revocations::new([RevokedEntry::Serial {
            serial: fixed::serial(&n1).parse().expect("serial"),
            since: fixed::at(2),
        }]));
    let error = client_of(&served.url, &ca, &n1)
        .identity()
        .await
        .expect_err("the next handshake with n1's certificate");
    assert!(error.to_string().contains("cannot reach"), "{error}");
    // Under TLS 1.3 the server judges the client's certificate after the
    // client has finished its handshake, so reqwest sees the connection
    // close; rustls itself reads the alert, under 1.3 as under 1.2.
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let refused = rustls_request(served.port, &ca, &n1, version)
            .await
            .expect_err("refused");
        assert!(
            refused.contains("CertificateRevoked"),
            "{version:?}: a TLS alert saying the certificate is revoked: {refused}"
        );
        rustls_request(served.port, &ca, &n2, version)
            .await
            .expect("n2 is not revoked");
    }
    client_of(&served.url, &ca, &n2)
        .identity()
        .await
        .expect("another identity still connects");
    open.identity()
        .await
        .expect("a connection opened before the revocation goes on until it closes");

    let refused = openssl_identity(served.port, &ca, &n1).await;
    assert!(
        refused.contains("alert certificate revoked"),
        "openssl is told its certificate is revoked:\n{refused}"
    );
    assert!(!refused.contains("HTTP/1.1 200"), "{refused}");
    let answered = openssl_identity(served.port, &ca, &n2).await;
    assert!(
        answered.contains("HTTP/1.1 200") && answered.contains("\"n2\""),
        "openssl with n2's certificate gets an answer:\n{answered}"
    );

    // n2 is removed at hour 20 and added again at hour 21: every
    // certificate of it issued before hour 20 is refused, the new one
    // is not. The replaced list no longer revokes n1's serial.
    served
        .tls
        .revocations()
        .replace(Revocations::new([RevokedEntry::Identity {
            identity: Identity::Node("n2".into()),
            issued_before: fixed::at(20),
        }]));
    let renewed = fixed::issue(&ca, "node:n2", &[], 17);
    for before in [&n2, &renewed] {
        client_of(&served.url, &ca, before)
            .identity()
            .await
            .expect_err("issued before n2 was removed");
        let refused = rustls_request(served.port, &ca, before, &rustls::version::TLS13)
            .await
            .expect_err("refused");
        assert!(refused.contains("CertificateRevoked"), "{refused}");
    }
    let readded = fixed::issue(&ca, "node:n2", &[], 21);
    let seen = client_of(&served.url, &ca, &readded)
        .identity()
        .await
        .expect("n2's certificate issued after it was added again");
    assert_eq!(seen.identity.expect("an identity").name, "n2");
    client_of(&served.url, &ca, &n1)
        .identity()
        .await
        .expect("n1's serial is no longer revoked");
    let _ = served.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_session_does_not_outlive_a_revocation() {
    use cca_trust::revocation::{Revocations, RevokedEntry};

    let h = harness().await;
    let ca = fixed::ca();
    let server = fixed::issue(&ca, "server:s1", &["localhost"], 0);
    let chain = format!("{}{}", server.cert_pem, ca.cert_pem());
    let served = serve_tls_pem(&h, ca.cert_pem(), &chain, &server.key_pem).await;
    let n1 = fixed::issue(&ca, "node:n1", &[], 1);
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        served.tls.revocations().replace(Revocations::default());
        // One configuration for both connections: the second would
        // resume the first's session, whose certificate was checked then.
        let config = rustls_config(&ca, &n1, version);
        request_with(served.port, Arc::clone(&config))
            .await
            .expect("n1 connects");
        served
            .tls
            .revocations()
            .replace(Revocations::new([RevokedEntry::Serial {
                serial: fixed::serial(&n1).parse().expect("serial"),
                since: fixed::at(2),
            }]));
        let refused = request_with(served.port, config)
            .await
            .expect_err("no session outlives the revocation");
        assert!(
            refused.contains("CertificateRevoked"),
            "{version:?}: {refused}"
        );
    }
    let _ = served.stop.send(());
}
