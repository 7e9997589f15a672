//! What the agent's real-container tests (`containers.rs`,
//! `container_failures.rs`, `container_volumes.rs`, `container_files.rs`)
//! share: skipping without root (as root, a missing tool fails), the busybox test image in a loopback registry,
//! an image service and its instance to build assignments from, a node's
//! image store and `oci` runtime with a `RuntimeSet` over them (with a
//! node network or without), a supervisor over it, ticking until a
//! condition holds, a guard that force-deletes containers and unmounts
//! their rootfs even when an assertion failed, a throwaway node network
//! removed on drop, and the check that nothing of a removed container is
//! left.

#![allow(dead_code, reason = "each test binary uses a part of this module")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cca_agent::desired::Desired;
use cca_agent::supervisor::{Supervisor, SupervisorConfig, Tick};
use cca_agent::{Containers, InstanceNetwork, RuntimeSet};
use cca_image::testing::{TestRegistry, busybox_layer, root_test, write_oci_layout};
use cca_image::{Digest, ImageStore, RegistrySettings};
use cca_model::cluster::{Instance, InstanceState};
use cca_model::spec::{Cpu, Memory, ServiceSpec, Workload};
use cca_net::{HostNetwork, KernelNetwork, NetConfig};
use cca_runtime::fake::FakeRuntime;
use cca_runtime::{OciConfig, OciRuntime, Runtime};
use cca_wire::types::Assignment;

/// Whether the test can run: skipped (saying why) when not root; as root
/// every one of `tools` must be on `PATH`, or the test fails.
pub(crate) fn can_run(test: &str, tools: &[&str]) -> bool {
    root_test(test, "containers", tools)
}

/// A loopback registry holding `test/busybox:1` (busybox-static, `sh`).
pub(crate) struct BusyboxRegistry {
    pub(crate) registry: TestRegistry,
    /// `127.0.0.1:PORT/test/busybox:1`.
    pub(crate) image: String,
    /// The image's manifest digest.
    pub(crate) digest: Digest,
}

impl BusyboxRegistry {
    pub(crate) fn start() -> Self {
        let layout = tempfile::tempdir().expect("tempdir");
        let digest = write_oci_layout(
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
        Self {
            registry,
            image,
            digest,
        }
    }
}

/// Service `name` running `command` in `image`, one replica, nothing else:
/// tests set what they need with `ServiceSpec { …, ..image_service(…) }`.
pub(crate) fn image_service(name: &str, image: &str, command: &str) -> ServiceSpec {
    ServiceSpec::new(
        name,
        Workload::Image {
            image: image.into(),
            command: Some(command.into()),
        },
    )
}

/// Instance `id` of `service` on node `n1`, running, no resources or host
/// ports: tests set what they need with `Instance { …, ..instance(…) }`.
pub(crate) fn instance(id: &str, service: &str) -> Instance {
    Instance {
        id: id.into(),
        service: service.into(),
        node: "n1".into(),
        ordinal: None,
        spec_hash: "h".into(),
        cpu: Cpu(0),
        memory: Memory(0),
        host_ports: BTreeMap::new(),
        created_at: 0,
        stopping: false,
        replaces: None,
        failures: Vec::new(),
        resized: None,
    }
}

/// A node's image store and `oci` runtime in a temporary data dir, and the
/// `RuntimeSet` over them (processes to a fake: these tests run images).
pub(crate) struct Node {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) store: ImageStore,
    pub(crate) oci: Arc<OciRuntime>,
    pub(crate) set: Arc<RuntimeSet>,
}

impl Node {
    /// Containers on the host's network, pulling from `registry`.
    pub(crate) async fn new(registry: &BusyboxRegistry) -> Self {
        Self::with(std::slice::from_ref(&registry.registry.host), None).await
    }

    /// Containers pulling over plain HTTP from `registries`, attached to
    /// `network` when given.
    pub(crate) async fn with(
        registries: &[String],
        network: Option<Arc<dyn InstanceNetwork>>,
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = ImageStore::open(dir.path().join("images")).expect("store");
        let oci = Arc::new(
            OciRuntime::new(OciConfig::new(dir.path().join("oci"), store.clone()))
                .await
                .expect("the oci runtime opens"),
        );
        let set = runtime_set(&oci, &store, registries, network);
        Self {
            dir,
            store,
            oci,
            set,
        }
    }

    /// A supervisor of node `n1` over the runtime set, stopping quickly.
    pub(crate) fn supervisor(&self) -> Supervisor {
        self.supervisor_with(SupervisorConfig {
            stop_grace: Duration::from_millis(200),
            ..SupervisorConfig::default()
        })
    }

    /// A supervisor of node `n1` over the runtime set.
    pub(crate) fn supervisor_with(&self, config: SupervisorConfig) -> Supervisor {
        supervisor(&self.set, config)
    }

    /// A guard that force-deletes `ids`' containers on drop.
    pub(crate) fn cleanup(&self, ids: &[&'static str]) -> Cleanup {
        Cleanup::new(&self.oci, ids)
    }

    /// Nothing of container `id` is left: no instance directory, mount,
    /// cgroup or OCI runtime state.
    pub(crate) fn assert_container_gone(&self, id: &str) {
        assert_container_gone(&self.oci, id);
    }
}

/// A `RuntimeSet` of a fake process runtime and `oci`'s containers from
/// `store`, pulling over plain HTTP from `registries`, attached to
/// `network` when given.
pub(crate) fn runtime_set(
    oci: &Arc<OciRuntime>,
    store: &ImageStore,
    registries: &[String],
    network: Option<Arc<dyn InstanceNetwork>>,
) -> Arc<RuntimeSet> {
    let mut containers = Containers::new(
        Arc::clone(oci) as Arc<dyn Runtime>,
        store.clone(),
        RegistrySettings::insecure(registries).expect("settings"),
    );
    if let Some(network) = network {
        containers = containers.with_network(network);
    }
    Arc::new(RuntimeSet::new(Arc::new(FakeRuntime::new()), containers))
}

/// A supervisor of node `n1` (address 127.0.0.1) over `set`.
pub(crate) fn supervisor(set: &Arc<RuntimeSet>, config: SupervisorConfig) -> Supervisor {
    Supervisor::new(
        "n1",
        "127.0.0.1",
        Arc::clone(set) as Arc<dyn Runtime>,
        config,
        BTreeMap::new(),
    )
}

/// Nothing of container `id` is left in `oci`: no instance directory,
/// mount, cgroup or OCI runtime state.
pub(crate) fn assert_container_gone(oci: &OciRuntime, id: &str) {
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
    let state = oci.binary().state_root.join(id);
    assert!(!state.exists(), "runtime state {} is left", state.display());
}

/// Force-deletes the test's containers and unmounts their rootfs even when
/// an assertion failed, so a failed run leaves nothing behind either.
pub(crate) struct Cleanup {
    oci: Arc<OciRuntime>,
    ids: Vec<&'static str>,
}

impl Cleanup {
    pub(crate) fn new(oci: &Arc<OciRuntime>, ids: &[&'static str]) -> Self {
        Self {
            oci: Arc::clone(oci),
            ids: ids.to_vec(),
        }
    }
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
/// and a subnet in `10.{octet}.0.0/16` (the names cca-net's own tests
/// use, marked with `letter` so test files differ), removed on drop even
/// when an assertion failed. Declare it before the node and the cleanup
/// guard so it drops last: containers go before their namespaces, the
/// namespaces before the bridge.
pub(crate) struct NetGuard {
    pub(crate) config: NetConfig,
    _dir: tempfile::TempDir,
}

impl NetGuard {
    pub(crate) fn new(letter: char, octet: u8) -> Self {
        let tag = format!("{:04x}", fastrand::u16(..));
        let dir = tempfile::tempdir().expect("a temporary state dir");
        let subnet = format!("10.{octet}.{}.0/24", fastrand::u8(1..=254));
        let mut config = NetConfig::new(subnet.parse().expect("a valid test subnet"), dir.path());
        config.bridge = format!("cca{letter}{tag}");
        config.table = format!("cca{letter}_{tag}");
        config.netns_prefix = format!("cca{letter}{tag}-");
        config.veth_prefix = format!("v{letter}{tag}");
        Self { config, _dir: dir }
    }

    pub(crate) fn netns_left(&self) -> Vec<String> {
        KernelNetwork::new()
            .list_netns()
            .expect("netns list")
            .into_iter()
            .filter(|ns| ns.starts_with(&self.config.netns_prefix))
            .collect()
    }

    pub(crate) fn veths_left(&self) -> Vec<String> {
        KernelNetwork::new()
            .list_links()
            .expect("link list")
            .into_iter()
            .filter(|link| link.starts_with(&self.config.veth_prefix))
            .collect()
    }
}

impl Drop for NetGuard {
    fn drop(&mut self) {
        let host = KernelNetwork::new();
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

/// The node's assignments, known (as after a snapshot).
pub(crate) fn desired(assignments: Vec<Assignment>) -> Desired {
    Desired {
        revision: 1,
        known: true,
        assignments: assignments
            .into_iter()
            .map(|a| (a.instance.id.clone(), a))
            .collect(),
        ..Desired::default()
    }
}

/// Ticks until `done` holds, failing after 15 s with the last statuses.
pub(crate) async fn tick_until(
    supervisor: &mut Supervisor,
    desired: &Desired,
    what: &str,
    done: impl Fn(&Tick) -> bool,
) -> Tick {
    tick_until_within(supervisor, desired, what, Duration::from_secs(15), done).await
}

/// Ticks until `done` holds, failing after `within` with the last statuses.
pub(crate) async fn tick_until_within(
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

/// The state of the one instance a tick describes.
pub(crate) fn state(tick: &Tick) -> Option<InstanceState> {
    tick.statuses.first().map(|status| status.state)
}
