//! Gate certificates: what a gate with `tls { self_signed }` serves to
//! the outside for its hosts, signed by the cluster CA. Unlike every other
//! certificate the CA makes ([`crate::pki`]), one carries no identity
//! (`cca://…`) and only the server usage: a gate's key sits on a node
//! beside traffic from anywhere, and must never pass for the node, a user
//! or a server, nor authenticate a client at all. Its names are the gate's
//! hosts, wildcards (`*.example.com`, a whole leftmost label) included.
//! The gate node makes the key and sends a CSR ([`gate_csr`]); the CA
//! signs it only when it names exactly the gate's hosts
//! ([`ClusterCa::sign_gate_csr`]), so a node cannot widen what a gate
//! answers for, and a refusal says which names were wrong.

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use rcgen::{
    CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyUsagePurpose, SanType,
    SubjectPublicKeyInfo,
};
use rustls_pki_types::CertificateSigningRequestDer;
use rustls_pki_types::pem::PemObject;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

use crate::pki::{
    ClusterCa, CsrAndKey, Error, Names, Result, check_csr_key, common_name, crypto, new_key,
    random_serial, requested_names, set_validity, unreadable,
};

/// A gate's certificate: 90 days, as public CAs issue them. The gate node
/// renews it two thirds into its life, which leaves a month to ride out
/// an outage of the control plane.
pub const GATE_CERT_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);

/// The hosts of a gate as a certificate names them: DNS names in lower
/// case (a leading `*.` label allowed) and IP addresses, each once,
/// sorted, so two sets compare by value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GateHosts(Names);

impl GateHosts {
    /// Checks and sorts a gate's hosts (its spec's `hosts`). Refuses an
    /// empty list and any name a certificate cannot carry.
    pub fn new<S: AsRef<str>>(hosts: impl IntoIterator<Item = S>) -> Result<GateHosts> {
        let mut names = Names::none();
        for host in hosts {
            let host = host.as_ref();
            match host.parse::<IpAddr>() {
                Ok(ip) => names.ips.push(ip),
                Err(_) => {
                    check_gate_host(host)?;
                    names.dns.push(host.to_ascii_lowercase());
                }
            }
        }
        if names.is_empty() {
            return Err(Error::BadGateHost {
                name: String::new(),
                why: "a gate's certificate names at least one host",
            });
        }
        Ok(GateHosts::sorted(names))
    }

    fn sorted(mut names: Names) -> GateHosts {
        names.dns.sort();
        names.dns.dedup();
        names.ips.sort();
        names.ips.dedup();
        GateHosts(names)
    }

    /// The names, DNS then IP.
    pub fn names(&self) -> &Names {
        &self.0
    }

    fn sans(&self) -> Result<Vec<SanType>> {
        let mut sans = Vec::with_capacity(self.0.dns.len() + self.0.ips.len());
        for name in &self.0.dns {
            let name = name
                .clone()
                .try_into()
                .map_err(crypto("encode a DNS name"))?;
            sans.push(SanType::DnsName(name));
        }
        sans.extend(self.0.ips.iter().copied().map(SanType::IpAddress));
        Ok(sans)
    }

    /// The common name: the first host, for tools that still show it.
    fn subject(&self) -> String {
        self.0
            .dns
            .first()
            .cloned()
            .or_else(|| self.0.ips.first().map(IpAddr::to_string))
            .unwrap_or_default()
    }
}

impl std::fmt::Display for GateHosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Host names as webpki matches them: labels of letters, digits and `-`
/// (1–63 characters, 253 in all), and a wildcard only as the whole
/// leftmost label of a name with at least two more labels
/// (`*.example.com`, not `*.com` nor `w*.example.com`).
fn check_gate_host(name: &str) -> Result<()> {
    let bad = |why| {
        Err(Error::BadGateHost {
            name: name.to_owned(),
            why,
        })
    };
    if name.is_empty() || name.len() > 253 {
        return bad("a host name has 1 to 253 characters");
    }
    let labels: Vec<&str> = name.split('.').collect();
    for (index, label) in labels.iter().enumerate() {
        if *label == "*" && index == 0 {
            if labels.len() < 3 {
                return bad("a wildcard covers a subdomain of a domain (`*.example.com`)");
            }
            continue;
        }
        if label.contains('*') {
            return bad("a wildcard is the whole leftmost label only (`*.example.com`)");
        }
        if label.is_empty() || label.len() > 63 {
            return bad("each dot-separated label has 1 to 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return bad("use letters, digits, `-` and `.` only");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("a label neither starts nor ends with `-`");
        }
    }
    Ok(())
}

/// Makes a new P-256 key and a CSR naming `hosts` and nothing else: what
/// a gate node sends for a gate's certificate. The key stays with it.
pub fn gate_csr(hosts: &GateHosts) -> Result<CsrAndKey> {
    let key = new_key()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = common_name(&hosts.subject());
    params.subject_alt_names = hosts.sans()?;
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

impl ClusterCa {
    /// Signs a gate node's CSR for a gate serving `hosts`: its signature
    /// must verify and it must name exactly `hosts` (DNS names without
    /// regard to case) — no identity, no other name, none missing. The
    /// certificate names the hosts, serves TLS only (no client usage) and
    /// lives `validity` from a little before `now`, never past the CA.
    pub fn sign_gate_csr(
        &self,
        csr_pem: &str,
        hosts: &GateHosts,
        validity: Duration,
        now: SystemTime,
    ) -> Result<String> {
        let der = CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes())
            .map_err(|error| unreadable("the CSR (PEM)", error))?;
        let (_, request) = X509CertificationRequest::from_der(&der)
            .map_err(|error| unreadable("the CSR (PKCS#10)", error))?;
        let spki = &request.certification_request_info.subject_pki;
        check_csr_key(spki)?;
        request
            .verify_signature()
            .map_err(|_| Error::CsrSignature)?;
        let asked = requested_names(&request);
        let mut problems: Vec<String> = asked.others;
        problems.extend(
            asked.uris.iter().map(|uri| {
                format!("it asks for `{uri}`, but a gate's certificate names no identity")
            }),
        );
        let asked_hosts = GateHosts::sorted(Names {
            dns: asked
                .names
                .dns
                .iter()
                .map(|name| name.to_ascii_lowercase())
                .collect(),
            ips: asked.names.ips,
        });
        let extra = asked_hosts.0.outside(&hosts.0);
        if !extra.is_empty() {
            problems.push(format!("it also asks for {extra}"));
        }
        let missing = hosts.0.outside(&asked_hosts.0);
        if !missing.is_empty() {
            problems.push(format!("it leaves out {missing}"));
        }
        if !problems.is_empty() {
            return Err(Error::CsrGateHosts {
                hosts: hosts.0.clone(),
                problem: problems.join("; "),
            });
        }
        let public_key = SubjectPublicKeyInfo::from_der(spki.raw).map_err(|_| Error::CsrKey {
            algorithm: spki.algorithm.algorithm.to_id_string(),
        })?;
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name(&hosts.subject());
        params.subject_alt_names = hosts.sans()?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial()?);
        set_validity(&mut params, now, validity, Some(self.info().not_after))?;
        let cert = params
            .signed_by(&public_key, self.issuer())
            .map_err(crypto("sign the gate's certificate"))?;
        Ok(cert.pem())
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use x509_parser::certificate::X509Certificate;

    use super::*;
    use crate::identity::Identity;
    use crate::pki::{CA_VALIDITY, CertInfo, csr, verify_issued};

    fn at(days: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_750_000_000 + days * 86_400)
    }

    fn ca() -> ClusterCa {
        ClusterCa::generate("test", at(0), CA_VALIDITY).expect("ca")
    }

    #[test]
    fn a_gate_certificate_names_its_hosts_serves_only_and_carries_no_identity() {
        let ca = ca();
        let hosts =
            GateHosts::new(["Shop.Example.com", "*.api.example.com", "192.0.2.7"]).expect("hosts");
        let request = gate_csr(&hosts).expect("csr");
        let cert = ca
            .sign_gate_csr(&request.csr_pem, &hosts, GATE_CERT_VALIDITY, at(1))
            .expect("signed");
        let info = verify_issued(&cert, ca.cert_pem(), at(2)).expect("issued by the CA");
        assert_eq!(info.identity, None);
        assert_eq!(info.names.dns, ["*.api.example.com", "shop.example.com"]);
        assert_eq!(info.names.ips, ["192.0.2.7".parse::<IpAddr>().expect("ip")]);
        assert_eq!(
            info.not_after.duration_since(at(1)).expect("after"),
            GATE_CERT_VALIDITY
        );
        crate::pki::check_key_matches(&cert, &request.key_pem).expect("the node's own key");
        let der = rustls_pki_types::CertificateDer::from_pem_slice(cert.as_bytes()).expect("pem");
        let (_, parsed) = X509Certificate::from_der(&der).expect("x509");
        let usage = parsed
            .extended_key_usage()
            .expect("parses")
            .expect("present")
            .value;
        assert!(usage.server_auth && !usage.client_auth, "{usage:?}");
    }

    #[test]
    fn a_csr_asking_for_more_or_less_than_the_hosts_is_refused_naming_why() {
        let ca = ca();
        let hosts = GateHosts::new(["a.example.com", "b.example.com"]).expect("hosts");
        let sign = |asked: &[&str]| {
            let asked = GateHosts::new(asked).expect("asked");
            let request = gate_csr(&asked).expect("csr");
            ca.sign_gate_csr(&request.csr_pem, &hosts, GATE_CERT_VALIDITY, at(1))
                .map_err(|error| error.to_string())
        };
        sign(&["B.example.com", "a.example.com"]).expect("the same set, in any order and case");
        let extra = sign(&["a.example.com", "b.example.com", "evil.example.com"])
            .expect_err("an extra name");
        assert!(
            extra.contains("also asks for `evil.example.com`"),
            "{extra}"
        );
        let missing = sign(&["a.example.com"]).expect_err("a missing name");
        assert!(missing.contains("leaves out `b.example.com`"), "{missing}");

        let node = csr(
            &Identity::Node("n1".into()),
            &Names::from_hosts(["a.example.com", "b.example.com"]).expect("names"),
        )
        .expect("a node's csr");
        let error = ca
            .sign_gate_csr(&node.csr_pem, &hosts, GATE_CERT_VALIDITY, at(1))
            .expect_err("an identity");
        assert!(error.to_string().contains("`cca://node/n1`"), "{error}");
    }

    #[test]
    fn only_a_whole_leftmost_wildcard_label_is_a_gate_host() {
        for good in ["*.example.com", "example.com", "a-b.c", "10.0.0.1", "::1"] {
            GateHosts::new([good]).unwrap_or_else(|error| panic!("{good}: {error}"));
        }
        for bad in [
            "*",
            "*.com",
            "w*.example.com",
            "a.*.com",
            "-a.com",
            "a..b",
            "a_b.com",
        ] {
            let error = GateHosts::new([bad]).expect_err(bad);
            assert!(error.to_string().contains(&format!("`{bad}`")), "{error}");
        }
        GateHosts::new(Vec::<String>::new()).expect_err("no hosts");
        let info = CertInfo::parse({
            let ca = ca();
            let hosts = GateHosts::new(["*.example.com"]).expect("hosts");
            let request = gate_csr(&hosts).expect("csr");
            ca.sign_gate_csr(&request.csr_pem, &hosts, GATE_CERT_VALIDITY, at(1))
                .expect("signed")
        })
        .expect("parses");
        assert_eq!(info.subject, "*.example.com");
    }
}
