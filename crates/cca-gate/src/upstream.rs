//! The gate's connections to one backend: kept-alive HTTP/1.1 connections
//! it reads and writes itself with [`crate::h1`]'s framing, and a stack of
//! the idle ones, reused newest first so that the warm connections stay in
//! use and the others age out. A connection goes back on the stack once
//! the response it carried has been read to its end and says the
//! connection persists (one whose body was abandoned half-way is closed
//! instead). A connection the backend closed while it sat idle is noticed
//! before use; in the race where the backend closes it just as a request
//! goes out, a request with no body is sent again on a new connection.
//!
//! A connection has no task of its own: the request using it writes the
//! request and reads the response head from the task that serves the
//! client, and the response body reads the socket as the client's
//! connection asks for more. Nothing passes through a channel or wakes
//! another task. A `101 Switching Protocols` hands the socket itself (and
//! any bytes already read past the head) to the tunnel.
//!
//! Each worker thread (see [`crate::workers`]) has a stack of its own:
//! a connection's socket is registered with the runtime that opened it,
//! and a request on another worker's thread reusing it would be woken
//! from that thread.
//!
//! This replaces a general-purpose pooled client: a gate knows its
//! backends' addresses, needs no DNS, proxy or TLS to them, and gains from
//! a checkout that is one uncontended lock and a pop.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body as _, Frame, SizeHint};
use hyper::header::HeaderMap;
use hyper::{Method, Response, StatusCode};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::forward::Forwarding;
use crate::h1::{self, BodyLength, ChunkedDecoder, Decoded, Framing, FramingError};
use crate::passed::Answer;
use crate::proxy::{Body, BodyError};
use crate::sharded::Shards;
use crate::transport::poll_fill;

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
        source: io::Error,
    },
    #[error("sending the request to {address}: {source}")]
    Send {
        address: SocketAddr,
        source: BodyError,
    },
    #[error("the request's body could not be read: {0}")]
    RequestBody(BodyError),
    #[error("{address} closed the connection before responding")]
    Closed { address: SocketAddr },
    #[error("reading the response of {address}: {source}")]
    Receive {
        address: SocketAddr,
        source: io::Error,
    },
    #[error("{address} sent a response the gate cannot read: {source}")]
    Framing {
        address: SocketAddr,
        source: FramingError,
    },
}

/// Why a backend response's body broke off.
#[derive(Debug, thiserror::Error)]
pub enum BodyBroken {
    #[error("the backend closed the connection {0} bytes before the body's end")]
    Short(u64),
    #[error("the backend closed the connection in the middle of a chunked body")]
    ShortChunked,
    #[error("reading the body from the backend: {0}")]
    Io(#[from] io::Error),
    #[error("the backend sent a body the gate cannot read: {0}")]
    Framing(#[from] FramingError),
}

/// A request's head as it goes to a backend, borrowed from the request
/// so that a retry sends it again without a copy.
#[derive(Debug, Clone, Copy)]
pub struct RequestLine<'a> {
    pub method: &'a Method,
    /// Origin form: path and query.
    pub target: &'a str,
    pub headers: &'a HeaderMap,
    /// Written in place of the request's own forwarding fields.
    pub forwarding: &'a Forwarding,
}

impl RequestLine<'_> {
    fn write(&self, out: &mut BytesMut, length: BodyLength) {
        let own = self
            .headers
            .iter()
            .filter(|(name, _)| !Forwarding::replaces(name));
        let fields = own.chain(self.forwarding.fields());
        let count = self.headers.len() + 5;
        h1::write_request_head(out, self.method, self.target, fields, count, length);
    }
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
    connection: Connection,
    since: Instant,
}

/// A connection to the backend with what was read past the last message.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    read: BytesMut,
    write: BytesMut,
}

fn lock(stack: &Mutex<Vec<Idle>>) -> std::sync::MutexGuard<'_, Vec<Idle>> {
    stack
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Connection {
    fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            read: BytesMut::new(),
            write: BytesMut::new(),
        }
    }

    /// Whether the backend has neither closed the connection nor sent
    /// anything unasked, as far as can be seen without waiting.
    fn is_open(&mut self) -> bool {
        if !self.read.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        poll_fill(&self.stream, &mut self.read, &mut cx).is_pending()
    }

    /// Writes the request and its body and reads the response's head
    /// (skipping interim 1xx responses but `101`). A response that comes
    /// before the body is all sent stops the sending; the connection then
    /// closes after it.
    async fn exchange(
        &mut self,
        method: &Method,
        body: Option<Body>,
        length: BodyLength,
        address: SocketAddr,
    ) -> Result<(h1::ResponseHead, bool), UpstreamError> {
        let Self {
            stream,
            read,
            write,
        } = self;
        write_all(stream, write)
            .await
            .map_err(|source| UpstreamError::Send {
                address,
                source: source.into(),
            })?;
        write.clear();
        let Some(body) = body else {
            return Ok((read_head(stream, read, method, address).await?, true));
        };
        let mut sending = std::pin::pin!(send_body(stream, body, length, address));
        let mut head = std::pin::pin!(read_head(stream, read, method, address));
        let mut sent = false;
        poll_fn(|cx| {
            if let Poll::Ready(head) = head.as_mut().poll(cx) {
                return Poll::Ready(head.map(|head| (head, sent)));
            }
            if !sent && let Poll::Ready(result) = sending.as_mut().poll(cx) {
                result?;
                sent = true;
                return head
                    .as_mut()
                    .poll(cx)
                    .map(|head| head.map(|head| (head, true)));
            }
            Poll::Pending
        })
        .await
    }
}

/// Writes all of `bytes`.
async fn write_all(stream: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match stream.try_write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => bytes = &bytes[written..],
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => stream.writable().await?,
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Reads a response head, skipping interim responses (but `101`).
async fn read_head(
    stream: &TcpStream,
    read: &mut BytesMut,
    method: &Method,
    address: SocketAddr,
) -> Result<h1::ResponseHead, UpstreamError> {
    loop {
        match h1::parse_response(read, method) {
            Ok(Some(head))
                if head.status.is_informational()
                    && head.status != StatusCode::SWITCHING_PROTOCOLS =>
            {
                continue;
            }
            Ok(Some(head)) => return Ok(head),
            Ok(None) => {}
            Err(source) => return Err(UpstreamError::Framing { address, source }),
        }
        let got = poll_fn(|cx| poll_fill(stream, read, cx))
            .await
            .map_err(|source| UpstreamError::Receive { address, source })?;
        if got == 0 && read.is_empty() {
            return Err(UpstreamError::Closed { address });
        }
        if got == 0 {
            return Err(UpstreamError::Receive {
                address,
                source: io::ErrorKind::UnexpectedEof.into(),
            });
        }
    }
}

/// Writes a request body, framed as `length` says.
async fn send_body(
    stream: &TcpStream,
    mut body: Body,
    length: BodyLength,
    address: SocketAddr,
) -> Result<(), UpstreamError> {
    let failed = |source: BodyError| UpstreamError::Send { address, source };
    let mut framed = BytesMut::new();
    let mut sent = 0u64;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(UpstreamError::RequestBody)?.into_data() else {
            continue; // Trailers are not forwarded.
        };
        sent += data.len() as u64;
        if let BodyLength::Known(declared) = length
            && sent > declared
        {
            return Err(UpstreamError::RequestBody(
                "it is longer than its Content-Length".into(),
            ));
        }
        if length == BodyLength::Chunked {
            if data.is_empty() {
                continue;
            }
            framed.clear();
            h1::write_chunk(&mut framed, &data);
            write_all(stream, &framed).await
        } else {
            write_all(stream, &data).await
        }
        .map_err(|error| failed(error.into()))?;
    }
    match length {
        BodyLength::Chunked => {
            framed.clear();
            h1::write_chunk(&mut framed, b"");
            write_all(stream, &framed)
                .await
                .map_err(|error| failed(error.into()))
        }
        BodyLength::Known(declared) if sent != declared => Err(UpstreamError::RequestBody(
            "it is shorter than its Content-Length".into(),
        )),
        _ => Ok(()),
    }
}

impl Upstream {
    pub fn new(address: SocketAddr) -> Self {
        Self {
            address,
            idle: Shards::default(),
        }
    }

    /// Sends a request (`Host` among its headers) and returns the
    /// response, whose body hands the connection back when it ends.
    pub async fn send(
        self: &Arc<Self>,
        head: RequestLine<'_>,
        body: Body,
        settings: UpstreamSettings,
    ) -> Result<Answer<UpstreamBody>, UpstreamError> {
        let length = body_length(head.method, &body);
        let body = (!body.is_end_stream()).then_some(body);
        // Sent again on a new connection if a reused one turns out closed
        // (the backend closed it as the request went out): only while
        // nothing of a body was consumed, and after a reset only when
        // sending twice does no harm.
        let resendable = |error: &UpstreamError| match error {
            UpstreamError::Closed { .. } | UpstreamError::Send { .. } => true,
            UpstreamError::Receive { source, .. } => {
                source.kind() == io::ErrorKind::ConnectionReset
                    && crate::forward::is_idempotent(head.method)
            }
            _ => false,
        };
        if let Some(mut connection) = self.checkout(settings.idle) {
            head.write(&mut connection.write, length);
            let had_body = body.is_some();
            match connection
                .exchange(head.method, body, length, self.address)
                .await
            {
                Ok((response, sent)) => {
                    return Ok(self.returning(response, connection, sent, settings));
                }
                Err(error) if !had_body && resendable(&error) => {}
                Err(error) => return Err(error),
            }
            // The body was empty: nothing of it is lost.
            return Box::pin(self.send_fresh(head, None, length, settings)).await;
        }
        Box::pin(self.send_fresh(head, body, length, settings)).await
    }

    /// Sends on a new connection.
    async fn send_fresh(
        self: &Arc<Self>,
        head: RequestLine<'_>,
        body: Option<Body>,
        length: BodyLength,
        settings: UpstreamSettings,
    ) -> Result<Answer<UpstreamBody>, UpstreamError> {
        let mut connection = self.connect(settings.connect).await?;
        head.write(&mut connection.write, length);
        let (response, sent) = connection
            .exchange(head.method, body, length, self.address)
            .await?;
        Ok(self.returning(response, connection, sent, settings))
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

    /// The newest idle connection that is young enough and still open.
    fn checkout(&self, idle: Duration) -> Option<Connection> {
        let now = Instant::now();
        let mut stack = self.local();
        while let Some(mut entry) = stack.pop() {
            if now.duration_since(entry.since) < idle && entry.connection.is_open() {
                return Some(entry.connection);
            }
        }
        None
    }

    fn give_back(&self, mut connection: Connection, max_idle: usize) {
        if !connection.read.is_empty() {
            // Bytes past the response's end: not a backend to trust.
            return;
        }
        // An idle connection holds no buffer.
        crate::transport::put_aside(std::mem::take(&mut connection.read));
        let mut stack = self.local();
        if stack.len() < max_idle {
            stack.push(Idle {
                connection,
                since: Instant::now(),
            });
        }
    }

    async fn connect(&self, timeout: Duration) -> Result<Connection, UpstreamError> {
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
        Ok(Connection::new(stream))
    }

    fn returning(
        self: &Arc<Self>,
        head: h1::ResponseHead,
        connection: Connection,
        sent: bool,
        settings: UpstreamSettings,
    ) -> Answer<UpstreamBody> {
        let mut response = Response::new(());
        *response.status_mut() = head.status;
        let switching = head.status == StatusCode::SWITCHING_PROTOCOLS;
        let left = match head.framing {
            Framing::Empty => Left::Nothing,
            Framing::Length(length) => Left::Bytes(length),
            Framing::Chunked => Left::Chunked(ChunkedDecoder::default()),
            Framing::UntilClose => Left::UntilClose,
        };
        let mut body = UpstreamBody {
            left: if switching { Left::Nothing } else { left },
            lent: Some(Lent {
                connection,
                upstream: Arc::clone(self),
                max_idle: settings.max_idle,
                // A connection whose request body was cut short, or that
                // switched protocols, cannot carry another request.
                reusable: head.keep_alive && sent && !switching,
            }),
            switched: switching,
        };
        if !switching && body.is_end_stream() {
            body.finish();
        }
        Answer {
            response: response.map(|()| body),
            passed: head.fields,
        }
    }
}

/// How the request's body is framed for the backend.
fn body_length(method: &Method, body: &Body) -> BodyLength {
    if body.is_end_stream() {
        // A method that defines a body says its length even when it is
        // empty; GET and the like say nothing.
        return if matches!(*method, Method::POST | Method::PUT | Method::PATCH) {
            BodyLength::Known(0)
        } else {
            BodyLength::None
        };
    }
    match body.size_hint().exact() {
        Some(length) => BodyLength::Known(length),
        None => BodyLength::Chunked,
    }
}

/// A connection on loan to a response body.
#[derive(Debug)]
struct Lent {
    connection: Connection,
    upstream: Arc<Upstream>,
    max_idle: usize,
    reusable: bool,
}

/// What is left of a response body.
#[derive(Debug)]
enum Left {
    Nothing,
    Bytes(u64),
    Chunked(ChunkedDecoder),
    UntilClose,
}

/// A backend response's body. It reads the backend's socket as it is
/// read, and hands the connection back to the idle stack when it ends.
#[derive(Debug)]
pub struct UpstreamBody {
    left: Left,
    lent: Option<Lent>,
    /// A `101`: the connection is the tunnel's ([`Self::into_upgraded`]).
    switched: bool,
}

/// A backend connection that switched protocols: its socket and the
/// bytes that came after the `101` head.
#[derive(Debug)]
pub struct Upgraded {
    pub stream: TcpStream,
    pub early: Bytes,
}

impl UpstreamBody {
    /// The connection of a `101` response, for the tunnel.
    pub fn into_upgraded(mut self) -> Option<Upgraded> {
        if !self.switched {
            return None;
        }
        let lent = self.lent.take()?;
        Some(Upgraded {
            stream: lent.connection.stream,
            early: lent.connection.read.freeze(),
        })
    }

    /// The body ended: the connection goes back if it may.
    fn finish(&mut self) {
        self.left = Left::Nothing;
        if let Some(lent) = self.lent.take()
            && lent.reusable
        {
            lent.upstream.give_back(lent.connection, lent.max_idle);
        }
    }

    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyBroken>>> {
        let Some(lent) = &mut self.lent else {
            return Poll::Ready(None);
        };
        let connection = &mut lent.connection;
        loop {
            let buffered = &mut connection.read;
            match &mut self.left {
                Left::Nothing => return Poll::Ready(None),
                Left::Bytes(left) => {
                    if !buffered.is_empty() {
                        let taken = (*left).min(buffered.len() as u64);
                        *left -= taken;
                        return Poll::Ready(Some(Ok(buffered.split_to(taken as usize).freeze())));
                    }
                }
                Left::Chunked(decoder) => match decoder.decode(buffered) {
                    Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(data))),
                    Ok(Decoded::Done) => return Poll::Ready(None),
                    Ok(Decoded::NeedMore) => {}
                    Err(error) => return Poll::Ready(Some(Err(error.into()))),
                },
                Left::UntilClose => {
                    if !buffered.is_empty() {
                        return Poll::Ready(Some(Ok(buffered.split().freeze())));
                    }
                }
            }
            let got = match ready!(poll_fill(&connection.stream, &mut connection.read, cx)) {
                Ok(got) => got,
                Err(error) => return Poll::Ready(Some(Err(error.into()))),
            };
            if got == 0 {
                return Poll::Ready(match &self.left {
                    Left::Bytes(left) => Some(Err(BodyBroken::Short(*left))),
                    Left::Chunked(_) => Some(Err(BodyBroken::ShortChunked)),
                    _ => {
                        lent.reusable = false;
                        None
                    }
                });
            }
        }
    }
}

impl hyper::body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let polled = ready!(self.poll_body(cx));
        match polled {
            Some(Ok(data)) => {
                if self.is_end_stream() {
                    self.finish();
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            None => {
                self.finish();
                Poll::Ready(None)
            }
            Some(Err(error)) => {
                // A broken body leaves the connection in no state to reuse.
                self.lent = None;
                self.left = Left::Nothing;
                Poll::Ready(Some(Err(error.into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.left {
            Left::Nothing | Left::Bytes(0) => true,
            Left::Chunked(decoder) => decoder.is_done(),
            _ => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.left {
            Left::Nothing => SizeHint::with_exact(0),
            Left::Bytes(left) => SizeHint::with_exact(*left),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use hyper::Request;

    use super::*;
    use crate::forward::{ClientAddress, Origin};
    use hyper::header::HeaderValue;

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

    /// Sends `request` as the proxy does; the response with all its
    /// fields in its map.
    async fn send(
        upstream: &Arc<Upstream>,
        request: Request<Body>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let (parts, body) = request.into_parts();
        let client = ClientAddress::new(([192, 0, 2, 1], 5555).into());
        let host = HeaderValue::from_static("shop.example.com");
        let origin = Origin {
            client: &client,
            scheme: "http",
            host: &host,
        };
        let forwarding = Forwarding::of(&parts.headers, origin);
        let line = RequestLine {
            method: &parts.method,
            target: parts.uri.path_and_query().map_or("/", |pq| pq.as_str()),
            headers: &parts.headers,
            forwarding: &forwarding,
        };
        upstream
            .send(line, body, SETTINGS)
            .await
            .map(Answer::into_response)
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
        let response = send(upstream, get()).await?;
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

    /// A backend that answers the requests it gets with `answers`, in
    /// turn (closing the connection after those marked so), and records
    /// every request it read. Returns its address, the requests, and how
    /// many connections it accepted.
    async fn scripted(
        answers: Vec<(&'static [u8], bool)>,
    ) -> (SocketAddr, Arc<Mutex<Vec<String>>>, Arc<AtomicUsize>) {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let answers = Arc::new(Mutex::new(std::collections::VecDeque::from(answers)));
        let received = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (seen, counting) = (Arc::clone(&received), Arc::clone(&accepted));
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counting.fetch_add(1, Ordering::SeqCst);
                let (answers, seen) = (Arc::clone(&answers), Arc::clone(&seen));
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut chunk = [0; 4096];
                    loop {
                        while let Some(length) = complete_request(&buffer) {
                            let request: Vec<u8> = buffer.drain(..length).collect();
                            seen.lock()
                                .expect("lock")
                                .push(String::from_utf8_lossy(&request).into_owned());
                            let Some((answer, close)) = answers.lock().expect("lock").pop_front()
                            else {
                                return;
                            };
                            if stream.write_all(answer).await.is_err() || close {
                                return;
                            }
                        }
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(read) => buffer.extend_from_slice(&chunk[..read]),
                        }
                    }
                });
            }
        });
        (address, received, accepted)
    }

    /// The length of the complete request at the start of `buffer`.
    fn complete_request(buffer: &[u8]) -> Option<usize> {
        let head = buffer.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
        let text = String::from_utf8_lossy(&buffer[..head]).to_ascii_lowercase();
        if text.contains("transfer-encoding: chunked") {
            let end = buffer[head..].windows(5).position(|w| w == b"0\r\n\r\n")?;
            return Some(head + end + 5);
        }
        let length = text
            .lines()
            .find_map(|line| line.strip_prefix("content-length: "))
            .map_or(0, |value| value.trim().parse::<usize>().expect("length"));
        (buffer.len() >= head + length).then_some(head + length)
    }

    async fn read_all(response: Response<UpstreamBody>) -> Result<Bytes, BodyError> {
        Ok(response.into_body().collect().await?.to_bytes())
    }

    #[tokio::test]
    async fn chunked_and_length_bodies_are_read_and_the_connection_reused() {
        let (address, _, accepted) = scripted(vec![
            (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n3\r\n!!!\r\n0\r\n\r\n", false),
            (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nnext", false),
            (b"HTTP/1.1 204 No Content\r\n\r\n", false),
        ])
        .await;
        let upstream = Arc::new(Upstream::new(address));
        let first = send(&upstream, get()).await.expect("response");
        assert_eq!(read_all(first).await.expect("body"), "ok!!!");
        let second = send(&upstream, get()).await.expect("response");
        assert_eq!(
            second.status(),
            StatusCode::OK,
            "the interim 100 is skipped"
        );
        assert_eq!(read_all(second).await.expect("body"), "next");
        let third = send(&upstream, get()).await.expect("response");
        assert_eq!(third.status(), StatusCode::NO_CONTENT);
        assert!(third.body().is_end_stream());
        assert_eq!(upstream.idle_connections(), 1, "back as soon as it ended");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error_and_its_connection_is_not_reused() {
        let (address, _, accepted) = scripted(vec![
            (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", true),
            (b"HTTP/1.1 200 OK\r\n\r\nuntil the close", true),
            (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", false),
        ])
        .await;
        let upstream = Arc::new(Upstream::new(address));
        let cut = send(&upstream, get()).await.expect("response");
        let error = read_all(cut).await.expect_err("cut short");
        assert!(
            error.to_string().contains("5 bytes before the body's end"),
            "{error}"
        );
        let until_close = send(&upstream, get()).await.expect("response");
        assert_eq!(
            read_all(until_close).await.expect("body"),
            "until the close"
        );
        assert_eq!(upstream.idle_connections(), 0);
        assert_eq!(exchange(&upstream).await.expect("answer"), "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn request_bodies_go_out_with_their_framing() {
        let ok: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        let (address, received, _) = scripted(vec![(ok, false), (ok, false), (ok, false)]).await;
        let upstream = Arc::new(Upstream::new(address));
        let full = http_body_util::Full::new(Bytes::from_static(b"hello"))
            .map_err(|never| match never {})
            .boxed_unsync();
        let post = Request::post("/in")
            .header("host", "a")
            .body(full)
            .expect("request");
        send(&upstream, post).await.expect("response");
        let (sender, stream_body) =
            tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BodyError>>(2);
        let streamed =
            http_body_util::StreamBody::new(tokio_stream_from(stream_body)).boxed_unsync();
        sender
            .send(Ok(Frame::data(Bytes::from_static(b"ab"))))
            .await
            .expect("send");
        sender
            .send(Ok(Frame::data(Bytes::from_static(b"cde"))))
            .await
            .expect("send");
        drop(sender);
        let put = Request::put("/in")
            .header("host", "a")
            .body(streamed)
            .expect("request");
        send(&upstream, put).await.expect("response");
        let empty = http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed_unsync();
        let bare = Request::post("/in")
            .header("host", "a")
            .body(empty)
            .expect("request");
        send(&upstream, bare).await.expect("response");
        let received = received.lock().expect("lock").clone();
        assert_eq!(
            received[0],
            format!("POST /in HTTP/1.1\r\nhost: a\r\n{FORWARDING}content-length: 5\r\n\r\nhello")
        );
        assert_eq!(
            received[1],
            format!(
                "PUT /in HTTP/1.1\r\nhost: a\r\n{FORWARDING}transfer-encoding: chunked\r\n\r\n2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n"
            )
        );
        assert_eq!(
            received[2],
            format!("POST /in HTTP/1.1\r\nhost: a\r\n{FORWARDING}content-length: 0\r\n\r\n")
        );
    }

    /// The forwarding fields [`send`] has the gate write.
    const FORWARDING: &str = "x-forwarded-for: 192.0.2.1\r\n\
        forwarded: for=192.0.2.1;proto=http;host=shop.example.com\r\n\
        x-forwarded-proto: http\r\n\
        x-forwarded-host: shop.example.com\r\n";

    /// A client's own forwarding fields reach the backend once, extended or
    /// replaced by the gate's: a client cannot pass for another address,
    /// scheme or host.
    #[tokio::test]
    async fn the_clients_forwarding_fields_give_way_to_the_gates() {
        let ok: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        let (address, received, _) = scripted(vec![(ok, false)]).await;
        let upstream = Arc::new(Upstream::new(address));
        let empty = http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed_unsync();
        let spoofed = Request::get("/")
            .header("host", "a")
            .header("x-forwarded-for", "198.51.100.7")
            .header("x-forwarded-proto", "https")
            .header("x-forwarded-host", "elsewhere")
            .header("accept", "*/*")
            .body(empty)
            .expect("request");
        send(&upstream, spoofed).await.expect("response");
        let received = received.lock().expect("lock").clone();
        assert_eq!(
            received[0],
            "GET / HTTP/1.1\r\nhost: a\r\naccept: */*\r\n\
             x-forwarded-for: 198.51.100.7, 192.0.2.1\r\n\
             forwarded: for=192.0.2.1;proto=http;host=shop.example.com\r\n\
             x-forwarded-proto: http\r\n\
             x-forwarded-host: shop.example.com\r\n\r\n"
        );
    }

    /// A stream of a channel's items.
    fn tokio_stream_from<T>(
        mut receiver: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> {
        futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx))
    }

    #[tokio::test]
    async fn a_switch_of_protocols_hands_over_the_socket_and_what_followed_the_head() {
        let (address, _, _) = scripted(vec![(
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\nearly",
            false,
        )])
        .await;
        let upstream = Arc::new(Upstream::new(address));
        let response = send(&upstream, get()).await.expect("response");
        assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
        let mut upgraded = response.into_body().into_upgraded().expect("the socket");
        let mut early = upgraded.early.to_vec();
        while early.len() < 5 {
            let mut more = [0; 16];
            let read = upgraded.stream.read(&mut more).await.expect("read");
            assert!(read > 0, "the early bytes arrive");
            early.extend_from_slice(&more[..read]);
        }
        assert_eq!(early, b"early");
        assert_eq!(upstream.idle_connections(), 0);
    }

    #[tokio::test]
    async fn a_response_the_gate_cannot_frame_names_the_backend_and_the_problem() {
        let (address, _, _) = scripted(vec![(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok",
            false,
        )])
        .await;
        let upstream = Arc::new(Upstream::new(address));
        let error = send(&upstream, get()).await.expect_err("refused");
        let shown = error.to_string();
        assert!(shown.contains(&address.to_string()), "{shown}");
        assert!(
            shown.contains("Content-Length values that disagree"),
            "{shown}"
        );
    }
}
