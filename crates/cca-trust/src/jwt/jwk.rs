//! Public keys as JSON Web Keys (RFC 7517): the set a [`super::Verifier`]
//! checks signatures against, read from our own key or from an OIDC
//! issuer's `jwks_uri` document, and the discovery document that names that
//! URI. Parsing only: the caller fetches the documents (over HTTPS). A set
//! keeps only keys it can verify with — EC P-256 for ES256 and RSA of 2048
//! to 8192 bits for RS256 — and notes every other key with its `kid` and
//! why it was left out, so an operator can see why a token signed with
//! such a key is refused.

use std::fmt;

use aws_lc_rs::digest;
use aws_lc_rs::signature::{
    ECDSA_P256_SHA256_FIXED, ParsedPublicKey, RSA_PKCS1_2048_8192_SHA256, RsaPublicKeyComponents,
};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

use super::Alg;

/// One JSON Web Key, as it is written in a JWKS document. Only the
/// members this crate reads are kept; others are ignored when parsing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jwk {
    /// `EC` or `RSA` (others are skipped).
    pub kty: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kid: Option<String>,
    /// `sig` or `enc`; keys for encryption are skipped.
    #[serde(default, rename = "use", skip_serializing_if = "Option::is_none")]
    pub use_: Option<String>,
    /// The one algorithm the key may be used with, when the issuer says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alg: Option<String>,
    /// EC: the curve (`P-256`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crv: Option<String>,
    /// EC: the point's coordinates, base64url.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub y: Option<String>,
    /// RSA: modulus and public exponent, base64url big-endian.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e: Option<String>,
}

impl Jwk {
    /// The RFC 7638 thumbprint (SHA-256 of the key's required members in
    /// lexicographic order, base64url): what our own keys use as `kid`.
    /// `None` for key types this crate does not know.
    pub fn thumbprint(&self) -> Option<String> {
        // Members are base64url strings: none of them needs JSON escaping,
        // but a foreign key could carry anything, so serialise properly.
        let text = match self.kty.as_str() {
            "EC" => serde_json::json!({
                "crv": self.crv.as_deref()?, "kty": "EC",
                "x": self.x.as_deref()?, "y": self.y.as_deref()?,
            }),
            "RSA" => serde_json::json!({
                "e": self.e.as_deref()?, "kty": "RSA", "n": self.n.as_deref()?,
            }),
            _ => return None,
        };
        // serde_json's Map is a BTreeMap here (no `preserve_order`), so the
        // members come out sorted as RFC 7638 requires.
        let text = text.to_string();
        Some(URL_SAFE_NO_PAD.encode(digest::digest(&digest::SHA256, text.as_bytes())))
    }
}

/// A key a set verifies with: its `kid`, the one algorithm it is used
/// with (from its type, never from a token), and the parsed public key.
#[derive(Clone)]
pub(crate) struct VerifyingKey {
    pub(crate) kid: String,
    pub(crate) alg: Alg,
    pub(crate) key: ParsedPublicKey,
    jwk: Jwk,
}

impl fmt::Debug for VerifyingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifyingKey")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

/// A key a set left out, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedKey {
    /// The key's `kid`, `None` when it had none.
    pub kid: Option<String>,
    pub reason: String,
}

impl fmt::Display for SkippedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kid {
            Some(kid) => write!(f, "key `{kid}` skipped: {}", self.reason),
            None => write!(f, "key without kid skipped: {}", self.reason),
        }
    }
}

/// The keys tokens may be signed with.
#[derive(Clone, Debug, Default)]
pub struct JwkSet {
    keys: Vec<VerifyingKey>,
    skipped: Vec<SkippedKey>,
}

/// Why a JWKS document could not be read at all (single bad keys are
/// skipped instead, see [`JwkSet::skipped`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JwkError {
    #[error(
        "the JWKS document is not a JSON object with a `keys` array ({0}): check the issuer's jwks_uri"
    )]
    NotJwks(String),
}

#[derive(Deserialize)]
struct JwksDocument {
    keys: Vec<serde_json::Value>,
}

impl JwkSet {
    /// Reads a JWKS document (`{"keys": [...]}`). Keys this crate cannot
    /// verify with, or that are malformed, are skipped and noted.
    pub fn from_json(text: &str) -> Result<JwkSet, JwkError> {
        let document: JwksDocument =
            serde_json::from_str(text).map_err(|error| JwkError::NotJwks(error.to_string()))?;
        let mut set = JwkSet::default();
        for value in document.keys {
            let kid = value
                .get("kid")
                .and_then(|kid| kid.as_str())
                .map(str::to_owned);
            match serde_json::from_value::<Jwk>(value) {
                Ok(jwk) => set.insert(jwk),
                Err(error) => set.skipped.push(SkippedKey {
                    kid,
                    reason: format!("not a JSON Web Key ({error})"),
                }),
            }
        }
        Ok(set)
    }

    /// A set of the given keys, skipping those it cannot use.
    pub fn from_keys(keys: impl IntoIterator<Item = Jwk>) -> JwkSet {
        let mut set = JwkSet::default();
        for jwk in keys {
            set.insert(jwk);
        }
        set
    }

    /// Adds a key, or notes why it is skipped. A second key with a `kid`
    /// already present is skipped: a token names one key.
    pub fn insert(&mut self, jwk: Jwk) {
        let kid = jwk.kid.clone();
        match verifying_key(jwk) {
            Ok(key) if self.keys.iter().any(|known| known.kid == key.kid) => {
                self.skipped.push(SkippedKey {
                    kid,
                    reason: "another key of the set has the same kid".into(),
                })
            }
            Ok(key) => self.keys.push(key),
            Err(reason) => self.skipped.push(SkippedKey { kid, reason }),
        }
    }

    /// The kids of the keys tokens may be signed with.
    pub fn key_ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|key| key.kid.as_str())
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The keys left out, each with its kid and why.
    pub fn skipped(&self) -> &[SkippedKey] {
        &self.skipped
    }

    /// The set as a JWKS document, to serve as our own `jwks_uri`.
    pub fn to_json(&self) -> String {
        let keys: Vec<&Jwk> = self.keys.iter().map(|key| &key.jwk).collect();
        serde_json::json!({ "keys": keys }).to_string()
    }

    pub(crate) fn find(&self, kid: &str) -> Option<&VerifyingKey> {
        self.keys.iter().find(|key| key.kid == kid)
    }
}

fn verifying_key(jwk: Jwk) -> Result<VerifyingKey, String> {
    let Some(kid) = jwk.kid.clone() else {
        return Err("it has no kid, and tokens name their key by kid".into());
    };
    if let Some(use_) = jwk.use_.as_deref()
        && use_ != "sig"
    {
        return Err(format!("its use is `{use_}`, not `sig`"));
    }
    let (alg, key) = match jwk.kty.as_str() {
        "EC" => (Alg::Es256, ec_key(&jwk)?),
        "RSA" => (Alg::Rs256, rsa_key(&jwk)?),
        other => {
            return Err(format!(
                "key type `{other}` is not supported (EC P-256 and RSA are)"
            ));
        }
    };
    if let Some(named) = jwk.alg.as_deref()
        && named != alg.name()
    {
        return Err(format!(
            "its alg is `{named}`; only {} is verified with a key of type {}",
            alg.name(),
            jwk.kty
        ));
    }
    Ok(VerifyingKey { kid, alg, key, jwk })
}

fn member(jwk: &Jwk, value: &Option<String>, name: &str) -> Result<Vec<u8>, String> {
    let text = value
        .as_deref()
        .ok_or_else(|| format!("the {} key has no `{name}`", jwk.kty))?;
    URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|_| format!("its `{name}` is not base64url"))
}

fn ec_key(jwk: &Jwk) -> Result<ParsedPublicKey, String> {
    match jwk.crv.as_deref() {
        Some("P-256") => {}
        Some(other) => return Err(format!("curve `{other}` is not supported (P-256 is)")),
        None => return Err("the EC key has no `crv`".into()),
    }
    let x = member(jwk, &jwk.x, "x")?;
    let y = member(jwk, &jwk.y, "y")?;
    if x.len() != 32 || y.len() != 32 {
        return Err("a P-256 point has coordinates of 32 bytes".into());
    }
    let mut point = Vec::with_capacity(65);
    point.push(0x04);
    point.extend_from_slice(&x);
    point.extend_from_slice(&y);
    ParsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, point)
        .map_err(|_| "its point is not on the P-256 curve".into())
}

fn rsa_key(jwk: &Jwk) -> Result<ParsedPublicKey, String> {
    let n = member(jwk, &jwk.n, "n")?;
    let e = member(jwk, &jwk.e, "e")?;
    let bits = n
        .iter()
        .position(|byte| *byte != 0)
        .map_or(0, |first| (n.len() - first) * 8);
    if !(2048..=8192).contains(&bits) {
        return Err(format!(
            "an RSA modulus of {bits} bits is outside 2048 to 8192"
        ));
    }
    let components = RsaPublicKeyComponents {
        n: strip_zeros(&n),
        e: strip_zeros(&e),
    };
    components
        .to_parsed_public_key(&RSA_PKCS1_2048_8192_SHA256)
        .map_err(|_| "its modulus and exponent do not form an RSA key".into())
}

/// aws-lc wants big-endian integers without leading zeros; some issuers
/// pad theirs.
fn strip_zeros(bytes: &[u8]) -> &[u8] {
    let first = bytes
        .iter()
        .position(|byte| *byte != 0)
        .unwrap_or(bytes.len());
    &bytes[first..]
}

/// The part of an OIDC discovery document (`/.well-known/openid-configuration`)
/// login and verification need.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OidcDiscovery {
    pub issuer: String,
    pub jwks_uri: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_authorization_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub id_token_signing_alg_values_supported: Vec<String>,
}

/// Why a discovery document is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    #[error(
        "the OIDC discovery document is not JSON with `issuer` and `jwks_uri` ({0}): check the issuer URL"
    )]
    NotDiscovery(String),
    #[error(
        "the OIDC discovery document names issuer `{found}`, but it was fetched for `{expected}`: OIDC requires them to be equal, check the configured issuer URL"
    )]
    IssuerMismatch { found: String, expected: String },
    #[error(
        "the OIDC issuer's jwks_uri `{0}` is not HTTPS (plain HTTP is accepted only on loopback, for tests)"
    )]
    InsecureJwksUri(String),
}

impl OidcDiscovery {
    /// Where an issuer's discovery document is (OIDC Discovery §4).
    pub fn url_for(issuer: &str) -> String {
        format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        )
    }

    /// Reads a discovery document fetched for `expected_issuer`: its
    /// `issuer` must be that one exactly (else a document could redirect
    /// trust to another issuer), and its `jwks_uri` HTTPS or loopback HTTP.
    pub fn from_json(text: &str, expected_issuer: &str) -> Result<OidcDiscovery, DiscoveryError> {
        let document: OidcDiscovery = serde_json::from_str(text)
            .map_err(|error| DiscoveryError::NotDiscovery(error.to_string()))?;
        if document.issuer != expected_issuer {
            return Err(DiscoveryError::IssuerMismatch {
                found: document.issuer,
                expected: expected_issuer.to_owned(),
            });
        }
        if !secure_uri(&document.jwks_uri) {
            return Err(DiscoveryError::InsecureJwksUri(document.jwks_uri));
        }
        Ok(document)
    }
}

fn secure_uri(uri: &str) -> bool {
    if uri.starts_with("https://") {
        return true;
    }
    let Some(rest) = uri.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
