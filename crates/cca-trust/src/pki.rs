//! The cluster PKI: one self-signed CA per cluster ([`ClusterCa`]) that
//! issues every certificate the cluster's TLS uses, and the reading of
//! certificates back ([`CertInfo`]). Keys are ECDSA P-256 made by
//! aws-lc-rs through rcgen; everything goes in and out as PEM and no file
//! is touched here (callers write keys 0600). Two ways to get a
//! certificate: [`ClusterCa::issue`] makes the key too (the server's own
//! certificate and the local admin's, which `cca init` writes next to the
//! CA), and [`ClusterCa::sign_csr`] signs a key it never sees (enrolment:
//! the node keeps its private key, [`csr`] makes its request). In both the
//! CA, not the requester, decides the identity, the host names, the
//! lifetime and the usages; a request that asks for more than the caller
//! allows is refused, never trimmed, so the refusal can be audited.
//! Handshakes are verified by rustls/webpki with the CA as the only root;
//! [`verify_issued`] is for pre-flight checks and renewal, outside TLS.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber, SubjectPublicKeyInfo,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateSigningRequestDer};
use serde::{Deserialize, Serialize};
use x509_parser::certificate::X509Certificate;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

use crate::identity::{BadName, Identity, check_name};

/// How long a new cluster CA is valid: ten years. Replacing a CA means
/// re-enrolling every node, so it should outlive the cluster's hardware;
/// its key never leaves the server's config directory.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// A node's certificate: 24 hours. Nodes renew by themselves at two thirds
/// of the life ([`CertInfo::renew_at`]), so a short life costs nothing
/// and bounds how long a stolen node key is worth anything.
pub const NODE_CERT_VALIDITY: Duration = Duration::from_secs(24 * 3600);

/// The server's own certificate: one year. It is renewed by the operator
/// on the server itself (no enrolment round trip), so it is long enough
/// not to be a chore and short enough that a forgotten key expires.
pub const SERVER_CERT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// A user's client certificate (the local admin's that `cca init` writes):
/// one year, like the server's, for the same reason: nobody renews it
/// automatically.
pub const USER_CERT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// How far before `now` a certificate's validity starts, so that a
/// machine whose clock is a little behind the CA's accepts it at once.
pub const CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

/// The default life of a certificate for `identity`.
pub fn default_validity(identity: &Identity) -> Duration {
    match identity {
        Identity::Node(_) => NODE_CERT_VALIDITY,
        Identity::Server(_) => SERVER_CERT_VALIDITY,
        Identity::User(_) => USER_CERT_VALIDITY,
    }
}

/// What went wrong making, loading, signing or reading a certificate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what} is not readable: {why}")]
    Unreadable { what: &'static str, why: String },
    #[error("could not {what}: {source}")]
    Crypto {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error(transparent)]
    BadName(#[from] BadName),
    #[error("`{name}` cannot be a host name in a certificate: {why}")]
    BadHostName { name: String, why: &'static str },
    #[error(
        "the key does not belong to the certificate `{subject}`: give the key file written with that certificate"
    )]
    KeyMismatch { subject: String },
    #[error(
        "the certificate `{subject}` is not a CA certificate (no CA:true basic constraint or no certificate-signing key usage): give the cluster CA's certificate"
    )]
    NotCa { subject: String },
    #[error(
        "the certificate `{subject}` is not signed by the CA {ca}: it belongs to another cluster or was tampered with"
    )]
    NotIssuedBy { subject: String, ca: Fingerprint },
    #[error(
        "the certificate `{subject}` expired at {at}: renew it (a node re-enrols with a new join token)"
    )]
    Expired { subject: String, at: String },
    #[error("the certificate `{subject}` is valid only from {at}: check this machine's clock")]
    NotYetValid { subject: String, at: String },
    #[error(
        "a {kind} certificate carries no host names (asked for {names}): only nodes and servers serve TLS"
    )]
    HostNamesForbidden { kind: &'static str, names: Names },
    #[error("a certificate cannot be valid for {validity:?} from {from}: pick a shorter validity")]
    Validity { validity: Duration, from: String },
    #[error("could not draw a random serial number from the system: retry")]
    Random,
    #[error(
        "the CSR's signature does not verify: it was altered or not signed by the key it carries"
    )]
    CsrSignature,
    #[error("the CSR asks for {asked} but this enrolment is for {expected}")]
    CsrIdentity { asked: String, expected: String },
    #[error("the CSR asks for {asked}, not among the names allowed for {identity} ({allowed})")]
    CsrNames {
        identity: String,
        asked: String,
        allowed: Names,
    },
    #[error("the CSR's key is {algorithm}: send an ECDSA P-256 or P-384 or an Ed25519 key")]
    CsrKey { algorithm: String },
    #[error("`{name}` cannot be a host in a gate's certificate: {why}")]
    BadGateHost { name: String, why: &'static str },
    #[error("the CSR must name exactly the gate's hosts ({hosts}), nothing else: {problem}")]
    CsrGateHosts { hosts: Names, problem: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn crypto(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |source| Error::Crypto { what, source }
}

pub(crate) fn unreadable(what: &'static str, why: impl fmt::Display) -> Error {
    Error::Unreadable {
        what,
        why: why.to_string(),
    }
}

fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

/// SHA-256 of a certificate's DER: how a join token names the CA a node
/// must find before it sends anything secret. Compares in constant time.
#[derive(Clone, Copy)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of a DER-encoded certificate.
    pub fn of_der(der: &[u8]) -> Fingerprint {
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, der);
        let mut bytes = [0; 32];
        bytes.copy_from_slice(digest.as_ref());
        Fingerprint(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl PartialEq for Fingerprint {
    fn eq(&self, other: &Fingerprint) -> bool {
        aws_lc_rs::constant_time::verify_slices_are_equal(&self.0, &other.0).is_ok()
    }
}

impl Eq for Fingerprint {}

impl std::hash::Hash for Fingerprint {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// Why text is not a fingerprint.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a SHA-256 fingerprint: {why}")]
pub struct BadFingerprint {
    pub why: &'static str,
}

impl FromStr for Fingerprint {
    type Err = BadFingerprint;

    /// 64 hexadecimal digits in either case, with or without the colons
    /// `openssl x509 -fingerprint -sha256` puts between bytes.
    fn from_str(text: &str) -> Result<Fingerprint, BadFingerprint> {
        let digits: Vec<u8> = if text.len() == 95 && text.contains(':') {
            text.bytes().filter(|&b| b != b':').collect()
        } else {
            text.bytes().collect()
        };
        if digits.len() != 64 {
            return Err(BadFingerprint {
                why: "a fingerprint has 64 hexadecimal digits",
            });
        }
        let mut bytes = [0; 32];
        for (byte, pair) in bytes.iter_mut().zip(digits.chunks(2)) {
            let high = hex_value(pair[0]);
            let low = hex_value(pair[1]);
            match (high, low) {
                (Some(high), Some(low)) => *byte = high << 4 | low,
                _ => {
                    return Err(BadFingerprint {
                        why: "use the digits 0-9 and a-f only",
                    });
                }
            }
        }
        Ok(Fingerprint(bytes))
    }
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Fingerprint {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The host names a certificate serves TLS for, besides its identity.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Names {
    /// DNS names, lower case, no wildcards.
    #[serde(default)]
    pub dns: Vec<String>,
    #[serde(default)]
    pub ips: Vec<IpAddr>,
}

impl Names {
    /// No host names: a client-only certificate.
    pub fn none() -> Names {
        Names::default()
    }

    /// Sorts hosts into IP addresses and DNS names and checks the names.
    pub fn from_hosts<S: AsRef<str>>(hosts: impl IntoIterator<Item = S>) -> Result<Names> {
        let mut names = Names::none();
        for host in hosts {
            let host = host.as_ref();
            match host.parse::<IpAddr>() {
                Ok(ip) => names.ips.push(ip),
                Err(_) => names.dns.push(host.to_ascii_lowercase()),
            }
        }
        names.check()?;
        Ok(names)
    }

    pub fn is_empty(&self) -> bool {
        self.dns.is_empty() && self.ips.is_empty()
    }

    /// Whether every name of `self` is among `allowed`'s.
    pub fn within(&self, allowed: &Names) -> bool {
        self.outside(allowed).is_empty()
    }

    /// The names of `self` that `allowed` does not have (DNS names
    /// compared without regard to case, as DNS does).
    pub fn outside(&self, allowed: &Names) -> Names {
        Names {
            dns: self
                .dns
                .iter()
                .filter(|name| !allowed.dns.iter().any(|ok| ok.eq_ignore_ascii_case(name)))
                .cloned()
                .collect(),
            ips: self
                .ips
                .iter()
                .filter(|ip| !allowed.ips.contains(ip))
                .copied()
                .collect(),
        }
    }

    fn check(&self) -> Result<()> {
        self.dns.iter().try_for_each(|name| check_dns_name(name))
    }

    fn sans(&self) -> Result<Vec<SanType>> {
        self.check()?;
        let mut sans = Vec::with_capacity(self.dns.len() + self.ips.len());
        for name in &self.dns {
            let name = name
                .to_ascii_lowercase()
                .try_into()
                .map_err(crypto("encode a DNS name"))?;
            sans.push(SanType::DnsName(name));
        }
        sans.extend(self.ips.iter().copied().map(SanType::IpAddress));
        Ok(sans)
    }
}

impl fmt::Display for Names {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("no host names");
        }
        let names: Vec<String> = self
            .dns
            .iter()
            .map(|name| format!("`{name}`"))
            .chain(self.ips.iter().map(|ip| format!("`{ip}`")))
            .collect();
        f.write_str(&names.join(", "))
    }
}

/// Host names are what rustls matches server names against: letters,
/// digits, `-` and `.` in labels of 1–63 characters, 253 in all. No
/// wildcards: every certificate here names exact hosts.
fn check_dns_name(name: &str) -> Result<()> {
    let bad = |why| {
        Err(Error::BadHostName {
            name: name.to_owned(),
            why,
        })
    };
    if name.is_empty() || name.len() > 253 {
        return bad("a host name has 1 to 253 characters");
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return bad("each dot-separated label has 1 to 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return bad("use letters, digits, `-` and `.` only (no wildcards)");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("a label neither starts nor ends with `-`");
        }
    }
    Ok(())
}

/// A certificate to issue with a key made here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issue {
    pub identity: Identity,
    /// Host names to serve TLS for; only nodes and servers may have any.
    pub names: Names,
    pub validity: Duration,
}

impl Issue {
    /// A certificate for `identity` valid for its kind's default life.
    pub fn new(identity: Identity, names: Names) -> Issue {
        let validity = default_validity(&identity);
        Issue {
            identity,
            names,
            validity,
        }
    }

    pub fn valid_for(self, validity: Duration) -> Issue {
        Issue { validity, ..self }
    }
}

/// A certificate and its private key, both PEM. `Debug` hides the key.
#[derive(Clone, PartialEq, Eq)]
pub struct CertAndKey {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for CertAndKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertAndKey")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"[hidden]")
            .finish()
    }
}

/// A certificate signing request and the private key it was made with,
/// both PEM: the requester keeps the key and sends the CSR. `Debug` hides
/// the key.
#[derive(Clone, PartialEq, Eq)]
pub struct CsrAndKey {
    pub csr_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for CsrAndKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CsrAndKey")
            .field("csr_pem", &self.csr_pem)
            .field("key_pem", &"[hidden]")
            .finish()
    }
}

/// Makes a new P-256 key and a CSR asking for `identity` and `names`:
/// what an enrolling node sends. The CA decides everything else.
pub fn csr(identity: &Identity, names: &Names) -> Result<CsrAndKey> {
    check_name(identity.name())?;
    let key = new_key()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = common_name(&identity.uri());
    params.subject_alt_names = identity_sans(identity, names)?;
    let request = params
        .serialize_request(&key)
        .map_err(crypto("sign the certificate request"))?;
    let csr_pem = request
        .pem()
        .map_err(crypto("encode the certificate request"))?;
    Ok(CsrAndKey {
        csr_pem,
        key_pem: key.serialize_pem(),
    })
}

/// The cluster's certificate authority: its certificate, its key, and
/// what it takes to sign with them. `Debug` shows the fingerprint only.
pub struct ClusterCa {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    info: CertInfo,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterCa")
            .field("subject", &self.info.subject)
            .field("fingerprint", &self.info.fingerprint)
            .finish_non_exhaustive()
    }
}

impl ClusterCa {
    /// A new CA for the cluster `cluster` (a name like a node's), valid
    /// from a little before `now` for `validity` ([`CA_VALIDITY`] unless
    /// a test wants otherwise). Basic constraints CA:true with path
    /// length 0: it signs end certificates only, never another CA.
    pub fn generate(cluster: &str, now: SystemTime, validity: Duration) -> Result<ClusterCa> {
        check_name(cluster)?;
        let key = new_key()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = {
            let mut name = DistinguishedName::new();
            name.push(DnType::OrganizationName, "CCattler");
            name.push(DnType::CommonName, format!("cca cluster {cluster} CA"));
            name
        };
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.serial_number = Some(random_serial()?);
        set_validity(&mut params, now, validity, None)?;
        let cert = params
            .self_signed(&key)
            .map_err(crypto("sign the CA certificate"))?;
        ClusterCa::from_parts(cert.pem(), cert.der().clone(), key)
    }

    /// The CA `cca init` wrote: checks that the certificate is a CA's and
    /// signed by itself, and that the key is its key.
    pub fn load(cert_pem: &str, key_pem: &str) -> Result<ClusterCa> {
        let der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|error| unreadable("the CA certificate (PEM)", error))?;
        let key = KeyPair::from_pem(key_pem)
            .map_err(|error| unreadable("the CA key (PEM, PKCS#8)", error))?;
        ClusterCa::from_parts(cert_pem.to_owned(), der, key)
    }

    fn from_parts(
        cert_pem: String,
        der: CertificateDer<'static>,
        key: KeyPair,
    ) -> Result<ClusterCa> {
        let (_, cert) = X509Certificate::from_der(&der)
            .map_err(|error| unreadable("the CA certificate (X.509)", error))?;
        let info = CertInfo::from_x509(&cert, &der)?;
        if !is_signing_ca(&cert) {
            return Err(Error::NotCa {
                subject: info.subject,
            });
        }
        if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            return Err(Error::KeyMismatch {
                subject: info.subject,
            });
        }
        if cert.verify_signature(None).is_err() {
            return Err(Error::NotIssuedBy {
                subject: info.subject,
                ca: info.fingerprint,
            });
        }
        let issuer =
            Issuer::from_ca_cert_der(&der, key).map_err(crypto("read the CA certificate"))?;
        Ok(ClusterCa {
            cert_pem,
            cert_der: der,
            info,
            issuer,
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The certificate as DER, for a rustls root store.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// The private key as PEM (PKCS#8): write it 0600.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    pub fn fingerprint(&self) -> Fingerprint {
        self.info.fingerprint
    }

    pub fn info(&self) -> &CertInfo {
        &self.info
    }

    /// What signs: for the other kinds of certificate this crate makes
    /// (`gate`).
    pub(crate) fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.issuer
    }

    /// Makes a key and a certificate for `request`: for the server's own
    /// certificate and the local admin's, which never leave the machine
    /// the CA is on.
    pub fn issue(&self, request: &Issue, now: SystemTime) -> Result<CertAndKey> {
        let key = new_key()?;
        let cert_pem = self.sign(
            &key,
            &request.identity,
            &request.names,
            request.validity,
            now,
        )?;
        Ok(CertAndKey {
            cert_pem,
            key_pem: key.serialize_pem(),
        })
    }

    /// A new certificate for the key, identity and host names of
    /// `cert_pem` (one this CA issued), valid from `now` for its kind's
    /// default life: the server renewing its own certificate. The key
    /// stays, so only the certificate file changes and a renewal is one
    /// atomic write (a crash never pairs a new key with an old
    /// certificate). Refused for a certificate this CA did not issue or
    /// one that names no identity.
    pub fn reissue(&self, cert_pem: &str, now: SystemTime) -> Result<String> {
        let der = certificate_der(cert_pem.as_bytes())?;
        let (_, cert) = X509Certificate::from_der(&der)
            .map_err(|error| unreadable("the certificate (X.509)", error))?;
        let info = CertInfo::from_x509(&cert, &der)?;
        let (_, ca) = X509Certificate::from_der(&self.cert_der)
            .map_err(|error| unreadable("the CA certificate (X.509)", error))?;
        if cert.issuer().as_raw() != ca.subject().as_raw()
            || cert.verify_signature(Some(ca.public_key())).is_err()
        {
            return Err(Error::NotIssuedBy {
                subject: info.subject,
                ca: self.fingerprint(),
            });
        }
        let identity = info.identity.clone().ok_or_else(|| {
            unreadable(
                "the certificate to renew",
                "it names no identity (`cca://…`)",
            )
        })?;
        let spki = cert.public_key();
        let public_key = SubjectPublicKeyInfo::from_der(spki.raw).map_err(|_| Error::CsrKey {
            algorithm: spki.algorithm.algorithm.to_id_string(),
        })?;
        self.sign(
            &public_key,
            &identity,
            &info.names,
            default_validity(&identity),
            now,
        )
    }

    /// Signs an enrolling node's CSR after checking it: its signature must
    /// verify, it must ask for `expected`'s identity URI and no other, and
    /// its host names must be among `allowed` (the caller decides which a
    /// node may serve). A CSR asking for anything else is refused whole.
    /// The CSR's subject, key usages, basic constraints and any other
    /// extension are ignored: the CA sets them.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        expected: &Identity,
        allowed: &Names,
        validity: Duration,
        now: SystemTime,
    ) -> Result<String> {
        let der = CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes())
            .map_err(|error| unreadable("the CSR (PEM)", error))?;
        let (_, request) = X509CertificationRequest::from_der(&der)
            .map_err(|error| unreadable("the CSR (PKCS#10)", error))?;
        // The key's kind first: a key the signature check does not know
        // would otherwise be reported as a bad signature.
        let spki = &request.certification_request_info.subject_pki;
        check_csr_key(spki)?;
        request
            .verify_signature()
            .map_err(|_| Error::CsrSignature)?;
        let asked = requested_names(&request);
        let expected_uri = expected.uri();
        if asked.uris.len() != 1 || asked.uris[0] != expected_uri {
            let asked = match asked.uris.as_slice() {
                [] => "no identity".to_owned(),
                uris => uris
                    .iter()
                    .map(|uri| format!("`{uri}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            return Err(Error::CsrIdentity {
                asked,
                expected: format!("`{expected_uri}`"),
            });
        }
        let outside = asked.names.outside(allowed);
        if !asked.others.is_empty() || !outside.is_empty() {
            let mut refused = asked.others;
            if !outside.is_empty() {
                refused.push(outside.to_string());
            }
            return Err(Error::CsrNames {
                identity: expected.to_string(),
                asked: refused.join(", "),
                allowed: allowed.clone(),
            });
        }
        let public_key = SubjectPublicKeyInfo::from_der(spki.raw).map_err(|_| Error::CsrKey {
            algorithm: spki.algorithm.algorithm.to_id_string(),
        })?;
        self.sign(&public_key, expected, &asked.names, validity, now)
    }

    /// The one place certificates are made: the identity's URI, its
    /// common name, the usages its kind needs, a random serial, and a
    /// validity from a little before `now` that never outlives the CA.
    fn sign(
        &self,
        public_key: &impl rcgen::PublicKeyData,
        identity: &Identity,
        names: &Names,
        validity: Duration,
        now: SystemTime,
    ) -> Result<String> {
        check_name(identity.name())?;
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name(&identity.uri());
        params.subject_alt_names = identity_sans(identity, names)?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = extended_key_usages(identity, names);
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial()?);
        set_validity(&mut params, now, validity, Some(self.info.not_after))?;
        let cert = params
            .signed_by(public_key, &self.issuer)
            .map_err(crypto("sign the certificate"))?;
        Ok(cert.pem())
    }
}

/// Every certificate authenticates a client (nodes and servers call each
/// other, users call the API); those with host names, and servers,
/// also serve TLS.
fn extended_key_usages(identity: &Identity, names: &Names) -> Vec<ExtendedKeyUsagePurpose> {
    let mut usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    if matches!(identity, Identity::Server(_)) || !names.is_empty() {
        usages.insert(0, ExtendedKeyUsagePurpose::ServerAuth);
    }
    usages
}

fn identity_sans(identity: &Identity, names: &Names) -> Result<Vec<SanType>> {
    if matches!(identity, Identity::User(_)) && !names.is_empty() {
        return Err(Error::HostNamesForbidden {
            kind: identity.kind(),
            names: names.clone(),
        });
    }
    let uri = identity
        .uri()
        .try_into()
        .map_err(crypto("encode the identity URI"))?;
    let mut sans = vec![SanType::URI(uri)];
    sans.extend(names.sans()?);
    Ok(sans)
}

pub(crate) fn common_name(text: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, text);
    name
}

pub(crate) fn new_key() -> Result<KeyPair> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(crypto("make a P-256 key"))
}

/// 128 random bits, read as a positive integer (DER adds the sign byte).
pub(crate) fn random_serial() -> Result<SerialNumber> {
    let mut bytes = [0u8; 16];
    aws_lc_rs::rand::fill(&mut bytes).map_err(|_| Error::Random)?;
    // A zero serial is not allowed; one in 2^128, but cheap to rule out.
    bytes[0] |= u8::from(bytes.iter().all(|&b| b == 0));
    Ok(SerialNumber::from_slice(&bytes))
}

/// The latest instant rcgen's time type and X.509's GeneralizedTime both
/// hold comfortably: far past any sensible validity.
const LATEST: Duration = Duration::from_secs(253_402_214_400 - 86_400); // 9999-12-30

/// Sets `params`' validity: from a little before `now` (clock skew)
/// for `validity`, never past `cap`.
pub(crate) fn set_validity(
    params: &mut CertificateParams,
    now: SystemTime,
    validity: Duration,
    cap: Option<SystemTime>,
) -> Result<()> {
    let too_long = || Error::Validity {
        validity,
        from: rfc3339(now),
    };
    let from = now.checked_sub(CLOCK_SKEW).unwrap_or(now).max(UNIX_EPOCH);
    let mut until = now.checked_add(validity).ok_or_else(too_long)?;
    if let Some(cap) = cap {
        until = until.min(cap);
    }
    let from = from.duration_since(UNIX_EPOCH).unwrap_or_default();
    let until = until.duration_since(UNIX_EPOCH).map_err(|_| too_long())?;
    if until > LATEST || until <= from {
        return Err(too_long());
    }
    // rcgen's times are `time::OffsetDateTime`; adding to its epoch keeps
    // `time` out of this crate's dependencies.
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + from;
    params.not_after = epoch + until;
    Ok(())
}

fn is_signing_ca(cert: &X509Certificate<'_>) -> bool {
    let ca = matches!(cert.basic_constraints(), Ok(Some(bc)) if bc.value.ca);
    let signs = match cert.key_usage() {
        Ok(Some(usage)) => usage.value.key_cert_sign(),
        Ok(None) => true,
        Err(_) => false,
    };
    ca && signs
}

pub(crate) struct Requested {
    pub(crate) uris: Vec<String>,
    pub(crate) names: Names,
    /// Names of kinds no certificate here carries (e-mail, directory ...).
    pub(crate) others: Vec<String>,
}

pub(crate) fn requested_names(request: &X509CertificationRequest<'_>) -> Requested {
    let mut requested = Requested {
        uris: Vec::new(),
        names: Names::none(),
        others: Vec::new(),
    };
    for extension in request.requested_extensions().into_iter().flatten() {
        let ParsedExtension::SubjectAlternativeName(san) = extension else {
            continue;
        };
        for name in &san.general_names {
            match name {
                GeneralName::URI(uri) => requested.uris.push((*uri).to_owned()),
                GeneralName::DNSName(dns) => requested.names.dns.push((*dns).to_owned()),
                GeneralName::IPAddress(bytes) => match ip_from_bytes(bytes) {
                    Some(ip) => requested.names.ips.push(ip),
                    None => requested.others.push("a malformed IP address".to_owned()),
                },
                other => requested.others.push(format!("the name {other}")),
            }
        }
    }
    requested
}

/// The DNS names and IP addresses a CSR (PEM) asks for, read without
/// checking its signature (`ClusterCa::sign_csr` checks everything): what
/// a caller needs to decide which names to allow.
pub fn csr_names(csr_pem: &str) -> Result<Names> {
    let der = CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes())
        .map_err(|error| unreadable("the CSR (PEM)", error))?;
    let (_, request) = X509CertificationRequest::from_der(&der)
        .map_err(|error| unreadable("the CSR (PKCS#10)", error))?;
    Ok(requested_names(&request).names)
}

/// The keys rustls signs handshakes with and webpki verifies: ECDSA on
/// P-256 or P-384, or Ed25519. No RSA: nothing here makes RSA keys, and
/// refusing it rules out weak sizes without measuring them.
pub(crate) fn check_csr_key(spki: &x509_parser::x509::SubjectPublicKeyInfo<'_>) -> Result<()> {
    use x509_parser::oid_registry::{
        OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_SIG_ED25519,
    };
    let algorithm = &spki.algorithm;
    let curve = algorithm
        .parameters
        .as_ref()
        .and_then(|parameters| parameters.as_oid().ok());
    let supported = if algorithm.algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY {
        curve
            .as_ref()
            .is_some_and(|curve| *curve == OID_EC_P256 || *curve == OID_NIST_EC_P384)
    } else {
        algorithm.algorithm == OID_SIG_ED25519
    };
    if supported {
        return Ok(());
    }
    let mut name = algorithm.algorithm.to_id_string();
    if let Some(curve) = curve {
        name = format!("{name} on curve {}", curve.to_id_string());
    }
    Err(Error::CsrKey { algorithm: name })
}

fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        return Some(IpAddr::from(v4));
    }
    <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from)
}

/// What a certificate says, read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// The identity of its one identity URI name
    /// ([`Identity::from_certificate`]); `None` for the CA and for
    /// certificates not made here.
    pub identity: Option<Identity>,
    /// The subject's common name.
    pub subject: String,
    pub names: Names,
    pub is_ca: bool,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// The serial number in lower-case hex.
    pub serial: String,
    /// SHA-256 of this certificate's DER.
    pub fingerprint: Fingerprint,
}

impl CertInfo {
    /// Reads one certificate, PEM (the first `CERTIFICATE` block) or DER.
    pub fn parse(pem_or_der: impl AsRef<[u8]>) -> Result<CertInfo> {
        let der = certificate_der(pem_or_der.as_ref())?;
        let (_, cert) = X509Certificate::from_der(&der)
            .map_err(|error| unreadable("the certificate (X.509)", error))?;
        CertInfo::from_x509(&cert, &der)
    }

    fn from_x509(cert: &X509Certificate<'_>, der: &[u8]) -> Result<CertInfo> {
        let mut names = Names::none();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(dns) => names.dns.push((*dns).to_owned()),
                    GeneralName::IPAddress(bytes) => names.ips.extend(ip_from_bytes(bytes)),
                    _ => {}
                }
            }
        }
        let subject = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned)
            .unwrap_or_else(|| cert.subject().to_string());
        let time = |at: x509_parser::time::ASN1Time| {
            u64::try_from(at.timestamp())
                .map(|secs| UNIX_EPOCH + Duration::from_secs(secs))
                .map_err(|_| unreadable("the certificate's validity", "it starts before 1970"))
        };
        Ok(CertInfo {
            identity: Identity::from_certificate(der),
            names,
            is_ca: cert.is_ca(),
            not_before: time(cert.validity().not_before)?,
            not_after: time(cert.validity().not_after)?,
            serial: cert
                .raw_serial()
                .iter()
                .skip_while(|&&b| b == 0)
                .map(|b| format!("{b:02x}"))
                .collect(),
            fingerprint: Fingerprint::of_der(der),
            subject,
        })
    }

    /// When to renew: two thirds into the certificate's life, which
    /// leaves a third (8 hours of a node's 24) to ride out an outage of
    /// the control plane.
    pub fn renew_at(&self) -> SystemTime {
        let life = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        self.not_before + life * 2 / 3
    }

    /// Whether `now` is within the validity.
    pub fn check_valid_at(&self, now: SystemTime) -> Result<()> {
        if now < self.not_before {
            return Err(Error::NotYetValid {
                subject: self.subject.clone(),
                at: rfc3339(self.not_before),
            });
        }
        if now > self.not_after {
            return Err(Error::Expired {
                subject: self.subject.clone(),
                at: rfc3339(self.not_after),
            });
        }
        Ok(())
    }
}

fn certificate_der(bytes: &[u8]) -> Result<CertificateDer<'static>> {
    if bytes.trim_ascii_start().starts_with(b"-----BEGIN") {
        CertificateDer::from_pem_slice(bytes)
            .map_err(|error| unreadable("the certificate (PEM)", error))
    } else {
        Ok(CertificateDer::from(bytes.to_vec()))
    }
}

/// Checks outside a handshake that `cert` (PEM or DER) is signed by
/// `ca_cert` and valid at `now`: pre-flight checks at start, and a node
/// looking at the certificate it just received before swapping it in.
pub fn verify_issued(
    cert: impl AsRef<[u8]>,
    ca_cert: impl AsRef<[u8]>,
    now: SystemTime,
) -> Result<CertInfo> {
    let ca_der = certificate_der(ca_cert.as_ref())?;
    let (_, ca) = X509Certificate::from_der(&ca_der)
        .map_err(|error| unreadable("the CA certificate (X.509)", error))?;
    let der = certificate_der(cert.as_ref())?;
    let (_, leaf) = X509Certificate::from_der(&der)
        .map_err(|error| unreadable("the certificate (X.509)", error))?;
    let info = CertInfo::from_x509(&leaf, &der)?;
    if !is_signing_ca(&ca) {
        return Err(Error::NotCa {
            subject: CertInfo::from_x509(&ca, &ca_der)?.subject,
        });
    }
    if leaf.issuer().as_raw() != ca.subject().as_raw()
        || leaf.verify_signature(Some(ca.public_key())).is_err()
    {
        return Err(Error::NotIssuedBy {
            subject: info.subject,
            ca: Fingerprint::of_der(&ca_der),
        });
    }
    info.check_valid_at(now)?;
    Ok(info)
}

/// Checks that `key_pem` is the private key of `cert` (PEM or DER): a
/// pre-flight check, so a mixed-up key file fails at start and not at the
/// first handshake.
pub fn check_key_matches(cert: impl AsRef<[u8]>, key_pem: &str) -> Result<()> {
    let der = certificate_der(cert.as_ref())?;
    let (_, cert) = X509Certificate::from_der(&der)
        .map_err(|error| unreadable("the certificate (X.509)", error))?;
    let key =
        KeyPair::from_pem(key_pem).map_err(|error| unreadable("the key (PEM, PKCS#8)", error))?;
    if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err(Error::KeyMismatch {
            subject: CertInfo::from_x509(&cert, &der)?.subject,
        });
    }
    Ok(())
}
