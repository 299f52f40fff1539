//! GRPCRoute: gRPC calls on HTTP and HTTPS listeners.
//!
//! A gRPC call is an HTTP/2 POST to `/<service>/<method>`, so a GRPCRoute rule becomes an HTTP
//! rule ([`RouteRule::Http`]) whose path match is made from the method match: the data plane's
//! HTTP router, filters and balancer serve it unchanged. What differs from HTTPRoute is
//! translated here: method matches, the smaller set of filters, and backends that are always
//! spoken to over HTTP/2 ([`RouteKind::HTTP2_BACKENDS`]).

use super::http::{BackendTemplate, FilterTemplate, RuleTemplate, filters, matches};
use super::{
    ParentRef, RouteKind, RouteRule, RouteStatus, RuleCtx, parent_ref_from, route_status_from,
};
use crate::kinds::{Finding, PathSegment};
use gatehouse_ir as ir;
use gateway_api::apis::standard::grpcroutes::{
    GrpcRoute, GrpcRouteParentRefs, GrpcRouteRules, GrpcRouteRulesBackendRefsFilters,
    GrpcRouteRulesBackendRefsFiltersType, GrpcRouteRulesFilters, GrpcRouteRulesFiltersType,
    GrpcRouteRulesMatches, GrpcRouteRulesMatchesHeadersType, GrpcRouteRulesMatchesMethod,
    GrpcRouteRulesMatchesMethodType, GrpcRouteStatus, GrpcRouteStatusParentsParentRef,
};

parent_ref_from!(GrpcRouteParentRefs, GrpcRouteStatusParentsParentRef);
route_status_from!(GrpcRouteStatus);

impl RouteKind for GrpcRoute {
    const PROTOCOLS: &'static [&'static str] = &["HTTP", "HTTPS"];
    const HTTP2_BACKENDS: bool = true;

    fn parent_refs(&self) -> Vec<ParentRef> {
        self.spec
            .parent_refs
            .iter()
            .flatten()
            .map(Into::into)
            .collect()
    }

    fn hostnames(&self) -> &[String] {
        self.spec.hostnames.as_deref().unwrap_or_default()
    }

    fn rules(&self, ctx: &mut RuleCtx<'_, '_>) -> Vec<Result<RouteRule, String>> {
        let rules = self.spec.rules.as_deref().unwrap_or_default();
        rules
            .iter()
            .enumerate()
            .map(|(index, r)| rule(index, r, ctx).map(RouteRule::Http))
            .collect()
    }

    fn carried_status(&self) -> Option<RouteStatus> {
        self.status.as_ref().map(Into::into)
    }

    fn findings(&self) -> Vec<Finding> {
        regex_findings(self)
    }
}

/// Translate one rule. As for HTTPRoute, backend problems do not invalidate the rule (those
/// calls are answered UNAVAILABLE by the data plane); the context records them.
fn rule(
    index: usize,
    r: &GrpcRouteRules,
    ctx: &mut RuleCtx<'_, '_>,
) -> Result<RuleTemplate, String> {
    let matches: Vec<std::sync::Arc<ir::HttpMatch>> = match r.matches.as_deref() {
        None | Some([]) => vec![Default::default()],
        Some(list) => list
            .iter()
            .map(|m| grpc_match(m).map(std::sync::Arc::new))
            .collect::<Result<_, _>>()?,
    };
    let mut rule_filters = Vec::new();
    for f in r.filters.iter().flatten() {
        rule_filters.extend(rule_filter(f, ctx)?);
    }
    let mut backends = Vec::new();
    for b in r.backend_refs.iter().flatten() {
        let mut backend_filters = Vec::new();
        for f in b.filters.iter().flatten() {
            backend_filters.extend(backend_filter(f, ctx)?);
        }
        let resolved = ctx.backend(&crate::backends::backend_ref_of!(b));
        backends.push(BackendTemplate {
            weight: u32::try_from(b.weight.unwrap_or(1)).unwrap_or(0),
            target: resolved.target,
            filters: backend_filters,
            policy_cluster: resolved.policy_cluster,
        });
    }
    Ok(RuleTemplate {
        route: ctx.route_ref(index),
        matches,
        filters: rule_filters,
        backends,
        // GRPCRoute has no timeouts field: the data plane's default applies.
        timeouts: ir::Timeouts::default(),
        // Nor a retry field (GRPCRoute v1): calls go out once.
        retry: None,
    })
}

/// A service name as the CRD allows it: dot-separated identifiers.
fn is_service_name(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').enumerate().all(|(i, part)| {
            // A leading dot is allowed (a fully qualified name).
            (i == 0 && part.is_empty()) || is_identifier(part)
        })
}

fn is_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The path match of a method match: the call's path is `/<service>/<method>`.
///
/// Exact with both names is an exact path; a service alone is the path prefix `/<service>`
/// (segment-wise, so `/pkg.Svc` does not take `/pkg.SvcOther/...`); a method alone is a
/// regular expression for any service. RegularExpression matches each name against its
/// expression, an empty one matching any name.
fn method_path(m: &GrpcRouteRulesMatchesMethod) -> Result<ir::PathMatch, String> {
    let service = m.service.as_deref().filter(|s| !s.is_empty());
    let method = m.method.as_deref().filter(|s| !s.is_empty());
    let regex = m.r#type == Some(GrpcRouteRulesMatchesMethodType::RegularExpression);
    if regex {
        let part = |re: Option<&str>, what: &str| -> Result<String, String> {
            match re {
                None => Ok("[^/]+".to_string()),
                Some(re) => {
                    matches::check_regex(what, re)?;
                    Ok(format!("(?:{re})"))
                }
            }
        };
        let service = part(service, "method match service")?;
        let method = part(method, "method match method")?;
        return Ok(ir::PathMatch::Regex(format!("/{service}/{method}")));
    }
    if let Some(s) = service.filter(|s| !is_service_name(s)) {
        return Err(format!(
            "method match service {s:?} is not a gRPC service name"
        ));
    }
    if let Some(m) = method.filter(|m| !is_identifier(m)) {
        return Err(format!(
            "method match method {m:?} is not a gRPC method name"
        ));
    }
    match (service, method) {
        (Some(s), Some(m)) => Ok(ir::PathMatch::Exact(format!("/{s}/{m}"))),
        (Some(s), None) => Ok(ir::PathMatch::Prefix(format!("/{s}"))),
        (None, Some(m)) => Ok(ir::PathMatch::Regex(format!("/[^/]+/{}", regex::escape(m)))),
        (None, None) => Err("an Exact method match needs a service or a method".into()),
    }
}

fn grpc_match(m: &GrpcRouteRulesMatches) -> Result<ir::HttpMatch, String> {
    let path = match &m.method {
        None => ir::PathMatch::Prefix("/".into()),
        Some(method) => method_path(method)?,
    };
    let headers = matches::header_matches(m.headers.iter().flatten().map(|h| {
        let regex = h.r#type == Some(GrpcRouteRulesMatchesHeadersType::RegularExpression);
        (h.name.as_str(), regex, h.value.as_str())
    }))?;
    Ok(ir::HttpMatch {
        path,
        method: None,
        headers,
        query_params: Vec::new(),
    })
}

/// Builds `fn $name(&$filter, &mut RuleCtx) -> Result<Option<FilterTemplate>, String>` for
/// one of GRPCRoute's two filter types (rule and backendRef), which have the same fields: the
/// header modifiers and RequestMirror of HTTPRoute, nothing else.
macro_rules! grpc_filter_from {
    ($name:ident, $filter:ty, $kind:ident) => {
        fn $name(f: &$filter, ctx: &mut RuleCtx<'_, '_>) -> Result<Option<FilterTemplate>, String> {
            Ok(Some(match f.r#type {
                $kind::RequestHeaderModifier => {
                    FilterTemplate::Ready(ir::HttpFilter::RequestHeaders(
                        filters::header_modifier_of!(f.request_header_modifier.as_ref())?,
                    ))
                }
                $kind::ResponseHeaderModifier => {
                    FilterTemplate::Ready(ir::HttpFilter::ResponseHeaders(
                        filters::header_modifier_of!(f.response_header_modifier.as_ref())?,
                    ))
                }
                $kind::RequestMirror => {
                    let Some(m) = f.request_mirror.as_ref() else {
                        return Err("RequestMirror needs requestMirror".into());
                    };
                    // The mirror's copy is a gRPC call too: `ctx` resolves its backend over
                    // HTTP/2 as the rule's.
                    return filters::mirror(
                        &crate::backends::backend_ref_of!(m.backend_ref),
                        m.percent,
                        m.fraction.as_ref().map(|f| (f.numerator, f.denominator)),
                        ctx,
                    );
                }
                $kind::ExtensionRef => return Err(filters::unsupported("ExtensionRef")),
            }))
        }
    };
}

grpc_filter_from!(
    rule_filter,
    GrpcRouteRulesFilters,
    GrpcRouteRulesFiltersType
);
grpc_filter_from!(
    backend_filter,
    GrpcRouteRulesBackendRefsFilters,
    GrpcRouteRulesBackendRefsFiltersType
);

/// Every RegularExpression of the route that does not compile, by field path.
fn regex_findings(route: &GrpcRoute) -> Vec<Finding> {
    let mut out = Vec::new();
    let rules = route.spec.rules.as_deref().unwrap_or_default();
    for (r, rule) in rules.iter().enumerate() {
        for (m, matched) in rule.matches.iter().flatten().enumerate() {
            let base = [
                matches::key("spec"),
                matches::key("rules"),
                PathSegment::Index(r),
                matches::key("matches"),
                PathSegment::Index(m),
            ];
            let mut check = |value: &str, tail: &[PathSegment]| {
                out.extend(matches::regex_finding(&base, tail, value));
            };
            if let Some(method) = &matched.method
                && method.r#type == Some(GrpcRouteRulesMatchesMethodType::RegularExpression)
            {
                for (field, value) in [("service", &method.service), ("method", &method.method)] {
                    if let Some(v) = value {
                        check(v, &[matches::key("method"), matches::key(field)]);
                    }
                }
            }
            for (h, header) in matched.headers.iter().flatten().enumerate() {
                if header.r#type == Some(GrpcRouteRulesMatchesHeadersType::RegularExpression) {
                    check(
                        &header.value,
                        &[
                            matches::key("headers"),
                            PathSegment::Index(h),
                            matches::key("value"),
                        ],
                    );
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `method_path` of a method match; an empty name is left out.
    fn try_method(
        kind: Option<GrpcRouteRulesMatchesMethodType>,
        s: &str,
        m: &str,
    ) -> Result<ir::PathMatch, String> {
        let opt = |v: &str| (!v.is_empty()).then(|| v.to_string());
        method_path(&GrpcRouteRulesMatchesMethod {
            r#type: kind,
            service: opt(s),
            method: opt(m),
        })
    }

    fn method(kind: Option<GrpcRouteRulesMatchesMethodType>, s: &str, m: &str) -> ir::PathMatch {
        try_method(kind, s, m).unwrap_or_else(|e| panic!("{s}/{m}: {e}"))
    }

    fn method_err(kind: Option<GrpcRouteRulesMatchesMethodType>, s: &str, m: &str) -> String {
        try_method(kind, s, m).expect_err("should be refused")
    }

    use GrpcRouteRulesMatchesMethodType::{Exact, RegularExpression as Re};

    #[test]
    fn exact_method_matches_become_paths() {
        assert_eq!(
            method(Some(Exact), "pkg.Svc", "Call"),
            ir::PathMatch::Exact("/pkg.Svc/Call".into())
        );
        // The type defaults to Exact.
        assert_eq!(
            method(None, "pkg.Svc", "Call"),
            ir::PathMatch::Exact("/pkg.Svc/Call".into())
        );
        assert_eq!(
            method(None, "pkg.Svc", ""),
            ir::PathMatch::Prefix("/pkg.Svc".into())
        );
        // A method alone: any service, the method's name taken literally.
        assert_eq!(
            method(None, "", "Call"),
            ir::PathMatch::Regex("/[^/]+/Call".into())
        );
    }

    #[test]
    fn regular_expression_method_matches_group_each_name() {
        assert_eq!(
            method(Some(Re), "pkg\\.(A|B)", ""),
            ir::PathMatch::Regex("/(?:pkg\\.(A|B))/[^/]+".into())
        );
        assert_eq!(
            method(Some(Re), "", "Get|Put"),
            ir::PathMatch::Regex("/[^/]+/(?:Get|Put)".into())
        );
        let compiled = regex::Regex::new(&ir::anchored_regex("/[^/]+/(?:Get|Put)")).unwrap();
        assert!(compiled.is_match("/a.B/Put"));
        assert!(!compiled.is_match("/a.B/Putter"));
    }

    #[test]
    fn bad_method_matches_say_why() {
        assert!(method_err(None, "", "").contains("needs a service or a method"));
        assert!(method_err(None, "pkg/Svc", "Call").contains("not a gRPC service name"));
        assert!(method_err(None, "pkg.Svc", "Ca ll").contains("not a gRPC method name"));
        assert!(method_err(Some(Re), "(", "").contains("invalid regular expression"));
    }

    #[test]
    fn service_names_may_be_fully_qualified() {
        assert!(is_service_name(".pkg.v1.Svc"));
        assert!(is_service_name("Svc"));
        assert!(!is_service_name("pkg..Svc"));
        assert!(!is_service_name("1pkg.Svc"));
    }
}
