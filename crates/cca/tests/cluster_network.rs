//! The cluster network across three nodes on one machine (issue 13, item
//! 7): a real `cca server` and three real `cca agent`s, each in a network
//! namespace of its own joined by an underlay bridge, with the VXLAN
//! overlay between them (see `netcluster`). Real clients check it: busybox
//! `wget` and glibc `getent` inside containers, `curl` and `getent` in a
//! host process, `dig` against the nodes' and the server's DNS servers.
//!
//! - a container and a host process on node 1 reach a service whose only
//!   instance is on node 3 by its address, its VIP and its DNS names;
//! - `dig` gets VIPs, ordinals and SRV records from every node's and the
//!   server's DNS, and NXDOMAIN for unknown names;
//! - a dead node 3 leaves node 1's VIP targets within the node TTL, and
//!   the replacement answers through the same VIP;
//! - network policy lets `a` reach `b` and refuses `c` at once (a reset);
//! - `examples/airflow.cca` runs across the three nodes with stand-in
//!   images whose connections resolve through the cluster DNS.
//!
//! Every scenario runs twice, one test matrix (issue 18): in `nftables::`
//! the agents balance VIPs with nftables rules, in `ebpf::` with the eBPF
//! programs (`--dataplane ebpf`), the same steps and assertions against
//! both; on the eBPF plane a scenario also checks that the programs' own
//! counters moved (not only the nftables rules kept beside them), and
//! waits on the eBPF maps' live tables where it waits on VIP targets.
//!
//! Root only (each test skips, saying why, otherwise); one lab at a time
//! on the machine. Every test ends by tearing its lab down and asserting
//! that nothing of it is left.

mod netcluster;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use netcluster::{
    DataPlane, Instance, Lab, NODE_TTL, SERVICE_TABLE, eventually, images, root_test, text, within,
};

/// Each scenario is a test on each data plane: `nftables::NAME` and
/// `ebpf::NAME`.
macro_rules! on_both_planes {
    ($($scenario:ident),+ $(,)?) => {
        mod nftables {
            $(#[test]
            fn $scenario() {
                super::run(stringify!($scenario), super::DataPlane::Nftables, super::$scenario);
            })+
        }
        mod ebpf {
            $(#[test]
            fn $scenario() {
                super::run(stringify!($scenario), super::DataPlane::Ebpf, super::$scenario);
            })+
        }
    };
}

on_both_planes!(
    a_container_on_node_1_reaches_a_service_on_node_3_by_address_vip_and_name,
    a_process_on_node_1_reaches_a_service_on_node_3_by_address_vip_and_name,
    dig_gets_vips_ordinals_and_srv_records_from_nodes_and_server,
    a_dead_node_leaves_the_vip_within_the_node_ttl_and_its_replacement_answers,
    policy_lets_a_reach_b_and_refuses_c_at_once,
    airflow_runs_across_three_nodes_with_its_connections_resolving,
);

/// Runs `scenario` on `plane` where labs can run.
fn run(name: &str, plane: DataPlane, scenario: fn(DataPlane)) {
    if root_test(&format!("{plane:?}::{name}")) {
        scenario(plane);
    }
}

/// Checks that node `index`'s eBPF programs balanced flows since
/// `before` (from [`Lab::ebpf_balanced`]): host processes' when
/// `processes`, else containers'. Nothing to check on the nftables plane.
fn assert_ebpf_balanced(lab: &Lab, index: usize, before: Option<(u64, u64)>, processes: bool) {
    let (Some(before), Some(now)) = (before, lab.ebpf_balanced(index)) else {
        return;
    };
    let (was, is, what) = if processes {
        (
            before.0,
            now.0,
            "host processes' connects (socket programs)",
        )
    } else {
        (before.1, now.1, "containers' flows (tc programs)")
    };
    assert!(
        is > was,
        "node {}'s eBPF programs balanced none of the {what}: {was} before, {is} now",
        index + 1
    );
}

/// `web` on node 3 only, serving `web ID` on 8080.
const WEB_ON_N3: &str = r#"
service web {
  image = "cca.test/net:1"
  command = "exec stand-in web 8080"
  port http 8080

  placement {
    restrict {
      name = "n3"
    }
  }
}
"#;

/// A container client on node 1.
const CLIENT_ON_N1: &str = r#"
service client {
  image = "cca.test/net:1"

  placement {
    restrict {
      name = "n1"
    }
  }
}
"#;

/// A host process on node 1.
const PROCESS_ON_N1: &str = r#"
service probe {
  run = "sleep 1000000"

  placement {
    restrict {
      name = "n1"
    }
  }
}
"#;

/// `wget -q -O - URL` in `instance`, bounded by `timeout` (busybox's own
/// `-T` is not used: it has crashed on this machine).
fn wget(lab: &Lab, instance: &str, url: &str) -> std::process::Output {
    lab.exec(instance, &["timeout", "5", "wget", "-q", "-O", "-", url])
}

fn wget_ok(lab: &Lab, instance: &str, url: &str) -> String {
    lab.exec_ok(instance, &["timeout", "5", "wget", "-q", "-O", "-", url])
}

/// The only instance of `service`.
fn only(lab: &Lab, service: &str) -> Instance {
    let mut instances = lab.wait_running(service, 1);
    instances.pop().expect("one instance")
}

/// Waits until node `index`'s data plane names every one of `addresses`:
/// as VIP targets (`maps_only`: where its VIPs send new flows), or
/// anywhere in its nftables table (its policy's member sets too). An instance runs a moment before
/// every node's rules hold it; a test that reaches it through a VIP (or is
/// judged by policy as its member) waits for that moment first.
fn wait_programmed(lab: &Lab, index: usize, addresses: &[&str], maps_only: bool) {
    let node = &lab.nodes[index].name;
    eventually(
        &format!("{node}'s data plane to hold {addresses:?}"),
        Duration::from_secs(10),
        || {
            let listed = if maps_only {
                lab.vip_targets(index)
            } else {
                lab.nft_table(index, SERVICE_TABLE)
            };
            addresses
                .iter()
                .all(|address| mentions(&listed, address))
                .then_some(())
        },
    );
}

fn a_container_on_node_1_reaches_a_service_on_node_3_by_address_vip_and_name(plane: DataPlane) {
    let lab = Lab::on_plane(plane, &[images::net()]);
    lab.apply("app.cca", &format!("{WEB_ON_N3}{CLIENT_ON_N1}"));
    let web = only(&lab, "web");
    let client = only(&lab, "client");
    assert_eq!((web.node.as_str(), client.node.as_str()), ("n3", "n1"));
    let vip = lab.vip("web");
    let served = format!("web {}\n", web.id);

    // Over the overlay, to the instance's own address.
    let url = format!("http://{}:8080/", web.address);
    assert_eq!(wget_ok(&lab, &client.id, &url), served);

    // The container resolves through its node's DNS on the gateway, with
    // the cluster's search domain.
    let resolv = lab.exec_ok(&client.id, &["cat", "/etc/resolv.conf"]);
    assert!(
        resolv.contains(&format!("nameserver {}", lab.gateway(0)))
            && resolv.contains("search cca.local"),
        "the client's resolv.conf names node 1's DNS:\n{resolv}"
    );
    let hosts = lab.exec_ok(&client.id, &["/usr/bin/getent", "hosts", "web"]);
    assert_eq!(
        hosts.split_whitespace().collect::<Vec<_>>(),
        [vip.to_string().as_str(), "web.cca.local"],
        "glibc resolves the short name to the VIP"
    );

    // Through the VIP, by address and by both names.
    wait_programmed(&lab, 0, &[&web.address], true);
    let balanced = lab.ebpf_balanced(0);
    for url in [
        format!("http://{vip}:8080/"),
        "http://web.cca.local:8080/".to_owned(),
        "http://web:8080/".to_owned(),
    ] {
        assert_eq!(wget_ok(&lab, &client.id, &url), served, "{url}");
    }
    assert_ebpf_balanced(&lab, 0, balanced, false);
    lab.finish();
}

fn a_process_on_node_1_reaches_a_service_on_node_3_by_address_vip_and_name(plane: DataPlane) {
    let lab = Lab::on_plane(plane, &[images::net()]);
    lab.apply("app.cca", &format!("{WEB_ON_N3}{PROCESS_ON_N1}"));
    let web = only(&lab, "web");
    let probe = only(&lab, "probe");
    assert_eq!((web.node.as_str(), probe.node.as_str()), ("n3", "n1"));
    let vip = lab.vip("web");
    let served = format!("web {}\n", web.id);
    let curl = |url: &str| lab.exec_ok(&probe.id, &["curl", "-sS", "--max-time", "5", url]);

    assert_eq!(curl(&format!("http://{}:8080/", web.address)), served);
    let hosts = lab.exec_ok(&probe.id, &["/usr/bin/getent", "hosts", "web"]);
    assert_eq!(
        hosts.split_whitespace().collect::<Vec<_>>(),
        [vip.to_string().as_str(), "web.cca.local"],
        "the process resolves the short name through node 1's DNS"
    );
    // Node 1 has no default route: the service range's route is the
    // agent's.
    wait_programmed(&lab, 0, &[&web.address], true);
    let balanced = lab.ebpf_balanced(0);
    for url in [
        format!("http://{vip}:8080/"),
        "http://web.cca.local:8080/".to_owned(),
        "http://web:8080/".to_owned(),
    ] {
        assert_eq!(curl(&url), served, "{url}");
    }
    assert_ebpf_balanced(&lab, 0, balanced, true);
    // The host's own resolver is untouched: only the instance sees the
    // node's.
    let host_resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    assert!(
        !host_resolv.contains(&lab.gateway(0).to_string()),
        "{host_resolv}"
    );
    lab.finish();
}

/// `dig +short ARGS` as a host process of node `index`.
fn dig_short(lab: &Lab, index: usize, args: &[&str]) -> String {
    let mut all = vec!["+short", "+tries=1", "+time=2"];
    all.extend(args);
    let output = lab.on_node(index, "dig", &all);
    assert!(
        output.status.success(),
        "dig {args:?}: {}",
        text(&output.stderr)
    );
    text(&output.stdout).trim().to_owned()
}

fn dig_gets_vips_ordinals_and_srv_records_from_nodes_and_server(plane: DataPlane) {
    let lab = Lab::on_plane(plane, &[]);
    lab.apply(
        "app.cca",
        r#"
service web {
  run = "sleep 1000000"
  port http 8080
}

service db {
  run = "sleep 1000000"
  port 5432
  stateful
}
"#,
    );
    let db = only(&lab, "db");
    lab.wait_running("web", 1);
    let (web_vip, db_vip) = (lab.vip("web"), lab.vip("db"));
    assert_ne!(web_vip, db_vip);
    let listed = lab.cca_ok(&["get", "services"]);
    assert!(listed.contains(&web_vip.to_string()), "{listed}");

    // Every node's DNS on its gateway (port 53, redirected to its server),
    // and the control plane's on its own address.
    let server = lab.control_address().to_string();
    for index in 0..3 {
        let gateway = format!("@{}", lab.gateway(index));
        assert_eq!(
            dig_short(&lab, index, &[&gateway, "web.cca.local"]),
            web_vip.to_string()
        );
        assert_eq!(
            dig_short(
                &lab,
                index,
                &["-p", "15353", &format!("@{server}"), "web.cca.local"]
            ),
            web_vip.to_string()
        );
    }
    let gateway = format!("@{}", lab.gateway(0));
    assert_eq!(
        dig_short(&lab, 0, &[&gateway, "db.cca.local"]),
        db_vip.to_string()
    );
    assert_eq!(
        dig_short(&lab, 0, &[&gateway, "db-0.db.cca.local"]),
        db.address,
        "a stateful service's ordinal names its instance"
    );
    assert_eq!(
        dig_short(&lab, 0, &[&gateway, "SRV", "_http._tcp.web.cca.local"]),
        "0 0 8080 web.cca.local."
    );

    // An unknown name is NXDOMAIN at once, from nodes and server alike.
    for (index, target) in [(0, gateway.clone()), (1, format!("@{server}"))] {
        let mut args = vec!["+tries=1", "+time=2", target.as_str(), "nope.cca.local"];
        if target.contains(&server) {
            args.extend(["-p", "15353"]);
        }
        let start = Instant::now();
        let output = lab.on_node(index, "dig", &args);
        let answer = text(&output.stdout);
        assert!(
            answer.contains("status: NXDOMAIN"),
            "dig {args:?}:\n{answer}"
        );
        assert!(start.elapsed() < Duration::from_secs(2), "{answer}");
    }
    lab.finish();
}

/// `web` spread one per node, serving `web ID`.
const SPREAD_WEB: &str = r#"
service web {
  image = "cca.test/net:1"
  command = "exec stand-in web 8080"
  replicas = 3
  port http 8080

  placement {
    spread name
  }
}
"#;

/// Requests `url` `count` times from `client`, each bounded by 2 s (in
/// exec calls of 10, well inside `cca exec`'s 30 s); the instance ids
/// that answered, in order, and the number of failures.
fn responders(lab: &Lab, client: &str, url: &str, count: usize) -> (Vec<String>, usize) {
    let (mut ids, mut failed) = (Vec::new(), 0);
    let mut left = count;
    while left > 0 {
        let batch = left.min(10);
        left -= batch;
        let script = format!(
            "for i in $(seq {batch}); do timeout 2 wget -q -O - {url} || echo failed; done"
        );
        let out = lab.exec_ok(client, &["sh", "-c", &script]);
        failed += out.lines().filter(|line| *line == "failed").count();
        ids.extend(
            out.lines()
                .filter_map(|line| line.strip_prefix("web "))
                .map(str::to_owned),
        );
    }
    (ids, failed)
}

#[allow(clippy::print_stderr, reason = "the test reports the time it measured")]
fn a_dead_node_leaves_the_vip_within_the_node_ttl_and_its_replacement_answers(plane: DataPlane) {
    let mut lab = Lab::on_plane(plane, &[images::net()]);
    lab.apply("app.cca", &format!("{SPREAD_WEB}{CLIENT_ON_N1}"));
    let before = lab.wait_running("web", 3);
    let nodes: std::collections::BTreeSet<&str> = before.iter().map(|i| i.node.as_str()).collect();
    assert_eq!(nodes.len(), 3, "one per node: {before:?}");
    let client = only(&lab, "client");
    let vip = lab.vip("web");
    let url = format!("http://{vip}:8080/");
    let on_n3 = before
        .iter()
        .find(|i| i.node == "n3")
        .expect("an instance on n3")
        .clone();

    // Every instance gets flows through the VIP from node 1.
    let addresses: Vec<&str> = before.iter().map(|i| i.address.as_str()).collect();
    wait_programmed(&lab, 0, &addresses, true);
    let balanced = lab.ebpf_balanced(0);
    let (ids, failed) = responders(&lab, &client.id, &url, 30);
    assert_eq!(failed, 0, "{ids:?}");
    assert_ebpf_balanced(&lab, 0, balanced, false);
    for instance in &before {
        assert!(
            ids.contains(&instance.id),
            "{} never answered: {ids:?}",
            instance.id
        );
    }

    // Node 3 dies. Node 1's data plane drops its target (its VIP sends no
    // new flows there) once the control plane holds it unreachable, which is at most
    // the node TTL after its last heartbeat; a little more for the change
    // to travel.
    let killed = Instant::now();
    lab.kill_node(2);
    let gone = eventually(
        "node 1's VIP targets to drop node 3's instance",
        NODE_TTL * 5,
        || {
            let targets = lab.vip_targets(0);
            (!targets.is_empty() && !mentions(&targets, &on_n3.address)).then(|| killed.elapsed())
        },
    );
    eprintln!("node 1 stopped sending flows to the dead node {gone:?} after the kill");
    assert!(
        gone <= NODE_TTL + Duration::from_secs(2),
        "node 3's instance left node 1's VIP targets only after {gone:?} (node TTL {NODE_TTL:?})"
    );
    let (ids, failed) = responders(&lab, &client.id, &url, 20);
    assert_eq!(failed, 0, "every flow goes to a live instance: {ids:?}");
    assert!(!ids.contains(&on_n3.id), "{ids:?}");

    // The replacement, on node 1 or 2, answers over the overlay and
    // through the same VIP.
    let after = eventually("web replaced off node 3", Duration::from_secs(40), || {
        let running = lab.running("web", 3)?;
        running.iter().all(|i| i.node != "n3").then_some(running)
    });
    let replacement = after
        .iter()
        .find(|i| !before.iter().any(|b| b.id == i.id))
        .expect("a new instance")
        .clone();
    let direct = format!("http://{}:8080/", replacement.address);
    assert_eq!(
        wget_ok(&lab, &client.id, &direct),
        format!("web {}\n", replacement.id)
    );
    assert_eq!(lab.vip("web"), vip, "the VIP stays");
    let answered = eventually(
        "the replacement to answer through the VIP",
        Duration::from_secs(20),
        || {
            let (ids, failed) = responders(&lab, &client.id, &url, 30);
            (failed == 0 && ids.contains(&replacement.id)).then_some(ids)
        },
    );
    assert!(!answered.contains(&on_n3.id), "{answered:?}");
    lab.finish();
}

/// Whether `text` names `address` (not merely a longer address that
/// starts with it).
fn mentions(text: &str, address: &str) -> bool {
    text.match_indices(address).any(|(at, _)| {
        let next = text[at + address.len()..].chars().next();
        let before = text[..at].chars().next_back();
        !next.is_some_and(|c| c.is_ascii_digit())
            && !before.is_some_and(|c| c.is_ascii_digit() || c == '.')
    })
}

const POLICY: &str = r#"
service a {
  image = "cca.test/net:1"

  placement {
    restrict {
      name = "n1"
    }
  }
}

service b {
  image = "cca.test/net:1"
  command = "exec stand-in b 80"
  port http 80

  placement {
    restrict {
      name = "n3"
    }
  }
}

service c {
  image = "cca.test/net:1"

  placement {
    restrict {
      name = "n2"
    }
  }
}

network {
  allow a -> b port 80
  deny * -> b
}
"#;

fn policy_lets_a_reach_b_and_refuses_c_at_once(plane: DataPlane) {
    let lab = Lab::on_plane(plane, &[images::net()]);
    lab.apply("app.cca", POLICY);
    let (a, b, c) = (only(&lab, "a"), only(&lab, "b"), only(&lab, "c"));
    let vip = lab.vip("b");
    let served = format!("b {}\n", b.id);
    let urls = [
        format!("http://{vip}/"),
        format!("http://{}/", b.address),
        "http://b/".to_owned(),
    ];
    // A flow is judged on every node it enters (a's on nodes 1 and 3):
    // both must know a's address as a member of `a`.
    wait_programmed(&lab, 0, &[&b.address], true);
    for index in [0, 2] {
        wait_programmed(&lab, index, &[&a.address], false);
    }
    let balanced = lab.ebpf_balanced(0);
    for url in &urls {
        assert_eq!(wget_ok(&lab, &a.id, url), served, "a -> {url}");
    }
    assert_ebpf_balanced(&lab, 0, balanced, false);
    for url in &urls {
        let start = Instant::now();
        let refused = wget(&lab, &c.id, url);
        let took = start.elapsed();
        let said = format!("{}{}", text(&refused.stdout), text(&refused.stderr));
        assert!(!refused.status.success(), "c reached {url}: {said}");
        assert!(
            said.contains("refused") || said.contains("reset"),
            "c -> {url} is refused, not dropped: {said}"
        );
        assert!(
            took < Duration::from_secs(2),
            "c -> {url} was refused only after {took:?}"
        );
    }
    lab.finish();
}

/// The example's path in the workspace.
fn airflow_example() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/airflow.cca")
}

/// What an Airflow stand-in reached, from the `/tmp/connections` it
/// writes: `CONNECTION HOST ADDRESS PORT BODY...` per line (BODY: what the
/// server answered, its name first). `None` while it has not written it.
fn reached(lab: &Lab, instance: &str) -> Option<Vec<(String, String, Ipv4Addr, String)>> {
    let output = lab.exec(instance, &["cat", "/tmp/connections"]);
    if !output.status.success() {
        return None;
    }
    let lines = text(&output.stdout)
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let (name, host, address, body) =
                (words.first()?, words.get(1)?, words.get(2)?, words.get(4)?);
            Some((
                (*name).to_owned(),
                (*host).to_owned(),
                address.parse().ok()?,
                (*body).to_owned(),
            ))
        })
        .collect();
    Some(lines)
}

fn airflow_runs_across_three_nodes_with_its_connections_resolving(plane: DataPlane) {
    let lab = Lab::on_plane(plane, &images::airflow());
    lab.set_secret("airflow_db_password", "s3cret");
    lab.set_secret("airflow_fernet_key", "a-fernet-key");
    lab.apply_file(&airflow_example());

    // Every service runs (the webservers healthy: they serve /health only
    // once both connections worked), spread over the three nodes.
    let services = [
        ("postgres", 1),
        ("redis", 1),
        ("webserver", 2),
        ("scheduler", 1),
        ("worker", 2),
    ];
    let running = eventually(
        "every airflow service running, the webservers healthy",
        Duration::from_secs(120),
        || {
            let mut all = Vec::new();
            for (service, count) in services {
                all.extend(lab.running(service, count)?);
            }
            let webservers = lab.instances(Some("webserver"));
            webservers
                .iter()
                .all(|row| row["healthy"] == true)
                .then_some(all)
        },
    );
    let nodes: std::collections::BTreeSet<&str> = running.iter().map(|i| i.node.as_str()).collect();
    assert_eq!(nodes.len(), 3, "spread over the three nodes: {running:?}");

    // Each Airflow process resolved `postgres` and `redis` to their VIPs
    // and got its answer through them.
    let (postgres, redis) = (lab.vip("postgres"), lab.vip("redis"));
    let expected = [
        ("airflow_db", "postgres", postgres, "postgres"),
        ("airflow_broker", "redis", redis, "redis"),
    ];
    let airflow: Vec<&Instance> = running
        .iter()
        .filter(|i| {
            ["webserver-", "scheduler-", "worker-"]
                .iter()
                .any(|s| i.id.starts_with(s))
        })
        .collect();
    for instance in airflow {
        let mut seen = None;
        let done = within(Duration::from_secs(60), || {
            seen = reached(&lab, &instance.id);
            let lines = seen.as_ref()?;
            expected
                .iter()
                .all(|(name, host, vip, body)| {
                    lines
                        .iter()
                        .any(|r| r.0 == *name && r.1 == *host && r.2 == *vip && r.3 == *body)
                })
                .then_some(())
        });
        assert!(
            done.is_some(),
            "{} did not reach postgres at {postgres} and redis at {redis}: {seen:?}",
            instance.id
        );
        if instance.id.starts_with("webserver-") {
            let health = wget_ok(&lab, &instance.id, "http://127.0.0.1:8080/health");
            assert!(
                health.contains("airflow_db") && health.contains("airflow_broker"),
                "{health}"
            );
        }
    }
    if plane == DataPlane::Ebpf {
        let flows: u64 = (0..3)
            .filter_map(|index| lab.ebpf_balanced(index))
            .map(|(_, containers)| containers)
            .sum();
        assert!(
            flows > 0,
            "the tc programs balanced none of Airflow's flows"
        );
    }
    lab.finish();
}
