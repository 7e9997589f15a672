//! What a proxy changes in the messages it forwards, as pure functions on
//! headers: the host a request is for, the hop-by-hop headers that stay on
//! their own connection (RFC 9110 §7.6.1), `X-Forwarded-For/Proto/Host`
//! and `Forwarded` (RFC 7239) telling the backend who asked and how, and
//! the sticky cookie.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;

use cca_model::spec::{SameSite, Sticky};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Uri};

/// Headers that describe one connection, never forwarded.
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
// The same names where a reference must outlive the call.
static X_FORWARDED_FOR_NAME: HeaderName = X_FORWARDED_FOR;
static X_FORWARDED_PROTO_NAME: HeaderName = X_FORWARDED_PROTO;
static X_FORWARDED_HOST_NAME: HeaderName = X_FORWARDED_HOST;

/// The host a request is for, lowercase and without a port: the URI's
/// authority (HTTP/2, absolute-form) or the `Host` header.
pub fn request_host<'a>(uri: &'a Uri, headers: &'a HeaderMap) -> Option<Cow<'a, str>> {
    let raw = match uri.authority() {
        Some(authority) => authority.host(),
        None => strip_port(headers.get(header::HOST)?.to_str().ok()?),
    };
    let host = raw.trim_end_matches('.');
    if host.is_empty() {
        return None;
    }
    Some(if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    })
}

/// `host` without its `:port` (an IPv6 literal keeps its brackets).
pub fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        // An IPv6 literal: `[::1]:8080`.
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    host.rsplit_once(':')
        .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
        .map_or(host, |(name, _)| name)
}

/// Whether a request asks to switch protocols (a WebSocket handshake).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
}

/// Removes hop-by-hop headers, those the `Connection` header names
/// included; an upgrade keeps `Connection: upgrade` and `Upgrade`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    // Most messages carry few: one pass over the names says which.
    let mut present = 0u16;
    for name in headers.keys() {
        if let Some(bit) = hop_by_hop_bit(name) {
            present |= bit;
        }
    }
    if present & CONNECTION_BIT != 0 {
        // Owned copies (cheap: shared bytes) so the map can change; a
        // second `Connection` line is rare, and an empty Vec allocates
        // nothing.
        let mut listed = headers.get_all(header::CONNECTION).iter().cloned();
        let first = listed.next();
        let rest: Vec<HeaderValue> = listed.collect();
        for value in first.iter().chain(&rest) {
            remove_listed(headers, value);
        }
    }
    for (index, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << index) != 0 {
            headers.remove(name);
        }
    }
    if !upgrade && present & UPGRADE_BIT != 0 {
        headers.remove(header::UPGRADE);
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// `Connection` is the first of [`HOP_BY_HOP`].
const CONNECTION_BIT: u16 = 1;
const UPGRADE_BIT: u16 = 1 << HOP_BY_HOP.len();

/// The bit of a hop-by-hop name: its place in [`HOP_BY_HOP`], or
/// [`UPGRADE_BIT`]. Standard names compare as numbers; only a name as
/// long as a custom one on the list has its bytes compared.
fn hop_by_hop_bit(name: &HeaderName) -> Option<u16> {
    if name == header::UPGRADE {
        return Some(UPGRADE_BIT);
    }
    let length = name.as_str().len();
    HOP_BY_HOP
        .iter()
        .position(|listed| listed.as_str().len() == length && listed == name)
        .map(|index| 1 << index)
}

/// Removes the headers a `Connection` value names, but `Upgrade` (which
/// the caller settles) and the ones every message loses anyway.
fn remove_listed(headers: &mut HeaderMap, connection: &HeaderValue) {
    let Ok(connection) = connection.to_str() else {
        return;
    };
    for token in connection.split(',').map(str::trim) {
        if names_a_field(token.as_bytes()) {
            // By `&str`: looked up without allocating a name.
            headers.remove(token);
        }
    }
}

/// Whether a `Connection` token names a field the message loses on its
/// way: not `close`, nor `Upgrade` (an upgrade settles it), nor a field
/// every message loses anyway.
pub(crate) fn names_a_field(token: &[u8]) -> bool {
    !(token.is_empty()
        || token.eq_ignore_ascii_case(b"close")
        || token.eq_ignore_ascii_case(header::UPGRADE.as_str().as_bytes())
        || is_hop_by_hop(token))
}

/// Whether `name` (in any case) is a hop-by-hop field's, `Upgrade` but
/// one.
pub(crate) fn is_hop_by_hop(name: &[u8]) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|listed| listed.as_str().as_bytes().eq_ignore_ascii_case(name))
}

/// A client's address as the forwarding headers write it, worked out once
/// per connection.
#[derive(Debug)]
pub struct ClientAddress {
    pub address: SocketAddr,
    /// For `X-Forwarded-For`.
    listed: HeaderValue,
    /// For `Forwarded: for=` (an IPv6 address quoted and bracketed).
    node: String,
    /// The `Forwarded` value last written, for its scheme and host (a
    /// connection's requests are nearly always for one host).
    last_forwarded: Mutex<Option<(&'static str, HeaderValue, HeaderValue)>>,
}

impl ClientAddress {
    pub fn new(address: SocketAddr) -> Self {
        let ip = address.ip();
        let node = match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("\"[{v6}]\""),
        };
        let listed = HeaderValue::from_str(&ip.to_string())
            .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        Self {
            address,
            listed,
            node,
            last_forwarded: Mutex::new(None),
        }
    }

    /// This client's `Forwarded` element for `scheme` and `host`.
    fn forwarded(&self, scheme: &'static str, host: &HeaderValue) -> Option<HeaderValue> {
        let mut last = self
            .last_forwarded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((last_scheme, last_host, value)) = &*last
            && *last_scheme == scheme
            && last_host == host
        {
            return Some(value.clone());
        }
        let mut value = String::with_capacity(64);
        value.push_str("for=");
        value.push_str(&self.node);
        value.push_str(";proto=");
        value.push_str(scheme);
        value.push_str(";host=");
        push_quoted_if_needed(&mut value, host.to_str().unwrap_or_default());
        let value = HeaderValue::from_str(&value).ok()?;
        // A copy: the request's own value shares its connection's read
        // buffer, which this would keep for the connection's life.
        let host = HeaderValue::from_bytes(host.as_bytes()).ok()?;
        *last = Some((scheme, host, value.clone()));
        Some(value)
    }
}

/// Who asked and how, for the backend.
#[derive(Clone, Copy, Debug)]
pub struct Origin<'a> {
    pub client: &'a ClientAddress,
    /// `https` when the client's connection was TLS.
    pub scheme: &'static str,
    /// As the client wrote it (with its port, if any).
    pub host: &'a HeaderValue,
}

/// The forwarding fields of one request: the client's address after what
/// earlier proxies wrote in `X-Forwarded-For` and `Forwarded`, the
/// scheme in `X-Forwarded-Proto`, the host in `X-Forwarded-Host`, and
/// `Host` when the request had none (HTTP/2). They take the place of the
/// request's own fields of those names as its head is written, so the
/// request's header map is read, never changed.
#[derive(Debug)]
pub struct Forwarding {
    forwarded_for: HeaderValue,
    forwarded: Option<HeaderValue>,
    proto: HeaderValue,
    host: HeaderValue,
    add_host: bool,
}

impl Forwarding {
    pub fn of(headers: &HeaderMap, origin: Origin<'_>) -> Self {
        let client = origin.client;
        let forwarded_for = match existing(headers, &X_FORWARDED_FOR) {
            Some(earlier) => joined(earlier, client.ip()),
            None => None,
        }
        .unwrap_or_else(|| client.listed.clone());
        let forwarded = client.forwarded(origin.scheme, origin.host).map(|own| {
            match existing(headers, &header::FORWARDED) {
                Some(earlier) => joined(earlier, own.to_str().unwrap_or_default()).unwrap_or(own),
                None => own,
            }
        });
        Self {
            forwarded_for,
            forwarded,
            proto: HeaderValue::from_static(origin.scheme),
            host: origin.host.clone(),
            add_host: !headers.contains_key(header::HOST),
        }
    }

    /// Whether the request's own field `name` gives way to these.
    pub fn replaces(name: &HeaderName) -> bool {
        name == header::FORWARDED
            || name == X_FORWARDED_FOR
            || name == X_FORWARDED_PROTO
            || name == X_FORWARDED_HOST
    }

    /// The fields, written after the request's own.
    pub fn fields(&self) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
        [
            Some((&X_FORWARDED_FOR_NAME, &self.forwarded_for)),
            self.forwarded
                .as_ref()
                .map(|value| (&header::FORWARDED, value)),
            Some((&X_FORWARDED_PROTO_NAME, &self.proto)),
            Some((&X_FORWARDED_HOST_NAME, &self.host)),
            self.add_host.then_some((&header::HOST, &self.host)),
        ]
        .into_iter()
        .flatten()
    }
}

/// `earlier, own`, as one field value.
fn joined(earlier: &str, own: &str) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(format!("{earlier}, {own}"))).ok()
}

impl ClientAddress {
    fn ip(&self) -> &str {
        self.listed.to_str().unwrap_or_default()
    }
}

fn existing<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.trim().is_empty())
}

fn push_quoted_if_needed(out: &mut String, value: &str) {
    if value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
    {
        out.push_str(value);
    } else {
        out.push('"');
        out.extend(value.chars().filter(|c| *c != '"'));
        out.push('"');
    }
}

/// Whether a request can be sent again without changing its effect
/// (RFC 9110 §9.2.2).
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// The value of cookie `name` in a request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim_matches('"'))
}

/// The `Set-Cookie` that pins a session to the backend with `token`.
pub fn sticky_cookie(sticky: &Sticky, token: &str) -> Option<HeaderValue> {
    let same_site = match sticky.same_site {
        SameSite::Strict => "Strict",
        SameSite::Lax => "Lax",
        SameSite::None => "None",
    };
    let mut cookie = format!("{}={token}; Path=/; SameSite={same_site}", sticky.cookie);
    if sticky.secure {
        cookie.push_str("; Secure");
    }
    if sticky.http_only {
        cookie.push_str("; HttpOnly");
    }
    HeaderValue::from_str(&cookie).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).expect("value"));
        }
        map
    }

    #[test]
    fn the_host_comes_from_the_authority_or_the_host_header() {
        let h2: Uri = "https://Shop.Example.com:8443/x".parse().expect("uri");
        assert_eq!(
            request_host(&h2, &HeaderMap::new()).as_deref(),
            Some("shop.example.com")
        );
        let h1: Uri = "/x".parse().expect("uri");
        let host =
            |value: &str| request_host(&h1, &headers(&[("host", value)])).map(Cow::into_owned);
        assert_eq!(
            host("shop.example.com:80").as_deref(),
            Some("shop.example.com")
        );
        assert_eq!(
            host("SHOP.example.com.").as_deref(),
            Some("shop.example.com")
        );
        assert_eq!(host("[::1]:8080").as_deref(), Some("[::1]"));
        assert_eq!(request_host(&h1, &HeaderMap::new()), None);
    }

    #[test]
    fn hop_by_hop_headers_stay_behind() {
        let mut map = headers(&[
            ("connection", "keep-alive, x-private"),
            ("keep-alive", "timeout=5"),
            ("x-private", "secret"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("accept", "*/*"),
        ]);
        strip_hop_by_hop(&mut map, false);
        let names: Vec<&str> = map.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, vec!["accept"]);
    }

    #[test]
    fn an_upgrade_keeps_its_handshake() {
        let mut map = headers(&[("connection", "Upgrade"), ("upgrade", "websocket")]);
        assert!(is_upgrade(&map));
        strip_hop_by_hop(&mut map, true);
        assert_eq!(map["connection"], "upgrade");
        assert_eq!(map["upgrade"], "websocket");
    }

    /// `forwarding`'s fields set in `headers`, as a backend reads them.
    fn apply(forwarding: &Forwarding, headers: &mut HeaderMap) {
        for (name, value) in forwarding.fields() {
            headers.insert(name.clone(), value.clone());
        }
    }

    #[test]
    fn forwarded_headers_append_the_client() {
        let mut map = headers(&[
            ("x-forwarded-for", "198.51.100.7"),
            ("forwarded", "for=198.51.100.7"),
        ]);
        let client = ClientAddress::new("192.0.2.1:5555".parse().expect("addr"));
        let host = HeaderValue::from_static("shop.example.com");
        let origin = Origin {
            client: &client,
            scheme: "https",
            host: &host,
        };
        apply(&Forwarding::of(&map, origin), &mut map);
        assert_eq!(map["x-forwarded-for"], "198.51.100.7, 192.0.2.1");
        assert_eq!(
            map["forwarded"],
            "for=198.51.100.7, for=192.0.2.1;proto=https;host=shop.example.com"
        );
        assert_eq!(map["x-forwarded-proto"], "https");
        assert_eq!(map["x-forwarded-host"], "shop.example.com");
        assert_eq!(map["host"], "shop.example.com");
        let mut v6 = HeaderMap::new();
        let client = ClientAddress::new("[2001:db8::1]:5555".parse().expect("addr"));
        let host = HeaderValue::from_static("a:8080");
        let origin = Origin {
            client: &client,
            scheme: "http",
            host: &host,
        };
        apply(&Forwarding::of(&v6, origin), &mut v6);
        assert_eq!(
            v6["forwarded"],
            "for=\"[2001:db8::1]\";proto=http;host=\"a:8080\""
        );
    }

    #[test]
    fn the_sticky_cookie_round_trips() {
        let sticky = Sticky {
            cookie: "__CCA_STICKY_web".into(),
            secure: true,
            http_only: true,
            same_site: SameSite::Lax,
        };
        let set = sticky_cookie(&sticky, "00ff").expect("cookie");
        assert_eq!(
            set,
            "__CCA_STICKY_web=00ff; Path=/; SameSite=Lax; Secure; HttpOnly"
        );
        let map = headers(&[("cookie", "a=1; __CCA_STICKY_web=00ff; b=2")]);
        assert_eq!(cookie(&map, "__CCA_STICKY_web"), Some("00ff"));
        assert_eq!(cookie(&map, "missing"), None);
    }
}
