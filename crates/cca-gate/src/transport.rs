//! Reading sockets into the gate's buffers, the same for client
//! connections (plain or TLS) and backend connections. A plain socket's
//! read that drains it (returns less than it had room for) clears the
//! socket's readiness: the next read then waits for the kernel to say more
//! arrived instead of asking in a system call that would only answer
//! "nothing yet". A buffer gets room only once bytes are there to read, so
//! a connection waiting for its next request holds none.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// Room a read asks for at least.
pub const READ_ROOM: usize = 8 * 1024;

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
