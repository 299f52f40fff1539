//! Gateway-generated answers to gRPC calls.
//!
//! A gRPC client reads the outcome of a call from the `grpc-status` trailer, not from the
//! HTTP status: a 404 or a 503 with a text body reaches the application as an opaque
//! transport error (`UNKNOWN` or `UNAVAILABLE` with "unexpected content-type"). So when the
//! gateway itself answers a gRPC request (no route, no backend, timeout, ...), the answer is
//! rewritten into a trailers-only gRPC response: HTTP 200, `content-type: application/grpc`,
//! `grpc-status` and `grpc-message` in the one HEADERS frame that ends the stream.
//!
//! Responses from backends are never touched: a gRPC backend's own status goes through as
//! the backend wrote it, trailers included. The check runs only for HTTP/2 requests (gRPC
//! has no HTTP/1.1 mapping) and costs one header lookup; the rewrite happens only on the
//! error path and allocates nothing.

use crate::hyper_path::ResponseBody;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, Version};

static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

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
