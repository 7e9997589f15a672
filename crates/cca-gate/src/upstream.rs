//! The gate's connections to one backend: kept-alive HTTP/1.1 connections
//! driven with hyper's connection API, and a stack of the idle ones,
//! reused newest first so that the warm connections stay in use and the
//! others age out. A connection goes back on the stack once the response
//! it carried has been read to its end (one whose body was abandoned
//! half-way is closed instead). A connection the backend closed while it
//! sat idle is noticed before use; in the race where the backend closes it
//! just as a request goes out, hyper hands the request back unsent and it
//! goes out on another connection.
//!
//! A connection has no task of its own: the request using it drives it
//! (writes the request, reads the response) from the task that serves the
//! client, and the response body drives it as the client's connection
//! reads. A task per connection cost every request two wake-ups of other
//! tasks, often on the other core, often waking a parked worker thread.
//! Upgrades (WebSocket) are the exception: their connections run in a
//! task, since the tunnel outlives the request.
//!
//! Each worker thread (see [`crate::workers`]) has a stack of its own:
//! a connection's socket is registered with the runtime that opened it,
//! and a request on another worker's thread reusing it would be woken
//! from that thread.
//!
//! This replaces a general-purpose pooled client: a gate knows its
//! backends' addresses, needs no DNS, proxy or TLS to them, and gains from
//! a checkout that is one uncontended lock and a pop.

use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper::client::conn::TrySendError;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::proxy::Body;
use crate::sharded::Shards;

/// How a gate talks to its backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpstreamSettings {
    /// Longest wait for a new connection.
    pub connect: Duration,
    /// An idle connection older than this is closed.
    pub idle: Duration,
    /// Idle connections kept per backend.
    pub max_idle: usize,
}

/// Why a request did not get a response from a backend.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("connecting to {address} took longer than {after:?}")]
    ConnectTimeout {
        address: SocketAddr,
        after: Duration,
    },
    #[error("connecting to {address}: {source}")]
    Connect {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("starting HTTP/1.1 with {address}: {source}")]
    Handshake {
        address: SocketAddr,
        source: hyper::Error,
    },
    #[error("{}", root_cause(.0))]
    Exchange(hyper::Error),
}

/// The innermost reason of an error (hyper's outer layers say little).
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// One backend's connections; see the module documentation.
#[derive(Debug)]
pub struct Upstream {
    address: SocketAddr,
    /// One stack per worker thread.
    idle: Shards<Mutex<Vec<Idle>>>,
}

#[derive(Debug)]
struct Idle {
    connection: Driven,
    since: Instant,
}

type Connection = http1::Connection<TokioIo<TcpStream>, Body>;

/// A connection and the handle its requests go through, polled by
/// whichever request or body uses it.
struct Driven {
    sender: SendRequest<Body>,
    /// `None` once it finished (closed or failed): dropping it hands back
    /// any request it had not sent.
    connection: Option<Pin<Box<Connection>>>,
}

impl std::fmt::Debug for Driven {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driven")
            .field("ended", &self.connection.is_none())
            .finish_non_exhaustive()
    }
}

impl Driven {
    fn new(sender: SendRequest<Body>, connection: Connection) -> Self {
        Self {
            sender,
            connection: Some(Box::pin(connection)),
        }
    }

    /// Lets the connection do what IO it can: write a request, read a
    /// response, notice the backend closed it.
    fn drive(&mut self, cx: &mut Context<'_>) {
        drive(&mut self.connection, cx);
    }

    /// Ready for a request (`false`: it is closed).
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        self.drive(cx);
        if self.connection.is_none() {
            return Poll::Ready(false);
        }
        self.sender.poll_ready(cx).map(|ready| ready.is_ok())
    }

    /// Whether it is still open, as far as it knows without waiting.
    fn is_open(&mut self) -> bool {
        self.drive(&mut Context::from_waker(Waker::noop()));
        self.connection.is_some() && !self.sender.is_closed()
    }

    /// Sends `request` and waits for the response's head, driving the
    /// connection meanwhile.
    async fn exchange(
        &mut self,
        request: Request<Body>,
    ) -> Result<Response<Incoming>, TrySendError<Request<Body>>> {
        let Self { sender, connection } = self;
        let mut response = std::pin::pin!(sender.try_send_request(request));
        poll_fn(|cx| {
            if let Poll::Ready(answered) = response.as_mut().poll(cx) {
                return Poll::Ready(answered);
            }
            drive(connection, cx);
            response.as_mut().poll(cx)
        })
        .await
    }
}

fn lock(stack: &Mutex<Vec<Idle>>) -> std::sync::MutexGuard<'_, Vec<Idle>> {
    stack
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Polls `connection` unless it finished, and drops it when it does.
fn drive(connection: &mut Option<Pin<Box<Connection>>>, cx: &mut Context<'_>) {
    if let Some(running) = connection
        && running.as_mut().poll(cx).is_ready()
    {
        *connection = None;
    }
}

impl Upstream {
    pub fn new(address: SocketAddr) -> Self {
        Self {
            address,
            idle: Shards::default(),
        }
    }

    /// Sends `request` (origin-form URI, `Host` set) and returns the
    /// response, whose body hands the connection back when it ends. An
    /// `upgrade` goes out on a connection of its own.
    pub async fn send(
        self: &Arc<Self>,
        mut request: Request<Body>,
        settings: UpstreamSettings,
        upgrade: bool,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        // The rare paths (an upgrade, a new connection) are boxed: the
        // common one's future stays small, and it is built and moved on
        // every request.
        if upgrade {
            return Box::pin(self.send_upgrade(request, settings)).await;
        }
        while let Some(mut connection) = self.checkout(settings.idle) {
            if !connection.ready(settings.connect).await {
                continue;
            }
            match connection.exchange(request).await {
                Ok(response) => return Ok(self.returning(response, connection, settings)),
                Err(mut failed) => match failed.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(UpstreamError::Exchange(failed.into_error())),
                },
            }
        }
        let (sender, connection) = Box::pin(self.connect(settings.connect)).await?;
        let mut connection = Driven::new(sender, connection);
        match connection.exchange(request).await {
            Ok(response) => Ok(self.returning(response, connection, settings)),
            Err(failed) => Err(UpstreamError::Exchange(failed.into_error())),
        }
    }

    /// An upgrade on a new connection, run by a task of its own so that
    /// it can be handed to the tunnel.
    async fn send_upgrade(
        &self,
        request: Request<Body>,
        settings: UpstreamSettings,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let (mut sender, connection) = self.connect(settings.connect).await?;
        let address = self.address;
        tokio::spawn(async move {
            if let Err(error) = connection.with_upgrades().await {
                tracing::debug!(%address, %error, "a gate connection to a backend ended with an error");
            }
        });
        let response = sender
            .send_request(request)
            .await
            .map_err(UpstreamError::Exchange)?;
        Ok(response.map(|body| UpstreamBody { body, lent: None }))
    }

    /// Closes idle connections older than `idle` and those the backend
    /// closed.
    pub fn sweep(&self, idle: Duration) {
        let now = Instant::now();
        for stack in self.idle.iter() {
            lock(stack).retain_mut(|entry| {
                now.duration_since(entry.since) < idle && entry.connection.is_open()
            });
        }
    }

    /// Idle connections kept now.
    pub fn idle_connections(&self) -> usize {
        self.idle.iter().map(|stack| lock(stack).len()).sum()
    }

    /// The calling worker's stack.
    fn local(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        lock(self.idle.local())
    }

    /// The newest idle connection that is young enough.
    fn checkout(&self, idle: Duration) -> Option<Driven> {
        let now = Instant::now();
        let mut stack = self.local();
        while let Some(entry) = stack.pop() {
            if now.duration_since(entry.since) < idle {
                return Some(entry.connection);
            }
        }
        None
    }

    fn give_back(&self, connection: Driven, max_idle: usize) {
        if connection.connection.is_none() || connection.sender.is_closed() {
            return;
        }
        let mut stack = self.local();
        if stack.len() < max_idle {
            stack.push(Idle {
                connection,
                since: Instant::now(),
            });
        }
    }

    async fn connect(
        &self,
        timeout: Duration,
    ) -> Result<(SendRequest<Body>, Connection), UpstreamError> {
        let address = self.address;
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(source)) => return Err(UpstreamError::Connect { address, source }),
            Err(_) => {
                return Err(UpstreamError::ConnectTimeout {
                    address,
                    after: timeout,
                });
            }
        };
        let _ = stream.set_nodelay(true);
        http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|source| UpstreamError::Handshake { address, source })
    }

    fn returning(
        self: &Arc<Self>,
        response: Response<Incoming>,
        connection: Driven,
        settings: UpstreamSettings,
    ) -> Response<UpstreamBody> {
        // A 101 to a request that did not ask for one leaves the
        // connection in no state to reuse.
        let reusable = response.status() != StatusCode::SWITCHING_PROTOCOLS;
        response.map(|body| {
            let mut body = UpstreamBody {
                body,
                lent: reusable.then(|| Lent {
                    connection,
                    upstream: Arc::clone(self),
                    max_idle: settings.max_idle,
                }),
            };
            if body.body.is_end_stream() {
                body.give_back();
            }
            body
        })
    }
}

impl Driven {
    /// Waits (up to `timeout`) for the connection to take a request;
    /// `false`: it closed, or is still busy with its last response.
    async fn ready(&mut self, timeout: Duration) -> bool {
        // Nearly always ready at once: no timer for that.
        if let Poll::Ready(ready) = poll_fn(|cx| Poll::Ready(self.poll_ready(cx))).await {
            return ready;
        }
        Box::pin(tokio::time::timeout(
            timeout,
            poll_fn(|cx| self.poll_ready(cx)),
        ))
        .await
        .unwrap_or(false)
    }
}

/// A connection on loan to a response body.
#[derive(Debug)]
struct Lent {
    connection: Driven,
    upstream: Arc<Upstream>,
    max_idle: usize,
}

/// A backend response's body. It drives its connection as it is read,
/// and hands the connection back to the idle stack when it ends.
#[derive(Debug)]
pub struct UpstreamBody {
    body: Incoming,
    lent: Option<Lent>,
}

impl UpstreamBody {
    fn give_back(&mut self) {
        if let Some(lent) = self.lent.take() {
            lent.upstream.give_back(lent.connection, lent.max_idle);
        }
    }

    fn poll_body(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }
}

impl hyper::body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let mut polled = self.poll_body(cx);
        if polled.is_pending()
            && let Some(lent) = &mut self.lent
        {
            // The connection reads what the body waits for.
            lent.connection.drive(cx);
            polled = self.poll_body(cx);
        }
        let frame = ready!(polled);
        match &frame {
            None => self.give_back(),
            Some(Ok(_)) if self.body.is_end_stream() => self.give_back(),
            Some(Ok(_)) => {}
            // A broken body leaves the connection in no state to reuse.
            Some(Err(_)) => self.lent = None,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    const SETTINGS: UpstreamSettings = UpstreamSettings {
        connect: Duration::from_secs(5),
        idle: Duration::from_secs(60),
        max_idle: 4,
    };

    /// A backend answering `ok` to each request; with `close_after_each`
    /// it closes every connection after its first response without saying
    /// so, as a backend whose keep-alive timeout passed would. Returns its
    /// address and how many connections it accepted.
    async fn backend(close_after_each: bool) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let counting = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counting.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut chunk = [0; 1024];
                    loop {
                        let Ok(read) = stream.read(&mut chunk).await else {
                            return;
                        };
                        if read == 0 {
                            return;
                        }
                        buffer.extend_from_slice(&chunk[..read]);
                        while let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                            buffer.drain(..end + 4);
                            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if stream.write_all(answer).await.is_err() || close_after_each {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (address, accepted)
    }

    fn get() -> Request<Body> {
        let body = http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed_unsync();
        Request::get("/")
            .header("host", "shop.example.com")
            .body(body)
            .expect("request")
    }

    async fn exchange(upstream: &Arc<Upstream>) -> Result<Bytes, UpstreamError> {
        let response = upstream.send(get(), SETTINGS, false).await?;
        Ok(response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes())
    }

    #[tokio::test]
    async fn requests_in_turn_reuse_one_kept_alive_connection() {
        let (address, accepted) = backend(false).await;
        let upstream = Arc::new(Upstream::new(address));
        for _ in 0..3 {
            assert_eq!(exchange(&upstream).await.expect("answer"), "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(upstream.idle_connections(), 1);
    }

    #[tokio::test]
    async fn a_connection_the_backend_closed_while_idle_is_replaced() {
        let (address, accepted) = backend(true).await;
        let upstream = Arc::new(Upstream::new(address));
        assert_eq!(exchange(&upstream).await.expect("answer"), "ok");
        // Let the connection's task see the backend's close.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(exchange(&upstream).await.expect("a new connection"), "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_refused_connection_names_the_backend() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        drop(listener);
        let upstream = Arc::new(Upstream::new(address));
        let error = exchange(&upstream).await.expect_err("nothing listens");
        assert!(error.to_string().contains(&address.to_string()), "{error}");
    }
}
