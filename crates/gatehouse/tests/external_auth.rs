//! End to end over real sockets: the ExternalAuth filter, at a Gateway listener (before
//! routing, GatewayListenerFilters) and at an HTTPRoute rule (in filter order), against a real
//! HTTP authorization server and a real gRPC one speaking Envoy's `Authorization/Check` over
//! h2c. Allows go on with the server's headers, denials reach the client as the server wrote
//! them, and a server that cannot be asked refuses the request (fail closed).

mod support;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use serde_json::Value;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use support::*;
use tokio::sync::mpsc;

/// A request as an authorization server received it.
#[derive(Debug)]
struct Asked {
    method: String,
    path: String,
    headers: http::HeaderMap,
    body: Bytes,
}

type Reply = http::Response<http_body_util::Full<Bytes>>;

/// An HTTP authorization server: `Bearer good` is allowed (with `x-user: alice`,
/// `x-auth-extra: 1` and a Content-Type of its own), `Bearer redirect` is sent to a login
/// page, anything else gets a 401 with a challenge and a body.
async fn http_auth_server() -> (SocketAddr, mpsc::UnboundedReceiver<Asked>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: http::Request<Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await.unwrap().to_bytes();
                        let auth = parts
                            .headers
                            .get("authorization")
                            .map(|v| v.to_str().unwrap().to_string());
                        let _ = tx.send(Asked {
                            method: parts.method.to_string(),
                            path: parts.uri.to_string(),
                            headers: parts.headers,
                            body,
                        });
                        let reply = match auth.as_deref() {
                            Some("Bearer good") => http::Response::builder()
                                .header("x-user", "alice")
                                .header("x-auth-extra", "1")
                                .header("content-type", "text/plain")
                                .body("ok".into()),
                            Some("Bearer redirect") => http::Response::builder()
                                .status(302)
                                .header("location", "https://login.example/start")
                                .body(Bytes::new().into()),
                            _ => http::Response::builder()
                                .status(401)
                                .header("www-authenticate", "Bearer realm=\"cafe\"")
                                .body("denied by auth\n".into()),
                        };
                        Ok::<Reply, Infallible>(reply.unwrap())
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    (addr, rx)
}

/// The messages of `envoy.service.auth.v3`, the server's side: written here again from the
/// proto files rather than shared with the data plane, so that a wrong field number on one
/// side fails this test.
mod authz {
    use std::collections::BTreeMap;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CheckRequest {
        #[prost(message, optional, tag = "1")]
        pub attributes: Option<AttributeContext>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AttributeContext {
        #[prost(message, optional, tag = "1")]
        pub source: Option<Peer>,
        #[prost(message, optional, tag = "4")]
        pub request: Option<Request>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Peer {
        #[prost(message, optional, tag = "1")]
        pub address: Option<Address>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Address {
        #[prost(message, optional, tag = "1")]
        pub socket_address: Option<SocketAddress>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SocketAddress {
        #[prost(string, tag = "2")]
        pub address: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Request {
        #[prost(message, optional, tag = "2")]
        pub http: Option<HttpRequest>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HttpRequest {
        #[prost(string, tag = "2")]
        pub method: String,
        #[prost(btree_map = "string, string", tag = "3")]
        pub headers: BTreeMap<String, String>,
        #[prost(string, tag = "4")]
        pub path: String,
        #[prost(string, tag = "5")]
        pub host: String,
        #[prost(string, tag = "6")]
        pub scheme: String,
        #[prost(string, tag = "10")]
        pub protocol: String,
        #[prost(string, tag = "11")]
        pub body: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CheckResponse {
        #[prost(message, optional, tag = "1")]
        pub status: Option<Status>,
        #[prost(message, optional, tag = "2")]
        pub denied_response: Option<Denied>,
        #[prost(message, optional, tag = "3")]
        pub ok_response: Option<Ok>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Status {
        #[prost(int32, tag = "1")]
        pub code: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Denied {
        #[prost(message, optional, tag = "1")]
        pub status: Option<HttpStatus>,
        #[prost(message, repeated, tag = "2")]
        pub headers: Vec<HeaderValueOption>,
        #[prost(string, tag = "3")]
        pub body: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HttpStatus {
        #[prost(int32, tag = "1")]
        pub code: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Ok {
        #[prost(message, repeated, tag = "2")]
        pub headers: Vec<HeaderValueOption>,
        #[prost(string, repeated, tag = "5")]
        pub headers_to_remove: Vec<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HeaderValueOption {
        #[prost(message, optional, tag = "1")]
        pub header: Option<HeaderValue>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HeaderValue {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(string, tag = "2")]
        pub value: String,
    }
}

fn header(key: &str, value: &str) -> authz::HeaderValueOption {
    authz::HeaderValueOption {
        header: Some(authz::HeaderValue {
            key: key.into(),
            value: value.into(),
        }),
    }
}

type GrpcBody = http_body_util::StreamBody<
    futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>,
>;

/// A gRPC authorization server over h2c: `Bearer good` is allowed (sets `x-user`, removes
/// Authorization), `Bearer broken` fails the call (grpc-status 13), anything else is denied
/// with a 401 of its own.
async fn grpc_auth_server() -> (SocketAddr, mpsc::UnboundedReceiver<authz::HttpRequest>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: http::Request<Incoming>| {
                    let tx = tx.clone();
                    async move {
                        assert_eq!(
                            req.uri().path(),
                            "/envoy.service.auth.v3.Authorization/Check"
                        );
                        assert_eq!(req.headers()["content-type"], "application/grpc");
                        let mut body = req.into_body().collect().await.unwrap().to_bytes();
                        assert_eq!(body.get_u8(), 0, "uncompressed");
                        let len = body.get_u32() as usize;
                        assert_eq!(body.len(), len);
                        let check = authz::CheckRequest::decode(body).unwrap();
                        let http = check.attributes.unwrap().request.unwrap().http.unwrap();
                        let auth = http.headers.get("authorization").cloned();
                        let _ = tx.send(http);
                        let (grpc_status, answer) = match auth.as_deref() {
                            Some("Bearer good") => (
                                "0",
                                authz::CheckResponse {
                                    status: Some(authz::Status { code: 0 }),
                                    denied_response: None,
                                    ok_response: Some(authz::Ok {
                                        headers: vec![header("x-user", "grpc-alice")],
                                        headers_to_remove: vec!["authorization".into()],
                                    }),
                                },
                            ),
                            Some("Bearer broken") => ("13", authz::CheckResponse::default()),
                            _ => (
                                "0",
                                authz::CheckResponse {
                                    status: Some(authz::Status { code: 7 }),
                                    denied_response: Some(authz::Denied {
                                        status: Some(authz::HttpStatus { code: 401 }),
                                        headers: vec![header("www-authenticate", "Bearer")],
                                        body: "denied by grpc auth\n".into(),
                                    }),
                                    ok_response: None,
                                },
                            ),
                        };
                        let mut frames = Vec::new();
                        if grpc_status == "0" {
                            let message = answer.encode_to_vec();
                            let mut framed = BytesMut::new();
                            framed.put_u8(0);
                            framed.put_u32(message.len() as u32);
                            framed.extend_from_slice(&message);
                            frames.push(Ok(Frame::data(framed.freeze())));
                        }
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", grpc_status.parse().unwrap());
                        frames.push(Ok(Frame::trailers(trailers)));
                        let body: GrpcBody =
                            http_body_util::StreamBody::new(futures_util::stream::iter(frames));
                        Ok::<_, Infallible>(
                            http::Response::builder()
                                .header("content-type", "application/grpc")
                                .body(body)
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    (addr, rx)
}

/// GatewayClass and Gateway `gw`: `guarded` (HTTP auth before routing, path prefix
/// `/check/`), `open` (no listener filter), `grpc` (gRPC auth before routing, two headers
/// allowed) and `broken` (an auth server that does not exist).
fn gateway_with_filters(guarded: u16, open: u16, grpc: u16, broken: u16) -> String {
    format!(
        r#"{class}---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw, namespace: default}}
spec:
  gatewayClassName: gatehouse
  listeners:
  - name: guarded
    port: {guarded}
    protocol: HTTP
    filters:
      requests:
      - type: ExternalAuth
        externalAuth:
          protocol: HTTP
          backendRef: {{name: auth, port: 80}}
          http: {{path: /check/}}
  - {{name: open, port: {open}, protocol: HTTP}}
  - name: grpc
    port: {grpc}
    protocol: HTTP
    filters:
      requests:
      - type: ExternalAuth
        externalAuth:
          protocol: GRPC
          backendRef: {{name: grpc-auth, port: 80}}
          grpc: {{allowedHeaders: [authorization, x-allowed]}}
  - name: broken
    port: {broken}
    protocol: HTTP
    filters:
      requests:
      - type: ExternalAuth
        externalAuth: {{protocol: HTTP, backendRef: {{name: missing, port: 80}}, http: {{}}}}
"#,
        class = gatehouse_testkit::manifests::gateway_class()
    )
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Asked>) -> Asked {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("the authorization server is asked")
        .unwrap()
}

fn header_of(json: &Value, name: &str) -> Option<String> {
    json["headers"][name][0].as_str().map(str::to_string)
}

fn auth_counter(cluster: &str, result: &str) -> String {
    format!("gatehouse_external_auth_checks_total{{cluster=\"{cluster}\",result=\"{result}\"}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_auth_guards_listeners_before_routing_and_rules_in_filter_order() {
    let app = echo("app").await;
    let alice_app = echo("alice-app").await;
    let (auth, mut asked) = http_auth_server().await;
    let (grpc_auth, mut grpc_asked) = grpc_auth_server().await;
    let down: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let (guarded, open, grpc, broken) = (free_port(), free_port(), free_port(), free_port());
    let mut services = service("app", &[app], None);
    services.push_str(&service("alice-app", &[alice_app], None));
    services.push_str(&service("auth", &[auth], None));
    services.push_str(&service("grpc-auth", &[grpc_auth], None));
    services.push_str(&service("down", &[down], None));
    let routes = route(
        "app",
        r#"  rules:
  - matches: [{path: {value: /whoami}, headers: [{name: x-user, value: alice}]}]
    backendRefs: [{name: alice-app, port: 80}]
  - matches: [{path: {value: /rule}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {remove: [x-user]}
    - type: ExternalAuth
      externalAuth:
        protocol: HTTP
        backendRef: {name: auth, port: 80}
        http: {allowedHeaders: [x-extra], allowedResponseHeaders: [x-user]}
        forwardBody: {maxSize: 16}
    backendRefs: [{name: app, port: 80}]
  - matches: [{path: {value: /down}}]
    filters:
    - type: ExternalAuth
      externalAuth: {protocol: HTTP, backendRef: {name: down, port: 80}, http: {}}
    backendRefs: [{name: app, port: 80}]
  - backendRefs: [{name: app, port: 80}]"#,
    );
    let gw = Gateway::start(&[
        (
            "gateway.yaml",
            gateway_with_filters(guarded, open, grpc, broken),
        ),
        ("services.yaml", services),
        ("routes.yaml", routes),
    ])
    .await;
    let c = client();

    // The guarded listener: no credentials, the server's 401 (challenge and body) reaches the
    // client, and the server was asked with the prefix, Host and a zero Content-Length only.
    let resp = c
        .get(url(guarded, "/menu?day=1"))
        .header("x-other", "not sent")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.headers()["www-authenticate"], "Bearer realm=\"cafe\"");
    assert_eq!(resp.text().await.unwrap(), "denied by auth\n");
    let a = next(&mut asked).await;
    assert_eq!(a.method, "GET");
    assert_eq!(a.path, "/check/menu?day=1");
    assert_eq!(a.headers["host"], format!("{HOST}:{guarded}"));
    assert_eq!(a.headers["content-length"], "0");
    assert!(a.headers.get("x-other").is_none(), "{:?}", a.headers);
    assert!(a.body.is_empty());

    // Allowed: the request goes on with the server's headers, but not with the fields that
    // describe the server's own response.
    let resp = c
        .get(url(guarded, "/menu"))
        .header("authorization", "Bearer good")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let json = echo_json(resp).await;
    assert_eq!(json["name"], "app");
    assert_eq!(header_of(&json, "x-user").as_deref(), Some("alice"));
    assert_eq!(header_of(&json, "x-auth-extra").as_deref(), Some("1"));
    assert_eq!(header_of(&json, "content-type"), None);
    assert_eq!(header_of(&json, "host"), Some(format!("{HOST}:{guarded}")));
    let a = next(&mut asked).await;
    assert_eq!(a.headers["authorization"], "Bearer good");

    // Before routing: the header the server set is what routing matches on.
    let resp = c
        .get(url(guarded, "/whoami"))
        .header("authorization", "Bearer good")
        .send()
        .await
        .unwrap();
    assert_eq!(status_and_backend(resp).await, (200, "alice-app".into()));
    next(&mut asked).await;
    // ... and a client cannot claim it past a listener that checks.
    let resp = c
        .get(url(open, "/whoami"))
        .header("x-user", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(status_and_backend(resp).await, (200, "alice-app".into()));

    // A redirect to a login page is passed on as it is; HTTP/2 clients are checked alike.
    let resp = builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(url(guarded, "/menu"))
        .header("authorization", "Bearer redirect")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 302);
    assert_eq!(resp.headers()["location"], "https://login.example/start");
    next(&mut asked).await;
    let h2 = builder().http2_prior_knowledge().build().unwrap();
    let resp = h2.get(url(guarded, "/menu")).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let a = next(&mut asked).await;
    assert_eq!(a.headers["host"], format!("{HOST}:{guarded}"));
    let resp = h2
        .get(url(guarded, "/menu"))
        .header("authorization", "Bearer good")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    next(&mut asked).await;

    // The rule's filter, on a listener without one: the modifier before it ran first (the
    // client's x-user is gone before the server's is set), only the allowed response header
    // is copied, and the body is sent to the server and then to the backend.
    let resp = c
        .post(url(open, "/rule"))
        .header("authorization", "Bearer good")
        .header("x-user", "mallory")
        .header("x-extra", "e")
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let json = echo_json(resp).await;
    assert_eq!(json["body_bytes"], 5);
    assert_eq!(header_of(&json, "x-user").as_deref(), Some("alice"));
    assert_eq!(header_of(&json, "x-auth-extra"), None);
    let a = next(&mut asked).await;
    assert_eq!((a.method.as_str(), a.path.as_str()), ("POST", "/rule"));
    assert_eq!(&a.body[..], b"hello");
    assert_eq!(a.headers["content-length"], "5");
    assert_eq!(a.headers["x-extra"], "e");
    assert!(
        a.headers.get("x-user").is_none(),
        "removed before the check"
    );
    // A body over forwardBody.maxSize is refused before anyone is asked.
    let resp = c
        .post(url(open, "/rule"))
        .header("authorization", "Bearer good")
        .body(vec![b'x'; 17])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    // Rules without the filter are not checked.
    let resp = c.get(url(open, "/menu")).send().await.unwrap();
    assert_eq!(status_and_backend(resp).await, (200, "app".into()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(asked.try_recv().is_err(), "neither was checked");

    // Fail closed: a server nobody listens on (503), a backendRef that does not resolve (500,
    // and the listener says why).
    let resp = c
        .get(url(open, "/down"))
        .header("authorization", "Bearer good")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    let resp = c.get(url(broken, "/menu")).send().await.unwrap();
    assert_eq!(resp.status(), 500);
    let status = gw.status().await;
    let (s, reason, message) = listener_condition(&status, "broken", "ResolvedRefs");
    assert_eq!((s.as_str(), reason.as_str()), ("False", "BackendNotFound"));
    assert!(message.contains("ExternalAuth"), "{message}");
    assert_eq!(listener_condition(&status, "broken", "Accepted").0, "True");
    assert_eq!(
        listener_condition(&status, "guarded", "ResolvedRefs").0,
        "True"
    );

    // gRPC: allowed with its edits, only the allowed headers sent.
    let resp = c
        .get(url(grpc, "/menu?q=1"))
        .header("authorization", "Bearer good")
        .header("x-allowed", "yes")
        .header("x-other", "no")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let json = echo_json(resp).await;
    assert_eq!(header_of(&json, "x-user").as_deref(), Some("grpc-alice"));
    assert_eq!(
        header_of(&json, "authorization"),
        None,
        "removed by the server"
    );
    let http = tokio::time::timeout(Duration::from_secs(5), grpc_asked.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(http.method, "GET");
    assert_eq!(http.path, "/menu?q=1");
    assert_eq!(http.host, format!("{HOST}:{grpc}"));
    assert_eq!(http.scheme, "http");
    assert_eq!(http.protocol, "HTTP/1.1");
    let sent: Vec<&str> = http.headers.keys().map(String::as_str).collect();
    assert_eq!(sent, ["authorization", "x-allowed"]);
    // Denied with the server's own status, header and body; a failed call refuses.
    let resp = c.get(url(grpc, "/menu")).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.headers()["www-authenticate"], "Bearer");
    assert_eq!(resp.text().await.unwrap(), "denied by grpc auth\n");
    let resp = c
        .get(url(grpc, "/menu"))
        .header("authorization", "Bearer broken")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);

    let admin = gw.admin();
    let http_auth = "default/auth:80";
    let grpc_cluster = "default/grpc-auth:80+h2";
    assert!(metric(admin, &auth_counter(http_auth, "allowed")).await >= 4);
    assert!(metric(admin, &auth_counter(http_auth, "denied")).await >= 3);
    assert_eq!(
        metric(admin, &auth_counter(grpc_cluster, "allowed")).await,
        1
    );
    assert_eq!(
        metric(admin, &auth_counter(grpc_cluster, "denied")).await,
        1
    );
    assert_eq!(metric(admin, &auth_counter(grpc_cluster, "error")).await, 1);
    gw.stop().await;
}
