//! The API over HTTPS: the server presents its certificate, verifies
//! client certificates against the cluster CA alone, refuses revoked ones
//! at the next handshake, and tells each request which identity its
//! connection proved; clients trust the cluster CA alone; certificates
//! rotate under open streams. Certificates are made here with rcgen, or
//! by the cluster's own `ClusterCa` at fixed instants (`fixed`).

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
        .expect_err("the connection opened before is closed, a new one refused");

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

/// The rotation test's server: what it knows of each connection.
#[derive(Clone, Debug)]
struct SeenConnection {
    number: u64,
    client_serial: String,
}

static CONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>>
    for SeenConnection
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        let (_, connection) = stream.io().tls().get_ref();
        let client_serial = connection
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| cca_trust::pki::CertInfo::parse(leaf.as_ref()).ok())
            .map_or_else(|| "-".to_owned(), |info| info.serial);
        Self {
            number: CONNECTIONS.fetch_add(1, std::sync::atomic::Ordering::SeqCst),
            client_serial,
        }
    }
}

/// The streams the rotation test's server sends: a 1 KiB line every
/// 5 ms until `stop`, then `END`, so a stream cut short is told from
/// one that ended.
struct Streaming {
    stop: tokio::sync::watch::Receiver<bool>,
    sent: std::sync::atomic::AtomicU64,
}

/// A stream's last line.
const END: &[u8] = b"END\n";

fn rotation_app(streaming: Arc<Streaming>) -> axum::Router {
    use axum::extract::{ConnectInfo, State};
    use axum::routing::get;

    async fn who(
        ConnectInfo(seen): ConnectInfo<SeenConnection>,
        version: axum::http::Version,
    ) -> String {
        format!("{} {} {version:?}", seen.number, seen.client_serial)
    }

    async fn stream(State(streaming): State<Arc<Streaming>>) -> axum::body::Body {
        let lines = futures_util::stream::unfold(0u64, move |line| {
            let streaming = Arc::clone(&streaming);
            async move {
                if line == u64::MAX {
                    return None;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                let (chunk, next) = if *streaming.stop.borrow() {
                    (bytes::Bytes::from_static(END), u64::MAX)
                } else {
                    let text = format!("{line:08} {}\n", "x".repeat(1014));
                    (bytes::Bytes::from(text), line + 1)
                };
                streaming
                    .sent
                    .fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::SeqCst);
                Some((Ok::<_, std::convert::Infallible>(chunk), next))
            }
        });
        axum::body::Body::from_stream(lines)
    }

    axum::Router::new()
        .route("/who", get(who))
        .route("/stream", get(stream))
        .with_state(streaming)
}

/// A reqwest client over cca-wire's TLS settings presenting `certificate`:
/// HTTP/2 (one connection for every request and stream) or HTTP/1.1,
/// optionally with a new connection, so a new handshake, per request.
fn rotation_client(
    ca: &cca_trust::pki::ClusterCa,
    certificate: &Arc<ClientCertificate>,
    http1: bool,
    new_connection_per_request: bool,
) -> reqwest::Client {
    let mut config = ClientTls::new(ca.cert_pem())
        .with_certificate(Arc::clone(certificate))
        .rustls_config()
        .expect("TLS settings");
    let mut builder = reqwest::Client::builder().tls_info(true);
    if http1 {
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        builder = builder.http1_only();
    }
    if new_connection_per_request {
        builder = builder.pool_max_idle_per_host(0);
    }
    builder
        .tls_backend_preconfigured(config)
        .build()
        .expect("client")
}

/// One `GET /who`: the serial of the server's certificate the client saw
/// on the connection, and the server's `connection serial version`.
async fn who(client: &reqwest::Client, url: &str) -> Result<(String, String), String> {
    let response = client
        .get(format!("{url}/who"))
        .send()
        .await
        .map_err(|error| format!("{error:?}"))?;
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()));
    }
    let server_serial = response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|info| info.peer_certificate())
        .and_then(|der| cca_trust::pki::CertInfo::parse(der).ok())
        .map(|info| info.serial)
        .ok_or("no server certificate")?;
    let body = response
        .text()
        .await
        .map_err(|error| format!("{error:?}"))?;
    Ok((server_serial, body))
}

/// Reads one long-lived stream to its end: the bytes it carried, or why
/// it broke. `progress` counts the bytes as they come.
async fn follow(
    client: reqwest::Client,
    url: String,
    progress: Arc<std::sync::atomic::AtomicU64>,
) -> Result<u64, String> {
    let mut response = client
        .get(format!("{url}/stream"))
        .send()
        .await
        .map_err(|error| format!("opening: {error:?}"))?;
    if response.version() != reqwest::Version::HTTP_2 {
        return Err(format!("the stream is {:?}", response.version()));
    }
    let mut bytes = 0u64;
    let mut tail = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| format!("after {bytes} bytes: {error:?}"))?
    {
        bytes += chunk.len() as u64;
        progress.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::SeqCst);
        tail.extend_from_slice(&chunk);
        let keep = tail.len().saturating_sub(END.len());
        tail.drain(..keep);
    }
    if tail != END {
        return Err(format!("cut short after {bytes} bytes"));
    }
    Ok(bytes)
}

/// Polls `done` every 10 ms for up to 20 s.
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "waited for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// The server's and a client's certificates are replaced while HTTP/2
/// streams carry data and HTTP/1.1 requests come and go through the TLS
/// listener: nothing fails, the open connections keep their certificates,
/// new handshakes present the renewed ones. The server is a small router
/// of its own on [`TlsListener`] and [`ServerTls`], as the API's: its
/// streams send all the time, where the API's send only on changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_without_dropping_a_stream_or_a_request() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    const STREAMS: usize = 8;
    let ca = fixed::ca();
    // The first certificates at hour 0; their renewals at hour 16, two
    // thirds into a node certificate's day, as the agents renew.
    let server_first = fixed::issue(&ca, "server:s1", &["localhost"], 0);
    let server_renewed = fixed::issue(&ca, "server:s1", &["localhost"], 16);
    let node_first = fixed::issue(&ca, "node:n1", &[], 0);
    let node_renewed = fixed::issue(&ca, "node:n1", &[], 16);
    let [s1, s2, n1, n2] =
        [&server_first, &server_renewed, &node_first, &node_renewed].map(fixed::serial);

    let chain = |issued: &CertAndKey| format!("{}{}", issued.cert_pem, ca.cert_pem());
    let served = Arc::new(
        ServerCertificate::from_pem(&chain(&server_first), &server_first.key_pem)
            .expect("server cert"),
    );
    let tls = ServerTls::new(ca.cert_pem(), Arc::clone(&served)).expect("tls");
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let url = format!(
        "https://localhost:{}",
        tcp.local_addr().expect("address").port()
    );
    let listener = TlsListener::new(tcp, &tls).expect("listener");
    let (stop_streams, stop) = tokio::sync::watch::channel(false);
    let streaming = Arc::new(Streaming {
        stop,
        sent: AtomicU64::new(0),
    });
    let app = rotation_app(Arc::clone(&streaming))
        .into_make_service_with_connect_info::<SeenConnection>();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let presented = Arc::new(
        ClientCertificate::from_pem(&node_first.cert_pem, &node_first.key_pem)
            .expect("client cert"),
    );
    let h2 = rotation_client(&ca, &presented, false, false);
    let h1_kept = rotation_client(&ca, &presented, true, false);
    let h1_new = rotation_client(&ca, &presented, true, true);

    let (first_h2, _) = who(&h2, &url).await.expect("h2 answers");
    let (_, first_h2_seen) = who(&h2, &url).await.expect("h2 answers");
    assert_eq!(first_h2, s1);
    let progress: Vec<Arc<AtomicU64>> = (0..STREAMS).map(|_| Arc::default()).collect();
    let streams: Vec<_> = progress
        .iter()
        .map(|progress| tokio::spawn(follow(h2.clone(), url.clone(), Arc::clone(progress))))
        .collect();
    until("every stream to carry bytes", || {
        progress.iter().all(|p| p.load(Ordering::SeqCst) > 0)
    })
    .await;

    // HTTP/1.1 requests all along: on one kept connection, and each on a
    // new connection. Every answer is kept: (server serial, body).
    let requesting = Arc::new(AtomicBool::new(true));
    let requests: Vec<_> = [h1_kept.clone(), h1_new.clone()]
        .into_iter()
        .map(|client| {
            let (url, requesting) = (url.clone(), Arc::clone(&requesting));
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while requesting.load(Ordering::SeqCst) {
                    answers.push(who(&client, &url).await);
                    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                }
                answers
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;

    // Rotate both certificates mid-stream.
    let at_rotation: Vec<u64> = progress.iter().map(|p| p.load(Ordering::SeqCst)).collect();
    served
        .replace(&chain(&server_renewed), &server_renewed.key_pem)
        .expect("server certificate replaced");
    presented
        .replace(&node_renewed.cert_pem, &node_renewed.key_pem)
        .expect("client certificate replaced");
    until(
        "every stream to carry 20 KiB more after the rotation",
        || {
            progress
                .iter()
                .zip(&at_rotation)
                .all(|(p, before)| p.load(Ordering::SeqCst) >= before + 20 * 1024)
        },
    )
    .await;

    // A new handshake presents both new certificates.
    let (server_serial, seen) = who(&h1_new, &url).await.expect("a new connection");
    assert_eq!(
        server_serial, s2,
        "the client sees the renewed server certificate"
    );
    assert!(
        seen.contains(&format!(" {n2} ")) && seen.ends_with("HTTP/1.1"),
        "the server sees the renewed node certificate: {seen}"
    );
    let fresh = rotation_client(&ca, &presented, false, false);
    let (server_serial, seen) = who(&fresh, &url).await.expect("a new h2 connection");
    assert_eq!(server_serial, s2);
    assert!(
        seen.contains(&format!(" {n2} ")) && seen.ends_with("HTTP/2.0"),
        "{seen}"
    );
    // The open HTTP/2 connection is the one from before, still on the
    // certificates it was opened with.
    let (server_serial, seen) = who(&h2, &url).await.expect("the open h2 connection");
    assert_eq!(server_serial, s1);
    let connection = |seen: &str| seen.split(' ').next().unwrap_or_default().to_owned();
    assert_eq!(connection(&seen), connection(&first_h2_seen), "{seen}");
    assert!(seen.contains(&format!(" {n1} ")), "{seen}");

    requesting.store(false, Ordering::SeqCst);
    stop_streams.send(true).expect("streams stop");
    let mut failures = Vec::new();
    let mut received = 0u64;
    for stream in streams {
        match stream.await.expect("stream task") {
            Ok(bytes) => received += bytes,
            Err(error) => failures.push(format!("stream: {error}")),
        }
    }
    let mut answered = Vec::new();
    for requests in requests {
        let answers = requests.await.expect("request task");
        for answer in answers {
            match answer {
                Ok(answer) => answered.push(answer),
                Err(error) => failures.push(format!("request: {error}")),
            }
        }
    }
    let sent = streaming.sent.load(Ordering::SeqCst);
    let rotated =
        |(server, seen): &(String, String)| (server == &s2) && seen.contains(&format!(" {n2} "));
    let before =
        |(server, seen): &(String, String)| (server == &s1) && seen.contains(&format!(" {n1} "));
    println!(
        "rotation: {STREAMS} HTTP/2 streams carried {received} bytes across it; \
         {} HTTP/1.1 requests answered ({} of them with both new certificates); \
         {} failures",
        answered.len(),
        answered.iter().filter(|a| rotated(a)).count(),
        failures.len()
    );
    assert_eq!(failures, Vec::<String>::new(), "nothing failed");
    assert_eq!(received, sent, "every byte sent was received");
    assert!(answered.iter().any(before), "requests before the rotation");
    assert!(answered.iter().any(rotated), "requests after the rotation");
    server.abort();
}

/// An open HTTP/1.1 connection over rustls: `GET /v1/identity` answered
/// on it, kept alive.
struct OpenConnection {
    stream: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
}

impl OpenConnection {
    async fn open(port: u16, config: Arc<rustls::ClientConfig>) -> Self {
        let connector = tokio_rustls::TlsConnector::from(config);
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connects");
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let stream = connector.connect(name, tcp).await.expect("handshake");
        let mut connection = Self { stream };
        connection.identity().await.expect("answers");
        connection
    }

    /// The answer's text, or why there was none.
    async fn identity(&mut self) -> Result<String, String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        self.stream
            .write_all(b"GET /v1/identity HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .map_err(|error| format!("writing: {error}"))?;
        let mut answer = Vec::new();
        let mut buffer = [0u8; 4096];
        // The answer is small JSON with a Content-Length: done at its `}`.
        while !(answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.ends_with(b"}")) {
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                self.stream.read(&mut buffer),
            )
            .await
            .map_err(|_| "no answer in 10 s".to_owned())?
            .map_err(|error| format!("reading: {error}"))?;
            if read == 0 {
                return Err("the server closed the connection".into());
            }
            answer.extend_from_slice(&buffer[..read]);
        }
        Ok(String::from_utf8_lossy(&answer).into_owned())
    }

    /// Whether the server closes the connection within `wait`, with
    /// nothing asked.
    async fn closed_within(&mut self, wait: std::time::Duration) -> bool {
        use tokio::io::AsyncReadExt;

        let mut buffer = [0u8; 64];
        match tokio::time::timeout(wait, self.stream.read(&mut buffer)).await {
            Err(_) => false,
            Ok(Ok(0) | Err(_)) => true,
            Ok(Ok(_)) => panic!("the server sent something unasked"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_connection_closes_when_its_certificate_is_revoked() {
    use cca_trust::identity::Identity;
    use cca_trust::revocation::{Revocations, RevokedEntry};
    use std::time::Duration;

    let h = harness().await;
    let ca = fixed::ca();
    let server = fixed::issue(&ca, "server:s1", &["localhost"], 0);
    let chain = format!("{}{}", server.cert_pem, ca.cert_pem());
    let served = serve_tls_pem(&h, ca.cert_pem(), &chain, &server.key_pem).await;
    let n1 = fixed::issue(&ca, "node:n1", &[], 1);
    let n2 = fixed::issue(&ca, "node:n2", &[], 1);
    let tls13 = &rustls::version::TLS13;
    let mut first = OpenConnection::open(served.port, rustls_config(&ca, &n1, tls13)).await;
    let mut second = OpenConnection::open(
        served.port,
        rustls_config(&ca, &n1, &rustls::version::TLS12),
    )
    .await;
    let mut other = OpenConnection::open(served.port, rustls_config(&ca, &n2, tls13)).await;
    assert!(
        !first.closed_within(Duration::from_millis(200)).await,
        "idle, open"
    );

    // A replacement that revokes nothing of theirs closes nothing.
    served
        .tls
        .revocations()
        .replace(Revocations::new([RevokedEntry::Identity {
            identity: Identity::Node("n3".into()),
            issued_before: fixed::at(20),
        }]));
    assert!(!first.closed_within(Duration::from_millis(200)).await);
    first.identity().await.expect("still answered");

    // n1 is removed: both its connections close at once, unasked.
    served
        .tls
        .revocations()
        .replace(Revocations::new([RevokedEntry::Identity {
            identity: Identity::Node("n1".into()),
            issued_before: fixed::at(20),
        }]));
    assert!(
        first.closed_within(Duration::from_secs(10)).await,
        "n1's TLS 1.3 connection"
    );
    assert!(
        second.closed_within(Duration::from_secs(10)).await,
        "n1's TLS 1.2 connection"
    );
    let seen = other.identity().await.expect("n2's connection goes on");
    assert!(seen.contains("\"n2\""), "{seen}");
    let _ = served.stop.send(());
}
