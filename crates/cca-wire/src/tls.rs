//! HTTPS for the API's clients: the cluster CA is the only root a client
//! trusts (a public CA's certificate for the same name is refused), and a
//! client certificate, when it has one, can be replaced while the client
//! is in use (an agent renewing its node certificate keeps its streams and
//! presents the new certificate from its next connection on).

use std::sync::{Arc, RwLock};

use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, SignatureScheme};

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

/// The TLS settings of an API client.
#[derive(Clone, Debug)]
pub struct ClientTls {
    ca_pem: String,
    certificate: Option<Arc<ClientCertificate>>,
}

impl ClientTls {
    /// Trusts the cluster CA `ca_pem` (and nothing else).
    pub fn new(ca_pem: impl Into<String>) -> Self {
        Self {
            ca_pem: ca_pem.into(),
            certificate: None,
        }
    }

    /// Presents `certificate` when the server asks for one.
    pub fn with_certificate(mut self, certificate: Arc<ClientCertificate>) -> Self {
        self.certificate = Some(certificate);
        self
    }

    /// The rustls configuration: TLS 1.2 and 1.3, h2 and http/1.1.
    pub fn rustls_config(&self) -> Result<ClientConfig, ClientTlsError> {
        let mut roots = RootCertStore::empty();
        let mut any = false;
        for cert in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            let cert = cert.map_err(|error| ClientTlsError::Pem {
                what: "cluster CA certificate",
                reason: error.to_string(),
            })?;
            roots
                .add(cert)
                .map_err(|error| ClientTlsError::Config(format!("the cluster CA: {error}")))?;
            any = true;
        }
        if !any {
            return Err(ClientTlsError::Pem {
                what: "cluster CA certificate",
                reason: "it holds no certificate".into(),
            });
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| ClientTlsError::Config(error.to_string()))?
            .with_root_certificates(roots);
        let mut config = match &self.certificate {
            Some(certificate) => builder
                .with_client_cert_resolver(Arc::clone(certificate) as Arc<dyn ResolvesClientCert>),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}
