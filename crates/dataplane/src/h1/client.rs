//! The pooled HTTP/1.1 upstream connections, for requests that arrived on hyper (HTTP/2
//! clients, mostly): the request head is written from its `http` parts and the response comes
//! back as an `http::Response` whose body reads the pooled connection and parks it when done.
//!
//! Only requests without a body take this way (the common case for HTTP/2 GETs); the rest keep
//! hyper-util's client, which streams request bodies.

use super::body::Decoder;
use super::pool::{Conn, Pool, checkout_or_connect, reconnect};
use crate::headers::HeaderList;
use crate::table::{ClusterState, Endpoint};
use crate::upstream::{BoxError, UpstreamError};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use tokio::io::AsyncWriteExt;

/// Sends a request without a body (its head in `parts`, URI in origin or absolute form) and
/// returns the response head with a body streaming from the connection.
/// Goes to `endpoint`, or to another endpoint of `cluster` when connecting to it fails (see
/// [`checkout_or_connect`]).
pub(crate) async fn send(
    cluster: &ClusterState,
    endpoint: &Endpoint,
    parts: &http::request::Parts,
) -> Result<Response<PooledBody>, UpstreamError> {
    let idempotent = matches!(
        parts.method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    );
    let (mut up, mut endpoint) = checkout_or_connect(cluster, endpoint)
        .await
        .map_err(UpstreamError::Connect)?;
    let mut retried = false;
    let len = loop {
        up.out.clear();
        write_head(&mut up.out, parts);
        match exchange(&mut up).await {
            Ok(len) => break len,
            // A kept-alive connection the backend closed meanwhile: once more on a new one.
            // (Once: a second closed connection is a backend that closes on purpose.)
            Err(Failure::Closed) if up.reused && idempotent && !retried => {
                retried = true;
                (up, endpoint) = reconnect(cluster, endpoint)
                    .await
                    .map_err(UpstreamError::Connect)?;
            }
            Err(Failure::Closed) => {
                return Err(UpstreamError::Failed(
                    "connection closed before a response".into(),
                ));
            }
            Err(Failure::Io(e)) => return Err(UpstreamError::Failed(e.into())),
            Err(Failure::HeadTooLarge) => return Err(UpstreamError::HeadTooLarge),
        }
    };
    endpoint.health.success();
    let framing = up.head.framing(parts.method == Method::HEAD);
    let status = StatusCode::from_u16(up.head.status)
        .map_err(|e| UpstreamError::Failed(Box::new(e) as BoxError))?;
    // `exchange` skipped the other 1xx; a 101 without an Upgrade request is an error.
    if up.head.status == 101 {
        return Err(UpstreamError::Failed(
            "switching protocols without an upgrade request".into(),
        ));
    }
    let headers = header_map(&up.head.headers);
    let reusable = up.head.reusable(framing);
    up.buf.consume(len);
    let mut body = PooledBody {
        conn: Some(up),
        decoder: Decoder::new(framing),
        pool: endpoint
            .pool
            .clone()
            .expect("checkout_or_connect and reconnect use the pool"),
        reusable,
    };
    if body.decoder.is_done() {
        // No body will be polled: the connection is free now.
        body.finish();
    }
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    Ok(resp)
}

/// The response fields as a `HeaderMap`. The values are slices of one copy of the head, so
/// the map costs one allocation for all values rather than one per field.
fn header_map(fields: &HeaderList) -> HeaderMap {
    let raw = Bytes::copy_from_slice(fields.buf());
    let mut headers = HeaderMap::with_capacity(fields.spans().count());
    for (name, value) in fields.spans() {
        // Names are tokens and values field-content, as httparse checked them.
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&raw[name.range()]),
            HeaderValue::from_maybe_shared(raw.slice(value.range())),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    headers
}

enum Failure {
    /// End of stream or reset before any response byte.
    Closed,
    Io(io::Error),
    /// The response head is over the limit.
    HeadTooLarge,
}

/// Writes the head in `up.out`, reads the final response head (interim responses skipped: the
/// client sent no body to continue with). Returns the head's length in the buffer.
async fn exchange(up: &mut Conn) -> Result<usize, Failure> {
    let closed = |e: io::Error| match e.kind() {
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => Failure::Closed,
        _ => Failure::Io(e),
    };
    up.io.write_all(&up.out).await.map_err(closed)?;
    up.io.flush().await.map_err(closed)?;
    let mut received = false;
    loop {
        if !up.buf.is_empty() {
            match up.head.parse(up.buf.data()) {
                Ok(Some(len)) if (100..200).contains(&up.head.status) && up.head.status != 101 => {
                    up.buf.consume(len);
                    continue;
                }
                Ok(Some(len)) => return Ok(len),
                Ok(None) if up.buf.is_full() && !up.room_for_head() => {
                    return Err(Failure::HeadTooLarge);
                }
                Ok(None) => {}
                Err(e) => return Err(Failure::Io(io::Error::other(e.reason()))),
            }
        }
        match poll_fn(|cx| up.buf.poll_fill(cx, &mut up.io)).await {
            Ok(0) if !received => return Err(Failure::Closed),
            Ok(0) => return Err(Failure::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(_) => received = true,
            Err(e) if !received => return Err(closed(e)),
            Err(e) => return Err(Failure::Io(e)),
        }
    }
}

/// `METHOD target HTTP/1.1`, then every field of `parts` (the caller has set Host and the
/// forwarding fields and removed hop-by-hop ones).
fn write_head(out: &mut Vec<u8>, parts: &http::request::Parts) {
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &parts.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// A response body read from a pooled connection, which goes back to the pool once the body
/// has been read to its end (and is closed if the body is dropped before).
pub(crate) struct PooledBody {
    conn: Option<Box<Conn>>,
    decoder: Decoder,
    pool: Arc<Pool>,
    reusable: bool,
}

impl std::fmt::Debug for PooledBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBody")
            .field("decoder", &self.decoder)
            .finish_non_exhaustive()
    }
}

impl PooledBody {
    fn finish(&mut self) {
        if let Some(conn) = self.conn.take()
            && self.reusable
            && conn.buf.is_empty()
        {
            self.pool.checkin(conn);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        loop {
            if this.decoder.is_done() {
                this.finish();
                return Poll::Ready(None);
            }
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            if !conn.buf.is_empty() {
                let (used, data) = this
                    .decoder
                    .decode(conn.buf.data())
                    .map_err(|m| io::Error::new(io::ErrorKind::InvalidData, m.0))?;
                let frame = data.map(|r| Bytes::copy_from_slice(&conn.buf.data()[r]));
                conn.buf.consume(used);
                if let Some(data) = frame {
                    if this.decoder.is_done() {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                if used > 0 {
                    continue;
                }
            }
            let n = ready!(conn.buf.poll_fill(cx, &mut conn.io))?;
            if n == 0 {
                if this.decoder == Decoder::Eof {
                    this.decoder = Decoder::Done;
                    this.reusable = false;
                    continue;
                }
                this.conn = None;
                return Poll::Ready(Some(Err(io::ErrorKind::UnexpectedEof.into())));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder {
            Decoder::Length(n) => SizeHint::with_exact(n),
            Decoder::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_from_parts() {
        let (parts, ()) = http::Request::get("http://10.0.0.1:8080/a/b?c=1")
            .header("host", "cafe.example.com")
            .header("x-forwarded-for", "1.2.3.4")
            .body(())
            .unwrap()
            .into_parts();
        let mut out = Vec::new();
        write_head(&mut out, &parts);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET /a/b?c=1 HTTP/1.1\r\nhost: cafe.example.com\r\nx-forwarded-for: 1.2.3.4\r\n\r\n"
        );
    }
}
