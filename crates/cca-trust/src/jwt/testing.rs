//! A test OIDC issuer (feature `testing`): an ES256 key, the discovery
//! document and JWKS a test serves from its own HTTP server, and tokens
//! signed by it, so login and verification are tested against an issuer
//! the test suite runs itself.

use std::time::{Duration, SystemTime};

use super::{Claims, JwkSet, OidcDiscovery, SigningKey, Verifier, sign};

/// Where the JWKS is served, relative to the issuer URL.
pub const JWKS_PATH: &str = "/jwks.json";

/// An issuer at a URL the test chose, e.g. `http://127.0.0.1:PORT`: serve
/// [`TestIssuer::discovery_document`] at
/// [`OidcDiscovery::url_for`]`(issuer)` and [`TestIssuer::jwks_document`]
/// at `issuer` + [`JWKS_PATH`].
#[derive(Debug)]
pub struct TestIssuer {
    key: SigningKey,
    issuer: String,
}

impl TestIssuer {
    /// An issuer with a fresh key.
    ///
    /// # Panics
    /// When aws-lc cannot generate a key (a broken test machine).
    pub fn new(issuer: impl Into<String>) -> TestIssuer {
        TestIssuer {
            key: SigningKey::generate().expect("aws-lc generates a P-256 key"),
            issuer: issuer.into().trim_end_matches('/').to_owned(),
        }
    }

    /// The issuer URL, as tokens and the discovery document name it.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    pub fn key(&self) -> &SigningKey {
        &self.key
    }

    /// The discovery document's URL.
    pub fn discovery_url(&self) -> String {
        OidcDiscovery::url_for(&self.issuer)
    }

    /// The JWKS document's URL.
    pub fn jwks_uri(&self) -> String {
        format!("{}{JWKS_PATH}", self.issuer)
    }

    /// `/.well-known/openid-configuration`, naming [`TestIssuer::jwks_uri`].
    pub fn discovery_document(&self) -> String {
        serde_json::json!({
            "issuer": self.issuer,
            "jwks_uri": self.jwks_uri(),
            "authorization_endpoint": format!("{}/authorize", self.issuer),
            "token_endpoint": format!("{}/token", self.issuer),
            "id_token_signing_alg_values_supported": ["ES256"],
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
        })
        .to_string()
    }

    /// The JWKS document: the issuer's one public key.
    pub fn jwks_document(&self) -> String {
        self.key.jwk_set().to_json()
    }

    /// Claims for `subject` and `audience`, valid from `now` for `ttl`.
    pub fn claims(&self, subject: &str, audience: &str, now: SystemTime, ttl: Duration) -> Claims {
        Claims::new(self.issuer.clone(), subject, audience, now, ttl)
    }

    /// A signed token for `subject` and `audience`.
    pub fn token(&self, subject: &str, audience: &str, now: SystemTime, ttl: Duration) -> String {
        self.sign(&self.claims(subject, audience, now, ttl))
    }

    /// Signs any claims with the issuer's key.
    pub fn sign(&self, claims: &Claims) -> String {
        sign(&self.key, claims)
    }

    /// A verifier trusting this issuer for `audience`.
    pub fn verifier(&self, audience: &str) -> Verifier {
        Verifier::new(self.keys(), self.issuer.clone(), audience)
    }

    pub fn keys(&self) -> JwkSet {
        self.key.jwk_set()
    }
}
