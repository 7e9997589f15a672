//! The gate's HTTP/1.1 server side: reads a client connection's requests
//! with [`crate::h1`], hands each to the proxy as an `http::Request`, and
//! writes the response back, one request after another on a kept-alive
//! connection (pipelined requests wait in the read buffer their turn).
//!
//! It is the gate's own rather than hyper's because a proxy pays for every
//! layer twice a request: the request body, when there is one, reaches the
//! proxy through a channel the connection fills as the proxy asks (sending
//! `100 Continue` first when the client waits for it), and a response is
//! written as its body arrives, its head and first bytes in one write.
//! Between requests a connection holds no buffer, so an idle kept-alive
//! connection costs its socket and a few hundred bytes.
//!
//! A request that cannot be read is answered 400 (431 for a head too
//! large, 501 for a transfer coding other than chunked) with a body that
//! says why, and the connection closed. A connection closes after a
//! response when the client asked, when the gate is draining or the
//! connection idle past its timeout (see [`crate::server`]), when the
//! client's body was not read to its end, and when the response's length
//! is unknown to an HTTP/1.0 client. A `101 Switching Protocols` hands
//! the connection itself to the tunnel.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body as _, Frame, SizeHint};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, StatusCode, Version};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

use crate::h1::{
    self, ChunkedDecoder, Decoded, Framing, Persistence, RequestError, RequestHead, ResponseBody,
};
use crate::passed::{Answer, PassedFields};
use crate::proxy::{Body, BodyError, Peer};
use crate::server::Activity;
use crate::transport::Transport;

/// Largest response body written together with its head.
const COALESCE: usize = 16 * 1024;

/// A client connection handed to a tunnel by a `101`: the connection and
/// the bytes the client sent after its request.
pub struct OwnUpgraded {
    pub io: Box<dyn ClientIo>,
    pub early: Bytes,
}

impl std::fmt::Debug for OwnUpgraded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnUpgraded")
            .field("early", &self.early.len())
            .finish_non_exhaustive()
    }
}

/// What a tunnel copies to and from on the client's side.
pub trait ClientIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> ClientIo for T {}

/// Where a request that asks to upgrade gets its connection if the
/// backend agrees (in the request's extensions, which must be `Clone`).
#[derive(Clone, Debug)]
pub struct UpgradeSlot(Arc<std::sync::Mutex<Option<oneshot::Receiver<OwnUpgraded>>>>);

impl UpgradeSlot {
    /// The receiving end (once).
    pub fn take(&self) -> Option<oneshot::Receiver<OwnUpgraded>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// What the connection does after a response.
enum Next {
    Continue,
    Close,
    Upgrade(oneshot::Sender<OwnUpgraded>),
}

/// Serves the HTTP/1.1 requests of one client connection until it closes;
/// `read` holds what was already read of it.
pub async fn serve<T: Transport>(mut io: T, mut read: BytesMut, peer: Arc<Peer>) {
    let activity = Arc::clone(&peer.activity);
    loop {
        let head = match next_head(&mut io, &mut read, &activity).await {
            Ok(Some(head)) => head,
            Ok(None) => break,
            Err(refused) => {
                let _ = answer_refusal(&mut io, &refused).await;
                break;
            }
        };
        // Boxed: a request's exchange, the proxy's answer in it, is
        // kilobytes; held inline, every idle connection's task would be
        // that large.
        match Box::pin(exchange(&mut io, &mut read, head, &peer)).await {
            Next::Continue => {}
            Next::Close => break,
            Next::Upgrade(slot) => {
                let early = read.split().freeze();
                let _ = slot.send(OwnUpgraded {
                    io: Box::new(io),
                    early,
                });
                return;
            }
        }
    }
    let _ = io.shutdown().await;
}

/// Reads the next request head: `None` when the client closed the
/// connection, or it was asked to close while no request was pending.
async fn next_head<T: Transport>(
    io: &mut T,
    read: &mut BytesMut,
    activity: &Activity,
) -> Result<Option<RequestHead>, RequestError> {
    loop {
        if !read.is_empty()
            && let Some(head) = h1::parse_request(read)?
        {
            return Ok(Some(head));
        }
        let got = poll_fn(|cx| {
            activity.register(cx.waker());
            if activity.aborted() || (read.is_empty() && activity.asked_to_close()) {
                return Poll::Ready(Ok(0));
            }
            let polled = io.poll_fill(read, cx);
            if polled.is_pending() && read.is_empty() {
                // Waiting for a request: hold no buffer meanwhile.
                crate::transport::put_aside(std::mem::take(read));
            }
            polled
        })
        .await;
        match got {
            Ok(0) | Err(_) => return Ok(None),
            Ok(_) => activity.bytes_arrived(),
        }
    }
}

/// Answers a request that could not be read.
async fn answer_refusal<T: Transport>(io: &mut T, refused: &RequestError) -> io::Result<()> {
    let body = format!("{refused}\n");
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    let mut out = BytesMut::new();
    h1::write_response_head(
        &mut out,
        refused.status(),
        &PassedFields::default(),
        &headers,
        ResponseBody::Length(body.len() as u64),
        Persistence::Close,
    );
    out.extend_from_slice(body.as_bytes());
    io.write_all(&out).await?;
    io.flush().await
}

/// Serves one request: the proxy's answer, fed the request body as it
/// asks, then the response written back.
async fn exchange<T: Transport>(
    io: &mut T,
    read: &mut BytesMut,
    head: RequestHead,
    peer: &Peer,
) -> Next {
    let RequestHead {
        method,
        uri,
        version,
        headers,
        framing,
        keep_alive,
        expect_continue,
    } = head;
    let head_request = method == Method::HEAD;
    let (body, feed) = request_body(framing, expect_continue);
    let mut request = Request::new(body);
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    *request.headers_mut() = headers;
    let upgrade = (version == Version::HTTP_11 && crate::forward::is_upgrade(request.headers()))
        .then(|| {
            let (slot, taken) = oneshot::channel();
            request
                .extensions_mut()
                .insert(UpgradeSlot(Arc::new(std::sync::Mutex::new(Some(taken)))));
            slot
        });
    // In a block of its own: the answer's future (kilobytes) is dead
    // before the response is written, so the two share their room.
    let ((answer, busy), body_read) = {
        let mut answer = std::pin::pin!(peer.answer(request));
        match feed {
            None => (answer.await, true),
            Some(feed) => answer_while_feeding(answer.as_mut(), feed, io, read).await,
        }
    };
    let persists = keep_alive && body_read && !peer.activity.asked_to_close();
    let mut out = crate::transport::spare_buffer();
    let written = write_response(io, &mut out, answer, head_request, version, persists).await;
    crate::transport::put_aside(out);
    drop(busy);
    match (written, upgrade) {
        (Ok(Written::Switched), Some(slot)) => Next::Upgrade(slot),
        (Ok(Written::Persists), _) => Next::Continue,
        _ => Next::Close,
    }
}

/// Awaits the proxy's answer while reading the request body into its
/// channel: the answer, and whether the body was read to its end (the
/// next request then starts right after it).
async fn answer_while_feeding<T: Transport, F: Future>(
    mut answer: Pin<&mut F>,
    feed: Feed,
    io: &mut T,
    read: &mut BytesMut,
) -> (F::Output, bool) {
    let mut feeding = std::pin::pin!(feed.run(io, read));
    let mut fed = None;
    poll_fn(|cx| {
        if let Poll::Ready(response) = answer.as_mut().poll(cx) {
            return Poll::Ready((response, fed == Some(true)));
        }
        if fed.is_none()
            && let Poll::Ready(done) = feeding.as_mut().poll(cx)
        {
            fed = Some(done);
            return answer.as_mut().poll(cx).map(|response| (response, done));
        }
        Poll::Pending
    })
    .await
}

/// The request body the proxy reads, and what fills it.
fn request_body(framing: Framing, expect_continue: bool) -> (Body, Option<Feed>) {
    let left = match framing {
        Framing::Empty => return (crate::proxy::empty(), None),
        Framing::Length(length) => Some(length),
        Framing::Chunked | Framing::UntilClose => None,
    };
    let (sender, receiver) = mpsc::channel(2);
    let (wanted, asked) = oneshot::channel();
    let body = RequestBody {
        receiver,
        wanted: Some(wanted),
        left,
        ended: false,
    };
    let feed = Feed {
        sender,
        asked: expect_continue.then_some(asked),
        framing,
    };
    (body.boxed_unsync(), Some(feed))
}

/// A request body as the proxy reads it: what the connection feeds it.
struct RequestBody {
    receiver: mpsc::Receiver<Result<Bytes, BodyError>>,
    /// Told when the body is first read (the client may wait for
    /// `100 Continue` until then).
    wanted: Option<oneshot::Sender<()>>,
    /// Bytes still to come, when the length is known.
    left: Option<u64>,
    ended: bool,
}

impl hyper::body::Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(wanted) = self.wanted.take() {
            let _ = wanted.send(());
        }
        match ready!(self.receiver.poll_recv(cx)) {
            Some(Ok(data)) => {
                if let Some(left) = &mut self.left {
                    *left = left.saturating_sub(data.len() as u64);
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Some(Err(error)) => Poll::Ready(Some(Err(error))),
            None => {
                self.ended = true;
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.left == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        match self.left {
            Some(left) => SizeHint::with_exact(left),
            None => SizeHint::default(),
        }
    }
}

/// Reads a request body off the connection into its channel.
struct Feed {
    sender: mpsc::Sender<Result<Bytes, BodyError>>,
    /// Fires when the proxy first reads the body: `100 Continue` goes out
    /// then.
    asked: Option<oneshot::Receiver<()>>,
    framing: Framing,
}

/// Why a request body stopped short.
#[derive(Debug, thiserror::Error)]
enum BodyCut {
    #[error("the client closed the connection before the request body's end")]
    Closed,
    #[error("reading the request body: {0}")]
    Io(#[from] io::Error),
    #[error("the request body's chunked coding is malformed: {0}")]
    Framing(#[from] h1::FramingError),
}

impl Feed {
    /// Feeds the whole body: `true` once it was read to its end, `false`
    /// when the client or the proxy gave up on it.
    async fn run<T: Transport>(mut self, io: &mut T, read: &mut BytesMut) -> bool {
        if let Some(asked) = self.asked.take() {
            if asked.await.is_err() {
                return false;
            }
            let continuing = async {
                io.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
                io.flush().await
            };
            if continuing.await.is_err() {
                return false;
            }
        }
        let result = self.pump(io, read).await;
        match result {
            Ok(done) => done,
            Err(cut) => {
                let _ = self.sender.send(Err(Box::new(cut))).await;
                false
            }
        }
    }

    async fn pump<T: Transport>(
        &mut self,
        io: &mut T,
        read: &mut BytesMut,
    ) -> Result<bool, BodyCut> {
        let mut left = match self.framing {
            Framing::Length(length) => length,
            _ => 0,
        };
        let mut decoder = ChunkedDecoder::default();
        loop {
            let data = match self.framing {
                Framing::Length(_) if left == 0 => return Ok(true),
                Framing::Length(_) if !read.is_empty() => {
                    let taken = left.min(read.len() as u64);
                    left -= taken;
                    Some(read.split_to(taken as usize).freeze())
                }
                Framing::Chunked => match decoder.decode(read)? {
                    Decoded::Data(data) => Some(data),
                    Decoded::Done => return Ok(true),
                    Decoded::NeedMore => None,
                },
                _ => None,
            };
            match data {
                Some(data) => {
                    if self.sender.send(Ok(data)).await.is_err() {
                        // The proxy dropped the body: the rest is unread.
                        return Ok(false);
                    }
                }
                None => {
                    let got = poll_fn(|cx| io.poll_fill(read, cx)).await?;
                    if got == 0 {
                        return Err(BodyCut::Closed);
                    }
                }
            }
        }
    }
}

/// How a response went out.
enum Written {
    /// Complete, and the connection can carry another request.
    Persists,
    /// Complete, and the connection closes after it (the client or the
    /// gate asked, its body was not read to the end, or the response's
    /// length was unknown to an HTTP/1.0 client).
    Closes,
    /// A `101`: the connection is the tunnel's now.
    Switched,
}

/// Writes `answer` through `out`: its head and, when it is at hand and
/// small, the start of its body in one write; then the rest as it
/// arrives.
async fn write_response<T: Transport>(
    io: &mut T,
    out: &mut BytesMut,
    answer: Answer<Body>,
    head_request: bool,
    version: Version,
    persists: bool,
) -> io::Result<Written> {
    let (parts, mut body) = answer.response.into_parts();
    let status = parts.status;
    let switching = status == StatusCode::SWITCHING_PROTOCOLS;
    let framing = if head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        ResponseBody::None
    } else if let Some(length) = body.size_hint().exact() {
        ResponseBody::Length(length)
    } else if version == Version::HTTP_11 {
        ResponseBody::Chunked
    } else {
        ResponseBody::UntilClose
    };
    let persists = persists && framing != ResponseBody::UntilClose;
    let persistence = match (switching, persists, version) {
        (true, _, _) => Persistence::AsIs,
        (false, false, _) => Persistence::Close,
        (false, true, Version::HTTP_10) => Persistence::KeepAlive,
        (false, true, _) => Persistence::Default,
    };
    let complete = if persists {
        Written::Persists
    } else {
        Written::Closes
    };
    h1::write_response_head(
        out,
        status,
        &answer.passed,
        &parts.headers,
        framing,
        persistence,
    );
    if framing == ResponseBody::None {
        drop(body);
        io.write_all(out).await?;
        io.flush().await?;
        return Ok(if switching {
            Written::Switched
        } else {
            complete
        });
    }
    let chunked = framing == ResponseBody::Chunked;
    // The body's first bytes, if already here, go with the head.
    let mut ended = false;
    let first = poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await;
    match first {
        Poll::Ready(Some(Ok(frame))) => {
            if let Ok(data) = frame.into_data() {
                if data.len() <= COALESCE {
                    put_data(out, &data, chunked);
                } else {
                    io.write_all(out).await?;
                    out.clear();
                    write_data(io, out, &data, chunked).await?;
                }
            }
            ended = body.is_end_stream();
        }
        Poll::Ready(Some(Err(error))) => return Err(body_failed(error)),
        Poll::Ready(None) => ended = true,
        Poll::Pending => {}
    }
    if ended {
        if chunked {
            h1::write_chunk(out, b"");
        }
        io.write_all(out).await?;
        io.flush().await?;
        return Ok(complete);
    }
    if !out.is_empty() {
        io.write_all(out).await?;
        io.flush().await?;
    }
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(body_failed)?.into_data() else {
            continue; // Trailers are not passed on.
        };
        out.clear();
        write_data(io, out, &data, chunked).await?;
        io.flush().await?;
    }
    if chunked {
        out.clear();
        h1::write_chunk(out, b"");
        io.write_all(out).await?;
        io.flush().await?;
    }
    Ok(complete)
}

/// Body bytes into `out`, framed as a chunk when `chunked`.
fn put_data(out: &mut BytesMut, data: &[u8], chunked: bool) {
    if data.is_empty() {
        return;
    }
    if chunked {
        h1::write_chunk(out, data);
    } else {
        out.extend_from_slice(data);
    }
}

/// Writes body bytes (a large block without copying it).
async fn write_data<T: Transport>(
    io: &mut T,
    out: &mut BytesMut,
    data: &Bytes,
    chunked: bool,
) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    if !chunked {
        return io.write_all(data).await;
    }
    h1::write_chunk_header(out, data.len());
    io.write_all(out).await?;
    io.write_all(data).await?;
    io.write_all(b"\r\n").await
}

fn body_failed(error: BodyError) -> io::Error {
    // The response cannot be finished: closing the connection tells the
    // client it is incomplete.
    io::Error::other(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection's task is as large as its largest state, so a
    /// request's exchange (kilobytes, with the proxy's answer in it) must
    /// stay behind a box, or every idle connection holds that much.
    #[tokio::test]
    async fn a_connections_task_holds_no_room_for_an_exchange() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let mut io = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let proxy = Arc::new(crate::proxy::Proxy::new(
            metrics,
            Arc::default(),
            Default::default(),
        ));
        let peer = Arc::new(Peer::new(
            proxy,
            address,
            false,
            Arc::new(Activity::for_tests()),
        ));
        let mut read = BytesMut::new();
        let head = h1::parse_request(&mut BytesMut::from("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
            .expect("valid")
            .expect("complete");
        let exchanging = exchange(&mut io, &mut read, head, &peer);
        let exchange_size = std::mem::size_of_val(&exchanging);
        drop(exchanging);
        let connection = serve(io, BytesMut::new(), Arc::clone(&peer));
        let connection_size = std::mem::size_of_val(&connection);
        assert!(connection_size < 1024, "{connection_size} bytes");
        assert!(
            exchange_size > connection_size + 1024,
            "an exchange of {exchange_size} bytes is boxed"
        );
    }
}
