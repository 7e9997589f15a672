//! The agent's link to the control plane, through the API only: register
//! the node and keep its heartbeat lease alive (registering again when the
//! lease is gone), and follow the node's assignment stream into the cached
//! [`Desired`] state. Every loop retries with [`Retry`] while the API is
//! unreachable or sheds it (never sooner than its `Retry-After`); the
//! supervisor keeps working from the cache meanwhile. Heartbeats are sent
//! every 0.8–1.0 × a third of the TTL, drawn afresh each time, so nodes
//! that registered together drift apart instead of renewing in lock-step,
//! without waiting for the previous one's answer (a few may overlap); a
//! failed one is retried within a second or so (backing off to a period),
//! because its lease's deadline is coming.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cca_model::LeaseId;
use cca_model::node_lease::heartbeat_period;
use cca_wire::types::{AssignmentLine, RegisterReply, RegisterRequest, Resume};
use cca_wire::{Client, ClientError, ClientResult, LineStream};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::desired::{Applied, Desired};
use crate::retry::Retry;

/// The first retry of a failed heartbeat waits 0.25–0.5 s.
const HEARTBEAT_RETRY_FIRST: Duration = Duration::from_millis(500);

/// Registers the node and keeps its lease alive until `stop`.
pub(crate) async fn keep_registered(
    client: Client,
    request: RegisterRequest,
    connected: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut retry = Retry::new();
    loop {
        let sent = Instant::now();
        let registration = tokio::select! {
            registration = client.register(&request) => registration,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        let reply = match registration {
            Ok(reply) => reply,
            Err(error) => {
                tracing::warn!(%error, "registering the node failed; retrying");
                let _ = connected.send(false);
                let wait = retry.next_delay(error.retry_after(), fastrand::f64());
                if pause(wait, &mut stop).await {
                    return;
                }
                continue;
            }
        };
        retry.reset();
        let _ = connected.send(true);
        tracing::info!(node = %request.name, lease = reply.lease_id, "registered");
        let lease = Lease {
            node: &request.name,
            reply: &reply,
            granted_after: sent,
        };
        if !keep_alive(&client, &lease, &connected, &mut stop).await {
            return;
        }
    }
}

/// Heartbeats sent but not yet answered, at most.
const HEARTBEATS_IN_FLIGHT: usize = 3;

/// A registered node's lease.
struct Lease<'a> {
    node: &'a str,
    reply: &'a RegisterReply,
    /// When the registration was sent: the lease's TTL runs from some
    /// moment after this, so heartbeats counted from here are never late,
    /// however long the registration's answer took to come back.
    granted_after: Instant,
}

/// Heartbeats the lease of `reply` until it is gone (true: register
/// again) or `stop` (false). Heartbeats go out on their own schedule, not
/// one answer after another: with a server slow to answer (a busy control
/// plane), waiting for each answer before the next period added the
/// answer's delay to every gap between renewals, and a 6 s lease ran out
/// behind answers that each took 3 s. Up to [`HEARTBEATS_IN_FLIGHT`] may
/// overlap; whichever arrives renews the lease. An answer may move the
/// node to another lease (the fleet's size changed its TTL): heartbeats
/// renew that one from then on, and answers about the old one, sent
/// before the move, no longer count.
async fn keep_alive(
    client: &Client,
    lease: &Lease<'_>,
    connected: &watch::Sender<bool>,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let node = lease.node;
    let mut held = Held::new(lease.reply.lease_id, lease.reply.ttl_secs);
    let mut retry = Retry::between(HEARTBEAT_RETRY_FIRST, held.retry_cap());
    // Possibly already past (a slow registration): the first heartbeat
    // then goes at once.
    let mut next = lease.granted_after + held.period();
    let mut in_flight = FuturesUnordered::new();
    loop {
        tokio::select! {
            _ = stop.wait_for(|stop| *stop) => return false,
            () = tokio::time::sleep_until(next), if in_flight.len() < HEARTBEATS_IN_FLIGHT => {
                let id = held.id;
                in_flight.push(async move { (id, client.heartbeat(node, id).await) });
                next = Instant::now() + held.period();
            }
            Some((sent_for, answer)) = in_flight.next() => match answer {
                _ if sent_for != held.id => {}
                Ok(reply) => {
                    let _ = connected.send(true);
                    retry.reset();
                    if let Some(moved) = reply.lease_id.filter(|moved| *moved != held.id) {
                        held = Held::new(moved, reply.ttl_secs);
                        retry = Retry::between(HEARTBEAT_RETRY_FIRST, held.retry_cap());
                        next = Instant::now() + held.period();
                        tracing::info!(node, lease = moved, ttl_secs = reply.ttl_secs, "the node's heartbeat moved to another lease");
                    }
                }
                Err(error) if lease_gone(&error) => {
                    tracing::warn!(%error, "the node's lease is gone; registering again");
                    return true;
                }
                Err(error) => {
                    let _ = connected.send(false);
                    let wait = retry.next_delay(error.retry_after(), fastrand::f64());
                    next = Instant::now() + wait;
                    tracing::warn!(%error, retry_in = ?wait, "heartbeat failed");
                }
            },
        }
    }
}

/// The lease a node renews now.
struct Held {
    id: LeaseId,
    ttl: Duration,
}

impl Held {
    fn new(id: LeaseId, ttl_secs: u64) -> Self {
        Self {
            id,
            ttl: Duration::from_secs(ttl_secs.max(1)),
        }
    }

    fn period(&self) -> Duration {
        heartbeat_period(self.ttl, fastrand::f64())
    }

    /// A failed heartbeat is retried within a third of the TTL at most.
    fn retry_cap(&self) -> Duration {
        self.ttl / 3
    }
}

/// The API no longer knows the lease (409) or the node (404).
fn lease_gone(error: &ClientError) -> bool {
    matches!(error.status(), Some(409 | 404))
}

/// Sleeps `wait`; true when `stop` came first.
async fn pause(wait: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(wait) => false,
        _ = stop.wait_for(|stop| *stop) => true,
    }
}

/// Follows the node's assignments into `desired`, caching each change on
/// disk under `dir`, until `stop`.
pub(crate) async fn follow_assignments(
    client: Client,
    node: String,
    dir: PathBuf,
    desired: watch::Sender<Arc<Desired>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut retry = Retry::new();
    let mut resume = Resume::SNAPSHOT;
    loop {
        let stream = tokio::select! {
            stream = client.assignments(&node, &resume) => stream,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        let mut stream = match stream {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(%error, "assignment stream unavailable; retrying");
                let wait = retry.next_delay(error.retry_after(), fastrand::f64());
                if pause(wait, &mut stop).await {
                    return;
                }
                continue;
            }
        };
        loop {
            let line = tokio::select! {
                line = stream.next() => line,
                _ = stop.wait_for(|stop| *stop) => return,
            };
            let mut next = Desired::clone(&desired.borrow());
            let (changed, burst) = apply_burst(line, &mut stream, &mut next).await;
            if changed {
                retry.reset();
                let next = save(next, &dir).await;
                resume = next.resume();
                desired.send_replace(Arc::new(next));
            }
            match burst {
                Burst::Continues => {}
                Burst::Reconnect => break,
                Burst::Resnapshot => {
                    resume = Resume::SNAPSHOT;
                    break;
                }
            }
        }
        if pause(retry.next_delay(None, fastrand::f64()), &mut stop).await {
            return;
        }
    }
}

/// How the lines read at once ended.
enum Burst {
    /// The stream goes on.
    Continues,
    /// The stream broke or ended: resume it.
    Reconnect,
    /// The server can no longer resume it: start from a snapshot.
    Resnapshot,
}

/// A burst goes on while lines follow each other this closely…
const BURST_GAP: Duration = Duration::from_millis(5);
/// …for at most this long.
const BURST_MAX: Duration = Duration::from_millis(50);

/// Applies `first` and the lines that follow it closely to `next`, so
/// the cache is written once per burst: a deploy sends a node its
/// assignments one line each, and writing the whole cache per line was
/// quadratic in the node's assignments (a quarter of the CPU of a
/// 100,000-instance deploy). Costs a change at most [`BURST_MAX`]. True
/// when `next` changed.
async fn apply_burst(
    first: Option<ClientResult<AssignmentLine>>,
    stream: &mut LineStream<AssignmentLine>,
    next: &mut Desired,
) -> (bool, Burst) {
    let deadline = tokio::time::Instant::now() + BURST_MAX;
    let mut changed = false;
    let mut line = first;
    loop {
        match line {
            Some(Ok(assignment)) => match next.apply(assignment, cca_model::clock::now_millis()) {
                Applied::Resnapshot => return (changed, Burst::Resnapshot),
                Applied::Changed => changed = true,
            },
            Some(Err(error)) => {
                tracing::warn!(%error, "assignment stream broke; reconnecting");
                return (changed, Burst::Reconnect);
            }
            None => return (changed, Burst::Reconnect),
        }
        line = match stream.next_buffered() {
            Some(buffered) => Some(buffered),
            None => {
                let wait = BURST_GAP.min(deadline - tokio::time::Instant::now().min(deadline));
                match tokio::time::timeout(wait, stream.next()).await {
                    Ok(arrived) => arrived,
                    Err(_) => return (changed, Burst::Continues),
                }
            }
        };
    }
}

/// Writes the cache off the async workers (it is a file write and an
/// fsync); returns the state for the caller to publish.
async fn save(next: Desired, dir: &std::path::Path) -> Desired {
    let dir = dir.to_path_buf();
    let published = next.clone();
    let saved = tokio::task::spawn_blocking(move || next.save(&dir)).await;
    match saved {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::error!(%error, "caching the desired state failed"),
        Err(error) => tracing::error!(%error, "caching the desired state did not finish"),
    }
    published
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the fake API answers a request (its head and body as read):
    /// after how long, with which status and JSON body.
    type Answer = (Duration, u16, String);

    /// An HTTP/1.1 API on loopback answering every request with `answer`.
    async fn fake_api(answer: impl Fn(&str) -> Answer + Send + Sync + 'static) -> String {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let answer = Arc::new(answer);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let answer = Arc::clone(&answer);
                tokio::spawn(async move {
                    let mut pending = Vec::new();
                    loop {
                        let Some(request) = read_request(&mut socket, &mut pending).await else {
                            return;
                        };
                        let (delay, status, body) = answer(&request);
                        tokio::time::sleep(delay).await;
                        let response = format!(
                            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if socket.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        url
    }

    /// One whole request (head and `content-length` body) off `socket`;
    /// `None` once it closes.
    async fn read_request(
        socket: &mut tokio::net::TcpStream,
        pending: &mut Vec<u8>,
    ) -> Option<String> {
        use tokio::io::AsyncReadExt;
        let mut buffer = [0u8; 8192];
        loop {
            if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&pending[..end]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length:"))
                    .and_then(|value| value.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                let total = end + 4 + length;
                if pending.len() >= total {
                    let request = String::from_utf8_lossy(&pending[..total]).into_owned();
                    pending.drain(..total);
                    return Some(request);
                }
            }
            match socket.read(&mut buffer).await {
                Ok(0) | Err(_) => return None,
                Ok(read) => pending.extend_from_slice(&buffer[..read]),
            }
        }
    }

    fn registration(lease: LeaseId, ttl_secs: u64) -> String {
        format!(r#"{{"node":"n1","lease_id":{lease},"ttl_secs":{ttl_secs},"revision":1}}"#)
    }

    fn register_request() -> RegisterRequest {
        RegisterRequest {
            name: "n1".into(),
            cpu: cca_model::spec::Cpu(1000),
            memory: cca_model::spec::Memory(1 << 30),
            arch: "x86_64".into(),
            zone: None,
            labels: Default::default(),
            addresses: Vec::new(),
            agent_url: None,
            gate: Default::default(),
        }
    }

    /// An API whose registration answers `register_delay` late, with a
    /// `ttl_secs` lease; sends the time of each heartbeat's arrival,
    /// counted from the registration's arrival.
    async fn slow_registrar(
        register_delay: Duration,
        ttl_secs: u64,
    ) -> (String, tokio::sync::mpsc::UnboundedReceiver<Duration>) {
        let (heartbeats, heard) = tokio::sync::mpsc::unbounded_channel();
        let registered_at = std::sync::Mutex::new(None::<Instant>);
        let url = fake_api(move |request| {
            if request.starts_with("POST /v1/agent/register") {
                *registered_at.lock().expect("lock") = Some(Instant::now());
                return (register_delay, 200, registration(7, ttl_secs));
            }
            let since = registered_at.lock().expect("lock").map(|at| at.elapsed());
            if let Some(since) = since {
                let _ = heartbeats.send(since);
            }
            (Duration::ZERO, 200, format!(r#"{{"ttl_secs":{ttl_secs}}}"#))
        })
        .await;
        (url, heard)
    }

    /// A registration answered later than a heartbeat period: the first
    /// heartbeat goes as soon as the answer is in, not a period after it
    /// (by when a lease granted as the registration arrived may be gone).
    #[tokio::test]
    async fn heartbeats_count_from_when_the_registration_was_sent() {
        let (url, mut heard) = slow_registrar(Duration::from_millis(1500), 3).await;
        let request = register_request();
        let (connected, _) = watch::channel(false);
        let (stop, stopped) = watch::channel(false);
        let agent = tokio::spawn(keep_registered(
            Client::new(&url),
            request,
            connected,
            stopped,
        ));
        let first = tokio::time::timeout(Duration::from_secs(10), heard.recv())
            .await
            .expect("a heartbeat within 10 s")
            .expect("a heartbeat");
        stop.send_replace(true);
        let _ = agent.await;
        // The period is 0.8–1.0 s: counted from the answer, the first
        // heartbeat would come 2.3 s or more after the registration.
        assert!(
            first < Duration::from_millis(2000),
            "first heartbeat {first:?} after the registration"
        );
    }

    /// The API moves the node to a longer lease in its answer to a slow
    /// heartbeat, while another heartbeat of the old lease is on its way
    /// (then refused: the old lease is revoked). The agent renews the new
    /// lease from then on and does not register again.
    #[tokio::test]
    async fn a_heartbeat_answer_moves_the_node_to_another_lease() {
        let (heard, mut heartbeats) = tokio::sync::mpsc::unbounded_channel();
        let moved = std::sync::atomic::AtomicBool::new(false);
        let url = fake_api(move |request| {
            if request.starts_with("POST /v1/agent/register") {
                let _ = heard.send("register".to_owned());
                return (Duration::ZERO, 200, registration(7, 3));
            }
            let old = request.contains(r#""lease_id":7"#);
            let _ = heard.send(if old { "7" } else { "8" }.to_owned());
            if !old {
                return (Duration::ZERO, 200, r#"{"ttl_secs":6}"#.to_owned());
            }
            if moved.swap(true, std::sync::atomic::Ordering::SeqCst) {
                // Answered after the move's answer: the lease is revoked.
                return (
                    Duration::from_millis(1500),
                    409,
                    r#"{"error":"gone"}"#.to_owned(),
                );
            }
            // Slow enough that a second heartbeat goes out meanwhile.
            (
                Duration::from_millis(1200),
                200,
                r#"{"ttl_secs":6,"lease_id":8}"#.to_owned(),
            )
        })
        .await;
        let (connected, _) = watch::channel(false);
        let (stop, stopped) = watch::channel(false);
        let agent = tokio::spawn(keep_registered(
            Client::new(&url),
            register_request(),
            connected,
            stopped,
        ));
        let mut seen = Vec::new();
        while seen.iter().filter(|heard| *heard == "8").count() < 2 {
            let heard = tokio::time::timeout(Duration::from_secs(15), heartbeats.recv())
                .await
                .expect("heartbeats of the new lease within 15 s")
                .expect("the fake API runs");
            seen.push(heard);
        }
        stop.send_replace(true);
        let _ = agent.await;
        // Two heartbeats of lease 7 out before the move was answered (the
        // second refused afterwards), then only lease 8, and a single
        // registration: the refusal of the revoked lease did not count.
        assert_eq!(seen, ["register", "7", "7", "8", "8"], "{seen:?}");
    }

    #[test]
    fn only_a_conflict_or_an_unknown_node_means_register_again() {
        let api = |status| ClientError::Api {
            status,
            message: String::new(),
            problems: Vec::new(),
            retry_after: None,
        };
        assert!(lease_gone(&api(409)));
        assert!(lease_gone(&api(404)));
        assert!(!lease_gone(&api(429)));
        assert!(!lease_gone(&api(503)));
        let down = ClientError::Unreachable {
            url: "http://127.0.0.1:9".into(),
            reason: "refused".into(),
        };
        assert!(!lease_gone(&down));
    }
}
