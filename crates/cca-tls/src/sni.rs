//! [`HostCertificates`]: a server certificate per host name, chosen by the
//! client's SNI, for a listener serving many sites (a gate node). Names are
//! exact (`shop.example.com`) or one-label wildcards (`*.example.com`
//! matches `a.example.com`, not `a.b.example.com` or `example.com`, as a
//! wildcard certificate does); an exact name wins over a wildcard. The
//! whole set is replaced at once and takes effect at the next handshake.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::TlsError;

/// Certificates by host name; see the module documentation.
#[derive(Debug, Default)]
pub struct HostCertificates {
    current: RwLock<Arc<HashMap<String, Arc<CertifiedKey>>>>,
}

/// One certificate chain and key (PEM) and the host names it serves.
#[derive(Clone, Debug)]
pub struct HostPair<'a> {
    pub hosts: &'a [String],
    pub chain_pem: &'a str,
    pub key_pem: &'a str,
}

impl HostCertificates {
    /// Serves `pairs` from the next handshake on. A pair that does not
    /// parse is left out and returned with its error (the rest are served).
    pub fn replace<'a>(
        &self,
        pairs: impl IntoIterator<Item = HostPair<'a>>,
    ) -> Vec<(HostPair<'a>, TlsError)> {
        let mut hosts = HashMap::new();
        let mut failed = Vec::new();
        for pair in pairs {
            match crate::pem::certified_key(pair.chain_pem, pair.key_pem) {
                Ok(certified) => {
                    for host in pair.hosts {
                        hosts.insert(host.to_ascii_lowercase(), Arc::clone(&certified));
                    }
                }
                Err(error) => failed.push((pair, error)),
            }
        }
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(hosts);
        failed
    }

    /// The certificate for `host` (lowercase), exact or by wildcard.
    pub fn get(&self, host: &str) -> Option<Arc<CertifiedKey>> {
        let hosts = Arc::clone(
            &self
                .current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if let Some(exact) = hosts.get(host) {
            return Some(Arc::clone(exact));
        }
        let (_, parent) = host.split_once('.')?;
        hosts.get(&format!("*.{parent}")).cloned()
    }

    /// How many names have a certificate.
    pub fn len(&self) -> usize {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ResolvesServerCert for HostCertificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name()?.to_ascii_lowercase();
        self.get(&name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(hosts: &[&str]) -> (Vec<String>, String, String) {
        let names: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(names.clone())
            .expect("params")
            .self_signed(&key)
            .expect("self-signed");
        (names, cert.pem(), key.serialize_pem())
    }

    #[test]
    fn exact_names_win_over_wildcards_which_cover_one_label() {
        let certificates = HostCertificates::default();
        let (exact_hosts, exact_chain, exact_key) = pair(&["a.example.com"]);
        let (wild_hosts, wild_chain, wild_key) = pair(&["*.example.com"]);
        let failed = certificates.replace([
            HostPair {
                hosts: &exact_hosts,
                chain_pem: &exact_chain,
                key_pem: &exact_key,
            },
            HostPair {
                hosts: &wild_hosts,
                chain_pem: &wild_chain,
                key_pem: &wild_key,
            },
        ]);
        assert!(failed.is_empty());
        let exact = certificates.get("a.example.com").expect("exact");
        let wild = certificates.get("b.example.com").expect("wildcard");
        assert_ne!(exact.cert[0], wild.cert[0]);
        assert!(certificates.get("a.b.example.com").is_none());
        assert!(certificates.get("example.com").is_none());
    }

    #[test]
    fn a_bad_pair_is_reported_and_the_rest_served() {
        let certificates = HostCertificates::default();
        let (hosts, chain, key) = pair(&["good.example.com"]);
        let bad_hosts = vec!["bad.example.com".to_owned()];
        let failed = certificates.replace([
            HostPair {
                hosts: &hosts,
                chain_pem: &chain,
                key_pem: &key,
            },
            HostPair {
                hosts: &bad_hosts,
                chain_pem: "not pem",
                key_pem: &key,
            },
        ]);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].0.hosts, bad_hosts.as_slice());
        assert!(certificates.get("good.example.com").is_some());
        assert!(certificates.get("bad.example.com").is_none());
    }
}
