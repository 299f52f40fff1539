//! Hostname matching and intersection as the Gateway API defines them.
//!
//! A wildcard `*.example.com` matches one or more DNS labels in front of `.example.com` and never
//! `example.com` itself. Hostnames are compared case-insensitively; callers pass lower case.

/// Does `pattern` (exact or `*.`-wildcard) match the concrete or wildcard `name`?
/// A wildcard pattern matches a wildcard name when the name's suffix is at least as specific.
pub fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix('*') {
        None => pattern == name,
        Some(suffix) => {
            // `suffix` starts with '.'; `name` must have at least one label in front of it.
            let name_rest = name.strip_prefix('*').unwrap_or(name);
            name_rest.len() > suffix.len() && name_rest.ends_with(suffix)
                || (name.starts_with('*') && name_rest == suffix)
        }
    }
}

/// The hostnames a route serves on a listener: the intersection of the listener's hostname
/// (`None` = any) with the route's hostnames (empty = any). `None` means nothing intersects;
/// `Some(["*"])` means every host.
pub fn intersect(listener: Option<&str>, route: &[String]) -> Option<Vec<String>> {
    let route: Vec<String> = route.iter().map(|h| h.to_ascii_lowercase()).collect();
    let listener = listener.map(str::to_ascii_lowercase);
    let mut out: Vec<String> = match (listener.as_deref(), route.is_empty()) {
        (None, true) => vec!["*".to_string()],
        (Some(l), true) => vec![l.to_string()],
        (None, false) => route,
        (Some(l), false) => route
            .iter()
            .filter_map(|r| {
                if matches(l, r) {
                    Some(r.clone())
                } else if matches(r, l) {
                    Some(l.to_string())
                } else {
                    None
                }
            })
            .collect(),
    };
    out.sort();
    out.dedup();
    if out.is_empty() { None } else { Some(out) }
}

/// Ordering key for specificity: exact names first, then wildcards with longer suffixes, then `*`.
/// Smaller sorts first.
pub fn specificity(hostname: &str) -> (u8, std::cmp::Reverse<usize>) {
    if hostname == "*" {
        (2, std::cmp::Reverse(0))
    } else if hostname.starts_with('*') {
        (1, std::cmp::Reverse(hostname.len()))
    } else {
        (0, std::cmp::Reverse(hostname.len()))
    }
}

/// [`origin_specificity`]'s result: [`specificity`] of a route hostname.
pub type Origin = (u8, std::cmp::Reverse<usize>);

/// The specificity of the route hostname that `served` (one of [`intersect`]'s results) came
/// from: the most specific of `route` (lower case) equal to or covering it, `*` for a route
/// without hostnames. Precedence between routes that serve the same name ranks them by this
/// (GatewayRouteHostnameIntersectionPrecedence): a route that asked for `abc.example.com`
/// beats one that asked for `*.example.com`, though a listener for `abc.example.com` narrows
/// both to that name.
pub fn origin_specificity(served: &str, route: &[String]) -> Origin {
    route
        .iter()
        .filter(|r| r.as_str() == served || matches(r, served))
        .map(|r| specificity(r))
        .min()
        .unwrap_or_else(|| specificity("*"))
}

/// Does the virtual host `general` (`*`, wildcard or exact) also cover requests for `specific`?
pub fn covers(general: &str, specific: &str) -> bool {
    general == "*" || matches(general, specific)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn origin_is_the_most_specific_route_hostname_that_produced_the_name() {
        let route = s(&["*.example.com", "abc.example.com", "*.com"]);
        assert_eq!(
            origin_specificity("abc.example.com", &route),
            specificity("abc.example.com")
        );
        assert_eq!(
            origin_specificity("x.example.com", &route),
            specificity("*.example.com")
        );
        assert_eq!(
            origin_specificity("*.example.com", &route),
            specificity("*.example.com")
        );
        assert_eq!(origin_specificity("x.org", &[]), specificity("*"));
        assert!(specificity("abc.example.com") < specificity("*.example.com"));
        assert!(specificity("*.example.com") < specificity("*.com"));
    }

    #[test]
    fn wildcard_matching() {
        let cases = [
            ("*.example.com", "foo.example.com", true),
            ("*.example.com", "a.b.example.com", true),
            ("*.example.com", "example.com", false),
            ("*.example.com", "fooexample.com", false),
            ("*.example.com", "*.foo.example.com", true),
            ("*.example.com", "*.example.com", true),
            ("*.foo.example.com", "*.example.com", false),
            ("foo.example.com", "foo.example.com", true),
            ("foo.example.com", "bar.example.com", false),
        ];
        for (pattern, name, want) in cases {
            assert_eq!(matches(pattern, name), want, "{pattern} vs {name}");
        }
    }

    type IntersectCase<'a> = (Option<&'a str>, Vec<String>, Option<Vec<String>>);

    #[test]
    fn intersections() {
        let cases: Vec<IntersectCase> = vec![
            (None, vec![], Some(s(&["*"]))),
            (Some("foo.com"), vec![], Some(s(&["foo.com"]))),
            (None, s(&["a.com", "B.com"]), Some(s(&["a.com", "b.com"]))),
            (
                Some("*.example.com"),
                s(&["foo.example.com", "other.org"]),
                Some(s(&["foo.example.com"])),
            ),
            (
                Some("foo.example.com"),
                s(&["*.example.com"]),
                Some(s(&["foo.example.com"])),
            ),
            (
                Some("*.example.com"),
                s(&["*.foo.example.com"]),
                Some(s(&["*.foo.example.com"])),
            ),
            (
                Some("*.foo.example.com"),
                s(&["*.example.com"]),
                Some(s(&["*.foo.example.com"])),
            ),
            (Some("foo.example.com"), s(&["bar.example.com"]), None),
            (Some("*.example.com"), s(&["example.com"]), None),
        ];
        for (listener, route, want) in cases {
            assert_eq!(
                intersect(listener, &route),
                want,
                "{listener:?} x {route:?}"
            );
        }
    }

    #[test]
    fn specificity_orders_exact_then_longer_wildcards_then_any() {
        let mut v = s(&["*", "*.com", "a.example.com", "*.example.com", "b.com"]);
        v.sort_by_key(|h| specificity(h));
        assert_eq!(
            v,
            s(&["a.example.com", "b.com", "*.example.com", "*.com", "*"])
        );
    }
}
