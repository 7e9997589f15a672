//! The servers' side: the rustls server configuration over a replaceable
//! [`Certificate`], the revocations every handshake checks, and a
//! listener that does handshakes off the accept loop.
//!
//! The API server asks for client certificates and verifies them against
//! the cluster CA alone, but does not require one at the handshake
//! ([`ServerTls::new`]): a user may come with a bearer token instead.
//! Whether a request may go on without one is the routes' decision (agent
//! routes require a node certificate), so a missing certificate gets an
//! HTTP answer that says what is missing rather than a bare TLS alert. An
//! agent's API serves the API server alone ([`ServerTls::requiring`]):
//! there a client without a certificate of the cluster CA naming the
//! expected identity fails the handshake.
//!
//! A certificate the cluster revoked is refused at the handshake, with a
//! `certificate_revoked` alert: the verifier reads the [`RevocationList`]
//! at every handshake, so a revocation takes effect at the next one.
//! Sessions are never resumed: every handshake verifies the client's
//! certificate. A connection already open when its certificate is revoked
//! is closed ([`TlsConnection`] watches the list), so a removed node's
//! streams end with its certificate rather than whenever they would have.
//!
//! Handshakes run in their own tasks with a deadline: one slow or silent
//! client must not hold the accept loop, and through it every other
//! connection.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::serve::Listener;
use cca_trust::identity::Identity;
use cca_trust::pki::CertInfo;
use cca_trust::revocation::Revocations;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ResolvesServerCert, WebPkiClientVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::TlsError;
use crate::client::ExpectedPeer;
use crate::pem::{Certificate, root_store};

/// Longest a client may take to finish its handshake.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const READY_BACKLOG: usize = 256;

/// The certificates the server refuses although they chain to the CA,
/// replaceable while it serves. Every handshake with a client certificate
/// reads it (a clone of an `Arc` under a read lock held for no more than
/// that), so a replaced list refuses from the next handshake on, and
/// open connections hear of each replacement and close if theirs is
/// revoked.
#[derive(Debug)]
pub struct RevocationList {
    current: RwLock<Arc<Revocations>>,
    /// Counts replacements, for open connections to wake on.
    replaced: watch::Sender<u64>,
}

impl Default for RevocationList {
    fn default() -> Self {
        Self::new(Revocations::default())
    }
}

impl RevocationList {
    pub fn new(revocations: Revocations) -> Self {
        Self {
            current: RwLock::new(Arc::new(revocations)),
            replaced: watch::Sender::new(0),
        }
    }

    /// Refuses what `revocations` revokes from the next handshake on.
    pub fn replace(&self, revocations: Revocations) {
        let next = Arc::new(revocations);
        let mut current = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let previous = std::mem::replace(&mut *current, next);
        drop(current);
        // A long list is freed here, after the lock, not under it.
        drop(previous);
        self.replaced.send_modify(|count| *count += 1);
    }

    /// The revocations in force.
    pub fn current(&self) -> Arc<Revocations> {
        Arc::clone(
            &self
                .current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// rustls's verifier (chain to the cluster CA, validity, usage), then,
/// when one is required, the client's identity, then the revocations: a
/// certificate is looked up only once it is known to be the cluster's,
/// and a revoked one fails the handshake with the `certificate_revoked`
/// alert.
#[derive(Debug)]
struct RevokingVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    /// Whom a client must be; `None`: anyone the CA certified, or no one.
    required: Option<ExpectedPeer>,
    revocations: Arc<RevocationList>,
}

impl ClientCertVerifier for RevokingVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if let Some(required) = &self.required
            && let Err(refused) =
                required.check(Identity::from_certificate(end_entity.as_ref()).as_ref())
        {
            tracing::warn!(%refused, "refused a client certificate");
            return Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ));
        }
        let revocations = self.revocations.current();
        if revocations.is_empty() {
            return Ok(verified);
        }
        // webpki has parsed it already, so this only fails on a
        // certificate no CA of ours would sign.
        let info = CertInfo::parse(end_entity.as_ref())
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        match revocations.check(&info) {
            Ok(()) => Ok(verified),
            Err(revoked) => {
                tracing::warn!(%revoked, "refused a revoked client certificate");
                Err(rustls::Error::InvalidCertificate(CertificateError::Revoked))
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.inner.requires_raw_public_keys()
    }
}

/// A server's TLS settings: its certificate, the CA client certificates
/// must chain to, whom they must name if anyone, and the client
/// certificates it no longer accepts.
#[derive(Clone, Debug)]
pub struct ServerTls {
    config: Arc<rustls::ServerConfig>,
    certificate: Arc<Certificate>,
    revocations: Arc<RevocationList>,
}

impl ServerTls {
    /// The API server's: serves `certificate`; client certificates are
    /// verified against `ca_pem` (and only it) when a client presents
    /// one. Nothing is revoked until [`ServerTls::revocations`] is given
    /// a list.
    pub fn new(ca_pem: &str, certificate: Arc<Certificate>) -> Result<Self, TlsError> {
        Self::build(ca_pem, certificate, None)
    }

    /// An agent's: serves `certificate` only to clients whose certificate
    /// chains to `ca_pem` and names `client` (the API server); any other
    /// client, or one without a certificate, fails the handshake.
    pub fn requiring(
        ca_pem: &str,
        certificate: Arc<Certificate>,
        client: ExpectedPeer,
    ) -> Result<Self, TlsError> {
        Self::build(ca_pem, certificate, Some(client))
    }

    fn build(
        ca_pem: &str,
        certificate: Arc<Certificate>,
        required: Option<ExpectedPeer>,
    ) -> Result<Self, TlsError> {
        let roots = Arc::new(root_store(ca_pem)?);
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut webpki = WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(&provider));
        if required.is_none() {
            webpki = webpki.allow_unauthenticated();
        }
        let webpki = webpki
            .build()
            .map_err(|error| TlsError::Config(error.to_string()))?;
        let revocations = Arc::new(RevocationList::default());
        let verifier = Arc::new(RevokingVerifier {
            inner: webpki,
            required,
            revocations: Arc::clone(&revocations),
        });
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError::Config(error.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(Arc::clone(&certificate) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        // No session resumption: a resumed session takes the client's
        // certificate from the session it resumes without verifying it
        // again, so it would outlive a revocation (and a renewed server
        // certificate). A full handshake costs one ECDSA signature and
        // one verification more.
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
        Ok(Self {
            config: Arc::new(config),
            certificate,
            revocations,
        })
    }

    /// The certificate being served (to replace it on renewal).
    pub fn certificate(&self) -> &Arc<Certificate> {
        &self.certificate
    }

    /// The revoked client certificates (to replace when they change).
    pub fn revocations(&self) -> &Arc<RevocationList> {
        &self.revocations
    }
}

/// A TCP listener whose connections come out handshaken. Dropping it
/// stops accepting.
#[derive(Debug)]
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsConnection, SocketAddr)>,
    local: SocketAddr,
    accepting: JoinHandle<()>,
    revocations: Arc<RevocationList>,
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl TlsListener {
    pub fn new(listener: TcpListener, tls: &ServerTls) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let (sender, ready) = mpsc::channel(READY_BACKLOG);
        let acceptor = TlsAcceptor::from(Arc::clone(&tls.config));
        let revocations = Arc::clone(&tls.revocations);
        let accepting = tokio::spawn(accept_loop(
            listener,
            acceptor,
            Arc::clone(&revocations),
            sender,
        ));
        Ok(Self {
            ready,
            local,
            accepting,
            revocations,
        })
    }

    /// The revocations its handshakes check (the server's, shared).
    pub fn revocations(&self) -> &Arc<RevocationList> {
        &self.revocations
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    revocations: Arc<RevocationList>,
    ready: mpsc::Sender<(TlsConnection, SocketAddr)>,
) {
    loop {
        let (stream, address) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors and the like: back off, as axum does.
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (acceptor, handed) = (acceptor.clone(), ready.clone());
        let revocations = Arc::clone(&revocations);
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => {
                    let connection = TlsConnection::new(stream, &revocations);
                    let _ = handed.send((connection, address)).await;
                }
                Ok(Err(error)) => tracing::debug!(%address, %error, "TLS handshake failed"),
                Err(_) => tracing::debug!(%address, "TLS handshake timed out"),
            }
        });
        if ready.is_closed() {
            return;
        }
    }
}

/// A handshaken connection that closes once the client's certificate is
/// revoked: its reads and writes then fail, which ends the connection and
/// every stream on it. Without a client certificate, a plain TLS stream.
pub struct TlsConnection {
    stream: TlsStream<TcpStream>,
    guard: Option<RevocationGuard>,
}

/// The client certificate of one connection, looked up again at every
/// replacement of the list.
struct RevocationGuard {
    certificate: CertInfo,
    list: Arc<RevocationList>,
    replaced: Pin<Box<dyn Future<Output = Option<watch::Receiver<u64>>> + Send>>,
    revoked: bool,
}

impl std::fmt::Debug for TlsConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnection")
            .field(
                "client_serial",
                &self.guard.as_ref().map(|g| &g.certificate.serial),
            )
            .field("revoked", &self.guard.as_ref().is_some_and(|g| g.revoked))
            .finish_non_exhaustive()
    }
}

/// Waits for the next replacement of the list; `None` once the list is
/// gone (the server with it).
async fn next_replacement(mut replaced: watch::Receiver<u64>) -> Option<watch::Receiver<u64>> {
    replaced.changed().await.ok()?;
    Some(replaced)
}

impl TlsConnection {
    fn new(stream: TlsStream<TcpStream>, list: &Arc<RevocationList>) -> Self {
        let certificate = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| CertInfo::parse(leaf.as_ref()).ok());
        let guard = certificate.map(|certificate| {
            // Subscribed before the first look, so a replacement between
            // the handshake and here is not missed.
            let replaced = list.replaced.subscribe();
            let revoked = list.current().check(&certificate).is_err();
            RevocationGuard {
                certificate,
                list: Arc::clone(list),
                replaced: Box::pin(next_replacement(replaced)),
                revoked,
            }
        });
        Self { stream, guard }
    }

    /// The TLS stream: the peer's certificates, the protocol.
    pub fn tls(&self) -> &TlsStream<TcpStream> {
        &self.stream
    }

    /// Whether the client's certificate has been revoked since the
    /// handshake; registers `cx` to be woken at the next replacement.
    fn poll_revoked(&mut self, cx: &mut Context<'_>) -> Result<(), io::Error> {
        let Some(guard) = &mut self.guard else {
            return Ok(());
        };
        while !guard.revoked {
            match guard.replaced.as_mut().poll(cx) {
                Poll::Pending => break,
                Poll::Ready(None) => {
                    guard.replaced = Box::pin(std::future::pending());
                    break;
                }
                Poll::Ready(Some(replaced)) => {
                    if let Err(revoked) = guard.list.current().check(&guard.certificate) {
                        tracing::warn!(%revoked, "closing a connection: its client certificate was revoked");
                        guard.revoked = true;
                    }
                    guard.replaced = Box::pin(next_replacement(replaced));
                }
            }
        }
        if guard.revoked {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "the client's certificate was revoked",
            ));
        }
        Ok(())
    }
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.poll_revoked(cx)?;
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_revoked(cx)?;
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_revoked(cx)?;
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Listener for TlsListener {
    type Io = TlsConnection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accept loop only ends once this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
