//! HTTP/1 message heads: parsing with httparse, and the framing and connection rules of
//! RFC 9112 that decide where a body ends and whether a connection may carry another message.
//!
//! Parsing copies the head once into the message's [`HeaderList`] (names lowercased in place)
//! and keeps spans, so nothing is allocated per message once the buffers are warm. The request
//! rules are strict where leniency lets two parsers disagree (request smuggling): a request
//! with both Content-Length and Transfer-Encoding, differing Content-Lengths, a transfer coding
//! other than `chunked`, more than one Host, or bytes outside the grammar gets a 4xx/5xx and
//! the connection is closed.

use crate::headers::{HeaderList, Span};
use http::Method;
use std::mem::MaybeUninit;

/// Most fields a head may have (hyper's default too).
pub(crate) const MAX_FIELDS: usize = 100;

/// How a message body is delimited (RFC 9112 §6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body.
    #[default]
    None,
    Length(u64),
    Chunked,
    /// Until the connection closes (responses only).
    Eof,
}

/// Why a head was refused; each maps to the status the client gets (requests) or to a 502
/// (responses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HeadError {
    /// 400 with a reason for the log.
    Bad(&'static str),
    /// 431: too many fields (the size limit is the caller's, on the buffer).
    TooManyFields,
    /// 501: a transfer coding other than `chunked`.
    UnsupportedCoding,
    /// 505: not HTTP/1.x.
    Version,
    /// The request line names no HTTP version at all: the peer is not speaking HTTP/1 (an
    /// invalid HTTP/2 preface, TLS to a cleartext port), so an HTTP/1 answer would be noise
    /// to it; the connection is closed without one.
    NotHttp,
}

impl HeadError {
    pub(crate) fn status(self) -> u16 {
        match self {
            HeadError::Bad(_) | HeadError::NotHttp => 400,
            HeadError::TooManyFields => 431,
            HeadError::UnsupportedCoding => 501,
            HeadError::Version => 505,
        }
    }

    pub(crate) fn reason(self) -> &'static str {
        match self {
            HeadError::Bad(why) => why,
            HeadError::TooManyFields => "too many header fields",
            HeadError::UnsupportedCoding => "unsupported transfer coding",
            HeadError::Version => "unsupported HTTP version",
            HeadError::NotHttp => "not an HTTP/1 request line",
        }
    }
}

impl From<httparse::Error> for HeadError {
    fn from(e: httparse::Error) -> Self {
        match e {
            httparse::Error::TooManyHeaders => HeadError::TooManyFields,
            httparse::Error::Version => HeadError::Version,
            httparse::Error::HeaderName => HeadError::Bad("invalid header name"),
            httparse::Error::HeaderValue => HeadError::Bad("invalid header value"),
            httparse::Error::NewLine => HeadError::Bad("invalid line ending"),
            httparse::Error::Status => HeadError::Bad("invalid status"),
            httparse::Error::Token => HeadError::Bad("invalid token"),
        }
    }
}

/// Tokens of a `Connection` field.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ConnectionTokens {
    pub close: bool,
    pub keep_alive: bool,
    pub upgrade: bool,
    /// Other tokens: names of fields that are hop-by-hop for this message.
    pub others: bool,
}

impl ConnectionTokens {
    fn add(&mut self, value: &[u8]) {
        for token in value.split(|&b| b == b',') {
            let token = token.trim_ascii();
            if token.is_empty() {
                continue;
            }
            if token.eq_ignore_ascii_case(b"close") {
                self.close = true;
            } else if token.eq_ignore_ascii_case(b"keep-alive") {
                self.keep_alive = true;
            } else if token.eq_ignore_ascii_case(b"upgrade") {
                self.upgrade = true;
            } else {
                self.others = true;
            }
        }
    }
}

/// Whether a field name is one of those that `Connection` lists in `headers`.
pub(crate) fn listed_in_connection(headers: &HeaderList, name: &[u8]) -> bool {
    headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(b"connection"))
        .flat_map(|(_, v)| v.split(|&b| b == b','))
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(name))
}

/// Removes `Connection` and the fields it names (hop-by-hop for this message; its tokens were
/// read into [`ConnectionTokens`] already). Runs before the route's filters, so a client (or
/// a backend) cannot name a field a filter adds and have it removed on the way out. Names
/// must be lower case.
pub(crate) fn strip_connection_listed(headers: &mut HeaderList) {
    let listed: Vec<Vec<u8>> = headers
        .iter()
        .filter(|(n, _)| *n == b"connection")
        .flat_map(|(_, v)| v.split(|&b| b == b','))
        .map(|t| t.trim_ascii().to_ascii_lowercase())
        .filter(|t| !t.is_empty() && !matches!(&t[..], b"close" | b"keep-alive" | b"upgrade"))
        .collect();
    for name in listed {
        headers.remove_all(&name);
    }
    headers.remove_all(b"connection");
}

/// Content-Length: digits only, repeated fields (or a list) must agree.
fn content_length(value: &[u8], seen: &mut Option<u64>) -> Result<(), ()> {
    for part in value.split(|&b| b == b',') {
        let part = part.trim_ascii();
        if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
            return Err(());
        }
        let n = part.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
        match seen {
            Some(prev) if *prev != n => return Err(()),
            _ => *seen = Some(n),
        }
    }
    Ok(())
}

/// Transfer-Encoding fields: whether `chunked` is the final coding, and whether any coding
/// other than `chunked` appears.
#[derive(Clone, Copy, Debug, Default)]
struct Codings {
    present: bool,
    chunked_last: bool,
    chunked_count: usize,
    other: bool,
}

impl Codings {
    fn add(&mut self, value: &[u8]) {
        self.present = true;
        for coding in value.split(|&b| b == b',') {
            // Parameters (`;q=...`) are not part of the coding name.
            let name = coding
                .split(|&b| b == b';')
                .next()
                .unwrap_or(b"")
                .trim_ascii();
            if name.is_empty() {
                continue;
            }
            if name.eq_ignore_ascii_case(b"chunked") {
                self.chunked_count += 1;
                self.chunked_last = true;
            } else {
                self.other = true;
                self.chunked_last = false;
            }
        }
    }
}

/// A parsed request head. Reused for every request of a connection.
#[derive(Debug, Default)]
pub(crate) struct RequestHead {
    pub method: Method,
    pub http10: bool,
    /// The origin-form target, fragment removed: `path[?query]`.
    pub target: String,
    /// Where the path ends in `target` (the `?`, or its length).
    pub path_end: usize,
    pub headers: HeaderList,
    pub body: Framing,
    /// The client allows another request on this connection after this one.
    pub keep_alive: bool,
    /// The first Host value, in `headers`.
    pub host: Option<Span>,
    pub connection: ConnectionTokens,
    /// `Connection: upgrade` with an `Upgrade` field: a protocol switch.
    pub upgrade: bool,
    /// The target is not in origin form (absolute-form, `*`, CONNECT's authority-form).
    pub unusual_target: bool,
}

impl RequestHead {
    pub(crate) fn path(&self) -> &str {
        &self.target[..self.path_end]
    }

    pub(crate) fn query(&self) -> Option<&str> {
        self.target.get(self.path_end + 1..)
    }

    pub(crate) fn host(&self) -> Option<&[u8]> {
        self.host.map(|s| self.headers.bytes(s))
    }

    /// Parses `data` (what has been read so far). `Ok(None)`: the head is not complete yet.
    /// `Ok(Some(n))`: the head is the first `n` bytes.
    pub(crate) fn parse(&mut self, data: &[u8]) -> Result<Option<usize>, HeadError> {
        let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
        let mut req = httparse::Request::new(&mut []);
        let len = match req.parse_with_uninit_headers(data, &mut fields) {
            Ok(httparse::Status::Partial) => return Ok(None),
            Ok(httparse::Status::Complete(n)) => n,
            Err(httparse::Error::Version) if !names_http_version(data) => {
                let Some(end) = data.iter().position(|&b| b == b'\n') else {
                    // Garbage or a bad target: the rest of the line tells which.
                    return Ok(None);
                };
                if data[..end].windows(5).any(|w| w == b"HTTP/") {
                    // `GET /a b HTTP/1.1`: httparse reads `b` as the version; a bad target.
                    return Err(HeadError::Bad("invalid request line"));
                }
                return Err(HeadError::NotHttp);
            }
            Err(e) => return Err(e.into()),
        };
        let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version)
        else {
            return Err(HeadError::Bad("incomplete request line"));
        };
        self.method =
            Method::from_bytes(method.as_bytes()).map_err(|_| HeadError::Bad("invalid method"))?;
        self.http10 = version == 0;
        self.set_target(target.as_bytes())?;

        self.headers.clear();
        self.headers.buf_mut().extend_from_slice(&data[..len]);
        let base = data.as_ptr() as usize;
        let span = |s: &[u8]| span_in(base, len, s);
        self.host = None;
        self.connection = ConnectionTokens::default();
        let mut hosts = 0;
        let mut length = None;
        let mut codings = Codings::default();
        let mut has_upgrade = false;
        for f in req.headers.iter() {
            let (name, value) = (span(f.name.as_bytes()), span(f.value));
            self.headers.push_spans(name, value);
            let value = f.value;
            // Lowercased by push_spans; read the list's copy.
            match self.headers.bytes(name) {
                b"host" => {
                    hosts += 1;
                    if self.host.is_none() {
                        self.host = Some(span(value.trim_ascii()));
                    }
                }
                b"content-length" => {
                    content_length(value, &mut length)
                        .map_err(|()| HeadError::Bad("invalid or conflicting Content-Length"))?;
                }
                b"transfer-encoding" => codings.add(value),
                b"connection" => self.connection.add(value),
                // `h2c` asks this hop to switch to HTTP/2 (removed in RFC 9113): not an
                // upgrade to forward, the request goes on as an ordinary one.
                b"upgrade" => {
                    has_upgrade |= value
                        .split(|&b| b == b',')
                        .any(|t| !t.trim_ascii().eq_ignore_ascii_case(b"h2c"));
                }
                _ => {}
            }
        }
        if hosts > 1 {
            return Err(HeadError::Bad("more than one Host field"));
        }
        if hosts == 0 && !self.http10 {
            return Err(HeadError::Bad("HTTP/1.1 request without Host"));
        }
        // RFC 9110 §7.2: Host is uri-host[:port], never userinfo@host (which would be routed
        // on one name and forwarded with another).
        if self.host().is_some_and(|h| h.contains(&b'@')) {
            return Err(HeadError::Bad("userinfo in Host"));
        }
        self.body = match (codings.present, length) {
            (true, Some(_)) => {
                return Err(HeadError::Bad("both Content-Length and Transfer-Encoding"));
            }
            (true, None) if self.http10 => {
                return Err(HeadError::Bad("Transfer-Encoding in an HTTP/1.0 request"));
            }
            (true, None) => {
                if codings.other {
                    return Err(HeadError::UnsupportedCoding);
                }
                if !codings.chunked_last || codings.chunked_count != 1 {
                    return Err(HeadError::Bad("chunked must be the last coding, once"));
                }
                Framing::Chunked
            }
            (false, Some(n)) => Framing::Length(n),
            (false, None) => Framing::None,
        };
        self.keep_alive = if self.http10 {
            self.connection.keep_alive && !self.connection.close
        } else {
            !self.connection.close
        };
        self.upgrade = self.connection.upgrade && has_upgrade && !self.http10;
        Ok(Some(len))
    }

    fn set_target(&mut self, raw: &[u8]) -> Result<(), HeadError> {
        self.target.clear();
        self.unusual_target = raw.first() != Some(&b'/');
        // The fragment is not sent to the origin (RFC 9110 §4.2.5); http::Uri drops it too.
        let raw = match raw.iter().position(|&b| b == b'#') {
            Some(i) => &raw[..i],
            None => raw,
        };
        // httparse admits 0x21-0x7e and 0x80-0xff; the router works on `&str`.
        let target = std::str::from_utf8(raw).map_err(|_| HeadError::Bad("target is not UTF-8"))?;
        let path_end = target.find('?').unwrap_or(target.len());
        // Origin-form paths are normalised here, once, before anything matches on them (the
        // other forms go to the hyper path, which does the same).
        let normal = if self.unusual_target {
            None
        } else {
            crate::path::normalize(&target[..path_end]).map_err(|e| HeadError::Bad(e.reason()))?
        };
        match normal {
            Some(path) => {
                self.target.push_str(&path);
                self.path_end = path.len();
                self.target.push_str(&target[path_end..]);
            }
            None => {
                self.target.push_str(target);
                self.path_end = path_end;
            }
        }
        Ok(())
    }
}

/// Whether the request line's third word is an HTTP version (`HTTP/...`): then a version
/// httparse refuses is an unsupported one (505) rather than a malformed line (400).
fn names_http_version(data: &[u8]) -> bool {
    let line = data.split(|&b| b == b'\n').next().unwrap_or(data);
    line.split(|&b| b == b' ')
        .nth(2)
        .is_some_and(|v| v.starts_with(b"HTTP/"))
}

/// Where `s` lies in the parsed head that starts at address `base` and is `len` bytes long.
/// httparse returns slices of its input, except for an empty reason phrase (`HTTP/1.1 200`
/// with nothing after the code), which is a static `""`: anything outside the head is an
/// empty span rather than an address difference that wraps (fuzzing found this: the wrapped
/// span then panicked when the reason was written).
fn span_in(base: usize, len: usize, s: &[u8]) -> Span {
    match (s.as_ptr() as usize).checked_sub(base) {
        Some(start) if start + s.len() <= len => Span::new(start, start + s.len()),
        _ => Span::default(),
    }
}

/// A parsed response head. Reused for every response of an upstream connection.
#[derive(Debug, Default)]
pub(crate) struct ResponseHead {
    pub status: u16,
    pub http10: bool,
    pub reason: Span,
    pub headers: HeaderList,
    pub connection: ConnectionTokens,
    pub content_length: Option<u64>,
    /// Transfer-Encoding present, and whether `chunked` is its final coding.
    pub transfer_encoding: Option<bool>,
    pub has_date: bool,
}

impl ResponseHead {
    pub(crate) fn parse(&mut self, data: &[u8]) -> Result<Option<usize>, HeadError> {
        let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
        let mut resp = httparse::Response::new(&mut []);
        let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut resp,
            data,
            &mut fields,
        )? {
            httparse::Status::Partial => return Ok(None),
            httparse::Status::Complete(n) => n,
        };
        let (Some(version), Some(status)) = (resp.version, resp.code) else {
            return Err(HeadError::Bad("incomplete status line"));
        };
        if !(100..=999).contains(&status) {
            return Err(HeadError::Bad("invalid status"));
        }
        self.status = status;
        self.http10 = version == 0;
        self.headers.clear();
        self.headers.buf_mut().extend_from_slice(&data[..len]);
        let base = data.as_ptr() as usize;
        let span = |s: &[u8]| span_in(base, len, s);
        self.reason = resp.reason.map_or(Span::default(), |r| span(r.as_bytes()));
        self.connection = ConnectionTokens::default();
        self.has_date = false;
        let mut length = None;
        let mut codings = Codings::default();
        // Names keep the backend's case (lowercasing every response head costs more than
        // comparing the few names that matter without regard to case).
        for f in resp.headers.iter() {
            let name = f.name.as_bytes();
            self.headers.push_spans_as_is(span(name), span(f.value));
            match name.len() {
                14 if name.eq_ignore_ascii_case(b"content-length") => {
                    content_length(f.value, &mut length)
                        .map_err(|()| HeadError::Bad("invalid or conflicting Content-Length"))?;
                }
                17 if name.eq_ignore_ascii_case(b"transfer-encoding") => codings.add(f.value),
                10 if name.eq_ignore_ascii_case(b"connection") => self.connection.add(f.value),
                4 if name.eq_ignore_ascii_case(b"date") => self.has_date = true,
                _ => {}
            }
        }
        self.content_length = length;
        self.transfer_encoding = codings.present.then_some(codings.chunked_last);
        Ok(Some(len))
    }

    /// Where the body ends (RFC 9112 §6.3), for a response to a request with `method`.
    pub(crate) fn framing(&self, head_request: bool) -> Framing {
        if head_request || (100..200).contains(&self.status) || matches!(self.status, 204 | 304) {
            return Framing::None;
        }
        match (self.transfer_encoding, self.content_length) {
            (Some(true), _) => Framing::Chunked,
            // A coding that does not end in chunked: the body runs to the close.
            (Some(false), _) => Framing::Eof,
            (None, Some(0)) => Framing::None,
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::Eof,
        }
    }

    /// The upstream connection may carry another request after this response.
    pub(crate) fn reusable(&self, framing: Framing) -> bool {
        let keep = if self.http10 {
            self.connection.keep_alive && !self.connection.close
        } else {
            !self.connection.close
        };
        // Both framings at once may be an attack on the next message: never reuse.
        keep && framing != Framing::Eof
            && !(self.transfer_encoding.is_some() && self.content_length.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(raw: &str) -> Result<RequestHead, HeadError> {
        let mut head = RequestHead::default();
        match head.parse(raw.as_bytes())? {
            Some(n) => assert_eq!(n, raw.find("\r\n\r\n").unwrap() + 4),
            None => panic!("incomplete: {raw:?}"),
        }
        Ok(head)
    }

    #[test]
    fn request_line_target_and_fields() {
        let h = req("GET /coffee/x?TEST=v2#frag HTTP/1.1\r\nHost: Cafe.Example.com\r\nX-Version: v2\r\n\r\n")
            .unwrap();
        assert_eq!(h.method, Method::GET);
        assert!(!h.http10);
        assert_eq!(h.path(), "/coffee/x");
        assert_eq!(h.query(), Some("TEST=v2"));
        assert_eq!(h.host(), Some(&b"Cafe.Example.com"[..]));
        assert_eq!(
            h.headers.get(b"x-version"),
            Some(&b"v2"[..]),
            "names lowercased"
        );
        assert_eq!(h.body, Framing::None);
        assert!(h.keep_alive);
        assert!(!h.unusual_target);

        let h = req("GET / HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
        assert_eq!(h.query(), None);
        let h = req("OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
        assert!(h.unusual_target);
    }

    #[test]
    fn partial_heads_ask_for_more() {
        let mut h = RequestHead::default();
        assert_eq!(h.parse(b"GET / HTTP/1.1\r\nHost: h\r\n"), Ok(None));
        assert_eq!(
            h.parse(b"GET / HTTP/1.1\r\nHost: h\r\n\r\nbody"),
            Ok(Some(27))
        );
    }

    #[test]
    fn framing_and_smuggling_rules() {
        let h = req("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n").unwrap();
        assert_eq!(h.body, Framing::Length(5));
        let h =
            req("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\ncontent-length: 5, 5\r\n\r\n")
                .unwrap();
        assert_eq!(
            h.body,
            Framing::Length(5),
            "repeated equal lengths collapse"
        );
        let h = req("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\r\n").unwrap();
        assert_eq!(h.body, Framing::Chunked);

        let bad = [
            (
                "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
                400,
            ),
            (
                "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n",
                400,
            ),
            (
                "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +4\r\n\r\n",
                400,
            ),
            (
                "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999\r\n\r\n",
                400,
            ),
            (
                "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n",
                501,
            ),
            (
                "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                501,
            ),
            (
                "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                400,
            ),
            ("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHo st: a\r\n\r\n", 400),
            ("GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
        ];
        for (raw, status) in bad {
            let mut h = RequestHead::default();
            let got = h.parse(raw.as_bytes()).map_err(HeadError::status);
            assert_eq!(got, Err(status), "{raw:?}");
        }
        let mut h = RequestHead::default();
        assert_eq!(
            h.parse(b"GET /a b HTTP/1.1\r\nHost: h\r\n\r\n")
                .map_err(HeadError::status),
            Err(400)
        );
    }

    #[test]
    fn keep_alive_and_upgrade() {
        assert!(!req("GET / HTTP/1.0\r\n\r\n").unwrap().keep_alive);
        assert!(
            req("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
                .unwrap()
                .keep_alive
        );
        assert!(
            !req("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
                .unwrap()
                .keep_alive
        );
        let up = req("GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n").unwrap();
        assert!(up.upgrade);
        let no = req("GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\n").unwrap();
        assert!(
            !no.upgrade,
            "Upgrade without Connection: upgrade is not a switch"
        );
        let listed =
            req("GET / HTTP/1.1\r\nHost: h\r\nConnection: x-secret\r\nX-Secret: 1\r\n\r\n")
                .unwrap();
        assert!(listed.connection.others);
        assert!(listed_in_connection(&listed.headers, b"x-secret"));
        assert!(!listed_in_connection(&listed.headers, b"host"));
    }

    fn resp(raw: &str) -> ResponseHead {
        let mut head = ResponseHead::default();
        head.parse(raw.as_bytes()).unwrap().unwrap();
        head
    }

    #[test]
    fn a_status_line_without_reason_parses() {
        // Found by fuzzing: httparse's empty reason is a static "" outside the buffer.
        for raw in [
            "HTTP/1.1 200\r\n\r\n",
            "HTTP/1.0 100\n\n",
            "HTTP/1.1 204 \r\n\r\n",
        ] {
            let r = resp(raw);
            assert!(r.reason.range().is_empty(), "{raw:?}");
        }
    }

    #[test]
    fn response_framing() {
        let r = resp("HTTP/1.1 200 OK\r\nContent-Length: 12\r\nDate: x\r\n\r\n");
        assert_eq!(r.framing(false), Framing::Length(12));
        assert_eq!(r.framing(true), Framing::None, "HEAD");
        assert!(r.has_date);
        assert!(r.reusable(r.framing(false)));
        let r = resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(r.framing(false), Framing::Chunked);
        let r = resp("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(r.framing(false), Framing::Eof);
        assert!(!r.reusable(Framing::Eof));
        let r = resp("HTTP/1.1 204 No Content\r\nContent-Length: 3\r\n\r\n");
        assert_eq!(r.framing(false), Framing::None);
        let r = resp("HTTP/1.1 304 Not Modified\r\n\r\n");
        assert_eq!(r.framing(false), Framing::None);
        let r = resp("HTTP/1.1 100 Continue\r\n\r\n");
        assert_eq!(r.framing(false), Framing::None);
        let r = resp("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n");
        assert!(!r.reusable(r.framing(false)), "HTTP/1.0 without keep-alive");
        let r = resp("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n");
        assert!(!r.reusable(r.framing(false)));
        let r = resp("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(r.framing(false), Framing::Chunked, "Transfer-Encoding wins");
        assert!(
            !r.reusable(Framing::Chunked),
            "but the connection is not reused"
        );
        let mut bad = ResponseHead::default();
        assert!(
            bad.parse(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n")
                .is_err()
        );
    }
}
