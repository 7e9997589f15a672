//! Certificates and CAs from PEM: the replaceable [`Certificate`] both
//! ends present, and the root store of the cluster CA both ends trust.

use std::sync::{Arc, RwLock};

use rustls::RootCertStore;
use rustls::SignatureScheme;
use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::TlsError;

/// A certificate chain and its key, swappable while in use: what a
/// server serves and what a client presents (the same holder may do both,
/// as the API server's does). A replacement takes effect at the next
/// handshake; open connections keep the one they started with. Empty
/// (the default) it presents nothing.
#[derive(Debug, Default)]
pub struct Certificate {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl Certificate {
    /// The chain (the leaf first; a server's then carries the CA, so a
    /// joining node can check it against its token's fingerprint) and its
    /// key.
    pub fn from_pem(chain_pem: &str, key_pem: &str) -> Result<Self, TlsError> {
        let holder = Self::default();
        holder.replace(chain_pem, key_pem)?;
        Ok(holder)
    }

    /// Presents `chain_pem` with `key_pem` from the next handshake on.
    pub fn replace(&self, chain_pem: &str, key_pem: &str) -> Result<(), TlsError> {
        let next = certified_key(chain_pem, key_pem)?;
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(next);
        Ok(())
    }

    /// The certificate presented now (the chain's first), DER; `None`
    /// while empty.
    pub fn leaf(&self) -> Option<CertificateDer<'static>> {
        self.current()
            .and_then(|certified| certified.cert.first().cloned())
    }

    fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

impl ResolvesClientCert for Certificate {
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

pub(crate) fn certified_key(chain_pem: &str, key_pem: &str) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|error| TlsError::Pem {
            what: "certificate chain",
            reason: error.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Pem {
            what: "certificate chain",
            reason: "it holds no certificate".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|error| TlsError::Pem {
        what: "private key",
        reason: error.to_string(),
    })?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let certified = CertifiedKey::from_der(chain, key, &provider)
        .map_err(|error| TlsError::KeyMismatch(error.to_string()))?;
    Ok(Arc::new(certified))
}

/// The cluster CA as the only root: every certificate in `ca_pem`, and
/// at least one.
pub(crate) fn root_store(ca_pem: &str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|error| TlsError::Pem {
            what: "cluster CA certificate",
            reason: error.to_string(),
        })?;
        roots
            .add(cert)
            .map_err(|error| TlsError::Config(format!("the cluster CA: {error}")))?;
    }
    if roots.is_empty() {
        return Err(TlsError::Pem {
            what: "cluster CA certificate",
            reason: "it holds no certificate".into(),
        });
    }
    Ok(roots)
}
