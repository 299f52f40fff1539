//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`): each takes arbitrary
//! input, runs one hand-written parser or matcher of the data plane, and asserts the
//! properties that must hold whatever the input. The internals stay private; only these
//! functions are exported.

use crate::h1::body::Decoder;
use crate::h1::parse::{Framing, RequestHead, ResponseHead};
use crate::matchers::{LazyQuery, RequestMatcher, RequestView};
use crate::router::RouteTable;
use crate::table::CompiledRoute;
use gatehouse_ir as ir;
use http::{HeaderMap, HeaderName, HeaderValue, Method};

/// The HTTP/1 request head parser, then the body decoder its framing picks, on what follows.
/// An accepted head must agree with httparse on where it ends and with an independent reading
/// of RFC 9112 §6 on how its body is framed (the differential check of the fast path's
/// framing decisions).
pub fn h1_request(data: &[u8]) {
    let mut head = RequestHead::default();
    let Ok(Some(len)) = head.parse(data) else {
        return;
    };
    assert!(len <= data.len());
    let mut fields = [httparse::EMPTY_HEADER; crate::h1::parse::MAX_FIELDS];
    let mut reference = httparse::Request::new(&mut fields);
    match reference.parse(data) {
        Ok(httparse::Status::Complete(n)) => assert_eq!(n, len, "head length"),
        other => panic!("the fast path accepted what httparse did not: {other:?}"),
    }
    assert_eq!(head.body, reference_framing(reference.headers), "framing");
    assert!(head.target.starts_with('/') || head.unusual_target);
    if !head.unusual_target {
        assert_eq!(
            crate::path::normalize(head.path()),
            Ok(None),
            "the path is normal"
        );
    }
    decode_all(head.body, &data[len..]);
}

/// RFC 9112 §6.3 for requests, written separately from `RequestHead::parse`: a request the
/// fast path accepts must have exactly the framing this says.
fn reference_framing(headers: &[httparse::Header<'_>]) -> Framing {
    let te: Vec<&[u8]> = headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("transfer-encoding"))
        .map(|h| h.value)
        .collect();
    if !te.is_empty() {
        return Framing::Chunked;
    }
    let cl = headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .map(|h| {
            let v = std::str::from_utf8(h.value).unwrap_or("");
            v.split(',')
                .next()
                .unwrap_or("")
                .trim()
                .parse::<u64>()
                .unwrap_or(u64::MAX)
        });
    match cl {
        None => Framing::None,
        Some(n) => Framing::Length(n),
    }
}

/// The HTTP/1 response head parser and the framing it derives, then the body decoder.
pub fn h1_response(data: &[u8], head_request: bool) {
    let mut head = ResponseHead::default();
    let Ok(Some(len)) = head.parse(data) else {
        return;
    };
    assert!(len <= data.len());
    let framing = head.framing(head_request);
    if head.reusable(framing) {
        assert_ne!(
            framing,
            Framing::Eof,
            "a close-delimited body is never reusable"
        );
    }
    decode_all(framing, &data[len..]);
}

/// Decodes `data` as a body of `framing` in one piece and byte by byte: both must agree.
fn decode_all(framing: Framing, data: &[u8]) {
    let whole = decode(framing, data, data.len().max(1));
    let bytewise = decode(framing, data, 1);
    assert_eq!(
        whole, bytewise,
        "decoding depends on how the input is split"
    );
}

/// (decoded body, malformed, done) for input fed `step` bytes at a time, as a connection's
/// read buffer feeds it.
fn decode(framing: Framing, data: &[u8], step: usize) -> (Vec<u8>, bool, bool) {
    let mut decoder = Decoder::new(framing);
    let mut pending: Vec<u8> = Vec::new();
    let mut body = Vec::new();
    for chunk in data.chunks(step) {
        pending.extend_from_slice(chunk);
        while !decoder.is_done() {
            match decoder.decode(&pending) {
                Err(_) => return (body, true, false),
                Ok((used, range)) => {
                    if let Some(r) = range {
                        body.extend_from_slice(&pending[r]);
                    }
                    pending.drain(..used);
                    if used == 0 {
                        break;
                    }
                }
            }
        }
        if decoder.is_done() {
            break;
        }
    }
    (body, false, decoder.is_done())
}

/// Path normalisation: a path is refused, left alone, or rewritten into a normal form that is
/// itself left alone, starts with `/`, and has no empty, `.` or `..` segment.
pub fn path(data: &str) {
    let normal = match crate::path::normalize(data) {
        Err(_) => return,
        Ok(None) => data.to_string(),
        Ok(Some(n)) => n,
    };
    assert!(normal.starts_with('/'));
    assert_eq!(
        crate::path::normalize(&normal),
        Ok(None),
        "{data:?} -> {normal:?}"
    );
    let inner = normal.trim_start_matches('/');
    let inner = inner.strip_suffix('/').unwrap_or(inner);
    if !inner.is_empty() {
        for segment in inner.split('/') {
            assert!(
                !matches!(segment, "" | "." | ".."),
                "{data:?} -> {normal:?}"
            );
        }
    }
}

/// `grpc-timeout` values: the parser agrees with the protocol's definition read another way
/// (the text split at its last character, the digits read by `u64::from_str`, the unit as a
/// count of nanoseconds), and never panics.
pub fn grpc_timeout(data: &[u8]) {
    let parsed = crate::grpc::parse_timeout(data).map(|d| d.as_nanos());
    let reference = (|| {
        let text = std::str::from_utf8(data).ok()?;
        let unit = text.chars().last()?;
        let digits = &text[..text.len() - unit.len_utf8()];
        // `from_str` alone would also take a leading `+`.
        if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: u64 = digits.parse().ok()?;
        let nanos: u128 = match unit {
            'H' => 3_600_000_000_000,
            'M' => 60_000_000_000,
            'S' => 1_000_000_000,
            'm' => 1_000_000,
            'u' => 1_000,
            'n' => 1,
            _ => return None,
        };
        Some(u128::from(n) * nanos)
    })();
    assert_eq!(parsed, reference, "{:?}", String::from_utf8_lossy(data));
}

/// The body of an ExternalAuth server's gRPC answer (`ext_auth`): parsed or refused, never a
/// panic; an allow never changes Host, whatever it asks; a denial always has a final status.
pub fn ext_auth_answer(data: &[u8]) {
    use crate::ext_auth::{Answer, apply, grpc_answer, parse_answer};
    let Ok(answer) = parse_answer(bytes::Bytes::copy_from_slice(data)) else {
        return;
    };
    match grpc_answer(answer) {
        Answer::Allow(changes) => {
            let mut headers = http::HeaderMap::new();
            headers.insert(
                http::header::HOST,
                http::HeaderValue::from_static("a.example"),
            );
            apply(&mut headers, changes);
            let hosts: Vec<_> = headers.get_all(http::header::HOST).iter().collect();
            assert_eq!(hosts, ["a.example"]);
        }
        Answer::Deny(response) => assert!(response.status().as_u16() >= 200),
    }
}

/// A request for [`router`].
#[derive(Debug)]
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: Vec<(&'a str, &'a str)>,
}

/// The router's match path: a virtual host's entries (with their exact-header indexes) must
/// pick exactly the entry a linear scan in precedence order picks.
pub fn router(matches: &[ir::HttpMatch], request: &Request<'_>) {
    let routes: Vec<CompiledRoute> = matches
        .iter()
        .enumerate()
        .filter_map(|(entry, m)| {
            RequestMatcher::try_from(m)
                .ok()
                .map(|matcher| CompiledRoute { matcher, entry })
        })
        .collect();
    let Ok(method) = Method::from_bytes(request.method.as_bytes()) else {
        return;
    };
    let mut headers = HeaderMap::new();
    for (n, v) in &request.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(n.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            headers.append(n, v);
        }
    }
    let view = || RequestView {
        method: &method,
        path: request.path,
        headers: &headers,
        query: LazyQuery::new(request.query),
    };
    let linear = routes
        .iter()
        .find(|r| r.matcher.matches(&mut view()))
        .map(|r| r.entry);
    let table = RouteTable::new(routes);
    let indexed = table.find(&mut view()).map(|r| r.entry);
    assert_eq!(indexed, linear, "{request:?}");
}

/// Every match and filter of a translated configuration builds in the data plane: translate
/// refuses (with status) whatever the data plane could not serve, so the data plane's own
/// contain-or-reject checks never fire on what translate emits.
pub fn compiles(config: &ir::Config) {
    for gateway in &config.gateways {
        for listener in &gateway.listeners {
            for host in &listener.virtual_hosts {
                for entry in &host.routes {
                    if let Err(e) = RequestMatcher::try_from(&*entry.matcher) {
                        panic!("translate emitted a match the data plane refuses: {e}: {entry:?}");
                    }
                }
            }
            for rule in &listener.rules {
                let backend_filters = rule.backends.iter().flat_map(|b| &b.filters);
                for filter in rule.filters.iter().chain(backend_filters) {
                    if let ir::HttpFilter::Mirror(m) = filter {
                        assert!(
                            config.clusters.iter().any(|c| c.name == m.cluster),
                            "translate emitted a mirror to a cluster it left out: {m:?}"
                        );
                        continue;
                    }
                    if let Err(e) = crate::filters::Filter::try_from(filter) {
                        panic!(
                            "translate emitted a filter the data plane refuses: {e}: {filter:?}"
                        );
                    }
                }
            }
        }
    }
}
