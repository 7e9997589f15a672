//! The key pairs a gate node serves its gates' HTTPS with, obtained from
//! the control plane and kept current. [`GateCertificates::spawn`] follows
//! the gates of the node's network view and publishes, per gate with TLS,
//! the chain and key to serve ([`GateKeyPair`]) on a watch channel the
//! gate's SNI resolver reads:
//!
//! - a `tls { self_signed }` gate: the node makes a key, sends a CSR for
//!   the gate's hosts (`POST /v1/agent/nodes/{node}/gates/{gate}/certificate`)
//!   and keeps the certificate the cluster CA signs; it asks again two
//!   thirds into the certificate's life, and at once when the gate's hosts
//!   change (the old pair is served until the new one arrives);
//! - a `tls { cert key }` gate: the node polls the two secrets' values
//!   (`GET /v1/agent/nodes/{node}/gates/{gate}/tls`) every
//!   [`SECRETS_POLL`] with the version it has (a 304 costs nothing), and
//!   at once when the gate changes, so `cca secret set` is served within
//!   seconds, without a restart. A value that is not a usable chain and
//!   key is logged, naming the gate and its secrets, and the previous
//!   pair stays.
//!
//! Every pair is cached in `DATA/gate-tls/{gate}.json` (0600 in a 0700
//! directory, written whole or not at all) before it is published, so a
//! gate node restarted while the control plane is down serves HTTPS from
//! the cache and its cached network view. A gate that leaves the map, or
//! stops having TLS, is dropped from the channel and its file removed.
//! Failures are logged with the gate's name and retried with the agent's
//! backoff ([`Retry`]), honouring the server's `Retry-After`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cca_model::clock::system_now;
use cca_model::spec::{GateSpec, Tls};
use cca_trust::gate::{GateHosts, gate_csr};
use cca_trust::pki::{CertInfo, Names, verify_issued};
use cca_wire::types::{GateCertificate, GateCertificateRequest, GateTls};
use cca_wire::{Client, ClientError};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::netmap::NetworkView;
use crate::retry::Retry;

/// How often a `tls { cert key }` gate's secrets are asked for.
pub const SECRETS_POLL: Duration = Duration::from_secs(10);
/// The cache directory in the data directory.
pub const CACHE_DIR: &str = "gate-tls";
/// After a failure the next attempt comes this soon, backing off.
const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between attempts at a certificate: a gate without
/// one serves no HTTPS, so not long.
const RETRY_MAX: Duration = Duration::from_secs(60);

/// What a gate serves: its chain (PEM, leaf first) and key (PEM), and
/// when the leaf expires (milliseconds since the epoch). `Debug` hides
/// the key.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateKeyPair {
    pub chain_pem: String,
    pub key_pem: String,
    pub not_after: i64,
}

impl std::fmt::Debug for GateKeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GateKeyPair")
            .field("chain_pem", &self.chain_pem)
            .field("key_pem", &"[hidden]")
            .field("not_after", &self.not_after)
            .finish()
    }
}

/// Every gate's pair, by gate name: what the channel carries.
pub type GateKeyPairs = Arc<BTreeMap<String, GateKeyPair>>;

/// Where certificates and secrets come from: the API client in
/// production, a fake in tests.
#[async_trait::async_trait]
pub trait GateTlsSource: Send + Sync {
    /// A certificate for gate `gate` for the key of `csr_pem`.
    async fn certificate(
        &self,
        node: &str,
        gate: &str,
        csr_pem: String,
    ) -> Result<GateCertificate, ClientError>;

    /// Gate `gate`'s chain and key; `None` while still at `known`.
    async fn secrets(
        &self,
        node: &str,
        gate: &str,
        known: Option<&str>,
    ) -> Result<Option<GateTls>, ClientError>;
}

#[async_trait::async_trait]
impl GateTlsSource for Client {
    async fn certificate(
        &self,
        node: &str,
        gate: &str,
        csr_pem: String,
    ) -> Result<GateCertificate, ClientError> {
        self.gate_certificate(node, gate, &GateCertificateRequest { csr_pem })
            .await
    }

    async fn secrets(
        &self,
        node: &str,
        gate: &str,
        known: Option<&str>,
    ) -> Result<Option<GateTls>, ClientError> {
        self.gate_tls(node, gate, known).await
    }
}

/// Keeps every gate's key pair; see the module documentation.
#[derive(Debug)]
pub struct GateCertificates;

impl GateCertificates {
    /// Starts following the gates of `network` for node `node` (a gate
    /// node), caching under `data_dir`, until `stop` turns true. The
    /// channel starts empty and holds a gate's pair from the cache at
    /// once, from the server as soon as it answers.
    pub fn spawn(
        source: impl GateTlsSource + 'static,
        node: impl Into<String>,
        data_dir: impl Into<PathBuf>,
        network: watch::Receiver<Arc<NetworkView>>,
        stop: watch::Receiver<bool>,
    ) -> watch::Receiver<GateKeyPairs> {
        let (pairs, receiver) = watch::channel(GateKeyPairs::default());
        let shared = Arc::new(Shared {
            source: Box::new(source),
            node: node.into(),
            dir: data_dir.into().join(CACHE_DIR),
            pairs,
        });
        tokio::spawn(follow(shared, network, stop));
        receiver
    }
}

/// What every gate's task shares.
struct Shared {
    source: Box<dyn GateTlsSource>,
    node: String,
    dir: PathBuf,
    pairs: watch::Sender<GateKeyPairs>,
}

impl Shared {
    fn publish(&self, gate: &str, pair: &GateKeyPair) {
        self.pairs.send_if_modified(|pairs| {
            if pairs.get(gate) == Some(pair) {
                return false;
            }
            Arc::make_mut(pairs).insert(gate.to_owned(), pair.clone());
            true
        });
    }

    fn withdraw(&self, gate: &str) {
        self.pairs.send_if_modified(|pairs| {
            if !pairs.contains_key(gate) {
                return false;
            }
            Arc::make_mut(pairs).remove(gate);
            true
        });
    }
}

/// A gate's task and the spec it was started for.
struct Running {
    spec: Arc<GateSpec>,
    task: JoinHandle<()>,
}

/// Starts, restarts and stops one task per gate with TLS as the view
/// changes, until `stop`.
async fn follow(
    shared: Arc<Shared>,
    mut network: watch::Receiver<Arc<NetworkView>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    let mut pruned = false;
    loop {
        let view = Arc::clone(&network.borrow_and_update());
        let wanted: BTreeMap<&String, &Arc<GateSpec>> = view
            .map
            .gates
            .iter()
            .filter(|(_, spec)| spec.tls.is_some())
            .collect();
        let gone: Vec<String> = running
            .keys()
            .filter(|gate| !wanted.contains_key(gate))
            .cloned()
            .collect();
        for gate in gone {
            if let Some(old) = running.remove(&gate) {
                end(old.task).await;
            }
            shared.withdraw(&gate);
            remove_cached(&shared.dir, &gate);
            tracing::info!(gate = %gate, "the gate is gone or serves no TLS: its key pair is dropped");
        }
        // Until the first map (from the server or the cache) nothing is
        // known to be gone: a cache is pruned only against a real map.
        if !pruned && view.revision > 0 {
            prune_cache(&shared.dir, &wanted);
            pruned = true;
        }
        for (gate, spec) in wanted {
            if running.get(gate).is_some_and(|run| run.spec == *spec) {
                continue;
            }
            if let Some(old) = running.remove(gate) {
                end(old.task).await;
            }
            let task = tokio::spawn(keep_gate(
                Arc::clone(&shared),
                gate.clone(),
                Arc::clone(spec),
            ));
            running.insert(
                gate.clone(),
                Running {
                    spec: Arc::clone(spec),
                    task,
                },
            );
        }
        let closed = tokio::select! {
            changed = network.changed() => changed.is_err(),
            _ = stop.wait_for(|stop| *stop) => break,
        };
        if closed {
            // No more views: keep what runs until told to stop.
            let _ = stop.wait_for(|stop| *stop).await;
            break;
        }
    }
    for (_, run) in running {
        end(run.task).await;
    }
}

/// Stops a gate's task and waits for it, so it publishes nothing after.
async fn end(task: JoinHandle<()>) {
    task.abort();
    let _ = task.await;
}

/// One gate's pair, for as long as its spec stays as it is.
async fn keep_gate(shared: Arc<Shared>, gate: String, spec: Arc<GateSpec>) {
    match &spec.tls {
        Some(Tls::SelfSigned) => keep_self_signed(&shared, &gate, &spec.hosts).await,
        Some(Tls::Secrets { cert, key }) => keep_secrets(&shared, &gate, cert, key).await,
        None => {}
    }
}

/// A `tls { self_signed }` gate: a certificate for its hosts, renewed two
/// thirds into its life.
async fn keep_self_signed(shared: &Shared, gate: &str, hosts: &[String]) {
    let hosts = match GateHosts::new(hosts) {
        Ok(hosts) => hosts,
        Err(error) => {
            tracing::error!(gate = %gate, %error, "the gate's hosts cannot be named in a certificate: it serves no HTTPS until they are fixed");
            return;
        }
    };
    let mut wait = Duration::ZERO;
    // A pair cached for another kind of TLS (the gate changed while the
    // agent was stopped) is not served: the new pair is asked for at once.
    if let Some(Cached {
        source: Source::SelfSigned { hosts: cached },
        pair,
    }) = load_cached(&shared.dir, gate)
    {
        shared.publish(gate, &pair);
        // Hosts changed: served until the new certificate comes.
        if cached == host_list(hosts.names()) {
            wait = until(renew_at(&pair), system_now());
        }
    }
    let mut retry = Retry::between(RETRY_FIRST, RETRY_MAX);
    loop {
        tokio::time::sleep(wait).await;
        match self_signed_once(shared, gate, &hosts).await {
            Ok(pair) => {
                tracing::info!(gate = %gate, not_after = pair.not_after, "the gate has a new certificate from the cluster CA");
                retry.reset();
                wait = until(renew_at(&pair), system_now());
            }
            Err(failure) => {
                wait = retry.next_delay(failure.retry_after, fastrand::f64());
                tracing::warn!(gate = %gate, error = %failure.message, retry_in = ?wait, "getting the gate's certificate failed");
            }
        }
    }
}

/// Why an attempt failed, and how long the server asked to be left.
struct Failure {
    message: String,
    retry_after: Option<Duration>,
}

impl Failure {
    fn local(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            retry_after: None,
        }
    }
}

impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Self {
        Failure {
            retry_after: error.retry_after(),
            message: error.to_string(),
        }
    }
}

/// A new key, a CSR, the CA's signature, checked, cached, published.
async fn self_signed_once(
    shared: &Shared,
    gate: &str,
    hosts: &GateHosts,
) -> Result<GateKeyPair, Failure> {
    let request = gate_csr(hosts)
        .map_err(|error| Failure::local(format!("making the key and CSR: {error}")))?;
    let issued = shared
        .source
        .certificate(&shared.node, gate, request.csr_pem)
        .await?;
    let info = verify_issued(&issued.certificate_pem, &issued.ca_pem, system_now())
        .map_err(|error| Failure::local(format!("the certificate the server sent: {error}")))?;
    if host_list(&info.names) != host_list(hosts.names()) {
        return Err(Failure::local(format!(
            "the certificate the server sent names {}, not the gate's hosts {hosts}",
            info.names
        )));
    }
    // The CA after the leaf, as the API server's chain carries it: a
    // client can read the root to trust from the handshake.
    let chain_pem = format!("{}{}", issued.certificate_pem, issued.ca_pem);
    let not_after = checked_pair(&chain_pem, &request.key_pem).map_err(Failure::local)?;
    let pair = GateKeyPair {
        chain_pem,
        key_pem: request.key_pem,
        not_after,
    };
    let cached = Cached {
        source: Source::SelfSigned {
            hosts: host_list(hosts.names()),
        },
        pair,
    };
    if let Err(error) = save_cached(&shared.dir, gate, &cached) {
        tracing::warn!(gate = %gate, %error, "caching the gate's key pair failed: served, but not after a restart without the control plane");
    }
    shared.publish(gate, &cached.pair);
    Ok(cached.pair)
}

/// A `tls { cert key }` gate: its secrets' values, polled.
async fn keep_secrets(shared: &Shared, gate: &str, cert: &str, key: &str) {
    let mut known = None;
    if let Some(Cached {
        source:
            Source::Secrets {
                cert: cached_cert,
                key: cached_key,
                version,
            },
        pair,
    }) = load_cached(&shared.dir, gate)
    {
        shared.publish(gate, &pair);
        // Other secrets: served until theirs come, asked for at once.
        if cached_cert == cert && cached_key == key {
            known = Some(version);
        }
    }
    let mut retry = Retry::between(RETRY_FIRST, SECRETS_POLL);
    let mut failing = false;
    loop {
        let wait = match shared
            .source
            .secrets(&shared.node, gate, known.as_deref())
            .await
        {
            Ok(answer) => {
                if let Some(tls) = answer {
                    take_secrets(shared, gate, cert, key, &tls);
                    known = Some(tls.version);
                }
                failing = false;
                retry.reset();
                SECRETS_POLL.mul_f64(0.9 + 0.2 * fastrand::f64())
            }
            Err(error) => {
                let wait = retry.next_delay(error.retry_after(), fastrand::f64());
                if failing {
                    tracing::debug!(gate = %gate, %error, retry_in = ?wait, "fetching the gate's certificate and key failed again");
                } else {
                    tracing::warn!(gate = %gate, %error, retry_in = ?wait, "fetching the gate's certificate and key failed: it keeps serving the pair it has");
                }
                failing = true;
                wait
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// Serves a new version of the secrets if it is a usable chain and key;
/// else says why and keeps the pair served.
fn take_secrets(shared: &Shared, gate: &str, cert: &str, key: &str, tls: &GateTls) {
    let not_after = match checked_pair(&tls.chain_pem, &tls.key_pem) {
        Ok(not_after) => not_after,
        Err(error) => {
            tracing::error!(
                gate = %gate,
                cert_secret = %cert,
                key_secret = %key,
                version = %tls.version,
                %error,
                "the gate's secrets do not hold a usable certificate chain and key: it keeps \
                 serving the previous pair; set them again (`cca secret set {cert}`, `cca secret \
                 set {key}`) with PEM"
            );
            return;
        }
    };
    if not_after < cca_model::clock::now_millis() {
        tracing::warn!(gate = %gate, cert_secret = %cert, "the gate's certificate has expired: clients will refuse it; set a new one");
    }
    let cached = Cached {
        source: Source::Secrets {
            cert: cert.to_owned(),
            key: key.to_owned(),
            version: tls.version.clone(),
        },
        pair: GateKeyPair {
            chain_pem: tls.chain_pem.clone(),
            key_pem: tls.key_pem.clone(),
            not_after,
        },
    };
    if let Err(error) = save_cached(&shared.dir, gate, &cached) {
        tracing::warn!(gate = %gate, %error, "caching the gate's key pair failed: served, but not after a restart without the control plane");
    }
    shared.publish(gate, &cached.pair);
    tracing::info!(gate = %gate, version = %tls.version, "the gate serves the certificate of its secrets");
}

/// Whether `chain_pem` and `key_pem` are what TLS can serve: PEM, at least
/// one certificate, a key rustls signs with that fits the leaf. The
/// leaf's expiry in milliseconds.
fn checked_pair(chain_pem: &str, key_pem: &str) -> Result<i64, String> {
    cca_tls::Certificate::from_pem(chain_pem, key_pem).map_err(|error| error.to_string())?;
    let leaf = CertInfo::parse(chain_pem).map_err(|error| error.to_string())?;
    Ok(millis(leaf.not_after))
}

fn millis(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |since| {
        i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
    })
}

/// Two thirds into the pair's life: `CertInfo::renew_at` of its leaf.
fn renew_at(pair: &GateKeyPair) -> SystemTime {
    match CertInfo::parse(&pair.chain_pem) {
        Ok(info) => info.renew_at(),
        Err(_) => UNIX_EPOCH,
    }
}

/// Names as one sorted list, DNS names in lower case: two certificates'
/// or a certificate's and a gate's compare by it.
fn host_list(names: &Names) -> Vec<String> {
    let mut list: Vec<String> = names
        .dns
        .iter()
        .map(|name| name.to_ascii_lowercase())
        .chain(names.ips.iter().map(ToString::to_string))
        .collect();
    list.sort();
    list.dedup();
    list
}

fn until(at: SystemTime, now: SystemTime) -> Duration {
    at.duration_since(now).unwrap_or_default()
}

/// A gate's cache file: its pair and what it was obtained for.
#[derive(Serialize, Deserialize)]
struct Cached {
    source: Source,
    pair: GateKeyPair,
}

#[derive(PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Source {
    /// Signed for these hosts (as [`host_list`] lists them).
    SelfSigned { hosts: Vec<String> },
    /// The values of these secrets at `version`.
    Secrets {
        cert: String,
        key: String,
        version: String,
    },
}

/// The cache file of `gate`; `None` for a name that is no file name
/// (gate names are letters, digits, `_` and `-`, so never in practice).
fn cache_file(dir: &Path, gate: &str) -> Option<PathBuf> {
    let plain = !gate.is_empty()
        && gate
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    plain.then(|| dir.join(format!("{gate}.json")))
}

fn load_cached(dir: &Path, gate: &str) -> Option<Cached> {
    let path = cache_file(dir, gate)?;
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => {
            tracing::warn!(gate = %gate, path = %path.display(), %error, "the gate's cached key pair is unreadable: waiting for the server's");
            return None;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(cached) => Some(cached),
        Err(error) => {
            tracing::warn!(gate = %gate, path = %path.display(), %error, "the gate's cached key pair does not parse: waiting for the server's");
            None
        }
    }
}

/// Whole or not at all: a temporary file made 0600, fsync'd, renamed,
/// in a directory only the agent reads.
fn save_cached(dir: &Path, gate: &str, cached: &Cached) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let Some(path) = cache_file(dir, gate) else {
        return Err(std::io::Error::other(format!(
            "`{gate}` cannot be a file name"
        )));
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let bytes = serde_json::to_vec(cached).map_err(std::io::Error::other)?;
    let temporary = dir.join(format!(".{gate}.json.tmp"));
    let _ = std::fs::remove_file(&temporary);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temporary)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, &path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

fn remove_cached(dir: &Path, gate: &str) {
    let Some(path) = cache_file(dir, gate) else {
        return;
    };
    if let Err(error) = std::fs::remove_file(&path)
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(gate = %gate, path = %path.display(), %error, "removing the gate's cached key pair failed");
    }
}

/// Removes the cache files of gates the map no longer has with TLS
/// (gone while the agent was stopped).
fn prune_cache(dir: &Path, wanted: &BTreeMap<&String, &Arc<GateSpec>>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(gate) = name.to_str().and_then(|name| name.strip_suffix(".json")) else {
            continue;
        };
        if !gate.starts_with('.') && !wanted.keys().any(|wanted| wanted.as_str() == gate) {
            remove_cached(dir, gate);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use cca_model::net::{NetworkChange, Touched};
    use cca_trust::gate::GATE_CERT_VALIDITY;
    use cca_trust::identity::Identity;
    use cca_trust::pki::{CA_VALIDITY, ClusterCa, Issue};

    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    /// The server's side: signs with a real CA, answers secrets at a
    /// version (none while `known` is it), or fails while `down`.
    struct FakeServer {
        ca: ClusterCa,
        down: AtomicBool,
        signed: AtomicU32,
        secrets: Mutex<Option<GateTls>>,
        /// The `known` of every secrets call.
        asked: Mutex<Vec<Option<String>>>,
    }

    impl FakeServer {
        fn new() -> Arc<Self> {
            Arc::new(FakeServer {
                ca: ClusterCa::generate("t", system_now(), CA_VALIDITY).expect("ca"),
                down: AtomicBool::new(false),
                signed: AtomicU32::new(0),
                secrets: Mutex::new(None),
                asked: Mutex::new(Vec::new()),
            })
        }

        fn fail_if_down(&self) -> Result<(), ClientError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(ClientError::Unreachable {
                    url: "https://server".into(),
                    reason: "connection refused".into(),
                });
            }
            Ok(())
        }

        fn set_secrets(&self, version: &str, chain_pem: &str, key_pem: &str) {
            *self.secrets.lock().expect("lock") = Some(GateTls {
                version: version.into(),
                chain_pem: chain_pem.into(),
                key_pem: key_pem.into(),
            });
        }

        /// A pair of the CA for `api.example.com`, as a user would set.
        fn issued(&self) -> (String, String) {
            let issued = self
                .ca
                .issue(
                    &Issue::new(
                        Identity::Server("api".into()),
                        Names::from_hosts(["api.example.com"]).expect("names"),
                    ),
                    system_now(),
                )
                .expect("issues");
            (issued.cert_pem, issued.key_pem)
        }
    }

    #[async_trait::async_trait]
    impl GateTlsSource for Arc<FakeServer> {
        async fn certificate(
            &self,
            node: &str,
            gate: &str,
            csr_pem: String,
        ) -> Result<GateCertificate, ClientError> {
            assert_eq!(node, "n1", "the node asks as itself");
            self.fail_if_down()?;
            let hosts = match gate {
                "shop" => vec!["shop.example.com", "*.shop.example.com"],
                "shop2" => vec!["shop.example.com", "new.example.com"],
                other => panic!("no self-signed gate {other}"),
            };
            let hosts = GateHosts::new(hosts).expect("hosts");
            let certificate = self
                .ca
                .sign_gate_csr(&csr_pem, &hosts, GATE_CERT_VALIDITY, system_now())
                .map_err(|error| ClientError::Api {
                    status: 422,
                    message: error.to_string(),
                    problems: Vec::new(),
                    retry_after: None,
                })?;
            self.signed.fetch_add(1, Ordering::SeqCst);
            Ok(GateCertificate {
                certificate_pem: certificate,
                ca_pem: self.ca.cert_pem().to_owned(),
            })
        }

        async fn secrets(
            &self,
            node: &str,
            gate: &str,
            known: Option<&str>,
        ) -> Result<Option<GateTls>, ClientError> {
            assert_eq!((node, gate), ("n1", "api"));
            self.asked
                .lock()
                .expect("lock")
                .push(known.map(str::to_owned));
            self.fail_if_down()?;
            let current = self.secrets.lock().expect("lock").clone();
            match current {
                Some(tls) if Some(tls.version.as_str()) == known => Ok(None),
                Some(tls) => Ok(Some(tls)),
                None => Err(ClientError::Api {
                    status: 409,
                    message: "secret `api_cert` has no value".into(),
                    problems: Vec::new(),
                    retry_after: None,
                }),
            }
        }
    }

    fn gate(name: &str, hosts: &[&str], tls: Tls) -> GateSpec {
        GateSpec {
            name: name.into(),
            hosts: hosts.iter().map(|host| (*host).to_owned()).collect(),
            service: "web".into(),
            port: 80,
            tls: Some(tls),
            ..GateSpec::default()
        }
    }

    fn shop() -> GateSpec {
        gate(
            "shop",
            &["shop.example.com", "*.shop.example.com"],
            Tls::SelfSigned,
        )
    }

    fn api() -> GateSpec {
        gate(
            "api",
            &["api.example.com"],
            Tls::Secrets {
                cert: "api_cert".into(),
                key: "api_key".into(),
            },
        )
    }

    fn view(revision: i64, gates: &[GateSpec]) -> Arc<NetworkView> {
        let mut view = NetworkView {
            revision,
            ..NetworkView::default()
        };
        for gate in gates {
            view.map.apply(
                NetworkChange::Gate(Arc::new(gate.clone())),
                &mut Touched::default(),
            );
        }
        Arc::new(view)
    }

    async fn until(
        pairs: &mut watch::Receiver<GateKeyPairs>,
        what: &str,
        done: impl Fn(&BTreeMap<String, GateKeyPair>) -> bool,
    ) -> GateKeyPairs {
        match tokio::time::timeout(365 * DAY, pairs.wait_for(|pairs| done(pairs))).await {
            Ok(Ok(pairs)) => Arc::clone(&pairs),
            _ => panic!("never: {what}"),
        }
    }

    fn hosts_of(pair: &GateKeyPair) -> Vec<String> {
        host_list(&CertInfo::parse(&pair.chain_pem).expect("parses").names)
    }

    #[tokio::test(start_paused = true)]
    async fn a_self_signed_gate_is_certified_renewed_at_two_thirds_and_on_new_hosts() {
        let server = FakeServer::new();
        let dir = tempfile::tempdir().expect("dir");
        let (views, network) = watch::channel(view(1, &[shop()]));
        let (stop, stopping) = watch::channel(false);
        let mut pairs =
            GateCertificates::spawn(Arc::clone(&server), "n1", dir.path(), network, stopping);

        let first = until(&mut pairs, "a certificate", |pairs| {
            pairs.contains_key("shop")
        })
        .await;
        let first = first["shop"].clone();
        assert_eq!(hosts_of(&first), ["*.shop.example.com", "shop.example.com"]);
        verify_issued(&first.chain_pem, server.ca.cert_pem(), system_now()).expect("the CA's");
        cca_trust::pki::check_key_matches(&first.chain_pem, &first.key_pem).expect("its key");
        assert!(
            first.chain_pem.ends_with(server.ca.cert_pem()),
            "the CA follows the leaf"
        );
        assert!(
            !format!("{first:?}").contains(&first.key_pem),
            "Debug hides the key"
        );
        assert_eq!(server.signed.load(Ordering::SeqCst), 1);

        // 90 days: nothing before 60, a new key and certificate after.
        tokio::time::sleep(59 * DAY).await;
        assert_eq!(server.signed.load(Ordering::SeqCst), 1, "not yet");
        tokio::time::sleep(2 * DAY).await;
        let renewed = until(&mut pairs, "a renewal", |pairs| pairs["shop"] != first).await;
        assert_eq!(server.signed.load(Ordering::SeqCst), 2);
        assert_ne!(renewed["shop"].key_pem, first.key_pem, "a new key");

        // The hosts change: a certificate for them at once.
        let mut changed = shop();
        changed.name = "shop2".into();
        changed.hosts = vec!["shop.example.com".into(), "new.example.com".into()];
        views.send_replace(view(2, &[shop(), changed]));
        let both = until(&mut pairs, "the second gate", |pairs| {
            pairs.contains_key("shop2")
        })
        .await;
        assert_eq!(
            hosts_of(&both["shop2"]),
            ["new.example.com", "shop.example.com"]
        );
        assert_eq!(
            both["shop"], renewed["shop"],
            "the other gate keeps its pair"
        );

        // A gate that goes is dropped, its cache file too.
        assert!(dir.path().join("gate-tls/shop.json").exists());
        views.send_replace(view(
            3,
            &[gate(
                "shop2",
                &["shop.example.com", "new.example.com"],
                Tls::SelfSigned,
            )],
        ));
        until(&mut pairs, "shop dropped", |pairs| {
            !pairs.contains_key("shop")
        })
        .await;
        assert!(!dir.path().join("gate-tls/shop.json").exists());
        stop.send_replace(true);
    }

    #[tokio::test(start_paused = true)]
    async fn a_secrets_gate_reloads_each_new_version_and_keeps_its_pair_on_a_bad_one() {
        let server = FakeServer::new();
        let (chain, key) = server.issued();
        server.set_secrets("1.2", &chain, &key);
        let dir = tempfile::tempdir().expect("dir");
        let (_views, network) = watch::channel(view(1, &[api()]));
        let (stop, stopping) = watch::channel(false);
        let mut pairs =
            GateCertificates::spawn(Arc::clone(&server), "n1", dir.path(), network, stopping);
        let got = until(&mut pairs, "the pair", |pairs| pairs.contains_key("api")).await;
        assert_eq!(
            (got["api"].chain_pem.as_str(), got["api"].key_pem.as_str()),
            (chain.as_str(), key.as_str())
        );

        // Polled with the version it has: 304s change nothing.
        tokio::time::sleep(25 * Duration::from_secs(1)).await;
        let asked = server.asked.lock().expect("lock").clone();
        assert_eq!(asked.first(), Some(&None));
        assert!(
            asked.len() >= 3
                && asked[1..]
                    .iter()
                    .all(|known| known.as_deref() == Some("1.2")),
            "{asked:?}"
        );

        // A value that is no PEM: the old pair stays.
        server.set_secrets("3.2", "not a certificate", &key);
        tokio::time::sleep(25 * Duration::from_secs(1)).await;
        assert_eq!(
            server.asked.lock().expect("lock").last(),
            Some(&Some("3.2".to_owned())),
            "the bad version was seen"
        );
        assert_eq!(
            pairs.borrow()["api"],
            got["api"],
            "the previous pair is served"
        );
        // A certificate with another's key: the same.
        let (other_chain, _) = server.issued();
        server.set_secrets("4.2", &other_chain, &key);
        tokio::time::sleep(25 * Duration::from_secs(1)).await;
        assert_eq!(
            pairs.borrow()["api"],
            got["api"],
            "a key that does not fit is refused"
        );

        // Set again, properly: served without a restart.
        let (new_chain, new_key) = server.issued();
        server.set_secrets("5.6", &new_chain, &new_key);
        let reloaded = until(&mut pairs, "the new pair", |pairs| {
            pairs["api"] != got["api"]
        })
        .await;
        assert_eq!(reloaded["api"].chain_pem, new_chain);
        assert_eq!(reloaded["api"].key_pem, new_key);
        stop.send_replace(true);
    }

    #[tokio::test]
    async fn a_restarted_gate_node_serves_its_cached_pairs_without_the_control_plane() {
        let server = FakeServer::new();
        let (chain, key) = server.issued();
        server.set_secrets("1.2", &chain, &key);
        let dir = tempfile::tempdir().expect("dir");
        let (_views, network) = watch::channel(view(1, &[shop(), api()]));
        let (stop, stopping) = watch::channel(false);
        let mut pairs =
            GateCertificates::spawn(Arc::clone(&server), "n1", dir.path(), network, stopping);
        let before = until(&mut pairs, "both pairs", |pairs| pairs.len() == 2).await;
        stop.send_replace(true);

        let cache = dir.path().join("gate-tls");
        let mode =
            |path: &Path| std::fs::metadata(path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&cache), 0o700);
        for gate in ["shop", "api"] {
            assert_eq!(mode(&cache.join(format!("{gate}.json"))), 0o600, "{gate}");
        }
        // A gate that went while the node was stopped.
        std::fs::copy(cache.join("shop.json"), cache.join("gone.json")).expect("copy");

        // Restarted, the control plane away: the cached pairs at once.
        server.down.store(true, Ordering::SeqCst);
        let (_views, network) = watch::channel(view(7, &[shop(), api()]));
        let (stop, stopping) = watch::channel(false);
        let mut pairs =
            GateCertificates::spawn(Arc::clone(&server), "n1", dir.path(), network, stopping);
        let after = until(&mut pairs, "the cached pairs", |pairs| pairs.len() == 2).await;
        assert_eq!(after, before);
        assert_eq!(
            server.signed.load(Ordering::SeqCst),
            1,
            "no new certificate asked for"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!cache.join("gone.json").exists(), "pruned against the map");
        assert_eq!(*pairs.borrow(), before, "kept while the server is down");
        stop.send_replace(true);
    }
}
