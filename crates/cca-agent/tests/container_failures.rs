//! Containers that cannot run, through the agent for real: a supervisor
//! over a `RuntimeSet` with the `oci` runtime (runc), a loopback
//! `docker-registry` and a throwaway node network. Each bad input — a tag
//! the registry lacks, a well-formed digest it lacks, a layer it serves
//! corrupted, a registry nobody listens for, an invalid reference — fails
//! its instance with a message naming the problem (the message `cca
//! describe instance` shows) and leaves nothing: no instance directory,
//! mount, cgroup, runc state, namespace, veth, lease or published port, and
//! no blob, layer, record or temporary file in the image store. A container
//! allocating past its memory limit is reported failed with its last exit
//! `oom_killed`. Skipped without root or the tools `scripts/test` installs.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cca_agent::supervisor::{SupervisorConfig, Tick};
use cca_image::ImageStore;
use cca_image::testing::{LayerBuilder, free_port, layer_blob_digest, write_oci_layout};
use cca_model::cluster::{Instance, InstanceState, InstanceStatus};
use cca_model::spec::{Memory, PortSpec, Resources, ServiceSpec};
use cca_net::{HostNetwork, KernelNetwork, NodeNetwork};
use cca_runtime::Runtime;
use cca_wire::types::Assignment;
use support::{
    BusyboxRegistry, NetGuard, Node, can_run, desired, image_service, instance, tick_until_within,
};

/// An assignment of `id` running `image` (with `command`, and a memory
/// limit when given), its one port on `host_port`.
fn assignment(
    id: &str,
    image: &str,
    command: &str,
    memory: Option<u64>,
    host_port: u16,
) -> Assignment {
    let service = ServiceSpec {
        ports: vec![PortSpec::tcp("http", 80)],
        resources: Resources {
            cpu: None,
            memory: memory.map(Memory),
        },
        ..image_service("web", image, command)
    };
    Assignment {
        instance: Instance {
            memory: Memory(memory.unwrap_or(0)),
            host_ports: BTreeMap::from([("http".into(), host_port)]),
            ..instance(id, "web")
        },
        spec: Some(service),
        secrets: Vec::new(),
        probes: Default::default(),
    }
}

fn status<'t>(tick: &'t Tick, id: &str) -> &'t InstanceStatus {
    tick.statuses
        .iter()
        .find(|status| status.id == id)
        .unwrap_or_else(|| panic!("no status of {id}: {:#?}", tick.statuses))
}

/// The entries of one of the image store's directories.
fn entries(store: &ImageStore, dir: &str) -> Vec<String> {
    std::fs::read_dir(store.root().join(dir))
        .expect("an image store dir")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

#[tokio::test]
async fn bad_images_fail_their_instances_with_the_reason_and_leave_nothing() {
    let test = "bad_images_fail";
    if !can_run(
        test,
        &["runc", "docker-registry", "skopeo", "busybox", "ip", "nft"],
    ) {
        return;
    }
    let fixture = BusyboxRegistry::start();
    let registry = &fixture.registry;
    let host = registry.host.clone();
    // An image of its own for the corrupt layer: the registry shares blobs
    // between repositories.
    let small = LayerBuilder::new()
        .dir("etc")
        .and_then(|layer| layer.file("etc/motd", b"tampered with\n", 0o644))
        .and_then(LayerBuilder::finish)
        .expect("a small layer");
    let tampered = tempfile::tempdir().expect("tempdir");
    write_oci_layout(tampered.path(), "1", std::slice::from_ref(&small), &["sh"]).expect("layout");
    registry
        .push(tampered.path(), "1", "test/tampered")
        .expect("push");
    let layer = layer_blob_digest(&small).expect("layer digest");
    registry
        .corrupt_blob(&layer)
        .expect("the layer is tampered with");
    let closed = format!("127.0.0.1:{}", free_port().expect("port"));
    let zeros = "0".repeat(64);

    let net = NetGuard::new('f', 197);
    let network = Arc::new(
        NodeNetwork::open(net.config.clone(), KernelNetwork::new()).expect("network opens"),
    );
    let node = Node::with(
        &[host.clone(), closed.clone()],
        Some(Arc::clone(&network) as Arc<dyn cca_agent::InstanceNetwork>),
    )
    .await;
    let (store, oci) = (&node.store, &node.oci);
    let cases: [(&'static str, String); 5] = [
        ("missing-tag", format!("{host}/test/busybox:2")),
        (
            "wrong-digest",
            format!("{host}/test/busybox@sha256:{zeros}"),
        ),
        ("corrupt-layer", format!("{host}/test/tampered:1")),
        ("unreachable", format!("{closed}/test/busybox:1")),
        ("invalid", format!("{host}/Test/BusyBox:1")),
    ];
    let _cleanup = node.cleanup(&cases.each_ref().map(|(id, _)| *id));
    let mut supervisor = node.supervisor_with(SupervisorConfig::default());

    let bad = desired(
        cases
            .iter()
            .map(|(id, image)| assignment(id, image, "sleep 60", None, free_port().expect("port")))
            .collect(),
    );
    let tick = tick_until_within(
        &mut supervisor,
        &bad,
        "every instance failed",
        Duration::from_secs(30),
        |t| {
            t.statuses.len() == cases.len()
                && t.statuses.iter().all(|s| s.state == InstanceState::Failed)
        },
    )
    .await;

    // What `cca describe instance` shows as the message of each.
    let pull_failed = |id: &str, image: &str| {
        format!("instance {id}: create failed: pulling the image failed: image {image}: ")
    };
    let mut messages = BTreeMap::new();
    for (id, image) in &cases {
        let status = status(&tick, id);
        assert_eq!(
            (status.restarts, &status.last_exit, status.pid),
            (0, &None, None),
            "{id} never ran"
        );
        let message = status.message.clone().unwrap_or_default();
        assert!(
            *id == "invalid" || message.starts_with(&pull_failed(id, image)),
            "{id}: {message}"
        );
        messages.insert(*id, message);
    }
    // Each says what to do about it, too.
    for (id, missing) in [
        ("missing-tag", "tag 2".to_owned()),
        ("wrong-digest", format!("digest sha256:{zeros}")),
    ] {
        let message = &messages[id];
        assert!(
            message.contains(&format!("registry {host}: "))
                && message.contains("manifest unknown")
                && message.ends_with(&format!(
                    "(the registry has no test/busybox with {missing}: check the reference, or \
                     push the image)"
                )),
            "{id}: {message}"
        );
    }
    let corrupt = &messages["corrupt-layer"];
    assert!(
        corrupt.contains(&format!("layer {layer}: the content's digest is sha256:"))
            && corrupt.ends_with("(corrupted at its source or on the way; nothing of it was kept)"),
        "{corrupt}"
    );
    let unreachable = &messages["unreachable"];
    assert!(
        unreachable.contains(&format!("registry {closed}: "))
            && unreachable.contains("Connection refused")
            && unreachable.ends_with("(is the registry running and reachable from this node?)"),
        "{unreachable}"
    );
    assert_eq!(
        messages["invalid"],
        format!(
            "instance invalid: create failed: invalid image reference \"{host}/Test/BusyBox:1\": \
             repository component \"Test\" must be lowercase letters, digits and '.', '_', '-' \
             inside"
        )
    );

    // Nothing half-created: not in the runtime, not in the network, not in
    // the image store.
    for (id, _) in &cases {
        node.assert_container_gone(id);
    }
    assert_eq!(oci.list().await.expect("list").len(), 0, "no container");
    assert_eq!(net.netns_left(), Vec::<String>::new(), "namespaces left");
    assert_eq!(net.veths_left(), Vec::<String>::new(), "veths left");
    assert_eq!(network.leases(), BTreeMap::new(), "leases left");
    assert_eq!(
        KernelNetwork::new()
            .list_ports(&net.config.table)
            .expect("ports"),
        Vec::new(),
        "published ports left"
    );
    assert!(
        store.images().expect("images").is_empty(),
        "an image record"
    );
    for dir in ["tmp", "blobs/sha256", "layers/sha256"] {
        assert_eq!(
            entries(store, dir),
            Vec::<String>::new(),
            "{dir} is not empty"
        );
    }

    // Failed instances are left alone: another tick starts nothing.
    let again = supervisor.tick(&bad).await;
    assert!(
        again
            .statuses
            .iter()
            .all(|s| s.state == InstanceState::Failed
                && s.message == messages.get(s.id.as_str()).cloned()),
        "{:#?}",
        again.statuses
    );
    assert!(entries(store, "blobs/sha256").is_empty());

    // Replaced by the scheduler (unassigned here): their observed records
    // go too, as for removed instances.
    let gone = supervisor.tick(&desired(Vec::new())).await;
    let mut removed = gone.removed.clone();
    removed.sort();
    let mut ids: Vec<&str> = cases.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    assert_eq!(removed, ids);
    assert!(
        supervisor
            .tick(&desired(Vec::new()))
            .await
            .removed
            .is_empty(),
        "forgotten once"
    );
}

#[tokio::test]
async fn a_container_over_its_memory_limit_is_reported_failed_oom_killed() {
    let test = "agent_oom_killed";
    if !can_run(test, &["runc", "docker-registry", "skopeo", "busybox"]) {
        return;
    }
    const ID: &str = "hog-1";
    const LIMIT: u64 = 32 << 20;
    let registry = BusyboxRegistry::start();
    let image = registry.image.clone();
    let node = Node::new(&registry).await;
    let _cleanup = node.cleanup(&[ID]);
    let mut supervisor = node.supervisor_with(SupervisorConfig {
        restart_threshold: 2,
        backoff_base: Duration::from_millis(20),
        stop_grace: Duration::from_millis(200),
        ..SupervisorConfig::default()
    });

    // busybox tail without -c keeps the last line; /dev/zero has none, so
    // it buffers all 200 MiB and the kernel kills it at 32 MiB.
    let hog = desired(vec![assignment(
        ID,
        &image,
        "echo allocating; head -c 200m /dev/zero | tail",
        Some(LIMIT),
        free_port().expect("port"),
    )]);
    let tick = tick_until_within(
        &mut supervisor,
        &hog,
        "failed",
        Duration::from_secs(60),
        |t| t.statuses.first().map(|s| s.state) == Some(InstanceState::Failed),
    )
    .await;
    let status = status(&tick, ID);
    let exit = status.last_exit.clone().expect("a last exit");
    assert_eq!(exit.reason, "oom_killed", "{status:#?}");
    assert_eq!(
        (exit.code, exit.signal),
        (None, Some(9)),
        "the shell reports tail's SIGKILL"
    );
    // The tail is of the log, which the failing run may still be
    // writing: its own "Killed" can land after the tail is read.
    assert!(
        exit.log_tail.iter().any(|line| line == "allocating")
            && exit.log_tail.iter().any(|line| line == "Killed"),
        "its output is kept: {:?}",
        exit.log_tail
    );
    assert_eq!(status.restarts, 1, "restarted once before giving up");
    assert_eq!(
        status.message.as_deref(),
        Some(
            format!(
                "out of memory (limit {LIMIT} bytes) by signal 9; gave up after 2 consecutive \
                 crashes"
            )
            .as_str()
        )
    );

    tick_until_within(
        &mut supervisor,
        &desired(Vec::new()),
        "removed",
        Duration::from_secs(15),
        |t| t.removed == [ID],
    )
    .await;
    node.assert_container_gone(ID);
}
