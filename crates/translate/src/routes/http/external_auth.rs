//! `ExternalAuth` filters, of HTTPRoute rules and of Gateway listeners (GatewayListenerFilters),
//! to [`ir::ExternalAuth`]. The generated types of the two places differ only in name, so
//! [`raw_external_auth!`] reads either into [`RawExternalAuth`] and one function checks it.

use crate::backends::BackendRef;
use crate::routes::ResolvedBackend;
use gatehouse_ir as ir;

/// The largest `forwardBody.maxSize` Gatehouse buffers: every request the filter sees may hold
/// this much memory until the server answers.
pub const MAX_FORWARD_BODY: i32 = 1024 * 1024;

/// An `externalAuth` stanza, read from whichever generated type carries it.
pub struct RawExternalAuth<'a> {
    pub grpc: bool,
    /// Which of the `grpc` and `http` stanzas are present: each goes with its protocol.
    pub has_grpc: bool,
    pub has_http: bool,
    pub backend: BackendRef<'a>,
    pub forward_body: Option<i32>,
    pub grpc_allowed_headers: &'a [String],
    pub http_path: Option<&'a str>,
    pub http_allowed_headers: &'a [String],
    pub http_allowed_response_headers: &'a [String],
}

/// [`RawExternalAuth`] of a generated `externalAuth` value (`&_`), given its protocol enum.
macro_rules! raw_external_auth {
    ($auth:expr, $protocol:ident) => {{
        let a = $auth;
        $crate::routes::http::external_auth::RawExternalAuth {
            grpc: matches!(a.protocol, $protocol::Grpc),
            has_grpc: a.grpc.is_some(),
            has_http: a.http.is_some(),
            backend: $crate::backends::backend_ref_of!(a.backend_ref),
            forward_body: a.forward_body.as_ref().and_then(|b| b.max_size),
            grpc_allowed_headers: a
                .grpc
                .as_ref()
                .and_then(|g| g.allowed_headers.as_deref())
                .unwrap_or_default(),
            http_path: a.http.as_ref().and_then(|h| h.path.as_deref()),
            http_allowed_headers: a
                .http
                .as_ref()
                .and_then(|h| h.allowed_headers.as_deref())
                .unwrap_or_default(),
            http_allowed_response_headers: a
                .http
                .as_ref()
                .and_then(|h| h.allowed_response_headers.as_deref())
                .unwrap_or_default(),
        }
    }};
}
pub(crate) use raw_external_auth;

/// Checks the stanza and resolves its backendRef with `resolve` (`true`: over HTTP/2, for the
/// gRPC protocol). A backendRef that cannot be used still makes a filter: its target is
/// invalid and every request it sees is refused, because the filter must fail closed.
pub fn filter(
    raw: &RawExternalAuth<'_>,
    resolve: impl FnOnce(&BackendRef<'_>, bool) -> ResolvedBackend,
) -> Result<ir::ExternalAuth, String> {
    // The CRD's rule, checked here too for manifests no API server validated.
    if raw.has_grpc != raw.grpc || raw.has_http == raw.grpc {
        let (protocol, stanza) = if raw.grpc {
            ("GRPC", "grpc")
        } else {
            ("HTTP", "http")
        };
        return Err(format!(
            "ExternalAuth with protocol {protocol} needs {stanza} (and only {stanza}; \
             `{stanza}: {{}}` takes the defaults)"
        ));
    }
    let forward_body = match raw.forward_body {
        None => 0,
        Some(n) if (0..=MAX_FORWARD_BODY).contains(&n) => n as u32,
        Some(n) => {
            return Err(format!(
                "ExternalAuth forwardBody.maxSize {n} is not between 0 and {MAX_FORWARD_BODY}"
            ));
        }
    };
    let protocol = if raw.grpc {
        ir::AuthProtocol::Grpc {
            allowed_headers: header_names(raw.grpc_allowed_headers)?,
        }
    } else {
        ir::AuthProtocol::Http {
            path_prefix: path_prefix(raw.http_path)?,
            allowed_headers: header_names(raw.http_allowed_headers)?,
            allowed_response_headers: header_names(raw.http_allowed_response_headers)?,
        }
    };
    let resolved = resolve(&raw.backend, raw.grpc);
    Ok(ir::ExternalAuth {
        target: resolved.target,
        protocol,
        forward_body,
    })
}

/// `http.path` is prepended to the request's path: a path without its trailing `/` (so that
/// `/auth/` and `/auth` both send `/auth/login` for `/login`); `/` and "" add nothing.
fn path_prefix(path: Option<&str>) -> Result<String, String> {
    let Some(p) = path.filter(|p| !p.is_empty()) else {
        return Ok(String::new());
    };
    ir::check_path_value(p).map_err(|why| format!("ExternalAuth http.path {p:?} {why}"))?;
    Ok(p.trim_end_matches('/').to_string())
}

fn header_names(names: &[String]) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for n in names {
        if !super::matches::is_token(n) {
            return Err(format!(
                "ExternalAuth header name {n:?} is not a valid HTTP header name"
            ));
        }
        let lower = n.to_ascii_lowercase();
        if !out.contains(&lower) {
            out.push(lower);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw<'a>(grpc: bool, path: Option<&'a str>, body: Option<i32>) -> RawExternalAuth<'a> {
        RawExternalAuth {
            grpc,
            has_grpc: grpc,
            has_http: !grpc,
            backend: BackendRef {
                group: None,
                kind: None,
                name: "auth",
                namespace: None,
                port: Some(8080),
            },
            forward_body: body,
            grpc_allowed_headers: &[],
            http_path: path,
            http_allowed_headers: &[],
            http_allowed_response_headers: &[],
        }
    }

    fn resolved(name: &str) -> ResolvedBackend {
        ResolvedBackend {
            target: ir::BackendTarget::Cluster(name.into()),
            policy_cluster: None,
        }
    }

    #[test]
    fn the_path_prefix_loses_its_trailing_slash() {
        for (path, prefix) in [
            (None, ""),
            (Some(""), ""),
            (Some("/"), ""),
            (Some("/auth"), "/auth"),
            (Some("/auth/"), "/auth"),
        ] {
            let f = filter(&raw(false, path, None), |_, _| resolved("c")).unwrap();
            let ir::AuthProtocol::Http { path_prefix, .. } = f.protocol else {
                panic!("HTTP protocol expected");
            };
            assert_eq!(path_prefix, prefix, "{path:?}");
        }
    }

    #[test]
    fn grpc_resolves_over_http2_and_http_does_not() {
        let mut asked = None;
        filter(&raw(true, None, None), |_, h2| {
            asked = Some(h2);
            resolved("c")
        })
        .unwrap();
        assert_eq!(asked, Some(true));
        filter(&raw(false, None, None), |_, h2| {
            asked = Some(h2);
            resolved("c")
        })
        .unwrap();
        assert_eq!(asked, Some(false));
    }

    #[test]
    fn bad_values_are_refused_with_the_field_named() {
        let e = filter(&raw(false, None, Some(-1)), |_, _| resolved("c")).unwrap_err();
        assert!(e.contains("forwardBody.maxSize -1"), "{e}");
        let e = filter(&raw(false, None, Some(MAX_FORWARD_BODY + 1)), |_, _| {
            resolved("c")
        })
        .unwrap_err();
        assert!(e.contains("forwardBody.maxSize"), "{e}");
        let e = filter(&raw(false, Some("no-slash"), None), |_, _| resolved("c")).unwrap_err();
        assert!(e.contains("http.path"), "{e}");
        let bad = ["bad header".to_string()];
        let mut r = raw(true, None, None);
        r.grpc_allowed_headers = &bad;
        let e = filter(&r, |_, _| resolved("c")).unwrap_err();
        assert!(e.contains("\"bad header\""), "{e}");
    }

    #[test]
    fn each_protocol_takes_its_own_stanza_only() {
        let mut r = raw(false, None, None);
        r.has_http = false;
        let e = filter(&r, |_, _| resolved("c")).unwrap_err();
        assert!(e.contains("protocol HTTP needs http"), "{e}");
        let mut r = raw(true, None, None);
        r.has_http = true;
        let e = filter(&r, |_, _| resolved("c")).unwrap_err();
        assert!(e.contains("protocol GRPC needs grpc"), "{e}");
    }

    #[test]
    fn header_names_are_lower_case_and_unique() {
        let names = ["X-User".to_string(), "x-user".to_string(), "Cookie".into()];
        let mut r = raw(false, None, Some(0));
        r.http_allowed_headers = &names;
        let f = filter(&r, |_, _| resolved("c")).unwrap();
        assert_eq!(f.forward_body, 0);
        let ir::AuthProtocol::Http {
            allowed_headers, ..
        } = f.protocol
        else {
            panic!("HTTP protocol expected");
        };
        assert_eq!(allowed_headers, ["x-user", "cookie"]);
    }
}
