//! Init probes through the API on a loopback socket: an instance whose
//! init step probes a connection is assigned with the connection's host and
//! port, and with the VIP of the service its host names (`{svc}` or
//! `{svc}.cca.local`) once that service holds one, so the agent dials what
//! the workload would reach.

mod support;

use std::net::Ipv4Addr;

use cca_model::cluster::Instance;
use cca_model::keys;
use cca_model::net::Allocation;
use cca_model::spec::{ConnectionSpec, InitStep, Program, spec_hash};
use cca_store::{Op, Txn};
use cca_wire::types::{AssignmentLine, ProbeAddress};
use support::{harness, service};

fn connection(name: &str, host: &str) -> ConnectionSpec {
    ConnectionSpec {
        name: name.into(),
        driver: "postgres".into(),
        user: None,
        secret: None,
        host: host.into(),
        port: 5432,
        database: None,
        params: Default::default(),
        tenant: None,
    }
}

#[tokio::test]
async fn an_assignment_carries_where_its_init_probes_dial() {
    let h = harness().await;
    let (client, _stop) = h.serve().await;
    client
        .register(&support::node_request("n1"))
        .await
        .expect("registers");
    let mut web = service("web", 1);
    for (step, probed) in [("db", "db"), ("external", "external")] {
        web.init.push(InitStep {
            name: step.into(),
            command: None,
            image: None,
            probe: Some(probed.into()),
            timeout: None,
        });
    }
    let mut program = Program::default();
    program.services.insert("web".into(), web.clone());
    program.services.insert("pg".into(), service("pg", 1));
    program
        .connections
        .insert("db".into(), connection("db", "pg.cca.local"));
    program
        .connections
        .insert("external".into(), connection("external", "db.example"));
    client.apply(&program, false).await.expect("applies");
    let vip = Ipv4Addr::new(10, 96, 0, 7);
    let instance = Instance {
        spec_hash: spec_hash(&web),
        ..support::instance("web-1", "web", "n1")
    };
    let txn = Txn::new()
        .then(Op::put(
            keys::derived_vip("pg"),
            serde_json::to_vec(&Allocation::Held { address: vip }).expect("encodes"),
        ))
        .then(Op::put(
            keys::derived_instance("web", "web-1"),
            serde_json::to_vec(&instance).expect("encodes"),
        ));
    h.store.txn(txn).await.expect("written");
    let mut stream = client
        .assignments("n1", &cca_wire::types::Resume::SNAPSHOT)
        .await
        .expect("stream");
    let line = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
        .await
        .expect("a line in time")
        .expect("open")
        .expect("decodes");
    let AssignmentLine::Snapshot { assignments, .. } = line else {
        panic!("a snapshot first");
    };
    let probes = &assignments[0].probes;
    assert_eq!(
        probes["db"],
        ProbeAddress {
            host: "pg.cca.local".into(),
            port: 5432,
            vip: Some(vip),
        }
    );
    assert_eq!(
        probes["external"],
        ProbeAddress {
            host: "db.example".into(),
            port: 5432,
            vip: None,
        }
    );
}
