//! HTTPS for the API's clients: the cluster CA is the only root a client
//! trusts (a public CA's certificate for the same name is refused), and a
//! client certificate, when it has one, can be replaced while the client
//! is in use (an agent renewing its node certificate keeps its streams and
//! presents the new certificate from its next connection on).
//!
//! Every certificate of the cluster comes from the one CA, so a valid
//! chain is not enough: a node's certificate may name an address too, and
//! must not pass for the server's. The client therefore also checks the
//! identity the peer's certificate carries ([`ExpectedPeer`]): the API
//! server's (`cca://server/…`) by default, one node's when the server
//! calls that node's agent. A node joining the cluster does not have the
//! CA yet: it trusts the one CA in the server's chain whose fingerprint
//! its join token names ([`ClientTls::pinned`]), and sends its token only
//! once the handshake checked out.

use std::sync::{Arc, RwLock};

use cca_trust::identity::Identity;
use cca_trust::pki::Fingerprint;
use rustls::client::ResolvesClientCert;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// What went wrong setting up a client's TLS.
#[derive(Debug, thiserror::Error)]
pub enum ClientTlsError {
    #[error("the {what} is not usable PEM: {reason}")]
    Pem { what: &'static str, reason: String },
    #[error("the client certificate and key do not fit together: {0}")]
    KeyMismatch(String),
    #[error("cannot build the TLS configuration: {0}")]
    Config(String),
}

/// A client certificate and key that can be swapped while in use.
#[derive(Debug, Default)]
pub struct ClientCertificate {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl ClientCertificate {
    pub fn from_pem(chain_pem: &str, key_pem: &str) -> Result<Self, ClientTlsError> {
        let holder = Self::default();
        holder.replace(chain_pem, key_pem)?;
        Ok(holder)
    }

    /// Presents `chain_pem` with `key_pem` from the next handshake on.
    pub fn replace(&self, chain_pem: &str, key_pem: &str) -> Result<(), ClientTlsError> {
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(chain_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|error| ClientTlsError::Pem {
                    what: "client certificate",
                    reason: error.to_string(),
                })?;
        if chain.is_empty() {
            return Err(ClientTlsError::Pem {
                what: "client certificate",
                reason: "it holds no certificate".into(),
            });
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|error| {
            ClientTlsError::Pem {
                what: "client key",
                reason: error.to_string(),
            }
        })?;
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        let certified = CertifiedKey::from_der(chain, key, &provider)
            .map_err(|error| ClientTlsError::KeyMismatch(error.to_string()))?;
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(certified));
        Ok(())
    }

    fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl ResolvesClientCert for ClientCertificate {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        schemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.current()
            .filter(|certified| certified.key.choose_scheme(schemes).is_some())
    }

    fn has_certs(&self) -> bool {
        self.current().is_some()
    }
}

/// Whom the client must find at the other end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ExpectedPeer {
    /// An API server (`cca://server/NAME`, any name).
    #[default]
    Server,
    /// Exactly this identity (a node's agent API: `cca://node/NAME`).
    Exactly(Identity),
}

impl ExpectedPeer {
    fn check(&self, found: Option<&Identity>) -> Result<(), rustls::Error> {
        let fits = match (self, found) {
            (ExpectedPeer::Server, Some(Identity::Server(_))) => true,
            (ExpectedPeer::Exactly(wanted), Some(found)) => wanted == found,
            _ => false,
        };
        if fits {
            return Ok(());
        }
        let wanted = match self {
            ExpectedPeer::Server => "an API server".to_owned(),
            ExpectedPeer::Exactly(identity) => identity.to_string(),
        };
        let found = found.map_or_else(|| "no cluster identity".to_owned(), ToString::to_string);
        Err(rustls::Error::General(format!(
            "the peer's certificate is from the cluster CA but names {found}, not {wanted}"
        )))
    }
}

/// Which CA the client trusts.
#[derive(Clone, Debug)]
enum Trust {
    /// The cluster CA's certificate (PEM).
    Ca(String),
    /// The CA in the server's own chain whose SHA-256 is this (joining).
    Pinned(Fingerprint),
}

/// The TLS settings of an API client.
#[derive(Clone, Debug)]
pub struct ClientTls {
    trust: Trust,
    expect: ExpectedPeer,
    certificate: Option<Arc<ClientCertificate>>,
}

impl ClientTls {
    /// Trusts the cluster CA `ca_pem` (and nothing else), and expects an
    /// API server.
    pub fn new(ca_pem: impl Into<String>) -> Self {
        Self {
            trust: Trust::Ca(ca_pem.into()),
            expect: ExpectedPeer::default(),
            certificate: None,
        }
    }

    /// Trusts the CA certificate, sent in the server's own chain, whose
    /// SHA-256 is `ca` (a join token's fingerprint): how a node with no CA
    /// yet reaches the right cluster and no other.
    pub fn pinned(ca: Fingerprint) -> Self {
        Self {
            trust: Trust::Pinned(ca),
            expect: ExpectedPeer::default(),
            certificate: None,
        }
    }

    /// Presents `certificate` when the server asks for one.
    pub fn with_certificate(mut self, certificate: Arc<ClientCertificate>) -> Self {
        self.certificate = Some(certificate);
        self
    }

    /// Expects `peer` instead of an API server.
    pub fn expecting(mut self, peer: ExpectedPeer) -> Self {
        self.expect = peer;
        self
    }

    /// The rustls configuration: TLS 1.2 and 1.3, h2 and http/1.1.
    pub fn rustls_config(&self) -> Result<ClientConfig, ClientTlsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let anchor = match &self.trust {
            Trust::Ca(pem) => Anchor::Ca(webpki(Arc::new(root_store(pem)?), &provider)?),
            Trust::Pinned(fingerprint) => Anchor::Pinned(*fingerprint),
        };
        let verifier = ClusterVerifier {
            anchor,
            expect: self.expect.clone(),
            algorithms: provider.signature_verification_algorithms,
            provider: Arc::clone(&provider),
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| ClientTlsError::Config(error.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier));
        let mut config = match &self.certificate {
            Some(certificate) => builder
                .with_client_cert_resolver(Arc::clone(certificate) as Arc<dyn ResolvesClientCert>),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}

fn root_store(ca_pem: &str) -> Result<RootCertStore, ClientTlsError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|error| ClientTlsError::Pem {
            what: "cluster CA certificate",
            reason: error.to_string(),
        })?;
        roots
            .add(cert)
            .map_err(|error| ClientTlsError::Config(format!("the cluster CA: {error}")))?;
    }
    if roots.is_empty() {
        return Err(ClientTlsError::Pem {
            what: "cluster CA certificate",
            reason: "it holds no certificate".into(),
        });
    }
    Ok(roots)
}

/// rustls's WebPKI check against the cluster CA (or the pinned one), then
/// the identity check of [`ExpectedPeer`].
#[derive(Debug)]
struct ClusterVerifier {
    anchor: Anchor,
    expect: ExpectedPeer,
    algorithms: WebPkiSupportedAlgorithms,
    provider: Arc<CryptoProvider>,
}

#[derive(Debug)]
enum Anchor {
    /// Built once: the cluster CA is known.
    Ca(Arc<WebPkiServerVerifier>),
    /// Built per handshake from the server's chain (a join, once).
    Pinned(Fingerprint),
}

fn webpki(
    roots: Arc<RootCertStore>,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, ClientTlsError> {
    WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(provider))
        .build()
        .map_err(|error| ClientTlsError::Config(format!("the cluster CA: {error}")))
}

impl ClusterVerifier {
    /// The pinned CA among the certificates the server sent.
    fn pinned_roots(
        &self,
        fingerprint: &Fingerprint,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> Result<Arc<RootCertStore>, rustls::Error> {
        let ca = std::iter::once(end_entity)
            .chain(intermediates)
            .find(|cert| Fingerprint::of_der(cert) == *fingerprint)
            .ok_or_else(|| {
                rustls::Error::General(format!(
                    "the server's certificate chain holds no CA with fingerprint {fingerprint}: \
                     this is not the cluster the join token is for"
                ))
            })?;
        let mut roots = RootCertStore::empty();
        roots
            .add(ca.clone().into_owned())
            .map_err(|error| rustls::Error::General(format!("the pinned CA: {error}")))?;
        Ok(Arc::new(roots))
    }
}

impl ServerCertVerifier for ClusterVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let webpki = match &self.anchor {
            Anchor::Ca(webpki) => Arc::clone(webpki),
            Anchor::Pinned(fingerprint) => {
                let roots = self.pinned_roots(fingerprint, end_entity, intermediates)?;
                webpki(roots, &self.provider)
                    .map_err(|error| rustls::Error::General(error.to_string()))?
            }
        };
        webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)?;
        self.expect
            .check(Identity::from_certificate(end_entity).as_ref())?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
