//! Identities: who a certificate or a token speaks for. A node acts only
//! as itself, a user as themself, a server as the control plane. In a
//! certificate the identity is one URI subject alternative name,
//! `cca://node/{name}`, `cca://user/{name}` or `cca://server/{name}`
//! (the common name repeats it for people reading `openssl x509`, but only
//! the URI counts): a URI cannot be mistaken for a host name, so a node's
//! certificate can never pass as a server's for TLS host checks, and the
//! kind of principal is part of what the CA signs.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The scheme of identity URIs.
pub const URI_SCHEME: &str = "cca://";

/// Who a certificate or token speaks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", content = "name", rename_all = "lowercase")]
pub enum Identity {
    /// A node's agent: may act only for that node.
    Node(String),
    /// A person or a program acting for one.
    User(String),
    /// A control-plane server.
    Server(String),
}

impl Identity {
    /// The kind as it is spelled in URIs and messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Identity::Node(_) => "node",
            Identity::User(_) => "user",
            Identity::Server(_) => "server",
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Identity::Node(name) | Identity::User(name) | Identity::Server(name) => name,
        }
    }

    /// The identity as a certificate's URI name: `cca://node/n1`.
    pub fn uri(&self) -> String {
        format!("{URI_SCHEME}{}/{}", self.kind(), self.name())
    }

    /// Reads a URI name; `None` for URIs that are not identities.
    pub fn from_uri(uri: &str) -> Option<Identity> {
        let rest = uri.strip_prefix(URI_SCHEME)?;
        let (kind, name) = rest.split_once('/')?;
        check_name(name).ok()?;
        match kind {
            "node" => Some(Identity::Node(name.to_owned())),
            "user" => Some(Identity::User(name.to_owned())),
            "server" => Some(Identity::Server(name.to_owned())),
            _ => None,
        }
    }
}

impl Identity {
    /// The identity a DER certificate carries in its URI names: exactly
    /// one identity URI, or `None` (none, several, or not a certificate).
    /// Only call this on a certificate whose chain was verified: it reads
    /// the names, it does not check who signed them.
    pub fn from_certificate(der: &[u8]) -> Option<Identity> {
        use x509_parser::extensions::GeneralName;
        let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
        let names = certificate.subject_alternative_name().ok()??;
        let mut found = names
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::URI(uri) => Identity::from_uri(uri),
                _ => None,
            });
        let identity = found.next()?;
        found.next().is_none().then_some(identity)
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} `{}`", self.kind(), self.name())
    }
}

/// Why a name cannot be an identity's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{name}` cannot name a node, user or server: {why}")]
pub struct BadName {
    pub name: String,
    pub why: &'static str,
}

/// Names are 1–63 characters of lower-case letters, digits, `-`, `_` and
/// `.`, starting with a letter or digit: they appear in URIs, file names
/// and fact keys, so nothing in them may need escaping. The one rule of
/// users, roles and tenants too (`cca_model::access::check_name`).
pub fn check_name(name: &str) -> Result<(), BadName> {
    cca_model::access::check_name("node, user or server", name).map_err(|bad| BadName {
        name: bad.name,
        why: bad.why,
    })
}

impl FromStr for Identity {
    type Err = String;

    /// `node:n1`, `user:alice`, `server:s1`, or the URI form.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if let Some(identity) = Identity::from_uri(text) {
            return Ok(identity);
        }
        let (kind, name) = text.split_once(':').ok_or_else(|| {
            format!("`{text}` is not an identity: write node:NAME, user:NAME or server:NAME")
        })?;
        check_name(name).map_err(|error| error.to_string())?;
        match kind {
            "node" => Ok(Identity::Node(name.to_owned())),
            "user" => Ok(Identity::User(name.to_owned())),
            "server" => Ok(Identity::Server(name.to_owned())),
            other => Err(format!(
                "`{other}` is not a kind of identity: node, user or server"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_round_trip_through_their_uri() {
        for identity in [
            Identity::Node("n1".into()),
            Identity::User("alice.b".into()),
            Identity::Server("cp-0".into()),
        ] {
            assert_eq!(Identity::from_uri(&identity.uri()), Some(identity.clone()));
            assert_eq!(identity.uri().parse::<Identity>(), Ok(identity.clone()));
        }
        assert_eq!(
            "node:n1".parse::<Identity>(),
            Ok(Identity::Node("n1".into()))
        );
    }

    fn certificate_with(uris: &[&str]) -> Vec<u8> {
        let mut params =
            rcgen::CertificateParams::new(vec!["n1.example".to_owned()]).expect("params");
        for uri in uris {
            let uri = rcgen::string::Ia5String::try_from(uri.to_string()).expect("ia5");
            params.subject_alt_names.push(rcgen::SanType::URI(uri));
        }
        let key = rcgen::KeyPair::generate().expect("key");
        params.self_signed(&key).expect("signs").der().to_vec()
    }

    #[test]
    fn a_certificate_carries_exactly_one_identity_uri() {
        assert_eq!(
            Identity::from_certificate(&certificate_with(&["cca://node/n1"])),
            Some(Identity::Node("n1".into()))
        );
        assert_eq!(
            Identity::from_certificate(&certificate_with(&[
                "https://example.org/x",
                "cca://user/al"
            ])),
            Some(Identity::User("al".into())),
            "other URIs are not identities"
        );
        assert_eq!(Identity::from_certificate(&certificate_with(&[])), None);
        assert_eq!(
            Identity::from_certificate(&certificate_with(&["cca://node/n1", "cca://node/n2"])),
            None,
            "two identities are none"
        );
        assert_eq!(Identity::from_certificate(b"not der"), None);
    }

    #[test]
    fn foreign_or_malformed_names_are_no_identity() {
        for uri in [
            "https://node/n1",
            "cca://pod/n1",
            "cca://node/",
            "cca://node/N1",
            "cca://node/a/b",
            "cca://node/-x",
        ] {
            assert_eq!(Identity::from_uri(uri), None, "{uri}");
        }
        let error = "robot:r2".parse::<Identity>().expect_err("unknown kind");
        assert!(error.contains("`robot`"), "{error}");
        let error = "node:Big".parse::<Identity>().expect_err("upper case");
        assert!(error.contains("lower-case"), "{error}");
        assert!(check_name(&"a".repeat(64)).is_err());
    }
}
