//! What the agent's real-container tests share: skipping without root or
//! tools, the busybox test image in a loopback registry, a supervisor over
//! a `RuntimeSet` with the real `oci` runtime, ticking until a condition
//! holds, a guard that force-deletes containers and unmounts their rootfs
//! even when an assertion failed, and the check that nothing of a removed
//! container is left. (`containers.rs` predates this module and keeps its
//! own copies.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cca_agent::desired::Desired;
use cca_agent::supervisor::{Supervisor, SupervisorConfig, Tick};
use cca_agent::{Containers, RuntimeSet};
use cca_api::types::Assignment;
use cca_image::testing::{TestRegistry, busybox_layer, commands_available, write_oci_layout};
use cca_image::{ImageStore, RegistrySettings};
use cca_model::cluster::InstanceState;
use cca_runtime::fake::FakeRuntime;
use cca_runtime::{OciConfig, OciRuntime, Runtime};

/// Whether the test can run: root and `tools` on `PATH`; says why not.
pub(crate) fn can_run(test: &str, tools: &[&str]) -> bool {
    if !commands_available(test, tools) {
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

/// A loopback registry holding `test/busybox:1` (busybox-static, `sh`).
pub(crate) struct BusyboxRegistry {
    pub(crate) registry: TestRegistry,
    /// `127.0.0.1:PORT/test/busybox:1`.
    pub(crate) image: String,
}

impl BusyboxRegistry {
    pub(crate) fn start() -> Self {
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
        Self { registry, image }
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
    pub(crate) async fn new(registry: &BusyboxRegistry) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = ImageStore::open(dir.path().join("images")).expect("store");
        let oci = Arc::new(
            OciRuntime::new(OciConfig::new(dir.path().join("oci"), store.clone()))
                .await
                .expect("the oci runtime opens"),
        );
        let host = registry.registry.host.clone();
        let set = Arc::new(RuntimeSet::new(
            Arc::new(FakeRuntime::new()),
            Containers::new(
                Arc::clone(&oci) as Arc<dyn Runtime>,
                store.clone(),
                RegistrySettings::insecure(&[host]).expect("settings"),
            ),
        ));
        Self {
            dir,
            store,
            oci,
            set,
        }
    }

    /// A supervisor of node `n1` over the runtime set, stopping quickly.
    pub(crate) fn supervisor(&self) -> Supervisor {
        let config = SupervisorConfig {
            stop_grace: Duration::from_millis(200),
            ..SupervisorConfig::default()
        };
        Supervisor::new(
            "n1",
            "127.0.0.1",
            Arc::clone(&self.set) as Arc<dyn Runtime>,
            config,
            BTreeMap::new(),
        )
    }

    /// A guard that force-deletes `ids`' containers on drop.
    pub(crate) fn cleanup(&self, ids: &[&'static str]) -> Cleanup {
        Cleanup {
            oci: Arc::clone(&self.oci),
            ids: ids.to_vec(),
        }
    }

    /// Nothing of container `id` is left: no instance directory, mount,
    /// cgroup or OCI runtime state.
    pub(crate) fn assert_container_gone(&self, id: &str) {
        let instance_dir = self.oci.instance_dir(id);
        assert!(!instance_dir.exists(), "{} is left", instance_dir.display());
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert!(
            !mountinfo.contains(&instance_dir.display().to_string()),
            "a mount of {id} is left"
        );
        let cgroups: Vec<_> = self
            .oci
            .cgroup_dirs(id)
            .into_iter()
            .filter(|d| d.exists())
            .collect();
        assert!(cgroups.is_empty(), "cgroups of {id} left: {cgroups:?}");
        let state = self.oci.binary().state_root.join(id);
        assert!(!state.exists(), "runtime state {} is left", state.display());
    }
}

/// Force-deletes the test's containers and unmounts their rootfs even when
/// an assertion failed, so a failed run leaves nothing behind either.
pub(crate) struct Cleanup {
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

/// The node's assignments, known (as after a snapshot).
pub(crate) fn desired(assignments: Vec<Assignment>) -> Desired {
    Desired {
        revision: 1,
        known: true,
        assignments: assignments
            .into_iter()
            .map(|a| (a.instance.id.clone(), a))
            .collect(),
    }
}

/// Ticks until `done` holds, failing after 15 s with the last statuses.
pub(crate) async fn tick_until(
    supervisor: &mut Supervisor,
    desired: &Desired,
    what: &str,
    done: impl Fn(&Tick) -> bool,
) -> Tick {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let tick = supervisor.tick(desired).await;
        if done(&tick) {
            return tick;
        }
        assert!(
            Instant::now() < deadline,
            "never reached {what}: {:?}",
            tick.statuses
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The state of the one instance a tick describes.
pub(crate) fn state(tick: &Tick) -> Option<InstanceState> {
    tick.statuses.first().map(|status| status.state)
}
