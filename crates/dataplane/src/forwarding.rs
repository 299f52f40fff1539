//! What happens to a matched request before it leaves for a backend, the same on both request
//! paths (hyper's HTTP/2 and fallback path in `proxy`, the HTTP/1 path in `h1`): request
//! filters, backend choice, backend filters, endpoint choice, and the answers Gatehouse gives
//! itself when one of them decides the request goes nowhere.

use crate::cors::{CorsFields, CorsOutcome};
use crate::filters::Filter;
use crate::headers::{HeaderEdit, RequestHeaders};
use crate::table::{Backend, ClusterState, CompiledRule, Endpoint, Target};
use http::{HeaderValue, Method, StatusCode};

/// A response Gatehouse makes itself.
#[derive(Debug)]
pub(crate) enum Answer {
    /// Short `text/plain` body.
    Text(StatusCode, &'static str),
    /// `RequestRedirect`: status and `Location`, no body.
    Redirect(StatusCode, HeaderValue),
    /// A CORS preflight: `200 OK`, these fields, no body. (Not 204: Gatehouse's HTTP/1
    /// answers always carry a Content-Length, which a 204 may not.)
    Preflight(CorsFields),
}

impl Answer {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Answer::Text(status, _) | Answer::Redirect(status, _) => *status,
            Answer::Preflight(_) => StatusCode::OK,
        }
    }
}

/// What `URLRewrite` filters decided, applied when the upstream request is written; and the
/// CORS fields the response gets.
#[derive(Debug, Default)]
pub(crate) struct Rewrite {
    pub host: Option<HeaderValue>,
    pub path: Option<String>,
    pub cors: Option<CorsFields>,
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
        /// The CORS fields of an allowed cross-origin request, when the CORS filter ran before
        /// the answer was decided: a browser shows the page's script an error the gateway
        /// generated (500 for an invalid backend, 503 with no endpoints) only if it carries
        /// them, as it does a backend's error.
        cors: Option<CorsFields>,
    },
}

/// The request parts the filters read. `path` is the request path before any rewrite.
pub(crate) struct RequestParts<'r> {
    pub method: &'r Method,
    pub host: &'r str,
    pub path: &'r str,
    pub query: Option<&'r str>,
    /// What `ReplacePrefixMatch` replaces (see `PathMatcher::replaceable_prefix`).
    pub matched_prefix: Option<&'r str>,
}

/// Runs the rule's filters, picks a backend and runs its filters, picks an endpoint.
pub(crate) fn decide<'t, H: HeaderEdit + RequestHeaders + ?Sized>(
    rule: &'t CompiledRule,
    req: &RequestParts<'_>,
    headers: &mut H,
) -> Decision<'t> {
    decide_after(rule, 0, Rewrite::default(), req, headers)
}

/// [`decide`] for a request whose first `done` rule filters already ran (up to and including
/// an `ExternalAuth` check, see `hyper_path`) and left `rewrite`.
pub(crate) fn decide_after<'t, H: HeaderEdit + RequestHeaders + ?Sized>(
    rule: &'t CompiledRule,
    done: usize,
    mut rewrite: Rewrite,
    req: &RequestParts<'_>,
    headers: &mut H,
) -> Decision<'t> {
    let rest = rule.filters.get(done..).unwrap_or_default();
    if let Some(answer) = request_filters(rest, req, headers, &mut rewrite) {
        return Decision::Answer {
            answer,
            backend_filters: &[],
            cors: rewrite.cors,
        };
    }
    let Some(backend) = rule.backends.pick() else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "no backend for this route\n",
            &[],
            rewrite.cors,
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
                rewrite.cors,
            );
        }
    };
    if let Some(answer) = request_filters(filters, req, headers, &mut rewrite) {
        return Decision::Answer {
            answer,
            backend_filters: filters,
            cors: rewrite.cors,
        };
    }
    let Some(endpoint) = cluster.pick() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "no healthy endpoints\n",
            filters,
            rewrite.cors,
        );
    };
    if cluster.tls_broken {
        return text(
            StatusCode::BAD_GATEWAY,
            "upstream TLS is misconfigured\n",
            filters,
            rewrite.cors,
        );
    }
    Decision::Forward {
        cluster,
        endpoint,
        backend_filters: filters,
        rewrite,
    }
}

fn text<'t>(
    status: StatusCode,
    body: &'static str,
    backend_filters: &'t [Filter],
    cors: Option<CorsFields>,
) -> Decision<'t> {
    Decision::Answer {
        answer: Answer::Text(status, body),
        backend_filters,
        cors,
    }
}

/// Runs request-side filters; `Some` when one of them answers (redirect, broken filter).
pub(crate) fn request_filters<H: HeaderEdit + RequestHeaders + ?Sized>(
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
            Filter::Cors(policy) => match policy.evaluate(req.method, headers) {
                CorsOutcome::Pass => {}
                CorsOutcome::Preflight(fields) => return Some(Answer::Preflight(fields)),
                CorsOutcome::Actual(fields) => rewrite.cors = Some(fields),
            },
            // Mirrors start once the request is ready to leave (`mirror::start`).
            Filter::Mirror(_) => {}
            // Checks are awaited by the hyper path, which runs the filters before each one
            // first and hands this function only those after the last (`decide_after`); the
            // HTTP/1 path hands such rules over.
            Filter::ExternalAuth(_) => {}
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

/// What runs on a response head: the CORS fields of an allowed cross-origin request, then the
/// `ResponseHeaderModifier` filters of the rule and of the backend (which have the last word).
#[derive(Clone, Copy)]
pub(crate) struct ResponseEdits<'a> {
    pub rule_filters: &'a [Filter],
    pub backend_filters: &'a [Filter],
    pub cors: Option<&'a CorsFields>,
}

impl ResponseEdits<'_> {
    pub(crate) fn apply<H: HeaderEdit + ?Sized>(&self, headers: &mut H) {
        if let Some(cors) = self.cors {
            cors.apply(headers);
        }
        for filter in self.rule_filters.iter().chain(self.backend_filters) {
            if let Filter::ResponseHeaders(mods) = filter {
                mods.apply(headers);
            }
        }
    }

    /// Whether anything would run (most rules have nothing; the HTTP/1 path then skips
    /// building an editable copy of the response head).
    pub(crate) fn any(&self) -> bool {
        self.cors.is_some()
            || self
                .rule_filters
                .iter()
                .chain(self.backend_filters)
                .any(|f| matches!(f, Filter::ResponseHeaders(_)))
    }
}
