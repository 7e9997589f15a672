//! The agent running a real container end to end: a busybox image built in
//! the test and pushed to a loopback `docker-registry`, a supervisor over a
//! `RuntimeSet` with the real `oci` runtime (runc), an assignment naming
//! the image by tag. The agent pulls it, runs `busybox httpd`, reports it
//! running, serves over loopback; once stopped and unassigned, nothing is
//! left: no instance directory, mount, cgroup or runc state. Without a node
//! network the container shares the host's and listens on its host port;
//! with one (a throwaway bridge, table and subnet) it has its own address,
//! listens on its declared port, is reached there and through the host
//! port published on 127.0.0.1, and leaves no namespace, veth or published
//! port behind either. An image named by digest runs the same way. After a
//! host reboot (simulated: the container ended, its namespace and veth
//! deleted by hand, the agent started again) the restarted container is
//! attached again, at its old address, with its host port published.
//! Skipped without root or the tools `scripts/test` installs.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cca_agent::desired::Desired;
use cca_agent::supervisor::{Supervisor, SupervisorConfig, Tick};
use cca_agent::{Containers, RuntimeSet};
use cca_api::types::Assignment;
use cca_image::testing::{
    TestRegistry, busybox_layer, commands_available, free_port, write_oci_layout,
};
use cca_image::{Digest, ImageStore, RegistrySettings};
use cca_model::cluster::{Instance, InstanceState};
use cca_model::spec::{
    Cpu, Memory, Placement, PortSpec, Protocol, Resources, ServiceSpec, UpdateStrategy, Workload,
};
use cca_net::{HostNetwork, IpNft, NetConfig, NodeNetwork, Proto};
use cca_runtime::fake::FakeRuntime;
use cca_runtime::{OciConfig, OciRuntime, Runtime};

fn assignment(image: &str, host_port: u16, stopping: bool) -> Assignment {
    assignment_of("web-1", image, host_port, stopping)
}

fn assignment_of(id: &str, image: &str, host_port: u16, stopping: bool) -> Assignment {
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
            id: id.into(),
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
    http_get_at(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
}

/// `GET /` at `address`, the body when the answer is 200.
fn http_get_at(address: IpAddr, port: u16) -> Option<String> {
    let mut stream =
        TcpStream::connect_timeout(&(address, port).into(), Duration::from_secs(2)).ok()?;
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
    id: &'static str,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let binary = self.oci.binary();
        let _ = std::process::Command::new(&binary.path)
            .arg("--root")
            .arg(&binary.state_root)
            .args(["delete", "--force", self.id])
            .output();
        let _ = rustix::mount::unmount(
            self.oci.instance_dir(self.id).join("bundle/rootfs"),
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
        id: "web-1",
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

/// The throwaway node network of one test: random bridge, table, prefixes
/// and subnet (the names cca-net's own tests use), removed on drop even
/// when an assertion failed.
struct NetGuard {
    config: NetConfig,
    _dir: tempfile::TempDir,
}

impl NetGuard {
    fn new() -> Self {
        let tag = format!("{:04x}", fastrand::u16(..));
        let dir = tempfile::tempdir().expect("a temporary state dir");
        let subnet = format!("10.198.{}.0/24", fastrand::u8(1..=254));
        let mut config = NetConfig::new(subnet.parse().expect("a valid test subnet"), dir.path());
        config.bridge = format!("ccaa{tag}");
        config.table = format!("ccaa_{tag}");
        config.netns_prefix = format!("ccaa{tag}-");
        config.veth_prefix = format!("va{tag}");
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

#[tokio::test]
async fn with_a_node_network_a_container_has_its_own_address_and_published_ports() {
    let test = "agent_attaches_a_container";
    if !commands_available(
        test,
        &["runc", "docker-registry", "skopeo", "busybox", "ip", "nft"],
    ) {
        return;
    }
    if !rustix::process::geteuid().is_root() {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("skipping {test}: containers need root");
        }
        return;
    }
    const ID: &str = "web-net";
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

    // Declared first so it drops last: the container goes before its
    // namespace, the namespaces before the bridge.
    let net = NetGuard::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(dir.path().join("images")).expect("store");
    let oci = Arc::new(
        OciRuntime::new(OciConfig::new(dir.path().join("oci"), store.clone()))
            .await
            .expect("the oci runtime opens"),
    );
    let _cleanup = Cleanup {
        oci: Arc::clone(&oci),
        id: ID,
    };
    let network = NodeNetwork::open(net.config.clone(), IpNft::new()).expect("network opens");
    let set = Arc::new(RuntimeSet::new(
        Arc::new(FakeRuntime::new()),
        Containers::new(
            Arc::clone(&oci) as Arc<dyn Runtime>,
            store.clone(),
            RegistrySettings::insecure(std::slice::from_ref(&registry.host)).expect("settings"),
        )
        .with_network(Arc::new(network)),
    ));
    let report = set
        .cleanup_network_orphans()
        .await
        .expect("cleanup runs")
        .expect("there is a node network");
    assert_eq!(report, cca_net::CleanupReport::default());
    let config = SupervisorConfig {
        stop_grace: Duration::from_millis(200),
        ..SupervisorConfig::default()
    };
    let mut supervisor = Supervisor::new(
        "n1",
        "127.0.0.1",
        Arc::clone(&set) as Arc<dyn Runtime>,
        config,
        BTreeMap::new(),
    );

    let port = free_port().expect("port");
    let running = desired(vec![assignment_of(ID, &image, port, false)]);
    let tick = tick_until(&mut supervisor, &running, "running", |t| {
        state(t) == Some(InstanceState::Running)
    })
    .await;
    let address: Ipv4Addr = tick.statuses[0]
        .address
        .as_deref()
        .expect("an address is reported")
        .parse()
        .expect("the reported address is an IPv4 address");
    assert!(
        net.config.subnet.contains(address),
        "{address} is not in {}",
        net.config.subnet
    );
    let status = set.inspect(ID).await.expect("inspect");
    let attachment = status.spec.network.expect("the container is attached");
    assert_eq!(attachment.address, address);
    assert_eq!(net.netns_left().len(), 1);

    // httpd listens on the declared port 80 ($PORT inside its namespace):
    // reached at its own address, and at the host port on loopback.
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        if let Some(body) = http_get_at(IpAddr::V4(address), 80) {
            break body;
        }
        let log = std::fs::read_to_string(oci.instance_dir(ID).join("output.log"));
        assert!(Instant::now() < deadline, "httpd does not answer: {log:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(body, "hello from busybox\n");
    assert_eq!(
        http_get(port).as_deref(),
        Some("hello from busybox\n"),
        "the published host port on 127.0.0.1"
    );
    let published = IpNft::new().list_ports(&net.config.table).expect("ports");
    assert_eq!(
        published
            .iter()
            .map(|p| (p.proto, p.host_port, p.container_port))
            .collect::<Vec<_>>(),
        [(Proto::Tcp, port, 80)],
        "the host port is published for its declared protocol only"
    );

    let stopping = desired(vec![assignment_of(ID, &image, port, true)]);
    tick_until(&mut supervisor, &stopping, "stopped", |t| {
        state(t) == Some(InstanceState::Stopped)
    })
    .await;
    assert!(http_get(port).is_none(), "httpd is gone");
    tick_until(&mut supervisor, &desired(Vec::new()), "removed", |t| {
        t.removed == [ID]
    })
    .await;

    assert!(!attachment.netns_path.exists(), "the namespace is left");
    assert_eq!(net.netns_left(), Vec::<String>::new(), "namespaces left");
    assert_eq!(net.veths_left(), Vec::<String>::new(), "veths left");
    assert_eq!(
        IpNft::new().list_ports(&net.config.table).expect("ports"),
        Vec::new(),
        "published ports left"
    );
    let instance_dir = oci.instance_dir(ID);
    assert!(!instance_dir.exists(), "{} is left", instance_dir.display());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mountinfo.contains(&instance_dir.display().to_string()),
        "a mount is left"
    );
    let cgroups: Vec<_> = oci
        .cgroup_dirs(ID)
        .into_iter()
        .filter(|d| d.exists())
        .collect();
    assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}");
}

/// A loopback registry holding `test/busybox:1`, and its manifest digest.
struct BusyboxRegistry {
    registry: TestRegistry,
    digest: Digest,
    _layout: tempfile::TempDir,
}

impl BusyboxRegistry {
    fn start() -> Self {
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
        Self {
            registry,
            digest,
            _layout: layout,
        }
    }
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

/// `GET /` at `address` until it answers 200, the body.
async fn wait_for_httpd(oci: &OciRuntime, id: &str, address: IpAddr, port: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(body) = http_get_at(address, port) {
            return body;
        }
        let log = std::fs::read_to_string(oci.instance_dir(id).join("output.log"));
        assert!(
            Instant::now() < deadline,
            "httpd does not answer at {address}:{port}: {log:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_agent_runs_an_image_named_by_digest() {
    let test = "agent_pulls_by_digest";
    if !can_run(test, &["runc", "docker-registry", "skopeo", "busybox"]) {
        return;
    }
    const ID: &str = "web-digest";
    let fixture = BusyboxRegistry::start();
    let host = &fixture.registry.host;
    let image = format!("{host}/test/busybox@{}", fixture.digest);

    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(dir.path().join("images")).expect("store");
    let oci = Arc::new(
        OciRuntime::new(OciConfig::new(dir.path().join("oci"), store.clone()))
            .await
            .expect("the oci runtime opens"),
    );
    let _cleanup = Cleanup {
        oci: Arc::clone(&oci),
        id: ID,
    };
    let set = Arc::new(RuntimeSet::new(
        Arc::new(FakeRuntime::new()),
        Containers::new(
            Arc::clone(&oci) as Arc<dyn Runtime>,
            store.clone(),
            RegistrySettings::insecure(std::slice::from_ref(host)).expect("settings"),
        ),
    ));
    let config = SupervisorConfig {
        stop_grace: Duration::from_millis(200),
        ..SupervisorConfig::default()
    };
    let mut supervisor = Supervisor::new(
        "n1",
        "127.0.0.1",
        Arc::clone(&set) as Arc<dyn Runtime>,
        config,
        BTreeMap::new(),
    );

    let port = free_port().expect("port");
    let running = desired(vec![assignment_of(ID, &image, port, false)]);
    tick_until(&mut supervisor, &running, "running", |t| {
        state(t) == Some(InstanceState::Running)
    })
    .await;
    let body = wait_for_httpd(&oci, ID, IpAddr::V4(Ipv4Addr::LOCALHOST), port).await;
    assert_eq!(body, "hello from busybox\n");
    let images = store.images().expect("images");
    assert_eq!(images.len(), 1, "one image pulled");
    assert_eq!(images[0].digest, fixture.digest, "the digest asked for");
    assert!(images[0].names.contains(&image), "{:?}", images[0].names);
    assert_eq!(
        set.inspect(ID)
            .await
            .expect("inspect")
            .spec
            .image
            .as_deref(),
        Some(image.as_str()),
        "the container runs the image named by its digest"
    );

    let stopping = desired(vec![assignment_of(ID, &image, port, true)]);
    tick_until(&mut supervisor, &stopping, "stopped", |t| {
        state(t) == Some(InstanceState::Stopped)
    })
    .await;
    tick_until(&mut supervisor, &desired(Vec::new()), "removed", |t| {
        t.removed == [ID]
    })
    .await;
    assert!(!oci.instance_dir(ID).exists(), "the instance is left");
}

/// An agent over `oci` with the node network of `config`, opened as at
/// agent start (bridge, table, published ports restored), its orphans
/// cleaned up; restarts after 20 ms.
async fn agent_on_network(
    config: &NetConfig,
    oci: &Arc<OciRuntime>,
    store: &ImageStore,
    registry: &str,
) -> (Arc<RuntimeSet>, Supervisor) {
    let network = NodeNetwork::open(config.clone(), IpNft::new()).expect("network opens");
    let set = Arc::new(RuntimeSet::new(
        Arc::new(FakeRuntime::new()),
        Containers::new(
            Arc::clone(oci) as Arc<dyn Runtime>,
            store.clone(),
            RegistrySettings::insecure(&[registry.to_owned()]).expect("settings"),
        )
        .with_network(Arc::new(network)),
    ));
    let report = set
        .cleanup_network_orphans()
        .await
        .expect("cleanup runs")
        .expect("there is a node network");
    assert_eq!(report, cca_net::CleanupReport::default(), "no orphans");
    let config = SupervisorConfig {
        stop_grace: Duration::from_millis(200),
        backoff_base: Duration::from_millis(20),
        ..SupervisorConfig::default()
    };
    let supervisor = Supervisor::new(
        "n1",
        "127.0.0.1",
        Arc::clone(&set) as Arc<dyn Runtime>,
        config,
        BTreeMap::new(),
    );
    (set, supervisor)
}

#[tokio::test]
async fn after_a_host_reboot_a_restarted_container_is_attached_again() {
    let test = "agent_reattaches_after_reboot";
    if !can_run(
        test,
        &["runc", "docker-registry", "skopeo", "busybox", "ip", "nft"],
    ) {
        return;
    }
    const ID: &str = "web-boot";
    let fixture = BusyboxRegistry::start();
    let host = fixture.registry.host.clone();
    let image = format!("{host}/test/busybox:1");

    // Declared first so it drops last: the container goes before its
    // namespace, the namespaces before the bridge.
    let net = NetGuard::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(dir.path().join("images")).expect("store");
    let oci = Arc::new(
        OciRuntime::new(OciConfig::new(dir.path().join("oci"), store.clone()))
            .await
            .expect("the oci runtime opens"),
    );
    let _cleanup = Cleanup {
        oci: Arc::clone(&oci),
        id: ID,
    };
    let (set, mut supervisor) = agent_on_network(&net.config, &oci, &store, &host).await;
    let port = free_port().expect("port");
    let running = desired(vec![assignment_of(ID, &image, port, false)]);
    let tick = tick_until(&mut supervisor, &running, "running", |t| {
        state(t) == Some(InstanceState::Running)
    })
    .await;
    let address = tick.statuses[0].address.clone().expect("an address");
    let ip: IpAddr = address.parse().expect("an IP address");
    wait_for_httpd(&oci, ID, ip, 80).await;
    let created = set
        .inspect(ID)
        .await
        .expect("inspect")
        .spec
        .network
        .expect("attached");

    // The host reboots: the container ends with it, the agent is gone, and
    // so are the namespace's mount and the veth.
    oci.stop(ID, Duration::ZERO)
        .await
        .expect("the container ends");
    drop((set, supervisor));
    let host_net = IpNft::new();
    let (netns, veth) = (net.config.netns_name(ID), net.config.veth_name(ID));
    host_net.delete_link(&veth).expect("the veth is deleted");
    host_net
        .delete_netns(&netns)
        .expect("the namespace is deleted");
    assert_eq!(net.netns_left(), Vec::<String>::new());
    assert_eq!(net.veths_left(), Vec::<String>::new());
    assert!(!created.netns_path.exists());
    assert!(http_get_at(ip, 80).is_none() && http_get(port).is_none());

    // The agent comes back and restarts the container: attached again,
    // at the same address, reached there and through its host port.
    let (set, mut supervisor) = agent_on_network(&net.config, &oci, &store, &host).await;
    let tick = tick_until(&mut supervisor, &running, "running again", |t| {
        state(t) == Some(InstanceState::Running)
    })
    .await;
    assert_eq!(tick.statuses[0].restarts, 1, "{:#?}", tick.statuses);
    assert_eq!(tick.statuses[0].address.as_deref(), Some(address.as_str()));
    assert_eq!(net.netns_left(), [netns]);
    assert_eq!(net.veths_left(), [veth]);
    assert_eq!(
        set.inspect(ID).await.expect("inspect").spec.network,
        Some(created.clone())
    );
    assert_eq!(
        wait_for_httpd(&oci, ID, ip, 80).await,
        "hello from busybox\n"
    );
    assert_eq!(
        http_get(port).as_deref(),
        Some("hello from busybox\n"),
        "the published host port on 127.0.0.1"
    );

    let stopping = desired(vec![assignment_of(ID, &image, port, true)]);
    tick_until(&mut supervisor, &stopping, "stopped", |t| {
        state(t) == Some(InstanceState::Stopped)
    })
    .await;
    tick_until(&mut supervisor, &desired(Vec::new()), "removed", |t| {
        t.removed == [ID]
    })
    .await;
    assert_eq!(net.netns_left(), Vec::<String>::new(), "namespaces left");
    assert_eq!(net.veths_left(), Vec::<String>::new(), "veths left");
    assert_eq!(
        IpNft::new().list_ports(&net.config.table).expect("ports"),
        Vec::new(),
        "published ports left"
    );
    assert!(!oci.instance_dir(ID).exists(), "the instance is left");
}
