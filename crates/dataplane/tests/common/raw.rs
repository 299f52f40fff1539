//! Scripted HTTP/1 backends that speak raw bytes and record every request as received, and
//! raw-socket clients: for tests that need framing and bytes exactly as they cross the wire.

use super::*;
use gatehouse_dataplane::Options;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What a scripted backend does with one request: the bytes to answer, and whether to close
/// the connection afterwards. `None`: close without answering.
pub type Reply = Option<(Vec<u8>, bool)>;

pub struct RawBackend {
    pub addr: SocketAddr,
    /// Every request as received (head and body bytes).
    pub requests: Arc<Mutex<Vec<Vec<u8>>>>,
    pub connections: Arc<AtomicUsize>,
}

/// Reads one request (head, then a Content-Length or chunked body) from `stream`.
pub async fn read_request(stream: &mut TcpStream, pending: &mut Vec<u8>) -> Option<Vec<u8>> {
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head_len = end + 4;
            let head = String::from_utf8_lossy(&pending[..head_len]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map(|v| v.trim().parse::<usize>().unwrap());
            let chunked = head.contains("transfer-encoding: chunked");
            loop {
                let total = if chunked {
                    pending[head_len..]
                        .windows(5)
                        .position(|w| w == b"0\r\n\r\n")
                        .map(|p| head_len + p + 5)
                } else {
                    Some(head_len + length.unwrap_or(0))
                };
                if let Some(total) = total.filter(|&t| t <= pending.len()) {
                    return Some(pending.drain(..total).collect());
                }
                let mut buf = [0u8; 4096];
                let n = stream.read(&mut buf).await.ok()?;
                if n == 0 {
                    return None;
                }
                pending.extend_from_slice(&buf[..n]);
            }
        }
        let mut buf = [0u8; 4096];
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        pending.extend_from_slice(&buf[..n]);
    }
}

/// `reply(i, request)` answers the `i`-th request of a connection.
pub async fn raw_backend<F>(reply: F) -> RawBackend
where
    F: Fn(usize, &[u8]) -> Reply + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let connections = Arc::new(AtomicUsize::new(0));
    let reply = Arc::new(reply);
    let (seen, count) = (requests.clone(), connections.clone());
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            count.fetch_add(1, Ordering::SeqCst);
            let (seen, reply) = (seen.clone(), reply.clone());
            tokio::spawn(async move {
                let mut pending = Vec::new();
                for i in 0.. {
                    let Some(request) = read_request(&mut stream, &mut pending).await else {
                        return;
                    };
                    seen.lock().unwrap().push(request.clone());
                    match reply(i, &request) {
                        None => return,
                        Some((bytes, close)) => {
                            if stream.write_all(&bytes).await.is_err() || close {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    RawBackend {
        addr,
        requests,
        connections,
    }
}

pub fn ok(body: &str) -> Reply {
    Some((
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
        false,
    ))
}

/// The path of a raw request.
pub fn path_of(request: &[u8]) -> String {
    String::from_utf8_lossy(request)
        .split(' ')
        .nth(1)
        .unwrap_or("")
        .to_owned()
}

/// A data plane on a free port routing everything to `backend`.
pub async fn proxy_to(backend: SocketAddr) -> (u16, Arc<gatehouse_dataplane::DataPlane>) {
    let (port, dp, _) = proxy_to_endpoints(vec![backend], Options::default()).await;
    (port, dp)
}

/// Sends `request` on a new connection to `port` and reads the response.
pub async fn exchange_once(port: u16, request: &[u8]) -> String {
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    c.write_all(request).await.unwrap();
    let mut pending = Vec::new();
    read_response(&mut c, &mut pending, false).await
}

/// Reads one response (head and Content-Length, chunked or no body) from `stream`.
pub async fn read_response(
    stream: &mut TcpStream,
    pending: &mut Vec<u8>,
    head_request: bool,
) -> String {
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head_len = end + 4;
            let head = String::from_utf8_lossy(&pending[..head_len]).to_ascii_lowercase();
            let total = if head_request
                || head.starts_with("http/1.1 1")
                || head.starts_with("http/1.1 204")
                || head.starts_with("http/1.1 304")
            {
                Some(head_len)
            } else if head.contains("transfer-encoding: chunked") {
                pending[head_len..]
                    .windows(5)
                    .position(|w| w == b"0\r\n\r\n")
                    .map(|p| head_len + p + 5)
            } else {
                // Without a length the body runs until the close.
                head.lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .map(|n| head_len + n.trim().parse::<usize>().unwrap())
            };
            if let Some(total) = total.filter(|&t| t <= pending.len()) {
                let resp: Vec<u8> = pending.drain(..total).collect();
                return String::from_utf8_lossy(&resp).into_owned();
            }
        }
        let mut buf = [0u8; 8192];
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no complete response within 5 s: {:?}",
                    String::from_utf8_lossy(pending)
                )
            })
            .unwrap();
        if n == 0 {
            let resp: Vec<u8> = std::mem::take(pending);
            return String::from_utf8_lossy(&resp).into_owned();
        }
        pending.extend_from_slice(&buf[..n]);
    }
}

pub async fn closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 16];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}
