//! Gates' certificates and keys as gate nodes get them, over the API's
//! real mTLS: a `tls { self_signed }` gate's certificate signed by the
//! cluster CA for a CSR naming exactly its hosts, a `tls { cert key }`
//! gate's secrets handed over with a version and 304 until set again,
//! each only to a gate node asking as itself. And on a server without a
//! CA (plain HTTP, `cca dev --insecure`), a CA of its own signs.

mod support;

use std::sync::Arc;
use std::time::Duration;

use cca_api::{ServerCertificate, ServerTls, TlsListener};
use cca_model::cluster::GateListen;
use cca_model::spec::{GateSpec, Program, SecretSpec, Tls};
use cca_trust::gate::{GateHosts, gate_csr};
use cca_trust::identity::Identity;
use cca_trust::pki::{CA_VALIDITY, CertAndKey, CertInfo, ClusterCa, Issue, Names, verify_issued};
use cca_wire::Client;
use cca_wire::tls::{ClientCertificate, ClientTls};
use cca_wire::types::GateCertificateRequest;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::sync::oneshot;

const SHOP_HOSTS: [&str; 2] = ["shop.example.com", "*.shop.example.com"];

/// A cluster under certificate authentication with the cluster CA, a
/// secret key, and the callers: gate node `n1`, plain node `n2`, user
/// `admin`. A program with gates `shop` (self-signed), `api` (secrets
/// `api_cert`, `api_key`) and `plain` (no TLS) is applied.
struct Cluster {
    h: support::Harness,
    _stop: oneshot::Sender<()>,
    ca: Arc<ClusterCa>,
    n1: Client,
    n2: Client,
    admin: Client,
}

impl Cluster {
    async fn start() -> Self {
        let config = cca_api::ApiConfig {
            authentication: cca_api::auth::Authentication::Certificates,
            ..cca_api::ApiConfig::default()
        };
        let h = support::harness_with(config).await;
        let now = cca_model::clock::system_now();
        let ca = Arc::new(ClusterCa::generate("test", now, CA_VALIDITY).expect("ca"));
        let key = cca_api::SecretKey::from_bytes(&[7; 32]).expect("32 bytes");
        let _ = h
            .state
            .clone()
            .with_authority(Arc::clone(&ca))
            .with_secret_key(key);
        let server = issue(&ca, Identity::Server("s1".into()), &["localhost"]);
        let chain = format!("{}{}", server.cert_pem, ca.cert_pem());
        let certificate =
            Arc::new(ServerCertificate::from_pem(&chain, &server.key_pem).expect("server cert"));
        let tls = ServerTls::new(ca.cert_pem(), certificate).expect("tls");
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let url = format!(
            "https://localhost:{}",
            tcp.local_addr().expect("address").port()
        );
        let listener = TlsListener::new(tcp, &tls).expect("listener");
        let (stop, stopped) = oneshot::channel::<()>();
        let state = h.state.clone();
        tokio::spawn(async move {
            let _ = cca_api::serve(listener, state, async {
                let _ = stopped.await;
            })
            .await;
        });
        let client = |identity: Identity| {
            let issued = issue(&ca, identity, &[]);
            let presented = ClientCertificate::from_pem(&issued.cert_pem, &issued.key_pem)
                .expect("client cert");
            let tls = ClientTls::new(ca.cert_pem()).with_certificate(Arc::new(presented));
            Client::with_tls(&url, &tls).expect("client")
        };
        let cluster = Self {
            n1: client(Identity::Node("n1".into())),
            n2: client(Identity::Node("n2".into())),
            admin: client(Identity::User("admin".into())),
            ca,
            h,
            _stop: stop,
        };
        let mut gate_node = support::node_request("n1");
        gate_node.gate = GateListen {
            http: Some("0.0.0.0:80".into()),
            https: Some("0.0.0.0:443".into()),
        };
        cluster.n1.register(&gate_node).await.expect("n1 registers");
        cluster
            .n2
            .register(&support::node_request("n2"))
            .await
            .expect("n2 registers");
        cluster
            .admin
            .apply(&program(), false)
            .await
            .expect("the program applies");
        support::fresh(&cluster.h.state).await;
        cluster
    }
}

fn issue(ca: &ClusterCa, identity: Identity, hosts: &[&str]) -> CertAndKey {
    let names = Names::from_hosts(hosts).expect("names");
    ca.issue(&Issue::new(identity, names), cca_model::clock::system_now())
        .expect("issues")
}

fn gate(name: &str, hosts: &[&str], tls: Option<Tls>) -> GateSpec {
    GateSpec {
        name: name.into(),
        hosts: hosts.iter().map(|host| (*host).to_owned()).collect(),
        service: "web".into(),
        port: 8080,
        tls,
        ..GateSpec::default()
    }
}

fn program() -> Program {
    let mut program = support::program(&[("web", 1)]);
    for gate in [
        gate("shop", &SHOP_HOSTS, Some(Tls::SelfSigned)),
        gate(
            "api",
            &["api.example.com"],
            Some(Tls::Secrets {
                cert: "api_cert".into(),
                key: "api_key".into(),
            }),
        ),
        gate("plain", &["plain.example.com"], None),
    ] {
        program.gates.insert(gate.name.clone(), gate);
    }
    for name in ["api_cert", "api_key"] {
        program.secrets.insert(
            name.into(),
            SecretSpec {
                name: name.into(),
                description: None,
                tenant: None,
            },
        );
    }
    program
}

fn request(hosts: &[&str]) -> (GateCertificateRequest, String) {
    let request = gate_csr(&GateHosts::new(hosts).expect("hosts")).expect("csr");
    (
        GateCertificateRequest {
            csr_pem: request.csr_pem,
        },
        request.key_pem,
    )
}

/// Whether a TLS client trusting only `ca_pem` accepts `cert_pem` for
/// `host`, as webpki judges a server's certificate.
fn accepted_for(cert_pem: &str, ca_pem: &str, host: &str) -> bool {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("ca"))
        .expect("root");
    use rustls::client::danger::ServerCertVerifier;
    let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
        .build()
        .expect("verifier");
    let leaf = CertificateDer::from_pem_slice(cert_pem.as_bytes()).expect("leaf");
    let name = ServerName::try_from(host.to_owned()).expect("name");
    verifier
        .verify_server_cert(&leaf, &[], &name, &[], UnixTime::now())
        .is_ok()
}

#[tokio::test]
async fn a_gate_node_gets_a_certificate_for_exactly_its_gates_hosts() {
    let cluster = Cluster::start().await;
    let (n1, n2) = (&cluster.n1, &cluster.n2);

    let (asked, key_pem) = request(&SHOP_HOSTS);
    let issued = n1
        .gate_certificate("n1", "shop", &asked)
        .await
        .expect("the gate node gets the shop's certificate");
    assert_eq!(issued.ca_pem, cluster.ca.cert_pem());
    let info = verify_issued(
        &issued.certificate_pem,
        cluster.ca.cert_pem(),
        cca_model::clock::system_now(),
    )
    .expect("signed by the cluster CA");
    let mut names = info.names.dns.clone();
    names.sort();
    assert_eq!(names, ["*.shop.example.com", "shop.example.com"]);
    assert_eq!(
        info.identity, None,
        "a gate's certificate is nobody's identity"
    );
    let life = info
        .not_after
        .duration_since(info.not_before)
        .expect("life");
    assert!(
        life >= Duration::from_secs(90 * 86_400) && life <= Duration::from_secs(91 * 86_400),
        "{life:?}"
    );
    cca_trust::pki::check_key_matches(&issued.certificate_pem, &key_pem)
        .expect("for the node's own key");
    for host in ["shop.example.com", "www.shop.example.com"] {
        assert!(
            accepted_for(&issued.certificate_pem, &issued.ca_pem, host),
            "{host}"
        );
    }
    assert!(!accepted_for(
        &issued.certificate_pem,
        &issued.ca_pem,
        "api.example.com"
    ));

    let error = n2
        .gate_certificate("n2", "shop", &asked)
        .await
        .expect_err("n2 is not a gate node");
    assert_eq!(error.status(), Some(403), "{error}");
    assert!(error.to_string().contains("not a gate node"), "{error}");
    let error = n2
        .gate_certificate("n1", "shop", &asked)
        .await
        .expect_err("n2 cannot ask as n1");
    assert_eq!(error.status(), Some(403), "{error}");
    assert!(error.to_string().contains("only as itself"), "{error}");

    let (wider, _) = request(&["shop.example.com", "*.shop.example.com", "bank.example.com"]);
    let error = n1
        .gate_certificate("n1", "shop", &wider)
        .await
        .expect_err("a name the gate does not serve");
    assert_eq!(error.status(), Some(422), "{error}");
    assert!(
        error
            .to_string()
            .contains("also asks for `bank.example.com`"),
        "{error}"
    );
    let (narrower, _) = request(&["shop.example.com"]);
    let error = n1
        .gate_certificate("n1", "shop", &narrower)
        .await
        .expect_err("not exactly the hosts");
    assert!(error.to_string().contains("leaves out"), "{error}");

    for gate in ["api", "plain"] {
        let (asked, _) = request(&["api.example.com"]);
        let error = n1
            .gate_certificate("n1", gate, &asked)
            .await
            .expect_err("not a self-signed gate");
        assert_eq!(error.status(), Some(409), "{error}");
        assert!(error.to_string().contains("self_signed"), "{error}");
    }
    let error = n1
        .gate_certificate("n1", "nowhere", &asked)
        .await
        .expect_err("no such gate");
    assert_eq!(error.status(), Some(404), "{error}");

    // The certificate issued is in the audit log, with the gate.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let entries = cluster
            .admin
            .audit(&cca_wire::AuditQuery::default())
            .await
            .expect("reads the audit log");
        let issued = entries.iter().find(|entry| {
            entry.record.path == "/v1/agent/nodes/n1/gates/shop/certificate"
                && entry.record.status == 200
        });
        if let Some(entry) = issued {
            assert_eq!(entry.record.who.as_deref(), Some("node:n1"));
            let detail = entry.record.detail.as_deref().unwrap_or_default();
            assert!(detail.contains("gate `shop`"), "{detail}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not audited: {entries:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_gates_secrets_are_handed_over_then_304_until_set_again() {
    let cluster = Cluster::start().await;
    let (n1, n2, admin) = (&cluster.n1, &cluster.n2, &cluster.admin);

    let error = n1
        .gate_tls("n1", "api", None)
        .await
        .expect_err("the secrets have no value yet");
    assert_eq!(error.status(), Some(409), "{error}");
    assert!(
        error.to_string().contains("cca secret set api_cert"),
        "{error}"
    );

    let first = issue(
        &cluster.ca,
        Identity::Server("api".into()),
        &["api.example.com"],
    );
    admin
        .set_secret("api_cert", first.cert_pem.clone())
        .await
        .expect("sets the chain");
    admin
        .set_secret("api_key", first.key_pem.clone())
        .await
        .expect("sets the key");
    support::fresh(&cluster.h.state).await;

    let got = n1
        .gate_tls("n1", "api", None)
        .await
        .expect("answers")
        .expect("the pair");
    assert_eq!(
        (got.chain_pem.as_str(), got.key_pem.as_str()),
        (first.cert_pem.as_str(), first.key_pem.as_str())
    );
    assert!(
        !format!("{got:?}").contains(&first.key_pem),
        "Debug hides the key"
    );
    let again = n1
        .gate_tls("n1", "api", Some(&got.version))
        .await
        .expect("answers");
    assert_eq!(again, None, "304: nothing changed");

    let second = issue(
        &cluster.ca,
        Identity::Server("api".into()),
        &["api.example.com"],
    );
    admin
        .set_secret("api_cert", second.cert_pem.clone())
        .await
        .expect("sets the chain again");
    support::fresh(&cluster.h.state).await;
    let renewed = n1
        .gate_tls("n1", "api", Some(&got.version))
        .await
        .expect("answers")
        .expect("a new version");
    assert_ne!(renewed.version, got.version);
    assert_eq!(renewed.chain_pem, second.cert_pem);
    assert_eq!(renewed.key_pem, first.key_pem, "the key secret as it is");
    assert_eq!(
        n1.gate_tls("n1", "api", Some(&renewed.version))
            .await
            .expect("answers"),
        None
    );

    let error = n2
        .gate_tls("n2", "api", None)
        .await
        .expect_err("n2 is not a gate node");
    assert_eq!(error.status(), Some(403), "{error}");
    let error = n1
        .gate_tls("n1", "shop", None)
        .await
        .expect_err("a self-signed gate has no secrets");
    assert_eq!(error.status(), Some(409), "{error}");
}

#[tokio::test]
async fn a_server_without_a_ca_signs_gates_with_one_of_its_own() {
    // As `cca dev --insecure` runs: open, plain HTTP, no cluster CA.
    let h = support::harness().await;
    let (client, _stop) = h.serve().await;
    let mut gate_node = support::node_request("n1");
    gate_node.gate.https = Some("127.0.0.1:8443".into());
    client.register(&gate_node).await.expect("registers");
    client.apply(&program(), false).await.expect("applies");
    support::fresh(&h.state).await;

    let (asked, _) = request(&SHOP_HOSTS);
    let first = client
        .gate_certificate("n1", "shop", &asked)
        .await
        .expect("signed without a cluster CA");
    let info = CertInfo::parse(&first.ca_pem).expect("a CA certificate");
    assert!(info.is_ca, "{info:?}");
    verify_issued(
        &first.certificate_pem,
        &first.ca_pem,
        cca_model::clock::system_now(),
    )
    .expect("by that CA");
    assert!(accepted_for(
        &first.certificate_pem,
        &first.ca_pem,
        "www.shop.example.com"
    ));
    let second = client
        .gate_certificate("n1", "shop", &asked)
        .await
        .expect("again");
    assert_eq!(
        second.ca_pem, first.ca_pem,
        "the same CA for the server's run"
    );
}
