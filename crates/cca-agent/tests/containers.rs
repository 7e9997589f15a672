//! The agent running a real container end to end: a busybox image built in
//! the test and pushed to a loopback `docker-registry`, a supervisor over a
//! `RuntimeSet` with the real `oci` runtime (runc), an assignment naming
//! the image by tag. The agent pulls it, runs `busybox httpd` on the host
//! port it was given (containers share the host network for now), reports
//! it running, serves over loopback; once stopped and unassigned, nothing
//! is left: no instance directory, mount, cgroup or runc state. Skipped
//! without root or the tools `scripts/test` installs.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cca_agent::desired::Desired;
use cca_agent::supervisor::{Supervisor, SupervisorConfig, Tick};
use cca_agent::{Containers, RuntimeSet};
use cca_api::types::Assignment;
use cca_image::testing::{
    TestRegistry, busybox_layer, commands_available, free_port, write_oci_layout,
};
use cca_image::{ImageStore, RegistrySettings};
use cca_model::cluster::{Instance, InstanceState};
use cca_model::spec::{
    Cpu, Memory, Placement, PortSpec, Protocol, Resources, ServiceSpec, UpdateStrategy, Workload,
};
use cca_runtime::fake::FakeRuntime;
use cca_runtime::{OciConfig, OciRuntime, Runtime};

fn assignment(image: &str, host_port: u16, stopping: bool) -> Assignment {
    let service = ServiceSpec {
        name: "web".into(),
        workload: Workload::Image {
            image: image.into(),
            command: Some("busybox httpd -f -p $PORT -h /www".into()),
        },
        replicas: 1,
        ports: vec![PortSpec {
            name: Some("http".into()),
            number: 80,
            protocol: Protocol::Tcp,
        }],
        env: BTreeMap::new(),
        resources: Resources::default(),
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
            id: "web-1".into(),
            service: "web".into(),
            node: "n1".into(),
            ordinal: None,
            spec_hash: "h".into(),
            cpu: Cpu(0),
            memory: Memory(0),
            host_ports: BTreeMap::from([("http".into(), host_port)]),
            created_at: 0,
            stopping,
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

fn state(tick: &Tick) -> Option<InstanceState> {
    tick.statuses.first().map(|status| status.state)
}

/// `GET /` on loopback, the body when the answer is 200.
fn http_get(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .write_all(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    (head.split(' ').nth(1) == Some("200")).then(|| body.to_owned())
}

/// Force-deletes the test's container and unmounts its rootfs even when
/// an assertion failed, so a failed run leaves nothing behind either.
struct Cleanup {
    oci: Arc<OciRuntime>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let binary = self.oci.binary();
        let _ = std::process::Command::new(&binary.path)
            .arg("--root")
            .arg(&binary.state_root)
            .args(["delete", "--force", "web-1"])
            .output();
        let _ = rustix::mount::unmount(
            self.oci.instance_dir("web-1").join("bundle/rootfs"),
            rustix::mount::UnmountFlags::DETACH,
        );
    }
}

#[tokio::test]
async fn the_agent_pulls_an_image_runs_it_as_a_container_and_removes_it_completely() {
    let test = "agent_runs_a_container";
    if !commands_available(test, &["runc", "docker-registry", "skopeo", "busybox"]) {
        return;
    }
    if !rustix::process::geteuid().is_root() {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("skipping {test}: containers need root");
        }
        return;
    }
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
        stop_grace: Duration::from_millis(200),
        ..SupervisorConfig::default()
    };
    let mut supervisor = Supervisor::new("n1", "127.0.0.1", Arc::new(set), config, BTreeMap::new());

    let port = free_port().expect("port");
    let running = desired(vec![assignment(&image, port, false)]);
    tick_until(&mut supervisor, &running, "running", |t| {
        state(t) == Some(InstanceState::Running)
    })
    .await;
    assert_eq!(store.images().expect("images").len(), 1, "pulled by tag");
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        if let Some(body) = http_get(port) {
            break body;
        }
        let log = std::fs::read_to_string(oci.instance_dir("web-1").join("output.log"));
        assert!(Instant::now() < deadline, "httpd does not answer: {log:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(body, "hello from busybox\n");

    let stopping = desired(vec![assignment(&image, port, true)]);
    tick_until(&mut supervisor, &stopping, "stopped", |t| {
        state(t) == Some(InstanceState::Stopped)
    })
    .await;
    assert!(http_get(port).is_none(), "httpd is gone");
    let tick = tick_until(&mut supervisor, &desired(Vec::new()), "removed", |t| {
        t.removed == ["web-1"]
    })
    .await;
    assert!(tick.statuses.is_empty());

    let instance_dir = oci.instance_dir("web-1");
    assert!(!instance_dir.exists(), "{} is left", instance_dir.display());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mountinfo.contains(&instance_dir.display().to_string()),
        "a mount is left"
    );
    let cgroups: Vec<_> = oci
        .cgroup_dirs("web-1")
        .into_iter()
        .filter(|d| d.exists())
        .collect();
    assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}");
    let state_dir = oci.binary().state_root.join("web-1");
    assert!(
        !state_dir.exists(),
        "runc state {} is left",
        state_dir.display()
    );
    assert_eq!(
        store.images().expect("images").len(),
        1,
        "a named image stays after garbage collection"
    );
}
