//! The gate over real sockets: backends are hyper servers on loopback, the
//! client is reqwest (HTTP/1.1, HTTP/2 and TLS with SNI) or a raw TCP
//! stream (WebSocket handshake, HTTP/1.1 framing, pipelining, `100
//! Continue`, requests the gate refuses).

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cca_gate::{Gate, Listener, ProxyOptions, ServerOptions};
use cca_model::net::{Affinity, NetworkMap, ServiceNet, Target};
use cca_model::spec::{GateSpec, PortSpec, SameSite, Sticky};
use cca_tls::HostPair;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Responses `/cached` served (one test uses it).
static CACHED_SERVED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A backend answering every request with its name and the request's
/// forwarding headers; `/slow` waits a second first, `/hang` half a
/// minute; `/ws` upgrades and echoes.
struct Backend {
    address: SocketAddr,
    /// Notified when a `/slow` request arrives, so a test can act while
    /// one is surely in flight.
    slow_arrived: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn backend(name: &'static str) -> Backend {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let slow_arrived = Arc::new(tokio::sync::Notify::new());
    let arrivals = slow_arrived.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let arrivals = arrivals.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let arrivals = arrivals.clone();
                    async move { Ok::<_, Infallible>(answer(name, &arrivals, request).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Backend {
        address,
        slow_arrived,
        task,
    }
}

async fn answer(
    name: &str,
    slow_arrived: &tokio::sync::Notify,
    mut request: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    if request.uri().path() == "/ws" {
        let upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                let mut io = TokioIo::new(upgraded);
                let mut buffer = [0u8; 64];
                while let Ok(n) = io.read(&mut buffer).await {
                    if n == 0 || io.write_all(&buffer[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        return Response::builder()
            .status(101)
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .body(Full::default())
            .expect("response");
    }
    if request.uri().path() == "/echo" {
        use http_body_util::BodyExt;
        let body = request
            .into_body()
            .collect()
            .await
            .map(|all| all.to_bytes());
        return Response::new(Full::new(body.unwrap_or_default()));
    }
    if request.uri().path() == "/cached" {
        let served = CACHED_SERVED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        return Response::builder()
            .header("cache-control", "public, max-age=60")
            .body(Full::new(Bytes::from(format!("served {served}\n"))))
            .expect("response");
    }
    if request.uri().path() == "/slow" {
        slow_arrived.notify_one();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    if request.uri().path() == "/hang" {
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    let body = format!(
        "backend={name}\nhost={}\nxff={}\nproto={}\nxhost={}\nforwarded={}\n",
        header("host"),
        header("x-forwarded-for"),
        header("x-forwarded-proto"),
        header("x-forwarded-host"),
        header("forwarded"),
    );
    Response::new(Full::new(Bytes::from(body)))
}

fn service(name: &str, port: u16, backends: &[(&str, SocketAddr)]) -> Arc<ServiceNet> {
    let targets = backends
        .iter()
        .map(|(instance, address)| Target {
            instance: (*instance).to_owned(),
            node: "n1".into(),
            address: match address.ip() {
                std::net::IpAddr::V4(v4) => v4,
                std::net::IpAddr::V6(_) => Ipv4Addr::LOCALHOST,
            },
            port: address.port(),
        })
        .collect();
    Arc::new(ServiceNet {
        name: name.into(),
        vip: None,
        ports: vec![PortSpec::tcp("http", port)],
        affinity: Affinity::default(),
        endpoints: [("http".to_owned(), targets)].into(),
        members: vec![],
        asleep: false,
        scale_to_zero: None,
    })
}

fn gate_spec(name: &str, hosts: &[&str], service: &str) -> GateSpec {
    GateSpec {
        name: name.into(),
        hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
        service: service.into(),
        port: 8080,
        ..GateSpec::default()
    }
}

fn map(gates: Vec<GateSpec>, services: Vec<Arc<ServiceNet>>) -> NetworkMap {
    let mut map = NetworkMap::default();
    for gate in gates {
        map.gates.insert(gate.name.clone(), Arc::new(gate));
    }
    for service in services {
        map.services.insert(service.name.clone(), service);
    }
    map
}

/// A running gate; stops (and drains) when dropped.
struct Running {
    gate: Arc<Gate>,
    http: SocketAddr,
    https: SocketAddr,
    stop: watch::Sender<bool>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn start(map: &NetworkMap) -> Running {
    start_with(map, ServerOptions::default()).await
}

async fn start_with(map: &NetworkMap, options: ServerOptions) -> Running {
    let gate = Arc::new(Gate::new(ProxyOptions::default()));
    gate.update(map);
    let http = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind");
    let https = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind");
    let (http_address, https_address) = (
        http.local_addr().expect("address"),
        https.local_addr().expect("address"),
    );
    let listeners = vec![
        Listener {
            socket: http,
            tls: None,
        },
        Listener {
            socket: https,
            tls: Some(gate.tls_config().expect("tls config")),
        },
    ];
    let (stop, stopped) = watch::channel(false);
    let serving = Arc::clone(&gate);
    tokio::spawn(async move {
        serving
            .serve(listeners, options, stopped)
            .await
            .expect("the gate serves");
    });
    Running {
        gate,
        http: http_address,
        https: https_address,
        stop,
    }
}

/// A gate for `shop.example.com` in front of `web` alone.
async fn start_shop(web: &Backend) -> Running {
    start(&map(
        vec![gate_spec("shop", &["shop.example.com"], "web")],
        vec![service("web", 8080, &[("web-a", web.address)])],
    ))
    .await
}

async fn get(client: &reqwest::Client, url: &str, host: &str) -> (u16, String) {
    let response = client
        .get(url)
        .header("host", host)
        .send()
        .await
        .expect("request");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

#[tokio::test]
async fn requests_reach_the_backend_of_their_host_with_forwarding_headers() {
    let web = backend("web-a").await;
    let running = start_shop(&web).await;
    let client = reqwest::Client::new();
    let url = format!("http://{}/hello", running.http);
    let (status, body) = get(&client, &url, "Shop.Example.com:80").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("backend=web-a"), "{body}");
    assert!(body.contains("host=Shop.Example.com:80"), "{body}");
    assert!(body.contains("xff=127.0.0.1\n"), "{body}");
    assert!(body.contains("proto=http\n"), "{body}");
    assert!(body.contains("xhost=Shop.Example.com:80\n"), "{body}");
    assert!(
        body.contains("forwarded=for=127.0.0.1;proto=http;host=\"Shop.Example.com:80\""),
        "{body}"
    );
}

#[tokio::test]
async fn an_unknown_host_is_404_and_a_target_without_backends_503() {
    let running = start(&map(
        vec![gate_spec("shop", &["shop.example.com"], "web")],
        vec![service("web", 8080, &[])],
    ))
    .await;
    let client = reqwest::Client::new();
    let url = format!("http://{}/", running.http);
    let (status, body) = get(&client, &url, "nobody.example.com").await;
    assert_eq!(status, 404);
    assert_eq!(body, "no gate serves the host \"nobody.example.com\"\n");
    let response = client
        .get(&url)
        .header("host", "shop.example.com")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status().as_u16(), 503);
    assert_eq!(response.headers()["retry-after"], "5");
    let body = response.text().await.expect("body");
    assert!(
        body.contains("service \"web\" has no ready instance"),
        "{body}"
    );
}

#[tokio::test]
async fn http2_with_prior_knowledge_is_served() {
    let web = backend("web-a").await;
    let running = start_shop(&web).await;
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .resolve("shop.example.com", running.http)
        .build()
        .expect("client");
    let response = client
        .get(format!("http://shop.example.com:{}/", running.http.port()))
        .send()
        .await
        .expect("request");
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert!(
        response
            .text()
            .await
            .expect("body")
            .contains("backend=web-a")
    );
}

fn self_signed(host: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec![host.to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    (cert.pem(), key.serialize_pem())
}

#[tokio::test]
async fn https_serves_each_host_its_own_certificate_by_sni() {
    let web = backend("web-a").await;
    let api = backend("api-a").await;
    let running = start(&map(
        vec![
            gate_spec("shop", &["shop.example.com"], "web"),
            gate_spec("api", &["api.example.com"], "api"),
        ],
        vec![
            service("web", 8080, &[("web-a", web.address)]),
            service("api", 8080, &[("api-a", api.address)]),
        ],
    ))
    .await;
    let (shop_chain, shop_key) = self_signed("shop.example.com");
    let (api_chain, api_key) = self_signed("api.example.com");
    let shop_hosts = vec!["shop.example.com".to_owned()];
    let api_hosts = vec!["api.example.com".to_owned()];
    let failed = running.gate.certificates().replace([
        HostPair {
            hosts: &shop_hosts,
            chain_pem: &shop_chain,
            key_pem: &shop_key,
        },
        HostPair {
            hosts: &api_hosts,
            chain_pem: &api_chain,
            key_pem: &api_key,
        },
    ]);
    assert!(failed.is_empty());
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(shop_chain.as_bytes()).expect("pem"))
        .add_root_certificate(reqwest::Certificate::from_pem(api_chain.as_bytes()).expect("pem"))
        .resolve("shop.example.com", running.https)
        .resolve("api.example.com", running.https)
        .build()
        .expect("client");
    for (host, expected) in [("shop", "web-a"), ("api", "api-a")] {
        let response = client
            .get(format!(
                "https://{host}.example.com:{}/",
                running.https.port()
            ))
            .send()
            .await
            .expect("a verified HTTPS request");
        assert_eq!(
            response.version(),
            reqwest::Version::HTTP_2,
            "ALPN picks h2"
        );
        let body = response.text().await.expect("body");
        assert!(body.contains(&format!("backend={expected}")), "{body}");
        assert!(body.contains("proto=https"), "{body}");
    }
    // HTTP/1.1 over TLS: the gate's own HTTP/1.1 server behind rustls.
    let http1 = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(shop_chain.as_bytes()).expect("pem"))
        .resolve("shop.example.com", running.https)
        .http1_only()
        .build()
        .expect("client");
    for _ in 0..3 {
        let response = http1
            .post(format!(
                "https://shop.example.com:{}/echo",
                running.https.port()
            ))
            .body("over tls")
            .send()
            .await
            .expect("an HTTP/1.1 request over TLS");
        assert_eq!(response.version(), reqwest::Version::HTTP_11);
        assert_eq!(response.text().await.expect("body"), "over tls");
    }
}

#[tokio::test]
async fn a_websocket_handshake_and_its_bytes_pass_through() {
    let web = backend("web-a").await;
    let running = start_shop(&web).await;
    let mut stream = TcpStream::connect(running.http).await.expect("connect");
    stream
        .write_all(
            b"GET /ws HTTP/1.1\r\nHost: shop.example.com\r\nConnection: Upgrade\r\n\
              Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        )
        .await
        .expect("handshake");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await.expect("response head");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    stream.write_all(b"ping").await.expect("send");
    let mut echoed = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut echoed))
        .await
        .expect("echo in time")
        .expect("echo");
    assert_eq!(&echoed, b"ping");
}

#[tokio::test]
async fn a_dead_backend_costs_no_idempotent_request() {
    let live = backend("web-live").await;
    // A port nothing listens on: connections are refused.
    let dead = {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        listener.local_addr().expect("address")
    };
    let running = start(&map(
        vec![gate_spec("shop", &["shop.example.com"], "web")],
        vec![service(
            "web",
            8080,
            &[("web-dead", dead), ("web-live", live.address)],
        )],
    ))
    .await;
    let client = reqwest::Client::new();
    let url = format!("http://{}/", running.http);
    for _ in 0..20 {
        let (status, body) = get(&client, &url, "shop.example.com").await;
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("backend=web-live"));
    }
    let metrics = running.gate.metrics().render();
    assert!(
        metrics.contains(
            "cca_gate_backend_ejections_total{service=\"web\",instance=\"web-dead\",node=\"n1\"} 1"
        ),
        "{metrics}"
    );
    let described = running.gate.describe("shop").expect("the gate");
    let states: Vec<(String, bool)> = described[0]
        .backends
        .iter()
        .map(|b| {
            let ejected = matches!(b.state, cca_model::net::BackendState::Ejected { .. });
            (b.target.instance.clone(), ejected)
        })
        .collect();
    assert_eq!(
        states,
        vec![
            ("web-dead".to_owned(), true),
            ("web-live".to_owned(), false)
        ]
    );
    assert!(running.gate.describe("nope").is_none());
    // The ejected backend gets no new request, not even a POST, which
    // could not be retried elsewhere.
    let mut refused = 0;
    for _ in 0..4 {
        let response = client
            .post(&url)
            .header("host", "shop.example.com")
            .body("x")
            .send()
            .await
            .expect("request");
        refused += u32::from(response.status().as_u16() == 502);
    }
    assert_eq!(refused, 0, "the ejected backend gets no new requests");
}

#[tokio::test]
async fn a_sticky_session_keeps_its_backend_across_a_scale_up() {
    let a = backend("web-a").await;
    let b = backend("web-b").await;
    let c = backend("web-c").await;
    let mut spec = gate_spec("shop", &["shop.example.com"], "web");
    spec.sticky = Some(Sticky {
        cookie: "__CCA_STICKY_web".into(),
        secure: false,
        http_only: true,
        same_site: SameSite::Lax,
    });
    let two = map(
        vec![spec.clone()],
        vec![service(
            "web",
            8080,
            &[("web-a", a.address), ("web-b", b.address)],
        )],
    );
    let running = start(&two).await;
    let url = format!("http://{}/", running.http);
    let first = reqwest::Client::new()
        .get(&url)
        .header("host", "shop.example.com")
        .send()
        .await
        .expect("request");
    let cookie = first.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Lax"),
        "{cookie}"
    );
    let pinned_to = first.text().await.expect("body");
    let pair = cookie.split(';').next().expect("pair").to_owned();
    running.gate.update(&map(
        vec![spec],
        vec![service(
            "web",
            8080,
            &[
                ("web-a", a.address),
                ("web-b", b.address),
                ("web-c", c.address),
            ],
        )],
    ));
    let client = reqwest::Client::new();
    for _ in 0..10 {
        let response = client
            .get(&url)
            .header("host", "shop.example.com")
            .header("cookie", &pair)
            .send()
            .await
            .expect("request");
        assert!(
            response.headers().get("set-cookie").is_none(),
            "still pinned"
        );
        let body = response.text().await.expect("body");
        assert_eq!(
            body.lines().next(),
            pinned_to.lines().next(),
            "the session stays on its backend"
        );
    }
}

#[tokio::test]
async fn a_map_change_does_not_cut_a_request_in_flight() {
    let web = backend("web-a").await;
    let spec = gate_spec("shop", &["shop.example.com"], "web");
    let running = start(&map(
        vec![spec.clone()],
        vec![service("web", 8080, &[("web-a", web.address)])],
    ))
    .await;
    let url = format!("http://{}/slow", running.http);
    let slow =
        tokio::spawn(async move { get(&reqwest::Client::new(), &url, "shop.example.com").await });
    web.slow_arrived.notified().await;
    running
        .gate
        .update(&map(vec![spec], vec![service("web", 8080, &[])]));
    let (status, body) = slow.await.expect("task");
    assert_eq!(status, 200, "{body}");
    let (status, _) = get(
        &reqwest::Client::new(),
        &format!("http://{}/", running.http),
        "shop.example.com",
    )
    .await;
    assert_eq!(status, 503, "new requests see the new map");
}

#[tokio::test]
async fn a_cacheable_get_is_answered_from_the_cache() {
    let web = backend("web-a").await;
    let mut spec = gate_spec("shop", &["shop.example.com"], "web");
    spec.cache = Some(cca_model::spec::ResponseCache::default());
    let running = start(&map(
        vec![spec],
        vec![service("web", 8080, &[("web-a", web.address)])],
    ))
    .await;
    let client = reqwest::Client::new();
    let url = format!("http://{}/cached", running.http);
    let mut answers = Vec::new();
    for _ in 0..3 {
        let response = client
            .get(&url)
            .header("host", "shop.example.com")
            .send()
            .await
            .expect("request");
        let hit = response.headers().get("cca-cache").is_some();
        answers.push((hit, response.text().await.expect("body")));
    }
    assert_eq!(
        answers,
        vec![
            (false, "served 1\n".to_owned()),
            (true, "served 1\n".to_owned()),
            (true, "served 1\n".to_owned()),
        ]
    );
    // HEAD is answered from the GET's entry, with the GET's length.
    let head = client
        .head(&url)
        .header("host", "shop.example.com")
        .send()
        .await
        .expect("request");
    assert!(head.headers().get("cca-cache").is_some(), "{head:?}");
    assert_eq!(
        head.headers().get("content-length").map(|v| v.as_bytes()),
        Some(&b"9"[..]),
        "{head:?}"
    );
    // A request that refuses cached answers reaches the backend.
    let fresh = client
        .get(&url)
        .header("host", "shop.example.com")
        .header("cache-control", "no-cache")
        .send()
        .await
        .expect("request");
    assert_eq!(fresh.text().await.expect("body"), "served 2\n");
    let metrics = running.gate.metrics().render();
    assert!(
        metrics.contains("cca_gate_cache_hits_total{gate=\"shop\"} 3"),
        "{metrics}"
    );
}

/// A waker that says which services it was asked to wake.
#[derive(Debug)]
struct Recorded(tokio::sync::mpsc::UnboundedSender<String>);

impl cca_gate::traffic::Wake for Recorded {
    fn wake(&self, service: &str) {
        let _ = self.0.send(service.to_owned());
    }
}

fn asleep(name: &str) -> Arc<ServiceNet> {
    let mut net = ServiceNet::clone(&service(name, 8080, &[]));
    net.asleep = true;
    net.scale_to_zero = Some(60_000);
    Arc::new(net)
}

#[tokio::test]
async fn a_request_for_a_sleeping_service_wakes_it_and_waits() {
    let web = backend("web-a").await;
    let spec = gate_spec("shop", &["shop.example.com"], "web");
    let running = start(&map(vec![spec.clone()], vec![asleep("web")])).await;
    let (wakes, mut woken) = tokio::sync::mpsc::unbounded_channel();
    running.gate.set_waker(Arc::new(Recorded(wakes)));
    let url = format!("http://{}/", running.http);
    let request = tokio::spawn(async move {
        reqwest::Client::new()
            .get(&url)
            .header("host", "shop.example.com")
            .send()
            .await
    });
    let asked = woken.recv().await.expect("a wake call");
    assert_eq!(asked, "web");
    // The control plane starts an instance; its endpoint reaches the map.
    tokio::time::sleep(Duration::from_millis(100)).await;
    running.gate.update(&map(
        vec![spec],
        vec![service("web", 8080, &[("web-a", web.address)])],
    ));
    let response = request.await.expect("task").expect("response");
    assert_eq!(response.status().as_u16(), 200);
    let waited: u64 = response.headers()["cca-cold-start"]
        .to_str()
        .expect("text")
        .parse()
        .expect("milliseconds");
    assert!(waited >= 100, "held {waited} ms");
    assert!(
        response
            .text()
            .await
            .expect("body")
            .contains("backend=web-a")
    );
    let metrics = running.gate.metrics().render();
    assert!(
        metrics.contains("cca_gate_cold_starts_total{gate=\"shop\"} 1"),
        "{metrics}"
    );
    // Its traffic is there for the agent to report.
    let traffic = running.gate.traffic().take_new();
    assert!(traffic.contains_key("web"), "{traffic:?}");
    // And its count, for autoscaling on requests per second.
    let counted = running.gate.traffic().requests();
    assert_eq!(counted.get("web"), Some(&1), "{counted:?}");
}

#[tokio::test]
async fn a_service_that_does_not_wake_in_time_gets_a_503_and_a_full_queue_at_once() {
    let mut spec = gate_spec("shop", &["shop.example.com"], "web");
    spec.timeouts.wake = cca_model::spec::Duration(300);
    spec.queue = 1;
    let running = start(&map(vec![spec], vec![asleep("web")])).await;
    let (wakes, mut woken) = tokio::sync::mpsc::unbounded_channel();
    running.gate.set_waker(Arc::new(Recorded(wakes)));
    let url = format!("http://{}/", running.http);
    let first = {
        let url = url.clone();
        tokio::spawn(async move { get(&reqwest::Client::new(), &url, "shop.example.com").await })
    };
    // The first request holds the queue's place before it wakes the
    // service.
    assert_eq!(woken.recv().await.as_deref(), Some("web"));
    let (status, body) = get(&reqwest::Client::new(), &url, "shop.example.com").await;
    assert_eq!(status, 503, "the queue of one is full");
    assert!(body.contains("1 requests already wait"), "{body}");
    let (status, body) = first.await.expect("task");
    assert_eq!(status, 503);
    assert!(body.contains("did not wake within 300ms"), "{body}");
}

#[tokio::test]
async fn plain_http_to_a_gate_with_a_tls_redirect_gets_a_308_to_https() {
    let web = backend("web-a").await;
    let mut spec = gate_spec("shop", &["shop.example.com"], "web");
    spec.tls = Some(cca_model::spec::Tls::SelfSigned);
    spec.redirect_https = true;
    let running = start(&map(
        vec![spec],
        vec![service("web", 8080, &[("web-a", web.address)])],
    ))
    .await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let response = client
        .get(format!("http://{}/cart?item=3", running.http))
        .header("host", "shop.example.com")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status().as_u16(), 308);
    // The test gate has no HTTPS port of its own configured: the standard one.
    assert_eq!(
        response.headers()["location"],
        "https://shop.example.com/cart?item=3"
    );
}

/// One HTTP/1.1 connection to `at`, driven by hyper's client connection:
/// the request sender and the connection's task (done when it closes).
async fn connection(
    at: SocketAddr,
) -> (
    hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    tokio::task::JoinHandle<tokio::time::Instant>,
) {
    let stream = TcpStream::connect(at).await.expect("connect");
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    let closed = tokio::spawn(async move {
        let _ = connection.await;
        tokio::time::Instant::now()
    });
    (sender, closed)
}

async fn send(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &str,
) -> u16 {
    use http_body_util::BodyExt;
    let request = Request::get(path)
        .header("host", "shop.example.com")
        .body(Full::default())
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let status = response.status().as_u16();
    response.into_body().collect().await.expect("body");
    status
}

#[tokio::test]
async fn a_connection_idle_past_its_gates_idle_timeout_is_closed_and_a_busy_one_is_not() {
    let web = backend("web-a").await;
    let mut spec = gate_spec("shop", &["shop.example.com"], "web");
    spec.timeouts.idle = cca_model::spec::Duration(600);
    let running = start(&map(
        vec![spec],
        vec![service("web", 8080, &[("web-a", web.address)])],
    ))
    .await;
    let (mut idle, idle_closed) = connection(running.http).await;
    assert_eq!(send(&mut idle, "/").await, 200);
    let quiet_since = tokio::time::Instant::now();
    // `/slow` keeps a request in flight for a second, past the timeout.
    let (mut busy, busy_closed) = connection(running.http).await;
    assert_eq!(send(&mut busy, "/slow").await, 200, "not cut mid-request");
    assert!(!busy_closed.is_finished(), "closed while busy");
    let closed_at = tokio::time::timeout(Duration::from_secs(10), idle_closed)
        .await
        .expect("the idle connection is closed")
        .expect("task");
    let quiet = closed_at - quiet_since;
    assert!(
        quiet >= Duration::from_millis(500),
        "closed after {quiet:?}, before the idle timeout"
    );
    // The busy one's timeout counts from its last response.
    tokio::time::timeout(Duration::from_secs(10), busy_closed)
        .await
        .expect("the other connection is closed once idle")
        .expect("task");
}

#[tokio::test]
async fn a_client_slow_with_its_headers_is_cut_off_and_an_idle_one_is_not() {
    let web = backend("web-a").await;
    let options = ServerOptions {
        header_timeout: Duration::from_secs(1),
        ..ServerOptions::default()
    };
    let running = start_with(
        &map(
            vec![gate_spec("shop", &["shop.example.com"], "web")],
            vec![service("web", 8080, &[("web-a", web.address)])],
        ),
        options,
    )
    .await;
    let mut idle = TcpStream::connect(running.http).await.expect("connect");
    let mut slow = TcpStream::connect(running.http).await.expect("connect");
    let started = tokio::time::Instant::now();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: shop.exa")
        .await
        .expect("half a head");
    let mut buffer = [0u8; 256];
    let read = tokio::time::timeout(Duration::from_secs(10), slow.read(&mut buffer))
        .await
        .expect("the slow client is cut off");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    let after = started.elapsed();
    assert!(
        after >= Duration::from_millis(900),
        "cut off after {after:?}"
    );
    // The idle one has sent nothing: only the idle timeout (60 s) applies.
    let still_open = tokio::time::timeout(Duration::from_millis(500), idle.read(&mut buffer)).await;
    assert!(
        still_open.is_err(),
        "the idle connection was closed: {still_open:?}"
    );
    idle.write_all(b"GET / HTTP/1.1\r\nHost: shop.example.com\r\n\r\n")
        .await
        .expect("a request");
    let read = idle.read(&mut buffer).await.expect("the answer");
    assert!(
        buffer[..read].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buffer[..read])
    );
}

#[tokio::test]
async fn a_backend_silent_past_the_response_timeout_gets_a_504() {
    let web = backend("web-a").await;
    let mut spec = gate_spec("shop", &["shop.example.com"], "web");
    // Long enough for the connection sweep to time it (2 s and more).
    spec.timeouts.response = cca_model::spec::Duration(2_000);
    let running = start(&map(
        vec![spec],
        vec![service("web", 8080, &[("web-a", web.address)])],
    ))
    .await;
    let client = reqwest::Client::new();
    let started = tokio::time::Instant::now();
    let (status, body) = get(
        &client,
        &format!("http://{}/hang", running.http),
        "shop.example.com",
    )
    .await;
    let after = started.elapsed();
    assert_eq!(status, 504, "{body}");
    assert!(body.contains("sent no response within 2s"), "{body}");
    assert!(
        after >= Duration::from_secs(2) && after < Duration::from_secs(5),
        "answered after {after:?}"
    );
}

/// Sends `raw` on a new connection to `at` and reads until the gate
/// closes it.
async fn raw_exchange(at: SocketAddr, raw: &[u8]) -> String {
    let mut stream = TcpStream::connect(at).await.expect("connect");
    stream.write_all(raw).await.expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the gate closes the connection")
        .expect("read");
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn request_bodies_keep_their_framing_and_pipelined_requests_are_answered_in_turn() {
    let web = backend("web-a").await;
    let gate = start_shop(&web).await;
    let pipelined = "POST /echo HTTP/1.1\r\nHost: shop.example.com\r\nContent-Length: 5\r\n\r\nhello\
                     POST /echo HTTP/1.1\r\nHost: shop.example.com\r\nTransfer-Encoding: chunked\r\n\r\n\
                     2\r\nab\r\n3;ext=1\r\ncde\r\n0\r\n\r\n\
                     HEAD / HTTP/1.1\r\nHost: shop.example.com\r\n\r\n\
                     GET / HTTP/1.1\r\nHost: shop.example.com\r\nConnection: close\r\n\r\n";
    let answer = raw_exchange(gate.http, pipelined.as_bytes()).await;
    let statuses: Vec<&str> = answer
        .match_indices("HTTP/1.1 ")
        .map(|(at, _)| &answer[at..at + 12])
        .collect();
    assert_eq!(statuses, ["HTTP/1.1 200"; 4], "{answer}");
    let hello = answer.find("\r\n\r\nhello").expect("the first body");
    let chunked = answer
        .find("\r\n\r\nabcde")
        .expect("the chunked body, whole");
    let last = answer.find("backend=web-a").expect("the GET's answer");
    assert!(hello < chunked && chunked < last, "in turn: {answer}");
    let head_response = &answer[answer.match_indices("HTTP/1.1 ").nth(2).expect("HEAD").0..last];
    assert!(
        head_response
            .to_ascii_lowercase()
            .contains("content-length: "),
        "a HEAD answer keeps the length of what a GET would get: {head_response}"
    );
    assert!(answer.contains("connection: close"), "{answer}");
}

#[tokio::test]
async fn a_client_waiting_for_100_continue_gets_it_before_sending_its_body() {
    let web = backend("web-a").await;
    let gate = start_shop(&web).await;
    let mut stream = TcpStream::connect(gate.http).await.expect("connect");
    stream
        .write_all(
            b"PUT /echo HTTP/1.1\r\nHost: shop.example.com\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n",
        )
        .await
        .expect("write");
    let mut interim = [0u8; 25];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut interim))
        .await
        .expect("100 Continue comes without the body")
        .expect("read");
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(b"data").await.expect("write");
    let mut answer = vec![0u8; 4096];
    let mut read = 0;
    while !answer[..read].ends_with(b"data") {
        let got = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut answer[read..]))
            .await
            .expect("the answer")
            .expect("read");
        assert!(got > 0, "{}", String::from_utf8_lossy(&answer[..read]));
        read += got;
    }
    assert!(answer.starts_with(b"HTTP/1.1 200 OK\r\n"));
}

#[tokio::test]
async fn requests_two_readers_could_frame_differently_are_refused_and_the_connection_closed() {
    let web = backend("web-a").await;
    let gate = start_shop(&web).await;
    let cases = [
        (
            "POST /echo HTTP/1.1\r\nHost: shop.example.com\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n",
            "HTTP/1.1 400 Bad Request",
            "both Transfer-Encoding and Content-Length",
        ),
        (
            "POST /echo HTTP/1.1\r\nHost: shop.example.com\r\nTransfer-Encoding: gzip\r\n\r\n",
            "HTTP/1.1 501 Not Implemented",
            "not a lone \"chunked\"",
        ),
        (
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "HTTP/1.1 400 Bad Request",
            "exactly one Host header",
        ),
        (
            "POST /echo HTTP/1.1\r\nHost: shop.example.com\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "HTTP/1.1 400 Bad Request",
            "chunk size that is not a hexadecimal number",
        ),
    ];
    for (raw, status, reason) in cases {
        let answer = raw_exchange(gate.http, raw.as_bytes()).await;
        assert!(answer.starts_with(status), "{raw}\n=> {answer}");
        assert!(answer.contains(reason), "{raw}\n=> {answer}");
        let answers = answer
            .lines()
            .filter(|line| line.starts_with("HTTP/1.1 "))
            .count();
        assert_eq!(answers, 1, "nothing more is served: {answer}");
    }
}

#[tokio::test]
async fn connect_is_refused_with_405() {
    let web = backend("web-a").await;
    let gate = start_shop(&web).await;
    let answer = raw_exchange(
        gate.http,
        b"CONNECT shop.example.com:443 HTTP/1.1\r\nHost: shop.example.com:443\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
        "{answer}"
    );
    assert!(answer.contains("does not tunnel CONNECT"), "{answer}");
}

#[tokio::test]
async fn an_http10_client_keeps_its_connection_only_when_it_asks() {
    let web = backend("web-a").await;
    let gate = start_shop(&web).await;
    let kept = raw_exchange(
        gate.http,
        b"GET / HTTP/1.0\r\nHost: shop.example.com\r\nConnection: keep-alive\r\n\r\n\
          GET / HTTP/1.0\r\nHost: shop.example.com\r\n\r\n",
    )
    .await;
    assert_eq!(kept.matches("backend=web-a").count(), 2, "{kept}");
    let (first, second) = kept.split_at(kept.rfind("HTTP/1.1 200").expect("two answers"));
    assert!(first.contains("connection: keep-alive"), "{first}");
    assert!(second.contains("connection: close"), "{second}");
}
