//! A service volume in a real container, end to end: the agent's
//! supervisor over a `RuntimeSet` with the real `oci` runtime runs a
//! busybox container (image built in the test, pulled from a loopback
//! `docker-registry`) of a stateful service with a volume at `/data`. The
//! first instance writes a file there; it is stopped and removed, and its
//! replacement (same service and ordinal, a new instance) reads the file
//! back from inside its own container. On the host the data is in the
//! agent's volumes dir, `VOLUMES/db/data-0`; after removal nothing else is
//! left (no instance directory, mount, cgroup or runc state), while the
//! volume stays. Skipped without root or the tools `scripts/test` installs.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use cca_model::cluster::{Instance, InstanceState};
use cca_model::spec::{ServiceSpec, VolumeSpec};
use cca_runtime::Runtime;
use cca_wire::types::Assignment;
use support::{BusyboxRegistry, Node, desired, image_service, instance, state, tick_until};

const FIRST: &str = "db-first";
const REPLACEMENT: &str = "db-second";

/// Instance `id` of the stateful service `db` at ordinal 0, running
/// `command` in the busybox image with the volume `data` at `/data`.
fn assignment(
    id: &str,
    image: &str,
    command: &str,
    replaces: Option<&str>,
    stopping: bool,
) -> Assignment {
    let service = ServiceSpec {
        volumes: vec![VolumeSpec {
            name: "data".into(),
            path: "/data".into(),
            size: None,
        }],
        stateful: true,
        ..image_service("db", image, command)
    };
    Assignment {
        instance: Instance {
            ordinal: Some(0),
            stopping,
            replaces: replaces.map(str::to_owned),
            ..instance(id, "db")
        },
        spec: Some(service),
        secrets: Vec::new(),
        probes: Default::default(),
    }
}

/// Waits until `path` holds `expected` (the workload writes it).
async fn wait_for_file(path: &Path, expected: &str, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if std::fs::read_to_string(path).is_ok_and(|text| text == expected) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} never held {expected:?}; container output: {:?}",
            path.display(),
            std::fs::read_to_string(log)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every file under `dir`, relative, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).expect("read_dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(dir).expect("under dir");
                files.push(relative.display().to_string());
            }
        }
    }
    files.sort();
    files
}

#[tokio::test]
async fn a_volume_keeps_a_containers_data_for_its_replacement_and_outlives_both() {
    let test = "container_volumes";
    if !support::can_run(test, &["runc", "docker-registry", "skopeo", "busybox"]) {
        return;
    }
    let registry = BusyboxRegistry::start();
    let node = Node::new(&registry).await;
    let _cleanup = node.cleanup(&[FIRST, REPLACEMENT]);
    let volumes = node.dir.path().join("volumes");
    let mut supervisor = node.supervisor().with_volumes_dir(&volumes);
    let volume = volumes.join("db/data-0");
    let image = registry.image.as_str();

    // The first instance writes into its volume, then idles.
    let write = "echo written by $CCA_INSTANCE > /data/greeting && exec sleep 600";
    let running = desired(vec![assignment(FIRST, image, write, None, false)]);
    tick_until(&mut supervisor, &running, "the first running", |t| {
        state(t) == Some(InstanceState::Running)
    })
    .await;
    let status = node.set.inspect(FIRST).await.expect("inspect");
    assert_eq!(status.spec.mounts.len(), 1, "{:?}", status.spec.mounts);
    let mount = &status.spec.mounts[0];
    assert_eq!(mount.source, volume, "bound from the volumes dir");
    assert_eq!(mount.target, "/data");
    assert!(!mount.read_only, "a volume is writable");
    let first_log = node.oci.instance_dir(FIRST).join("output.log");
    wait_for_file(
        &volume.join("greeting"),
        &format!("written by {FIRST}\n"),
        &first_log,
    )
    .await;

    // Stopped, then unassigned: removed, the volume stays.
    let stopping = desired(vec![assignment(FIRST, image, write, None, true)]);
    tick_until(&mut supervisor, &stopping, "the first stopped", |t| {
        state(t) == Some(InstanceState::Stopped)
    })
    .await;
    tick_until(
        &mut supervisor,
        &desired(Vec::new()),
        "the first removed",
        |t| t.removed == [FIRST],
    )
    .await;
    node.assert_container_gone(FIRST);
    assert!(volume.join("greeting").is_file(), "the volume outlives it");

    // The replacement finds the data inside its own container and adds to it.
    let read = "cat /data/greeting > /data/read-back && echo read by $CCA_INSTANCE >> /data/read-back && exec sleep 600";
    let replaced = desired(vec![assignment(
        REPLACEMENT,
        image,
        read,
        Some(FIRST),
        false,
    )]);
    tick_until(&mut supervisor, &replaced, "the replacement running", |t| {
        state(t) == Some(InstanceState::Running)
    })
    .await;
    let second_log = node.oci.instance_dir(REPLACEMENT).join("output.log");
    wait_for_file(
        &volume.join("read-back"),
        &format!("written by {FIRST}\nread by {REPLACEMENT}\n"),
        &second_log,
    )
    .await;

    let stopping = desired(vec![assignment(
        REPLACEMENT,
        image,
        read,
        Some(FIRST),
        true,
    )]);
    tick_until(&mut supervisor, &stopping, "the replacement stopped", |t| {
        state(t) == Some(InstanceState::Stopped)
    })
    .await;
    tick_until(
        &mut supervisor,
        &desired(Vec::new()),
        "the replacement removed",
        |t| t.removed == [REPLACEMENT],
    )
    .await;

    // Nothing of either container is left; the volume is, with both files.
    node.assert_container_gone(REPLACEMENT);
    node.assert_container_gone(FIRST);
    let instances = node.oci.instance_dir(FIRST);
    let instances = instances.parent().expect("the instances dir");
    assert_eq!(
        std::fs::read_dir(instances).expect("instances dir").count(),
        0,
        "instance directories are left in {}",
        instances.display()
    );
    assert_eq!(
        files_under(&volumes),
        ["db/data-0/greeting", "db/data-0/read-back"],
        "the volumes dir holds the volume's data and nothing else"
    );
    assert_eq!(
        node.store.images().expect("images").len(),
        1,
        "one image, pulled once, named, so kept by garbage collection"
    );
}
