//! Gates end to end with the clients people use: `cca dev` serves a
//! program's gates on the ports it prints, and `curl` reaches the service
//! through them over HTTP/1.1, HTTP/2 and HTTPS (the certificate the
//! cluster CA issued for the gate's hosts, by SNI), gets the gate's own 404
//! for a host no gate serves, and completes a WebSocket handshake (`cca
//! whoami` echoes WebSocket messages on `/ws`); under `h2load`'s load, a
//! backend killed with SIGKILL costs at most the requests in flight to it.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use support::dev::Dev;

/// One `cca dev` at a time: two dev clusters on one machine hand out the
/// same host ports (20000 up). Agents skip ports held outside their
/// cluster, but two starting together can still pick the same free port
/// (see `.config/nextest.toml`).
static ONE_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

const PROGRAM: &str = r#"
service hello {
  run = "exec cca whoami --port $PORT"
  replicas = 2
  port http 8080
  health {
    http "/"
    interval = 1s
    timeout = 500ms
  }
}

gate hello {
  host "hello.localhost" "*.apps.localhost"
  service hello port http
  tls {
    self_signed
  }
}
"#;

/// The plain-HTTP and HTTPS gate ports `cca dev` printed.
fn gate_ports(shown: &str) -> (u16, u16) {
    let line = shown
        .lines()
        .find_map(|line| line.strip_prefix("cca dev: gates on "))
        .unwrap_or_else(|| panic!("no gate line in:\n{shown}"));
    let port = |scheme: &str| {
        line.split_whitespace()
            .find_map(|word| word.strip_prefix(scheme))
            .and_then(|address| address.rsplit_once(':'))
            .and_then(|(_, port)| port.parse().ok())
            .unwrap_or_else(|| panic!("no {scheme} address in {line:?}"))
    };
    (port("http://"), port("https://"))
}

/// `curl -sS ARGS`, returning its stdout (and failing the test with its
/// stderr when it fails).
fn curl(args: &[&str]) -> String {
    let output = Command::new("curl")
        .arg("-sS")
        .args(args)
        .output()
        .expect("curl runs (scripts/test installs it)");
    assert!(
        output.status.success(),
        "curl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Polls `url` through the gate until the service answers 200 (instances
/// become ready a moment after `cca dev` prints them running; a gate's
/// certificate arrives a moment after the gate).
fn until_served(extra: &[&str], resolve: &str, url: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let output = Command::new("curl")
            .args(["-sS", "--resolve", resolve, "-w", "\n%{http_code}"])
            .args(extra)
            .arg(url)
            .output()
            .expect("curl runs (scripts/test installs it)");
        let shown = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        if shown.ends_with("\n200") {
            return shown;
        }
        assert!(Instant::now() < deadline, "never served; last:\n{shown}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn curl_reaches_a_service_through_its_gate() {
    let _alone = ONE_CLUSTER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("app.cca"), PROGRAM).expect("writes the program");
    let dev = Dev::start(dir.path(), &["--data-dir", "data", "app.cca"]);
    let (api, _) = dev.api_url();
    let shown = dev.read_until(|line, _| line.starts_with("cca dev: gates on "));
    let (port, tls_port) = gate_ports(&shown);
    let resolve = format!("hello.localhost:{port}:127.0.0.1");
    let url = format!("http://hello.localhost:{port}/some/path");
    let body = until_served(&[], &resolve, &url);
    assert!(body.contains("service: hello"), "{body}");
    assert!(body.contains("path: /some/path"), "{body}");

    // HTTPS with the certificate the cluster CA issued for the gate's
    // hosts, chosen by SNI, over HTTP/2 by ALPN.
    let ca = dir.path().join("data/trust/ca.pem");
    let ca = ca.to_str().expect("a UTF-8 path");
    let tls_resolve = format!("hello.localhost:{tls_port}:127.0.0.1");
    let tls_url = format!("https://hello.localhost:{tls_port}/secure");
    let body = until_served(&["--cacert", ca], &tls_resolve, &tls_url);
    assert!(body.contains("path: /secure"), "{body}");
    let version = curl(&[
        "--cacert",
        ca,
        "--resolve",
        &tls_resolve,
        "-o",
        "/dev/null",
        "-w",
        "%{http_version}",
        &tls_url,
    ]);
    assert_eq!(version, "2");
    let wild_tls = format!("a.apps.localhost:{tls_port}:127.0.0.1");
    let body = curl(&[
        "--cacert",
        ca,
        "--resolve",
        &wild_tls,
        &format!("https://a.apps.localhost:{tls_port}/"),
    ]);
    assert!(body.contains("service: hello"), "{body}");

    // Both instances serve, in turn.
    let mut instances = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let body = curl(&["--resolve", &resolve, &url]);
        let instance = body
            .lines()
            .find_map(|line| line.strip_prefix("instance: "))
            .expect("an instance line")
            .to_owned();
        instances.insert(instance);
    }
    assert_eq!(instances.len(), 2, "{instances:?}");

    // HTTP/2 without TLS (prior knowledge), and a wildcard host.
    let wild = format!("x.apps.localhost:{port}:127.0.0.1");
    let h2 = curl(&[
        "--http2-prior-knowledge",
        "--resolve",
        &wild,
        "-o",
        "/dev/null",
        "-w",
        "%{http_version} %{http_code}",
        &format!("http://x.apps.localhost:{port}/"),
    ]);
    assert_eq!(h2, "2 200");

    // A host no gate serves gets the gate's own 404.
    let other = format!("nobody.localhost:{port}:127.0.0.1");
    let missing = curl(&[
        "--resolve",
        &other,
        "-w",
        "%{http_code}",
        &format!("http://nobody.localhost:{port}/"),
    ]);
    assert_eq!(missing, "no gate serves the host \"nobody.localhost\"\n404");

    // A WebSocket handshake through the gate, with curl: the gate passes
    // the upgrade on and the backend's 101 back. curl keeps the upgraded
    // connection open until --max-time (exit 28): its output is the point.
    let handshake = Command::new("curl")
        .args(["-sS", "-i", "--max-time", "2", "--resolve", &resolve])
        .args(["-H", "Connection: Upgrade", "-H", "Upgrade: websocket"])
        .args(["-H", "Sec-WebSocket-Version: 13"])
        .args(["-H", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="])
        .arg(format!("http://hello.localhost:{port}/ws"))
        .output()
        .expect("curl runs");
    let shown = String::from_utf8_lossy(&handshake.stdout).to_ascii_lowercase();
    assert!(
        matches!(handshake.status.code(), Some(0 | 28)),
        "{shown}{}",
        String::from_utf8_lossy(&handshake.stderr)
    );
    assert!(shown.starts_with("http/1.1 101"), "{shown}");
    assert!(
        shown.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{shown}"
    );
    // `cca describe gate` shows the hosts, and each gate node's backends
    // with their health.
    let described = Command::new(support::CCA)
        .args(["describe", "gate", "hello"])
        .current_dir(dir.path())
        .env("CCA_SERVER", &api)
        .env("CCA_CONFIG_DIR", dir.path().join("data/trust"))
        .output()
        .expect("cca runs");
    let described = support::text(&described);
    assert!(
        described.contains("hello.localhost, *.apps.localhost"),
        "{described}"
    );
    assert!(
        described.contains("self-signed (cluster CA)"),
        "{described}"
    );
    assert!(described.contains("Gate node "), "{described}");
    assert_eq!(described.matches(" healthy ").count(), 2, "{described}");

    // And a message through it: one masked text frame, echoed unmasked.
    let echoed = websocket_echo(port, b"hello through the gate");
    assert_eq!(echoed, b"hello through the gate");
    drop(dev);
}

/// Opens a WebSocket through the gate, sends `message` as one masked text
/// frame and returns the payload of the frame that comes back.
fn websocket_echo(port: u16, message: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    stream
        .write_all(
            b"GET /ws HTTP/1.1\r\nHost: hello.localhost\r\nConnection: Upgrade\r\n\
              Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        )
        .expect("handshake");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).expect("response head");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let mask = [0x11u8, 0x22, 0x33, 0x44];
    let mut frame = vec![0x81, 0x80 | u8::try_from(message.len()).expect("short")];
    frame.extend_from_slice(&mask);
    frame.extend(message.iter().enumerate().map(|(k, b)| b ^ mask[k % 4]));
    stream.write_all(&frame).expect("frame");
    let mut header = [0u8; 2];
    stream.read_exact(&mut header).expect("frame header");
    assert_eq!(header[0], 0x81, "a final text frame");
    assert_eq!(header[1] & 0x80, 0, "server frames are not masked");
    let mut payload = vec![0u8; usize::from(header[1] & 0x7f)];
    stream.read_exact(&mut payload).expect("payload");
    payload
}

#[test]
fn cca_dev_serves_the_gate_example_over_http_and_https() {
    let _alone = ONE_CLUSTER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/gates.cca");
    let example = example.to_str().expect("a UTF-8 path");
    let dir = tempfile::tempdir().expect("temp dir");
    let dev = Dev::start(dir.path(), &["--data-dir", "data", example]);
    let shown = dev.read_until(|line, _| line.starts_with("  gate shop: curl"));
    let (port, tls_port) = gate_ports(&shown);
    assert!(
        shown.contains(&format!("gate shop: curl --cacert data/trust/ca.pem --resolve shop.localhost:{tls_port}:127.0.0.1 https://shop.localhost:{tls_port}/")),
        "{shown}"
    );
    let web = until_served(
        &[],
        &format!("shop.localhost:{port}:127.0.0.1"),
        &format!("http://shop.localhost:{port}/"),
    );
    assert!(web.contains("service: web"), "{web}");
    let ca = dir.path().join("data/trust/ca.pem");
    let api = until_served(
        &["--cacert", ca.to_str().expect("a UTF-8 path")],
        &format!("shop.localhost:{tls_port}:127.0.0.1"),
        &format!("https://shop.localhost:{tls_port}/api/orders"),
    );
    assert!(api.contains("service: api"), "{api}");
    assert!(api.contains("path: /api/orders"), "{api}");
    drop(dev);
}

#[test]
fn a_sleeping_service_wakes_on_the_first_request_through_its_gate() {
    let _alone = ONE_CLUSTER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let program = r#"
service sleepy {
  run = "exec cca whoami --port $PORT"
  port http 8080
  scale_to_zero = 2s
  health {
    http "/"
    interval = 1s
    timeout = 500ms
  }
}

gate sleepy {
  host "sleepy.localhost"
  service sleepy port http
}
"#;
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("app.cca"), program).expect("writes the program");
    let dev = Dev::start(dir.path(), &["--data-dir", "data", "app.cca"]);
    let (api, _) = dev.api_url();
    let shown = dev.read_until(|line, _| line.starts_with("cca dev: gates on "));
    let (port, _) = gate_ports(&shown);
    let resolve = format!("sleepy.localhost:{port}:127.0.0.1");
    let url = format!("http://sleepy.localhost:{port}/");
    until_served(&[], &resolve, &url);
    // Idle for its window, it goes to sleep: no instance runs.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let services = Command::new(support::CCA)
            .args(["get", "services"])
            .current_dir(dir.path())
            .env("CCA_SERVER", &api)
            .env("CCA_CONFIG_DIR", dir.path().join("data/trust"))
            .output()
            .expect("cca runs");
        let services = support::text(&services);
        if services.contains("asleep") {
            break;
        }
        assert!(Instant::now() < deadline, "never slept:\n{services}");
        std::thread::sleep(Duration::from_millis(250));
    }
    // The first request wakes it, waits, and is served; it says it waited.
    let headers =
        curl(&["--resolve", &resolve, "-D", "-", "-o", "/dev/null", &url]).to_ascii_lowercase();
    assert!(headers.starts_with("http/1.1 200"), "{headers}");
    let waited: u64 = headers
        .lines()
        .find_map(|line| line.strip_prefix("cca-cold-start: "))
        .and_then(|ms| ms.trim().parse().ok())
        .unwrap_or_else(|| panic!("no cca-cold-start header:\n{headers}"));
    assert!(waited > 0, "{headers}");
    // Once warm, requests go straight to the backend.
    let warm =
        curl(&["--resolve", &resolve, "-D", "-", "-o", "/dev/null", &url]).to_ascii_lowercase();
    assert!(
        warm.starts_with("http/1.1 200") && !warm.contains("cca-cold-start"),
        "{warm}"
    );
    drop(dev);
}

/// h2load's HTTP/1.1 connections in the kill test, each with one request
/// in flight: at most this many requests can be in flight to the killed
/// backend, so at most this many may be lost.
const LOAD_CONNECTIONS: u64 = 16;

/// Requests of the kill test's load: at [`LOAD_RATE`] about ten seconds,
/// so the kill falls well inside it.
const LOAD_REQUESTS: u64 = 4_000;

/// Requests a second each of h2load's connections sends at most: the load
/// must last, not saturate the machine — at full speed it starves the
/// timing-sensitive tests that run beside it (the overload scenarios'
/// leases).
const LOAD_RATE: u64 = 25;

/// Autoscaling on `requests_per_second`: the gate counts the requests it
/// forwards, the dev node's usage reports carry the counts, and a steady
/// 30 requests a second against 5 per instance scales the service to its
/// `max`.
#[test]
fn requests_through_the_gate_scale_a_service_on_requests_per_second() {
    let _alone = ONE_CLUSTER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let program = r#"
service rated {
  run = "exec cca whoami --port $PORT"
  port http 8080
  autoscale {
    min = 1
    max = 3
    requests_per_second = 5
  }
}

gate rated {
  host "rated.localhost"
  service rated port http
}
"#;
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("app.cca"), program).expect("writes the program");
    let dev = Dev::start(
        dir.path(),
        &["--data-dir", "data", "--usage-every", "1s", "app.cca"],
    );
    let (api, _) = dev.api_url();
    let shown = dev.read_until(|line, _| line.starts_with("cca dev: gates on "));
    let (port, _) = gate_ports(&shown);
    until_served(
        &[],
        &format!("rated.localhost:{port}:127.0.0.1"),
        &format!("http://rated.localhost:{port}/"),
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut sent = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
                    let request =
                        "GET / HTTP/1.1\r\nHost: rated.localhost\r\nConnection: close\r\n\r\n";
                    let mut answer = Vec::new();
                    if stream.write_all(request.as_bytes()).is_ok()
                        && stream.read_to_end(&mut answer).is_ok()
                    {
                        sent += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(33));
            }
            sent
        })
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        let status = cca_json(dir.path(), &api, &["scale", "why", "rated"]);
        if status["replicas"] == 3 {
            break status;
        }
        assert!(Instant::now() < deadline, "never scaled to 3: {status:#}");
        std::thread::sleep(Duration::from_millis(500));
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = load.join().expect("the load thread");
    assert!(sent > 0);
    let change = &status["autoscaled"]["last_change"];
    let signal = &change["signals"][0];
    assert_eq!(signal["metric"], "requests_per_second", "{status:#}");
    assert_eq!(signal["request"], 5_000, "{status:#}");
    assert!(
        signal["used"].as_u64().is_some_and(|used| used > 10_000),
        "well over 10 requests a second counted: {status:#}"
    );
    dev.stop();
}

#[test]
fn a_backend_killed_under_load_loses_at_most_the_requests_in_flight_to_it() {
    let _alone = ONE_CLUSTER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let program = r#"
service load {
  run = "exec cca whoami --port $PORT"
  replicas = 2
  port http 8080
  health {
    http "/"
    interval = 1s
    timeout = 500ms
  }
}

gate load {
  host "load.localhost"
  service load port http
}
"#;
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("app.cca"), program).expect("writes the program");
    let dev = Dev::start(dir.path(), &["--data-dir", "data", "app.cca"]);
    let (api, _) = dev.api_url();
    let shown = dev.read_until(|line, _| line.starts_with("cca dev: gates on "));
    let (port, _) = gate_ports(&shown);
    let resolve = format!("load.localhost:{port}:127.0.0.1");
    let url = format!("http://load.localhost:{port}/");
    until_served(&[], &resolve, &url);
    // Both replicas serve through the gate before the load starts.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut serving = std::collections::BTreeSet::new();
    while serving.len() < 2 {
        assert!(Instant::now() < deadline, "only {serving:?} ever served");
        serving.insert(answering_instance(&resolve, &url));
    }
    let victim = serving.first().expect("two instances").clone();
    let (pid, started) = instance_process(dir.path(), &api, &victim);

    // The load: h2load prints `progress: 30% done` once 30% of its
    // requests are answered; the kill comes then, so 70% of the load is
    // sent after it, whatever the machine's speed.
    let log = dir.path().join("h2load.log");
    let mut load = Load::start(port, &log);
    load.wait_for_line("progress: 30% done");
    assert_eq!(
        process_start(pid),
        Some(started),
        "{victim} died before the kill"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(i32::try_from(pid).expect("a pid")).expect("a pid"),
        rustix::process::Signal::KILL,
    )
    .unwrap_or_else(|error| panic!("SIGKILL to {victim} (pid {pid}): {error}"));
    // Dead: a zombie or reaped (its sockets are closed before it becomes
    // a zombie). No request h2load sent after this was in flight to it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while process_start(pid) == Some(started) {
        assert!(Instant::now() < deadline, "pid {pid} outlived SIGKILL");
        std::thread::sleep(Duration::from_millis(1));
    }
    let dead_at = micros_since_epoch();
    let summary = load.finish();
    let log = std::fs::read_to_string(&log).expect("h2load's log");
    // `START_MICROS\tSTATUS\tDURATION_MICROS`, status -1 for no response.
    let requests: Vec<(u64, i32)> = log
        .lines()
        .filter_map(|line| {
            let mut fields = line.split('\t');
            Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
        })
        .collect();
    let (total, done, ok) = (
        summary_count(&summary, "requests:", "total"),
        summary_count(&summary, "requests:", "done"),
        summary_count(&summary, "status codes:", "2xx"),
    );
    let served = |status: &i32| (200..300).contains(status);
    // Each request that got no 2xx, by when it was sent (ms from death).
    let failures: Vec<String> = requests
        .iter()
        .filter(|(_, status)| !served(status))
        .map(|(start, status)| {
            format!(
                "{status} at {:+.1} ms",
                (i128::from(*start) - i128::from(dead_at)) as f64 / 1000.0
            )
        })
        .collect();
    let context = format!("{summary}\nnot 2xx, by when sent from the death: {failures:?}");
    assert_eq!((total, done), (LOAD_REQUESTS, LOAD_REQUESTS), "{context}");
    assert_eq!(requests.len() as u64, LOAD_REQUESTS, "{context}");
    // Only requests in flight when it died may be lost: sent before, and
    // at most one per connection (the gate retries GETs elsewhere, so
    // usually none are).
    assert!(
        total - ok <= LOAD_CONNECTIONS,
        "{} of {total} requests lost:\n{context}",
        total - ok
    );
    assert!(
        requests
            .iter()
            .all(|(start, status)| *start < dead_at || served(status)),
        "a request sent after the backend died was lost:\n{context}"
    );
    // The kill came mid-load, and the load went on being served after it.
    let served_after = requests
        .iter()
        .filter(|(start, status)| *start > dead_at && served(status))
        .count() as u64;
    assert!(
        served_after >= LOAD_REQUESTS / 2,
        "only {served_after} requests were sent after the death and served:\n{context}"
    );

    // The agent restarts the killed instance in place (a new process,
    // its restarts counted), and the gate sends it requests again.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let detail = describe_instance(dir.path(), &api, &victim);
        let restarted = detail["status"]["pid"]
            .as_u64()
            .is_some_and(|new| new != u64::from(pid))
            && detail["status"]["state"] == "running"
            && detail["summary"]["restarts"].as_u64() >= Some(1);
        if restarted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{victim} never restarted:\n{detail:#}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while answering_instance(&resolve, &url) != victim {
        assert!(
            Instant::now() < deadline,
            "the gate never served {victim} again"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(dev);
}

/// The instance that answered one request through the gate.
fn answering_instance(resolve: &str, url: &str) -> String {
    let body = curl(&["--resolve", resolve, url]);
    body.lines()
        .find_map(|line| line.strip_prefix("instance: "))
        .unwrap_or_else(|| panic!("no instance line in:\n{body}"))
        .to_owned()
}

/// `cca describe instance ID -o json`.
fn describe_instance(dir: &std::path::Path, api: &str, id: &str) -> serde_json::Value {
    cca_json(dir, api, &["describe", "instance", id])
}

/// `cca ARGS -o json` against the dev cluster in `dir`.
fn cca_json(dir: &std::path::Path, api: &str, args: &[&str]) -> serde_json::Value {
    let output = Command::new(support::CCA)
        .args(args)
        .args(["-o", "json"])
        .current_dir(dir)
        .env("CCA_SERVER", api)
        .env("CCA_CONFIG_DIR", dir.join("data/trust"))
        .output()
        .expect("cca runs");
    assert!(output.status.success(), "{}", support::text(&output));
    serde_json::from_slice(&output.stdout).expect("JSON")
}

/// The pid and start time of instance `id`'s process: the pid its agent
/// reports (`cca describe instance`), checked against the process itself
/// — its environment names the instance (`CCA_INSTANCE`), so a stale
/// report or a reused pid is never taken for it. The service's `exec`
/// makes the runtime's process `cca whoami` itself, not a shell above it.
fn instance_process(dir: &std::path::Path, api: &str, id: &str) -> (u32, u64) {
    let detail = describe_instance(dir, api, id);
    let pid = detail["status"]["pid"]
        .as_u64()
        .and_then(|pid| u32::try_from(pid).ok())
        .unwrap_or_else(|| panic!("no pid reported for {id}:\n{detail:#}"));
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("the process's environment");
    let wanted = format!("CCA_INSTANCE={id}");
    assert!(
        environ
            .split(|&b| b == 0)
            .any(|var| var == wanted.as_bytes()),
        "pid {pid} is not {id}'s process"
    );
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("the process's command");
    assert!(
        cmdline.split(|&b| b == 0).any(|arg| arg == b"whoami"),
        "pid {pid} is not `cca whoami`: {}",
        String::from_utf8_lossy(&cmdline)
    );
    let started = process_start(pid).unwrap_or_else(|| panic!("pid {pid} is gone"));
    (pid, started)
}

/// A count in h2load's summary: `N WHAT` in the line starting with
/// `line` (`requests: 100 total, 100 started, 100 done, …`).
fn summary_count(summary: &str, line: &str, what: &str) -> u64 {
    summary
        .lines()
        .find_map(|l| l.trim().strip_prefix(line))
        .and_then(|counts| {
            counts.split(',').find_map(|part| {
                let (n, name) = part.trim().split_once(' ')?;
                (name == what).then(|| n.parse().ok()).flatten()
            })
        })
        .unwrap_or_else(|| panic!("no {line} {what} in h2load's summary:\n{summary}"))
}

/// When process `pid` started (field 22 of `/proc/PID/stat`, with the
/// pid naming one process), or `None` once it is a zombie or gone.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name in parentheses: state (field 3), then on.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Microseconds since the Unix epoch: the clock of h2load's log.
fn micros_since_epoch() -> u64 {
    cca_model::clock::system_now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        })
}

/// h2load (HTTP/1.1, [`LOAD_CONNECTIONS`] connections with one request
/// in flight each, [`LOAD_REQUESTS`] GETs at [`LOAD_RATE`] a second per
/// connection) against the gate, its stdout
/// read line by line; killed when dropped, pass or fail.
struct Load {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    shown: String,
}

impl Load {
    fn start(port: u16, log: &std::path::Path) -> Self {
        let mut child = Command::new("h2load")
            .arg("--h1")
            .args(["-c", &LOAD_CONNECTIONS.to_string(), "-m", "1", "-t", "1"])
            .args(["-n", &LOAD_REQUESTS.to_string()])
            .args(["--rps", &LOAD_RATE.to_string()])
            // `:authority` replaces h2load's Host header (a `host:` would
            // be sent beside it).
            .args(["-H", ":authority: load.localhost"])
            .arg("--log-file")
            .arg(log)
            .arg(format!("http://127.0.0.1:{port}/"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("h2load runs (scripts/test installs nghttp2-client)");
        let stdout = child.stdout.take().expect("stdout piped");
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            lines,
            shown: String::new(),
        }
    }

    /// Reads h2load's output until `wanted` (within four minutes).
    fn wait_for_line(&mut self, wanted: &str) {
        let deadline = Instant::now() + Duration::from_secs(240);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let Ok(line) = self.lines.recv_timeout(left) else {
                break;
            };
            self.shown.push_str(&line);
            self.shown.push('\n');
            if line.trim() == wanted {
                return;
            }
        }
        panic!("h2load never printed {wanted:?}:\n{}", self.shown);
    }

    /// Everything h2load printed, once it has ended (within four minutes).
    fn finish(mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.shown.push_str(&line);
                    self.shown.push('\n');
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    panic!("h2load did not end:\n{}", self.shown)
                }
            }
        }
        let status = self.child.wait().expect("h2load ends");
        assert!(status.success(), "h2load: {status}\n{}", self.shown);
        std::mem::take(&mut self.shown)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
