//! The API over HTTPS: the server presents its certificate, verifies
//! client certificates against the cluster CA alone, and tells each request
//! which identity its connection proved; clients trust the cluster CA
//! alone. Certificates are made here with rcgen, as `cca init` makes them.

mod support;

use std::sync::Arc;

use cca_api::{ServerCertificate, ServerTls, TlsListener};
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
    let certificate =
        Arc::new(ServerCertificate::from_pem(&chain, &server.key_pem).expect("server cert"));
    let tls = ServerTls::new(&ca.pem(), Arc::clone(&certificate)).expect("tls");
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
    (format!("https://localhost:{port}"), certificate, stop)
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
