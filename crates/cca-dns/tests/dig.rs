//! The server as a real client sees it: `dig` (from `bind9-dnsutils`,
//! installed by `scripts/test`) against a server on a free loopback port,
//! over UDP and TCP — service, ordinal and SRV names, NXDOMAIN, a map swap,
//! and forwarding to a fake upstream resolver (a small server in the test
//! that answers every name with 192.0.2.1, truncating over UDP when asked
//! to). Without `dig` the tests skip when not root and fail as root.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cca_dns::{DnsConfig, DnsHandle, DnsServer, Upstreams};
use cca_model::net::{Member, NetworkMap, ServiceNet};
use cca_model::spec::PortSpec;
use hickory_proto::op::{Message, MessageType};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::oneshot;

/// The address the fake upstream answers every name with.
const UPSTREAM_ANSWER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

/// Whether `dig` can run: skipped (saying why) when it is missing and we
/// are not root; as root (how `scripts/test` runs) it must be there.
#[allow(clippy::print_stderr, reason = "a skipped test says why")]
fn have_dig(test: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("dig").is_file()));
    if found {
        return true;
    }
    let root = std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0);
    assert!(
        !root,
        "{test} runs as root, so it must run, but `dig` is not on PATH: install bind9-dnsutils (scripts/test does)"
    );
    eprintln!(
        "skipping {test}: `dig` is not installed (bind9-dnsutils; scripts/test installs it as root)"
    );
    false
}

fn service(name: &str, vip: [u8; 4]) -> ServiceNet {
    ServiceNet {
        name: name.into(),
        vip: Some(vip.into()),
        ports: Vec::new(),
        affinity: Default::default(),
        endpoints: Default::default(),
        members: Vec::new(),
        asleep: false,
        scale_to_zero: None,
    }
}

/// `web` with a named port, `db` with ordinals 0 and 1.
fn map() -> NetworkMap {
    let mut web = service("web", [10, 43, 0, 7]);
    web.ports = vec![PortSpec::tcp("http", 8080)];
    let mut db = service("db", [10, 43, 0, 9]);
    db.members = [(0, [10, 42, 1, 5]), (1, [10, 42, 2, 6])]
        .into_iter()
        .map(|(ordinal, address)| Member {
            instance: format!("db-{ordinal}"),
            node: "n1".into(),
            address: address.into(),
            ordinal: Some(ordinal),
            host_network: false,
        })
        .collect();
    let mut map = NetworkMap::default();
    for service in [web, db] {
        map.services.insert(service.name.clone(), Arc::new(service));
    }
    map
}

/// A running server on a free loopback port; dropping it stops it.
struct Running {
    address: SocketAddr,
    handle: DnsHandle,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), cca_dns::DnsError>>,
}

impl Running {
    async fn start(upstreams: Upstreams) -> Running {
        Running::with(upstreams, |_| {}).await
    }

    /// A server with the tests' defaults changed by `adjust`.
    async fn with(upstreams: Upstreams, adjust: impl FnOnce(&mut DnsConfig)) -> Running {
        let mut config = DnsConfig::new(vec!["127.0.0.1:0".parse().expect("a listen address")]);
        config.upstreams = upstreams;
        config.forward_timeout = Duration::from_millis(500);
        adjust(&mut config);
        let server = DnsServer::bind(config, Arc::new(map()))
            .await
            .expect("the server binds a free loopback port");
        let address = server.local_addrs()[0];
        let handle = server.handle();
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        Running {
            address,
            handle,
            stop: Some(stop),
            task,
        }
    }

    /// `dig @server ARGS`'s output; `dig` itself must succeed.
    async fn dig(&self, args: &[&str]) -> String {
        dig(self.address, args).await
    }

    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task)
            .await
            .expect("the server task ends cleanly")
            .expect("the server ran");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn dig(server: SocketAddr, args: &[&str]) -> String {
    let output = tokio::process::Command::new("dig")
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string(), "+time=3", "+tries=1"])
        .args(args)
        .output()
        .await
        .expect("dig runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "dig {args:?} failed: {text}");
    text
}

/// The `status:` dig printed.
fn status(output: &str) -> &str {
    output
        .split("status: ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("no status in {output}"))
}

/// The records of one section of dig's output (`ANSWER`, `AUTHORITY`,
/// `ADDITIONAL`), whitespace collapsed.
fn section(output: &str, name: &str) -> Vec<String> {
    let header = format!(";; {name} SECTION:");
    output
        .lines()
        .skip_while(|line| *line != header)
        .skip(1)
        .take_while(|line| !line.is_empty())
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

fn run(test: impl Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a test runtime")
        .block_on(test);
}

#[test]
fn service_ordinal_and_srv_names_answer_over_udp_and_tcp() {
    if !have_dig("service_ordinal_and_srv_names_answer_over_udp_and_tcp") {
        return;
    }
    run(async {
        let server = Running::start(Upstreams::Fixed(Vec::new())).await;
        let out = server.dig(&["web.cca.local", "A"]).await;
        assert_eq!(status(&out), "NOERROR");
        assert_eq!(section(&out, "ANSWER"), ["web.cca.local. 5 IN A 10.43.0.7"]);
        assert!(out.contains("flags: qr aa rd ra"), "{out}");

        let out = server.dig(&["+tcp", "WEB.cca.LOCAL", "A"]).await;
        assert_eq!(section(&out, "ANSWER"), ["WEB.cca.LOCAL. 5 IN A 10.43.0.7"]);
        assert!(out.contains("(TCP)"), "{out}");

        let out = server.dig(&["db-1.db.cca.local"]).await;
        assert_eq!(
            section(&out, "ANSWER"),
            ["db-1.db.cca.local. 5 IN A 10.42.2.6"]
        );

        let out = server.dig(&["_http._tcp.web.cca.local", "SRV"]).await;
        assert_eq!(
            section(&out, "ANSWER"),
            ["_http._tcp.web.cca.local. 5 IN SRV 0 0 8080 web.cca.local."]
        );
        assert_eq!(
            section(&out, "ADDITIONAL"),
            ["web.cca.local. 5 IN A 10.43.0.7"]
        );
        let out = server
            .dig(&["+tcp", "_http._tcp.web.cca.local", "SRV"])
            .await;
        assert_eq!(section(&out, "ANSWER").len(), 1);

        let out = server.dig(&["web.cca.local", "AAAA"]).await;
        assert_eq!(status(&out), "NOERROR");
        assert!(section(&out, "ANSWER").is_empty());

        let metrics = server.handle.metrics().snapshot();
        assert_eq!(metrics.queries, 6);
        assert_eq!(metrics.nxdomain, 0);
        server.shutdown().await;
    });
}

#[test]
fn unknown_names_are_nxdomain_with_the_soa() {
    if !have_dig("unknown_names_are_nxdomain_with_the_soa") {
        return;
    }
    run(async {
        let server = Running::start(Upstreams::Fixed(Vec::new())).await;
        for args in [
            &["nothing.cca.local"][..],
            &["+tcp", "db-7.db.cca.local"],
            &["_ftp._tcp.web.cca.local", "SRV"],
        ] {
            let out = server.dig(args).await;
            assert_eq!(status(&out), "NXDOMAIN", "{args:?}: {out}");
            let authority = section(&out, "AUTHORITY");
            assert_eq!(authority.len(), 1, "{out}");
            assert!(
                authority[0].starts_with("cca.local. 5 IN SOA ns.cca.local. hostmaster.cca.local."),
                "{out}"
            );
        }
        assert_eq!(server.handle.metrics().snapshot().nxdomain, 3);
        server.shutdown().await;
    });
}

#[test]
fn a_swapped_map_answers_the_next_query() {
    if !have_dig("a_swapped_map_answers_the_next_query") {
        return;
    }
    run(async {
        let server = Running::start(Upstreams::Fixed(Vec::new())).await;
        let out = server.dig(&["late.cca.local"]).await;
        assert_eq!(status(&out), "NXDOMAIN");

        let mut next = (*server.handle.map()).clone();
        next.services
            .insert("late".into(), Arc::new(service("late", [10, 43, 1, 1])));
        next.services.remove("web");
        let swapped = Instant::now();
        server.handle.set_map(Arc::new(next));
        // The very next query, over either transport, sees the new map.
        let udp = server.dig(&["late.cca.local"]).await;
        let tcp = server.dig(&["+tcp", "late.cca.local"]).await;
        let gone = server.dig(&["web.cca.local"]).await;
        let elapsed = swapped.elapsed();
        assert_eq!(
            section(&udp, "ANSWER"),
            ["late.cca.local. 5 IN A 10.43.1.1"]
        );
        assert_eq!(
            section(&tcp, "ANSWER"),
            ["late.cca.local. 5 IN A 10.43.1.1"]
        );
        assert_eq!(status(&gone), "NXDOMAIN");
        assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
        server.shutdown().await;
    });
}

/// A UDP socket and a TCP listener on the same port: with port 0, a port
/// free for UDP may be someone else's for TCP (other tests run beside
/// this one), so another is tried.
async fn udp_and_tcp(address: SocketAddr) -> (UdpSocket, TcpListener) {
    for _ in 0..20 {
        let udp = UdpSocket::bind(address)
            .await
            .expect("a free port for the fake upstream");
        let port = udp.local_addr().expect("its address");
        match TcpListener::bind(port).await {
            Ok(tcp) => return (udp, tcp),
            Err(_) if address.port() == 0 => continue,
            Err(error) => panic!("TCP on {port}: {error}"),
        }
    }
    panic!("no port free for both UDP and TCP after 20 tries");
}

/// A fake upstream resolver on UDP and TCP at `address` (port 0: a free
/// one) answering every query with [`UPSTREAM_ANSWER`]; with `truncate`,
/// its UDP answers are empty with TC set. Returns the address.
async fn fake_upstream(address: SocketAddr, truncate: bool) -> SocketAddr {
    let (udp, tcp) = udp_and_tcp(address).await;
    let address = udp.local_addr().expect("its address");
    tokio::spawn(async move {
        let mut buffer = [0u8; 4096];
        while let Ok((len, peer)) = udp.recv_from(&mut buffer).await {
            let reply = upstream_reply(&buffer[..len], truncate);
            let _ = udp.send_to(&reply, peer).await;
        }
    });
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = tcp.accept().await {
            let len = stream.read_u16().await.expect("the query length");
            let mut query = vec![0; usize::from(len)];
            stream.read_exact(&mut query).await.expect("the query");
            let reply = upstream_reply(&query, false);
            stream
                .write_all(&(reply.len() as u16).to_be_bytes())
                .await
                .expect("the reply length is sent");
            stream.write_all(&reply).await.expect("the reply is sent");
        }
    });
    address
}

fn upstream_reply(query: &[u8], truncate: bool) -> Vec<u8> {
    let query = Message::from_vec(query).expect("the query parses");
    let mut reply = Message::new(query.id, MessageType::Response, query.op_code);
    reply.metadata.recursion_available = true;
    reply.metadata.recursion_desired = query.recursion_desired;
    reply.queries = query.queries.clone();
    if truncate {
        reply.metadata.truncation = true;
    } else {
        let name = query.queries[0].name().clone();
        reply.add_answer(Record::from_rdata(name, 60, RData::A(A(UPSTREAM_ANSWER))));
    }
    reply.to_vec().expect("the reply encodes")
}

#[test]
fn other_names_are_forwarded_to_the_upstream_resolver() {
    if !have_dig("other_names_are_forwarded_to_the_upstream_resolver") {
        return;
    }
    run(async {
        let upstream = fake_upstream("127.0.0.1:0".parse().unwrap(), false).await;
        let server = Running::start(Upstreams::Fixed(vec![upstream])).await;
        let out = server.dig(&["example.org"]).await;
        assert_eq!(status(&out), "NOERROR");
        assert_eq!(section(&out, "ANSWER"), ["example.org. 60 IN A 192.0.2.1"]);
        let out = server.dig(&["+tcp", "Example.Org"]).await;
        assert_eq!(section(&out, "ANSWER"), ["Example.Org. 60 IN A 192.0.2.1"]);
        assert_eq!(server.handle.metrics().snapshot().forwarded, 2);
        server.shutdown().await;
    });
}

#[test]
fn a_truncated_upstream_answer_is_asked_again_over_tcp() {
    if !have_dig("a_truncated_upstream_answer_is_asked_again_over_tcp") {
        return;
    }
    run(async {
        let upstream = fake_upstream("127.0.0.1:0".parse().unwrap(), true).await;
        let server = Running::start(Upstreams::Fixed(vec![upstream])).await;
        // dig retries a truncated UDP answer over TCP by itself; the server
        // then asks the upstream over UDP, sees TC, and asks over TCP.
        let out = server.dig(&["example.org"]).await;
        assert!(out.contains("Truncated, retrying in TCP mode"), "{out}");
        assert_eq!(section(&out, "ANSWER"), ["example.org. 60 IN A 192.0.2.1"]);
        let out = server.dig(&["+ignore", "example.org"]).await;
        assert!(
            out.contains("flags: qr tc rd ra"),
            "UDP gets the truncated answer: {out}"
        );
        server.shutdown().await;
    });
}

#[test]
fn a_silent_upstream_is_servfail_not_a_timeout() {
    if !have_dig("a_silent_upstream_is_servfail_not_a_timeout") {
        return;
    }
    run(async {
        // Bound and never read: queries to it go unanswered.
        let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let server = Running::start(Upstreams::Fixed(vec![silent.local_addr().unwrap()])).await;
        let started = Instant::now();
        let out = server.dig(&["example.org"]).await;
        assert_eq!(status(&out), "SERVFAIL");
        assert!(started.elapsed() < Duration::from_secs(2));
        let no_upstream = Running::start(Upstreams::Fixed(Vec::new())).await;
        assert_eq!(
            status(&no_upstream.dig(&["+tcp", "example.org"]).await),
            "SERVFAIL"
        );
        assert_eq!(no_upstream.handle.metrics().snapshot().errors, 1);
        server.shutdown().await;
        no_upstream.shutdown().await;
    });
}

#[test]
fn forwards_past_the_bound_are_servfail_at_once() {
    if !have_dig("forwards_past_the_bound_are_servfail_at_once") {
        return;
    }
    run(async {
        let silent = UdpSocket::bind("127.0.0.1:0").await.expect("a free port");
        let upstream = silent.local_addr().expect("its address");
        let server = Running::with(Upstreams::Fixed(vec![upstream]), |config| {
            config.max_forwards = 1;
            config.forward_timeout = Duration::from_secs(2);
        })
        .await;
        let address = server.address;
        // The one slot, held for the whole timeout by a silent upstream.
        let first = tokio::spawn(async move { dig(address, &["+time=5", "example.org"]).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        let second = server.dig(&["example.net"]).await;
        assert_eq!(status(&second), "SERVFAIL");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "not queued behind the first: {:?}",
            started.elapsed()
        );
        let first = first.await.expect("the first dig ran");
        assert_eq!(status(&first), "SERVFAIL", "the upstream never answered");
        assert_eq!(server.handle.metrics().snapshot().forwarded, 1);
        server.shutdown().await;
    });
}

#[test]
fn garbage_over_udp_and_tcp_does_not_stop_the_server() {
    if !have_dig("garbage_over_udp_and_tcp_does_not_stop_the_server") {
        return;
    }
    run(async {
        let server = Running::start(Upstreams::Fixed(Vec::new())).await;
        let client = UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("a client socket");
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..2_000 {
            let packet: Vec<u8> = (0..rng.usize(..300)).map(|_| rng.u8(..)).collect();
            client
                .send_to(&packet, server.address)
                .await
                .expect("a datagram is sent");
        }
        for _ in 0..20 {
            let mut stream = tokio::net::TcpStream::connect(server.address)
                .await
                .expect("a TCP connection");
            let garbage: Vec<u8> = (0..rng.usize(..600)).map(|_| rng.u8(..)).collect();
            // The server may close the connection halfway: that is fine.
            let _ = stream.write_all(&garbage).await;
        }
        let out = server.dig(&["web.cca.local"]).await;
        assert_eq!(section(&out, "ANSWER"), ["web.cca.local. 5 IN A 10.43.0.7"]);
        let out = server.dig(&["+tcp", "web.cca.local"]).await;
        assert_eq!(section(&out, "ANSWER"), ["web.cca.local. 5 IN A 10.43.0.7"]);
        server.shutdown().await;
    });
}

#[test]
#[allow(clippy::print_stderr, reason = "a skipped test says why")]
fn upstreams_come_from_resolv_conf_without_this_server() {
    if !have_dig("upstreams_come_from_resolv_conf_without_this_server") {
        return;
    }
    run(async {
        // resolv.conf names port 53 only: fake resolvers on random
        // loopback addresses, which needs root.
        let random_ip = || {
            IpAddr::V4(Ipv4Addr::new(
                127,
                53,
                fastrand::u8(1..=254),
                fastrand::u8(1..=254),
            ))
        };
        let (ip, own_ip) = (random_ip(), random_ip());
        let Ok(own) = UdpSocket::bind(SocketAddr::new(own_ip, 53)).await else {
            eprintln!(
                "skipping upstreams_come_from_resolv_conf_without_this_server: binding port 53 needs root"
            );
            return;
        };
        // `own` stands for this server reached through a NAT rule: bound
        // and never answering, so trying it would cost the whole timeout.
        fake_upstream(SocketAddr::new(ip, 53), false).await;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("resolv.conf");
        std::fs::write(
            &path,
            format!("search example\nnameserver {own_ip}\nnameserver {ip}\n"),
        )
        .unwrap();
        let mut config = DnsConfig::new(vec!["127.0.0.1:0".parse().unwrap()]);
        config.upstreams = Upstreams::ResolvConf(path);
        config.also_self = vec![own_ip];
        config.forward_timeout = Duration::from_millis(500);
        let server = DnsServer::bind(config, Arc::new(map())).await.unwrap();
        let address = server.local_addrs()[0];
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        let started = Instant::now();
        let out = dig(address, &["example.org"]).await;
        assert_eq!(section(&out, "ANSWER"), ["example.org. 60 IN A 192.0.2.1"]);
        assert!(
            started.elapsed() < Duration::from_millis(400),
            "the address that is this server was skipped, not tried until it timed out"
        );
        drop(own);
        let _ = stop.send(());
        task.await.unwrap().unwrap();
    });
}

#[test]
fn shutdown_closes_the_ports() {
    run(async {
        let server = Running::start(Upstreams::Fixed(Vec::new())).await;
        let address = server.address;
        server.shutdown().await;
        // Both ports are free again.
        drop(UdpSocket::bind(address).await.unwrap());
        drop(TcpListener::bind(address).await.unwrap());
    });
}
