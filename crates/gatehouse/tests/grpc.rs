//! GRPCRoute end to end over real sockets: a tonic client calls through the gateway to
//! tonic-served gRPC backends (cleartext HTTP/2 to Service ports without an appProtocol), and
//! checks method and header matches, header filters, the weighted split, trailers after data,
//! the gateway's own answers in gRPC's terms (UNIMPLEMENTED, UNAVAILABLE,
//! DEADLINE_EXCEEDED), and a call's `grpc-timeout` bounding the gateway's wait.

mod support;

use bytes::Bytes;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::*;
use tonic::codegen::{BoxFuture, Context, Poll, Service, StdError};
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
use tonic::{Code, Status};

const SERVICE: &str = "gatehouse.test.Echo";

/// A gRPC backend: every unary method answers `<backend> <method> <message> via=<x-via>`;
/// `Stream` sends one message, then ends with ABORTED and a custom trailer (`x-trailer`)
/// after the data; `Slow` answers after two seconds.
#[derive(Clone)]
struct Backend {
    name: &'static str,
}

struct Unary {
    backend: &'static str,
    method: String,
}

impl tonic::server::UnaryService<String> for Unary {
    type Response = String;
    type Future = BoxFuture<tonic::Response<String>, Status>;

    fn call(&mut self, req: tonic::Request<String>) -> Self::Future {
        let via = req
            .metadata()
            .get("x-via")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string();
        let reply = format!(
            "{} {} {} via={via}",
            self.backend,
            self.method,
            req.get_ref()
        );
        let slow = self.method == "Slow";
        Box::pin(async move {
            if slow {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Ok(tonic::Response::new(reply))
        })
    }
}

type Items = futures_util::stream::Iter<std::vec::IntoIter<Result<String, Status>>>;

struct Streaming(&'static str);

impl tonic::server::ServerStreamingService<String> for Streaming {
    type Response = String;
    type ResponseStream = Items;
    type Future = BoxFuture<tonic::Response<Items>, Status>;

    fn call(&mut self, _req: tonic::Request<String>) -> Self::Future {
        let mut trailer = MetadataMap::new();
        trailer.insert("x-trailer", "kept".parse().unwrap());
        let items = vec![
            Ok(format!("{} first", self.0)),
            Err(Status::with_metadata(Code::Aborted, "after data", trailer)),
        ];
        Box::pin(async move { Ok(tonic::Response::new(futures_util::stream::iter(items))) })
    }
}

impl<B> Service<http::Request<B>> for Backend
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let backend = self.name;
        let method = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_string();
        Box::pin(async move {
            let mut grpc =
                tonic::server::Grpc::new(tonic_prost::ProstCodec::<String, String>::default());
            Ok(if method == "Stream" {
                grpc.server_streaming(Streaming(backend), req).await
            } else {
                grpc.unary(Unary { backend, method }, req).await
            })
        })
    }
}

/// Serves `Backend { name }` over h2c on a fresh loopback port (tonic's gRPC server on
/// hyper's HTTP/2, as tonic's own transport does).
async fn grpc_backend(name: &'static str) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = hyper_util::service::TowerToHyperService::new(Backend { name });
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let service = service.clone();
            tokio::spawn(async move {
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
            });
        }
    });
    addr
}

struct Client {
    channel: Channel,
    origin: http::Uri,
}

impl Client {
    /// A channel to the gateway on `port` whose calls carry `:authority` `host:port`.
    async fn new(port: u16, host: &str) -> Client {
        let origin: http::Uri = format!("http://{host}:{port}").parse().unwrap();
        // Connect to loopback, but name `host` in every call (the channel's origin).
        let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .origin(origin.clone())
            .connect()
            .await
            .unwrap();
        Client { channel, origin }
    }

    fn grpc(&self) -> tonic::client::Grpc<Channel> {
        tonic::client::Grpc::with_origin(self.channel.clone(), self.origin.clone())
    }

    async fn call(
        &self,
        method: &str,
        message: &str,
        metadata: &[(&'static str, &'static str)],
    ) -> Result<tonic::Response<String>, Status> {
        let mut req = tonic::Request::new(message.to_string());
        for (k, v) in metadata {
            req.metadata_mut().insert(*k, v.parse().unwrap());
        }
        self.send(method, req).await
    }

    async fn send(
        &self,
        method: &str,
        req: tonic::Request<String>,
    ) -> Result<tonic::Response<String>, Status> {
        let mut grpc = self.grpc();
        grpc.ready().await.unwrap();
        let path = format!("/{SERVICE}/{method}").parse().unwrap();
        grpc.unary(
            req,
            path,
            tonic_prost::ProstCodec::<String, String>::default(),
        )
        .await
    }

    /// The reply of a call that must succeed.
    async fn reply(&self, method: &str, metadata: &[(&'static str, &'static str)]) -> String {
        match self.call(method, "hi", metadata).await {
            Ok(resp) => resp.into_inner(),
            Err(status) => panic!("{method}: {status:?}"),
        }
    }
}

/// What a call carrying `grpc-timeout: <deadline>` came back with: its gRPC status and
/// message (from the trailers-only answer or the trailers after the data), and how long it
/// took. Sent over hyper's HTTP/2 client: tonic's channel enforces a call's deadline itself
/// and would race the gateway's timer.
async fn call_within(port: u16, method: &str, deadline: &str) -> (String, String, Duration) {
    use http_body_util::BodyExt;
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    // One empty message: the compression flag and a zero length.
    let req = http::Request::post(format!("http://grpc.example.com/{SERVICE}/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", deadline)
        .body(http_body_util::Full::new(Bytes::from_static(&[
            0, 0, 0, 0, 0,
        ])))
        .unwrap();
    let started = Instant::now();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let (parts, body) = resp.into_parts();
    let trailers = body.collect().await.unwrap().trailers().cloned();
    let waited = started.elapsed();
    let fields = trailers.unwrap_or(parts.headers);
    let field = |name| {
        fields
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    (field("grpc-status"), field("grpc-message"), waited)
}

fn grpc_route(name: &str, body: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  parentRefs: [{{name: gw}}]\n  hostnames: [grpc.example.com]\n{body}\n"
    )
}

async fn gateway_with_backends() -> (Gateway, u16) {
    let port = free_port();
    let mut services = String::new();
    for name in ["a", "b", "c"] {
        services.push_str(&service(name, &[grpc_backend(name).await], None));
    }
    let dead: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    services.push_str(&service("dead", &[dead], None));
    let route = grpc_route(
        "echo",
        &format!(
            r#"  rules:
  - matches: [{{method: {{service: {SERVICE}, method: Say}}}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {{set: [{{name: x-via, value: gatehouse}}]}}
    - type: ResponseHeaderModifier
      responseHeaderModifier: {{add: [{{name: x-served, value: grpcroute}}]}}
    backendRefs: [{{name: a, port: 80}}]
  - matches: [{{method: {{method: Ping}}}}]
    backendRefs: [{{name: b, port: 80}}]
  - matches: [{{method: {{service: {SERVICE}}}, headers: [{{name: x-tenant, value: blue}}]}}]
    backendRefs: [{{name: c, port: 80}}]
  - matches: [{{method: {{type: RegularExpression, method: "S(tream|low)"}}}}]
    backendRefs: [{{name: a, port: 80}}]
  - matches: [{{method: {{service: {SERVICE}, method: Split}}}}]
    backendRefs: [{{name: a, port: 80, weight: 1}}, {{name: b, port: 80, weight: 3}}]
  - matches: [{{method: {{service: {SERVICE}, method: Dead}}}}]
    backendRefs: [{{name: dead, port: 80}}]"#
        ),
    );
    let gw = Gateway::start_with(
        &[
            ("gateway.yaml", gateway(&[("http", port)])),
            ("backends.yaml", services),
            ("routes.yaml", route),
        ],
        // A short default request timeout, for DEADLINE_EXCEEDED (GRPCRoute has no timeouts).
        |o| o.default_request_timeout = Some(Duration::from_secs(1)),
    )
    .await;
    assert!(gw.errors().is_empty(), "{:?}", gw.errors());
    (gw, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_route_by_method_and_header() {
    let (gw, port) = gateway_with_backends().await;
    let client = Client::new(port, "grpc.example.com").await;

    // Exact service and method, with the rule's header filters on both directions.
    let resp = client
        .call("Say", "hi", &[])
        .await
        .unwrap_or_else(|s| panic!("Say: {s:?}"));
    assert_eq!(resp.metadata().get("x-served").unwrap(), "grpcroute");
    assert_eq!(resp.get_ref(), "a Say hi via=gatehouse");
    // A method of any service.
    assert_eq!(client.reply("Ping", &[]).await, "b Ping hi via=-");
    // A service with a header match; without the header, no rule takes the call.
    assert_eq!(
        client.reply("Other", &[("x-tenant", "blue")]).await,
        "c Other hi via=-"
    );
    let unmatched = client.call("Other", "hi", &[]).await.unwrap_err();
    assert_eq!(unmatched.code(), Code::Unimplemented, "{unmatched:?}");
    assert_eq!(unmatched.message(), "no route for this request");
    // A hostname no route serves: also the gateway's UNIMPLEMENTED.
    let elsewhere = Client::new(port, "other.example.com").await;
    let status = elsewhere.call("Say", "hi", &[]).await.unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_after_data_reach_the_client() {
    let (gw, port) = gateway_with_backends().await;
    let client = Client::new(port, "grpc.example.com").await;
    let mut grpc = client.grpc();
    grpc.ready().await.unwrap();
    let path = format!("/{SERVICE}/Stream").parse().unwrap();
    let resp = grpc
        .server_streaming(
            tonic::Request::new("go".to_string()),
            path,
            tonic_prost::ProstCodec::<String, String>::default(),
        )
        .await
        .unwrap();
    let mut stream = resp.into_inner();
    assert_eq!(stream.message().await.unwrap().as_deref(), Some("a first"));
    // The status and the custom field come in the trailers, after the message.
    let status = stream.message().await.unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(status.message(), "after data");
    assert_eq!(status.metadata().get("x-trailer").unwrap(), "kept");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_backends_split_calls() {
    let (gw, port) = gateway_with_backends().await;
    let client = Client::new(port, "grpc.example.com").await;
    let (mut a, mut b) = (0, 0);
    for _ in 0..200 {
        let reply = client.reply("Split", &[]).await;
        match reply.split(' ').next() {
            Some("a") => a += 1,
            Some("b") => b += 1,
            other => panic!("unexpected backend {other:?}"),
        }
    }
    // Weights 1:3 over 200 calls: 50 to a expected; the bounds are far outside chance.
    assert!((25..=80).contains(&a), "a={a} b={b}");
    assert_eq!(a + b, 200);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_errors_are_grpc_statuses() {
    let (gw, port) = gateway_with_backends().await;
    let client = Client::new(port, "grpc.example.com").await;
    // No backend listening: UNAVAILABLE (the HTTP 502 the gateway would send).
    let status = client.call("Dead", "hi", &[]).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    // The default request timeout (1s) passes before the backend's answer (2s).
    let status = client.call("Slow", "hi", &[]).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(status.message(), "upstream timed out");
    // The same gateway still answers plain HTTP/1.1 errors as HTTP.
    let resp = support::client()
        .get(url(port, "/nothing"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_deadline_bounds_the_gateways_wait() {
    let (gw, port) = gateway_with_backends().await;
    // `Slow` answers after 2 s; the route's timeout (the default request timeout) is 1 s.
    let (status, message, waited) = call_within(port, "Slow", "300m").await;
    assert_eq!(
        (status.as_str(), message.as_str()),
        ("4", "upstream timed out")
    );
    assert!(waited < Duration::from_millis(900), "waited {waited:?}");
    // A deadline beyond the route's timeout does not lengthen it.
    let (status, _, waited) = call_within(port, "Slow", "10S").await;
    assert_eq!(status, "4");
    assert!(waited >= Duration::from_secs(1), "waited {waited:?}");
    assert!(waited < Duration::from_millis(1900), "waited {waited:?}");
    // A malformed deadline is left to the backend: the route's timeout applies.
    let (status, _, waited) = call_within(port, "Slow", "300ms").await;
    assert_eq!(status, "4");
    assert!(waited >= Duration::from_secs(1), "waited {waited:?}");
    // A call that makes its deadline is served (OK in the trailers after the reply).
    let (status, _, _) = call_within(port, "Ping", "5S").await;
    assert_eq!(status, "0");
    gw.stop().await;
}
