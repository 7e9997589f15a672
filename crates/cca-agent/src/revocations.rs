//! The cluster's certificate revocations, followed into the agent API's
//! handshakes. The API server keeps the revocations (`cca cert revoke`);
//! an agent asks it for them over its own mTLS connection (`GET
//! /v1/agent/nodes/{node}/revocations`) at start and then every period
//! (30 s by default, jittered), and replaces the [`RevocationList`] its
//! listener checks, so a revoked certificate — the server's, a user's,
//! another node's — is refused at the agent's next handshake, and a
//! connection already open with it is closed.
//!
//! The list is cached in `DATA/revocations.json`. While the control plane
//! is away the agent keeps the last list it had, across restarts too:
//! its workloads keep running, and a certificate revoked before the
//! outage stays refused. A revocation made during the outage counts from
//! the first poll after it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cca_tls::RevocationList;
use cca_trust::revocation::{Revocations, RevokedEntry};
use cca_wire::types::RevocationEntry;
use cca_wire::{Client, ClientError};
use tokio::sync::watch;

use crate::retry::Retry;

/// How often an agent asks for the revocations by default.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(30);
/// The cache of the last list, in the data directory.
const CACHE_FILE: &str = "revocations.json";
/// After a failure the next attempt comes this soon, backing off to the
/// period.
const RETRY_FIRST: Duration = Duration::from_secs(1);

/// Where the revocations come from: the API client in production, a fake
/// in tests.
#[async_trait::async_trait]
pub trait RevocationSource: Send + Sync {
    async fn revocations(&self, node: &str) -> Result<Vec<RevocationEntry>, ClientError>;
}

#[async_trait::async_trait]
impl RevocationSource for Client {
    async fn revocations(&self, node: &str) -> Result<Vec<RevocationEntry>, ClientError> {
        self.node_revocations(node).await
    }
}

/// What `list` is kept from: whose revocations, where, how often.
#[derive(Clone, Debug)]
pub struct Follow {
    pub node: String,
    pub data_dir: PathBuf,
    pub every: Duration,
}

/// Keeps `list` equal to the cluster's certificate revocations until
/// `shutdown`: the cached list first, then the server's at start and
/// every `follow.every`; a failed fetch keeps what the list holds.
pub async fn follow_revocations(
    source: Arc<dyn RevocationSource>,
    follow: Follow,
    list: Arc<RevocationList>,
    mut shutdown: watch::Receiver<bool>,
) {
    let path = follow.data_dir.join(CACHE_FILE);
    let mut shown = match load(&path) {
        Ok(Some(entries)) => {
            list.replace(revocations(&entries));
            Some(entries)
        }
        Ok(None) => None,
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "the cached revocations are unreadable: waiting for the server's");
            None
        }
    };
    let mut retry = Retry::between(RETRY_FIRST, follow.every);
    let mut failing = false;
    loop {
        let wait = match source.revocations(&follow.node).await {
            Ok(mut entries) => {
                entries.sort_by(|a, b| a.id.cmp(&b.id));
                if shown.as_ref() != Some(&entries) {
                    list.replace(revocations(&entries));
                    tracing::info!(
                        revocations = entries.len(),
                        "the agent API follows the cluster's revocations"
                    );
                    if let Err(error) = save(&path, &entries) {
                        tracing::warn!(path = %path.display(), %error, "caching the revocations failed");
                    }
                    shown = Some(entries);
                }
                failing = false;
                retry.reset();
                follow.every.mul_f64(0.9 + 0.2 * fastrand::f64())
            }
            Err(error) => {
                let wait = retry.next_delay(error.retry_after(), fastrand::f64());
                if failing {
                    tracing::debug!(%error, retry_in = ?wait, "fetching the revocations failed again");
                } else {
                    tracing::warn!(%error, retry_in = ?wait, "fetching the revocations failed: the agent API keeps refusing what it refused");
                }
                failing = true;
                wait
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

/// What the handshakes check, from the records (a token's, or one naming
/// nothing, refuses nothing).
fn revocations(entries: &[RevocationEntry]) -> Revocations {
    Revocations::new(
        entries
            .iter()
            .filter_map(|entry| RevokedEntry::from_record(&entry.record)),
    )
}

fn load(path: &Path) -> std::io::Result<Option<Vec<RevocationEntry>>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(std::io::Error::other),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Whole or not at all: a temporary file, fsync'd, renamed.
fn save(path: &Path, entries: &[RevocationEntry]) -> std::io::Result<()> {
    use std::io::Write;
    let bytes = serde_json::to_vec(entries).map_err(std::io::Error::other)?;
    let temporary = path.with_extension("json.tmp");
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    std::fs::rename(temporary, path)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use cca_model::access::{RevocationRecord, RevokedTarget};
    use cca_tls::ExpectedPeer;
    use cca_trust::config_dir::{ClientFiles, NodeCredentials};
    use cca_trust::identity::Identity;
    use cca_trust::pki::{CA_VALIDITY, CertAndKey, CertInfo, ClusterCa, Issue, Names};
    use cca_wire::tls::{ClientCertificate, ClientTls};

    use super::*;
    use crate::enrol::NodeTrust;

    /// The server's side: answers its list, or fails while `down`.
    #[derive(Default)]
    struct FakeServer {
        entries: Mutex<Vec<RevocationEntry>>,
        down: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl RevocationSource for FakeServer {
        async fn revocations(&self, node: &str) -> Result<Vec<RevocationEntry>, ClientError> {
            assert_eq!(node, "n1", "the agent asks as its own node");
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(ClientError::Unreachable {
                    url: "https://server".into(),
                    reason: "connection refused".into(),
                });
            }
            Ok(self.entries.lock().expect("lock").clone())
        }
    }

    fn revoked_serial(certificate: &CertAndKey) -> RevocationEntry {
        let serial = CertInfo::parse(&certificate.cert_pem)
            .expect("parses")
            .serial;
        let target = RevokedTarget::Serial { serial };
        RevocationEntry {
            id: target.id(),
            record: RevocationRecord {
                target,
                at: cca_model::clock::now_millis(),
                by: "user:admin".into(),
                reason: "test".into(),
            },
        }
    }

    /// The agent API's TLS as `run` serves it, over a route that answers.
    async fn agent_api(ca: &ClusterCa, data_dir: &Path) -> (u16, Arc<RevocationList>) {
        let names = Names::from_hosts(["127.0.0.1"]).expect("names");
        let node = ca
            .issue(
                &Issue::new(Identity::Node("n1".into()), names.clone()),
                cca_model::clock::system_now(),
            )
            .expect("node certificate");
        let files = ClientFiles {
            ca_pem: ca.cert_pem().to_owned(),
            cert_pem: node.cert_pem.clone(),
            key_pem: node.key_pem.clone(),
            certificate: CertInfo::parse(&node.cert_pem).expect("parses"),
        };
        let credentials = NodeCredentials::in_data_dir(data_dir);
        let trust = NodeTrust::new("n1", names, credentials, &files).expect("trust");
        let tls = crate::serve::server_tls(&trust).expect("tls");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let port = listener.local_addr().expect("address").port();
        let listener = cca_tls::TlsListener::new(listener, &tls).expect("tls listener");
        let router = axum::Router::new().route("/ping", axum::routing::get(|| async { "pong" }));
        tokio::spawn(async move { axum::serve(listener, router).await });
        (port, Arc::clone(tls.revocations()))
    }

    /// Whether the agent API answers a client presenting `certificate`,
    /// on a connection of its own (a new handshake).
    async fn answers(ca: &ClusterCa, port: u16, certificate: &CertAndKey) -> bool {
        let presented = ClientCertificate::from_pem(&certificate.cert_pem, &certificate.key_pem)
            .expect("client certificate");
        let config = ClientTls::new(ca.cert_pem())
            .with_certificate(Arc::new(presented))
            .expecting(ExpectedPeer::Exactly(Identity::Node("n1".into())))
            .rustls_config()
            .expect("client tls");
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(config)
            .timeout(Duration::from_secs(5))
            .build()
            .expect("client");
        match client
            .get(format!("https://127.0.0.1:{port}/ping"))
            .send()
            .await
        {
            Ok(response) => response.text().await.is_ok_and(|text| text == "pong"),
            Err(_) => false,
        }
    }

    /// Polls `answers` until it is `wanted`, for up to 5 s.
    async fn until_answers(ca: &ClusterCa, port: u16, certificate: &CertAndKey, wanted: bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while answers(ca, port, certificate).await != wanted {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the agent API never {} the certificate",
                if wanted { "accepted" } else { "refused" }
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_revoked_certificate_is_refused_at_the_next_handshake_and_stays_refused_offline() {
        let now = cca_model::clock::system_now();
        let ca = ClusterCa::generate("t", now, CA_VALIDITY).expect("ca");
        let server = |name: &str| {
            ca.issue(
                &Issue::new(Identity::Server(name.into()), Names::none()),
                now,
            )
            .expect("server certificate")
        };
        let (s1, s2) = (server("s1"), server("s2"));
        let dir = tempfile::tempdir().expect("dir");
        let (port, list) = agent_api(&ca, dir.path()).await;
        let source = Arc::new(FakeServer::default());
        let follow = Follow {
            node: "n1".into(),
            data_dir: dir.path().to_path_buf(),
            every: Duration::from_millis(50),
        };
        let (stop, stopping) = watch::channel(false);
        let following = tokio::spawn(follow_revocations(
            Arc::clone(&source) as Arc<dyn RevocationSource>,
            follow.clone(),
            Arc::clone(&list),
            stopping.clone(),
        ));
        assert!(answers(&ca, port, &s1).await, "s1 is served before");

        // Revoked at the server: the agent's next handshake refuses it;
        // another server's certificate is still served.
        source
            .entries
            .lock()
            .expect("lock")
            .push(revoked_serial(&s1));
        until_answers(&ca, port, &s1, false).await;
        assert!(answers(&ca, port, &s2).await, "s2 is not revoked");

        // The control plane goes away: the agent keeps its list.
        source.down.store(true, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!answers(&ca, port, &s1).await, "still refused offline");
        assert!(answers(&ca, port, &s2).await);
        stop.send_replace(true);
        following.await.expect("stops");

        // A restart while the server is still away: the cached list is
        // in force before any answer.
        let (port, list) = agent_api(&ca, dir.path()).await;
        let (stop, stopping) = watch::channel(false);
        let following = tokio::spawn(follow_revocations(
            Arc::clone(&source) as Arc<dyn RevocationSource>,
            follow,
            list,
            stopping,
        ));
        until_answers(&ca, port, &s1, false).await;
        assert!(answers(&ca, port, &s2).await);

        // Back, with the revocation gone (pruned): served again.
        source.entries.lock().expect("lock").clear();
        source
            .down
            .store(false, std::sync::atomic::Ordering::SeqCst);
        until_answers(&ca, port, &s1, true).await;
        stop.send_replace(true);
        following.await.expect("stops");
    }
}
