//! A backend response's header fields on their way to the client, kept as
//! the lines the gate writes rather than as a map. Reading a response head
//! ([`crate::h1::parse_response`]) settles the few fields the gate acts
//! on — the framing, `Connection` and the fields it names, the other
//! hop-by-hop fields, `Date` — and copies the rest, line by line, into one
//! buffer; a client served over HTTP/1.1 then gets them in one copy. A
//! map is made of them only where one is read: for an HTTP/2 client, for
//! the cache, for a test ([`Answer::into_response`]).
//!
//! A backend's response passes a proxy on every request: built into a
//! map, its fields cost a lookup or an allocation each, a hash, and a walk
//! to strip and another to write, for fields the gate mostly never reads.

use bytes::{BufMut, Bytes, BytesMut};
use hyper::Response;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};

use crate::forward;
use crate::h1::list_items;

/// A backend's header fields as the gate passes them on: `name: value`
/// lines, names as the backend wrote them. Empty for a response the gate
/// made itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassedFields {
    lines: Bytes,
    has_date: bool,
    /// A `Content-Length` line is among them (a response without a body).
    has_length: bool,
}

/// What a response keeps beyond what every response keeps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Keep {
    /// `Upgrade`: the response switches protocols.
    pub upgrade: bool,
    /// `Content-Length`: the response has no body, so its length describes
    /// the resource and is no framing the gate replaces.
    pub length: bool,
}

impl PassedFields {
    /// The fields of `fields` (names and values of a head httparse
    /// accepted) that a proxy passes on: all but the hop-by-hop ones, the
    /// ones `Connection` names, and those `keep` does not keep.
    pub(crate) fn of<'a, I>(fields: I, keep: Keep) -> Self
    where
        I: Iterator<Item = (&'a [u8], &'a [u8])> + Clone,
    {
        let connection = |(name, _): &(&[u8], &[u8])| name.eq_ignore_ascii_case(b"connection");
        let names_fields = fields
            .clone()
            .filter(connection)
            .any(|(_, value)| list_items(value).any(forward::names_a_field));
        let listed = |name: &[u8]| {
            names_fields
                && fields.clone().filter(connection).any(|(_, value)| {
                    list_items(value).any(|token| {
                        forward::names_a_field(token) && token.eq_ignore_ascii_case(name)
                    })
                })
        };
        let room = fields
            .clone()
            .map(|(name, value)| name.len() + value.len() + 4)
            .sum();
        let mut lines = BytesMut::with_capacity(room);
        let mut has_date = false;
        let mut has_length = false;
        for (name, value) in fields.clone() {
            if !passes(name, keep) || listed(name) {
                continue;
            }
            has_date |= name.eq_ignore_ascii_case(b"date");
            has_length |= is_length(name);
            lines.put_slice(name);
            lines.put_slice(b": ");
            lines.put_slice(value);
            lines.put_slice(b"\r\n");
        }
        Self {
            lines: lines.freeze(),
            has_date,
            has_length,
        }
    }

    /// The fields as lines ready to write in a head.
    pub fn lines(&self) -> &[u8] {
        &self.lines
    }

    /// Writes the lines into `out`; with `framed`, but any
    /// `Content-Length` (the gate frames the body it writes; only a
    /// response without one keeps the backend's).
    pub fn put(&self, out: &mut BytesMut, framed: bool) {
        if !(framed && self.has_length) {
            out.put_slice(&self.lines);
            return;
        }
        for line in self.lines.split_inclusive(|b| *b == b'\n') {
            let name = line.split(|b| *b == b':').next().unwrap_or_default();
            if !is_length(name) {
                out.put_slice(line);
            }
        }
    }

    /// Whether the backend gave the response a `Date`.
    pub fn has_date(&self) -> bool {
        self.has_date
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// The fields as a map (values share the lines), with room for
    /// `added` more.
    pub fn header_map(&self, added: usize) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(self.count() + added);
        for (name, value) in self.fields() {
            map.append(name, value);
        }
        map
    }

    fn count(&self) -> usize {
        self.lines.iter().filter(|b| **b == b'\n').count()
    }

    /// Each field as a name and a value. Every line was a field httparse
    /// accepted, whose bytes are those `http`'s types take; a line that
    /// were not would be left out of the map, loudly.
    fn fields(&self) -> impl Iterator<Item = (HeaderName, HeaderValue)> + '_ {
        let mut at = 0;
        std::iter::from_fn(move || {
            loop {
                let rest = &self.lines[at..];
                let end = rest.windows(2).position(|pair| pair == b"\r\n")?;
                let line = at..at + end;
                at += end + 2;
                let colon = self.lines[line.clone()]
                    .iter()
                    .position(|b| *b == b':')
                    .map(|colon| line.start + colon);
                let field = colon.and_then(|colon| {
                    let name = HeaderName::from_bytes(&self.lines[line.start..colon]).ok()?;
                    let value_at = (colon + 2).min(line.end);
                    let value =
                        HeaderValue::from_maybe_shared(self.lines.slice(value_at..line.end))
                            .ok()?;
                    Some((name, value))
                });
                match field {
                    Some(field) => return Some(field),
                    None => tracing::warn!(
                        line = %String::from_utf8_lossy(&self.lines[line]),
                        "a backend's header field could not be passed to the client"
                    ),
                }
            }
        })
    }
}

fn is_length(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"content-length")
}

/// Whether a field of this name passes to the client.
fn passes(name: &[u8], keep: Keep) -> bool {
    if is_length(name) {
        return keep.length;
    }
    if name.eq_ignore_ascii_case(b"upgrade") {
        return keep.upgrade;
    }
    !forward::is_hop_by_hop(name)
}

/// A response as the proxy answers a request: its map holds the fields the
/// gate set, and a backend's own fields travel beside it as `passed`, to
/// be written ahead of those.
#[derive(Debug)]
pub struct Answer<B> {
    pub response: Response<B>,
    pub passed: PassedFields,
}

impl<B> Answer<B> {
    /// The response with every field in its map: the backend's first,
    /// then the gate's.
    pub fn into_response(self) -> Response<B> {
        if self.passed.is_empty() {
            return self.response;
        }
        let (mut parts, body) = self.response.into_parts();
        let mut map = self.passed.header_map(parts.headers.len());
        // Appended, not inserted: the gate's `Set-Cookie` joins the
        // backend's.
        let mut last = None;
        for (name, value) in parts.headers {
            if let Some(name) = name {
                last = Some(name);
            }
            if let Some(name) = &last {
                map.append(name.clone(), value);
            }
        }
        parts.headers = map;
        Response::from_parts(parts, body)
    }

    pub fn map<C>(self, body: impl FnOnce(B) -> C) -> Answer<C> {
        Answer {
            response: self.response.map(body),
            passed: self.passed,
        }
    }
}

impl<B> From<Response<B>> for Answer<B> {
    fn from(response: Response<B>) -> Self {
        Self {
            response,
            passed: PassedFields::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use hyper::Method;

    use super::*;
    use crate::h1::parse_response;

    fn passed(raw: &str, method: Method) -> PassedFields {
        parse_response(&mut BytesMut::from(raw), &method)
            .expect("valid")
            .expect("complete")
            .fields
    }

    #[test]
    fn hop_by_hop_fields_and_those_connection_names_stay_behind() {
        let fields = passed(
            "HTTP/1.1 200 OK\r\nServer: b\r\nConnection: keep-alive, x-private\r\n\
             Keep-Alive: timeout=5\r\nX-Private: secret\r\nTransfer-Encoding: chunked\r\n\
             CONNECTION: X-Other\r\nx-other: 1\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\
             Upgrade: h2c\r\nx-empty:\r\n\r\n",
            Method::GET,
        );
        assert_eq!(
            std::str::from_utf8(fields.lines()).expect("text"),
            "Server: b\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nx-empty: \r\n",
            "names in any case, from every Connection line"
        );
        assert!(!fields.has_date());
        let map = fields.header_map(0);
        assert_eq!(map.len(), 4);
        assert_eq!(map.get_all("set-cookie").iter().count(), 2);
        assert_eq!(map["x-empty"], "");
    }

    #[test]
    fn the_length_is_framing_only_where_a_body_follows() {
        let head =
            "HTTP/1.1 200 OK\r\nContent-Length: 7\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\n";
        let with_body = passed(head, Method::GET);
        assert_eq!(
            with_body.header_map(0).get("content-length"),
            None,
            "the gate frames the body it writes"
        );
        assert!(with_body.has_date());
        let bodiless = passed(head, Method::HEAD);
        assert_eq!(bodiless.header_map(0)["content-length"], "7");
    }

    #[test]
    fn a_switch_of_protocols_keeps_its_upgrade() {
        for connection in ["Upgrade", "Upgrade, X-Foo"] {
            let fields = passed(
                &format!(
                    "HTTP/1.1 101 Switching Protocols\r\nConnection: {connection}\r\n\
                     Upgrade: websocket\r\nX-Foo: 1\r\nX-Bar: 2\r\n\r\n"
                ),
                Method::GET,
            );
            let expected: &[u8] = if connection.contains("X-Foo") {
                b"Upgrade: websocket\r\nX-Bar: 2\r\n"
            } else {
                b"Upgrade: websocket\r\nX-Foo: 1\r\nX-Bar: 2\r\n"
            };
            assert_eq!(fields.lines(), expected, "Connection: {connection}");
        }
    }

    #[test]
    fn a_kept_length_never_goes_out_beside_the_gates_framing() {
        let bodiless = passed(
            "HTTP/1.1 200 OK\r\nX-A: 1\r\ncontent-length: 7\r\nX-B: 2\r\n\r\n",
            Method::HEAD,
        );
        let mut out = BytesMut::new();
        bodiless.put(&mut out, false);
        assert_eq!(&out[..], b"X-A: 1\r\ncontent-length: 7\r\nX-B: 2\r\n");
        out.clear();
        bodiless.put(&mut out, true);
        assert_eq!(&out[..], b"X-A: 1\r\nX-B: 2\r\n");
    }

    #[test]
    fn every_name_and_value_httparse_accepts_converts_to_a_map() {
        // Every token character in a name, every byte a value may hold.
        let name = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let value: Vec<u8> = (0x21..=0x7e).chain(0x80..=0xff).collect();
        let mut raw = format!("HTTP/1.1 200 OK\r\n{name}: ").into_bytes();
        raw.extend_from_slice(&value);
        raw.extend_from_slice(b"\r\n\r\n");
        let fields = parse_response(&mut BytesMut::from(&raw[..]), &Method::GET)
            .expect("valid")
            .expect("complete")
            .fields;
        let map = fields.header_map(0);
        assert_eq!(map.len(), 1, "no field was lost");
        assert_eq!(
            map[name.to_ascii_lowercase().as_str()].as_bytes(),
            &value[..]
        );
    }

    #[test]
    fn an_answer_puts_the_gates_fields_after_the_backends() {
        let mut response = Response::new(());
        response
            .headers_mut()
            .append("set-cookie", HeaderValue::from_static("sticky=1"));
        response
            .headers_mut()
            .append("set-cookie", HeaderValue::from_static("other=2"));
        let answer = Answer {
            response,
            passed: passed(
                "HTTP/1.1 200 OK\r\nSet-Cookie: own=0\r\nContent-Length: 0\r\n\r\n",
                Method::GET,
            ),
        };
        let response = answer.into_response();
        let cookies: Vec<_> = response.headers().get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["own=0", "sticky=1", "other=2"]);
    }
}
