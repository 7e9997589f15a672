//! HTTPS for the API: the server's TLS pieces are `cca-tls`'s (the agent
//! serves its own API with them too), re-exported here under the names
//! the API has used; what is the API's own is [`Peer`], what each request
//! knows about the other end of its connection.

use std::net::SocketAddr;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use cca_trust::identity::Identity;
use tokio::net::{TcpListener, TcpStream};

pub use cca_tls::{
    Certificate as ServerCertificate, RevocationList, ServerTls, TlsConnection, TlsError,
    TlsListener,
};

/// The other end of a request's connection: its address, and the identity
/// its verified client certificate carries (none over plain HTTP, without
/// a certificate, or with one that names no identity).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub address: SocketAddr,
    pub identity: Option<Identity>,
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        let (_, connection) = stream.io().tls().get_ref();
        let identity = connection
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| Identity::from_certificate(leaf));
        Self {
            address: *stream.remote_addr(),
            identity,
        }
    }
}

/// A plain listener whose connections have Nagle's algorithm off, as the
/// TLS listener's have: a response's frames must not wait for the ACK of
/// the segment before them (Nagle against the peer's delayed ACKs).
#[derive(Debug)]
pub(crate) struct NoDelayListener(pub(crate) TcpListener);

impl Listener for NoDelayListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (stream, address) = Listener::accept(&mut self.0).await;
        // A socket that refuses it still serves, only slower.
        let _ = stream.set_nodelay(true);
        (stream, address)
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

impl Connected<IncomingStream<'_, NoDelayListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, NoDelayListener>) -> Self {
        Self {
            address: *stream.remote_addr(),
            identity: None,
        }
    }
}

impl Connected<IncomingStream<'_, TcpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        Self {
            address: *stream.remote_addr(),
            identity: None,
        }
    }
}
