//! The clients' side: the cluster CA is the only root a client trusts (a
//! public CA's certificate for the same name is refused), and a client
//! certificate, when it has one, can be replaced while the client is in
//! use (an agent renewing its node certificate keeps its streams and
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

use std::sync::Arc;

use cca_trust::identity::Identity;
use cca_trust::pki::Fingerprint;
use rustls::client::ResolvesClientCert;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::TlsError;
use crate::pem::{Certificate, root_store};

/// Whom one end must find at the other: a client checks the server's
/// certificate against it, a server that requires client certificates
/// (an agent's API) the client's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ExpectedPeer {
    /// An API server (`cca://server/NAME`, any name).
    #[default]
    Server,
    /// Exactly this identity (a node's agent API: `cca://node/NAME`).
    Exactly(Identity),
}

impl ExpectedPeer {
    /// Whether `found` (the identity a verified certificate carries) is
    /// the one expected; if not, what was found instead of what.
    pub(crate) fn check(&self, found: Option<&Identity>) -> Result<(), String> {
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
        Err(format!(
            "the peer's certificate is from the cluster CA but names {found}, not {wanted}"
        ))
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
    certificate: Option<Arc<Certificate>>,
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
    pub fn with_certificate(mut self, certificate: Arc<Certificate>) -> Self {
        self.certificate = Some(certificate);
        self
    }

    /// The cluster CA this client trusts (PEM); `None` while joining,
    /// when it trusts a pinned fingerprint instead.
    pub fn ca_pem(&self) -> Option<&str> {
        match &self.trust {
            Trust::Ca(pem) => Some(pem),
            Trust::Pinned(_) => None,
        }
    }

    /// Expects `peer` instead of an API server.
    pub fn expecting(mut self, peer: ExpectedPeer) -> Self {
        self.expect = peer;
        self
    }

    /// The rustls configuration: TLS 1.2 and 1.3, h2 and http/1.1.
    pub fn rustls_config(&self) -> Result<ClientConfig, TlsError> {
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
            .map_err(|error| TlsError::Config(error.to_string()))?
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
) -> Result<Arc<WebPkiServerVerifier>, TlsError> {
    WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(provider))
        .build()
        .map_err(|error| TlsError::Config(format!("the cluster CA: {error}")))
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
            .check(Identity::from_certificate(end_entity).as_ref())
            .map_err(rustls::Error::General)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_peers_fit_only_their_identity() {
        let server = Identity::Server("s1".into());
        let node = Identity::Node("n1".into());
        let user = Identity::User("admin".into());
        assert_eq!(ExpectedPeer::Server.check(Some(&server)), Ok(()));
        let exactly = ExpectedPeer::Exactly(node.clone());
        assert_eq!(exactly.check(Some(&node)), Ok(()));
        for (expected, found, message) in [
            (
                &ExpectedPeer::Server,
                Some(&node),
                "names node `n1`, not an API server",
            ),
            (
                &ExpectedPeer::Server,
                Some(&user),
                "names user `admin`, not an API server",
            ),
            (
                &ExpectedPeer::Server,
                None,
                "names no cluster identity, not an API server",
            ),
            (
                &exactly,
                Some(&Identity::Node("n2".into())),
                "names node `n2`, not node `n1`",
            ),
            (&exactly, Some(&server), "names server `s1`, not node `n1`"),
        ] {
            let refused = expected.check(found).expect_err("refused");
            assert!(refused.ends_with(message), "{refused}");
        }
    }
}
