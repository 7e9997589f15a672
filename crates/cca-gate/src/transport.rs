//! Reading sockets into the gate's buffers, the same for client
//! connections (plain or TLS) and backend connections. A plain socket's
//! read that drains it (returns less than it had room for) clears the
//! socket's readiness: the next read then waits for the kernel to say more
//! arrived instead of asking in a system call that would only answer
//! "nothing yet". A buffer gets room only once bytes are there to read, so
//! a connection waiting for its next request holds none: it puts its empty
//! buffer aside ([`put_aside`]) and the next read on the same worker
//! thread takes one back, so a busy gate does not allocate a buffer for
//! every request it reads.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// Room a read asks for at least.
pub const READ_ROOM: usize = 8 * 1024;

/// Empty buffers a worker thread keeps for its next reads: enough for the
/// connections it serves at once under load, few enough that what an
/// idle gate keeps is small.
const SPARE_BUFFERS: usize = 64;

thread_local! {
    static SPARE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// Keeps `buf` (emptied) for a later read or write on this thread; a
/// buffer grown large for one message is let go instead.
pub fn put_aside(mut buf: BytesMut) {
    if buf.capacity() == 0 || buf.capacity() > 2 * READ_ROOM {
        return;
    }
    buf.clear();
    SPARE.with_borrow_mut(|spare| {
        if spare.len() < SPARE_BUFFERS {
            spare.push(buf);
        }
    });
}

/// A buffer put aside on this thread, or a new empty one.
pub fn spare_buffer() -> BytesMut {
    SPARE.with_borrow_mut(Vec::pop).unwrap_or_default()
}

/// A client connection's byte stream.
pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Reads what is there into `buf`: 0 at the end of the stream.
    fn poll_fill(&mut self, buf: &mut BytesMut, cx: &mut Context<'_>) -> Poll<io::Result<usize>>;
}

impl Transport for TcpStream {
    fn poll_fill(&mut self, buf: &mut BytesMut, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        poll_fill(self, buf, cx)
    }
}

impl Transport for TlsStream<TcpStream> {
    fn poll_fill(&mut self, buf: &mut BytesMut, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if buf.capacity() == 0 {
            *buf = spare_buffer();
        }
        let start = buf.len();
        buf.resize(start + READ_ROOM, 0);
        let mut window = ReadBuf::new(&mut buf[start..]);
        let polled = Pin::new(self).poll_read(cx, &mut window);
        let got = window.filled().len();
        buf.truncate(start + got);
        ready!(polled)?;
        Poll::Ready(Ok(got))
    }
}

/// Reads what `stream` has into `buf`: 0 at the end of the stream.
pub fn poll_fill(
    stream: &TcpStream,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    loop {
        ready!(stream.poll_read_ready(cx))?;
        if buf.capacity() == 0 {
            *buf = spare_buffer();
        }
        if buf.capacity() - buf.len() < READ_ROOM / 2 {
            buf.reserve(READ_ROOM);
        }
        let room = buf.capacity() - buf.len();
        let mut got = 0;
        let read = stream.try_io(Interest::READABLE, || {
            got = stream.try_read_buf(buf)?;
            if got > 0 && got < room {
                // Drained: let the readiness go.
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(got)
            }
        });
        match read {
            Ok(read) => return Poll::Ready(Ok(read)),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                if got > 0 {
                    return Poll::Ready(Ok(got));
                }
            }
            Err(error) => return Poll::Ready(Err(error)),
        }
    }
}
