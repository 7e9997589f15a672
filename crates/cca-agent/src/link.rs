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
/// overlap; whichever arrives renews the lease.
async fn keep_alive(
    client: &Client,
    lease: &Lease<'_>,
    connected: &watch::Sender<bool>,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let Lease { node, reply, .. } = *lease;
    let ttl = Duration::from_secs(reply.ttl_secs.max(1));
    let mut retry = Retry::between(HEARTBEAT_RETRY_FIRST, ttl / 3);
    // Possibly already past (a slow registration): the first heartbeat
    // then goes at once.
    let mut next = lease.granted_after + heartbeat_period(ttl, fastrand::f64());
    let mut in_flight = FuturesUnordered::new();
    loop {
        tokio::select! {
            _ = stop.wait_for(|stop| *stop) => return false,
            () = tokio::time::sleep_until(next), if in_flight.len() < HEARTBEATS_IN_FLIGHT => {
                in_flight.push(client.heartbeat(node, reply.lease_id));
                next = Instant::now() + heartbeat_period(ttl, fastrand::f64());
            }
            Some(answer) = in_flight.next() => match answer {
                Ok(_) => {
                    let _ = connected.send(true);
                    retry.reset();
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

/// The API no longer knows the lease (409) or the node (404).
fn lease_gone(error: &ClientError) -> bool {
    matches!(error.status(), Some(409 | 404))
}

/// The wait before the next heartbeat: a third of the lease's TTL, times
/// 0.8 + 0.2 × `draw` (uniform in [0, 1)). Two missed heartbeats still
/// leave the lease alive; drawing each period afresh spreads the renewals
/// of nodes that registered in the same instant over a fifth of a period.
fn heartbeat_period(ttl: Duration, draw: f64) -> Duration {
    (ttl / 3).mul_f64(0.8 + 0.2 * draw.clamp(0.0, 1.0))
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

    #[test]
    fn heartbeats_come_every_0_8_to_1_0_of_a_third_of_the_ttl() {
        let ttl = Duration::from_secs(15);
        assert_eq!(heartbeat_period(ttl, 0.0), Duration::from_secs(4));
        assert_eq!(heartbeat_period(ttl, 0.5), Duration::from_millis(4500));
        assert_eq!(heartbeat_period(ttl, 1.0), Duration::from_secs(5));
        assert_eq!(heartbeat_period(ttl, 7.0), Duration::from_secs(5));
    }

    /// An API whose registration answers `register_delay` late, with a
    /// `ttl_secs` lease; sends the time of each heartbeat's arrival,
    /// counted from the registration's arrival.
    async fn slow_registrar(
        register_delay: Duration,
        ttl_secs: u64,
    ) -> (String, tokio::sync::mpsc::UnboundedReceiver<Duration>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let (heartbeats, heard) = tokio::sync::mpsc::unbounded_channel();
        let registered_at = Arc::new(std::sync::Mutex::new(None::<Instant>));
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let heartbeats = heartbeats.clone();
                let registered_at = Arc::clone(&registered_at);
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 8192];
                    loop {
                        let Ok(read) = socket.read(&mut buffer).await else {
                            return;
                        };
                        if read == 0 {
                            return;
                        }
                        let head = String::from_utf8_lossy(&buffer[..read]).into_owned();
                        let body = if head.starts_with("POST /v1/agent/register") {
                            *registered_at.lock().expect("lock") = Some(Instant::now());
                            tokio::time::sleep(register_delay).await;
                            format!(
                                r#"{{"node":"n1","lease_id":7,"ttl_secs":{ttl_secs},"revision":1}}"#
                            )
                        } else {
                            let since = registered_at.lock().expect("lock").map(|at| at.elapsed());
                            if let Some(since) = since {
                                let _ = heartbeats.send(since);
                            }
                            format!(r#"{{"ttl_secs":{ttl_secs}}}"#)
                        };
                        let response = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if socket.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, heard)
    }

    /// A registration answered later than a heartbeat period: the first
    /// heartbeat goes as soon as the answer is in, not a period after it
    /// (by when a lease granted as the registration arrived may be gone).
    #[tokio::test]
    async fn heartbeats_count_from_when_the_registration_was_sent() {
        let (url, mut heard) = slow_registrar(Duration::from_millis(1500), 3).await;
        let request = RegisterRequest {
            name: "n1".into(),
            cpu: cca_model::spec::Cpu(1000),
            memory: cca_model::spec::Memory(1 << 30),
            arch: "x86_64".into(),
            zone: None,
            labels: Default::default(),
            addresses: Vec::new(),
            agent_url: None,
            gate: Default::default(),
        };
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
