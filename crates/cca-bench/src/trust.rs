//! The cluster PKI of a `--tls` run: a fresh cluster CA, the server's
//! certificate (`cca://server/bench`, for `127.0.0.1` and `localhost`),
//! the local admin's certificate for the harness (`cca://user/admin`,
//! whose `admin` role needs no stored record: it applies, scales and reads
//! status as an operator after `cca init` would) and one certificate per
//! simulated node (`cca://node/NAME`), so that every agent proves its own
//! identity and the API's node rule (a node acts only as itself) is
//! checked on every agent request, as in production. Everything is
//! issued before the cluster starts, so the cost of issuing is reported
//! apart ([`BenchPki::issue_seconds`]) and never inside a measured span;
//! the node certificates are issued on every core at once (a P-256 key
//! and a signature each). They live a day (`NODE_CERT_VALIDITY`): no
//! renewal fires within a run, so agents get clients, not `NodeTrust`.

use std::sync::Arc;

use cca_api::{ServerCertificate, ServerTls};
use cca_trust::config_dir::ADMIN_USER;
use cca_trust::identity::Identity;
use cca_trust::pki::{CA_VALIDITY, CertAndKey, ClusterCa, Issue, Names};
use cca_wire::Client;
use cca_wire::tls::{ClientCertificate, ClientTls};

use crate::BenchError;

/// The name of the benchmark's cluster and server.
const NAME: &str = "bench";

/// Every certificate of a `--tls` run, ready to serve and present.
pub(crate) struct BenchPki {
    ca_pem: String,
    server: ServerTls,
    harness: Arc<ClientCertificate>,
    nodes: Vec<Arc<ClientCertificate>>,
    issue_seconds: f64,
}

impl std::fmt::Debug for BenchPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BenchPki")
            .field("nodes", &self.nodes.len())
            .field("issue_seconds", &self.issue_seconds)
            .finish_non_exhaustive()
    }
}

impl BenchPki {
    /// A CA and every certificate, node `i` named `names[i]`. Blocks for
    /// as long as issuing takes (about a second for 5,000 nodes on two
    /// cores): call it off the async workers.
    pub(crate) fn generate(names: &[String]) -> Result<Self, BenchError> {
        let begun = std::time::Instant::now();
        let now = cca_model::clock::system_now();
        let ca = ClusterCa::generate(NAME, now, CA_VALIDITY).map_err(trust("the cluster CA"))?;
        let hosts = Names::from_hosts(["127.0.0.1", "localhost"])
            .map_err(trust("the server's host names"))?;
        let server = ca
            .issue(&Issue::new(Identity::Server(NAME.into()), hosts), now)
            .map_err(trust("the server certificate"))?;
        let chain = format!("{}{}", server.cert_pem, ca.cert_pem());
        let certificate = ServerCertificate::from_pem(&chain, &server.key_pem)
            .map_err(trust("the server certificate"))?;
        let server = ServerTls::new(ca.cert_pem(), Arc::new(certificate))
            .map_err(trust("the server's TLS settings"))?;
        let harness = ca
            .issue(
                &Issue::new(Identity::User(ADMIN_USER.into()), Names::none()),
                now,
            )
            .map_err(trust("the local admin's certificate"))?;
        let harness = client_certificate(&harness, "the local admin's certificate")?;
        let nodes = issue_nodes(&ca, names, now)?;
        Ok(Self {
            ca_pem: ca.cert_pem().to_owned(),
            server,
            harness,
            nodes,
            issue_seconds: begun.elapsed().as_secs_f64(),
        })
    }

    /// What the API's listeners serve with.
    pub(crate) fn server(&self) -> &ServerTls {
        &self.server
    }

    /// Seconds it took to make the CA and issue every certificate.
    pub(crate) fn issue_seconds(&self) -> f64 {
        self.issue_seconds
    }

    /// A client of `base` (`https://…`) that presents the local admin's
    /// certificate.
    pub(crate) fn harness_client(&self, base: &str) -> Result<Client, BenchError> {
        self.client(base, &self.harness)
    }

    /// A client of `base` that presents node `index`'s own certificate:
    /// one connection of its own, shared with no other node.
    pub(crate) fn node_client(&self, index: usize, base: &str) -> Result<Client, BenchError> {
        let certificate = self.nodes.get(index).ok_or_else(|| {
            BenchError::Trust(format!(
                "no certificate for node {index}: {} were issued",
                self.nodes.len()
            ))
        })?;
        self.client(base, certificate)
    }

    fn client(
        &self,
        base: &str,
        certificate: &Arc<ClientCertificate>,
    ) -> Result<Client, BenchError> {
        let tls = ClientTls::new(self.ca_pem.clone()).with_certificate(Arc::clone(certificate));
        Ok(Client::with_tls(base, &tls)?)
    }
}

/// Node certificates for `names`, issued on as many threads as there are
/// cores, in order.
fn issue_nodes(
    ca: &ClusterCa,
    names: &[String],
    now: std::time::SystemTime,
) -> Result<Vec<Arc<ClientCertificate>>, BenchError> {
    let threads = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    let chunk = names.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = names
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .map(|name| {
                            let issued = ca
                                .issue(
                                    &Issue::new(Identity::Node(name.clone()), Names::none()),
                                    now,
                                )
                                .map_err(|error| {
                                    BenchError::Trust(format!("node {name}'s certificate: {error}"))
                                })?;
                            client_certificate(&issued, "a node certificate")
                        })
                        .collect::<Result<Vec<_>, BenchError>>()
                })
            })
            .collect();
        let mut issued = Vec::with_capacity(names.len());
        for worker in workers {
            let part = worker.join().map_err(|_| BenchError::Task {
                what: "certificate issuing".into(),
                problem: "a thread panicked".into(),
            })??;
            issued.extend(part);
        }
        Ok(issued)
    })
}

fn client_certificate(
    issued: &CertAndKey,
    what: &'static str,
) -> Result<Arc<ClientCertificate>, BenchError> {
    ClientCertificate::from_pem(&issued.cert_pem, &issued.key_pem)
        .map(Arc::new)
        .map_err(trust(what))
}

fn trust<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> BenchError {
    move |error| BenchError::Trust(format!("{what}: {error}"))
}
