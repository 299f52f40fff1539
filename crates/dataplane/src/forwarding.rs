//! What happens to a matched request before it leaves for a backend, the same on both request
//! paths (hyper's HTTP/2 and fallback path in `proxy`, the HTTP/1 path in `h1`): request
//! filters, backend choice, backend filters, endpoint choice, and the answers Gatehouse gives
//! itself when one of them decides the request goes nowhere.

use crate::filters::Filter;
use crate::headers::HeaderEdit;
use crate::table::{Backend, ClusterState, CompiledRule, Endpoint, Target};
use http::{HeaderValue, StatusCode};

/// A response Gatehouse makes itself.
#[derive(Debug)]
pub(crate) enum Answer {
    /// Short `text/plain` body.
    Text(StatusCode, &'static str),
    /// `RequestRedirect`: status and `Location`, no body.
    Redirect(StatusCode, HeaderValue),
}

/// What `URLRewrite` filters decided, applied when the upstream request is written.
#[derive(Debug, Default)]
pub(crate) struct Rewrite {
    pub host: Option<HeaderValue>,
    pub path: Option<String>,
}

/// Where a request goes, or what it is answered.
pub(crate) enum Decision<'t> {
    Forward {
        cluster: &'t ClusterState,
        endpoint: &'t Endpoint,
        /// The chosen backend's filters (response side still to run).
        backend_filters: &'t [Filter],
        rewrite: Rewrite,
    },
    Answer {
        answer: Answer,
        /// Backend filters that apply to the answer's headers, with the rule's.
        backend_filters: &'t [Filter],
    },
}

/// The request parts the filters read. `path` is the request path before any rewrite.
pub(crate) struct RequestParts<'r> {
    pub host: &'r str,
    pub path: &'r str,
    pub query: Option<&'r str>,
    /// What `ReplacePrefixMatch` replaces (see `PathMatcher::replaceable_prefix`).
    pub matched_prefix: Option<&'r str>,
}

/// Runs the rule's filters, picks a backend and runs its filters, picks an endpoint.
pub(crate) fn decide<'t, H: HeaderEdit + ?Sized>(
    rule: &'t CompiledRule,
    req: &RequestParts<'_>,
    headers: &mut H,
) -> Decision<'t> {
    let mut rewrite = Rewrite::default();
    if let Some(answer) = request_filters(&rule.filters, req, headers, &mut rewrite) {
        return Decision::Answer {
            answer,
            backend_filters: &[],
        };
    }
    let Some(backend) = rule.backends.pick() else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "no backend for this route\n",
            &[],
        );
    };
    let Backend { target, filters } = backend;
    let cluster = match target {
        Target::Cluster(cluster) => cluster,
        Target::Invalid => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "backend is invalid\n",
                filters,
            );
        }
    };
    if let Some(answer) = request_filters(filters, req, headers, &mut rewrite) {
        return Decision::Answer {
            answer,
            backend_filters: filters,
        };
    }
    let Some(endpoint) = cluster.pick() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "no healthy endpoints\n",
            filters,
        );
    };
    if cluster.tls_broken {
        return text(
            StatusCode::BAD_GATEWAY,
            "upstream TLS is misconfigured\n",
            filters,
        );
    }
    Decision::Forward {
        cluster,
        endpoint,
        backend_filters: filters,
        rewrite,
    }
}

fn text<'t>(status: StatusCode, body: &'static str, backend_filters: &'t [Filter]) -> Decision<'t> {
    Decision::Answer {
        answer: Answer::Text(status, body),
        backend_filters,
    }
}

/// Runs request-side filters; `Some` when one of them answers (redirect, broken filter).
fn request_filters<H: HeaderEdit + ?Sized>(
    filters: &[Filter],
    req: &RequestParts<'_>,
    headers: &mut H,
    rewrite: &mut Rewrite,
) -> Option<Answer> {
    for filter in filters {
        match filter {
            Filter::RequestHeaders(mods) => mods.apply(headers),
            Filter::ResponseHeaders(_) => {}
            Filter::Redirect(redirect) => {
                let path = rewrite.path.as_deref().unwrap_or(req.path);
                let location = redirect.location(req.host, path, req.query, req.matched_prefix);
                return Some(match HeaderValue::try_from(location) {
                    Ok(location) => Answer::Redirect(redirect.status, location),
                    Err(_) => Answer::Text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "redirect target is not a valid URL\n",
                    ),
                });
            }
            Filter::UrlRewrite(rw) => {
                if let Some(h) = &rw.hostname {
                    rewrite.host = Some(h.clone());
                }
                if let Some(modifier) = &rw.path {
                    let current = rewrite.path.as_deref().unwrap_or(req.path);
                    rewrite.path = Some(modifier.apply(current, req.matched_prefix).into_owned());
                }
            }
            Filter::Invalid => {
                return Some(Answer::Text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "route filter is misconfigured\n",
                ));
            }
        }
    }
    None
}

/// Applies the `ResponseHeaderModifier` filters of the rule, then of the backend.
pub(crate) fn response_filters<H: HeaderEdit + ?Sized>(
    rule_filters: &[Filter],
    backend_filters: &[Filter],
    headers: &mut H,
) {
    for filter in rule_filters.iter().chain(backend_filters) {
        if let Filter::ResponseHeaders(mods) = filter {
            mods.apply(headers);
        }
    }
}

/// Whether any response filter would run (most rules have none; the HTTP/1 path then skips
/// building an editable copy of the response head).
pub(crate) fn has_response_filters(rule_filters: &[Filter], backend_filters: &[Filter]) -> bool {
    rule_filters
        .iter()
        .chain(backend_filters)
        .any(|f| matches!(f, Filter::ResponseHeaders(_)))
}
