//! Gateway-generated answers to gRPC calls.
//!
//! A gRPC client reads the outcome of a call from the `grpc-status` trailer, not from the
//! HTTP status: a 404 or a 503 with a text body reaches the application as an opaque
//! transport error (`UNKNOWN` or `UNAVAILABLE` with "unexpected content-type"). So when the
//! gateway itself answers a gRPC request (no route, no backend, timeout, ...), the answer is
//! rewritten into a trailers-only gRPC response: HTTP 200, `content-type: application/grpc`,
//! `grpc-status` and `grpc-message` in the one HEADERS frame that ends the stream.
//!
//! A call's own deadline, the `grpc-timeout` field, bounds the gateway's wait for the backend
//! as the route's request timeout does, whichever is shorter: a client that gives a call
//! 300 ms gets DEADLINE_EXCEEDED from the gateway after 300 ms, not after the route's 15 s,
//! and the backend's connection slot is freed with it. The field goes on to the backend as it
//! came (the gateway's own time is microseconds; the backend enforces its deadline too).
//!
//! Responses from backends are never touched: a gRPC backend's own status goes through as
//! the backend wrote it, trailers included. The check runs only for HTTP/2 requests (gRPC
//! has no HTTP/1.1 mapping) and costs one header lookup; the rewrite happens only on the
//! error path and allocates nothing.

use crate::hyper_path::ResponseBody;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, Version};
use std::time::Duration;

static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// gRPC status codes the gateway answers with (the numbers are the protocol's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Code {
    Unknown = 2,
    DeadlineExceeded = 4,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl Code {
    fn header(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Code::Unknown => "2",
            Code::DeadlineExceeded => "4",
            Code::PermissionDenied => "7",
            Code::ResourceExhausted => "8",
            Code::Unimplemented => "12",
            Code::Internal => "13",
            Code::Unavailable => "14",
            Code::Unauthenticated => "16",
        })
    }
}

/// Whether a request is a gRPC call: HTTP/2 with `content-type: application/grpc`, alone or
/// with a `+codec` or parameters (gRPC-Web, which also runs over HTTP/1.1 and frames its
/// trailers in the body, is not: it is proxied as plain HTTP).
#[inline]
pub(crate) fn is_grpc(version: Version, headers: &HeaderMap) -> bool {
    if version != Version::HTTP_2 {
        return false;
    }
    let Some(ct) = headers.get(CONTENT_TYPE) else {
        return false;
    };
    let ct = ct.as_bytes();
    const GRPC: &[u8] = b"application/grpc";
    ct.len() >= GRPC.len()
        && ct[..GRPC.len()].eq_ignore_ascii_case(GRPC)
        && matches!(ct.get(GRPC.len()), None | Some(b'+' | b';'))
}

/// The deadline a gRPC call carries in `grpc-timeout`, if it carries a well-formed one.
#[inline]
pub(crate) fn deadline(headers: &HeaderMap) -> Option<Duration> {
    parse_timeout(headers.get(&GRPC_TIMEOUT)?.as_bytes())
}

/// A `grpc-timeout` value as gRPC over HTTP/2 defines it: at most 8 ASCII digits, then one
/// unit, `H` (hours), `M` (minutes), `S`, `m`, `u` or `n` (milli-, micro-, nanoseconds).
/// Anything else is `None`: a malformed deadline is the backend's to refuse, and the gateway
/// then waits as it would without one. Hand-written (no crate parses it alone): fuzzed
/// against its definition (`fuzzing::grpc_timeout`).
pub(crate) fn parse_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // At most 99,999,999: no overflow in u64, even in nanoseconds per hour below.
    let n = digits
        .iter()
        .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The shorter of two optional limits (`None` is no limit).
#[inline]
pub(crate) fn tighter(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The gRPC status of a gateway-generated HTTP status. The gRPC project's HTTP-to-gRPC
/// mapping, except that a gateway timeout is the call's deadline (DEADLINE_EXCEEDED) and a
/// 500 (a backendRef Gatehouse cannot use) is UNAVAILABLE: the call never reached a backend.
pub(crate) fn code_for(status: StatusCode) -> Code {
    match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        413 | 431 => Code::ResourceExhausted,
        421 | 429 | 500 | 502 | 503 => Code::Unavailable,
        504 => Code::DeadlineExceeded,
        _ => Code::Unknown,
    }
}

/// Turns a gateway-generated error (a [`ResponseBody::Static`] with an error status) into a
/// trailers-only gRPC response, keeping the fields response filters added. The text of the
/// generated body becomes `grpc-message`. Anything else is returned as it is.
pub(crate) fn answer_as_grpc(mut resp: Response<ResponseBody>) -> Response<ResponseBody> {
    let status = resp.status();
    if status.as_u16() < 400 {
        return resp;
    }
    let ResponseBody::Static(text) = resp.body_mut() else {
        return resp;
    };
    let message = text.take().and_then(|t| {
        let trimmed = t.trim_ascii_end().len();
        HeaderValue::from_maybe_shared(t.slice(..trimmed)).ok()
    });
    *resp.status_mut() = StatusCode::OK;
    let headers = resp.headers_mut();
    headers.remove(CONTENT_LENGTH);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS.clone(), code_for(status).header());
    if let Some(message) = message {
        headers.insert(GRPC_MESSAGE.clone(), message);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn headers(ct: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
        h
    }

    #[test]
    fn grpc_requests_are_http2_with_a_grpc_content_type() {
        for ct in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC;x=1",
        ] {
            assert!(is_grpc(Version::HTTP_2, &headers(ct)), "{ct}");
        }
        for ct in ["application/grpc-web", "application/grpcx", "text/plain"] {
            assert!(!is_grpc(Version::HTTP_2, &headers(ct)), "{ct}");
        }
        assert!(!is_grpc(Version::HTTP_11, &headers("application/grpc")));
        assert!(!is_grpc(Version::HTTP_2, &HeaderMap::new()));
    }

    #[test]
    fn generated_errors_become_trailers_only_responses() {
        let mut resp = Response::new(ResponseBody::Static(Some(Bytes::from_static(
            b"no route\n",
        ))));
        *resp.status_mut() = StatusCode::NOT_FOUND;
        resp.headers_mut()
            .insert("x-added", HeaderValue::from_static("by a filter"));
        let resp = answer_as_grpc(resp);
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()[CONTENT_TYPE], "application/grpc");
        assert_eq!(resp.headers()["grpc-status"], "12");
        assert_eq!(resp.headers()["grpc-message"], "no route");
        assert_eq!(resp.headers()["x-added"], "by a filter");
        // No body: the HEADERS frame ends the stream (trailers-only).
        assert!(matches!(resp.body(), ResponseBody::Static(None)));
    }

    #[test]
    fn other_responses_are_left_alone() {
        let mut redirect = Response::new(ResponseBody::Static(None));
        *redirect.status_mut() = StatusCode::FOUND;
        assert_eq!(answer_as_grpc(redirect).status(), StatusCode::FOUND);
    }

    #[test]
    fn grpc_timeouts_parse_as_the_protocol_defines_them() {
        let ms = Duration::from_millis;
        assert_eq!(parse_timeout(b"300m"), Some(ms(300)));
        assert_eq!(parse_timeout(b"1S"), Some(ms(1000)));
        assert_eq!(parse_timeout(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_timeout(b"250u"), Some(Duration::from_micros(250)));
        assert_eq!(
            parse_timeout(b"99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        assert_eq!(
            parse_timeout(b"99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
        assert_eq!(parse_timeout(b"0m"), Some(Duration::ZERO));
        // Nine digits, no digits, no unit, an unknown unit, a sign, a space.
        for bad in [
            &b"123456789m"[..],
            b"m",
            b"",
            b"100",
            b"100s",
            b"+1S",
            b" 1S",
            b"1 S",
        ] {
            assert_eq!(
                parse_timeout(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_tighter_limit_wins() {
        let s = Duration::from_secs;
        assert_eq!(tighter(Some(s(15)), Some(s(1))), Some(s(1)));
        assert_eq!(tighter(Some(s(1)), Some(s(15))), Some(s(1)));
        assert_eq!(tighter(None, Some(s(2))), Some(s(2)));
        assert_eq!(tighter(Some(s(2)), None), Some(s(2)));
        assert_eq!(tighter(None, None), None);
    }

    #[test]
    fn statuses_map_to_the_codes_clients_expect() {
        assert_eq!(code_for(StatusCode::NOT_FOUND), Code::Unimplemented);
        assert_eq!(code_for(StatusCode::SERVICE_UNAVAILABLE), Code::Unavailable);
        assert_eq!(code_for(StatusCode::BAD_GATEWAY), Code::Unavailable);
        assert_eq!(
            code_for(StatusCode::GATEWAY_TIMEOUT),
            Code::DeadlineExceeded
        );
        assert_eq!(code_for(StatusCode::IM_A_TEAPOT), Code::Unknown);
        assert_eq!(Code::Unavailable as u8, 14);
    }
}
