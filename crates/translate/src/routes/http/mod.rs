//! HTTPRoute: rules to listener-independent templates (matches, filters, backends, timeouts).

mod cors;
pub mod external_auth;
pub(crate) mod filters;
pub(crate) mod matches;
mod retry;
mod template;

pub use template::{BackendTemplate, FilterTemplate, RawRedirect, RuleTemplate};

use super::{
    ParentRef, RouteKind, RouteRule, RouteStatus, RuleCtx, parent_ref_from, route_status_from,
};
use crate::backends::backend_ref_of;
use crate::generated::httproutes::{
    HttpRoute, HttpRouteParentRefs, HttpRouteRules, HttpRouteRulesBackendRefsFiltersType,
    HttpRouteStatus, HttpRouteStatusParentsParentRef,
};
use crate::kinds::Finding;
use gatehouse_ir as ir;

parent_ref_from!(HttpRouteParentRefs, HttpRouteStatusParentsParentRef);
route_status_from!(HttpRouteStatus);

impl RouteKind for HttpRoute {
    const PROTOCOLS: &'static [&'static str] = &["HTTP", "HTTPS"];

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
        matches::regex_findings(self)
    }
}

fn duration_ms(what: &str, value: Option<&String>) -> Result<Option<u64>, String> {
    let Some(v) = value else { return Ok(None) };
    let d: gateway_api::Duration = v
        .parse()
        .map_err(|e| format!("invalid {what} timeout {v:?}: {e}"))?;
    // Zero means "no timeout" in the Gateway API.
    Ok((!d.is_zero()).then(|| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
}

fn all_prefix(matches: &[std::sync::Arc<ir::HttpMatch>]) -> bool {
    matches
        .iter()
        .all(|m| matches!(m.path, ir::PathMatch::Prefix(_)))
}

const PREFIX_NEEDS_PREFIX_MATCH: &str =
    "ReplacePrefixMatch needs every match of the rule to be a PathPrefix";

/// Translate one rule. Backend problems do not invalidate the rule (those requests get 500s);
/// the context records them for ResolvedRefs.
fn rule(
    index: usize,
    r: &HttpRouteRules,
    ctx: &mut RuleCtx<'_, '_>,
) -> Result<RuleTemplate, String> {
    let matches: Vec<std::sync::Arc<ir::HttpMatch>> = match r.matches.as_deref() {
        None | Some([]) => vec![Default::default()],
        Some(list) => list
            .iter()
            .map(|m| matches::http_match(m).map(std::sync::Arc::new))
            .collect::<Result<_, _>>()?,
    };
    let mut rule_filters = Vec::new();
    for f in r.filters.iter().flatten() {
        rule_filters.extend(filters::rule_filter(f, ctx)?);
    }
    filters::check_exclusive(&rule_filters)?;
    let mut backends = Vec::new();
    for b in r.backend_refs.iter().flatten() {
        let mut backend_filters = Vec::new();
        for f in b.filters.iter().flatten() {
            // An authorization check decides whether a request goes anywhere, so it belongs
            // before the backend is picked; the data plane runs it there only.
            if f.r#type == HttpRouteRulesBackendRefsFiltersType::ExternalAuth {
                return Err(
                    "ExternalAuth is supported in a rule's filters (and a listener's), \
                     not in a backendRef's"
                        .into(),
                );
            }
            backend_filters.extend(filters::backend_filter(f, ctx)?);
        }
        filters::check_exclusive(&backend_filters)?;
        let resolved = ctx.backend(&backend_ref_of!(b));
        if backend_filters.iter().any(FilterTemplate::replaces_prefix) && !all_prefix(&matches) {
            return Err(PREFIX_NEEDS_PREFIX_MATCH.into());
        }
        backends.push(BackendTemplate {
            weight: u32::try_from(b.weight.unwrap_or(1)).unwrap_or(0),
            target: resolved.target,
            filters: backend_filters,
            policy_cluster: resolved.policy_cluster,
        });
    }
    if rule_filters.iter().any(FilterTemplate::replaces_prefix) && !all_prefix(&matches) {
        return Err(PREFIX_NEEDS_PREFIX_MATCH.into());
    }
    let timeouts = match &r.timeouts {
        None => ir::Timeouts::default(),
        Some(t) => ir::Timeouts {
            request_ms: duration_ms("request", t.request.as_ref())?,
            backend_request_ms: duration_ms("backendRequest", t.backend_request.as_ref())?,
        },
    };
    let retry = match &r.retry {
        None => None,
        Some(x) => retry::policy(&retry::RawRetry {
            codes: x.codes.as_deref().unwrap_or_default(),
            attempts: x.attempts,
            backoff: x.backoff.as_deref(),
        })?,
    };
    Ok(RuleTemplate {
        route: ctx.route_ref(index),
        matches,
        filters: rule_filters,
        backends,
        timeouts,
        retry,
    })
}
