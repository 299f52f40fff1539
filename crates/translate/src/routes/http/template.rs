//! HTTP rules as translate keeps them until the listener they run on is known: everything is
//! final except redirects, whose defaults (scheme, port) depend on the listener.

use gatehouse_ir as ir;

#[derive(Clone, Debug)]
pub struct RuleTemplate {
    pub route: ir::RouteRef,
    /// Shared with every virtual host entry made from them ([`ir::RouteEntry::matcher`]).
    pub matches: Vec<std::sync::Arc<ir::HttpMatch>>,
    pub filters: Vec<FilterTemplate>,
    pub backends: Vec<BackendTemplate>,
    pub timeouts: ir::Timeouts,
    pub retry: Option<ir::Retry>,
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

    /// Uses `ReplacePrefixMatch`, which only makes sense after a PathPrefix match.
    pub fn replaces_prefix(&self) -> bool {
        let path = match self {
            FilterTemplate::Redirect(r) => &r.path,
            FilterTemplate::Ready(ir::HttpFilter::UrlRewrite(r)) => &r.path,
            FilterTemplate::Ready(_) => return false,
        };
        matches!(path, Some(ir::PathModifier::ReplacePrefixMatch(_)))
    }
}

impl RuleTemplate {
    /// The rule as served on a listener speaking `scheme` on `port`.
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
            retry: self.retry.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redirect(scheme: Option<&str>, port: Option<u16>) -> RawRedirect {
        RawRedirect {
            scheme: scheme.map(str::to_string),
            hostname: None,
            port,
            path: None,
            status: 302,
        }
    }

    #[test]
    fn redirect_ports_follow_the_spec_defaults() {
        // Nothing set: the listener's scheme and port; a well-known port is left out.
        assert_eq!(redirect(None, None).resolve("http", 8080).port, Some(8080));
        assert_eq!(redirect(None, None).resolve("http", 80).port, None);
        // A scheme alone implies its well-known port.
        let r = redirect(Some("https"), None).resolve("http", 8080);
        assert_eq!((r.scheme.as_str(), r.port), ("https", None));
        // An explicit port wins, and is kept unless it is the scheme's own.
        assert_eq!(
            redirect(Some("https"), Some(8443)).resolve("http", 80).port,
            Some(8443)
        );
        assert_eq!(
            redirect(Some("https"), Some(443)).resolve("http", 80).port,
            None
        );
    }
}
