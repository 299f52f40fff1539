//! Serialising HTTP/1 heads: the request Gatehouse sends upstream, the response it sends the
//! client, and the responses it makes itself. Field names go out lower case, as they arrive
//! over HTTP/2 and as the hyper path sends them.

use super::date::append_date_field;
use super::parse::{Framing, RequestHead, ResponseHead, listed_in_connection};
use crate::headers::HeaderList;
use http::StatusCode;

/// Fields that describe one connection or one message's framing (RFC 9110 §7.6.1, RFC 9112),
/// which a proxy writes itself rather than copying. Any case: response names keep the
/// backend's.
fn hop_by_hop(name: &[u8]) -> bool {
    let is = |lower: &[u8]| name.eq_ignore_ascii_case(lower);
    match name.len() {
        2 => is(b"te"),
        7 => is(b"upgrade"),
        10 => is(b"connection") || is(b"keep-alive"),
        16 => is(b"proxy-connection"),
        17 => is(b"transfer-encoding"),
        _ => false,
    }
}

fn is_content_length(name: &[u8]) -> bool {
    name.len() == 14 && name.eq_ignore_ascii_case(b"content-length")
}

fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

fn decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// What the upstream request says besides the client's own fields.
pub(crate) struct Upstream<'a> {
    /// The path to send (rewritten or the client's).
    pub path: &'a str,
    pub query: Option<&'a str>,
    /// `Host`: the rewritten host, the client's, or the endpoint's authority.
    pub host: &'a [u8],
    /// The client's host, for `X-Forwarded-Host`.
    pub original_host: Option<&'a [u8]>,
    pub client_ip: &'a [u8],
    /// `http` or `https`.
    pub proto: &'a [u8],
}

/// The request head for the backend: HTTP/1.1, hop-by-hop fields out, `Host` and
/// `X-Forwarded-*` set, framing written for the body as Gatehouse will send it.
pub(crate) fn upstream_request(out: &mut Vec<u8>, req: &RequestHead, up: &Upstream<'_>) {
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(up.path.as_bytes());
    if let Some(q) = up.query {
        out.push(b'?');
        out.extend_from_slice(q.as_bytes());
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");
    field(out, b"host", up.host);
    let mut forwarded_for = false;
    let mut trailers = false;
    for (name, value) in req.headers.iter() {
        match name {
            b"host" | b"content-length" | b"x-forwarded-proto" | b"x-forwarded-host" => continue,
            b"x-forwarded-for" => {
                forwarded_for = true;
                continue;
            }
            b"te" => {
                trailers |= value.split(|&b| b == b',').any(|t| {
                    t.split(|&b| b == b';')
                        .next()
                        .unwrap_or(b"")
                        .trim_ascii()
                        .eq_ignore_ascii_case(b"trailers")
                });
                continue;
            }
            // What `Connection` named went before the filters (`strip_connection_listed`).
            _ if hop_by_hop(name) => continue,
            _ => field(out, name, value),
        }
    }
    // Earlier proxies' entries stay, in order, before the client's address, on one line.
    out.extend_from_slice(b"x-forwarded-for: ");
    if forwarded_for {
        for (_, value) in req.headers.iter().filter(|(n, _)| *n == b"x-forwarded-for") {
            out.extend_from_slice(value);
            out.extend_from_slice(b", ");
        }
    }
    out.extend_from_slice(up.client_ip);
    out.extend_from_slice(b"\r\n");
    field(out, b"x-forwarded-proto", up.proto);
    if let Some(host) = up.original_host {
        field(out, b"x-forwarded-host", host);
    }
    if trailers {
        field(out, b"te", b"trailers");
    }
    match req.body {
        Framing::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            decimal(out, n);
            out.extend_from_slice(b"\r\n");
        }
        Framing::Chunked => field(out, b"transfer-encoding", b"chunked"),
        Framing::None | Framing::Eof => {}
    }
    out.extend_from_slice(b"\r\n");
}

/// How the client gets the response.
pub(crate) struct ClientResponse {
    /// The body's framing from upstream.
    pub framing: Framing,
    /// The client speaks HTTP/1.0 (no chunked encoding).
    pub client_http10: bool,
    /// The client connection closes after this response.
    pub close: bool,
}

impl ClientResponse {
    /// Whether the body goes to the client chunked (its length is unknown and the client
    /// understands chunked).
    pub(crate) fn chunked(&self) -> bool {
        matches!(self.framing, Framing::Chunked | Framing::Eof) && !self.client_http10
    }
}

fn status_line(out: &mut Vec<u8>, status: u16, upstream_reason: &[u8]) {
    out.extend_from_slice(b"HTTP/1.1 ");
    decimal(out, u64::from(status));
    out.push(b' ');
    let canonical = StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason());
    match canonical {
        Some(reason) => out.extend_from_slice(reason.as_bytes()),
        None => out.extend_from_slice(upstream_reason),
    }
    out.extend_from_slice(b"\r\n");
}

/// The response head for the client.
pub(crate) fn client_response(out: &mut Vec<u8>, resp: &ResponseHead, how: &ClientResponse) {
    status_line(out, resp.status, resp.headers.bytes(resp.reason));
    let keep_length = how.framing == Framing::None && !matches!(resp.status, 100..=199 | 204);
    for (name, value) in resp.headers.iter() {
        match name {
            _ if !keep_length && is_content_length(name) => continue,
            _ if hop_by_hop(name) => continue,
            _ if resp.connection.others && listed_in_connection(&resp.headers, name) => continue,
            _ => field(out, name, value),
        }
    }
    if !resp.has_date {
        append_date_field(out);
    }
    match how.framing {
        Framing::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            decimal(out, n);
            out.extend_from_slice(b"\r\n");
        }
        Framing::Chunked | Framing::Eof if how.chunked() => {
            field(out, b"transfer-encoding", b"chunked");
        }
        _ => {}
    }
    connection_field(out, how.close, how.client_http10);
    out.extend_from_slice(b"\r\n");
}

fn connection_field(out: &mut Vec<u8>, close: bool, client_http10: bool) {
    if close {
        field(out, b"connection", b"close");
    } else if client_http10 {
        field(out, b"connection", b"keep-alive");
    }
}

/// An interim (1xx) response for an HTTP/1.1 client, fields as the backend sent them.
pub(crate) fn interim(out: &mut Vec<u8>, resp: &ResponseHead) {
    status_line(out, resp.status, resp.headers.bytes(resp.reason));
    for (name, value) in resp.headers.iter() {
        if !hop_by_hop(name) {
            field(out, name, value);
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// A response Gatehouse makes: `fields` (already filtered), then length, date and connection.
pub(crate) fn generated(
    out: &mut Vec<u8>,
    status: StatusCode,
    fields: &HeaderList,
    body: &[u8],
    close: bool,
    client_http10: bool,
) {
    status_line(out, status.as_u16(), b"");
    for (name, value) in fields.iter() {
        if !is_content_length(name) && !hop_by_hop(name) {
            field(out, name, value);
        }
    }
    out.extend_from_slice(b"content-length: ");
    decimal(out, body.len() as u64);
    out.extend_from_slice(b"\r\n");
    append_date_field(out);
    connection_field(out, close, client_http10);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(raw: &str) -> RequestHead {
        let mut head = RequestHead::default();
        head.parse(raw.as_bytes()).unwrap().unwrap();
        head
    }

    fn upstream<'a>(host: &'a [u8]) -> Upstream<'a> {
        Upstream {
            path: "/p",
            query: Some("a=1"),
            host,
            original_host: Some(b"cafe.example.com"),
            client_ip: b"10.0.0.1",
            proto: b"http",
        }
    }

    #[test]
    fn upstream_request_rewrites_hop_by_hop_and_forwarding_fields() {
        let req = request(
            "POST /orig HTTP/1.1\r\nHost: cafe.example.com\r\nConnection: keep-alive, x-secret\r\n\
             X-Secret: s\r\nKeep-Alive: 5\r\nTE: trailers, deflate\r\nUpgrade: h2c\r\n\
             X-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 2.2.2.2\r\nX-Forwarded-Proto: https\r\n\
             Content-Length: 3\r\nAccept: */*\r\n\r\n",
        );
        let mut req = req;
        // What the session does before the filters run (fields `Connection` names go first).
        super::super::parse::strip_connection_listed(&mut req.headers);
        let mut out = Vec::new();
        upstream_request(&mut out, &req, &upstream(b"backend.internal"));
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "POST /p?a=1 HTTP/1.1\r\nhost: backend.internal\r\naccept: */*\r\n\
             x-forwarded-for: 1.1.1.1, 2.2.2.2, 10.0.0.1\r\nx-forwarded-proto: http\r\n\
             x-forwarded-host: cafe.example.com\r\nte: trailers\r\ncontent-length: 3\r\n\r\n"
        );
    }

    #[test]
    fn upstream_request_without_forwarded_for_and_chunked() {
        let req = request("PUT /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n");
        let mut out = Vec::new();
        let mut up = upstream(b"h");
        up.query = None;
        up.original_host = None;
        upstream_request(&mut out, &req, &up);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "PUT /p HTTP/1.1\r\nhost: h\r\nx-forwarded-for: 10.0.0.1\r\n\
             x-forwarded-proto: http\r\ntransfer-encoding: chunked\r\n\r\n"
        );
    }

    fn response(raw: &str) -> ResponseHead {
        let mut head = ResponseHead::default();
        head.parse(raw.as_bytes()).unwrap().unwrap();
        head
    }

    #[test]
    fn client_response_framing() {
        let r = response(
            "HTTP/1.1 200 Fine\r\nConnection: x-hop\r\nX-Hop: 1\r\nDate: d\r\n\
             Transfer-Encoding: chunked\r\nX-Kept: k\r\n\r\n",
        );
        let mut out = Vec::new();
        client_response(
            &mut out,
            &r,
            &ClientResponse {
                framing: r.framing(false),
                client_http10: false,
                close: false,
            },
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nDate: d\r\nX-Kept: k\r\ntransfer-encoding: chunked\r\n\r\n"
        );

        // To an HTTP/1.0 client an unknown length means closing; a known one allows keep-alive.
        let mut out = Vec::new();
        client_response(
            &mut out,
            &r,
            &ClientResponse {
                framing: Framing::Chunked,
                client_http10: true,
                close: true,
            },
        );
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("transfer-encoding") && text.contains("connection: close\r\n"));
        let r = response("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n");
        let mut out = Vec::new();
        client_response(
            &mut out,
            &r,
            &ClientResponse {
                framing: Framing::Length(2),
                client_http10: true,
                close: false,
            },
        );
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("content-length: 2\r\n") && text.contains("connection: keep-alive\r\n")
        );
        assert!(
            text.contains("\r\ndate: "),
            "a date is added when the backend sent none"
        );

        // HEAD: the length describes the GET and is kept as is.
        let mut out = Vec::new();
        client_response(
            &mut out,
            &r,
            &ClientResponse {
                framing: Framing::None,
                client_http10: false,
                close: false,
            },
        );
        assert!(
            String::from_utf8(out)
                .unwrap()
                .contains("Content-Length: 2\r\n")
        );
    }

    #[test]
    fn generated_response() {
        let mut fields = HeaderList::default();
        fields.push(b"content-type", b"text/plain");
        let mut out = Vec::new();
        generated(
            &mut out,
            StatusCode::NOT_FOUND,
            &fields,
            b"nope\n",
            true,
            false,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with(
            "HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\ncontent-length: 5\r\ndate: "
        ));
        assert!(text.ends_with("connection: close\r\n\r\nnope\n"));
    }
}
