//! The sockets around [`answer`](crate::answer::answer): UDP and TCP
//! listeners on each configured address, a few UDP loops per socket
//! (receive, answer from the current map, send), one task per TCP
//! connection, one task per forward. Every queue is bounded: the kernel's
//! socket buffer in front of the UDP loops, [`DnsConfig::max_tcp_connections`]
//! connections, [`DnsConfig::max_forwards`] forwards in flight (SERVFAIL
//! past that), one query at a time per connection.
//!
//! The UDP loops are OS threads on blocking sockets, not tasks: measured
//! with dnsperf, two tokio tasks receiving on one socket answered no more
//! than one (each readiness event woke both), while two threads on a
//! blocking socket double a single one's rate. They hand forwards to the
//! owner's runtime; TCP, forwards and shutdown are async.
//!
//! The map is a `watch` channel of `Arc<NetworkMap>`: a swap replaces the
//! whole snapshot, so a query sees the map before or after an update and
//! never half of one; each loop checks the channel's version (one atomic
//! load) before each query and takes the new snapshot when it moved.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use cca_model::net::{DNS_PORT, NetworkMap};
use hickory_proto::op::ResponseCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::answer::{Action, Transport, answer, error_reply};
use crate::metrics::Metrics;
use crate::upstream::{Forwarder, Upstreams};

/// The biggest query read over UDP; longer datagrams arrive cut and are
/// answered FORMERR.
const UDP_QUERY_BUFFER: usize = 4096;
/// How long a UDP loop waits in `recv` before looking at the stop flag:
/// the longest a shutdown waits for the loops.
const UDP_STOP_POLL: Duration = Duration::from_millis(100);
/// The longest a UDP send may block (a full socket buffer): past that the
/// reply is dropped and counted, as the kernel would drop it.
const UDP_SEND_TIMEOUT: Duration = Duration::from_millis(100);

/// How a [`DnsServer`] listens and forwards.
#[derive(Clone, Debug)]
pub struct DnsConfig {
    /// UDP and TCP on each (port 0: one free port, the same for both).
    pub listen: Vec<SocketAddr>,
    /// Where names outside the zone go.
    pub upstreams: Upstreams,
    /// Addresses whose port 53 reaches this server through NAT: never used
    /// as upstreams (its own listen addresses never are).
    pub also_self: Vec<IpAddr>,
    /// How long one upstream has to answer before the next is tried.
    pub forward_timeout: Duration,
    /// Forwards in flight at most; past that, SERVFAIL at once.
    pub max_forwards: usize,
    /// TCP connections at most; past that, new ones wait in the backlog.
    pub max_tcp_connections: usize,
    /// A TCP connection with no query for this long is closed.
    pub tcp_idle_timeout: Duration,
    /// Threads receiving on each UDP socket (one sends while another
    /// receives; more than the cores buys nothing).
    pub udp_workers: usize,
}

impl DnsConfig {
    /// Listening on `listen`, forwarding to `/etc/resolv.conf`'s resolvers.
    pub fn new(listen: Vec<SocketAddr>) -> DnsConfig {
        DnsConfig {
            listen,
            upstreams: Upstreams::default(),
            also_self: Vec::new(),
            forward_timeout: Duration::from_secs(2),
            max_forwards: 256,
            max_tcp_connections: 128,
            tcp_idle_timeout: Duration::from_secs(10),
            udp_workers: std::thread::available_parallelism().map_or(2, |cores| cores.get().min(4)),
        }
    }
}

impl Default for DnsConfig {
    /// Every address, port [`DNS_PORT`].
    fn default() -> DnsConfig {
        DnsConfig::new(vec![SocketAddr::from(([0, 0, 0, 0], DNS_PORT))])
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("no address to serve DNS on: give at least one listen address")]
    NoListen,
    #[error(
        "cannot serve DNS on {address} over {protocol}: {source} (another DNS server or cluster on this machine may hold it: give another listen address)"
    )]
    Bind {
        address: SocketAddr,
        protocol: &'static str,
        source: io::Error,
    },
    #[error(
        "cannot start the DNS server's UDP threads: {0} (the process is out of threads or file descriptors)"
    )]
    Threads(io::Error),
}

/// What the server's loops share.
#[derive(Debug)]
struct Shared {
    maps: watch::Sender<Arc<NetworkMap>>,
    metrics: Arc<Metrics>,
    forwarder: Forwarder,
    /// Set at shutdown: connection and forward tasks stop at once.
    stop: watch::Sender<bool>,
    /// Set at shutdown: the UDP threads stop within [`UDP_STOP_POLL`].
    stopping: AtomicBool,
}

/// The owner's side of a running server: swap the map, read the counters.
#[derive(Clone, Debug)]
pub struct DnsHandle {
    shared: Arc<Shared>,
}

impl DnsHandle {
    /// Answers from `map` from the next query on. Cheap: the map's tables
    /// are persistent, so the owner clones its own map into the `Arc`.
    pub fn set_map(&self, map: Arc<NetworkMap>) {
        self.shared.maps.send_replace(map);
    }

    /// The map answers come from now.
    pub fn map(&self) -> Arc<NetworkMap> {
        self.shared.maps.borrow().clone()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }
}

/// A bound DNS server; [`DnsServer::run`] serves until shutdown.
#[derive(Debug)]
pub struct DnsServer {
    udp: Vec<Arc<UdpSocket>>,
    tcp: Vec<TcpListener>,
    config: DnsConfig,
    shared: Arc<Shared>,
}

impl DnsServer {
    /// Binds UDP and TCP on every listen address, answering from `map`
    /// until the owner sets another.
    pub async fn bind(config: DnsConfig, map: Arc<NetworkMap>) -> Result<DnsServer, DnsError> {
        if config.listen.is_empty() {
            return Err(DnsError::NoListen);
        }
        let mut udp = Vec::new();
        let mut tcp = Vec::new();
        for address in &config.listen {
            let (socket, listener) = bind_pair(*address).await?;
            udp.push(Arc::new(socket));
            tcp.push(listener);
        }
        let listen: Vec<SocketAddr> = udp
            .iter()
            .filter_map(|socket| socket.local_addr().ok())
            .collect();
        let forwarder = Forwarder::new(
            config.upstreams.clone(),
            listen,
            config.also_self.clone(),
            config.forward_timeout,
            config.max_forwards,
        );
        let shared = Arc::new(Shared {
            maps: watch::Sender::new(map),
            metrics: Arc::default(),
            forwarder,
            stop: watch::Sender::new(false),
            stopping: AtomicBool::new(false),
        });
        Ok(DnsServer {
            udp,
            tcp,
            config,
            shared,
        })
    }

    /// The addresses served (UDP and TCP alike), with the ports bound.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.udp
            .iter()
            .filter_map(|socket| socket.local_addr().ok())
            .collect()
    }

    pub fn handle(&self) -> DnsHandle {
        DnsHandle {
            shared: self.shared.clone(),
        }
    }

    /// Serves until `shutdown` completes, then stops every loop,
    /// connection and forward and closes the sockets. Must be called
    /// within a tokio runtime (forwards and TCP run on it).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), DnsError> {
        let runtime = Handle::current();
        let mut threads = Vec::new();
        for (index, socket) in self.udp.iter().enumerate() {
            for worker in 0..self.config.udp_workers.max(1) {
                let (socket, shared, runtime) =
                    (socket.clone(), self.shared.clone(), runtime.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("cca-dns-udp{index}.{worker}"))
                    .spawn(move || udp_loop(&socket, &shared, &runtime));
                match spawned {
                    Ok(thread) => threads.push(thread),
                    Err(error) => {
                        stop_udp(&self.shared, threads).await;
                        return Err(DnsError::Threads(error));
                    }
                }
            }
        }
        let mut tasks = JoinSet::new();
        let connections = Arc::new(Semaphore::new(self.config.max_tcp_connections.max(1)));
        for listener in self.tcp {
            tasks.spawn(accept_loop(
                listener,
                self.shared.clone(),
                connections.clone(),
                self.config.tcp_idle_timeout,
            ));
        }
        tracing::info!(listen = ?self.udp.iter().filter_map(|s| s.local_addr().ok()).collect::<Vec<_>>(), "cluster DNS serving");
        shutdown.await;
        self.shared.stop.send_replace(true);
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        stop_udp(&self.shared, threads).await;
        Ok(())
    }
}

/// Stops the UDP threads and waits for them (at most [`UDP_STOP_POLL`]).
async fn stop_udp(shared: &Shared, threads: Vec<JoinHandle<()>>) {
    shared.stopping.store(true, Ordering::Relaxed);
    let joined = tokio::task::spawn_blocking(move || {
        for thread in threads {
            if thread.join().is_err() {
                tracing::error!("a DNS UDP thread panicked");
            }
        }
    });
    let _ = joined.await;
}

/// UDP and TCP on `address`; for port 0, one free port both can take.
async fn bind_pair(address: SocketAddr) -> Result<(UdpSocket, TcpListener), DnsError> {
    let bind_error = |protocol, address, source| DnsError::Bind {
        address,
        protocol,
        source,
    };
    let tries = if address.port() == 0 { 16 } else { 1 };
    let mut last = None;
    for _ in 0..tries {
        let socket = UdpSocket::bind(address)
            .and_then(|socket| {
                socket.set_read_timeout(Some(UDP_STOP_POLL))?;
                socket.set_write_timeout(Some(UDP_SEND_TIMEOUT))?;
                Ok(socket)
            })
            .map_err(|error| bind_error("UDP", address, error))?;
        let bound = socket
            .local_addr()
            .map_err(|error| bind_error("UDP", address, error))?;
        match TcpListener::bind(bound).await {
            Ok(listener) => return Ok((socket, listener)),
            Err(error) => last = Some(bind_error("TCP", bound, error)),
        }
    }
    Err(last.unwrap_or(DnsError::NoListen))
}

/// Receive, answer, send: the hot path, on a thread of its own.
fn udp_loop(socket: &Arc<UdpSocket>, shared: &Arc<Shared>, runtime: &Handle) {
    let mut maps = shared.maps.subscribe();
    let mut map = maps.borrow_and_update().clone();
    let mut packet = vec![0u8; UDP_QUERY_BUFFER];
    let mut out = Vec::with_capacity(usize::from(crate::answer::MAX_UDP_PAYLOAD));
    let metrics = &shared.metrics;
    while !shared.stopping.load(Ordering::Relaxed) {
        let (len, peer) = match socket.recv_from(&mut packet) {
            Ok(received) => received,
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(error) => {
                Metrics::count(&metrics.errors);
                tracing::debug!(%error, "DNS receive failed");
                // An error that repeats must not spin the loop.
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
        };
        if maps.has_changed().unwrap_or(false) {
            map = maps.borrow_and_update().clone();
        }
        let query = &packet[..len];
        match answer(query, &map, Transport::Udp, &mut out) {
            Action::Reply { rcode } => {
                Metrics::count(&metrics.queries);
                count_reply(metrics, rcode);
                if socket.send_to(&out, peer).is_err() {
                    Metrics::count(&metrics.errors);
                }
            }
            Action::Forward => {
                Metrics::count(&metrics.queries);
                forward_udp(socket, shared, runtime, query, peer, &mut out);
            }
            Action::Drop => {}
        }
    }
}

fn count_reply(metrics: &Metrics, rcode: ResponseCode) {
    match rcode {
        ResponseCode::NoError => {}
        ResponseCode::NXDomain => Metrics::count(&metrics.nxdomain),
        _ => Metrics::count(&metrics.errors),
    }
}

/// Hands a UDP query to a forward task, or answers SERVFAIL at once when
/// the forwards in flight are at their bound.
fn forward_udp(
    socket: &Arc<UdpSocket>,
    shared: &Arc<Shared>,
    runtime: &Handle,
    query: &[u8],
    peer: SocketAddr,
    out: &mut Vec<u8>,
) {
    let Some(permit) = shared.forwarder.permit() else {
        Metrics::count(&shared.metrics.errors);
        if error_reply(query, ResponseCode::ServFail, out) {
            let _ = socket.send_to(out, peer);
        }
        return;
    };
    Metrics::count(&shared.metrics.forwarded);
    let (socket, shared, query) = (socket.clone(), shared.clone(), query.to_vec());
    let mut stop = shared.stop.subscribe();
    runtime.spawn(async move {
        let _permit = permit;
        tokio::select! {
            () = stopped(&mut stop) => {}
            reply = forwarded(&shared, &query, Transport::Udp) => {
                // A UDP send does not wait unless the socket's buffer is
                // full, and then at most UDP_SEND_TIMEOUT.
                if let Some(reply) = reply
                    && socket.send_to(&reply, peer).is_err()
                {
                    Metrics::count(&shared.metrics.errors);
                }
            }
        }
    });
}

/// The upstream's answer to `query`, or SERVFAIL when none came.
async fn forwarded(shared: &Shared, query: &[u8], transport: Transport) -> Option<Vec<u8>> {
    if let Some(reply) = shared.forwarder.forward(query, transport).await {
        return Some(reply);
    }
    Metrics::count(&shared.metrics.errors);
    let mut out = Vec::new();
    error_reply(query, ResponseCode::ServFail, &mut out).then_some(out)
}

/// Completes once the server stops.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // An error means the server is gone, which is a stop as well.
    let _ = stop.wait_for(|stopped| *stopped).await;
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    connections: Arc<Semaphore>,
    idle: Duration,
) {
    loop {
        // Waiting for a slot before accepting leaves extra connections in
        // the kernel's backlog rather than in our memory.
        let Ok(permit) = connections.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::debug!(%error, "DNS accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let shared = shared.clone();
        let mut stop = shared.stop.subscribe();
        tokio::spawn(async move {
            let _permit = permit;
            tokio::select! {
                () = stopped(&mut stop) => {}
                _ = tcp_connection(stream, &shared, idle) => {}
            }
        });
    }
}

/// Length-prefixed queries, answered in order until the client closes,
/// idles for `idle`, or sends something that is not a query.
async fn tcp_connection(mut stream: TcpStream, shared: &Shared, idle: Duration) {
    let metrics = &shared.metrics;
    let mut query = Vec::new();
    let mut out = Vec::new();
    loop {
        let read = async {
            let len = stream.read_u16().await?;
            query.resize(usize::from(len), 0);
            stream.read_exact(&mut query).await?;
            Ok::<_, io::Error>(())
        };
        match tokio::time::timeout(idle, read).await {
            Ok(Ok(())) => {}
            _ => return,
        }
        let map = shared.maps.borrow().clone();
        let reply = match answer(&query, &map, Transport::Tcp, &mut out) {
            Action::Reply { rcode } => {
                Metrics::count(&metrics.queries);
                count_reply(metrics, rcode);
                std::mem::take(&mut out)
            }
            Action::Forward => {
                Metrics::count(&metrics.queries);
                let reply = match shared.forwarder.permit() {
                    Some(_permit) => {
                        Metrics::count(&metrics.forwarded);
                        forwarded(shared, &query, Transport::Tcp).await
                    }
                    None => {
                        Metrics::count(&metrics.errors);
                        error_reply(&query, ResponseCode::ServFail, &mut out)
                            .then(|| std::mem::take(&mut out))
                    }
                };
                let Some(reply) = reply else { return };
                reply
            }
            Action::Drop => return,
        };
        let Ok(len) = u16::try_from(reply.len()) else {
            return;
        };
        let mut framed = Vec::with_capacity(reply.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(&reply);
        if tokio::time::timeout(idle, stream.write_all(&framed))
            .await
            .map_or(true, |written| written.is_err())
        {
            return;
        }
        out = reply;
    }
}
