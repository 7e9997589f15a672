//! Forwarding names outside the zone to the host's resolvers. The server
//! never recurses itself: it relays the client's packet as it is (EDNS and
//! all) under a fresh random ID from a fresh socket, to each upstream in
//! turn until one answers, over UDP and then TCP when the answer comes back
//! truncated to a TCP client. The upstreams come from a `resolv.conf`
//! (re-read when it changes, checked at most every [`RECHECK`]) without the
//! nameservers that would lead back to this server.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use hickory_proto::op::{Header, Query};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::answer::Transport;

/// How often a changed `resolv.conf` is noticed, at most.
pub const RECHECK: Duration = Duration::from_secs(5);
/// The most upstreams tried for one query (glibc's MAXNS).
const MAX_UPSTREAMS: usize = 3;
/// The resolvers' port: `resolv.conf` cannot name another.
const DNS_PORT: u16 = 53;

/// Where the upstream resolvers come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Upstreams {
    /// The `nameserver` lines of this `resolv.conf`, port 53.
    ResolvConf(PathBuf),
    /// These addresses, in order (tests, or a node that names its own).
    Fixed(Vec<SocketAddr>),
}

impl Default for Upstreams {
    fn default() -> Self {
        Upstreams::ResolvConf(PathBuf::from("/etc/resolv.conf"))
    }
}

/// The nameservers a `resolv.conf` names, in order, the first
/// [`MAX_UPSTREAMS`] only (as glibc reads it); lines it cannot read are
/// skipped, as the libc resolver skips them.
pub fn parse_resolv_conf(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next())
                .flatten()?
                .parse()
                .ok()
        })
        .take(MAX_UPSTREAMS)
        .collect()
}

/// Whether a resolver at `upstream` is this server itself: one of its
/// listen addresses (a wildcard one catches loopback), or an address the
/// owner said reaches it through NAT (`also_self`, any port).
pub fn points_back(upstream: SocketAddr, listen: &[SocketAddr], also_self: &[IpAddr]) -> bool {
    also_self.contains(&upstream.ip())
        || listen.iter().any(|own| {
            own.port() == upstream.port()
                && (own.ip() == upstream.ip()
                    || (own.ip().is_unspecified() && upstream.ip().is_loopback()))
        })
}

/// Why one exchange with an upstream failed (logged, then the next one is
/// tried; the client gets SERVFAIL when none answers).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExchangeError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("the answer is longer than 65,535 bytes or has no header")]
    Malformed,
}

/// The upstream list in use and when it was read.
#[derive(Debug)]
struct Cached {
    upstreams: Arc<[SocketAddr]>,
    checked: Option<Instant>,
    modified: Option<SystemTime>,
}

/// The forwarding half of the server, shared by its loops.
#[derive(Debug)]
pub(crate) struct Forwarder {
    source: Upstreams,
    listen: Vec<SocketAddr>,
    also_self: Vec<IpAddr>,
    timeout: Duration,
    cached: Mutex<Cached>,
    permits: Arc<Semaphore>,
}

impl Forwarder {
    pub(crate) fn new(
        source: Upstreams,
        listen: Vec<SocketAddr>,
        also_self: Vec<IpAddr>,
        timeout: Duration,
        max_in_flight: usize,
    ) -> Forwarder {
        Forwarder {
            source,
            listen,
            also_self,
            timeout,
            cached: Mutex::new(Cached {
                upstreams: Arc::from(Vec::new()),
                checked: None,
                modified: None,
            }),
            permits: Arc::new(Semaphore::new(max_in_flight.max(1))),
        }
    }

    /// A slot for one forward, or `None` when [`Forwarder::new`]'s
    /// `max_in_flight` are already out (the caller answers SERVFAIL: a
    /// queue would only answer later what the client has given up on).
    pub(crate) fn permit(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().try_acquire_owned().ok()
    }

    /// The upstreams now, re-reading the `resolv.conf` when it changed.
    pub(crate) fn upstreams(&self) -> Arc<[SocketAddr]> {
        let path = match &self.source {
            Upstreams::Fixed(addresses) => {
                return self.usable(addresses.iter().copied());
            }
            Upstreams::ResolvConf(path) => path,
        };
        let mut cached = self
            .cached
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let now = Instant::now();
        if cached
            .checked
            .is_some_and(|checked| now.duration_since(checked) < RECHECK)
        {
            return cached.upstreams.clone();
        }
        cached.checked = Some(now);
        let modified = std::fs::metadata(path)
            .and_then(|meta| meta.modified())
            .ok();
        if modified.is_some() && modified == cached.modified {
            return cached.upstreams.clone();
        }
        cached.modified = modified;
        cached.upstreams = match std::fs::read_to_string(path) {
            Ok(text) => self.usable(
                parse_resolv_conf(&text)
                    .into_iter()
                    .map(|ip| SocketAddr::new(ip, DNS_PORT)),
            ),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "cannot read the upstream resolvers: names outside the zone get SERVFAIL until it can be read");
                Arc::from(Vec::new())
            }
        };
        cached.upstreams.clone()
    }

    fn usable(&self, addresses: impl Iterator<Item = SocketAddr>) -> Arc<[SocketAddr]> {
        addresses
            .filter(|upstream| !points_back(*upstream, &self.listen, &self.also_self))
            .collect()
    }

    /// The first upstream answer to `query` (a query packet the answer
    /// logic judged outside the zone), with the client's ID; `None` when no
    /// upstream answered. A TCP client's truncated answer is asked again
    /// over TCP; a UDP client gets it truncated and asks us over TCP.
    pub(crate) async fn forward(&self, query: &[u8], transport: Transport) -> Option<Vec<u8>> {
        let question = question_end(query)?;
        let upstreams = self.upstreams();
        if upstreams.is_empty() {
            tracing::debug!("no upstream resolver to forward to");
            return None;
        }
        for upstream in upstreams.iter() {
            let result = match self.exchange_udp(*upstream, query, question).await {
                Ok(answer) if truncated(&answer) && transport == Transport::Tcp => {
                    match self.exchange_tcp(*upstream, query, question).await {
                        Ok(full) => Ok(full),
                        // The truncated answer is still an answer.
                        Err(_) => Ok(answer),
                    }
                }
                other => other,
            };
            match result {
                Ok(mut answer) => {
                    answer[..2].copy_from_slice(&query[..2]);
                    return Some(answer);
                }
                Err(error) => {
                    tracing::debug!(%upstream, %error, "upstream resolver failed; trying the next");
                }
            }
        }
        None
    }

    async fn exchange_udp(
        &self,
        upstream: SocketAddr,
        query: &[u8],
        question: usize,
    ) -> Result<Vec<u8>, ExchangeError> {
        let local: IpAddr = match upstream {
            SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
            SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
        };
        // A fresh socket per forward: a random source port and ID are what
        // keep a spoofed answer out.
        let socket = UdpSocket::bind(SocketAddr::new(local, 0)).await?;
        socket.connect(upstream).await?;
        let (packet, id) = with_fresh_id(query);
        socket.send(&packet).await?;
        let mut buffer = vec![0u8; usize::from(u16::MAX)];
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            let len = tokio::time::timeout_at(deadline, socket.recv(&mut buffer))
                .await
                .map_err(|_| ExchangeError::Timeout(self.timeout))??;
            if answers(&buffer[..len], id, &packet[..question]) {
                buffer.truncate(len);
                return Ok(buffer);
            }
        }
    }

    async fn exchange_tcp(
        &self,
        upstream: SocketAddr,
        query: &[u8],
        question: usize,
    ) -> Result<Vec<u8>, ExchangeError> {
        let exchange = async {
            let mut stream = TcpStream::connect(upstream).await?;
            let (packet, id) = with_fresh_id(query);
            let len = u16::try_from(packet.len()).map_err(|_| ExchangeError::Malformed)?;
            let mut framed = Vec::with_capacity(packet.len() + 2);
            framed.extend_from_slice(&len.to_be_bytes());
            framed.extend_from_slice(&packet);
            stream.write_all(&framed).await?;
            loop {
                let len = stream.read_u16().await?;
                let mut answer = vec![0u8; usize::from(len)];
                stream.read_exact(&mut answer).await?;
                if answers(&answer, id, &packet[..question]) {
                    return Ok(answer);
                }
            }
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| ExchangeError::Timeout(self.timeout))?
    }
}

/// Where the question of a one-question query ends (its header and
/// question are what an answer must echo).
fn question_end(query: &[u8]) -> Option<usize> {
    let mut decoder = BinDecoder::new(query);
    let header = Header::read(&mut decoder).ok()?;
    if header.counts.queries != 1 {
        return None;
    }
    Query::read(&mut decoder).ok()?;
    Some(decoder.index())
}

/// `query` under a new random ID, and that ID.
fn with_fresh_id(query: &[u8]) -> (Vec<u8>, u16) {
    let id = fastrand::u16(..);
    let mut packet = query.to_vec();
    packet[..2].copy_from_slice(&id.to_be_bytes());
    (packet, id)
}

/// Whether `answer` is a response to the query whose header and question
/// are `asked` (with the ID `id`): same ID, QR set, one question, the same
/// question bytes.
fn answers(answer: &[u8], id: u16, asked: &[u8]) -> bool {
    answer.len() >= asked.len()
        && answer[..2] == id.to_be_bytes()
        && answer[2] & 0x80 != 0
        && answer[4..6] == [0, 1]
        && answer[12..asked.len()] == asked[12..]
}

fn truncated(answer: &[u8]) -> bool {
    answer.get(2).is_some_and(|flags| flags & 0x02 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_gives_the_first_three_nameservers_in_order() {
        let text = "# generated\nsearch example.org\nnameserver 10.0.0.2\n\
                    nameserver   fe80::1%eth0\nnameserver not-an-address\n\
                    options ndots:5\nnameserver ::1\nnameserver 10.0.0.3\n\
                    nameserver 10.0.0.4\n";
        assert_eq!(
            parse_resolv_conf(text),
            vec![
                "10.0.0.2".parse::<IpAddr>().unwrap(),
                "::1".parse().unwrap(),
                "10.0.0.3".parse().unwrap(),
            ]
        );
        assert!(parse_resolv_conf("").is_empty());
    }

    #[test]
    fn a_nameserver_that_is_this_server_is_not_an_upstream() {
        let on_53: SocketAddr = "0.0.0.0:53".parse().unwrap();
        let on_15353: SocketAddr = "10.0.0.9:15353".parse().unwrap();
        let upstream = |text: &str| text.parse::<SocketAddr>().unwrap();
        // A wildcard listener on 53 catches loopback resolvers.
        assert!(points_back(upstream("127.0.0.53:53"), &[on_53], &[]));
        assert!(!points_back(upstream("10.0.0.2:53"), &[on_53], &[]));
        // The usual port 15353 never matches a resolv.conf entry...
        assert!(!points_back(upstream("10.0.0.9:53"), &[on_15353], &[]));
        // ...unless the owner says that address reaches us through NAT.
        let nat: IpAddr = "10.0.0.9".parse().unwrap();
        assert!(points_back(upstream("10.0.0.9:53"), &[on_15353], &[nat]));
    }

    #[test]
    fn an_answer_must_echo_id_and_question() {
        let asked = [
            0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'a', 0, 0, 1, 0, 1,
        ];
        let mut answer = asked.to_vec();
        answer[2] |= 0x80;
        assert!(answers(&answer, 0x1234, &asked));
        assert!(!answers(&answer, 0x1235, &asked));
        let mut other = answer.clone();
        other[13] = b'b';
        assert!(!answers(&other, 0x1234, &asked));
        assert!(!answers(&asked, 0x1234, &asked), "a query is no answer");
        assert!(!answers(&answer[..5], 0x1234, &asked));
        assert_eq!(question_end(&asked), Some(asked.len()));
        assert_eq!(question_end(&asked[..15]), None);
    }
}
