//! HTTPRoute rules to listener-independent templates: matches, filters, backends, timeouts.
//! Redirects keep their raw form until the listener they run on is known.

use crate::backends::{BackendRef, Backends, From, RefProblem};
use crate::gateways::GATEWAY_GROUP;
use gatehouse_ir as ir;
use gateway_api::apis::standard::httproutes::*;

/// Why a rule cannot be served; the rule is dropped and the route is (partially) invalid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleProblem(pub String);

#[derive(Clone, Debug)]
pub struct RuleTemplate {
    pub route: ir::RouteRef,
    pub matches: Vec<ir::HttpMatch>,
    pub filters: Vec<FilterTemplate>,
    pub backends: Vec<BackendTemplate>,
    pub timeouts: ir::Timeouts,
}

#[derive(Clone, Debug)]
pub struct BackendTemplate {
    pub weight: u32,
    pub target: ir::BackendTarget,
    pub filters: Vec<FilterTemplate>,
    /// The cluster an invalid BackendTLSPolicy kept this backend from using.
    pub policy_cluster: Option<String>,
}

#[derive(Clone, Debug)]
pub enum FilterTemplate {
    Ready(ir::HttpFilter),
    Redirect(RawRedirect),
}

#[derive(Clone, Debug)]
pub struct RawRedirect {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub port: Option<u16>,
    pub path: Option<ir::PathModifier>,
    pub status: u16,
}

fn well_known_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

impl RawRedirect {
    /// Apply the spec's defaults for a listener with `scheme` on `port`: no port and no scheme
    /// keeps the listener's port, a scheme alone implies its well-known port, and a well-known
    /// port is left out of the Location.
    pub fn resolve(&self, listener_scheme: &str, listener_port: u16) -> ir::Redirect {
        let scheme = self
            .scheme
            .clone()
            .unwrap_or_else(|| listener_scheme.to_string());
        let port = match (self.port, &self.scheme) {
            (Some(p), _) => p,
            (None, Some(s)) => well_known_port(s).unwrap_or(listener_port),
            (None, None) => listener_port,
        };
        ir::Redirect {
            port: (well_known_port(&scheme) != Some(port)).then_some(port),
            scheme,
            hostname: self.hostname.clone(),
            path: self.path.clone(),
            status: self.status,
        }
    }
}

impl FilterTemplate {
    pub fn resolve(&self, scheme: &str, port: u16) -> ir::HttpFilter {
        match self {
            FilterTemplate::Ready(f) => f.clone(),
            FilterTemplate::Redirect(r) => ir::HttpFilter::Redirect(r.resolve(scheme, port)),
        }
    }
}

impl RuleTemplate {
    pub fn resolve(&self, scheme: &str, port: u16) -> ir::HttpRule {
        ir::HttpRule {
            route: self.route.clone(),
            filters: self
                .filters
                .iter()
                .map(|f| f.resolve(scheme, port))
                .collect(),
            backends: self
                .backends
                .iter()
                .map(|b| ir::WeightedBackend {
                    weight: b.weight,
                    target: b.target.clone(),
                    filters: b.filters.iter().map(|f| f.resolve(scheme, port)).collect(),
                })
                .collect(),
            timeouts: self.timeouts.clone(),
        }
    }
}

/// Compile a user regex the way the data plane will, so an invalid one is caught here.
fn check_regex(what: &str, re: &str) -> Result<(), RuleProblem> {
    regex::Regex::new(&format!("^(?:{re})$"))
        .map(|_| ())
        .map_err(|e| RuleProblem(format!("invalid regular expression in {what} {re:?}: {e}")))
}

pub fn http_match(m: &HttpRouteRulesMatches) -> Result<ir::HttpMatch, RuleProblem> {
    let path = match &m.path {
        None => ir::PathMatch::Prefix("/".into()),
        Some(p) => {
            let value = p.value.clone().unwrap_or_else(|| "/".into());
            match p.r#type {
                None | Some(HttpRouteRulesMatchesPathType::PathPrefix) => {
                    if !value.starts_with('/') {
                        return Err(RuleProblem(format!(
                            "path prefix {value:?} must start with /"
                        )));
                    }
                    let trimmed = if value.len() > 1 {
                        value.trim_end_matches('/')
                    } else {
                        &value
                    };
                    ir::PathMatch::Prefix(if trimmed.is_empty() {
                        "/".into()
                    } else {
                        trimmed.into()
                    })
                }
                Some(HttpRouteRulesMatchesPathType::Exact) => {
                    if !value.starts_with('/') {
                        return Err(RuleProblem(format!(
                            "exact path {value:?} must start with /"
                        )));
                    }
                    ir::PathMatch::Exact(value)
                }
                Some(HttpRouteRulesMatchesPathType::RegularExpression) => {
                    check_regex("path", &value)?;
                    ir::PathMatch::Regex(value)
                }
            }
        }
    };
    let mut headers: Vec<ir::HeaderMatch> = Vec::new();
    for h in m.headers.iter().flatten() {
        let name = h.name.to_ascii_lowercase();
        // The spec: only the first match for a given header name counts.
        if headers.iter().any(|x| x.name == name) {
            continue;
        }
        let value = match h.r#type {
            Some(HttpRouteRulesMatchesHeadersType::RegularExpression) => {
                check_regex("header match", &h.value)?;
                ir::StringMatch::Regex(h.value.clone())
            }
            _ => ir::StringMatch::Exact(h.value.clone()),
        };
        headers.push(ir::HeaderMatch { name, value });
    }
    let mut query_params: Vec<ir::QueryParamMatch> = Vec::new();
    for q in m.query_params.iter().flatten() {
        if query_params.iter().any(|x| x.name == q.name) {
            continue;
        }
        let value = match q.r#type {
            Some(HttpRouteRulesMatchesQueryParamsType::RegularExpression) => {
                check_regex("query parameter match", &q.value)?;
                ir::StringMatch::Regex(q.value.clone())
            }
            _ => ir::StringMatch::Exact(q.value.clone()),
        };
        query_params.push(ir::QueryParamMatch {
            name: q.name.clone(),
            value,
        });
    }
    let method = m.method.as_ref().map(|m| {
        serde_json::to_value(m)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    });
    Ok(ir::HttpMatch {
        path,
        method,
        headers,
        query_params,
    })
}

fn header_modifier(json: &serde_json::Value) -> ir::HeaderModifier {
    let pairs = |key: &str| -> Vec<ir::HeaderValue> {
        json.get(key)
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .map(|p| ir::HeaderValue {
                name: p
                    .get("name")
                    .and_then(|n| n.as_str())
                    .unwrap_or_default()
                    .to_ascii_lowercase(),
                value: p
                    .get("value")
                    .and_then(|n| n.as_str())
                    .unwrap_or_default()
                    .to_string(),
            })
            .collect()
    };
    ir::HeaderModifier {
        set: pairs("set"),
        add: pairs("add"),
        remove: json
            .get("remove")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_ascii_lowercase))
            .collect(),
    }
}

fn path_modifier(p: Option<&serde_json::Value>) -> Result<Option<ir::PathModifier>, RuleProblem> {
    let Some(p) = p else { return Ok(None) };
    let s = |k: &str| p.get(k).and_then(|v| v.as_str()).map(str::to_string);
    match p.get("type").and_then(|t| t.as_str()) {
        Some("ReplaceFullPath") => Ok(Some(ir::PathModifier::ReplaceFullPath(
            s("replaceFullPath")
                .ok_or_else(|| RuleProblem("ReplaceFullPath needs replaceFullPath".into()))?,
        ))),
        Some("ReplacePrefixMatch") => Ok(Some(ir::PathModifier::ReplacePrefixMatch(
            s("replacePrefixMatch")
                .ok_or_else(|| RuleProblem("ReplacePrefixMatch needs replacePrefixMatch".into()))?,
        ))),
        other => Err(RuleProblem(format!(
            "unsupported path modifier type {other:?}"
        ))),
    }
}

/// Rule filters and backendRef filters have separate generated types with one JSON shape, so
/// both are read through their JSON form.
fn filter(json: serde_json::Value) -> Result<FilterTemplate, RuleProblem> {
    let kind = json
        .get("type")
        .and_then(|t| t.as_str())
        .unwrap_or_default()
        .to_string();
    let section = |k: &str| json.get(k).cloned().unwrap_or(serde_json::Value::Null);
    Ok(match kind.as_str() {
        "RequestHeaderModifier" => FilterTemplate::Ready(ir::HttpFilter::RequestHeaders(
            header_modifier(&section("requestHeaderModifier")),
        )),
        "ResponseHeaderModifier" => FilterTemplate::Ready(ir::HttpFilter::ResponseHeaders(
            header_modifier(&section("responseHeaderModifier")),
        )),
        "RequestRedirect" => {
            let r = section("requestRedirect");
            let status = r.get("statusCode").and_then(|v| v.as_u64()).unwrap_or(302);
            if ![301, 302, 303, 307, 308].contains(&status) {
                return Err(RuleProblem(format!(
                    "redirect status code {status} is not supported"
                )));
            }
            FilterTemplate::Redirect(RawRedirect {
                scheme: r.get("scheme").and_then(|v| v.as_str()).map(str::to_string),
                hostname: r
                    .get("hostname")
                    .and_then(|v| v.as_str())
                    .map(str::to_ascii_lowercase),
                port: r
                    .get("port")
                    .and_then(|v| v.as_u64())
                    .and_then(|p| u16::try_from(p).ok()),
                path: path_modifier(r.get("path"))?,
                status: status as u16,
            })
        }
        "URLRewrite" => {
            let r = section("urlRewrite");
            FilterTemplate::Ready(ir::HttpFilter::UrlRewrite(ir::UrlRewrite {
                hostname: r
                    .get("hostname")
                    .and_then(|v| v.as_str())
                    .map(str::to_ascii_lowercase),
                path: path_modifier(r.get("path"))?,
            }))
        }
        other => {
            return Err(RuleProblem(format!(
                "filter type {other} is not supported by Gatehouse"
            )));
        }
    })
}

fn filters<T: serde::Serialize>(list: Option<&Vec<T>>) -> Result<Vec<FilterTemplate>, RuleProblem> {
    let filters: Vec<FilterTemplate> = list
        .into_iter()
        .flatten()
        .map(|f| filter(serde_json::to_value(f).unwrap_or_default()))
        .collect::<Result<_, _>>()?;
    let redirects = filters
        .iter()
        .filter(|f| matches!(f, FilterTemplate::Redirect(_)))
        .count();
    let rewrites = filters
        .iter()
        .filter(|f| matches!(f, FilterTemplate::Ready(ir::HttpFilter::UrlRewrite(_))))
        .count();
    if redirects + rewrites > 1 {
        return Err(RuleProblem(
            "a rule may have one RequestRedirect or one URLRewrite, not both or several".into(),
        ));
    }
    Ok(filters)
}

fn uses_prefix_replacement(filters: &[FilterTemplate]) -> bool {
    filters.iter().any(|f| match f {
        FilterTemplate::Redirect(r) => {
            matches!(r.path, Some(ir::PathModifier::ReplacePrefixMatch(_)))
        }
        FilterTemplate::Ready(ir::HttpFilter::UrlRewrite(r)) => {
            matches!(r.path, Some(ir::PathModifier::ReplacePrefixMatch(_)))
        }
        _ => false,
    })
}

fn duration_ms(what: &str, value: Option<&String>) -> Result<Option<u64>, RuleProblem> {
    let Some(v) = value else { return Ok(None) };
    let d: gateway_api::Duration = v
        .parse()
        .map_err(|e| RuleProblem(format!("invalid {what} timeout {v:?}: {e}")))?;
    // Zero means "no timeout" in the Gateway API.
    Ok((!d.is_zero()).then(|| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
}

/// Translate one rule. Backend problems do not invalidate the rule (those requests get 500s);
/// they are returned for the ResolvedRefs condition.
pub fn rule(
    route: ir::RouteRef,
    r: &HttpRouteRules,
    backends: &mut Backends,
    ref_problems: &mut Vec<RefProblem>,
) -> Result<RuleTemplate, RuleProblem> {
    let matches: Vec<ir::HttpMatch> = match r.matches.as_deref() {
        None | Some([]) => vec![ir::HttpMatch::default()],
        Some(list) => list.iter().map(http_match).collect::<Result<_, _>>()?,
    };
    let rule_filters = filters(r.filters.as_ref())?;
    let from = From {
        group: GATEWAY_GROUP,
        kind: "HTTPRoute",
        namespace: &route.namespace,
    };
    let mut backend_templates = Vec::new();
    for b in r.backend_refs.iter().flatten() {
        let backend_filters = filters(b.filters.as_ref())?;
        let weight = u32::try_from(b.weight.unwrap_or(1)).unwrap_or(0);
        let mut policy_cluster = None;
        let target = match backends.resolve(
            from,
            &BackendRef {
                group: b.group.as_deref(),
                kind: b.kind.as_deref(),
                name: &b.name,
                namespace: b.namespace.as_deref(),
                port: b.port,
            },
        ) {
            Ok(cluster) => ir::BackendTarget::Cluster(cluster),
            Err(problem) => {
                let reason = problem.message.clone();
                policy_cluster.clone_from(&problem.policy_cluster);
                ref_problems.push(problem);
                ir::BackendTarget::Invalid { reason }
            }
        };
        if uses_prefix_replacement(&backend_filters) && !all_prefix(&matches) {
            return Err(RuleProblem(
                "ReplacePrefixMatch needs every match of the rule to be a PathPrefix".into(),
            ));
        }
        backend_templates.push(BackendTemplate {
            weight,
            target,
            filters: backend_filters,
            policy_cluster,
        });
    }
    if uses_prefix_replacement(&rule_filters) && !all_prefix(&matches) {
        return Err(RuleProblem(
            "ReplacePrefixMatch needs every match of the rule to be a PathPrefix".into(),
        ));
    }
    let timeouts = match &r.timeouts {
        None => ir::Timeouts::default(),
        Some(t) => ir::Timeouts {
            request_ms: duration_ms("request", t.request.as_ref())?,
            backend_request_ms: duration_ms("backendRequest", t.backend_request.as_ref())?,
        },
    };
    Ok(RuleTemplate {
        route,
        matches,
        filters: rule_filters,
        backends: backend_templates,
        timeouts,
    })
}

fn all_prefix(matches: &[ir::HttpMatch]) -> bool {
    matches
        .iter()
        .all(|m| matches!(m.path, ir::PathMatch::Prefix(_)))
}
