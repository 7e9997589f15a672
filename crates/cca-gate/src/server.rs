//! The gate's listeners: accepts client connections (plain HTTP, and HTTPS
//! with the certificate chosen by SNI and HTTP/2 or HTTP/1.1 by ALPN),
//! serves each with HTTP/1.1 ([`crate::serve_h1`]) or, when it opens with
//! HTTP/2's preface or chose `h2` by ALPN, with hyper's HTTP/2, and closes
//! it when it has been idle for its gate's idle timeout. The
//! number of open connections is bounded; past it, accepting waits. On
//! stop it accepts no more, lets every request in flight finish (each
//! connection closes after its current response), and after the drain
//! deadline drops what is left.
//!
//! Idle connections are found by one sweep per listener a few times a
//! second rather than by a timer per connection: a request then costs two
//! atomic updates of its connection's [`Activity`], not a timer reset,
//! and a sweep asks the idle ones to close. The same sweep closes an
//! HTTP/1.1 connection whose client started a request's headers and did
//! not finish them within the header timeout (the connection reports the
//! first bytes of each request), and ends waits for a backend's response that passed
//! their deadline ([`Activity::within`]): a timer registered and
//! cancelled on every request added thread sleeps and wake-ups to a busy
//! gate.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::Request;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::proxy::{BodyError, Peer, Proxy};
use crate::serve_h1;
use crate::transport::Transport;
use crate::workers::Workers;

/// How often a listener looks for idle connections: an idle timeout is
/// kept to within this much.
const SWEEP_EVERY: Duration = Duration::from_millis(250);
/// Timeouts shorter than this are timed by a timer of their own: the
/// sweep's granularity would be a large part of them.
const SWEPT_FROM: Duration = Duration::from_secs(2);

/// Listener settings that hold before a request names its gate.
#[derive(Clone, Copy, Debug)]
pub struct ServerOptions {
    /// For a client to send a request's headers (and a TLS handshake).
    pub header_timeout: Duration,
    /// A connection with no request in flight for this long is closed,
    /// until a request names a gate whose own idle timeout then applies.
    pub idle_timeout: Duration,
    /// Open client connections, over every listener of the node.
    pub max_connections: usize,
    /// HTTP/2 streams one connection may have open at once.
    pub max_streams: u32,
    /// How long a stop waits for requests in flight.
    pub drain: Duration,
    /// Worker threads serving the connections (see [`crate::workers`]).
    pub workers: usize,
    /// Keep each worker to a CPU of its own, when the process may use as
    /// many CPUs as there are workers (see [`crate::workers`]).
    pub pin_workers: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 100_000,
            max_streams: 256,
            drain: Duration::from_secs(30),
            workers: std::thread::available_parallelism().map_or(1, usize::from),
            pin_workers: true,
        }
    }
}

/// What the sweep reads of a connection (requests in flight and when the
/// last one ended) and how it asks the connection to close.
#[derive(Debug)]
pub struct Activity {
    opened: Instant,
    in_flight: AtomicU32,
    /// Milliseconds after `opened` the last request ended.
    last: AtomicU64,
    idle_ms: AtomicU64,
    /// Milliseconds after `opened` (plus one) the first bytes of a request
    /// arrived with none in flight; 0: none are pending.
    head_since: AtomicU64,
    /// How long a request's headers may take, in milliseconds; 0: not
    /// timed (HTTP/2, whose frames are not request heads).
    header_ms: AtomicU64,
    close: AtomicBool,
    /// Close now, without waiting for anything in flight.
    abort: AtomicBool,
    /// The connection's task, woken to close.
    task: AtomicWaker,
    /// The connection's first wait with a deadline the sweep enforces
    /// (an HTTP/1.1 connection's only one: it needs no allocation).
    first: Deadline,
    /// Its other such waits (concurrent HTTP/2 streams).
    deadlines: Mutex<Vec<Arc<Deadline>>>,
}

/// One wait [`Activity::within`] bounds.
#[derive(Debug, Default)]
struct Deadline {
    /// Milliseconds after the connection opened; 0: no wait holds this
    /// one (the connection's `first`).
    at: AtomicU64,
    /// The `at` of the wait the sweep ended. A value rather than a flag:
    /// a sweep that read a finished wait's deadline cannot end the next
    /// wait, whose deadline is later.
    expired: AtomicU64,
    task: AtomicWaker,
}

impl Deadline {
    fn holding(at: u64) -> Self {
        Self {
            at: AtomicU64::new(at),
            ..Self::default()
        }
    }

    /// Ends the wait if its deadline passed by `now`.
    fn expire(&self, now: u64) {
        let at = self.at.load(Ordering::Acquire);
        if at != 0 && at <= now {
            self.expired.store(at, Ordering::Release);
            self.task.wake();
        }
    }

    /// `future`'s output, or `None` once the sweep ended the wait due at
    /// `at`.
    async fn bound<F: Future>(&self, at: u64, mut future: Pin<&mut F>) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            self.task.register(cx.waker());
            if self.expired.load(Ordering::Acquire) == at {
                return Poll::Ready(None);
            }
            future.as_mut().poll(cx).map(Some)
        })
        .await
    }
}

impl Activity {
    #[cfg(test)]
    pub(crate) fn for_tests() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(1))
    }

    fn new(idle: Duration, header: Duration) -> Self {
        Self {
            opened: Instant::now(),
            in_flight: AtomicU32::new(0),
            last: AtomicU64::new(0),
            idle_ms: AtomicU64::new(idle.as_millis() as u64),
            head_since: AtomicU64::new(0),
            header_ms: AtomicU64::new(header.as_millis().max(1) as u64),
            close: AtomicBool::new(false),
            abort: AtomicBool::new(false),
            task: AtomicWaker::new(),
            first: Deadline::default(),
            deadlines: Mutex::default(),
        }
    }

    /// Milliseconds since the connection opened.
    fn now(&self) -> u64 {
        self.opened.elapsed().as_millis() as u64
    }

    /// `future`'s output, or `None` once `timeout` has passed `since`: timed by
    /// the sweep to within its period (a quarter of a second), or by a
    /// timer for a timeout under [`SWEPT_FROM`].
    ///
    /// `future` is pinned by the caller: taken by value it would be held
    /// twice in this future's state (the argument and its pinned move),
    /// and every request's future would be that much larger to build and
    /// move.
    pub async fn within<F: Future>(
        &self,
        since: Instant,
        timeout: Duration,
        future: Pin<&mut F>,
    ) -> Option<F::Output> {
        if timeout < SWEPT_FROM {
            return tokio::time::timeout_at(since + timeout, future).await.ok();
        }
        // The caller's reading of the clock, not another.
        let at = (since.saturating_duration_since(self.opened) + timeout).as_millis() as u64;
        let at = at.max(1);
        let first = &self.first;
        if first
            .at
            .compare_exchange(0, at, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            let _release = ReleaseFirst(first);
            return first.bound(at, future).await;
        }
        let deadline = Arc::new(Deadline::holding(at));
        self.lock_deadlines().push(Arc::clone(&deadline));
        let _forget = ForgetDeadline(self, &deadline);
        deadline.bound(at, future).await
    }

    fn lock_deadlines(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Deadline>>> {
        self.deadlines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Ends the waits whose deadline passed.
    fn expire_deadlines(&self) {
        let now = self.now();
        self.first.expire(now);
        for deadline in self.lock_deadlines().iter() {
            deadline.expire(now);
        }
    }

    /// Wakes `waker` when the connection is asked to close.
    pub(crate) fn register(&self, waker: &std::task::Waker) {
        self.task.register(waker);
    }

    /// Asks the connection to close after the response it is sending.
    fn ask_to_close(&self) {
        self.close.store(true, Ordering::Release);
        self.task.wake();
    }

    pub(crate) fn asked_to_close(&self) -> bool {
        self.close.load(Ordering::Acquire)
    }

    /// Closes the connection now (a client too slow with its headers).
    fn abort(&self) {
        self.abort.store(true, Ordering::Release);
        self.task.wake();
    }

    pub(crate) fn aborted(&self) -> bool {
        self.abort.load(Ordering::Acquire)
    }

    /// Counts a request as in flight until the guard drops.
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_since.store(0, Ordering::Relaxed);
        Busy(Arc::clone(self))
    }

    /// Bytes arrived: with no request in flight they start a request's
    /// headers, and its header timeout.
    pub(crate) fn bytes_arrived(&self) {
        if self.header_ms.load(Ordering::Relaxed) != 0
            && self.in_flight.load(Ordering::Relaxed) == 0
            && self.head_since.load(Ordering::Relaxed) == 0
        {
            self.head_since.store(self.now() + 1, Ordering::Relaxed);
        }
    }

    /// The connection speaks HTTP/2: no header timeout.
    pub(crate) fn not_http1(&self) {
        self.header_ms.store(0, Ordering::Relaxed);
        self.head_since.store(0, Ordering::Relaxed);
    }

    /// A request's headers started arriving longer than the header
    /// timeout ago and are still not complete.
    fn headers_overdue(&self) -> bool {
        let since = self.head_since.load(Ordering::Relaxed);
        let limit = self.header_ms.load(Ordering::Relaxed);
        since != 0
            && limit != 0
            && self.in_flight.load(Ordering::Relaxed) == 0
            && self.now().saturating_sub(since - 1) > limit
    }

    /// The idle timeout of the gate the connection's requests go to.
    pub fn set_idle(&self, idle: Duration) {
        self.idle_ms
            .store(idle.as_millis() as u64, Ordering::Relaxed);
    }

    /// How long until the connection counts as idle; `None`: it is.
    fn idle_in(&self) -> Option<Duration> {
        let idle = Duration::from_millis(self.idle_ms.load(Ordering::Relaxed));
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return Some(idle);
        }
        let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
        let quiet = self.opened.elapsed().saturating_sub(last);
        idle.checked_sub(quiet).filter(|left| !left.is_zero())
    }
}

/// Frees the connection's first deadline when its wait ends.
struct ReleaseFirst<'a>(&'a Deadline);

impl Drop for ReleaseFirst<'_> {
    fn drop(&mut self) {
        self.0.at.store(0, Ordering::Release);
    }
}

/// Takes a finished wait off its connection's list.
struct ForgetDeadline<'a>(&'a Activity, &'a Arc<Deadline>);

impl Drop for ForgetDeadline<'_> {
    fn drop(&mut self) {
        self.0
            .lock_deadlines()
            .retain(|deadline| !Arc::ptr_eq(deadline, self.1));
    }
}

/// A request in flight on a connection.
#[derive(Debug)]
pub struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let activity = &self.0;
        let now = activity.opened.elapsed().as_millis() as u64;
        activity.last.store(now, Ordering::Relaxed);
        activity.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One listener: plain HTTP, or HTTPS with `tls`.
#[derive(Debug)]
pub struct Listener {
    pub socket: TcpListener,
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// Serves `listeners` on `options.workers` worker threads until `stop`
/// turns true, then drains.
pub async fn serve(
    proxy: Arc<Proxy>,
    listeners: Vec<Listener>,
    options: ServerOptions,
    stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let workers = Arc::new(Workers::start(options.workers, options.pin_workers)?);
    let permits = Arc::new(Semaphore::new(options.max_connections));
    let mut accepting = JoinSet::new();
    for listener in listeners {
        accepting.spawn(accept_loop(
            Arc::clone(&proxy),
            listener,
            options,
            (Arc::clone(&permits), Arc::clone(&workers)),
            stop.clone(),
        ));
    }
    while accepting.join_next().await.is_some() {}
    Ok(())
}

async fn accept_loop(
    proxy: Arc<Proxy>,
    listener: Listener,
    options: ServerOptions,
    (permits, workers): (Arc<Semaphore>, Arc<Workers>),
    mut stop: watch::Receiver<bool>,
) {
    let acceptor = listener.tls.map(TlsAcceptor::from);
    let open = Arc::new(OpenConnections::default());
    let mut connections = JoinSet::new();
    let sweeper = tokio::spawn(sweep_idle(Arc::clone(&open), stop.clone()));
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let accepted = tokio::select! {
            accepted = listener.socket.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let (stream, client) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors or a connection reset before accept:
                // back off a moment rather than spin.
                tracing::warn!(%error, "the gate could not accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        // Off this runtime's reactor, onto the worker's.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(error) => {
                tracing::warn!(%client, %error, "the gate could not hand a connection to a worker");
                continue;
            }
        };
        let activity = Arc::new(Activity::new(options.idle_timeout, options.header_timeout));
        open.add(&activity);
        let proxy = Arc::clone(&proxy);
        let acceptor = acceptor.clone();
        let (worker, placed) = workers.least_busy();
        connections.spawn_on(
            async move {
                let _placed = placed;
                let _permit = permit;
                let stream = match TcpStream::from_std(stream) {
                    Ok(stream) => stream,
                    Err(error) => {
                        tracing::warn!(%client, %error, "a gate worker could not take a connection");
                        return;
                    }
                };
                proxy.metrics.connections.inc();
                serve_connection(&proxy, stream, client, acceptor, options, activity).await;
                proxy.metrics.connections.dec();
            },
            worker,
        );
        // Reap finished connections so the set stays small.
        while connections.try_join_next().is_some() {}
    }
    sweeper.abort();
    open.close_all();
    let drained = async {
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        loop {
            tokio::select! {
                joined = connections.join_next() => if joined.is_none() { return },
                // A connection that opened its TLS session after the stop
                // is told too.
                _ = sweep.tick() => open.close_all(),
            }
        }
    };
    if tokio::time::timeout(options.drain, drained).await.is_err() {
        tracing::warn!(
            left = connections.len(),
            "gate connections still busy after the drain deadline are closed"
        );
        connections.shutdown().await;
    }
}

/// Asks the connections idle past their timeout to close, until `stop`.
async fn sweep_idle(open: Arc<OpenConnections>, mut stop: watch::Receiver<bool>) {
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = sweep.tick() => open.close_idle(),
            _ = stop.wait_for(|stop| *stop) => return,
        }
    }
}

/// A listener's open connections, as the sweep sees them.
#[derive(Debug, Default)]
struct OpenConnections(Mutex<Vec<Weak<Activity>>>);

impl OpenConnections {
    fn add(&self, activity: &Arc<Activity>) {
        self.lock().push(Arc::downgrade(activity));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<Activity>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks the connections idle past their timeout to close, ends waits
    /// past their deadline, and forgets the closed connections.
    fn close_idle(&self) {
        self.lock().retain(|weak| match weak.upgrade() {
            Some(activity) => {
                if activity.headers_overdue() {
                    activity.abort();
                } else if activity.idle_in().is_none() {
                    activity.ask_to_close();
                }
                activity.expire_deadlines();
                true
            }
            None => false,
        });
    }

    /// Asks every connection to close (after its requests in flight,
    /// whose deadlines still hold).
    fn close_all(&self) {
        self.lock().retain(|weak| match weak.upgrade() {
            Some(activity) => {
                activity.ask_to_close();
                activity.expire_deadlines();
                true
            }
            None => false,
        });
    }
}

async fn serve_connection(
    proxy: &Arc<Proxy>,
    stream: TcpStream,
    client: SocketAddr,
    acceptor: Option<TlsAcceptor>,
    options: ServerOptions,
    activity: Arc<Activity>,
) {
    // Each path boxed: a task is as large as the largest state of its
    // future, and a TLS session or an HTTP/2 connection is kilobytes every
    // idle plain connection would otherwise hold.
    let Some(acceptor) = acceptor else {
        let peer = Arc::new(Peer::new(Arc::clone(proxy), client, false, activity));
        return Box::pin(serve_plain(stream, peer, options)).await;
    };
    Box::pin(serve_tls(
        proxy, stream, client, acceptor, options, activity,
    ))
    .await;
}

async fn serve_tls(
    proxy: &Arc<Proxy>,
    stream: TcpStream,
    client: SocketAddr,
    acceptor: TlsAcceptor,
    options: ServerOptions,
    activity: Arc<Activity>,
) {
    let handshake = tokio::time::timeout(options.header_timeout, acceptor.accept(stream));
    match handshake.await {
        Ok(Ok(tls)) => {
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
            let peer = Arc::new(Peer::new(Arc::clone(proxy), client, true, activity));
            if h2 {
                Box::pin(serve_h2(tls, peer, options)).await;
            } else {
                serve_h1::serve(tls, BytesMut::new(), peer).await;
            }
        }
        Ok(Err(error)) => {
            tracing::debug!(%client, %error, "a TLS handshake with the gate failed")
        }
        Err(_) => tracing::debug!(%client, "a TLS handshake with the gate timed out"),
    }
}

/// How every HTTP/2 connection starts (RFC 9113 §3.4); no HTTP/1.1
/// request line does.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Serves a plain connection with HTTP/2 if it opens with HTTP/2's
/// preface, else with HTTP/1.1.
async fn serve_plain(mut stream: TcpStream, peer: Arc<Peer>, options: ServerOptions) {
    let activity = Arc::clone(&peer.activity);
    let mut read = BytesMut::new();
    loop {
        let compared = read.len().min(HTTP2_PREFACE.len());
        if read.len() >= HTTP2_PREFACE.len() || read[..compared] != HTTP2_PREFACE[..compared] {
            break;
        }
        let got = std::future::poll_fn(|cx| {
            activity.register(cx.waker());
            if activity.aborted() || activity.asked_to_close() {
                return Poll::Ready(Ok(0));
            }
            stream.poll_fill(&mut read, cx)
        })
        .await;
        if !matches!(got, Ok(1..)) {
            return;
        }
    }
    if read.starts_with(HTTP2_PREFACE) {
        Box::pin(serve_h2(Rewind::new(read.freeze(), stream), peer, options)).await;
    } else {
        activity.bytes_arrived();
        serve_h1::serve(stream, read, peer).await;
    }
}

/// A stream whose first bytes were already read: they are read again
/// first.
struct Rewind<I> {
    early: Bytes,
    inner: I,
}

impl<I> Rewind<I> {
    fn new(early: Bytes, inner: I) -> Self {
        Self { early, inner }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Rewind<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.early.is_empty() {
            let taken = self.early.len().min(buf.remaining());
            let early = self.early.split_to(taken);
            buf.put_slice(&early);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Rewind<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serves an HTTP/2 connection with hyper until it closes, closing it
/// gracefully when asked.
async fn serve_h2<I>(io: I, peer: Arc<Peer>, options: ServerOptions)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::clone(&peer.activity);
    activity.not_http1();
    let client = peer.client;
    let service = service_fn(move |request: Request<Incoming>| {
        let peer = Arc::clone(&peer);
        let request = request.map(|body| body.map_err(BodyError::from).boxed_unsync());
        // Boxed per request: hyper keeps a slot the size of the service's
        // future for each stream, and the request path's future is
        // kilobytes.
        let answer = Box::pin(async move { peer.handle(request).await });
        async move { Ok::<_, Infallible>(answer.await) }
    });
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(options.max_streams)
        .keep_alive_interval(Some(options.idle_timeout / 2));
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let mut closing = false;
    let served = std::future::poll_fn(|cx| {
        if !closing {
            activity.register(cx.waker());
            if activity.asked_to_close() {
                closing = true;
                connection.as_mut().graceful_shutdown();
            }
        }
        connection.as_mut().poll(cx)
    });
    if let Err(error) = served.await {
        tracing::debug!(%client, error = %error, "a gate connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_with_nothing_in_flight() {
        let activity = Arc::new(Activity::new(
            Duration::from_secs(10),
            Duration::from_secs(30),
        ));
        assert_eq!(activity.idle_in(), Some(Duration::from_secs(10)));
        let busy = activity.begin();
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(activity.idle_in(), Some(Duration::from_secs(10)), "busy");
        drop(busy);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(activity.idle_in(), Some(Duration::from_secs(6)));
        activity.set_idle(Duration::from_secs(2));
        assert_eq!(activity.idle_in(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweep_ends_a_wait_past_its_deadline_and_spares_the_others() {
        let activity = Arc::new(Activity::new(
            Duration::from_secs(60),
            Duration::from_secs(30),
        ));
        let open = OpenConnections::default();
        open.add(&activity);
        let waiting = |timeout| {
            let activity = Arc::clone(&activity);
            tokio::spawn(async move {
                let pending = std::pin::pin!(std::future::pending::<()>());
                activity.within(Instant::now(), timeout, pending).await
            })
        };
        let short = waiting(Duration::from_secs(5));
        let long = waiting(Duration::from_secs(60));
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_secs(4)).await;
        open.close_idle();
        tokio::task::yield_now().await;
        assert!(!short.is_finished(), "before its deadline");
        tokio::time::advance(Duration::from_secs(2)).await;
        open.close_idle();
        assert_eq!(short.await.expect("no panic"), None, "timed out");
        assert!(!long.is_finished());
        let held = usize::from(activity.first.at.load(Ordering::Relaxed) != 0)
            + activity.lock_deadlines().len();
        assert_eq!(held, 1, "the ended wait is forgotten");
        long.abort();
        let done = activity
            .within(
                Instant::now(),
                Duration::from_secs(60),
                std::pin::pin!(async { 7 }),
            )
            .await;
        assert_eq!(done, Some(7));
    }

    /// A sweep that read the deadline of a wait which then ended, and a
    /// new wait took the connection's first deadline, ends nothing.
    #[tokio::test]
    async fn a_sweep_late_for_an_ended_wait_spares_the_next() {
        let first = Deadline::default();
        first.at.store(100, Ordering::Release);
        let read_by_the_sweep = first.at.load(Ordering::Acquire);
        first.at.store(0, Ordering::Release);
        first.at.store(5_100, Ordering::Release);
        first.expired.store(read_by_the_sweep, Ordering::Release);
        let pending = std::pin::pin!(std::future::pending::<()>());
        let waited =
            tokio::time::timeout(Duration::from_millis(50), first.bound(5_100, pending)).await;
        assert!(waited.is_err(), "the new wait goes on: {waited:?}");
        first.expire(5_100);
        let ended = first
            .bound(5_100, std::pin::pin!(std::future::pending::<()>()))
            .await;
        assert_eq!(ended, None, "its own deadline ends it");
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_timeout_has_a_timer_of_its_own() {
        let activity = Activity::new(Duration::from_secs(60), Duration::from_secs(30));
        let started = Instant::now();
        let waited = activity
            .within(
                started,
                Duration::from_millis(300),
                std::pin::pin!(std::future::pending::<()>()),
            )
            .await;
        assert_eq!(waited, None);
        assert_eq!(started.elapsed(), Duration::from_millis(300));
    }
}
