//! The cluster PKI against real clients: rustls handshakes (in memory, on
//! a fake clock) accept what the CA issues and refuse another CA's and
//! expired certificates; sign_csr refuses every request that asks for
//! more than it may; openssl reads and verifies what is written.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cca_trust::identity::Identity;
use cca_trust::pki::{
    self, CA_VALIDITY, CertAndKey, CertInfo, ClusterCa, Error, Fingerprint, Issue,
    NODE_CERT_VALIDITY, Names, csr, verify_issued,
};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{
    CertificateDer, CertificateSigningRequestDer, PrivateKeyDer, ServerName, UnixTime,
};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection,
};

/// The fake clock's "now": 2030-03-17.
const NOW: Duration = Duration::from_secs(1_900_000_000);

fn now() -> SystemTime {
    UNIX_EPOCH + NOW
}

fn node(name: &str) -> Identity {
    Identity::Node(name.to_owned())
}

fn ca(cluster: &str) -> ClusterCa {
    ClusterCa::generate(cluster, now(), CA_VALIDITY).expect("CA")
}

fn server_names() -> Names {
    Names {
        dns: vec!["api.cluster.test".into()],
        ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    }
}

#[derive(Debug)]
struct FakeClock(UnixTime);

impl rustls::time_provider::TimeProvider for FakeClock {
    fn current_time(&self) -> Option<UnixTime> {
        Some(self.0)
    }
}

fn clock() -> Arc<FakeClock> {
    Arc::new(FakeClock(UnixTime::since_unix_epoch(NOW)))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn roots(ca: &ClusterCa) -> Arc<RootCertStore> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.cert_der().clone()).expect("CA as root");
    Arc::new(roots)
}

fn chain(issued: &CertAndKey) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let cert = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).expect("cert PEM");
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).expect("key PEM");
    (vec![cert], key)
}

/// A server that trusts `client_ca` for client certificates and presents
/// `server`; the way the lead's API server is to be configured.
fn server_config(client_ca: &ClusterCa, server: &CertAndKey) -> Arc<ServerConfig> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(client_ca), provider())
        .build()
        .expect("client verifier");
    let (certs, key) = chain(server);
    Arc::new(
        ServerConfig::builder_with_details(provider(), clock())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .expect("server config"),
    )
}

fn client_config(server_ca: &ClusterCa, client: &CertAndKey) -> Arc<ClientConfig> {
    let (certs, key) = chain(client);
    Arc::new(
        ClientConfig::builder_with_details(provider(), clock())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots(server_ca))
            .with_client_auth_cert(certs, key)
            .expect("client config"),
    )
}

#[derive(Debug, PartialEq)]
enum Side {
    Client(rustls::Error),
    Server(rustls::Error),
}

/// Runs a handshake through memory; on success, what the server knows of
/// its client.
fn handshake(
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
    name: &str,
) -> Result<CertInfo, Side> {
    let name = ServerName::try_from(name.to_owned()).expect("server name");
    let mut client = ClientConnection::new(client, name).expect("client");
    let mut server = ServerConnection::new(server).expect("server");
    for _ in 0..20 {
        let mut bytes = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut bytes).expect("client writes");
        }
        let mut unread = &bytes[..];
        while !unread.is_empty() {
            server.read_tls(&mut unread).expect("server reads");
            server.process_new_packets().map_err(Side::Server)?;
        }
        let mut bytes = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut bytes).expect("server writes");
        }
        let mut unread = &bytes[..];
        while !unread.is_empty() {
            client.read_tls(&mut unread).expect("client reads");
            client.process_new_packets().map_err(Side::Client)?;
        }
        if !client.is_handshaking() && !server.is_handshaking() && !client.wants_write() {
            let peer = server
                .peer_certificates()
                .and_then(|certs| certs.first())
                .expect("a client certificate");
            return Ok(CertInfo::parse(peer.as_ref()).expect("client certificate"));
        }
    }
    panic!("the handshake did not finish in 20 rounds");
}

fn issue(ca: &ClusterCa, identity: Identity, names: Names) -> CertAndKey {
    ca.issue(&Issue::new(identity, names), now())
        .expect("issue")
}

#[test]
fn rustls_accepts_the_server_by_dns_name_and_ip_and_the_node_as_client() {
    let ca = ca("prod");
    let server = issue(&ca, Identity::Server("cp-0".into()), server_names());
    let node = issue(&ca, node("n1"), Names::none());
    for name in ["api.cluster.test", "127.0.0.1"] {
        let peer = handshake(client_config(&ca, &node), server_config(&ca, &server), name)
            .unwrap_or_else(|error| panic!("handshake as {name}: {error:?}"));
        assert_eq!(peer.identity, Some(Identity::Node("n1".into())));
    }
    let admin = issue(&ca, Identity::User("admin".into()), Names::none());
    let peer = handshake(
        client_config(&ca, &admin),
        server_config(&ca, &server),
        "api.cluster.test",
    )
    .expect("the admin's certificate is a client's");
    assert_eq!(peer.identity, Some(Identity::User("admin".into())));
    let refused = handshake(
        client_config(&ca, &node),
        server_config(&ca, &server),
        "other.cluster.test",
    );
    assert!(
        matches!(
            refused,
            Err(Side::Client(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
            )))
        ),
        "{refused:?}"
    );
}

#[test]
fn a_node_certificate_is_no_server_certificate() {
    // A node's client certificate has no host name and no serverAuth: it
    // cannot stand in for the API server even to a client that trusts the CA.
    let ca = ca("prod");
    let node = issue(&ca, node("n1"), Names::none());
    let (certs, _) = chain(&node);
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots(&ca), provider())
            .build()
            .expect("server verifier");
    let refused = verifier.verify_server_cert(
        &certs[0],
        &[],
        &ServerName::try_from("n1").expect("name"),
        &[],
        UnixTime::since_unix_epoch(NOW),
    );
    assert!(refused.is_err(), "{refused:?}");
}

#[test]
fn another_clusters_certificates_are_refused_both_ways() {
    let ours = ca("prod");
    let server = issue(&ours, Identity::Server("cp-0".into()), server_names());
    let node = issue(&ours, node("n1"), Names::none());
    // webpki finds no issuer of another name, and an issuer of the same
    // name (another cluster also called prod) whose key did not sign it.
    for (theirs, error) in [
        (ca("staging"), CertificateError::UnknownIssuer),
        (ca("prod"), CertificateError::BadSignature),
    ] {
        assert_ne!(ours.fingerprint(), theirs.fingerprint());
        let intruder = issue(&theirs, self::node("n1"), Names::none());
        let refused = handshake(
            client_config(&ours, &intruder),
            server_config(&ours, &server),
            "api.cluster.test",
        );
        assert_eq!(
            refused.map(|_| ()),
            Err(Side::Server(rustls::Error::InvalidCertificate(
                error.clone()
            )))
        );
        let fake_server = issue(&theirs, Identity::Server("cp-0".into()), server_names());
        let refused = handshake(
            client_config(&ours, &node),
            server_config(&ours, &fake_server),
            "api.cluster.test",
        );
        assert_eq!(
            refused.map(|_| ()),
            Err(Side::Client(rustls::Error::InvalidCertificate(error)))
        );
    }
}

#[test]
fn an_expired_node_certificate_is_refused() {
    let ca = ClusterCa::generate("prod", now() - Duration::from_secs(7 * 86_400), CA_VALIDITY)
        .expect("CA");
    let server = issue(&ca, Identity::Server("cp-0".into()), server_names());
    let two_days_ago = now() - Duration::from_secs(2 * 86_400);
    let stale = ca
        .issue(&Issue::new(node("n1"), Names::none()), two_days_ago)
        .expect("issue");
    let refused = handshake(
        client_config(&ca, &stale),
        server_config(&ca, &server),
        "api.cluster.test",
    );
    assert!(
        matches!(
            refused,
            Err(Side::Server(rustls::Error::InvalidCertificate(
                CertificateError::Expired | CertificateError::ExpiredContext { .. }
            )))
        ),
        "{refused:?}"
    );
    let error = verify_issued(&stale.cert_pem, ca.cert_pem(), now()).expect_err("expired");
    assert!(matches!(error, Error::Expired { .. }), "{error}");
    assert!(error.to_string().contains("expired at 20"), "{error}");
}

#[test]
fn issued_certificates_say_who_for_how_long_and_when_to_renew() {
    let ca = ca("prod");
    let issued = issue(&ca, node("n1"), Names::none());
    let info = verify_issued(&issued.cert_pem, ca.cert_pem(), now()).expect("ours");
    assert_eq!(info.identity, Some(node("n1")));
    assert_eq!(info.subject, "cca://node/n1");
    assert!(!info.is_ca);
    assert_eq!(info.not_before, now() - pki::CLOCK_SKEW);
    assert_eq!(info.not_after, now() + NODE_CERT_VALIDITY);
    let life = NODE_CERT_VALIDITY + pki::CLOCK_SKEW;
    assert_eq!(info.renew_at(), info.not_before + life * 2 / 3);
    assert!(info.serial.len() >= 30, "{}", info.serial);
    let again = issue(&ca, node("n1"), Names::none());
    assert_ne!(
        CertInfo::parse(&again.cert_pem).expect("cert").serial,
        info.serial
    );
    // A certificate cannot outlive its CA.
    let long = ca
        .issue(
            &Issue::new(node("n1"), Names::none()).valid_for(CA_VALIDITY * 2),
            now(),
        )
        .expect("issue");
    let long = CertInfo::parse(&long.cert_pem).expect("cert");
    assert_eq!(long.not_after, ca.info().not_after);
    // Users serve no TLS.
    let error = ca
        .issue(
            &Issue::new(Identity::User("eve".into()), server_names()),
            now(),
        )
        .expect_err("user with host names");
    assert!(
        error
            .to_string()
            .contains("user certificate carries no host names"),
        "{error}"
    );
    let from_other = verify_issued(&issued.cert_pem, self::ca("prod").cert_pem(), now())
        .expect_err("another CA");
    assert!(
        matches!(from_other, Error::NotIssuedBy { .. }),
        "{from_other}"
    );
}

#[test]
fn the_ca_is_a_ca_and_loads_back_only_with_its_own_key() {
    let ca = ca("prod");
    let info = ca.info();
    assert!(info.is_ca);
    assert_eq!(info.identity, None);
    assert_eq!(info.not_after, now() + CA_VALIDITY);
    let loaded = ClusterCa::load(ca.cert_pem(), &ca.key_pem()).expect("load");
    assert_eq!(loaded.fingerprint(), ca.fingerprint());
    let issued = issue(&loaded, node("n1"), Names::none());
    verify_issued(&issued.cert_pem, ca.cert_pem(), now()).expect("issued by the loaded CA");
    pki::check_key_matches(&issued.cert_pem, &issued.key_pem).expect("its key");

    let other = self::ca("prod");
    let error = ClusterCa::load(ca.cert_pem(), &other.key_pem()).expect_err("wrong key");
    assert!(matches!(error, Error::KeyMismatch { .. }), "{error}");
    assert!(error.to_string().contains("does not belong"), "{error}");
    let error = pki::check_key_matches(&issued.cert_pem, &other.key_pem()).expect_err("wrong key");
    assert!(matches!(error, Error::KeyMismatch { .. }), "{error}");

    let server = issue(&ca, Identity::Server("cp-0".into()), server_names());
    let error = ClusterCa::load(&server.cert_pem, &server.key_pem).expect_err("not a CA");
    assert!(matches!(error, Error::NotCa { .. }), "{error}");
    assert!(
        error
            .to_string()
            .contains("`cca://server/cp-0` is not a CA"),
        "{error}"
    );

    let error = ClusterCa::load("not pem", &ca.key_pem()).expect_err("garbage");
    assert!(
        error
            .to_string()
            .contains("the CA certificate (PEM) is not readable"),
        "{error}"
    );
    let error = ClusterCa::load(ca.cert_pem(), "not pem").expect_err("garbage");
    assert!(error.to_string().contains("the CA key"), "{error}");
    assert!(format!("{ca:?}").contains(&ca.fingerprint().to_string()));
    assert!(!format!("{ca:?}").contains("PRIVATE"));
}

#[test]
fn sign_csr_signs_a_good_request_with_the_cas_choices() {
    let ca = ca("prod");
    let allowed = Names {
        dns: vec!["n1.nodes.test".into(), "n1".into()],
        ips: vec!["10.0.0.1".parse().expect("ip")],
    };
    let asked = Names {
        dns: vec!["n1.nodes.test".into()],
        ips: vec!["10.0.0.1".parse().expect("ip")],
    };
    let request = csr(&node("n1"), &asked).expect("csr");
    assert!(!format!("{request:?}").contains("PRIVATE"));
    let cert = ca
        .sign_csr(
            &request.csr_pem,
            &node("n1"),
            &allowed,
            NODE_CERT_VALIDITY,
            now(),
        )
        .expect("signed");
    let info = verify_issued(&cert, ca.cert_pem(), now()).expect("ours");
    assert_eq!(info.identity, Some(node("n1")));
    assert_eq!(info.names, asked);
    assert_eq!(info.not_after, now() + NODE_CERT_VALIDITY);
    pki::check_key_matches(&cert, &request.key_pem).expect("the node's own key");

    // With its names, the node's certificate serves TLS for them.
    let server = CertAndKey {
        cert_pem: cert,
        key_pem: request.key_pem,
    };
    let client = issue(&ca, Identity::Server("cp-0".into()), Names::none());
    handshake(
        client_config(&ca, &client),
        server_config(&ca, &server),
        "n1.nodes.test",
    )
    .expect("the node serves");
}

fn refused(ca: &ClusterCa, csr_pem: &str, expected: &Identity, allowed: &Names) -> Error {
    ca.sign_csr(csr_pem, expected, allowed, NODE_CERT_VALIDITY, now())
        .expect_err("refused")
}

#[test]
fn sign_csr_refuses_requests_for_more_than_allowed() {
    let ca = ca("prod");
    let other_node = csr(&node("n2"), &Names::none()).expect("csr");
    let error = refused(&ca, &other_node.csr_pem, &node("n1"), &Names::none());
    assert_eq!(
        error.to_string(),
        "the CSR asks for `cca://node/n2` but this enrolment is for `cca://node/n1`"
    );
    let user = csr(&Identity::User("n1".into()), &Names::none()).expect("csr");
    let error = refused(&ca, &user.csr_pem, &node("n1"), &Names::none());
    assert!(matches!(error, Error::CsrIdentity { .. }), "{error}");
    assert!(error.to_string().contains("`cca://user/n1`"), "{error}");

    let greedy = csr(
        &node("n1"),
        &Names::from_hosts(["n1.nodes.test", "api.cluster.test", "10.0.0.9"]).expect("names"),
    )
    .expect("csr");
    let allowed = Names::from_hosts(["n1.nodes.test"]).expect("names");
    let error = refused(&ca, &greedy.csr_pem, &node("n1"), &allowed);
    assert_eq!(
        error.to_string(),
        "the CSR asks for `api.cluster.test`, `10.0.0.9`, not among the names allowed for \
         node `n1` (`n1.nodes.test`)"
    );

    // A request made by hand with two identities, or none.
    let key = rcgen::KeyPair::generate().expect("key");
    let two = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    let mut two = two;
    two.subject_alt_names = vec![
        rcgen::SanType::URI("cca://node/n1".try_into().expect("uri")),
        rcgen::SanType::URI("cca://server/cp-0".try_into().expect("uri")),
    ];
    let two = two
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem");
    let error = refused(&ca, &two, &node("n1"), &Names::none());
    assert!(error.to_string().contains("`cca://server/cp-0`"), "{error}");
    let none = rcgen::CertificateParams::new(vec!["n1".to_owned()])
        .expect("params")
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem");
    let error = refused(
        &ca,
        &none,
        &node("n1"),
        &Names::from_hosts(["n1"]).expect("names"),
    );
    assert!(
        error.to_string().contains("asks for no identity"),
        "{error}"
    );
}

/// A CSR for `cca://node/n1` made by hand with a key of `algorithm`.
fn csr_with_key(key: &rcgen::KeyPair) -> String {
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = vec![rcgen::SanType::URI(
        "cca://node/n1".try_into().expect("uri"),
    )];
    params
        .serialize_request(key)
        .expect("csr")
        .pem()
        .expect("pem")
}

#[test]
fn sign_csr_takes_ecdsa_and_ed25519_keys_and_refuses_rsa() {
    let ca = ca("prod");
    for algorithm in [
        &rcgen::PKCS_ECDSA_P256_SHA256,
        &rcgen::PKCS_ECDSA_P384_SHA384,
        &rcgen::PKCS_ED25519,
    ] {
        let key = rcgen::KeyPair::generate_for(algorithm).expect("key");
        let cert = ca
            .sign_csr(
                &csr_with_key(&key),
                &node("n1"),
                &Names::none(),
                NODE_CERT_VALIDITY,
                now(),
            )
            .unwrap_or_else(|error| panic!("{algorithm:?}: {error}"));
        verify_issued(&cert, ca.cert_pem(), now()).expect("ours");
    }
    let rsa = rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
        .expect("RSA key");
    let error = refused(&ca, &csr_with_key(&rsa), &node("n1"), &Names::none());
    assert!(matches!(error, Error::CsrKey { .. }), "{error}");
    assert!(
        error.to_string().contains("1.2.840.113549.1.1.1"),
        "{error}"
    );
    let p521 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P521_SHA512).expect("key");
    let error = refused(&ca, &csr_with_key(&p521), &node("n1"), &Names::none());
    assert!(
        error.to_string().contains("on curve 1.3.132.0.35"),
        "{error}"
    );
}

#[test]
fn sign_csr_refuses_tampered_and_garbage_requests() {
    let ca = ca("prod");
    let request = csr(&node("n1"), &Names::none()).expect("csr");
    // Rewrite the identity to another node's: the request still parses,
    // but its signature no longer covers what it says.
    let mut der = CertificateSigningRequestDer::from_pem_slice(request.csr_pem.as_bytes())
        .expect("pem")
        .to_vec();
    let at = der
        .windows(13)
        .position(|window| window == b"cca://node/n1")
        .expect("the identity in the CSR");
    der[at + 12] = b'2';
    let tampered = pem_of("CERTIFICATE REQUEST", &der);
    let error = refused(&ca, &tampered, &node("n2"), &Names::none());
    assert!(matches!(error, Error::CsrSignature), "{error}");

    for garbage in [
        "",
        "hello",
        "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
    ] {
        let error = refused(&ca, garbage, &node("n1"), &Names::none());
        assert!(
            matches!(error, Error::Unreadable { .. }),
            "{garbage:?}: {error}"
        );
    }
}

fn pem_of(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = text
        .as_bytes()
        .chunks(64)
        .map(|line| std::str::from_utf8(line).expect("base64 is ASCII"))
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

#[test]
fn fingerprints_print_parse_and_compare() {
    let ca = ca("prod");
    let text = ca.fingerprint().to_string();
    assert_eq!(text.len(), 64);
    assert!(
        text.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    );
    assert_eq!(text.parse::<Fingerprint>(), Ok(ca.fingerprint()));
    assert_eq!(
        text.to_uppercase().parse::<Fingerprint>(),
        Ok(ca.fingerprint())
    );
    assert_eq!(
        Fingerprint::of_der(ca.cert_der()),
        ca.fingerprint(),
        "the fingerprint is the DER's SHA-256"
    );
    assert!("abc".parse::<Fingerprint>().is_err());
    assert!("g".repeat(64).parse::<Fingerprint>().is_err());
    let json = serde_json::to_string(&ca.fingerprint()).expect("json");
    assert_eq!(json, format!("\"{text}\""));
}

/// openssl is a real, independent reader of what we write.
#[test]
fn openssl_reads_and_verifies_what_the_ca_writes() {
    if Command::new("openssl").arg("version").output().is_err() {
        println!("skipped: openssl is not installed (scripts/test installs it)");
        return;
    }
    let ca = ca("prod");
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path
    };
    let ca_path = write("ca.pem", ca.cert_pem());
    let node_cert = issue(&ca, node("n1"), Names::none());
    let node_path = write("node.pem", &node_cert.cert_pem);
    let server = issue(&ca, Identity::Server("cp-0".into()), server_names());
    let server_path = write("server.pem", &server.cert_pem);
    let key_path = write("node.key", &node_cert.key_pem);

    let run = |args: &[&std::ffi::OsStr]| {
        let output = Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl runs");
        let text = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "openssl {args:?}: {text}");
        text
    };
    let text = run(&[
        "x509".as_ref(),
        "-noout".as_ref(),
        "-text".as_ref(),
        "-in".as_ref(),
        node_path.as_os_str(),
    ]);
    for expected in [
        "URI:cca://node/n1",
        "CA:FALSE",
        "TLS Web Client Authentication",
        "Digital Signature",
        "Subject: CN = cca://node/n1",
        "Issuer: O = CCattler, CN = cca cluster prod CA",
        "ASN1 OID: prime256v1",
    ] {
        assert!(text.contains(expected), "no `{expected}` in:\n{text}");
    }
    assert!(!text.contains("TLS Web Server Authentication"), "{text}");
    let text = run(&[
        "x509".as_ref(),
        "-noout".as_ref(),
        "-text".as_ref(),
        "-in".as_ref(),
        ca_path.as_os_str(),
    ]);
    for expected in ["CA:TRUE, pathlen:0", "Certificate Sign, CRL Sign"] {
        assert!(text.contains(expected), "no `{expected}` in:\n{text}");
    }
    let text = run(&[
        "x509".as_ref(),
        "-noout".as_ref(),
        "-text".as_ref(),
        "-in".as_ref(),
        server_path.as_os_str(),
    ]);
    for expected in [
        "DNS:api.cluster.test",
        "IP Address:127.0.0.1",
        "URI:cca://server/cp-0",
        "TLS Web Server Authentication, TLS Web Client Authentication",
    ] {
        assert!(text.contains(expected), "no `{expected}` in:\n{text}");
    }
    let text = run(&[
        "x509".as_ref(),
        "-noout".as_ref(),
        "-fingerprint".as_ref(),
        "-sha256".as_ref(),
        "-in".as_ref(),
        ca_path.as_os_str(),
    ]);
    let printed = text.trim().rsplit('=').next().expect("fingerprint");
    assert_eq!(
        printed.parse::<Fingerprint>(),
        Ok(ca.fingerprint()),
        "{text}"
    );
    run(&[
        "pkey".as_ref(),
        "-noout".as_ref(),
        "-in".as_ref(),
        key_path.as_os_str(),
    ]);

    let at = NOW.as_secs().to_string();
    for cert in [&node_path, &server_path] {
        let text = run(&[
            "verify".as_ref(),
            "-attime".as_ref(),
            at.as_ref(),
            "-CAfile".as_ref(),
            ca_path.as_os_str(),
            cert.as_os_str(),
        ]);
        assert!(text.contains(": OK"), "{text}");
    }
    // And refuses what another CA issued.
    let other_path = write("other.pem", self::ca("prod").cert_pem());
    let output = Command::new("openssl")
        .args(["verify", "-attime", &at, "-CAfile"])
        .arg(&other_path)
        .arg(&node_path)
        .output()
        .expect("openssl runs");
    assert!(
        !output.status.success(),
        "openssl verified a foreign certificate"
    );
    // openssl also checks the CSR's signature like sign_csr does.
    let request = csr(&node("n1"), &Names::none()).expect("csr");
    let csr_path = write("node.csr", &request.csr_pem);
    let text = run(&[
        "req".as_ref(),
        "-noout".as_ref(),
        "-verify".as_ref(),
        "-text".as_ref(),
        "-in".as_ref(),
        csr_path.as_os_str(),
    ]);
    assert!(text.contains("URI:cca://node/n1"), "{text}");
}
