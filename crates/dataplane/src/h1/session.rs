//! One client connection on the HTTP/1 path: read a request head, route it, forward it over a
//! pooled upstream connection, stream the response back, repeat. Everything happens in the
//! connection's task, so a proxied request costs two reads and two writes and no task switch.
//!
//! A request the path does not handle itself (a protocol upgrade, a non-origin-form target,
//! an h2c backend) hands the connection to hyper before anything of it is consumed, with the
//! bytes read so far; so does the HTTP/2 connection preface.

use super::body::{Encoding, Pipe, PipeError};
use super::buf::ReadBuf;
use super::deadline::Deadline;
use super::parse::{Framing, HeadError, RequestHead, strip_connection_listed};
use super::pool::{Conn, checkout_or_connect, reconnect};
use super::write::{self, ClientResponse, Upstream};
use crate::conn::ConnContext;
use crate::forwarding::{self, Answer, Decision, RequestParts, ResponseEdits};
use crate::headers::HeaderList;
use crate::limits::{Stall, TimeoutKind, Watch};
use crate::matchers::{LazyQuery, RequestView};
use crate::metrics::Side;
use crate::router::{self, MAX_HOST_LEN, Routed};
use crate::table::{CompiledRoute, CompiledRule, SocketTable};
use bytes::Bytes;
use http::header::{CONTENT_TYPE, LOCATION};
use http::{Method, StatusCode};
use std::future::{Future, poll_fn};
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// The client read buffer starts here and grows (doubling) only for larger heads.
const INITIAL_READ_BUFFER: usize = 4 * 1024;
/// Request bodies are streamed through a buffer of at least this size.
const BODY_READ_BUFFER: usize = 16 * 1024;
pub(crate) const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Settings of the HTTP/1 path.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    /// A client must send a request head within this time (also the keep-alive idle limit).
    pub header_read_timeout: Duration,
    /// Largest request head; beyond it the answer is 431.
    pub max_head: usize,
}

/// How a connection left the HTTP/1 path.
pub(crate) enum Outcome<I> {
    Closed,
    /// Continue on hyper with this transport, replaying these bytes first.
    Handoff(I, Bytes),
}

/// Serves HTTP/1 requests on `io` until the connection closes, the socket drains, or a request
/// needs hyper.
pub(crate) async fn serve<I>(
    io: I,
    conn: Arc<ConnContext>,
    drain: CancellationToken,
    settings: Settings,
) -> Outcome<I>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let mut session = Session {
        io,
        buf: ReadBuf::new(INITIAL_READ_BUFFER),
        head: RequestHead::default(),
        out: Vec::new(),
        up_out: Vec::new(),
        fields: HeaderList::default(),
        conn,
        settings,
        head_deadline: Deadline::new(),
        response_deadline: Deadline::new(),
        stall: None,
    };
    let drained = drain.cancelled_owned();
    let mut drained = pin!(drained);
    let mut first = true;
    loop {
        let len = match session.read_head(first, drained.as_mut()).await {
            Ok(len) => len,
            Err(ReadHead::H2Preface) => return session.handoff(),
            Err(ReadHead::Closed) => return Outcome::Closed,
            Err(ReadHead::Refused(status, why)) => {
                debug!(peer = ?session.conn.client_ip, status, why, "request refused");
                if status == 431 {
                    session
                        .conn
                        .socket
                        .shared
                        .metrics
                        .head_too_large(Side::Request);
                }
                let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
                session.fields.clear();
                session.fields.push(b"content-type", b"text/plain");
                let _ = session.send_generated(status, why.as_bytes(), true).await;
                return Outcome::Closed;
            }
        };
        first = false;
        let draining = session.conn.socket.closing();
        match session.request(len, draining).await {
            // The response promised keep-alive, so the connection stays open even if a drain
            // began meanwhile: closing it now would race the client's next request (it would
            // see the connection closed under it). That request is answered with
            // `Connection: close`; an idle connection closes when its socket stops
            // (read_head).
            Next::KeepGoing => {}
            Next::Close => {
                // TLS says goodbye (close_notify); plain TCP closes with the socket.
                if session.conn.sni.is_some() {
                    let _ = session.io.shutdown().await;
                }
                return Outcome::Closed;
            }
            Next::Handoff => return session.handoff(),
        }
    }
}

enum ReadHead {
    H2Preface,
    /// End of stream, timeout or drain with nothing pending, or a read error.
    Closed,
    /// Answer with this status and close.
    Refused(u16, &'static str),
}

enum Next {
    KeepGoing,
    Close,
    Handoff,
}

struct Session<I> {
    io: I,
    buf: ReadBuf,
    head: RequestHead,
    /// What goes to the client next (reused).
    out: Vec<u8>,
    /// What goes upstream next (reused).
    up_out: Vec<u8>,
    /// Fields of responses Gatehouse makes (reused).
    fields: HeaderList,
    conn: Arc<ConnContext>,
    settings: Settings,
    /// When the current request head must be in.
    head_deadline: Deadline,
    /// When the current response head must be in (the rule's timeout).
    response_deadline: Deadline,
    /// Request and response bodies that stop moving (made on the first body).
    stall: Option<Stall>,
}

/// What a forwarded request came to.
enum Exchanged {
    /// The response went out (entirely, or its head and part of its body before a failure, in
    /// which case `keep_client` is false).
    Responded { status: u16, keep_client: bool },
    /// Nothing reached the client yet: answer this and close (or keep going if `keep_client`).
    Failed {
        status: StatusCode,
        text: &'static str,
        keep_client: bool,
    },
    /// The client went away.
    ClientGone,
}

impl<I> Session<I>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    fn handoff(self) -> Outcome<I> {
        let pending = Bytes::copy_from_slice(self.buf.data());
        Outcome::Handoff(self.io, pending)
    }

    /// Reads until a whole request head is buffered; returns its length.
    async fn read_head(
        &mut self,
        first: bool,
        mut drained: Pin<&mut tokio_util::sync::WaitForCancellationFutureOwned>,
    ) -> Result<usize, ReadHead> {
        let deadline = tokio::time::Instant::now() + self.settings.header_read_timeout;
        loop {
            if !self.buf.is_empty() {
                let data = self.buf.data();
                if first && H2_PREFACE.starts_with(&data[..data.len().min(H2_PREFACE.len())]) {
                    if data.len() >= H2_PREFACE.len() {
                        return Err(ReadHead::H2Preface);
                    }
                } else {
                    match self.head.parse(data) {
                        Ok(Some(len)) => return Ok(len),
                        Ok(None) => {}
                        Err(HeadError::NotHttp) => {
                            debug!(peer = ?self.conn.client_ip, "not HTTP/1; closing");
                            return Err(ReadHead::Closed);
                        }
                        Err(e) => return Err(ReadHead::Refused(e.status(), e.reason())),
                    }
                }
                if self.buf.is_full() {
                    let max = self.settings.max_head;
                    if self.buf.capacity() >= max {
                        return Err(ReadHead::Refused(431, "request head too large"));
                    }
                    self.buf.grow_to((self.buf.capacity() * 2).min(max));
                }
            }
            let read = poll_fn(|cx| {
                if let Poll::Ready(r) = self.buf.poll_fill(cx, &mut self.io) {
                    return Poll::Ready(Some(r));
                }
                if self.buf.is_empty() && drained.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                self.head_deadline
                    .poll_passed(cx, deadline)
                    .map(|()| Some(Err(io::ErrorKind::TimedOut.into())))
            })
            .await;
            match read {
                Some(Ok(0)) | None => return Err(ReadHead::Closed),
                Some(Ok(_)) => {}
                Some(Err(e)) if e.kind() == io::ErrorKind::TimedOut => {
                    return Err(if self.buf.is_empty() {
                        ReadHead::Closed
                    } else {
                        ReadHead::Refused(408, "request head not received in time")
                    });
                }
                Some(Err(_)) => return Err(ReadHead::Closed),
            }
        }
    }

    /// Handles the request whose head is the first `len` bytes of the buffer.
    async fn request(&mut self, len: usize, draining: bool) -> Next {
        let start = Instant::now();
        let conn = self.conn.clone();
        let table: Arc<SocketTable> = conn.socket.table.load_full();
        if self.head.unusual_target || self.head.upgrade {
            return Next::Handoff;
        }
        let mut host_buf = [0u8; MAX_HOST_LEN];
        let host = self
            .head
            .host()
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| router::normalize_host(h, &mut host_buf))
            .unwrap_or("");
        // A listener's pre-routing filters await an authorization server: the hyper path runs
        // them (one flag read on every socket without any).
        if table.pre_routing
            && conn
                .listener(&table, host)
                .is_some_and(|l| !l.filters.is_empty())
        {
            return Next::Handoff;
        }
        let metrics = &conn.socket.shared.metrics;
        let routed = conn.route(
            &table,
            host,
            &mut RequestView {
                method: &self.head.method,
                path: self.head.path(),
                headers: &self.head.headers,
                query: LazyQuery::new(self.head.query()),
            },
        );
        let (route, rule) = match routed {
            Routed::Matched(route, rule) => (route, rule),
            Routed::Refused(refusal) => {
                self.buf.consume(len);
                let next = self
                    .answer_and_skip_body(
                        Answer::Text(refusal.status, refusal.text),
                        ResponseEdits {
                            rule_filters: &[],
                            backend_filters: &[],
                            cors: None,
                        },
                        draining,
                    )
                    .await;
                refusal
                    .metrics
                    .record(metrics, refusal.status.as_u16(), start.elapsed());
                return next;
            }
        };
        if rule.mirrored || rule.retry.is_some() || rule.authorized {
            // Mirrors copy the request body frame by frame, retries replay requests, and
            // ExternalAuth checks are awaited: the hyper path does all three.
            return Next::Handoff;
        }
        let (next, status) = self.forward(len, rule, route, host, draining, start).await;
        if let Some(status) = status {
            rule.metrics.record(metrics, status, start.elapsed());
        }
        next
    }

    /// Filters, backend choice and the exchange with the backend. Returns what to do next and
    /// the status the client got (none when the client went away first).
    async fn forward(
        &mut self,
        len: usize,
        rule: &CompiledRule,
        route: &CompiledRoute,
        host: &str,
        draining: bool,
        started: Instant,
    ) -> (Next, Option<u16>) {
        let RequestHead {
            method,
            target,
            path_end,
            headers,
            connection,
            ..
        } = &mut self.head;
        if connection.others {
            strip_connection_listed(headers);
        }
        let decision = forwarding::decide(
            rule,
            &RequestParts {
                method,
                host,
                path: &target[..*path_end],
                query: target.get(*path_end + 1..),
                matched_prefix: route.matcher.path.replaceable_prefix(),
            },
            headers,
        );
        let (cluster, endpoint, backend_filters, rewrite) = match decision {
            Decision::Answer {
                answer,
                backend_filters,
                cors,
            } => {
                let status = answer.status().as_u16();
                self.buf.consume(len);
                let edits = ResponseEdits {
                    rule_filters: &rule.filters,
                    backend_filters,
                    cors: cors.as_ref(),
                };
                let next = self.answer_and_skip_body(answer, edits, draining).await;
                return (next, Some(status));
            }
            Decision::Forward {
                cluster,
                endpoint,
                backend_filters,
                rewrite,
            } => (cluster, endpoint, backend_filters, rewrite),
        };
        if endpoint.pool.is_none() {
            // An h2c backend: hyper's client speaks HTTP/2 to it.
            return (Next::Handoff, None);
        }
        self.buf.consume(len);

        let head = &self.head;
        let conn = &self.conn;
        let original_host = head.host();
        let upstream_host = match (&rewrite.host, original_host) {
            (Some(h), _) => h.as_bytes(),
            (None, Some(h)) => h,
            (None, None) => endpoint.authority.as_str().as_bytes(),
        };
        self.up_out.clear();
        write::upstream_request(
            &mut self.up_out,
            head,
            &Upstream {
                path: rewrite.path.as_deref().unwrap_or(head.path()),
                query: head.query(),
                host: upstream_host,
                original_host,
                client_ip: conn.client_ip.as_bytes(),
                proto: conn.proto.as_bytes(),
            },
        );
        let close_after = !self.head.keep_alive || draining;
        let edits = ResponseEdits {
            rule_filters: &rule.filters,
            backend_filters,
            cors: rewrite.cors.as_ref(),
        };
        let exchanged = self
            .exchange(endpoint, rule, edits, close_after, cluster, started)
            .await;
        match exchanged {
            Exchanged::Responded {
                status,
                keep_client,
            } => (
                if keep_client {
                    Next::KeepGoing
                } else {
                    Next::Close
                },
                Some(status),
            ),
            Exchanged::Failed {
                status,
                text,
                keep_client,
            } => {
                self.fields.clear();
                self.fields.push(b"content-type", b"text/plain");
                edits.apply(&mut self.fields);
                let close = !keep_client || close_after;
                let sent = self.send_generated(status, text.as_bytes(), close).await;
                let next = if sent.is_ok() && !close {
                    Next::KeepGoing
                } else {
                    Next::Close
                };
                (next, Some(status.as_u16()))
            }
            Exchanged::ClientGone => (Next::Close, None),
        }
    }

    /// Sends the request (head in `up_out`, body from the client) and the response back.
    async fn exchange(
        &mut self,
        endpoint: &crate::table::Endpoint,
        rule: &CompiledRule,
        edits: ResponseEdits<'_>,
        close_after: bool,
        cluster: &crate::table::ClusterState,
        started: Instant,
    ) -> Exchanged {
        let method = self.head.method.clone();
        let head_request = method == Method::HEAD;
        let body = self.head.body;
        // Without a body the request can be sent again if a kept-alive connection turns out
        // to have been closed by the backend meanwhile.
        let replayable = body == Framing::None;
        // (The head in `up_out` names no endpoint, except as Host for an HTTP/1.0 request
        // without one: a retry on another endpoint sends it unchanged.)
        let (mut up, mut endpoint) = match checkout_or_connect(cluster, endpoint).await {
            Ok(connected) => connected,
            Err(_) => return self.fail(StatusCode::BAD_GATEWAY, "upstream connect error\n"),
        };
        let mut attempt = 0;
        let (status_len, req_pipe) = loop {
            attempt += 1;
            let mut req_pipe = Pipe::new(std::mem::take(&mut self.up_out));
            req_pipe.start(
                body,
                if body == Framing::Chunked {
                    Encoding::Chunked
                } else {
                    Encoding::Identity
                },
            );
            if self.buf.capacity() < BODY_READ_BUFFER && body != Framing::None {
                self.buf.grow_to(BODY_READ_BUFFER);
            }
            let limits = self.conn.socket.shared.limits;
            let stall = self
                .stall
                .get_or_insert_with(|| Stall::new(limits.request_body));
            let phase = send_and_read_head(
                &mut self.io,
                &mut self.buf,
                &mut up,
                &mut req_pipe,
                self.head.http10,
                &mut self.out,
                Watch::new(stall, limits, 0),
            );
            let result = match rule.timeout {
                Some(limit) => match self
                    .response_deadline
                    .run(tokio::time::Instant::from_std(started) + limit, phase)
                    .await
                {
                    Some(r) => r,
                    None => {
                        self.up_out = req_pipe.into_out();
                        return self.fail(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n");
                    }
                },
                None => phase.await,
            };
            match result {
                Ok(len) => break (len, req_pipe),
                Err(SendError::Client) => return Exchanged::ClientGone,
                Err(SendError::Stalled(kind)) => {
                    self.conn.socket.shared.metrics.timeout(kind);
                    debug!(kind = kind.as_str(), "request body stalled");
                    return Exchanged::Failed {
                        status: StatusCode::REQUEST_TIMEOUT,
                        text: "request body not received in time\n",
                        keep_client: false,
                    };
                }
                Err(SendError::HeadTooLarge) => {
                    self.conn
                        .socket
                        .shared
                        .metrics
                        .head_too_large(Side::Response);
                    debug!(cluster = &*cluster.name, "response head too large");
                    self.up_out = req_pipe.into_out();
                    return self.fail(
                        StatusCode::BAD_GATEWAY,
                        "upstream response head too large\n",
                    );
                }
                Err(SendError::MalformedBody) => {
                    return Exchanged::Failed {
                        status: StatusCode::BAD_REQUEST,
                        text: "malformed request body\n",
                        keep_client: false,
                    };
                }
                Err(SendError::Upstream { before_response }) => {
                    let idempotent = matches!(
                        method,
                        Method::GET
                            | Method::HEAD
                            | Method::OPTIONS
                            | Method::TRACE
                            | Method::PUT
                            | Method::DELETE
                    );
                    if before_response && up.reused && attempt == 1 && replayable && idempotent {
                        // Without a body the pipe still holds the whole request.
                        self.up_out = req_pipe.into_sent();
                        debug!(
                            cluster = &*cluster.name,
                            "kept-alive upstream connection was closed; retrying on a new one"
                        );
                        (up, endpoint) = match reconnect(cluster, endpoint).await {
                            Ok(connected) => connected,
                            Err(error) => {
                                debug!(cluster = &*cluster.name, %error, "upstream connect failed");
                                return self
                                    .fail(StatusCode::BAD_GATEWAY, "upstream connect error\n");
                            }
                        };
                        continue;
                    }
                    self.up_out = req_pipe.into_out();
                    debug!(cluster = &*cluster.name, "upstream request failed");
                    return self.fail(StatusCode::BAD_GATEWAY, "upstream request failed\n");
                }
            }
        };
        let mut req_pipe = req_pipe;
        endpoint.health.success();

        // The final response head.
        let framing = up.head.framing(head_request);
        if up.head.status == 101 {
            // Upgrades never take this path; a 101 here is a broken backend.
            self.up_out = req_pipe.into_out();
            return self.fail(StatusCode::BAD_GATEWAY, "upstream request failed\n");
        }
        let upstream_reusable = up.head.reusable(framing);
        if edits.any() {
            up.head.headers.lowercase_names();
            if up.head.connection.others {
                strip_connection_listed(&mut up.head.headers);
            }
            edits.apply(&mut up.head.headers);
        }
        let client_http10 = self.head.http10;
        let how = ClientResponse {
            framing,
            client_http10,
            // A body whose end only the close can tell an HTTP/1.0 client.
            close: close_after
                || (client_http10 && matches!(framing, Framing::Chunked | Framing::Eof)),
        };
        let status = up.head.status;
        let mut out = std::mem::take(&mut self.out);
        write::client_response(&mut out, &up.head, &how);
        up.buf.consume(status_len);
        let mut resp_pipe = Pipe::new(out);
        resp_pipe.start(
            framing,
            if how.chunked() {
                Encoding::Chunked
            } else {
                Encoding::Identity
            },
        );

        // The response body, while what is left of the request body still goes up (a backend
        // may answer before it has read everything).
        let mut request_done = req_pipe.finished();
        let mut request_abandoned = false;
        let limits = self.conn.socket.shared.limits;
        let stall = self
            .stall
            .get_or_insert_with(|| Stall::new(limits.backend_read));
        let mut watch = Watch::new(stall, limits, req_pipe.progress + resp_pipe.progress);
        let client_buf = &mut self.buf;
        let streamed = poll_fn(|cx| {
            if !request_done && !request_abandoned {
                match req_pipe.poll_run(cx, &mut self.io, client_buf, &mut up.io) {
                    Poll::Ready(Ok(())) => request_done = true,
                    // The backend stopped reading the request: its response still counts.
                    Poll::Ready(Err(PipeError::Sink(_))) => request_abandoned = true,
                    Poll::Ready(Err(PipeError::Source(_))) => {
                        return Poll::Ready(Err(SendError::Client));
                    }
                    Poll::Pending => {}
                }
            }
            match resp_pipe.poll_run(cx, &mut up.io, &mut up.buf, &mut self.io) {
                Poll::Ready(Ok(())) => Poll::Ready(Ok(())),
                Poll::Ready(Err(PipeError::Source(error))) => {
                    debug!(%error, "reading the response body failed");
                    Poll::Ready(Err(SendError::Upstream {
                        before_response: false,
                    }))
                }
                Poll::Ready(Err(PipeError::Sink(_))) => Poll::Ready(Err(SendError::Client)),
                Poll::Pending => {
                    if request_done
                        && !resp_pipe.blocked_on_sink
                        && client_gone(cx, &mut self.io, client_buf)
                    {
                        return Poll::Ready(Err(SendError::Client));
                    }
                    let waiting_for = if resp_pipe.blocked_on_sink {
                        TimeoutKind::ClientWrite
                    } else if !request_done && !request_abandoned && !req_pipe.blocked_on_sink {
                        TimeoutKind::RequestBody
                    } else {
                        TimeoutKind::BackendRead
                    };
                    let progress = req_pipe.progress + resp_pipe.progress;
                    watch
                        .poll(cx, progress, waiting_for)
                        .map(|kind| Err(SendError::Stalled(kind)))
                }
            }
        })
        .await;
        self.out = resp_pipe.into_out();
        self.up_out = req_pipe.into_out();
        match streamed {
            Ok(()) => {
                if upstream_reusable && request_done && up.buf.is_empty() {
                    endpoint
                        .pool
                        .as_deref()
                        .expect("checkout_or_connect and reconnect use the pool")
                        .checkin(up);
                }
                Exchanged::Responded {
                    status,
                    keep_client: !how.close && request_done,
                }
            }
            Err(SendError::Client | SendError::MalformedBody) => Exchanged::ClientGone,
            Err(SendError::Stalled(kind)) => {
                self.conn.socket.shared.metrics.timeout(kind);
                debug!(
                    cluster = &*cluster.name,
                    kind = kind.as_str(),
                    "exchange stalled after the response head; closing"
                );
                Exchanged::Responded {
                    status,
                    keep_client: false,
                }
            }
            // (No head is read while the body streams.)
            Err(SendError::Upstream { .. } | SendError::HeadTooLarge) => {
                debug!(
                    cluster = &*cluster.name,
                    "upstream response body ended early"
                );
                Exchanged::Responded {
                    status,
                    keep_client: false,
                }
            }
        }
    }

    /// A failure before any of the response reached the client. The client connection can
    /// carry on only if the request had no body (a body may be partly unread).
    fn fail(&self, status: StatusCode, text: &'static str) -> Exchanged {
        Exchanged::Failed {
            status,
            text,
            keep_client: self.head.body == Framing::None,
        }
    }

    /// Answers a request Gatehouse does not forward. Its body, if any, is not read: the
    /// connection closes after the answer.
    async fn answer_and_skip_body(
        &mut self,
        answer: Answer,
        edits: ResponseEdits<'_>,
        draining: bool,
    ) -> Next {
        self.fields.clear();
        let (status, body): (StatusCode, &[u8]) = match &answer {
            Answer::Text(status, text) => {
                self.fields
                    .push(CONTENT_TYPE.as_str().as_bytes(), b"text/plain");
                (*status, text.as_bytes())
            }
            Answer::Redirect(status, location) => {
                self.fields
                    .push(LOCATION.as_str().as_bytes(), location.as_bytes());
                (*status, b"")
            }
            Answer::Preflight(fields) => {
                fields.apply(&mut self.fields);
                (StatusCode::OK, b"")
            }
        };
        edits.apply(&mut self.fields);
        let close = !self.head.keep_alive || draining || self.head.body != Framing::None;
        match self.send_generated(status, body, close).await {
            Ok(()) if !close => Next::KeepGoing,
            _ => Next::Close,
        }
    }

    async fn send_generated(
        &mut self,
        status: StatusCode,
        body: &[u8],
        close: bool,
    ) -> io::Result<()> {
        self.out.clear();
        write::generated(
            &mut self.out,
            status,
            &self.fields,
            body,
            close,
            self.head.http10,
        );
        let result = self.io.write_all(&self.out).await;
        let flushed = match result {
            Ok(()) => self.io.flush().await,
            Err(e) => Err(e),
        };
        self.out.clear();
        flushed
    }
}

/// While waiting for the backend with the request sent: whether the client has closed its
/// connection (it is then gone, and the exchange is not kept until the backend answers).
/// Bytes it sends meanwhile are a pipelined request, kept in `buf` for later.
fn client_gone<I: AsyncRead + Unpin>(cx: &mut Context<'_>, io: &mut I, buf: &mut ReadBuf) -> bool {
    while !buf.is_full() {
        match buf.poll_fill(cx, io) {
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return true,
            Poll::Ready(Ok(_)) => {}
            Poll::Pending => return false,
        }
    }
    false
}

enum SendError {
    /// Reading from or writing to the client failed.
    Client,
    /// Nothing moved for the limit of the side being waited for.
    Stalled(TimeoutKind),
    /// The client's chunked body broke its framing.
    MalformedBody,
    /// The backend failed; `before_response`: no byte of its response arrived.
    Upstream { before_response: bool },
    /// The backend's response head is over `--max-response-head-bytes`.
    HeadTooLarge,
}

/// Writes the request (head and body) while reading the response head; interim responses are
/// passed to HTTP/1.1 clients. Returns the length of the final response head in the upstream
/// buffer (parsed into `up.head`).
async fn send_and_read_head<I>(
    client: &mut I,
    client_buf: &mut ReadBuf,
    up: &mut Conn,
    req_pipe: &mut Pipe,
    client_http10: bool,
    interim: &mut Vec<u8>,
    mut watch: Watch<'_>,
) -> Result<usize, SendError>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    interim.clear();
    let mut interim_written = 0;
    let mut received = false;
    poll_fn(|cx| {
        loop {
            if !req_pipe.finished() {
                match req_pipe.poll_run(cx, client, client_buf, &mut up.io) {
                    Poll::Ready(Ok(())) | Poll::Pending => {}
                    Poll::Ready(Err(PipeError::Source(error))) => {
                        debug!(%error, "reading the request body failed");
                        return Poll::Ready(Err(if error.kind() == io::ErrorKind::InvalidData {
                            SendError::MalformedBody
                        } else {
                            SendError::Client
                        }));
                    }
                    Poll::Ready(Err(PipeError::Sink(error))) => {
                        debug!(%error, "writing the request upstream failed");
                        return Poll::Ready(Err(SendError::Upstream {
                            before_response: !received,
                        }));
                    }
                }
            }
            while interim_written < interim.len() {
                match Pin::new(&mut *client).poll_write(cx, &interim[interim_written..]) {
                    Poll::Ready(Ok(n)) if n > 0 => interim_written += n,
                    Poll::Ready(_) => return Poll::Ready(Err(SendError::Client)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            if interim_written > 0 {
                if let Poll::Ready(Err(_)) = Pin::new(&mut *client).poll_flush(cx) {
                    return Poll::Ready(Err(SendError::Client));
                }
                interim.clear();
                interim_written = 0;
            }
            if !up.buf.is_empty() {
                match up.head.parse(up.buf.data()) {
                    Ok(Some(len)) => {
                        let status = up.head.status;
                        if (100..200).contains(&status) && status != 101 {
                            if !client_http10 {
                                write::interim(interim, &up.head);
                            }
                            up.buf.consume(len);
                            continue;
                        }
                        return Poll::Ready(Ok(len));
                    }
                    Ok(None) if up.buf.is_full() && !up.room_for_head() => {
                        return Poll::Ready(Err(SendError::HeadTooLarge));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        debug!(error = e.reason(), "invalid response head from upstream");
                        return Poll::Ready(Err(SendError::Upstream {
                            before_response: false,
                        }));
                    }
                }
            }
            match up.buf.poll_fill(cx, &mut up.io) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                    return Poll::Ready(Err(SendError::Upstream {
                        before_response: !received,
                    }));
                }
                Poll::Ready(Ok(_)) => received = true,
                Poll::Pending => {
                    if req_pipe.finished() && client_gone(cx, client, client_buf) {
                        return Poll::Ready(Err(SendError::Client));
                    }
                    // A client that stops sending its body mid-way: the response deadline
                    // bounds the backend, this bounds the client (even with no deadline).
                    if !req_pipe.finished() && !req_pipe.blocked_on_sink {
                        let progress = req_pipe.progress;
                        return watch
                            .poll(cx, progress, TimeoutKind::RequestBody)
                            .map(|kind| Err(SendError::Stalled(kind)));
                    }
                    return Poll::Pending;
                }
            }
        }
    })
    .await
}
