//! The node's own certificate: getting one with a join token
//! ([`join`]), and keeping it fresh ([`keep_renewed`]). A joining node
//! makes its key itself (it never leaves the node), trusts the server only
//! if the server's chain holds the CA the token names, and only then sends
//! the token's secret with its certificate request. The certificate it
//! gets lives a day; the agent asks for a new one, for a new key, two
//! thirds into its life over its own mTLS connection, and keeps asking
//! (backing off) through an outage of the control plane until it gets one
//! or the old one expires. Renewed credentials are written to the data
//! directory before they are used, so a restarted agent starts with the
//! newest; a restart past the renewal time renews at once.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cca_trust::config_dir::{ClientFiles, ConfigError, NodeCredentials};
use cca_trust::identity::Identity;
use cca_trust::join::JoinToken;
use cca_trust::pki::{self, CertInfo, Fingerprint, Names};
use cca_wire::tls::{ClientCertificate, ClientTls};
use cca_wire::types::{JoinRequest, NodeCertificate, RenewRequest};
use cca_wire::{Client, ClientError};
use tokio::sync::watch;

use crate::retry::Retry;

/// What went wrong joining or renewing.
#[derive(Debug, thiserror::Error)]
pub enum EnrolError {
    #[error("the node's credentials: {0}")]
    Files(#[from] ConfigError),
    #[error("making the node's key and certificate request: {0}")]
    Request(pki::Error),
    #[error("joining {server}: {error}")]
    Join { server: String, error: ClientError },
    #[error(
        "the server answered with a CA whose fingerprint is {found}, not the join token's {expected}: not the cluster the token is for"
    )]
    WrongCa {
        expected: Fingerprint,
        found: Fingerprint,
    },
    #[error("the certificate the server issued is unusable: {0}")]
    Issued(pki::Error),
    #[error("the certificate the server issued names {found}, not node `{node}`")]
    WrongIdentity { node: String, found: String },
    #[error("TLS: {0}")]
    Tls(String),
}

/// The names a node's certificate carries besides its identity: its name
/// and the address it is reached at (the agent API serves on it).
pub fn node_names(node: &str, address: Option<IpAddr>) -> Result<Names, EnrolError> {
    let mut hosts = vec![node.to_owned()];
    hosts.extend(address.map(|ip| ip.to_string()));
    Names::from_hosts(hosts).map_err(EnrolError::Request)
}

/// Joins the cluster at `server` (`https://…`) as `node` with `token`:
/// see the module documentation. Saves and returns the credentials.
pub async fn join(
    server: &str,
    token: &JoinToken,
    node: &str,
    names: &Names,
    credentials: &NodeCredentials,
    now: SystemTime,
) -> Result<ClientFiles, EnrolError> {
    let identity = Identity::Node(node.to_owned());
    let request = pki::csr(&identity, names).map_err(EnrolError::Request)?;
    let client = Client::with_tls(server, &ClientTls::pinned(*token.ca())).map_err(|error| {
        EnrolError::Join {
            server: server.to_owned(),
            error,
        }
    })?;
    let issued = client
        .join(&JoinRequest {
            token_id: token.id().to_owned(),
            secret: token.secret().to_owned(),
            node: node.to_owned(),
            csr_pem: request.csr_pem,
        })
        .await
        .map_err(|error| EnrolError::Join {
            server: server.to_owned(),
            error,
        })?;
    let found = CertInfo::parse(&issued.ca_pem)
        .map_err(EnrolError::Issued)?
        .fingerprint;
    if found != *token.ca() {
        return Err(EnrolError::WrongCa {
            expected: *token.ca(),
            found,
        });
    }
    accept(&issued, &request.key_pem, node, credentials, now)
}

/// Checks what the server issued for `key_pem`, then saves it.
fn accept(
    issued: &NodeCertificate,
    key_pem: &str,
    node: &str,
    credentials: &NodeCredentials,
    now: SystemTime,
) -> Result<ClientFiles, EnrolError> {
    let info = pki::verify_issued(&issued.certificate_pem, &issued.ca_pem, now)
        .map_err(EnrolError::Issued)?;
    pki::check_key_matches(&issued.certificate_pem, key_pem).map_err(EnrolError::Issued)?;
    if info.identity != Some(Identity::Node(node.to_owned())) {
        return Err(EnrolError::WrongIdentity {
            node: node.to_owned(),
            found: info
                .identity
                .as_ref()
                .map_or_else(|| "no identity".to_owned(), ToString::to_string),
        });
    }
    credentials.save(&issued.ca_pem, &issued.certificate_pem, key_pem)?;
    Ok(ClientFiles {
        ca_pem: issued.ca_pem.clone(),
        cert_pem: issued.certificate_pem.clone(),
        key_pem: key_pem.to_owned(),
        certificate: info,
    })
}

/// The TLS an agent talks to the server with: the cluster CA, and its
/// node certificate (replaceable, for renewals).
pub fn client_tls(files: &ClientFiles) -> Result<(ClientTls, Arc<ClientCertificate>), EnrolError> {
    let certificate = Arc::new(
        ClientCertificate::from_pem(&files.cert_pem, &files.key_pem)
            .map_err(|error| EnrolError::Tls(error.to_string()))?,
    );
    let tls = ClientTls::new(files.ca_pem.clone()).with_certificate(Arc::clone(&certificate));
    Ok((tls, certificate))
}

/// How a renewal reaches the server: the API client in production, a
/// CA in tests.
#[async_trait::async_trait]
pub trait Renewer: Send + Sync {
    async fn renew(&self, node: &str, csr_pem: String) -> Result<NodeCertificate, ClientError>;
}

#[async_trait::async_trait]
impl Renewer for Client {
    async fn renew(&self, node: &str, csr_pem: String) -> Result<NodeCertificate, ClientError> {
        self.renew_certificate(node, &RenewRequest { csr_pem })
            .await
    }
}

/// Everything the renewal loop works on.
#[derive(Clone)]
pub struct Renewal {
    pub node: String,
    pub names: Names,
    pub credentials: NodeCredentials,
    /// The certificate in use now.
    pub current: CertInfo,
    /// What the agent's connections present; replaced on renewal.
    pub presented: Arc<ClientCertificate>,
    /// The wall clock (a fake one in tests).
    pub clock: Arc<dyn Fn() -> SystemTime + Send + Sync>,
}

impl std::fmt::Debug for Renewal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewal")
            .field("node", &self.node)
            .field("serial", &self.current.serial)
            .finish_non_exhaustive()
    }
}

/// An agent's mTLS: how it reaches the server, and how it keeps its
/// certificate fresh.
#[derive(Debug)]
pub struct NodeTrust {
    pub tls: ClientTls,
    pub renewal: Renewal,
    /// How often the agent asks the server for the cluster's revocations
    /// (`revocations`); [`crate::revocations::DEFAULT_REFRESH`] unless
    /// set.
    pub revocation_refresh: Duration,
}

impl NodeTrust {
    /// From credentials loaded (or just issued) for `node`.
    pub fn new(
        node: &str,
        names: Names,
        credentials: NodeCredentials,
        files: &ClientFiles,
    ) -> Result<NodeTrust, EnrolError> {
        let (tls, presented) = client_tls(files)?;
        Ok(NodeTrust {
            tls,
            renewal: Renewal {
                node: node.to_owned(),
                names,
                credentials,
                current: files.certificate.clone(),
                presented,
                clock: Arc::new(cca_model::clock::system_now),
            },
            revocation_refresh: crate::revocations::DEFAULT_REFRESH,
        })
    }
}

/// Retries wait between these.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(300);

/// Renews the node's certificate two thirds into its life, and again
/// after each renewal, until `shutdown`.
pub async fn keep_renewed(
    renewer: Arc<dyn Renewer>,
    mut renewal: Renewal,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut retry = Retry::between(RETRY_FIRST, RETRY_MAX);
    let mut wait = until(renewal.current.renew_at(), (renewal.clock)());
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        match renew_once(renewer.as_ref(), &renewal).await {
            Ok(files) => {
                tracing::info!(
                    node = %renewal.node,
                    serial = %files.certificate.serial,
                    "renewed the node's certificate"
                );
                renewal.current = files.certificate;
                retry.reset();
                wait = until(renewal.current.renew_at(), (renewal.clock)());
            }
            Err(error) => {
                let now = (renewal.clock)();
                let left = until(renewal.current.not_after, now);
                wait = retry
                    .next_delay(None, fastrand::f64())
                    .min(left.max(RETRY_FIRST));
                tracing::warn!(
                    node = %renewal.node,
                    %error,
                    retry_in = ?wait,
                    expires_in = ?left,
                    "renewing the node's certificate failed"
                );
            }
        }
    }
}

fn until(at: SystemTime, now: SystemTime) -> Duration {
    at.duration_since(now).unwrap_or_default()
}

/// One renewal: a new key, a CSR, the server's signature, checked, saved,
/// then presented from the next handshake on.
async fn renew_once(renewer: &dyn Renewer, renewal: &Renewal) -> Result<ClientFiles, EnrolError> {
    let identity = Identity::Node(renewal.node.clone());
    let request = pki::csr(&identity, &renewal.names).map_err(EnrolError::Request)?;
    let issued = renewer
        .renew(&renewal.node, request.csr_pem)
        .await
        .map_err(|error| EnrolError::Join {
            server: "the API server".into(),
            error,
        })?;
    let files = accept(
        &issued,
        &request.key_pem,
        &renewal.node,
        &renewal.credentials,
        (renewal.clock)(),
    )?;
    renewal
        .presented
        .replace(&files.cert_pem, &files.key_pem)
        .map_err(|error| EnrolError::Tls(error.to_string()))?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::UNIX_EPOCH;

    use cca_trust::pki::{CA_VALIDITY, ClusterCa, NODE_CERT_VALIDITY};

    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    /// A fake wall clock: a fixed start plus the paused tokio clock's
    /// progress, so sleeping moves both.
    fn fake_clock(start: SystemTime) -> Arc<dyn Fn() -> SystemTime + Send + Sync> {
        let origin = tokio::time::Instant::now();
        Arc::new(move || start + origin.elapsed())
    }

    /// The server's side: signs at the fake clock, fails while `down`.
    struct FakeServer {
        ca: ClusterCa,
        clock: Arc<dyn Fn() -> SystemTime + Send + Sync>,
        down: std::sync::atomic::AtomicBool,
        calls: AtomicU32,
        issued: Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl Renewer for FakeServer {
        async fn renew(&self, node: &str, csr_pem: String) -> Result<NodeCertificate, ClientError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                return Err(ClientError::Unreachable {
                    url: "https://server".into(),
                    reason: "connection refused".into(),
                });
            }
            let names = node_names(node, None).expect("names");
            let pem = self
                .ca
                .sign_csr(
                    &csr_pem,
                    &Identity::Node(node.into()),
                    &names,
                    NODE_CERT_VALIDITY,
                    (self.clock)(),
                )
                .expect("signs");
            let serial = CertInfo::parse(&pem).expect("parses").serial;
            self.issued.lock().expect("lock").push(serial);
            Ok(NodeCertificate {
                certificate_pem: pem,
                ca_pem: self.ca.cert_pem().to_owned(),
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn renews_at_two_thirds_of_life_and_rides_out_an_outage() {
        let start = UNIX_EPOCH + Duration::from_secs(1_900_000_000);
        let clock = fake_clock(start);
        let dir = tempfile::tempdir().expect("dir");
        let credentials = NodeCredentials::in_data_dir(dir.path());
        let ca = ClusterCa::generate("t", start, CA_VALIDITY).expect("ca");
        let server = Arc::new(FakeServer {
            ca,
            clock: Arc::clone(&clock),
            down: false.into(),
            calls: AtomicU32::new(0),
            issued: Mutex::default(),
        });
        // The join: the first certificate, issued now.
        let names = node_names("n1", None).expect("names");
        let request = pki::csr(&Identity::Node("n1".into()), &names).expect("csr");
        let first = server.renew("n1", request.csr_pem).await.expect("issued");
        let files = accept(&first, &request.key_pem, "n1", &credentials, start).expect("saved");
        let trust = NodeTrust::new("n1", names, credentials.clone(), &files).expect("trust");
        let renewal = Renewal {
            clock: Arc::clone(&clock),
            ..trust.renewal
        };
        let (stop, stopping) = watch::channel(false);
        let running = tokio::spawn(keep_renewed(
            Arc::clone(&server) as Arc<dyn Renewer>,
            renewal,
            stopping,
        ));
        let serial_on_disk = || {
            credentials
                .load("n1", clock())
                .expect("loads at the fake now")
                .certificate
                .serial
        };

        // Nothing before two thirds of 24 h (the CA backdates a
        // certificate by its clock-skew allowance, 5 min).
        tokio::time::sleep(16 * HOUR - Duration::from_secs(15 * 60)).await;
        assert_eq!(server.calls.load(Ordering::SeqCst), 1, "only the join");
        tokio::time::sleep(Duration::from_secs(20 * 60)).await;
        assert_eq!(server.calls.load(Ordering::SeqCst), 2, "renewed once");
        let second = server.issued.lock().expect("lock")[1].clone();
        assert_eq!(serial_on_disk(), second, "the renewal is on disk");

        // The control plane goes away as the next renewal comes due: the
        // agent retries, backing off, and the old certificate still serves.
        server.down.store(true, Ordering::SeqCst);
        tokio::time::sleep(16 * HOUR + 2 * HOUR).await;
        let failed = server.calls.load(Ordering::SeqCst) - 2;
        assert!(
            (6..=100).contains(&failed),
            "retries back off (1 s doubling to 5 min) over 2 h: {failed}"
        );
        assert_eq!(serial_on_disk(), second);
        server.down.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(301)).await;
        let issued = server.issued.lock().expect("lock").clone();
        assert_eq!(issued.len(), 3, "renewed once it came back");
        assert_eq!(serial_on_disk(), issued[2]);
        assert!(
            credentials
                .load("n1", start + 24 * HOUR + 18 * HOUR)
                .is_ok(),
            "the new certificate outlives the old one"
        );

        stop.send_replace(true);
        running.await.expect("stops");
    }
}
