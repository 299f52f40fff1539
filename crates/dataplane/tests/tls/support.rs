//! What the TLS tests share beyond `common` and the test kit: what a client saw of the
//! server's certificate, small backends (HTTP, HTTPS, TLS echo, TCP echo), and clients.

pub use crate::common::*;
pub use gatehouse_testkit::certs::*;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use prometheus_client::registry::Registry;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

// ---------------------------------------------------------------------------------------------
// Certificates

/// What the client saw of the server's leaf certificate.
#[derive(Debug)]
pub struct Leaf {
    pub dns_names: Vec<String>,
    pub serial: u64,
    pub not_after: i64,
}

pub fn leaf_of(stream: &TlsStream<TcpStream>) -> Leaf {
    let der = &stream.get_ref().1.peer_certificates().unwrap()[0];
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    let dns_names = cert
        .subject_alternative_name()
        .unwrap()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Leaf {
        dns_names,
        serial: cert
            .raw_serial()
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)),
        not_after: cert.validity().not_after.timestamp(),
    }
}

// ---------------------------------------------------------------------------------------------
// Backends

type Body = Full<Bytes>;

/// Plain HTTP backend that describes the request it got.
pub async fn start_http_backend(id: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| async move {
                    let header = |n: &str| {
                        req.headers()
                            .get(n)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned()
                    };
                    let text = format!(
                        "backend={id}\nproto={}\nhost={}\n",
                        header("x-forwarded-proto"),
                        header("host"),
                    );
                    Ok::<_, Infallible>(Response::new(Body::from(text)))
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// HTTPS backend (HTTP/1.1 and h2 by ALPN) that reports the SNI it got, whether the client
/// presented a certificate, and the HTTP version.
pub async fn start_https_backend(pair: &Pair, client_ca: Option<&str>) -> SocketAddr {
    let acceptor = TlsAcceptor::from(server_config(pair, client_ca, &[b"h2", b"http/1.1"]));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let (_, conn) = tls.get_ref();
                let sni = conn.server_name().unwrap_or("").to_owned();
                let client = if conn.peer_certificates().is_some() {
                    "present"
                } else {
                    "none"
                };
                let service = service_fn(move |req: Request<Incoming>| {
                    let text = format!(
                        "backend=https\nsni={sni}\nclient={client}\nversion={:?}\nproto={}\n",
                        req.version(),
                        req.headers()
                            .get("x-forwarded-proto")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                    );
                    async move { Ok::<_, Infallible>(Response::new(Body::from(text))) }
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}

async fn echo<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S, prefix: &[u8]) {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let mut out = prefix.to_vec();
                out.extend_from_slice(&buf[..n]);
                if s.write_all(&out).await.is_err() {
                    break;
                }
            }
        }
    }
}

/// TLS echo server (its own certificate): answers each read with `tls:` + the bytes.
pub async fn start_tls_echo(pair: &Pair) -> SocketAddr {
    let acceptor = TlsAcceptor::from(server_config(pair, None, &[]));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(stream).await {
                    echo(tls, b"tls:").await;
                }
            });
        }
    });
    addr
}

/// Plain TCP echo server: answers each read with `tcp:` + the bytes.
pub async fn start_tcp_echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(echo(stream, b"tcp:"));
        }
    });
    addr
}

// ---------------------------------------------------------------------------------------------
// Metrics

/// The count of failed handshakes for `reason`.
pub fn failures(registry: &Registry, reason: &str) -> f64 {
    metric(
        registry,
        &format!(r#"gatehouse_tls_handshake_failures_total{{reason="{reason}"}}"#),
    )
}

/// The count of failed handshakes for `reason` once it reaches `expected`, or whatever it is
/// after two seconds. The server counts a failure after it has sent its alert, so a client can
/// see the refusal a moment before the counter moves; asserting at once is a race.
pub async fn failures_reaching(registry: &Registry, reason: &str, expected: f64) -> f64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let seen = failures(registry, reason);
        if seen == expected || std::time::Instant::now() >= deadline {
            return seen;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Clients

pub async fn connect(
    port: u16,
    sni: &str,
    config: &Arc<ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let name = ServerName::try_from(sni.to_owned()).unwrap();
    TlsConnector::from(config.clone()).connect(name, tcp).await
}

#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: String,
}

impl Answer {
    pub fn field(&self, key: &str) -> &str {
        self.body
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {key} in {self:?}"))
    }
}

pub async fn read_answer(resp: Response<Incoming>) -> Result<Answer, String> {
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(Answer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// One HTTP/1.1 request on an established (TLS) stream.
pub async fn get_on<S>(stream: S, host: &str, path: &str) -> Result<Answer, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", host)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    read_answer(resp).await
}

/// Handshake with `sni`, then `GET path` with Host `sni`.
pub async fn https_get(
    port: u16,
    sni: &str,
    config: &Arc<ClientConfig>,
    path: &str,
) -> Result<Answer, String> {
    let stream = connect(port, sni, config)
        .await
        .map_err(|e| e.to_string())?;
    get_on(stream, sni, path).await
}

/// Plain HTTP/1.1 GET.
pub async fn http_get(port: u16, host: &str, path: &str) -> Answer {
    let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    get_on(stream, host, path).await.unwrap()
}
