//! Autoscaled services through the API on a loopback socket: `cca scale`
//! is refused for one (the autoscaler owns its count), and `GET
//! /v1/services/{name}/scale` answers what sets the count: the spec's for
//! a plain service; for an autoscaled one the bounds, the signals from the
//! instances' usage reports, and the autoscaler's decision. No controller
//! runs here: the decision is written by hand, as the lifecycle controller
//! would.

mod support;

use std::collections::BTreeMap;

use cca_model::autoscale::{Autoscaled, Metric};
use cca_model::cluster::{Instance, InstanceState, InstanceStatus};
use cca_model::keys;
use cca_model::spec::{Autoscale, HorizontalScale, Percent, Program, ServiceSpec, spec_hash};
use cca_model::usage::{NodeUsage, UsageSummary};
use cca_store::{Op, Store, Txn};
use support::{harness, service};

fn autoscaled() -> ServiceSpec {
    let mut spec = service("web", 2);
    spec.autoscale = Some(Autoscale {
        horizontal: Some(HorizontalScale {
            min: 2,
            max: 10,
            cpu: Some(Percent(70)),
            memory: None,
            requests_per_second: None,
        }),
        vertical: None,
    });
    spec
}

async fn put<T: serde::Serialize>(store: &dyn Store, key: String, value: &T) {
    let value = serde_json::to_vec(value).expect("encodes");
    store
        .txn(Txn::new().then(Op::put(key, value)))
        .await
        .expect("written");
}

#[tokio::test]
async fn scale_is_refused_for_an_autoscaled_service_and_why_shows_what_sets_the_count() {
    let h = harness().await;
    let (client, _stop) = h.serve().await;
    let mut program = Program::default();
    program.services.insert("web".into(), autoscaled());
    program.services.insert("plain".into(), service("plain", 3));
    client.apply(&program, false).await.expect("applies");

    let refused = client.scale("web", 5).await.expect_err("autoscaled");
    assert_eq!(refused.status(), Some(409));
    assert!(refused.to_string().contains("min 2, max 10"), "{refused}");
    client
        .scale("plain", 4)
        .await
        .expect("a plain service scales");
    let plain = client.scale_status("plain").await.expect("status");
    assert_eq!((plain.replicas, plain.autoscale.is_none()), (4, true));

    let now = cca_model::clock::now_millis();
    let mut usage = BTreeMap::new();
    for id in ["web-a", "web-b"] {
        let instance = Instance {
            spec_hash: spec_hash(&autoscaled()),
            ..support::instance(id, "web", "n1")
        };
        put(
            h.store.as_ref(),
            keys::derived_instance("web", id),
            &instance,
        )
        .await;
        let status = InstanceStatus {
            id: id.into(),
            service: "web".into(),
            node: "n1".into(),
            state: InstanceState::Running,
            healthy: None,
            pid: None,
            address: None,
            own_network: false,
            host_ports: Default::default(),
            restarts: 0,
            last_exit: None,
            message: None,
            updated_at: now,
        };
        put(h.store.as_ref(), keys::observed_instance(id), &status).await;
        let used = UsageSummary {
            cpu_millis: 140,
            ..UsageSummary::default()
        };
        usage.insert(id.to_owned(), used);
    }
    let report = NodeUsage {
        at: now,
        period_ms: 30_000,
        node: UsageSummary::default(),
        instances: usage,
        requests: BTreeMap::new(),
    };
    put(h.store.as_ref(), keys::observed_usage("n1"), &report).await;
    let decided = Autoscaled {
        replicas: 4,
        recommended: 4,
        window_ms: 300_000,
        superseded: vec![],
        last_change: None,
        holding: None,
    };
    put(h.store.as_ref(), keys::derived_autoscale("web"), &decided).await;

    let status = client.scale_status("web").await.expect("status");
    assert_eq!((status.replicas, status.spec_replicas), (4, 2));
    assert_eq!(status.autoscaled, Some(decided));
    let cpu = &status.signals[0];
    assert_eq!(cpu.metric, Metric::Cpu);
    let instance_cpu = support::instance("x", "web", "n1").cpu.0;
    assert_eq!(
        (cpu.reporting, cpu.used, cpu.request),
        (2, 280, instance_cpu)
    );
    let detail = client.service("web").await.expect("describe");
    assert_eq!(detail.summary.replicas, 4, "the autoscaler's count");
    let missing = client.scale_status("nope").await.expect_err("none");
    assert_eq!(missing.status(), Some(404));
}

#[tokio::test]
async fn scale_status_and_describe_show_the_vertical_recommendation() {
    let h = harness().await;
    let (client, _stop) = h.serve().await;
    let mut spec = service("api", 2);
    spec.autoscale = Some(Autoscale {
        horizontal: None,
        vertical: Some(cca_model::spec::VerticalScale {
            max_cpu: Some(cca_model::spec::Cpu(2_000)),
            ..Default::default()
        }),
    });
    let mut program = Program::default();
    program.services.insert("api".into(), spec);
    program.services.insert("plain".into(), service("plain", 1));
    client.apply(&program, false).await.expect("applies");

    let waiting = client.scale_status("api").await.expect("status");
    let vertical = waiting.vertical.expect("a vertical block");
    assert_eq!((vertical.samples, vertical.recommended), (0, None));
    assert_eq!(vertical.min_samples, cca_model::vertical::MIN_SAMPLES);

    let sizes = cca_model::vertical::Sizes {
        cpu: 230,
        memory: 96 << 20,
    };
    let decided = cca_model::vertical::VerticalScaled {
        window_ms: 3_600_000,
        sampled_at: 5,
        slices: vec![],
        recommended: Some(sizes),
        observed: Some(sizes),
        samples: 40,
        applied: None,
        holding: None,
    };
    put(h.store.as_ref(), keys::derived_vertical("api"), &decided).await;
    let status = client.scale_status("api").await.expect("status");
    let vertical = status.vertical.expect("a vertical block");
    assert_eq!((vertical.samples, vertical.recommended), (40, Some(sizes)));
    assert_eq!(vertical.bounds.max_cpu, Some(cca_model::spec::Cpu(2_000)));
    let detail = client.service("api").await.expect("describe");
    assert_eq!(detail.vertical.and_then(|v| v.recommended), Some(sizes));
    let plain = client.service("plain").await.expect("describe");
    assert_eq!(plain.vertical, None, "no block, no vertical status");
}

#[tokio::test]
async fn why_shows_the_requests_per_second_the_gates_counted() {
    let h = harness().await;
    let (client, _stop) = h.serve().await;
    let mut spec = service("web", 2);
    spec.autoscale = Some(Autoscale {
        horizontal: Some(HorizontalScale {
            min: 1,
            max: 10,
            cpu: None,
            memory: None,
            requests_per_second: Some(100),
        }),
        vertical: None,
    });
    let mut program = Program::default();
    program.services.insert("web".into(), spec);
    client.apply(&program, false).await.expect("applies");
    let report = NodeUsage {
        at: cca_model::clock::now_millis(),
        period_ms: 30_000,
        node: UsageSummary::default(),
        instances: BTreeMap::new(),
        requests: BTreeMap::from([("web".to_owned(), 8_400)]),
    };
    put(h.store.as_ref(), keys::observed_usage("gate-1"), &report).await;
    let status = client.scale_status("web").await.expect("status");
    let signal = status
        .signals
        .iter()
        .find(|signal| signal.metric == Metric::RequestsPerSecond)
        .expect("a requests-per-second signal");
    assert_eq!((signal.used, signal.request), (280_000, 100_000));
    assert_eq!(signal.recommended, 3, "280/s at 100/s each");
}
