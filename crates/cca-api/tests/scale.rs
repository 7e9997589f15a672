//! Scale to zero's routes over the API's real mTLS: only a gate node,
//! asking as itself, reports gate activity (merged: the later time per
//! service, unknown services dropped, no write when nothing changes) and
//! wakes an asleep service (at once, by the route's own write; idempotent;
//! 404 for an unknown service, 409 for one that never sleeps).

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;

use cca_api::{ServerCertificate, ServerTls, TlsListener};
use cca_model::cluster::GateListen;
use cca_model::keys;
use cca_model::scale::{GateActivity, ScaleCause, ScaleState};
use cca_model::spec::{Duration, Program};
use cca_store::{Op, RangeRequest, Txn};
use cca_trust::identity::Identity;
use cca_trust::pki::{CA_VALIDITY, CertAndKey, ClusterCa, Issue, Names};
use cca_wire::Client;
use cca_wire::tls::{ClientCertificate, ClientTls};
use tokio::sync::oneshot;

/// A cluster under certificate authentication: gate node `g1`, plain node
/// `n2`; services `web` (scale_to_zero 1m) and `api` (never sleeps).
struct Cluster {
    h: support::Harness,
    _stop: oneshot::Sender<()>,
    g1: Client,
    n2: Client,
}

impl Cluster {
    async fn start() -> Self {
        let config = cca_api::ApiConfig {
            authentication: cca_api::auth::Authentication::Certificates,
            ..cca_api::ApiConfig::default()
        };
        let h = support::harness_with(config).await;
        let now = cca_model::clock::system_now();
        let ca = Arc::new(ClusterCa::generate("test", now, CA_VALIDITY).expect("ca"));
        let server = issue(&ca, Identity::Server("s1".into()), &["localhost"]);
        let chain = format!("{}{}", server.cert_pem, ca.cert_pem());
        let certificate =
            Arc::new(ServerCertificate::from_pem(&chain, &server.key_pem).expect("server cert"));
        let tls = ServerTls::new(ca.cert_pem(), certificate).expect("tls");
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let url = format!(
            "https://localhost:{}",
            tcp.local_addr().expect("address").port()
        );
        let listener = TlsListener::new(tcp, &tls).expect("listener");
        let (stop, stopped) = oneshot::channel::<()>();
        let state = h.state.clone();
        tokio::spawn(async move {
            let _ = cca_api::serve(listener, state, async {
                let _ = stopped.await;
            })
            .await;
        });
        let client = |identity: Identity| {
            let issued = issue(&ca, identity, &[]);
            let presented = ClientCertificate::from_pem(&issued.cert_pem, &issued.key_pem)
                .expect("client cert");
            let tls = ClientTls::new(ca.cert_pem()).with_certificate(Arc::new(presented));
            Client::with_tls(&url, &tls).expect("client")
        };
        let admin = client(Identity::User("admin".into()));
        let cluster = Self {
            g1: client(Identity::Node("g1".into())),
            n2: client(Identity::Node("n2".into())),
            h,
            _stop: stop,
        };
        let mut gate_node = support::node_request("g1");
        gate_node.gate = GateListen {
            http: Some("0.0.0.0:80".into()),
            https: None,
        };
        cluster.g1.register(&gate_node).await.expect("g1 registers");
        cluster
            .n2
            .register(&support::node_request("n2"))
            .await
            .expect("n2 registers");
        admin
            .apply(&program(), false)
            .await
            .expect("the program applies");
        support::fresh(&cluster.h.state).await;
        cluster
    }

    async fn put_scale(&self, state: &ScaleState) {
        let bytes = serde_json::to_vec(state).expect("encodes");
        let txn = Txn::new().then(Op::put(keys::derived_scale("web"), bytes));
        self.h.store.txn(txn).await.expect("writes");
        support::fresh(&self.h.state).await;
    }

    async fn scale(&self) -> Option<ScaleState> {
        let kv = self
            .h
            .store
            .get(&keys::derived_scale("web"))
            .await
            .expect("reads")?;
        Some(serde_json::from_slice(&kv.value).expect("decodes"))
    }

    async fn activity(&self, node: &str) -> Option<GateActivity> {
        let kv = self
            .h
            .store
            .get(&keys::observed_gate_activity(node))
            .await
            .expect("reads")?;
        Some(serde_json::from_slice(&kv.value).expect("decodes"))
    }
}

fn issue(ca: &ClusterCa, identity: Identity, hosts: &[&str]) -> CertAndKey {
    let names = Names::from_hosts(hosts).expect("names");
    ca.issue(&Issue::new(identity, names), cca_model::clock::system_now())
        .expect("issues")
}

fn program() -> Program {
    let mut program = support::program(&[("web", 2), ("api", 1)]);
    if let Some(web) = program.services.get_mut("web") {
        web.scale_to_zero = Some(Duration(60_000));
    }
    program
}

fn status(error: &cca_wire::ClientError) -> u16 {
    match error {
        cca_wire::ClientError::Api { status, .. } => *status,
        other => panic!("not an API error: {other}"),
    }
}

fn asleep() -> ScaleState {
    ScaleState {
        asleep: true,
        since: 1,
        cause: ScaleCause::Idle {
            window: 60_000,
            last_activity: 0,
        },
    }
}

#[tokio::test]
async fn only_a_gate_node_as_itself_reports_and_wakes() {
    let cluster = Cluster::start().await;
    cluster.put_scale(&asleep()).await;
    let report = BTreeMap::from([("web".to_owned(), 5)]);
    let refused = cluster
        .n2
        .wake_service("n2", "web")
        .await
        .expect_err("not a gate node");
    assert_eq!(status(&refused), 403, "{refused}");
    assert!(refused.to_string().contains("not a gate node"), "{refused}");
    let refused = cluster
        .n2
        .report_gate_activity("n2", report.clone())
        .await
        .expect_err("not a gate node");
    assert_eq!(status(&refused), 403, "{refused}");
    let refused = cluster
        .n2
        .wake_service("g1", "web")
        .await
        .expect_err("not as another node");
    assert_eq!(status(&refused), 403, "{refused}");
    assert_eq!(cluster.scale().await, Some(asleep()), "nothing woke it");
    assert!(cluster.activity("n2").await.is_none());
    assert!(cluster.activity("g1").await.is_none());
}

#[tokio::test]
async fn a_wake_is_immediate_idempotent_and_recorded() {
    let cluster = Cluster::start().await;
    // Before the scale controller's first window: awake, nothing to do.
    let reply = cluster.g1.wake_service("g1", "web").await.expect("202");
    assert!(!reply.woke && reply.revision.is_none());
    cluster.put_scale(&asleep()).await;
    let reply = cluster.g1.wake_service("g1", "web").await.expect("202");
    assert!(reply.woke);
    let revision = reply.revision.expect("it wrote");
    // No controller runs in this harness: the route wrote the fact itself.
    let woken = cluster.scale().await.expect("a fact");
    assert!(!woken.asleep);
    assert_eq!(woken.cause, ScaleCause::Woken { node: "g1".into() });
    let events = cluster
        .h
        .store
        .range(RangeRequest::prefix("events/"))
        .await
        .expect("range");
    assert!(
        events.kvs.iter().any(|kv| {
            kv.mod_revision == revision
                && String::from_utf8_lossy(&kv.value)
                    .contains("woken by a request via gate node g1")
        }),
        "an event in the same transaction names who woke it"
    );
    let again = cluster.g1.wake_service("g1", "web").await.expect("202");
    assert!(!again.woke && again.revision.is_none(), "idempotent");
    assert_eq!(cluster.h.revision().await, revision, "and wrote nothing");

    let missing = cluster
        .g1
        .wake_service("g1", "nope")
        .await
        .expect_err("no such service");
    assert_eq!(status(&missing), 404, "{missing}");
    let never = cluster
        .g1
        .wake_service("g1", "api")
        .await
        .expect_err("never sleeps");
    assert_eq!(status(&never), 409, "{never}");
    assert!(never.to_string().contains("scale_to_zero"), "{never}");
}

#[tokio::test]
async fn activity_reports_merge_per_service() {
    let cluster = Cluster::start().await;
    let report = |pairs: &[(&str, i64)]| -> BTreeMap<String, i64> {
        pairs
            .iter()
            .map(|(name, at)| ((*name).to_owned(), *at))
            .collect()
    };
    let first = cluster
        .g1
        .report_gate_activity("g1", report(&[("web", 100), ("api", 40), ("ghost", 7)]))
        .await
        .expect("recorded");
    assert!(first.revision.is_some());
    assert_eq!(
        cluster.activity("g1").await.expect("a fact").services,
        report(&[("web", 100), ("api", 40)]),
        "a service that does not exist is dropped"
    );
    let older = cluster
        .g1
        .report_gate_activity("g1", report(&[("web", 50)]))
        .await
        .expect("answered");
    assert_eq!(older.revision, None, "an older time changes nothing");
    cluster
        .g1
        .report_gate_activity("g1", report(&[("web", 200)]))
        .await
        .expect("recorded");
    assert_eq!(
        cluster.activity("g1").await.expect("a fact").services,
        report(&[("web", 200), ("api", 40)])
    );
}
