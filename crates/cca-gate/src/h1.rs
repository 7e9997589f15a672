//! HTTP/1.1 framing as the gate reads and writes it on its backend
//! connections (RFC 9112): a response head parsed with httparse into
//! `http` types, how long its body is (§6.3), a decoder for the chunked
//! coding that hands out data as it arrives, and the request head the
//! gate writes. Pure: bytes in, decisions out; the connections that read
//! and write are [`crate::upstream`]'s.
//!
//! Whatever could let one message be read as two is refused rather than
//! guessed: lengths that disagree or are not plain digits, a chunk size
//! that is not hexadecimal or overflows, a chunk not closed by CRLF, bare
//! LF line ends in the chunked coding. A response framed by both
//! `Transfer-Encoding` and `Content-Length` is read by the first (§6.3)
//! and its connection closed after it.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, StatusCode, Version};

/// Longest response head the gate reads.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in one response head.
pub const MAX_HEADERS: usize = 128;
/// Longest chunk-size line (with its extensions) and longest trailer
/// section.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 16 * 1024;

/// Why a message could not be read: what in it is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("a head longer than {MAX_HEAD} bytes")]
    HeadTooLong,
    #[error("a malformed head ({0})")]
    Head(&'static str),
    #[error("Content-Length values that disagree")]
    ConflictingLength,
    #[error("an invalid Content-Length {0:?}")]
    InvalidLength(String),
    #[error("a chunk size that is not a hexadecimal number")]
    ChunkSize,
    #[error("a chunk not followed by CRLF")]
    ChunkEnd,
    #[error("a line of the chunked coding that ends in a bare LF")]
    BareLf,
    #[error("a chunk-size line longer than {MAX_CHUNK_LINE} bytes")]
    ChunkLineTooLong,
    #[error("trailers longer than {MAX_TRAILERS} bytes")]
    TrailersTooLong,
}

/// How a message's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// This many bytes.
    Length(u64),
    /// The chunked coding.
    Chunked,
    /// Everything until the backend closes the connection.
    UntilClose,
}

/// A backend's response head.
#[derive(Debug)]
pub struct ResponseHead {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// The connection may carry another request once the body is read.
    pub keep_alive: bool,
}

/// Parses a response head at the start of `buf` and takes it off:
/// `None` while it is incomplete. `method` is the request's, which
/// decides whether the response has a body (HEAD).
pub fn parse_response(
    buf: &mut BytesMut,
    method: &Method,
) -> Result<Option<ResponseHead>, FramingError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut fields);
    let length = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err(FramingError::HeadTooLong);
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(FramingError::Head("more than 128 header fields"));
        }
        Err(error) => return Err(FramingError::Head(parse_error(error))),
    };
    if length > MAX_HEAD {
        return Err(FramingError::HeadTooLong);
    }
    let status = parsed
        .code
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or(FramingError::Head("no valid status code"))?;
    let version = match parsed.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let mut headers = HeaderMap::with_capacity(parsed.headers.len());
    for field in parsed.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| FramingError::Head("an invalid header name"))?;
        let value = HeaderValue::from_bytes(field.value)
            .map_err(|_| FramingError::Head("an invalid header value"))?;
        headers.append(name, value);
    }
    buf.advance(length);
    let (framing, framed_twice) = response_framing(status, method, &headers)?;
    let keep_alive =
        !framed_twice && framing != Framing::UntilClose && connection_persists(version, &headers);
    Ok(Some(ResponseHead {
        status,
        version,
        headers,
        framing,
        keep_alive,
    }))
}

fn parse_error(error: httparse::Error) -> &'static str {
    match error {
        httparse::Error::HeaderName => "an invalid header name",
        httparse::Error::HeaderValue => "an invalid header value",
        httparse::Error::NewLine => "an invalid line end",
        httparse::Error::Status => "an invalid status code",
        httparse::Error::Version => "not HTTP/1.x",
        httparse::Error::Token => "an invalid token",
        httparse::Error::TooManyHeaders => "more than 128 header fields",
    }
}

/// How a response's body is delimited (RFC 9112 §6.3), and whether it
/// was framed both ways (its connection must close after it).
fn response_framing(
    status: StatusCode,
    method: &Method,
    headers: &HeaderMap,
) -> Result<(Framing, bool), FramingError> {
    if *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok((Framing::Empty, false));
    }
    if *method == Method::CONNECT && status.is_success() {
        // A tunnel: what follows is not HTTP.
        return Ok((Framing::UntilClose, false));
    }
    let has_length = headers.contains_key(header::CONTENT_LENGTH);
    if headers.contains_key(header::TRANSFER_ENCODING) {
        let framing = if last_coding_is_chunked(headers) {
            Framing::Chunked
        } else {
            Framing::UntilClose
        };
        return Ok((framing, has_length));
    }
    match content_length(headers)? {
        Some(length) => Ok((Framing::Length(length), false)),
        None => Ok((Framing::UntilClose, false)),
    }
}

/// Whether the final transfer coding is `chunked`.
fn last_coding_is_chunked(headers: &HeaderMap) -> bool {
    let last = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|value| value.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .rfind(|coding| !coding.is_empty());
    last.is_some_and(|coding| coding.eq_ignore_ascii_case(b"chunked"))
}

/// The body length `Content-Length` gives: every value (of every line,
/// comma-separated lists included) plain digits and the same.
pub fn content_length(headers: &HeaderMap) -> Result<Option<u64>, FramingError> {
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for item in value.as_bytes().split(|b| *b == b',') {
            let item = item.trim_ascii();
            let parsed = std::str::from_utf8(item)
                .ok()
                .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|digits| digits.parse::<u64>().ok())
                .ok_or_else(|| {
                    FramingError::InvalidLength(String::from_utf8_lossy(item).into_owned())
                })?;
            if length.is_some_and(|seen| seen != parsed) {
                return Err(FramingError::ConflictingLength);
            }
            length = Some(parsed);
        }
    }
    Ok(length)
}

/// Whether a message's connection stays open after it: HTTP/1.1 unless
/// `Connection: close`, HTTP/1.0 only with `Connection: keep-alive`.
pub fn connection_persists(version: Version, headers: &HeaderMap) -> bool {
    let listed = |token: &str| {
        headers
            .get_all(header::CONNECTION)
            .iter()
            .flat_map(|value| value.as_bytes().split(|b| *b == b','))
            .any(|item| item.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
    };
    if version == Version::HTTP_10 {
        listed("keep-alive")
    } else {
        !listed("close")
    }
}

/// One step of [`ChunkedDecoder::decode`].
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes.
    Data(Bytes),
    /// The buffer holds no more of the body; read more.
    NeedMore,
    /// The body (and its trailers) ended.
    Done,
}

/// Decodes the chunked coding (RFC 9112 §7.1) from a buffer that fills
/// as bytes arrive. Trailers are read and dropped.
#[derive(Debug, Default)]
pub struct ChunkedDecoder {
    state: ChunkState,
    trailers: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    Data(u64),
    DataEnd,
    Trailers,
    Done,
}

impl ChunkedDecoder {
    /// Takes what it can of the body off the front of `buf`.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, FramingError> {
        loop {
            match self.state {
                ChunkState::Size => {
                    let Some(end) = line_end(buf, MAX_CHUNK_LINE)? else {
                        return Ok(Decoded::NeedMore);
                    };
                    let size = chunk_size(&buf[..end])?;
                    buf.advance(end + 2);
                    self.state = if size == 0 {
                        ChunkState::Trailers
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let taken = left.min(buf.len() as u64);
                    self.state = if taken == left {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left - taken)
                    };
                    return Ok(Decoded::Data(buf.split_to(taken as usize).freeze()));
                }
                ChunkState::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(Decoded::NeedMore);
                    }
                    if buf[..2] != *b"\r\n" {
                        return Err(FramingError::ChunkEnd);
                    }
                    buf.advance(2);
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailers => {
                    let room = MAX_TRAILERS.saturating_sub(self.trailers);
                    let end = match line_end(buf, room) {
                        Ok(Some(end)) => end,
                        Ok(None) => return Ok(Decoded::NeedMore),
                        Err(FramingError::ChunkLineTooLong) => {
                            return Err(FramingError::TrailersTooLong);
                        }
                        Err(error) => return Err(error),
                    };
                    buf.advance(end + 2);
                    self.trailers += end + 2;
                    if self.trailers > MAX_TRAILERS {
                        return Err(FramingError::TrailersTooLong);
                    }
                    if end == 0 {
                        self.state = ChunkState::Done;
                    }
                }
                ChunkState::Done => return Ok(Decoded::Done),
            }
        }
    }

    /// Whether the body ended.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }
}

/// Where the CRLF ending the first line of `buf` starts; `None` while it
/// has not arrived (and the line is shorter than `limit`).
fn line_end(buf: &[u8], limit: usize) -> Result<Option<usize>, FramingError> {
    let window = &buf[..buf.len().min(limit + 2)];
    match window.iter().position(|b| *b == b'\n') {
        Some(0) => Err(FramingError::BareLf),
        Some(newline) if window[newline - 1] != b'\r' => Err(FramingError::BareLf),
        Some(newline) => Ok(Some(newline - 1)),
        None if window.len() > limit => Err(FramingError::ChunkLineTooLong),
        None => Ok(None),
    }
}

/// The size on a chunk-size line (extensions after `;` ignored).
fn chunk_size(line: &[u8]) -> Result<u64, FramingError> {
    let digits = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    // Sixteen hex digits would overflow what a length can be used for.
    if digits == 0 || digits > 15 {
        return Err(FramingError::ChunkSize);
    }
    let rest = line[digits..].trim_ascii_start();
    if !(rest.is_empty() || rest[0] == b';') {
        return Err(FramingError::ChunkSize);
    }
    let hex = std::str::from_utf8(&line[..digits]).map_err(|_| FramingError::ChunkSize)?;
    u64::from_str_radix(hex, 16).map_err(|_| FramingError::ChunkSize)
}

/// How the body of a request the gate writes is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// No body (and none announced: a GET).
    None,
    /// Exactly this many bytes (`Content-Length`).
    Known(u64),
    /// Length unknown: the chunked coding.
    Chunked,
}

/// Writes a request head to a backend: the request line, `headers` but
/// for any framing of their own, and the framing of `body`.
pub fn write_request_head(
    out: &mut BytesMut,
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    body: BodyLength,
) {
    out.reserve(64 + target.len() + headers.len() * 32);
    out.put_slice(method.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(target.as_bytes());
    out.put_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            continue;
        }
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    match body {
        BodyLength::None => {}
        BodyLength::Known(length) => {
            out.put_slice(b"content-length: ");
            out.put_slice(itoa(length, &mut [0; 20]));
            out.put_slice(b"\r\n");
        }
        BodyLength::Chunked => out.put_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.put_slice(b"\r\n");
}

/// Writes one chunk of the chunked coding; an empty `data` writes the
/// last chunk and an empty trailer section, ending the body.
pub fn write_chunk(out: &mut BytesMut, data: &[u8]) {
    let mut size = [0u8; 16];
    let mut at = size.len();
    let mut left = data.len();
    loop {
        at -= 1;
        size[at] = b"0123456789abcdef"[left % 16];
        left /= 16;
        if left == 0 {
            break;
        }
    }
    out.put_slice(&size[at..]);
    out.put_slice(b"\r\n");
    out.put_slice(data);
    out.put_slice(b"\r\n");
}

/// `value` in decimal, in `digits`.
fn itoa(mut value: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            return &digits[at..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str, method: Method) -> Result<Option<ResponseHead>, FramingError> {
        parse_response(&mut BytesMut::from(raw), &method)
    }

    fn head(raw: &str) -> ResponseHead {
        parse(raw, Method::GET).expect("valid").expect("complete")
    }

    #[test]
    fn a_response_head_is_parsed_and_taken_off_the_buffer() {
        let mut buf =
            BytesMut::from("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\n\r\nhello");
        let head = parse_response(&mut buf, &Method::GET)
            .expect("valid")
            .expect("complete");
        assert_eq!(head.status, StatusCode::OK);
        assert_eq!(head.framing, Framing::Length(5));
        assert!(head.keep_alive);
        assert_eq!(head.headers.get_all("x-a").iter().count(), 2);
        assert_eq!(&buf[..], b"hello");
        let mut partial = BytesMut::from("HTTP/1.1 200 OK\r\nContent-Le");
        assert!(
            parse_response(&mut partial, &Method::GET)
                .expect("valid")
                .is_none()
        );
        assert_eq!(partial.len(), 27, "nothing taken while incomplete");
    }

    #[test]
    fn bodiless_responses_ignore_their_framing_headers() {
        for raw in [
            "HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n",
            "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 100 Continue\r\n\r\n",
        ] {
            assert_eq!(head(raw).framing, Framing::Empty, "{raw}");
        }
        let to_head = parse("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", Method::HEAD)
            .expect("valid")
            .expect("complete");
        assert_eq!(to_head.framing, Framing::Empty);
        assert!(to_head.keep_alive);
    }

    #[test]
    fn transfer_encoding_wins_over_content_length_and_closes_the_connection() {
        let both =
            head("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(both.framing, Framing::Chunked);
        assert!(
            !both.keep_alive,
            "a doubly framed response closes its connection"
        );
        let gzip_last = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n");
        assert_eq!(gzip_last.framing, Framing::UntilClose);
        assert!(!gzip_last.keep_alive);
        let chunked_last = head(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: Chunked\r\n\r\n",
        );
        assert_eq!(chunked_last.framing, Framing::Chunked);
        assert!(chunked_last.keep_alive);
    }

    #[test]
    fn lengths_that_disagree_or_are_not_digits_are_refused() {
        let same = head("HTTP/1.1 200 OK\r\nContent-Length: 4, 4\r\nContent-Length: 4\r\n\r\n");
        assert_eq!(same.framing, Framing::Length(4));
        assert_eq!(
            parse(
                "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n",
                Method::GET
            )
            .err(),
            Some(FramingError::ConflictingLength)
        );
        for bad in ["+4", "-1", "4 4", "0x10", "", "99999999999999999999999"] {
            let raw = format!("HTTP/1.1 200 OK\r\nContent-Length: {bad}\r\n\r\n");
            assert!(
                matches!(
                    parse(&raw, Method::GET),
                    Err(FramingError::InvalidLength(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn connection_persistence_follows_the_version_and_connection_header() {
        assert!(
            !head("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").keep_alive
        );
        assert!(!head("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n").keep_alive);
        assert!(
            head("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n")
                .keep_alive
        );
        let until_close = head("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(until_close.framing, Framing::UntilClose);
        assert!(!until_close.keep_alive);
    }

    #[test]
    fn oversized_and_malformed_heads_are_errors() {
        let long = format!("HTTP/1.1 200 OK\r\nX-Big: {}\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(
            parse(&long, Method::GET).err(),
            Some(FramingError::HeadTooLong)
        );
        assert!(matches!(
            parse("HTTP/2 200 OK\r\n\r\n", Method::GET),
            Err(FramingError::Head(_))
        ));
        let many: String = (0..=MAX_HEADERS).map(|n| format!("X-{n}: 1\r\n")).collect();
        let raw = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
        assert_eq!(
            parse(&raw, Method::GET).err(),
            Some(FramingError::Head("more than 128 header fields"))
        );
    }

    /// Decodes `raw` fed in pieces of `piece` bytes: the data and whether
    /// the body ended.
    fn decode_in_pieces(raw: &[u8], piece: usize) -> Result<(Vec<u8>, bool, usize), FramingError> {
        let mut decoder = ChunkedDecoder::default();
        let mut buf = BytesMut::new();
        let mut data = Vec::new();
        let mut fed = 0;
        for part in raw.chunks(piece.max(1)) {
            buf.extend_from_slice(part);
            fed += part.len();
            loop {
                match decoder.decode(&mut buf)? {
                    Decoded::Data(bytes) => data.extend_from_slice(&bytes),
                    Decoded::NeedMore => break,
                    Decoded::Done => return Ok((data, true, buf.len() + raw.len() - fed)),
                }
            }
        }
        Ok((data, decoder.is_done(), buf.len()))
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_pieces_they_arrive_in() {
        let raw = b"5;ext=1\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-Trailer: t\r\n\r\nNEXT";
        for piece in 1..raw.len() {
            let (data, done, left) = decode_in_pieces(raw, piece).expect("valid");
            assert_eq!(data, b"helloabcdefghijklmnopqrstuvwxyz", "piece {piece}");
            assert!(done);
            assert_eq!(left, 4, "the next message stays in the buffer");
        }
    }

    #[test]
    fn malformed_chunked_bodies_are_refused() {
        let cases: [(&[u8], FramingError); 6] = [
            (b"x\r\n", FramingError::ChunkSize),
            (b"5 x\r\nhello\r\n", FramingError::ChunkSize),
            (b"1000000000000000\r\n", FramingError::ChunkSize),
            (b"5\nhello\r\n", FramingError::BareLf),
            (b"5\r\nhelloXY", FramingError::ChunkEnd),
            (b"0\r\nX: 1\n\r\n", FramingError::BareLf),
        ];
        for (raw, expected) in cases {
            assert_eq!(
                decode_in_pieces(raw, raw.len()).err(),
                Some(expected),
                "{raw:?}"
            );
        }
        let long_line = format!("5;{}\r\n", "e".repeat(MAX_CHUNK_LINE));
        assert_eq!(
            decode_in_pieces(long_line.as_bytes(), 64).err(),
            Some(FramingError::ChunkLineTooLong)
        );
        let long_trailers = format!("0\r\n{}", "X: y\r\n".repeat(MAX_TRAILERS / 6 + 1));
        assert_eq!(
            decode_in_pieces(long_trailers.as_bytes(), 64).err(),
            Some(FramingError::TrailersTooLong)
        );
    }

    #[test]
    fn request_heads_carry_the_framing_of_their_body() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("shop"));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("gzip"));
        let mut out = BytesMut::new();
        write_request_head(
            &mut out,
            &Method::POST,
            "/a?b",
            &headers,
            BodyLength::Known(12),
        );
        assert_eq!(
            &out[..],
            b"POST /a?b HTTP/1.1\r\nhost: shop\r\ncontent-length: 12\r\n\r\n"
        );
        out.clear();
        write_request_head(
            &mut out,
            &Method::GET,
            "/",
            &HeaderMap::new(),
            BodyLength::None,
        );
        assert_eq!(&out[..], b"GET / HTTP/1.1\r\n\r\n");
        out.clear();
        write_request_head(
            &mut out,
            &Method::PUT,
            "/",
            &HeaderMap::new(),
            BodyLength::Chunked,
        );
        assert_eq!(
            &out[..],
            b"PUT / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
        );
    }

    #[test]
    fn written_chunks_decode_back() {
        let mut out = BytesMut::new();
        write_chunk(&mut out, &[7u8; 300]);
        write_chunk(&mut out, b"z");
        write_chunk(&mut out, b"");
        assert!(out.ends_with(b"\r\n0\r\n\r\n"));
        assert!(out.starts_with(b"12c\r\n"));
        let (data, done, _) = decode_in_pieces(&out, 7).expect("valid");
        assert_eq!(data.len(), 301);
        assert!(done);
    }
}
