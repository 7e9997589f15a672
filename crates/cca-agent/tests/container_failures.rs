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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cca_agent::desired::Desired;
use cca_agent::supervisor::{Supervisor, SupervisorConfig, Tick};
use cca_agent::{Containers, RuntimeSet};
use cca_api::types::Assignment;
use cca_image::testing::{
    LayerBuilder, TestRegistry, busybox_layer, commands_available, free_port, layer_blob_digest,
    write_oci_layout,
};
use cca_image::{ImageStore, RegistrySettings};
use cca_model::cluster::{Instance, InstanceState, InstanceStatus};
use cca_model::spec::{
    Cpu, Memory, Placement, PortSpec, Protocol, Resources, ServiceSpec, UpdateStrategy, Workload,
};
use cca_net::{HostNetwork, IpNft, NetConfig, NodeNetwork};
use cca_runtime::fake::FakeRuntime;
use cca_runtime::{OciConfig, OciRuntime, Runtime};

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
        name: "web".into(),
        workload: Workload::Image {
            image: image.into(),
            command: Some(command.into()),
        },
        replicas: 1,
        ports: vec![PortSpec {
            name: Some("http".into()),
            number: 80,
            protocol: Protocol::Tcp,
        }],
        env: BTreeMap::new(),
        resources: Resources {
            cpu: None,
            memory: memory.map(Memory),
        },
        health: None,
        placement: Placement::default(),
        connections: Vec::new(),
        volumes: Vec::new(),
        init: Vec::new(),
        update: UpdateStrategy::default(),
        budget: None,
        autoscale: None,
        stateful: false,
        scale_to_zero: None,
    };
    Assignment {
        instance: Instance {
            id: id.into(),
            service: "web".into(),
            node: "n1".into(),
            ordinal: None,
            spec_hash: "h".into(),
            cpu: Cpu(0),
            memory: Memory(memory.unwrap_or(0)),
            host_ports: BTreeMap::from([("http".into(), host_port)]),
            created_at: 0,
            stopping: false,
            replaces: None,
            failures: Vec::new(),
        },
        spec: Some(service),
    }
}

fn desired(assignments: Vec<Assignment>) -> Desired {
    Desired {
        revision: 1,
        known: true,
        assignments: assignments
            .into_iter()
            .map(|a| (a.instance.id.clone(), a))
            .collect(),
    }
}

async fn tick_until(
    supervisor: &mut Supervisor,
    desired: &Desired,
    what: &str,
    within: Duration,
    done: impl Fn(&Tick) -> bool,
) -> Tick {
    let deadline = Instant::now() + within;
    loop {
        let tick = supervisor.tick(desired).await;
        if done(&tick) {
            return tick;
        }
        assert!(
            Instant::now() < deadline,
            "never reached {what}: {:#?}",
            tick.statuses
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn status<'t>(tick: &'t Tick, id: &str) -> &'t InstanceStatus {
    tick.statuses
        .iter()
        .find(|status| status.id == id)
        .unwrap_or_else(|| panic!("no status of {id}: {:#?}", tick.statuses))
}

/// Whether the test can run here; prints why not.
fn can_run(test: &str, commands: &[&str]) -> bool {
    if !commands_available(test, commands) {
        return false;
    }
    if !rustix::process::geteuid().is_root() {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("skipping {test}: containers need root");
        }
        return false;
    }
    true
}

/// Force-deletes the test's containers, unmounts their rootfs and removes
/// their cgroups even when an assertion failed.
struct Cleanup {
    oci: Arc<OciRuntime>,
    ids: Vec<&'static str>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let binary = self.oci.binary();
        for id in &self.ids {
            let _ = std::process::Command::new(&binary.path)
                .arg("--root")
                .arg(&binary.state_root)
                .args(["delete", "--force", id])
                .output();
            let _ = rustix::mount::unmount(
                self.oci.instance_dir(id).join("bundle/rootfs"),
                rustix::mount::UnmountFlags::DETACH,
            );
            for cgroup in self.oci.cgroup_dirs(id) {
                let _ = std::fs::remove_dir(cgroup);
            }
        }
    }
}

/// The throwaway node network of one test: random bridge, table, prefixes
/// and subnet, removed on drop even when an assertion failed.
struct NetGuard {
    config: NetConfig,
    _dir: tempfile::TempDir,
}

impl NetGuard {
    fn new() -> Self {
        let tag = format!("{:04x}", fastrand::u16(..));
        let dir = tempfile::tempdir().expect("a temporary state dir");
        let subnet = format!("10.197.{}.0/24", fastrand::u8(1..=254));
        let mut config = NetConfig::new(subnet.parse().expect("a valid test subnet"), dir.path());
        config.bridge = format!("ccaf{tag}");
        config.table = format!("ccaf_{tag}");
        config.netns_prefix = format!("ccaf{tag}-");
        config.veth_prefix = format!("vf{tag}");
        Self { config, _dir: dir }
    }

    fn netns_left(&self) -> Vec<String> {
        IpNft::new()
            .list_netns()
            .expect("netns list")
            .into_iter()
            .filter(|ns| ns.starts_with(&self.config.netns_prefix))
            .collect()
    }

    fn veths_left(&self) -> Vec<String> {
        IpNft::new()
            .list_links()
            .expect("link list")
            .into_iter()
            .filter(|link| link.starts_with(&self.config.veth_prefix))
            .collect()
    }
}

impl Drop for NetGuard {
    fn drop(&mut self) {
        let host = IpNft::new();
        for netns in self.netns_left() {
            let _ = host.delete_netns(&netns);
        }
        for link in self.veths_left() {
            let _ = host.delete_link(&link);
        }
        let _ = host.delete_nat(&self.config.table);
        let _ = host.delete_bridge(&self.config.bridge);
    }
}

/// Nothing of `id` is left in the runtime: directory, mount, cgroups,
/// runc state.
fn assert_no_container(oci: &OciRuntime, id: &str) {
    let instance_dir = oci.instance_dir(id);
    assert!(!instance_dir.exists(), "{} is left", instance_dir.display());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mountinfo.contains(&instance_dir.display().to_string()),
        "a mount of {id} is left"
    );
    let cgroups: Vec<_> = oci
        .cgroup_dirs(id)
        .into_iter()
        .filter(|d| d.exists())
        .collect();
    assert!(cgroups.is_empty(), "cgroups of {id} left: {cgroups:?}");
    let state_dir = oci.binary().state_root.join(id);
    assert!(
        !state_dir.exists(),
        "runc state {} is left",
        state_dir.display()
    );
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
    let registry = TestRegistry::start().expect("registry");
    let host = registry.host.clone();
    let busybox = tempfile::tempdir().expect("tempdir");
    write_oci_layout(
        busybox.path(),
        "1",
        &[busybox_layer().expect("layer")],
        &["sh"],
    )
    .expect("layout");
    registry
        .push(busybox.path(), "1", "test/busybox")
        .expect("push");
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

    let net = NetGuard::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(dir.path().join("images")).expect("store");
    let oci = Arc::new(
        OciRuntime::new(OciConfig::new(dir.path().join("oci"), store.clone()))
            .await
            .expect("the oci runtime opens"),
    );
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
    let _cleanup = Cleanup {
        oci: Arc::clone(&oci),
        ids: cases.iter().map(|(id, _)| *id).collect(),
    };
    let network =
        Arc::new(NodeNetwork::open(net.config.clone(), IpNft::new()).expect("network opens"));
    let set = RuntimeSet::new(
        Arc::new(FakeRuntime::new()),
        Containers::new(
            Arc::clone(&oci) as Arc<dyn Runtime>,
            store.clone(),
            RegistrySettings::insecure(&[host.clone(), closed.clone()]).expect("settings"),
        )
        .with_network(Arc::clone(&network) as Arc<dyn cca_agent::InstanceNetwork>),
    );
    let mut supervisor = Supervisor::new(
        "n1",
        "127.0.0.1",
        Arc::new(set),
        SupervisorConfig::default(),
        BTreeMap::new(),
    );

    let bad = desired(
        cases
            .iter()
            .map(|(id, image)| assignment(id, image, "sleep 60", None, free_port().expect("port")))
            .collect(),
    );
    let tick = tick_until(
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
        assert_no_container(&oci, id);
    }
    assert_eq!(oci.list().await.expect("list").len(), 0, "no container");
    assert_eq!(net.netns_left(), Vec::<String>::new(), "namespaces left");
    assert_eq!(net.veths_left(), Vec::<String>::new(), "veths left");
    assert_eq!(network.leases(), BTreeMap::new(), "leases left");
    assert_eq!(
        IpNft::new().list_ports(&net.config.table).expect("ports"),
        Vec::new(),
        "published ports left"
    );
    assert!(
        store.images().expect("images").is_empty(),
        "an image record"
    );
    for dir in ["tmp", "blobs/sha256", "layers/sha256"] {
        assert_eq!(
            entries(&store, dir),
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
    assert!(entries(&store, "blobs/sha256").is_empty());

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
    let layout = tempfile::tempdir().expect("tempdir");
    write_oci_layout(
        layout.path(),
        "1",
        &[busybox_layer().expect("layer")],
        &["sh"],
    )
    .expect("layout");
    let registry = TestRegistry::start().expect("registry");
    registry
        .push(layout.path(), "1", "test/busybox")
        .expect("push");
    let image = format!("{}/test/busybox:1", registry.host);

    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(dir.path().join("images")).expect("store");
    let oci = Arc::new(
        OciRuntime::new(OciConfig::new(dir.path().join("oci"), store.clone()))
            .await
            .expect("the oci runtime opens"),
    );
    let _cleanup = Cleanup {
        oci: Arc::clone(&oci),
        ids: vec![ID],
    };
    let set = RuntimeSet::new(
        Arc::new(FakeRuntime::new()),
        Containers::new(
            Arc::clone(&oci) as Arc<dyn Runtime>,
            store.clone(),
            RegistrySettings::insecure(std::slice::from_ref(&registry.host)).expect("settings"),
        ),
    );
    let config = SupervisorConfig {
        restart_threshold: 2,
        backoff_base: Duration::from_millis(20),
        stop_grace: Duration::from_millis(200),
        ..SupervisorConfig::default()
    };
    let mut supervisor = Supervisor::new("n1", "127.0.0.1", Arc::new(set), config, BTreeMap::new());

    // busybox tail without -c keeps the last line; /dev/zero has none, so
    // it buffers all 200 MiB and the kernel kills it at 32 MiB.
    let hog = desired(vec![assignment(
        ID,
        &image,
        "echo allocating; head -c 200m /dev/zero | tail",
        Some(LIMIT),
        free_port().expect("port"),
    )]);
    let tick = tick_until(
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
    assert!(
        exit.log_tail
            .ends_with(&["allocating".to_owned(), "Killed".to_owned()]),
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

    tick_until(
        &mut supervisor,
        &desired(Vec::new()),
        "removed",
        Duration::from_secs(15),
        |t| t.removed == [ID],
    )
    .await;
    assert_no_container(&oci, ID);
}
