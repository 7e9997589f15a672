//! The etcd backend over TLS against a real etcd that serves clients over
//! TLS only and requires a client certificate (`--client-cert-auth`): the
//! store works with the CA and a client certificate, and is refused
//! without the certificate or when it trusts another CA. Certificates are
//! made here with rcgen.

use std::path::Path;
use std::sync::Arc;

use cca_store::etcd::{ClientIdentity, Config, EtcdStore, Tls};
use cca_store::testing::etcd::{EtcdServer, EtcdTlsFiles};
use cca_store::{Op, Store, Txn};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};

struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("key");
        Self(CertifiedIssuer::self_signed(params, key).expect("CA"))
    }

    /// A certificate for `names` and its key, in PEM.
    fn issue(&self, names: &[&str]) -> ClientIdentity {
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(names).expect("params");
        // etcd (Go) checks the purpose of both ends' certificates.
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.0).expect("signed");
        ClientIdentity {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("writes");
    path
}

/// Connects as `cca server` does: an `etcd://` URL's plain endpoint,
/// turned to `https://` by the TLS settings. Connecting reads once.
async fn connect(server: &EtcdServer, tls: Tls) -> cca_store::Result<EtcdStore> {
    let mut config = Config::new(vec![server.endpoint().replace("https://", "http://")]);
    config.tls = Some(tls);
    config.retry_attempts = 2;
    EtcdStore::connect(config).await
}

#[tokio::test]
async fn a_client_certificate_of_the_trusted_ca_is_needed_and_enough() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = Ca::new();
    let server_cert = ca.issue(&["127.0.0.1", "localhost"]);
    let files = EtcdTlsFiles {
        cert: write(dir.path(), "server.pem", &server_cert.cert_pem),
        key: write(dir.path(), "server.key", &server_cert.key_pem),
        client_ca: write(dir.path(), "ca.pem", &ca.0.pem()),
    };
    let server = EtcdServer::start_tls(files);
    assert!(server.endpoint().starts_with("https://"));

    let client = ca.issue(&["cca-server"]);
    let cert = write(dir.path(), "client.pem", &client.cert_pem);
    let key = write(dir.path(), "client.key", &client.key_pem);
    let tls = Tls::from_files(&dir.path().join("ca.pem"), Some(&cert), Some(&key))
        .expect("reads the files");
    let store: Arc<dyn Store> = Arc::new(
        connect(&server, tls)
            .await
            .unwrap_or_else(|error| panic!("{error}\n{}", server.log_tail())),
    );
    store
        .txn(Txn::new().then(Op::put("desired/service/web", b"{}".to_vec())))
        .await
        .unwrap_or_else(|error| panic!("writes over TLS: {error}\n{}", server.log_tail()));
    let kv = store
        .get("desired/service/web")
        .await
        .expect("reads over TLS");
    assert_eq!(kv.map(|kv| kv.value), Some(b"{}".to_vec()));

    let without = Tls {
        ca_pem: ca.0.pem(),
        client: None,
    };
    let error = connect(&server, without)
        .await
        .expect_err("etcd requires a client certificate");
    assert!(error.to_string().contains("unavailable"), "{error}");
    assert!(
        server.log_tail().contains("didn't provide a certificate"),
        "{}",
        server.log_tail()
    );

    let stranger = Ca::new();
    let wrong_root = Tls {
        ca_pem: stranger.0.pem(),
        client: Some(client.clone()),
    };
    let error = connect(&server, wrong_root)
        .await
        .expect_err("the server's certificate is not of the trusted CA");
    assert!(error.to_string().contains("certificate"), "{error}");

    let error = Tls::from_files(&dir.path().join("ca.pem"), Some(&cert), None)
        .expect_err("a certificate without its key");
    assert!(error.to_string().contains("--etcd-key"), "{error}");
}
