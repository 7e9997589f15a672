//! A cluster of three machines on this one, for the cluster network's
//! tests: every "machine" is a network namespace. An underlay namespace
//! holds a bridge; a control namespace runs `cca server` on its underlay
//! address; three node namespaces each run a real `cca agent` (started with
//! `nsenter --net`, not `ip netns exec`, which remounts /sys and hides the
//! cgroups runc needs) whose `--address` is its underlay address, so the
//! agents build their bridges, VXLAN overlay, nftables and DNS servers
//! inside their own namespaces and never on the host. Test images are
//! imported into each node's image store before its agent starts.
//!
//! [`Lab`] owns everything a test makes, under a random tag, and removes
//! it when dropped, pass or fail: services deleted (their instances
//! stopped the way the agents stop them), then whatever is left killed —
//! agents, server, runc containers, every process in the test's
//! namespaces — and the namespaces, mounts and cgroups deleted.
//! [`Lab::finish`] does the same at the end of a passing test and asserts
//! that nothing of the test is left and that the host's own links and
//! nftables tables are as they were.
//!
//! The tests contend for the machine's two cores and for `/run/netns`, so
//! a lab holds an exclusive lock on a file for its lifetime: one lab at a
//! time on the machine, whether the tests run as threads (`cargo test`) or
//! as processes (`cargo nextest`). Holding it, a new lab first removes
//! what labs of killed test runs left (their drop never ran).

#![allow(dead_code, reason = "each test uses a different part")]
#![allow(clippy::print_stderr, reason = "a failed or skipped test says why")]

pub(crate) mod ebpf;
pub(crate) mod images;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs::File;
use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use images::Image;

pub(crate) const CCA: &str = env!("CARGO_BIN_EXE_cca");

/// How long a node's lease lives without a heartbeat (`--node-ttl`), and
/// how long an unreachable node's instances wait for it (`--lost-grace`):
/// short, so failure tests are quick.
pub(crate) const NODE_TTL: Duration = Duration::from_secs(2);
pub(crate) const LOST_GRACE: Duration = Duration::from_secs(2);

/// The underlay: the control namespace and the nodes' addresses on it.
const UNDERLAY_PREFIX: u8 = 24;
const CONTROL_ADDRESS: Ipv4Addr = Ipv4Addr::new(192, 168, 200, 10);
const API_PORT: u16 = 9770;

/// The node data plane's nftables table (VIPs and policy).
pub(crate) const SERVICE_TABLE: &str = "cca-svc";

/// A lab's directory in the temp dir starts with this.
const DIR_PREFIX: &str = "cca-netcluster-";

/// The commands the labs and their tests run.
const TOOLS: &[&str] = &[
    "ip", "nsenter", "nft", "runc", "busybox", "dig", "curl", "getent", "bpftool",
];

/// Whether a lab can run here: as root with every tool (a missing tool
/// fails the test: `scripts/test` installs them); otherwise the test
/// prints why it skips.
pub(crate) fn root_test(test: &str) -> bool {
    cca_image::testing::root_test(
        test,
        "network namespaces, runc containers and nftables",
        TOOLS,
    )
}

/// One machine of the lab.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    /// Its name in the cluster: `n1`, `n2`, `n3`.
    pub(crate) name: String,
    /// Its network namespace.
    pub(crate) netns: String,
    /// Its underlay address (`--address`).
    pub(crate) address: Ipv4Addr,
    /// The agent's data directory.
    pub(crate) data: PathBuf,
}

/// The VIP data plane a lab's agents run (`cca agent --dataplane`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataPlane {
    Nftables,
    Ebpf,
}

impl DataPlane {
    fn flag(self) -> &'static str {
        match self {
            DataPlane::Nftables => "nftables",
            DataPlane::Ebpf => "ebpf",
        }
    }
}

/// A cluster of one server and three agents in namespaces; see the module
/// docs.
pub(crate) struct Lab {
    tag: String,
    dir: tempfile::TempDir,
    /// Every namespace the lab made, in order.
    namespaces: Vec<String>,
    server: Option<Child>,
    agents: BTreeMap<String, Child>,
    pub(crate) nodes: Vec<Node>,
    pub(crate) url: String,
    host_before: HostSnapshot,
    torn_down: bool,
    /// The agents' VIP data plane.
    pub(crate) plane: DataPlane,
    /// More flags for every `cca agent`.
    agent_flags: Vec<String>,
    /// Held for the lab's lifetime (released when the file closes).
    _lock: File,
}

impl Lab {
    /// Builds the lab and waits until the three nodes are ready with their
    /// node networks up; `images` are imported into every node first.
    pub(crate) fn start(images: &[Image]) -> Lab {
        Lab::start_with(DataPlane::Nftables, images, &[])
    }

    /// `start` with the agents on `plane`.
    pub(crate) fn on_plane(plane: DataPlane, images: &[Image]) -> Lab {
        Lab::start_with(plane, images, &[])
    }

    /// `start`, the agents on `plane` and with `agent_flags` too.
    pub(crate) fn start_with(plane: DataPlane, images: &[Image], agent_flags: &[&str]) -> Lab {
        let lock = exclusive_lock();
        sweep_stale_labs();
        let host_before = HostSnapshot::take();
        let tag = format!("ccm{:05x}", random() & 0xfffff);
        let mut lab = Lab {
            tag,
            dir: tempfile::Builder::new()
                .prefix(DIR_PREFIX)
                .tempdir()
                .expect("a temp dir"),
            namespaces: Vec::new(),
            server: None,
            agents: BTreeMap::new(),
            nodes: Vec::new(),
            url: format!("http://{CONTROL_ADDRESS}:{API_PORT}"),
            host_before,
            torn_down: false,
            plane,
            agent_flags: ["--dataplane", plane.flag()]
                .into_iter()
                .chain(agent_flags.iter().copied())
                .map(ToString::to_string)
                .collect(),
            _lock: lock,
        };
        lab.underlay();
        lab.start_server();
        let layouts = images::build_all(images, &lab.dir.path().join("layouts"));
        for index in 0..lab.nodes.len() {
            for (image, layout) in images.iter().zip(&layouts) {
                lab.import(index, image.name, layout);
            }
            lab.start_agent(index);
        }
        lab.wait_for_nodes();
        lab
    }

    /// The underlay bridge in its namespace, the control namespace and the
    /// three node namespaces, each with a veth onto the bridge. The
    /// machines have no default route, as on an isolated network: what
    /// reaches service VIPs from a node's own processes is the agent's.
    fn underlay(&mut self) {
        let underlay = self.make_netns("ul");
        ip(&["-n", &underlay, "link", "add", "ul0", "type", "bridge"]);
        ip(&["-n", &underlay, "link", "set", "ul0", "up"]);
        let machines = [("ctl", CONTROL_ADDRESS)]
            .into_iter()
            .chain((1..=3u8).map(|i| ("", Ipv4Addr::new(192, 168, 200, 10 + i))));
        for (index, (role, address)) in machines.enumerate() {
            let name = if role.is_empty() {
                format!("n{index}")
            } else {
                role.to_owned()
            };
            let netns = self.make_netns(&name);
            let veth = format!("{}-u{index}", self.tag);
            ip(&[
                "-n", &underlay, "link", "add", &veth, "type", "veth", "peer", "name", "eth0",
                "netns", &netns,
            ]);
            ip(&["-n", &underlay, "link", "set", &veth, "master", "ul0", "up"]);
            let cidr = format!("{address}/{UNDERLAY_PREFIX}");
            ip(&["-n", &netns, "addr", "add", &cidr, "dev", "eth0"]);
            ip(&["-n", &netns, "link", "set", "eth0", "up"]);
            ip(&["-n", &netns, "link", "set", "lo", "up"]);
            if !role.is_empty() {
                continue;
            }
            let data = self.dir.path().join(&name);
            std::fs::create_dir_all(&data).expect("a node data dir");
            self.nodes.push(Node {
                name,
                netns,
                address,
                data,
            });
        }
    }

    fn make_netns(&mut self, suffix: &str) -> String {
        let name = format!("{}-{suffix}", self.tag);
        ip(&["netns", "add", &name]);
        self.namespaces.push(name.clone());
        name
    }

    fn control_netns(&self) -> String {
        format!("{}-ctl", self.tag)
    }

    fn log_path(&self, who: &str) -> PathBuf {
        self.dir.path().join(format!("{who}.log"))
    }

    /// `cca server` in the control namespace on its underlay address, with
    /// its DNS server there too; waits until it listens.
    fn start_server(&mut self) {
        let store = format!("embedded:{}", self.dir.path().join("store").display());
        let listen = format!("{CONTROL_ADDRESS}:{API_PORT}");
        let dns = format!("{CONTROL_ADDRESS}:{}", cca_model::net::DNS_PORT);
        let (ttl, grace) = (seconds(NODE_TTL), seconds(LOST_GRACE));
        let log = self.log_path("server");
        let child = in_netns(&self.control_netns(), CCA)
            .args([
                "server",
                "--store",
                &store,
                "--listen",
                &listen,
                "--insecure",
            ])
            .args([
                "--dns-listen",
                &dns,
                "--node-ttl",
                &ttl,
                "--lost-grace",
                &grace,
            ])
            .args(["--startup-grace", "0s"])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("the server's log"))
            .spawn()
            .expect("cca server starts");
        self.server = Some(child);
        let announced = format!("cca server listening on {}", self.url);
        eventually("cca server to listen", Duration::from_secs(30), || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let exited = self
                .server
                .as_mut()
                .and_then(|server| server.try_wait().ok().flatten());
            assert!(exited.is_none(), "cca server exited ({exited:?}):\n{text}");
            text.contains(&announced).then_some(())
        });
    }

    /// `cca image import LAYOUT --name NAME` into node `index`'s store.
    fn import(&self, index: usize, name: &str, layout: &Path) {
        let node = &self.nodes[index];
        let output = Command::new(CCA)
            .arg("image")
            .arg("--data-dir")
            .arg(&node.data)
            .arg("import")
            .arg(layout)
            .args(["--name", name])
            .output()
            .expect("cca image import runs");
        assert!(
            output.status.success(),
            "importing {name} into {}: {}",
            node.name,
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// `cca agent` in node `index`'s namespace, tunnelling from its
    /// underlay address.
    fn start_agent(&mut self, index: usize) {
        let node = self.nodes[index].clone();
        let address = node.address.to_string();
        let child = in_netns(&node.netns, CCA)
            .args(["agent", "--server", &self.url, "--node", &node.name])
            .args(["--address", &address, "--cpu", "4", "--memory", "8Gi"])
            .args(["--restart-backoff", "200ms"])
            .args(&self.agent_flags)
            .arg("--data-dir")
            .arg(&node.data)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(self.log_path(&node.name)).expect("the agent's log"))
            .spawn()
            .expect("cca agent starts");
        self.agents.insert(node.name, child);
    }

    /// Every node ready and its node network up (its bridge holds its
    /// subnet's gateway).
    fn wait_for_nodes(&self) {
        eventually(
            "three ready nodes with their networks up",
            Duration::from_secs(30),
            || {
                let nodes = self.json(&["get", "nodes"]);
                let ready = nodes
                    .as_array()?
                    .iter()
                    .filter(|node| node["status"] == "ready")
                    .count();
                (ready == 3 && self.nodes.iter().all(|n| self.try_gateway(n).is_some()))
                    .then_some(())
            },
        );
    }

    /// The node's bridge address (its subnet's gateway, where its DNS
    /// server answers), once the node network is up.
    fn try_gateway(&self, node: &Node) -> Option<Ipv4Addr> {
        let output = ip_output(&["-n", &node.netns, "-4", "-o", "addr", "show", "dev", "cca0"]);
        let text = String::from_utf8_lossy(&output.stdout);
        let cidr = text
            .split_whitespace()
            .skip_while(|w| *w != "inet")
            .nth(1)?;
        cidr.split('/').next()?.parse().ok()
    }

    pub(crate) fn gateway(&self, node: usize) -> Ipv4Addr {
        self.try_gateway(&self.nodes[node])
            .unwrap_or_else(|| panic!("{} has no bridge address", self.nodes[node].name))
    }

    pub(crate) fn control_address(&self) -> Ipv4Addr {
        CONTROL_ADDRESS
    }

    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Runs `cca ARGS` against the lab's server (from the control
    /// namespace: the API is on the underlay only).
    pub(crate) fn cca(&self, args: &[&str]) -> Output {
        in_netns(&self.control_netns(), CCA)
            .args(args)
            .env("CCA_SERVER", &self.url)
            .stdin(Stdio::null())
            .output()
            .expect("cca runs")
    }

    /// `cca ARGS`, asserting success; its stdout.
    pub(crate) fn cca_ok(&self, args: &[&str]) -> String {
        let output = self.cca(args);
        assert!(
            output.status.success(),
            "cca {args:?} failed: {}{}",
            text(&output.stderr),
            text(&output.stdout)
        );
        text(&output.stdout)
    }

    /// `cca ARGS -o json`, parsed (null when the command failed).
    pub(crate) fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        let output = self.cca(&args);
        if !output.status.success() {
            return Value::Null;
        }
        serde_json::from_slice(&output.stdout).unwrap_or(Value::Null)
    }

    /// Applies `program` (written to a file in the lab's directory).
    pub(crate) fn apply(&self, name: &str, program: &str) {
        let file = self.dir.path().join(name);
        std::fs::write(&file, program).expect("writes the program");
        self.apply_file(&file);
    }

    /// `cca apply FILE` (the file is read by the CLI in the control
    /// namespace, which shares this mount namespace).
    pub(crate) fn apply_file(&self, file: &Path) {
        self.cca_ok(&["apply", &file.display().to_string()]);
    }

    /// `cca secret set NAME` with `value` on stdin.
    pub(crate) fn set_secret(&self, name: &str, value: &str) {
        let file = self.dir.path().join(format!("secret-{name}"));
        std::fs::write(&file, value).expect("writes the secret's value");
        self.cca_ok(&[
            "secret",
            "set",
            name,
            "--from-file",
            &file.display().to_string(),
        ]);
    }

    /// The instances of `service` (every service: `None`), as `cca get
    /// instances -o json` lists them.
    pub(crate) fn instances(&self, service: Option<&str>) -> Vec<Value> {
        let mut args = vec!["get", "instances"];
        if let Some(service) = service {
            args.extend(["--service", service]);
        }
        match self.json(&args) {
            Value::Array(rows) => rows,
            _ => Vec::new(),
        }
    }

    /// The `count` instances of `service` once exactly that many run (and
    /// are healthy, when the service has a health check), none stopping.
    pub(crate) fn wait_running(&self, service: &str, count: usize) -> Vec<Instance> {
        self.wait_running_within(service, count, Duration::from_secs(60))
    }

    pub(crate) fn wait_running_within(
        &self,
        service: &str,
        count: usize,
        timeout: Duration,
    ) -> Vec<Instance> {
        eventually(
            &format!("{count} running instance(s) of {service}"),
            timeout,
            || self.running(service, count),
        )
    }

    /// The instances of `service` when exactly `count` run (healthy, when
    /// it has a health check), none stopping.
    pub(crate) fn running(&self, service: &str, count: usize) -> Option<Vec<Instance>> {
        let rows = self.instances(Some(service));
        let running = rows.len() == count
            && rows.iter().all(|row| {
                row["state"] == "running" && row["stopping"] == false && row["healthy"] != false
            });
        running.then(|| rows.iter().map(Instance::from_json).collect())
    }

    /// The service's VIP, once allocated.
    pub(crate) fn vip(&self, service: &str) -> Ipv4Addr {
        eventually(
            &format!("a VIP for {service}"),
            Duration::from_secs(20),
            || {
                let services = self.json(&["get", "services"]);
                let row = services
                    .as_array()?
                    .iter()
                    .find(|row| row["name"] == service)?
                    .clone();
                (row["vip"]["state"] == "held")
                    .then(|| row["vip"]["address"].as_str()?.parse().ok())
                    .flatten()
            },
        )
    }

    /// `cca exec ID -- ARGV`.
    pub(crate) fn exec(&self, instance: &str, argv: &[&str]) -> Output {
        let mut args = vec!["exec", instance, "--"];
        args.extend(argv);
        self.cca(&args)
    }

    /// `cca exec ID -- ARGV`, asserting exit 0; its stdout.
    pub(crate) fn exec_ok(&self, instance: &str, argv: &[&str]) -> String {
        let output = self.exec(instance, argv);
        assert!(
            output.status.success(),
            "cca exec {instance} -- {argv:?} exited {:?}: {}{}",
            output.status.code(),
            text(&output.stderr),
            text(&output.stdout)
        );
        text(&output.stdout)
    }

    /// Runs `program ARGS` as a host process of node `index` (in its
    /// network namespace).
    pub(crate) fn on_node(&self, index: usize, program: &str, args: &[&str]) -> Output {
        in_netns(&self.nodes[index].netns, program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|error| panic!("running {program} on a node: {error}"))
    }

    /// `nft list table ip NAME` in node `index`'s namespace (empty when the
    /// table does not exist).
    pub(crate) fn nft_table(&self, index: usize, table: &str) -> String {
        text(
            &self
                .on_node(index, "nft", &["list", "table", "ip", table])
                .stdout,
        )
    }

    /// The maps of table `ip NAME` in node `index`'s namespace (where a
    /// VIP data plane keeps what it DNATs to), as `nft -j` lists them; empty
    /// when the table does not exist. Sets are left out: a node's sets may
    /// name every member of the cluster, ready or not.
    pub(crate) fn nft_maps(&self, index: usize, table: &str) -> String {
        let listed = self.on_node(index, "nft", &["-j", "list", "table", "ip", table]);
        let json: Value = serde_json::from_slice(&listed.stdout).unwrap_or(Value::Null);
        json["nftables"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|object| object.get("map"))
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Where node `index`'s data plane sends new flows to VIPs, as text
    /// that names each target address: the nftables maps, or the eBPF
    /// maps' live tables (the plane that sees containers' and processes'
    /// flows first; its nftables rules, kept for the rest, are written
    /// before it and removed before it).
    pub(crate) fn vip_targets(&self, index: usize) -> String {
        match self.plane {
            DataPlane::Nftables => self.nft_maps(index, SERVICE_TABLE),
            DataPlane::Ebpf => self
                .ebpf_pins(index)
                .map(|pins| ebpf::live_targets(&pins))
                .unwrap_or_default(),
        }
    }

    /// Flows node `index`'s eBPF programs sent to a backend so far (host
    /// processes' connects and datagrams, containers' flows); `None` on
    /// the nftables plane.
    pub(crate) fn ebpf_balanced(&self, index: usize) -> Option<(u64, u64)> {
        let pins = self
            .ebpf_pins(index)
            .filter(|_| self.plane == DataPlane::Ebpf)?;
        Some((
            ebpf::socket_translations(&pins),
            ebpf::container_flows(&pins),
        ))
    }

    /// Kills node `index` as a machine dies: its agent (SIGKILL), every
    /// container and process it ran, and its underlay link, so nothing of
    /// it answers any more.
    pub(crate) fn kill_node(&mut self, index: usize) {
        let node = self.nodes[index].clone();
        if let Some(mut agent) = self.agents.remove(&node.name) {
            let _ = agent.kill();
            let _ = agent.wait();
        }
        kill_containers(&node.data);
        let namespaces = namespace_inodes(std::slice::from_ref(&node.netns));
        kill_processes_in(&namespaces);
        ip(&["-n", &node.netns, "link", "set", "eth0", "down"]);
    }

    /// Tears the lab down (see the module docs) and asserts that nothing
    /// of it is left.
    pub(crate) fn finish(mut self) {
        let left = self.teardown();
        assert!(left.is_empty(), "left behind: {left:#?}");
    }

    /// Everything the lab made goes; returns what could not be removed.
    fn teardown(&mut self) -> Vec<String> {
        if self.torn_down {
            return Vec::new();
        }
        self.torn_down = true;
        let data_dirs: Vec<PathBuf> = self.nodes.iter().map(|node| node.data.clone()).collect();
        // Every instance the test ran, also those the agents remove now.
        let ids = instance_ids(&data_dirs);
        self.delete_services();
        for (_, mut agent) in std::mem::take(&mut self.agents) {
            let _ = agent.kill();
            let _ = agent.wait();
        }
        // What `--dataplane ebpf` pinned for a node outlives its agent by
        // design; the lab's namespaces go, so must it.
        for index in 0..self.nodes.len() {
            if let Some(pins) = self.ebpf_pins(index)
                && pins.exists()
                && let Err(error) = std::fs::remove_dir_all(&pins)
            {
                eprintln!("removing {}: {error}", pins.display());
            }
        }
        let mut left = remove_remains(Some(self.dir.path()), &data_dirs, &self.namespaces, ids);
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
        left.extend(self.host_changes());
        left
    }

    /// Where node `index`'s agent pins the eBPF data plane's maps and
    /// links (`/sys/fs/bpf/cca/netns-{inode}`).
    pub(crate) fn ebpf_pins(&self, index: usize) -> Option<PathBuf> {
        use std::os::unix::fs::MetadataExt;
        let netns = Path::new("/run/netns").join(&self.nodes[index].netns);
        let inode = std::fs::metadata(netns).ok()?.ino();
        Some(PathBuf::from(format!("/sys/fs/bpf/cca/netns-{inode}")))
    }

    /// Deletes every service and waits (a while) for their instances to
    /// stop, so the agents stop them the way they do: detached from the
    /// node network, cgroups and mounts removed.
    fn delete_services(&mut self) {
        let server_alive = self
            .server
            .as_mut()
            .is_some_and(|server| server.try_wait().ok().flatten().is_none());
        if !server_alive || self.agents.is_empty() {
            return;
        }
        let services = self.json(&["get", "services"]);
        for service in services.as_array().into_iter().flatten() {
            if let Some(name) = service["name"].as_str() {
                let _ = self.cca(&["delete", "service", name]);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let left = self.json(&["get", "instances", "--all"]);
            // Instances of a dead node stay listed: nothing stops them.
            let live = |row: &&Value| {
                row["node"]
                    .as_str()
                    .is_none_or(|node| self.agents.contains_key(node))
            };
            if left
                .as_array()
                .is_some_and(|rows| !rows.iter().any(|row| live(&row)))
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What differs on the host from before the lab: links or nftables
    /// tables that an agent run in the wrong namespace would have made.
    fn host_changes(&self) -> Vec<String> {
        let now = HostSnapshot::take();
        let mut changes = Vec::new();
        for link in now.links.difference(&self.host_before.links) {
            if link.contains(&self.tag) || link.starts_with("cca") || link.starts_with("vcca") {
                changes.push(format!("host link {link}"));
            }
        }
        if now.tables != self.host_before.tables {
            changes.push(format!(
                "the host's cca nftables tables changed: before {:?}, after {:?}",
                self.host_before.tables, now.tables
            ));
        }
        for name in &self.namespaces {
            if Path::new("/run/netns").join(name).exists() {
                changes.push(format!("namespace {name}"));
            }
        }
        changes
    }

    /// The last lines of the server's and agents' logs.
    fn logs(&self) -> String {
        let mut out = String::new();
        let mut who = vec!["server".to_owned()];
        who.extend(self.nodes.iter().map(|node| node.name.clone()));
        for name in who {
            let log = std::fs::read_to_string(self.log_path(&name)).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            let _ = write!(out, "\n--- {name} (last 40 lines)\n{tail}\n");
        }
        out
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let instances = text(&self.cca(&["get", "instances", "--all"]).stdout);
            eprintln!("instances:\n{instances}{}", self.logs());
        }
        let left = self.teardown();
        if !left.is_empty() {
            eprintln!("the lab left behind: {left:#?}");
        }
    }
}

/// One instance as `cca get instances` lists it.
#[derive(Clone, Debug)]
pub(crate) struct Instance {
    pub(crate) id: String,
    pub(crate) node: String,
    pub(crate) address: String,
}

impl Instance {
    fn from_json(row: &Value) -> Instance {
        let field = |name: &str| row[name].as_str().unwrap_or_default().to_owned();
        Instance {
            id: field("id"),
            node: field("node"),
            address: field("address"),
        }
    }
}

/// Polls `check` every 200 ms until it answers, failing the test after
/// `timeout`.
pub(crate) fn eventually<T>(what: &str, timeout: Duration, check: impl FnMut() -> Option<T>) -> T {
    within(timeout, check)
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// Polls `check` every 200 ms until it answers or `timeout` passes.
pub(crate) fn within<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn seconds(span: Duration) -> String {
    format!("{}s", span.as_secs())
}

/// A random number (the standard library's hasher keys are random per
/// process and per call).
fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// `nsenter --net=/run/netns/NETNS PROGRAM`: the program in the
/// namespace's network, with the host's mounts (and so its cgroups).
fn in_netns(netns: &str, program: &str) -> Command {
    let mut command = Command::new("nsenter");
    command
        .arg(format!("--net=/run/netns/{netns}"))
        .arg(program);
    command
}

fn ip_output(args: &[&str]) -> Output {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("ip runs")
}

/// `ip ARGS`, failing the test when it fails.
fn ip(args: &[&str]) {
    let output = ip_output(args);
    assert!(
        output.status.success(),
        "ip {}: {}",
        args.join(" "),
        text(&output.stderr)
    );
}

/// One lab at a time on this machine: an exclusive lock on a file in
/// /run/lock (or the temp dir), held by the returned handle.
fn exclusive_lock() -> File {
    let dir = Path::new("/run/lock");
    let dir = if dir.is_dir() {
        dir.to_owned()
    } else {
        std::env::temp_dir()
    };
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("cca-netcluster-tests.lock"))
        .expect("opens the labs' lock file");
    file.lock().expect("takes the labs' lock");
    file
}

/// What a lab must leave as it found it on the host.
#[derive(Debug)]
struct HostSnapshot {
    links: BTreeSet<String>,
    /// `nft list tables` lines naming a cca table (the names agents use).
    tables: Vec<String>,
}

impl HostSnapshot {
    fn take() -> HostSnapshot {
        let links = text(&ip_output(&["-o", "link", "show"]).stdout)
            .lines()
            .filter_map(|line| line.split(": ").nth(1))
            .map(|name| name.split('@').next().unwrap_or(name).to_owned())
            .collect();
        let tables = Command::new("nft")
            .args(["list", "tables"])
            .output()
            .map(|output| text(&output.stdout))
            .unwrap_or_default()
            .lines()
            .filter(|line| {
                line.split_whitespace()
                    .nth(2)
                    .is_some_and(|t| t.starts_with("cca"))
            })
            .map(str::to_owned)
            .collect();
        HostSnapshot { links, tables }
    }
}

/// Removes what a lab left under `dir` (its nodes' data dirs
/// `data_dirs`) and in its `namespaces`, and the namespaces and cgroups of
/// the instances its agents ran (`ids` and those its data dirs still
/// name): containers killed, every process in those namespaces killed,
/// mounts under `dir` detached, namespaces and cgroups deleted. What could
/// not be removed.
fn remove_remains(
    dir: Option<&Path>,
    data_dirs: &[PathBuf],
    namespaces: &[String],
    mut ids: BTreeSet<String>,
) -> Vec<String> {
    ids.extend(instance_ids(data_dirs));
    for data in data_dirs {
        kill_containers(data);
    }
    let mut all = instance_namespaces(&ids);
    all.extend(namespaces.iter().cloned());
    let inodes = namespace_inodes(&all);
    kill_processes_in(&inodes);
    let mut left = Vec::new();
    let still = processes_in(&inodes);
    if !still.is_empty() {
        left.push(format!("processes still running: {still:?}"));
    }
    if let Some(dir) = dir {
        left.extend(unmount_under(dir));
    }
    for name in &all {
        if Path::new("/run/netns").join(name).exists() {
            let output = ip_output(&["netns", "delete", name]);
            if !output.status.success() {
                left.push(format!("namespace {name}: {}", text(&output.stderr)));
            }
        }
    }
    left.extend(remove_cgroups(data_dirs, &ids));
    left
}

/// The named namespaces of these instances: each agent names them
/// `cca-{hash of its node}-{id}` (`cca_net::NetConfig::for_node`).
fn instance_namespaces(ids: &BTreeSet<String>) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| {
            name.strip_prefix("cca-").is_some_and(|rest| {
                ids.iter().any(|id| {
                    rest == id || rest.split_once('-').is_some_and(|(_, tail)| tail == id)
                })
            })
        })
        .collect()
}

/// Every instance id the agents with these data dirs ran and still know:
/// their runtimes' instance directories and their node networks' leases.
fn instance_ids(data_dirs: &[PathBuf]) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for data in data_dirs {
        for dir in ["oci/instances", "runtime/instances"] {
            let Ok(entries) = std::fs::read_dir(data.join(dir)) else {
                continue;
            };
            ids.extend(
                entries
                    .flatten()
                    .filter(|entry| entry.path().is_dir())
                    .filter_map(|entry| entry.file_name().to_str().map(str::to_owned)),
            );
        }
        let state = std::fs::read_to_string(data.join("network.json")).unwrap_or_default();
        let state: Value = serde_json::from_str(&state).unwrap_or(Value::Null);
        if let Some(leases) = state["ipam"]["leases"].as_object() {
            ids.extend(leases.keys().cloned());
        }
    }
    ids
}

/// Removes what labs of killed test runs left (a test process killed by a
/// timeout never runs its lab's drop): their namespaces (`ccmTAG-…`), the
/// processes in them, and their directories in the temp dir. Runs under
/// the labs' lock, so no live lab owns any of it.
fn sweep_stale_labs() {
    let namespaces: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str().map(str::to_owned))
        .filter(|name| is_lab_namespace(name))
        .collect();
    let dirs: Vec<PathBuf> = std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with(DIR_PREFIX))
        })
        .collect();
    if namespaces.is_empty() && dirs.is_empty() {
        return;
    }
    eprintln!("removing what killed test runs left: {namespaces:?} {dirs:?}");
    for dir in &dirs {
        let data_dirs: Vec<PathBuf> = (1..=3).map(|i| dir.join(format!("n{i}"))).collect();
        remove_remains(Some(dir), &data_dirs, &[], BTreeSet::new());
        let _ = std::fs::remove_dir_all(dir);
    }
    remove_remains(None, &[], &namespaces, BTreeSet::new());
}

/// `ccmXXXXX-…`: a namespace of a lab.
fn is_lab_namespace(name: &str) -> bool {
    name.len() > 9
        && name.starts_with("ccm")
        && name.as_bytes()[8] == b'-'
        && name[3..8].bytes().all(|b| b.is_ascii_hexdigit())
}

/// Kills and deletes every container of the node whose data dir is
/// `data` (runc keeps their state under `DATA/oci/oci-state`).
fn kill_containers(data: &Path) {
    let root = data.join("oci/oci-state");
    if !root.exists() {
        return;
    }
    let runc = |args: &[&str]| {
        Command::new("runc")
            .arg("--root")
            .arg(&root)
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
    };
    let Ok(listed) = runc(&["list", "-q"]) else {
        return;
    };
    for id in text(&listed.stdout).lines().filter(|id| !id.is_empty()) {
        let _ = runc(&["kill", id, "KILL"]);
        let _ = runc(&["delete", "--force", id]);
    }
}

/// The inodes of the named namespaces that exist.
fn namespace_inodes(names: &[String]) -> BTreeSet<u64> {
    names
        .iter()
        .filter_map(|name| std::fs::metadata(Path::new("/run/netns").join(name)).ok())
        .map(|meta| meta.ino())
        .collect()
}

/// The pids of processes whose network namespace is one of `inodes`.
fn processes_in(inodes: &BTreeSet<u64>) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let ns = std::fs::metadata(entry.path().join("ns/net")).ok()?;
            inodes.contains(&ns.ino()).then_some(pid)
        })
        .collect()
}

/// SIGKILLs every process in the namespaces and waits (a while) until
/// they are gone.
fn kill_processes_in(inodes: &BTreeSet<u64>) {
    if inodes.is_empty() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = processes_in(inodes);
        if pids.is_empty() || Instant::now() >= deadline {
            return;
        }
        for pid in pids {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Detaches every mount under `dir` (container root filesystems whose
/// runtime was killed), deepest first; what could not be unmounted.
fn unmount_under(dir: &Path) -> Vec<String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|point| point.starts_with(dir))
        .collect();
    points.sort();
    points.dedup();
    let mut left = Vec::new();
    for point in points.iter().rev() {
        if let Err(error) = rustix::mount::unmount(point, rustix::mount::UnmountFlags::DETACH) {
            left.push(format!("mount {}: {error}", point.display()));
        }
    }
    left
}

/// Removes the cgroups the agents with `data_dirs` made for `ids`
/// (`cca-{tag}/{id}` for processes, `cca-oci-{tag}/{id}` for containers,
/// `cca_agent::node::agent_tag`) in every v1 hierarchy, when a killed
/// agent or runtime left them; what could not be removed.
fn remove_cgroups(data_dirs: &[PathBuf], ids: &BTreeSet<String>) -> Vec<String> {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    let parents: Vec<String> = data_dirs
        .iter()
        .map(|data| cca_agent::node::agent_tag(data))
        .flat_map(|tag| [format!("cca-{tag}"), format!("cca-oci-{tag}")])
        .collect();
    let mut left = Vec::new();
    for hierarchy in hierarchies.flatten() {
        for parent in &parents {
            for id in ids {
                let dir = hierarchy.path().join(parent).join(id);
                if dir.is_dir() && std::fs::remove_dir(&dir).is_err() {
                    left.push(format!("cgroup {}", dir.display()));
                }
            }
        }
    }
    left
}
