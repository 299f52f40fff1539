//! HTTPRoute filters to filter templates. Rule filters and backendRef filters are separate
//! generated types with the same fields, so one conversion is written once ([`filter_from!`])
//! and instantiated for both. GRPCRoute's filters (a subset) are built in `routes/grpc.rs` from
//! the helpers here.

use super::template::{FilterTemplate, RawRedirect};
use crate::backends::BackendRef;
use crate::routes::RuleCtx;
use gatehouse_ir as ir;

/// [`header_modifier`] of a generated modifier (`Option<&_>` with `set`, `add`, `remove`):
/// HTTPRoute's and GRPCRoute's request and response modifiers are separate types with these
/// same fields.
macro_rules! header_modifier_of {
    ($modifier:expr) => {{
        let m = $modifier;
        $crate::routes::http::filters::header_modifier(
            m.and_then(|m| m.set.as_deref())
                .unwrap_or_default()
                .iter()
                .map(|h| (&h.name, &h.value)),
            m.and_then(|m| m.add.as_deref())
                .unwrap_or_default()
                .iter()
                .map(|h| (&h.name, &h.value)),
            m.and_then(|m| m.remove.as_deref()).unwrap_or_default(),
        )
    }};
}
pub(crate) use header_modifier_of;

/// Builds `fn $name(&$filter, &mut RuleCtx) -> Result<Option<FilterTemplate>, String>` over one
/// family of generated filter types (the filter, its type enum, and the enums of redirect and
/// rewrite paths). `None`: a mirror whose backendRef does not resolve, left out of the rule
/// (the context records the problem for ResolvedRefs).
macro_rules! filter_from {
    ($name:ident, $filter:ty, $kind:ident, $redirect_path:ident, $rewrite_path:ident, $scheme:ident, $auth_protocol:ident) => {
        pub fn $name(
            f: &$filter,
            ctx: &mut $crate::routes::RuleCtx<'_, '_>,
        ) -> Result<Option<$crate::routes::http::FilterTemplate>, String> {
            Ok(Some(match f.r#type {
                $kind::RequestHeaderModifier => $crate::routes::http::FilterTemplate::Ready(
                    gatehouse_ir::HttpFilter::RequestHeaders(header_modifier_of!(
                        f.request_header_modifier.as_ref()
                    )?),
                ),
                $kind::ResponseHeaderModifier => $crate::routes::http::FilterTemplate::Ready(
                    gatehouse_ir::HttpFilter::ResponseHeaders(header_modifier_of!(
                        f.response_header_modifier.as_ref()
                    )?),
                ),
                $kind::RequestRedirect => {
                    let r = f.request_redirect.clone().unwrap_or_default();
                    $crate::routes::http::filters::redirect(
                        r.scheme.map(|s| match s {
                            $scheme::Http => "http",
                            $scheme::Https => "https",
                        }),
                        r.hostname.as_deref(),
                        r.port,
                        r.path.map(|p| {
                            (
                                matches!(p.r#type, $redirect_path::ReplaceFullPath),
                                p.replace_full_path,
                                p.replace_prefix_match,
                            )
                        }),
                        r.status_code,
                    )?
                }
                $kind::UrlRewrite => {
                    let r = f.url_rewrite.clone().unwrap_or_default();
                    $crate::routes::http::FilterTemplate::Ready(
                        gatehouse_ir::HttpFilter::UrlRewrite(gatehouse_ir::UrlRewrite {
                            hostname: r.hostname.as_deref().map(str::to_ascii_lowercase),
                            path: $crate::routes::http::filters::path_modifier(r.path.map(|p| {
                                (
                                    matches!(p.r#type, $rewrite_path::ReplaceFullPath),
                                    p.replace_full_path,
                                    p.replace_prefix_match,
                                )
                            }))?,
                        }),
                    )
                }
                $kind::RequestMirror => {
                    let Some(m) = f.request_mirror.as_ref() else {
                        return Err("RequestMirror needs requestMirror".into());
                    };
                    return $crate::routes::http::filters::mirror(
                        &$crate::backends::backend_ref_of!(m.backend_ref),
                        m.percent,
                        m.fraction.as_ref().map(|f| (f.numerator, f.denominator)),
                        ctx,
                    );
                }
                $kind::ExtensionRef => {
                    return Err($crate::routes::http::filters::unsupported("ExtensionRef"))
                }
                $kind::ExternalAuth => {
                    let Some(a) = f.external_auth.as_ref() else {
                        return Err("ExternalAuth needs externalAuth".into());
                    };
                    let raw =
                        $crate::routes::http::external_auth::raw_external_auth!(a, $auth_protocol);
                    $crate::routes::http::FilterTemplate::Ready(
                        gatehouse_ir::HttpFilter::ExternalAuth(
                            $crate::routes::http::external_auth::filter(&raw, |b, h2| {
                                ctx.auth_backend(b, h2)
                            })?,
                        ),
                    )
                }
                $kind::Cors => {
                    let Some(c) = f.cors.as_ref() else {
                        return Err("CORS needs cors".into());
                    };
                    $crate::routes::http::FilterTemplate::Ready(gatehouse_ir::HttpFilter::Cors(
                        $crate::routes::http::cors::policy(&$crate::routes::http::cors::RawCors {
                            allow_origins: c.allow_origins.as_deref().unwrap_or_default(),
                            allow_credentials: c.allow_credentials.unwrap_or(false),
                            allow_methods: c.allow_methods.as_deref().unwrap_or_default(),
                            allow_headers: c.allow_headers.as_deref().unwrap_or_default(),
                            expose_headers: c.expose_headers.as_deref().unwrap_or_default(),
                            max_age: c.max_age,
                        })?,
                    ))
                }
            }))
        }
    };
}

/// A `RequestMirror` filter: `percent` or `fraction` (numerator, denominator; 100 when left
/// out) say how many requests are mirrored, every one when neither is set. A backendRef that
/// does not resolve leaves the mirror out (`None`): the spec asks for the backend to be
/// dropped with ResolvedRefs False, and the rest of the rule keeps working.
pub fn mirror(
    backend: &BackendRef<'_>,
    percent: Option<i32>,
    fraction: Option<(i32, Option<i32>)>,
    ctx: &mut RuleCtx<'_, '_>,
) -> Result<Option<FilterTemplate>, String> {
    let (numerator, denominator) = match (percent, fraction) {
        (Some(_), Some(_)) => {
            return Err("RequestMirror may set percent or fraction, not both".into());
        }
        (Some(p), None) if (0..=100).contains(&p) => (p, 100),
        (Some(p), None) => {
            return Err(format!(
                "RequestMirror percent {p} is not between 0 and 100"
            ));
        }
        (None, Some((n, d))) => {
            let d = d.unwrap_or(100);
            if d < 1 || n < 0 || n > d {
                return Err(format!(
                    "RequestMirror fraction {n}/{d} needs 0 <= numerator <= denominator and a denominator of at least 1"
                ));
            }
            (n, d)
        }
        (None, None) => (1, 1),
    };
    let resolved = ctx.backend(backend);
    let ir::BackendTarget::Cluster(cluster) = resolved.target else {
        return Ok(None);
    };
    Ok(Some(FilterTemplate::Ready(ir::HttpFilter::Mirror(
        ir::Mirror {
            cluster,
            numerator: numerator as u32,
            denominator: denominator as u32,
        },
    ))))
}

pub fn unsupported(kind: &str) -> String {
    format!("filter type {kind} is not supported by Gatehouse")
}

/// Header names are matched case-insensitively: the IR keeps them in lower case. Names must be
/// HTTP tokens and values visible ASCII (or tab), as the CRD's patterns say; manifest files are
/// not checked by the CRD, and the data plane would refuse anything else.
pub fn header_modifier<'a>(
    set: impl Iterator<Item = (&'a String, &'a String)>,
    add: impl Iterator<Item = (&'a String, &'a String)>,
    remove: &[String],
) -> Result<ir::HeaderModifier, String> {
    fn name(n: &str) -> Result<String, String> {
        if super::matches::is_token(n) {
            Ok(n.to_ascii_lowercase())
        } else {
            Err(format!("header name {n:?} is not a valid HTTP header name"))
        }
    }
    let pairs = |list: &mut dyn Iterator<Item = (&'a String, &'a String)>| {
        list.map(|(n, value)| {
            if !value
                .bytes()
                .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
            {
                return Err(format!(
                    "header {n:?}: value {value:?} holds characters a header value cannot carry"
                ));
            }
            Ok(ir::HeaderValue {
                name: name(n)?,
                value: value.clone(),
            })
        })
        .collect::<Result<Vec<_>, String>>()
    };
    let (mut set, mut add) = (set, add);
    Ok(ir::HeaderModifier {
        set: pairs(&mut set)?,
        add: pairs(&mut add)?,
        remove: remove.iter().map(|n| name(n)).collect::<Result<_, _>>()?,
    })
}

/// A path modifier given as (is ReplaceFullPath, replaceFullPath, replacePrefixMatch).
type RawPath = (bool, Option<String>, Option<String>);

pub fn path_modifier(p: Option<RawPath>) -> Result<Option<ir::PathModifier>, String> {
    match p {
        None => Ok(None),
        Some((true, full, _)) => {
            let v = full.ok_or_else(|| "ReplaceFullPath needs replaceFullPath".to_string())?;
            check_path_value("replaceFullPath", &v, false)?;
            Ok(Some(ir::PathModifier::ReplaceFullPath(v)))
        }
        Some((false, _, prefix)) => {
            let v =
                prefix.ok_or_else(|| "ReplacePrefixMatch needs replacePrefixMatch".to_string())?;
            check_path_value("replacePrefixMatch", &v, true)?;
            Ok(Some(ir::PathModifier::ReplacePrefixMatch(v)))
        }
    }
}

/// A path a filter writes must be one a request line or Location can carry
/// (`ir::check_path_value`); the replacement of a prefix may also be empty.
fn check_path_value(field: &str, value: &str, may_be_empty: bool) -> Result<(), String> {
    if value.is_empty() && may_be_empty {
        return Ok(());
    }
    ir::check_path_value(value).map_err(|why| format!("{field} {value:?} {why}"))
}

pub fn redirect(
    scheme: Option<&str>,
    hostname: Option<&str>,
    port: Option<i32>,
    path: Option<RawPath>,
    status: Option<i64>,
) -> Result<FilterTemplate, String> {
    let status = status.unwrap_or(302);
    if ![301, 302, 303, 307, 308].contains(&status) {
        return Err(format!("redirect status code {status} is not supported"));
    }
    Ok(FilterTemplate::Redirect(RawRedirect {
        scheme: scheme.map(str::to_string),
        hostname: hostname.map(str::to_ascii_lowercase),
        port: port.and_then(|p| u16::try_from(p).ok()),
        path: path_modifier(path)?,
        status: status as u16,
    }))
}

/// At most one RequestRedirect or URLRewrite per rule (or backendRef), and one CORS.
pub fn check_exclusive(filters: &[FilterTemplate]) -> Result<(), String> {
    let rewrites = filters
        .iter()
        .filter(|f| {
            matches!(
                f,
                FilterTemplate::Redirect(_) | FilterTemplate::Ready(ir::HttpFilter::UrlRewrite(_))
            )
        })
        .count();
    if rewrites > 1 {
        return Err(
            "a rule may have one RequestRedirect or one URLRewrite, not both or several".into(),
        );
    }
    let cors = filters
        .iter()
        .filter(|f| matches!(f, FilterTemplate::Ready(ir::HttpFilter::Cors(_))))
        .count();
    if cors > 1 {
        return Err("a rule may have one CORS filter".into());
    }
    Ok(())
}

mod generated {
    use crate::generated::httproutes::*;

    filter_from!(
        rule_filter,
        HttpRouteRulesFilters,
        HttpRouteRulesFiltersType,
        HttpRouteRulesFiltersRequestRedirectPathType,
        HttpRouteRulesFiltersUrlRewritePathType,
        HttpRouteRulesFiltersRequestRedirectScheme,
        HttpRouteRulesFiltersExternalAuthProtocol
    );
    filter_from!(
        backend_filter,
        HttpRouteRulesBackendRefsFilters,
        HttpRouteRulesBackendRefsFiltersType,
        HttpRouteRulesBackendRefsFiltersRequestRedirectPathType,
        HttpRouteRulesBackendRefsFiltersUrlRewritePathType,
        HttpRouteRulesBackendRefsFiltersRequestRedirectScheme,
        HttpRouteRulesBackendRefsFiltersExternalAuthProtocol
    );
}
pub use generated::{backend_filter, rule_filter};
