//! The admin endpoint: health, readiness, metrics, the IR and status, on its own address.

use crate::run::State;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::sync::Arc;

pub async fn serve(listener: tokio::net::TcpListener, state: Arc<State>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let state = Arc::clone(&state);
                async move { Ok::<_, std::convert::Infallible>(handle(&req, &state)) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn respond(
    status: StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(body.into()))
        .expect("static response parts are valid")
}

fn json(value: &serde_json::Value) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec_pretty(value).unwrap_or_default();
    respond(StatusCode::OK, "application/json", body)
}

fn handle(req: &Request<Incoming>, state: &State) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return respond(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET\n");
    }
    match req.uri().path() {
        "/healthz" => respond(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz" => {
            match state.control.readiness() {
                Ok(()) => {
                    // An unreachable API server does not make the data plane unready: it keeps
                    // serving the last configuration, and says so.
                    let remote = state.control.remote_name();
                    let api = match state.control.api_connected() {
                        Some(false) => {
                            format!("{remote}: unreachable, serving the last configuration\n")
                        }
                        Some(true) => format!("{remote}: connected\n"),
                        None => String::new(),
                    };
                    respond(StatusCode::OK, "text/plain", format!("ready\n{api}"))
                }
                Err(missing) => {
                    let mut body = String::from("not ready:\n");
                    for m in missing {
                        body.push_str("- ");
                        body.push_str(&m);
                        body.push('\n');
                    }
                    respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", body)
                }
            }
        }
        "/metrics" => {
            let mut out = String::new();
            match prometheus_client::encoding::text::encode(&mut out, &state.registry) {
                Ok(()) => respond(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    out,
                ),
                Err(e) => respond(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    format!("{e}\n"),
                ),
            }
        }
        "/config_dump" => {
            let snap = state.control.published.load();
            // Private keys never leave the process through the admin endpoint.
            let mut config = serde_json::to_value(&*snap.config).unwrap_or_default();
            for cert in config["certificates"].as_array_mut().into_iter().flatten() {
                cert["key_pem"] = serde_json::Value::String("<redacted>".into());
            }
            json(&serde_json::json!({
                "generation": snap.generation,
                "config": config,
                "bound_addresses": state.dataplane.bound_addresses(),
            }))
        }
        "/status" => {
            let snap = state.control.published.load();
            json(&serde_json::json!({
                "generation": snap.generation,
                "errors": snap.errors,
                "warnings": snap.warnings,
                "bind_errors": snap.bind_errors,
                "diagnostics": snap.diagnostics,
                "objects": snap.objects(),
            }))
        }
        _ => respond(
            StatusCode::NOT_FOUND,
            "text/plain",
            "try /healthz /readyz /metrics /config_dump /status\n",
        ),
    }
}
