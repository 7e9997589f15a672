//! The gate's connections to one backend: kept-alive HTTP/1.1 connections
//! driven with hyper's connection API (each served by a task of its own)
//! and a stack of the idle ones, reused newest first so that the warm
//! connections stay in use and the others age out. A connection goes back
//! on the stack once the response it carried has been read to its end
//! (one whose body was abandoned half-way is closed instead). A connection
//! the backend closed while it sat idle is noticed before use; in the race
//! where the backend closes it just as a request goes out, hyper hands the
//! request back unsent and it goes out on another connection.
//!
//! This replaces a general-purpose pooled client: a gate knows its
//! backends' addresses, needs no DNS, proxy or TLS to them, and gains from
//! a checkout that is one uncontended lock and a pop.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::proxy::Body;

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
    idle: Mutex<Vec<Idle>>,
}

#[derive(Debug)]
struct Idle {
    sender: SendRequest<Body>,
    since: Instant,
}

impl Upstream {
    pub fn new(address: SocketAddr) -> Self {
        Self {
            address,
            idle: Mutex::default(),
        }
    }

    /// Sends `request` (origin-form URI, `Host` set) and returns the
    /// response, whose body hands the connection back when it ends.
    pub async fn send(
        self: &Arc<Self>,
        mut request: Request<Body>,
        settings: UpstreamSettings,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        while let Some(mut sender) = self.checkout(settings.idle) {
            if !sender.is_ready() {
                // The connection is still finishing its last response.
                let ready = tokio::time::timeout(settings.connect, sender.ready()).await;
                if !matches!(ready, Ok(Ok(()))) {
                    continue;
                }
            }
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(self.returning(response, sender, settings)),
                Err(mut failed) => match failed.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(UpstreamError::Exchange(failed.into_error())),
                },
            }
        }
        let mut sender = self.connect(settings.connect).await?;
        let response = sender
            .send_request(request)
            .await
            .map_err(UpstreamError::Exchange)?;
        Ok(self.returning(response, sender, settings))
    }

    /// Closes idle connections older than `idle` and those the backend
    /// closed.
    pub fn sweep(&self, idle: Duration) {
        let now = Instant::now();
        self.lock()
            .retain(|entry| now.duration_since(entry.since) < idle && !entry.sender.is_closed());
    }

    /// Idle connections kept now.
    pub fn idle_connections(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The newest idle connection that is still open and young enough.
    fn checkout(&self, idle: Duration) -> Option<SendRequest<Body>> {
        let now = Instant::now();
        let mut stack = self.lock();
        while let Some(entry) = stack.pop() {
            if !entry.sender.is_closed() && now.duration_since(entry.since) < idle {
                return Some(entry.sender);
            }
        }
        None
    }

    fn give_back(&self, sender: SendRequest<Body>, max_idle: usize) {
        if sender.is_closed() {
            return;
        }
        let mut stack = self.lock();
        if stack.len() < max_idle {
            stack.push(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }

    async fn connect(&self, timeout: Duration) -> Result<SendRequest<Body>, UpstreamError> {
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
        let (sender, connection) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|source| UpstreamError::Handshake { address, source })?;
        tokio::spawn(async move {
            if let Err(error) = connection.with_upgrades().await {
                tracing::debug!(%address, %error, "a gate connection to a backend ended with an error");
            }
        });
        Ok(sender)
    }

    fn returning(
        self: &Arc<Self>,
        response: Response<Incoming>,
        sender: SendRequest<Body>,
        settings: UpstreamSettings,
    ) -> Response<UpstreamBody> {
        // An upgraded connection belongs to its tunnel from now on.
        let reusable = response.status() != StatusCode::SWITCHING_PROTOCOLS;
        response.map(|body| {
            let mut body = UpstreamBody {
                body,
                lent: reusable.then(|| (sender, Arc::clone(self), settings.max_idle)),
            };
            if body.body.is_end_stream() {
                body.give_back();
            }
            body
        })
    }
}

/// A backend response's body; its connection goes back to the idle stack
/// when the body ends.
#[derive(Debug)]
pub struct UpstreamBody {
    body: Incoming,
    lent: Option<(SendRequest<Body>, Arc<Upstream>, usize)>,
}

impl UpstreamBody {
    fn give_back(&mut self) {
        if let Some((sender, upstream, max_idle)) = self.lent.take() {
            upstream.give_back(sender, max_idle);
        }
    }
}

impl hyper::body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
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
        let response = upstream.send(get(), SETTINGS).await?;
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
