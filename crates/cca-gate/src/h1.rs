//! HTTP/1.1 framing as the gate reads and writes it (RFC 9112): request
//! heads from clients parsed with httparse into `http` types, response
//! heads from backends read with httparse into the fields the gate passes
//! on as they came ([`crate::passed`]), how long each body is (§6.3), a decoder
//! for the chunked coding that hands out data as it arrives, and the heads
//! the gate writes. Pure: bytes in, decisions out; the connections that
//! read and write are [`crate::upstream`]'s (backends) and
//! [`crate::serve_h1`]'s (clients).
//!
//! Whatever could let one message be read as two is refused rather than
//! guessed: lengths that disagree or are not plain digits, a chunk size
//! that is not hexadecimal or overflows, a chunk not closed by CRLF, bare
//! LF line ends in the chunked coding; from clients also a request framed
//! by both `Transfer-Encoding` and `Content-Length`, a transfer coding
//! other than a lone `chunked`, and an HTTP/1.1 request without exactly
//! one `Host`. A response framed both ways is read by `Transfer-Encoding`
//! (§6.3) and its connection closed after it.

use std::mem::MaybeUninit;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, StatusCode, Uri, Version};

use crate::passed::{Keep, PassedFields};

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
    /// The fields the gate passes on (see [`crate::passed`]).
    pub fields: PassedFields,
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
    // Left uninitialised: the parser writes what it finds, and setting
    // 128 empty fields first would cost more than parsing a small head.
    let mut fields = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut []);
    let parsing = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut parsed,
        buf,
        &mut fields,
    );
    let length = match parsing {
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
    let spans = FieldSpans::of(buf, parsed.headers);
    let head = buf.split_to(length);
    let fields = SpannedFields {
        spans: spans.spans(),
        head: &head,
    };
    let (framing, framed_twice) = response_framing(status, method, &fields)?;
    let keep_alive =
        !framed_twice && framing != Framing::UntilClose && connection_persists(version, &fields);
    let keep = Keep {
        upgrade: status == StatusCode::SWITCHING_PROTOCOLS,
        length: framing == Framing::Empty,
    };
    Ok(Some(ResponseHead {
        status,
        version,
        fields: PassedFields::of(fields.iter(), keep),
        framing,
        keep_alive,
    }))
}

/// The header fields of a head, however they are held.
pub(crate) trait FieldValues {
    /// The values of the fields named `name`, in order.
    fn values<'a>(&'a self, name: &'a HeaderName) -> impl Iterator<Item = &'a [u8]> + 'a;

    fn has(&self, name: &HeaderName) -> bool {
        self.values(name).next().is_some()
    }
}

impl FieldValues for HeaderMap {
    fn values<'a>(&'a self, name: &'a HeaderName) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.get_all(name).iter().map(HeaderValue::as_bytes)
    }

    fn has(&self, name: &HeaderName) -> bool {
        self.contains_key(name)
    }
}

/// A head's fields where httparse found them, read without a map.
struct SpannedFields<'a> {
    spans: &'a [FieldSpan],
    head: &'a [u8],
}

impl<'a> SpannedFields<'a> {
    /// Each field's name (as it came) and value.
    fn iter(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone + use<'a> {
        let head = self.head;
        self.spans.iter().map(move |field| {
            let (name, value) = (field.name, field.value);
            (
                &head[name.0 as usize..name.1 as usize],
                &head[value.0 as usize..value.1 as usize],
            )
        })
    }
}

impl FieldValues for SpannedFields<'_> {
    fn values<'a>(&'a self, name: &'a HeaderName) -> impl Iterator<Item = &'a [u8]> + 'a {
        let wanted = name.as_str().as_bytes();
        self.iter()
            .filter(move |(name, _)| name.eq_ignore_ascii_case(wanted))
            .map(|(_, value)| value)
    }
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
    headers: &impl FieldValues,
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
    let has_length = headers.has(&header::CONTENT_LENGTH);
    if headers.has(&header::TRANSFER_ENCODING) {
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
fn last_coding_is_chunked(headers: &impl FieldValues) -> bool {
    let last = headers
        .values(&header::TRANSFER_ENCODING)
        .flat_map(list_items)
        .last();
    last.is_some_and(|coding| coding.eq_ignore_ascii_case(b"chunked"))
}

/// The items of a comma-separated field value, trimmed, empty ones left
/// out (RFC 9110 §5.6.1).
pub(crate) fn list_items(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|item| !item.is_empty())
}

/// The body length `Content-Length` gives: every value (of every line,
/// comma-separated lists included) plain digits and the same.
pub(crate) fn content_length(headers: &impl FieldValues) -> Result<Option<u64>, FramingError> {
    let mut length = None;
    for value in headers.values(&header::CONTENT_LENGTH) {
        for item in value.split(|b| *b == b',') {
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
pub(crate) fn connection_persists(version: Version, headers: &impl FieldValues) -> bool {
    let listed = |token: &str| {
        headers
            .values(&header::CONNECTION)
            .flat_map(list_items)
            .any(|item| item.eq_ignore_ascii_case(token.as_bytes()))
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

/// Writes a request head to a backend: the request line, `fields` (about
/// `count` of them) but for any framing of their own, and the framing of
/// `body`.
pub fn write_request_head<'a>(
    out: &mut BytesMut,
    method: &Method,
    target: &str,
    fields: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>,
    count: usize,
    body: BodyLength,
) {
    out.reserve(64 + target.len() + count * 32);
    out.put_slice(method.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(target.as_bytes());
    out.put_slice(b" HTTP/1.1\r\n");
    for (name, value) in fields {
        if name != header::CONTENT_LENGTH && name != header::TRANSFER_ENCODING {
            put_field(out, name, value);
        }
    }
    match body {
        BodyLength::None => {}
        BodyLength::Known(length) => put_length(out, length),
        BodyLength::Chunked => out.put_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.put_slice(b"\r\n");
}

/// Writes one chunk of the chunked coding; an empty `data` writes the
/// last chunk and an empty trailer section, ending the body.
pub fn write_chunk(out: &mut BytesMut, data: &[u8]) {
    write_chunk_header(out, data.len());
    out.put_slice(data);
    out.put_slice(b"\r\n");
}

/// Writes the size line of a chunk of `size` bytes.
pub fn write_chunk_header(out: &mut BytesMut, size: usize) {
    let mut digits = [0u8; 16];
    let mut at = digits.len();
    let mut left = size;
    loop {
        at -= 1;
        digits[at] = b"0123456789abcdef"[left % 16];
        left /= 16;
        if left == 0 {
            break;
        }
    }
    out.put_slice(&digits[at..]);
    out.put_slice(b"\r\n");
}

/// One header field line.
fn put_field(out: &mut BytesMut, name: &HeaderName, value: &HeaderValue) {
    out.put_slice(name.as_str().as_bytes());
    out.put_slice(b": ");
    out.put_slice(value.as_bytes());
    out.put_slice(b"\r\n");
}

/// A `Content-Length` line.
fn put_length(out: &mut BytesMut, length: u64) {
    out.put_slice(b"content-length: ");
    out.put_slice(itoa(length, &mut [0; 20]));
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

/// A client's request head.
#[derive(Debug)]
pub struct RequestHead {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeaderMap,
    /// `Empty`, `Length` or `Chunked`: a request is never read to a close.
    pub framing: Framing,
    /// The client keeps the connection open after the response.
    pub keep_alive: bool,
    /// The client waits for `100 Continue` before sending its body.
    pub expect_continue: bool,
}

/// Why a client's request cannot be read; the gate answers
/// [`RequestError::status`] with this as the body and closes the
/// connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the request head is longer than {MAX_HEAD} bytes")]
    HeadTooLong,
    #[error("the request has more than {MAX_HEADERS} header fields")]
    TooManyHeaders,
    #[error("the request head is malformed: {0}")]
    Malformed(&'static str),
    #[error("an HTTP/1.1 request needs exactly one Host header")]
    Host,
    #[error("the request has both Transfer-Encoding and Content-Length")]
    FramedTwice,
    #[error(
        "the request's Transfer-Encoding is not a lone \"chunked\" (the only coding the gate reads)"
    )]
    Coding,
    #[error("the request has {0}")]
    Length(FramingError),
}

impl RequestError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::HeadTooLong | Self::TooManyHeaders => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::Coding => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// The fields a proxy adds to a request it forwards: `X-Forwarded-For`,
/// `-Proto`, `-Host` and `Forwarded`.
const FORWARDING_FIELDS: usize = 4;

/// Parses a request head at the start of `buf` and takes it off: `None`
/// while it is incomplete.
pub fn parse_request(buf: &mut BytesMut) -> Result<Option<RequestHead>, RequestError> {
    let mut fields = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut []);
    let length = match parsed.parse_with_uninit_headers(buf, &mut fields) {
        Ok(httparse::Status::Complete(length)) if length > MAX_HEAD => {
            return Err(RequestError::HeadTooLong);
        }
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err(RequestError::HeadTooLong);
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(RequestError::TooManyHeaders),
        Err(error) => return Err(RequestError::Malformed(parse_error(error))),
    };
    let method = parsed
        .method
        .and_then(|method| Method::from_bytes(method.as_bytes()).ok())
        .ok_or(RequestError::Malformed("an invalid method"))?;
    let target = span(buf, parsed.path.unwrap_or_default().as_bytes());
    let version = match parsed.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let spans = FieldSpans::of(buf, parsed.headers);
    let head = buf.split_to(length).freeze();
    let uri = Uri::from_maybe_shared(head.slice(target.0..target.1))
        .map_err(|_| RequestError::Malformed("an invalid request target"))?;
    let headers = spans
        .header_map(&head, FORWARDING_FIELDS)
        .map_err(RequestError::Malformed)?;
    if version == Version::HTTP_11 && headers.get_all(header::HOST).iter().count() != 1 {
        return Err(RequestError::Host);
    }
    let framing = request_framing(version, &headers)?;
    let keep_alive = connection_persists(version, &headers);
    let expect_continue = version == Version::HTTP_11
        && headers
            .get(header::EXPECT)
            .is_some_and(|expect| expect.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    Ok(Some(RequestHead {
        method,
        uri,
        version,
        headers,
        framing,
        keep_alive,
        expect_continue,
    }))
}

/// Where a head's header fields lie in it: noted while httparse borrows
/// the buffer, used once the head is split off as shared bytes, so that
/// each value is a slice of those bytes rather than a copy of its own.
/// A usual head's spans sit in a small array (zeroing room for the most a
/// head may have would cost more than the copies it saves).
#[expect(
    clippy::large_enum_variant,
    reason = "a stack temporary: the small array is what spares the usual head an allocation"
)]
enum FieldSpans {
    Few([FieldSpan; FEW_FIELDS], usize),
    Many(Vec<FieldSpan>),
}

/// More header fields than a usual request or response has.
const FEW_FIELDS: usize = 24;

/// Byte offsets in a head (at most [`MAX_HEAD`] long).
#[derive(Clone, Copy, Default)]
struct FieldSpan {
    name: (u32, u32),
    value: (u32, u32),
}

/// Where `part` lies in `buf` (an empty part may lie anywhere: the
/// empty span at the start then).
fn span(buf: &[u8], part: &[u8]) -> (usize, usize) {
    let start = (part.as_ptr() as usize).wrapping_sub(buf.as_ptr() as usize);
    if start
        .checked_add(part.len())
        .is_none_or(|end| end > buf.len())
    {
        return (0, 0);
    }
    (start, start + part.len())
}

impl FieldSpan {
    fn of(buf: &[u8], field: &httparse::Header<'_>) -> Self {
        let narrow = |(start, end): (usize, usize)| (start as u32, end as u32);
        Self {
            name: narrow(span(buf, field.name.as_bytes())),
            value: narrow(span(buf, field.value)),
        }
    }
}

impl FieldSpans {
    /// `buf` is at most [`MAX_HEAD`] long where the fields lie.
    fn of(buf: &[u8], fields: &[httparse::Header<'_>]) -> Self {
        let buf = &buf[..buf.len().min(MAX_HEAD)];
        if fields.len() > FEW_FIELDS {
            return Self::Many(
                fields
                    .iter()
                    .map(|field| FieldSpan::of(buf, field))
                    .collect(),
            );
        }
        let mut spans = [FieldSpan::default(); FEW_FIELDS];
        for (noted, field) in spans.iter_mut().zip(fields) {
            *noted = FieldSpan::of(buf, field);
        }
        Self::Few(spans, fields.len())
    }

    fn spans(&self) -> &[FieldSpan] {
        match self {
            Self::Few(spans, count) => &spans[..*count],
            Self::Many(spans) => spans,
        }
    }

    /// The fields as a map whose values share `head`, with room for
    /// `added` more (a map that grows allocates again).
    fn header_map(&self, head: &Bytes, added: usize) -> Result<HeaderMap, &'static str> {
        let spans = self.spans();
        let mut headers = HeaderMap::with_capacity(spans.len() + added);
        for field in spans {
            let (name, value) = (field.name, field.value);
            let name = HeaderName::from_bytes(&head[name.0 as usize..name.1 as usize])
                .map_err(|_| "an invalid header name")?;
            let value =
                HeaderValue::from_maybe_shared(head.slice(value.0 as usize..value.1 as usize))
                    .map_err(|_| "an invalid header value")?;
            headers.append(name, value);
        }
        Ok(headers)
    }
}

/// A map of `headers` whose values own their bytes: kept long (in the
/// cache), values sharing a connection's read buffer would keep all of it.
pub fn owned(headers: &HeaderMap) -> HeaderMap {
    let mut owned = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let mut copy = HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
        copy.set_sensitive(value.is_sensitive());
        owned.append(name.clone(), copy);
    }
    owned
}

/// How a request's body is delimited (RFC 9112 §6.3), refusing what two
/// readers could take differently.
fn request_framing(version: Version, headers: &HeaderMap) -> Result<Framing, RequestError> {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        if headers.contains_key(header::CONTENT_LENGTH) {
            return Err(RequestError::FramedTwice);
        }
        let mut codings = headers
            .get_all(header::TRANSFER_ENCODING)
            .iter()
            .flat_map(|value| list_items(value.as_bytes()));
        let lone_chunked = codings
            .next()
            .is_some_and(|coding| coding.eq_ignore_ascii_case(b"chunked"))
            && codings.next().is_none();
        if version != Version::HTTP_11 || !lone_chunked {
            return Err(RequestError::Coding);
        }
        return Ok(Framing::Chunked);
    }
    match content_length(headers).map_err(RequestError::Length)? {
        Some(0) | None => Ok(Framing::Empty),
        Some(length) => Ok(Framing::Length(length)),
    }
}

/// How the body of a response the gate writes is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseBody {
    /// No body follows (HEAD, 1xx, 204, 304): the framing headers are
    /// passed as they are, since they describe the resource.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// The chunked coding.
    Chunked,
    /// Until the connection closes (an HTTP/1.0 client, length unknown).
    UntilClose,
}

/// Writes a response head to a client: the status line, the backend's
/// `passed` fields, `headers` (but any framing of their own, unless `body`
/// is `None`), the framing of `body`, `Connection` as `persistence` says,
/// and `Date` when neither has one.
pub fn write_response_head(
    out: &mut BytesMut,
    status: StatusCode,
    passed: &PassedFields,
    headers: &HeaderMap,
    body: ResponseBody,
    persistence: Persistence,
) {
    out.reserve(128 + passed.lines().len() + headers.len() * 48);
    out.put_slice(b"HTTP/1.1 ");
    out.put_slice(status.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.put_slice(b"\r\n");
    let framed = body != ResponseBody::None;
    passed.put(out, framed);
    for (name, value) in headers {
        if framed && (name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING) {
            continue;
        }
        if persistence == Persistence::AsIs || name != header::CONNECTION {
            put_field(out, name, value);
        }
    }
    match body {
        ResponseBody::Length(length) => put_length(out, length),
        ResponseBody::Chunked => out.put_slice(b"transfer-encoding: chunked\r\n"),
        ResponseBody::None | ResponseBody::UntilClose => {}
    }
    match persistence {
        Persistence::Close => out.put_slice(b"connection: close\r\n"),
        Persistence::KeepAlive => out.put_slice(b"connection: keep-alive\r\n"),
        Persistence::Default | Persistence::AsIs => {}
    }
    if !passed.has_date() && !headers.contains_key(header::DATE) {
        out.put_slice(b"date: ");
        put_date(out);
        out.put_slice(b"\r\n");
    }
    out.put_slice(b"\r\n");
}

/// What a response's `Connection` header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// Nothing: HTTP/1.1 persists by default.
    Default,
    /// `Connection: keep-alive`, for an HTTP/1.0 client that asked.
    KeepAlive,
    /// `Connection: close`.
    Close,
    /// The response's own (`Connection: upgrade` of a `101`).
    AsIs,
}

/// The current time as an IMF-fixdate, formatted once a second per
/// thread.
fn put_date(out: &mut BytesMut) {
    thread_local! {
        static DATE: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((0, String::new())) };
    }
    let now = cca_model::clock::system_now();
    let second = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    DATE.with_borrow_mut(|(at, date)| {
        if *at != second || date.is_empty() {
            *at = second;
            *date = httpdate::fmt_http_date(now);
        }
        out.put_slice(date.as_bytes());
    });
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
        assert_eq!(head.fields.lines(), b"X-A: 1\r\nX-A: 2\r\n");
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
            headers.iter(),
            headers.len(),
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
            HeaderMap::new().iter(),
            0,
            BodyLength::None,
        );
        assert_eq!(&out[..], b"GET / HTTP/1.1\r\n\r\n");
        out.clear();
        write_request_head(
            &mut out,
            &Method::PUT,
            "/",
            HeaderMap::new().iter(),
            0,
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

    fn request(raw: &str) -> Result<Option<RequestHead>, RequestError> {
        parse_request(&mut BytesMut::from(raw))
    }

    #[test]
    fn a_request_head_is_parsed_with_its_framing_and_persistence() {
        let mut buf = BytesMut::from(
            "POST /cart?id=1 HTTP/1.1\r\nHost: shop\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\nabcGET",
        );
        let head = parse_request(&mut buf).expect("valid").expect("complete");
        assert_eq!(head.method, Method::POST);
        assert_eq!(head.uri, "/cart?id=1");
        assert_eq!(head.framing, Framing::Length(3));
        assert!(head.keep_alive);
        assert!(head.expect_continue);
        assert_eq!(&buf[..], b"abcGET", "the body and what follows stay");
        let old = request("GET / HTTP/1.0\r\n\r\n")
            .expect("valid")
            .expect("complete");
        assert!(!old.keep_alive, "HTTP/1.0 closes unless asked");
        assert_eq!(old.framing, Framing::Empty);
        let chunked = request("PUT / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
            .expect("valid")
            .expect("complete");
        assert_eq!(chunked.framing, Framing::Chunked);
        assert!(
            request("GET / HTTP/1.1\r\nHost: a\r\n")
                .expect("valid")
                .is_none()
        );
    }

    #[test]
    fn requests_two_readers_could_frame_differently_are_refused() {
        let cases = [
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                RequestError::FramedTwice,
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                RequestError::Coding,
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                RequestError::Coding,
            ),
            (
                "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
                RequestError::Coding,
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
                RequestError::Length(FramingError::ConflictingLength),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -3\r\n\r\n",
                RequestError::Length(FramingError::InvalidLength("-3".into())),
            ),
            ("GET / HTTP/1.1\r\n\r\n", RequestError::Host),
            (
                "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
                RequestError::Host,
            ),
        ];
        for (raw, expected) in cases {
            let refused = request(raw).expect_err(raw);
            assert_eq!(refused, expected, "{raw}");
        }
        assert_eq!(RequestError::Coding.status(), StatusCode::NOT_IMPLEMENTED);
        assert_eq!(RequestError::Host.status(), StatusCode::BAD_REQUEST);
        let malformed = request("GET /a b HTTP/1.1\r\nHost: a\r\n\r\n").expect_err("malformed");
        assert_eq!(malformed.status(), StatusCode::BAD_REQUEST);
        assert!(matches!(
            request("GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n"),
            Err(RequestError::Malformed(_))
        ));
    }

    #[test]
    fn request_heads_too_large_are_431() {
        let long = format!("GET / HTTP/1.1\r\nHost: a\r\nX: {}", "a".repeat(MAX_HEAD));
        let refused = request(&long).expect_err("too long");
        assert_eq!(refused, RequestError::HeadTooLong);
        assert_eq!(
            refused.status(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
        let many: String = (0..=MAX_HEADERS).map(|n| format!("X-{n}: 1\r\n")).collect();
        let refused =
            request(&format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n")).expect_err("many");
        assert_eq!(refused, RequestError::TooManyHeaders);
    }

    #[test]
    fn response_heads_carry_framing_connection_and_date() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        headers.insert(header::CONNECTION, HeaderValue::from_static("x-private"));
        headers.insert("x-a", HeaderValue::from_static("1"));
        let mut out = BytesMut::new();
        write_response_head(
            &mut out,
            StatusCode::OK,
            &PassedFields::default(),
            &headers,
            ResponseBody::Length(2),
            Persistence::KeepAlive,
        );
        let text = String::from_utf8(out.to_vec()).expect("text");
        assert!(
            text.starts_with(
                "HTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 2\r\nconnection: keep-alive\r\ndate: "
            ),
            "{text}"
        );
        assert!(text.ends_with(" GMT\r\n\r\n"), "{text}");
        out.clear();
        headers.insert(
            header::DATE,
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        write_response_head(
            &mut out,
            StatusCode::NOT_MODIFIED,
            &PassedFields::default(),
            &headers,
            ResponseBody::None,
            Persistence::Close,
        );
        let text = String::from_utf8(out.to_vec()).expect("text");
        assert_eq!(
            text,
            "HTTP/1.1 304 Not Modified\r\ncontent-length: 999\r\nx-a: 1\r\n\
             date: Sun, 06 Nov 1994 08:49:37 GMT\r\nconnection: close\r\n\r\n",
            "a bodiless response keeps its length; the connection header is the gate's"
        );
    }

    #[test]
    fn a_backends_fields_go_first_as_they_came_and_its_date_stands() {
        let passed = head(
            "HTTP/1.1 200 OK\r\nX-Backend: 1\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\
             Content-Length: 5\r\nConnection: keep-alive\r\n\r\n",
        )
        .fields;
        let mut headers = HeaderMap::new();
        headers.insert(header::SET_COOKIE, HeaderValue::from_static("s=1"));
        let mut out = BytesMut::new();
        write_response_head(
            &mut out,
            StatusCode::OK,
            &passed,
            &headers,
            ResponseBody::Length(5),
            Persistence::Default,
        );
        assert_eq!(
            String::from_utf8(out.to_vec()).expect("text"),
            "HTTP/1.1 200 OK\r\nX-Backend: 1\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\
             set-cookie: s=1\r\ncontent-length: 5\r\n\r\n"
        );
    }

    #[test]
    fn heads_with_many_fields_keep_every_one_and_values_share_the_head() {
        let many: String = (0..40).map(|n| format!("X-{n}: value {n}\r\n")).collect();
        let raw = format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n");
        let head = request(&raw).expect("valid").expect("complete");
        assert_eq!(head.headers.len(), 41);
        assert_eq!(head.headers["x-39"], "value 39");
        let few = head_of_fields(3);
        let few = few.fields.header_map(0);
        assert_eq!(few["x-2"], "value 2");
        assert_eq!(few["x-0"], "value 0");
    }

    fn head_of_fields(count: usize) -> ResponseHead {
        let fields: String = (0..count)
            .map(|n| format!("X-{n}: value {n}\r\n"))
            .collect();
        head(&format!(
            "HTTP/1.1 200 OK\r\n{fields}Content-Length: 0\r\n\r\n"
        ))
    }
}
