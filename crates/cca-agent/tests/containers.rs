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

mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cca_agent::RuntimeSet;
use cca_agent::supervisor::{Supervisor, SupervisorConfig};
use cca_image::testing::free_port;
use cca_model::cluster::{Instance, InstanceState};
use cca_model::spec::{PortSpec, ServiceSpec};
use cca_net::{HostNetwork, KernelNetwork, NetConfig, NodeNetwork, Proto};
use cca_runtime::{OciRuntime, Runtime};
use cca_wire::types::Assignment;
use support::{
    BusyboxRegistry, NetGuard, Node, can_run, desired, image_service, instance, runtime_set, state,
    tick_until,
};

fn assignment(image: &str, host_port: u16, stopping: bool) -> Assignment {
    assignment_of("web-1", image, host_port, stopping)
}

fn assignment_of(id: &str, image: &str, host_port: u16, stopping: bool) -> Assignment {
    let service = ServiceSpec {
        ports: vec![PortSpec::tcp("http", 80)],
        ..image_service("web", image, "busybox httpd -f -p $PORT -h /www")
    };
    Assignment {
        instance: Instance {
            host_ports: BTreeMap::from([("http".into(), host_port)]),
            stopping,
            ..instance(id, "web")
        },
        spec: Some(service),
        secrets: Vec::new(),
        probes: Default::default(),
    }
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

#[tokio::test]
async fn the_agent_pulls_an_image_runs_it_as_a_container_and_removes_it_completely() {
    let test = "agent_runs_a_container";
    if !can_run(test, &["runc", "docker-registry", "skopeo", "busybox"]) {
        return;
    }
    let registry = BusyboxRegistry::start();
    let image = registry.image.clone();
    let node = Node::new(&registry).await;
    let _cleanup = node.cleanup(&["web-1"]);
    let (store, oci) = (&node.store, &node.oci);
    let mut supervisor = node.supervisor();

    let port = free_port().expect("port");
    let running = desired(vec![assignment(&image, port, false)]);
    tick_until(&mut supervisor, &running, "running", |t| {
        state(t) == Some(InstanceState::Running)
    })
    .await;
    assert_eq!(store.images().expect("images").len(), 1, "pulled by tag");
    let body = wait_for_httpd(oci, "web-1", IpAddr::V4(Ipv4Addr::LOCALHOST), port).await;
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

    node.assert_container_gone("web-1");
    assert_eq!(
        store.images().expect("images").len(),
        1,
        "a named image stays after garbage collection"
    );
}

#[tokio::test]
async fn with_a_node_network_a_container_has_its_own_address_and_published_ports() {
    let test = "agent_attaches_a_container";
    if !can_run(
        test,
        &["runc", "docker-registry", "skopeo", "busybox", "ip", "nft"],
    ) {
        return;
    }
    const ID: &str = "web-net";
    let registry = BusyboxRegistry::start();
    let image = registry.image.clone();

    // Declared first so it drops last: the container goes before its
    // namespace, the namespaces before the bridge.
    let net = NetGuard::new('a', 198);
    let network =
        NodeNetwork::open(net.config.clone(), KernelNetwork::new()).expect("network opens");
    let node = Node::with(
        std::slice::from_ref(&registry.registry.host),
        Some(Arc::new(network)),
    )
    .await;
    let _cleanup = node.cleanup(&[ID]);
    let (set, oci) = (&node.set, &node.oci);
    let report = set
        .cleanup_network_orphans()
        .await
        .expect("cleanup runs")
        .expect("there is a node network");
    assert_eq!(report, cca_net::CleanupReport::default());
    let mut supervisor = node.supervisor();

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
    let attachment = status
        .spec
        .network
        .clone()
        .expect("the container is attached");
    assert_eq!(attachment.address, address);
    assert_eq!(net.netns_left().len(), 1);

    // httpd listens on the declared port 80 ($PORT inside its namespace):
    // reached at its own address, and at the host port on loopback.
    let body = wait_for_httpd(oci, ID, IpAddr::V4(address), 80).await;
    assert_eq!(body, "hello from busybox\n");
    assert_eq!(
        http_get(port).as_deref(),
        Some("hello from busybox\n"),
        "the published host port on 127.0.0.1"
    );
    let published = KernelNetwork::new()
        .list_ports(&net.config.table)
        .expect("ports");
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
        KernelNetwork::new()
            .list_ports(&net.config.table)
            .expect("ports"),
        Vec::new(),
        "published ports left"
    );
    node.assert_container_gone(ID);
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
    let image = format!("{}/test/busybox@{}", fixture.registry.host, fixture.digest);
    let node = Node::new(&fixture).await;
    let _cleanup = node.cleanup(&[ID]);
    let (set, store, oci) = (&node.set, &node.store, &node.oci);
    let mut supervisor = node.supervisor();

    let port = free_port().expect("port");
    let running = desired(vec![assignment_of(ID, &image, port, false)]);
    tick_until(&mut supervisor, &running, "running", |t| {
        state(t) == Some(InstanceState::Running)
    })
    .await;
    let body = wait_for_httpd(oci, ID, IpAddr::V4(Ipv4Addr::LOCALHOST), port).await;
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
    node: &Node,
    config: &NetConfig,
    registry: &str,
) -> (Arc<RuntimeSet>, Supervisor) {
    let network = NodeNetwork::open(config.clone(), KernelNetwork::new()).expect("network opens");
    let set = runtime_set(
        &node.oci,
        &node.store,
        &[registry.to_owned()],
        Some(Arc::new(network)),
    );
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
    let supervisor = support::supervisor(&set, config);
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
    let net = NetGuard::new('a', 198);
    // The node's own set is not used: the agent's come and go.
    let node = Node::new(&fixture).await;
    let _cleanup = node.cleanup(&[ID]);
    let oci = &node.oci;
    let (set, mut supervisor) = agent_on_network(&node, &net.config, &host).await;
    let port = free_port().expect("port");
    let running = desired(vec![assignment_of(ID, &image, port, false)]);
    let tick = tick_until(&mut supervisor, &running, "running", |t| {
        state(t) == Some(InstanceState::Running)
    })
    .await;
    let address = tick.statuses[0].address.clone().expect("an address");
    let ip: IpAddr = address.parse().expect("an IP address");
    wait_for_httpd(oci, ID, ip, 80).await;
    let created = set
        .inspect(ID)
        .await
        .expect("inspect")
        .spec
        .network
        .clone()
        .expect("attached");

    // The host reboots: the container ends with it, the agent is gone, and
    // so are the namespace's mount and the veth.
    oci.stop(ID, Duration::ZERO)
        .await
        .expect("the container ends");
    drop((set, supervisor));
    let host_net = KernelNetwork::new();
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
    let (set, mut supervisor) = agent_on_network(&node, &net.config, &host).await;
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
        wait_for_httpd(oci, ID, ip, 80).await,
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
        KernelNetwork::new()
            .list_ports(&net.config.table)
            .expect("ports"),
        Vec::new(),
        "published ports left"
    );
    assert!(!oci.instance_dir(ID).exists(), "the instance is left");
}

/// A host-process service whose init step checks, with `check`, that it
/// runs in `image`'s filesystem.
fn process_with_image_init(id: &str, image: &str, check: &str) -> Assignment {
    let mut service = ServiceSpec {
        workload: cca_model::spec::Workload::Process {
            run: "exec sleep 1000".into(),
        },
        ..image_service("web", image, "unused")
    };
    service.init.push(cca_model::spec::InitStep {
        name: "check".into(),
        command: Some(check.into()),
        image: Some(image.into()),
        probe: None,
        timeout: None,
    });
    Assignment {
        instance: instance(id, "web"),
        spec: Some(service),
        secrets: Vec::new(),
        probes: Default::default(),
    }
}

/// An init step with an image of its own runs as a container of that
/// image (this host is Debian; the busybox image has no
/// `/etc/debian_version`), then the host process starts; a step that
/// fails there fails the instance, naming the step.
#[tokio::test]
async fn an_init_step_with_its_own_image_runs_in_that_image_before_a_host_process() {
    let test = "init_step_with_its_own_image";
    if !can_run(test, &["runc", "docker-registry", "skopeo", "busybox"]) {
        return;
    }
    assert!(
        std::path::Path::new("/etc/debian_version").exists(),
        "the test tells the image from the host by /etc/debian_version"
    );
    let registry = BusyboxRegistry::start();
    let node = Node::new(&registry).await;
    let _cleanup = node.cleanup(&["web-1.init-check", "web-2.init-check"]);
    let mut supervisor = node.supervisor();

    let in_image =
        process_with_image_init("web-1", &registry.image, "test ! -e /etc/debian_version");
    tick_until(&mut supervisor, &desired(vec![in_image]), "running", |t| {
        state(t) == Some(InstanceState::Running)
    })
    .await;
    node.assert_container_gone("web-1.init-check");

    let mut supervisor = node.supervisor();
    let on_host = process_with_image_init("web-2", &registry.image, "test -e /etc/debian_version");
    let tick = tick_until(&mut supervisor, &desired(vec![on_host]), "failed", |t| {
        state(t) == Some(InstanceState::Failed)
    })
    .await;
    let message = tick.statuses[0].message.clone().unwrap_or_default();
    assert!(
        message.contains("init step `check`") && message.contains("code 1"),
        "{message}"
    );
    node.assert_container_gone("web-2.init-check");
}
