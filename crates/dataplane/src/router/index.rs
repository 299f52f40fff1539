//! A virtual host's route list with exact-header-match indexes, built at compile time.
//!
//! The IR delivers a virtual host's entries in precedence order and the router must return the
//! first entry that matches. Checked one by one, the last of many entries that differ only by a
//! header value costs a full scan. Here every maximal run of consecutive entries that each
//! carry at least one exact header match (and that is long enough to be worth it) becomes one
//! step of the scan: each entry is filed under one of its exact (name, value) pairs, so the
//! request's headers name the only candidates. A candidate is then checked with its complete
//! matcher, so the indexed pair is only a necessary condition and entries may carry anything
//! else (path, method, more headers, regexes, query parameters). Every entry that matches has
//! its indexed pair among the request's headers, so it is among the candidates, and the lowest
//! matching candidate is exactly what the linear scan would have returned.
//!
//! Per request the cost of a group is bounded by the smaller of the number of distinct header
//! names the group indexes and the number of header names the request carries, not by the
//! number of entries. Nothing is allocated: header values are looked up as bytes.

use crate::headers::RequestHeaders;
use crate::matchers::{RequestView, ValueMatcher};
use crate::table::CompiledRoute;
use std::collections::HashMap;
use std::ops::Range;

/// Runs of fewer indexable entries stay linear: checking three entries costs about what the
/// lookups of an index do.
const MIN_GROUP: usize = 4;

/// The routes of one virtual host, in precedence order, and how to scan them.
#[derive(Debug)]
pub(crate) struct RouteTable {
    routes: Vec<CompiledRoute>,
    steps: Box<[Step]>,
}

#[derive(Debug)]
enum Step {
    /// These entries, checked one by one.
    Linear(Range<usize>),
    /// A run of entries found through their exact header matches.
    Indexed(HeaderIndex),
}

#[derive(Debug)]
struct HeaderIndex {
    /// An entry whose path and method every entry of the run shares: checked once, and a
    /// request it refuses skips the run without any lookup.
    shared: Option<usize>,
    /// Indexed header names -> position in `slots`.
    names: Map<Box<str>, usize>,
    /// Bit `min(len, 63)` set for the length of every indexed name: most of a request's
    /// headers (`host`, `user-agent`, `accept`) are skipped without hashing their name.
    name_lengths: u64,
    /// Per indexed name: value bytes -> candidate entries, in precedence order.
    slots: Box<[Slot]>,
}

/// foldhash: a fraction of SipHash's cost on short keys, still seeded per map. The keys come
/// from the configuration; requests only probe.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// One indexed header name's values -> candidate entries, in precedence order.
type ValueIndex<C> = Map<Box<[u8]>, C>;

/// An indexed header name and its values.
type Slot = (Box<str>, ValueIndex<Box<[Candidate]>>);

#[derive(Debug)]
struct Candidate {
    /// Position in the route list.
    entry: usize,
    /// The lookup alone decides this entry: the run's shared path and method were checked and
    /// the indexed pair is its only other condition.
    decided: bool,
}

impl RouteTable {
    pub(crate) fn new(routes: Vec<CompiledRoute>) -> Self {
        let mut steps = Vec::new();
        let mut linear_start = 0;
        let mut i = 0;
        while i < routes.len() {
            let run_end = i + routes[i..].iter().take_while(|r| indexable(r)).count();
            if run_end - i >= MIN_GROUP {
                if linear_start < i {
                    steps.push(Step::Linear(linear_start..i));
                }
                steps.push(Step::Indexed(HeaderIndex::new(&routes, i..run_end)));
                linear_start = run_end;
            }
            i = run_end.max(i + 1);
        }
        if linear_start < routes.len() {
            steps.push(Step::Linear(linear_start..routes.len()));
        }
        RouteTable {
            routes,
            steps: steps.into(),
        }
    }

    /// The first route, in precedence order, whose match succeeds.
    pub(crate) fn find<H: RequestHeaders + ?Sized>(
        &self,
        req: &mut RequestView<'_, H>,
    ) -> Option<&CompiledRoute> {
        for step in &self.steps {
            let found = match step {
                Step::Linear(range) => self.routes[range.clone()]
                    .iter()
                    .find(|r| r.matcher.matches(req)),
                Step::Indexed(index) => index.find(&self.routes, req).map(|i| &self.routes[i]),
            };
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// Every entry, in precedence order (what a linear scan would walk).
    #[cfg(test)]
    pub(crate) fn routes(&self) -> &[CompiledRoute] {
        &self.routes
    }

    /// How many entries sit in indexed runs.
    #[cfg(test)]
    pub(crate) fn indexed_entries(&self) -> usize {
        self.steps
            .iter()
            .map(|s| match s {
                Step::Linear(_) => 0,
                Step::Indexed(index) => index
                    .slots
                    .iter()
                    .flat_map(|(_, values)| values.values())
                    .map(|c| c.len())
                    .sum::<usize>(),
            })
            .sum()
    }
}

fn indexable(route: &CompiledRoute) -> bool {
    exact_pairs(route).next().is_some()
}

fn exact_pairs(route: &CompiledRoute) -> impl Iterator<Item = (&str, &[u8])> {
    route.matcher.headers.iter().filter_map(|h| match &h.value {
        ValueMatcher::Exact(v) => Some((h.name.as_str(), v.as_bytes())),
        ValueMatcher::Regex(_) => None,
    })
}

impl HeaderIndex {
    /// `run` must hold only [`indexable`] entries.
    fn new(routes: &[CompiledRoute], run: Range<usize>) -> Self {
        let entries = &routes[run.clone()];
        // File each entry under its pair shared by the fewest entries of the run, so that a
        // common pair (`x-env: prod` on every entry) does not make one long candidate list.
        let mut counts: HashMap<(&str, &[u8]), usize> = HashMap::new();
        for r in entries {
            for pair in exact_pairs(r) {
                *counts.entry(pair).or_default() += 1;
            }
        }
        let first = &entries[0].matcher;
        let shared = entries[1..]
            .iter()
            .all(|r| r.matcher.method == first.method && r.matcher.path.same_as(&first.path))
            .then_some(run.start);
        let mut names: Map<Box<str>, usize> = Map::default();
        let mut slots: Vec<(Box<str>, ValueIndex<Vec<Candidate>>)> = Vec::new();
        for (entry, r) in run.clone().zip(entries) {
            let (name, value) = exact_pairs(r)
                .min_by_key(|pair| counts[pair])
                .expect("indexable entries have an exact header match");
            let slot = *names.entry(name.into()).or_insert_with(|| {
                slots.push((name.into(), Map::default()));
                slots.len() - 1
            });
            let decided =
                shared.is_some() && r.matcher.headers.len() == 1 && r.matcher.query.is_empty();
            slots[slot]
                .1
                .entry(value.into())
                .or_default()
                .push(Candidate { entry, decided });
        }
        HeaderIndex {
            shared,
            name_lengths: names.keys().fold(0, |bits, n| bits | length_bit(n)),
            names,
            slots: slots
                .into_iter()
                .map(|(name, values)| {
                    let values = values.into_iter().map(|(v, c)| (v, c.into())).collect();
                    (name, values)
                })
                .collect(),
        }
    }

    /// The position of the first entry of the run that matches. Out of line: it runs once per
    /// run, and inlining it would cost the per-entry checks of linear steps their inlining.
    #[inline(never)]
    fn find<H: RequestHeaders + ?Sized>(
        &self,
        routes: &[CompiledRoute],
        req: &mut RequestView<'_, H>,
    ) -> Option<usize> {
        if let Some(shared) = self.shared
            && !routes[shared].matcher.method_and_path_match(req)
        {
            return None;
        }
        let headers = req.headers;
        let mut best = usize::MAX;
        // Walk whichever side has fewer names; both visit every (name, value) pair the request
        // and the index have in common.
        if self.slots.len() <= headers.names_hint() {
            for (name, values) in &self.slots {
                for value in headers.values_of(name) {
                    if let Some(candidates) = values.get(value) {
                        best = first_match(routes, candidates, best, req);
                    }
                }
            }
        } else {
            for (name, value) in headers.fields() {
                if self.name_lengths & length_bit(name) != 0
                    && let Some(&slot) = self.names.get(name)
                    && let Some(candidates) = self.slots[slot].1.get(value)
                {
                    best = first_match(routes, candidates, best, req);
                }
            }
        }
        (best != usize::MAX).then_some(best)
    }
}

fn length_bit(name: &str) -> u64 {
    1 << name.len().min(63)
}

/// The first of `candidates` below `best` whose whole match succeeds, else `best`.
fn first_match<H: RequestHeaders + ?Sized>(
    routes: &[CompiledRoute],
    candidates: &[Candidate],
    best: usize,
    req: &mut RequestView<'_, H>,
) -> usize {
    candidates
        .iter()
        .take_while(|c| c.entry < best)
        .find(|c| c.decided || routes[c.entry].matcher.matches(req))
        .map_or(best, |c| c.entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matchers::LazyQuery;
    use crate::matchers::RequestMatcher;
    use gatehouse_ir as ir;
    use http::{HeaderMap, HeaderName, HeaderValue, Method};

    fn route(m: &ir::HttpMatch, entry: usize) -> CompiledRoute {
        CompiledRoute {
            matcher: RequestMatcher::try_from(m).unwrap(),
            entry,
        }
    }

    fn table(matches: &[ir::HttpMatch]) -> RouteTable {
        RouteTable::new(
            matches
                .iter()
                .enumerate()
                .map(|(i, m)| route(m, i))
                .collect(),
        )
    }

    fn exact(name: &str, value: &str) -> ir::HeaderMatch {
        ir::HeaderMatch {
            name: name.into(),
            value: ir::StringMatch::Exact(value.into()),
        }
    }

    fn on_root(headers: Vec<ir::HeaderMatch>) -> ir::HttpMatch {
        ir::HttpMatch {
            headers,
            ..Default::default()
        }
    }

    struct Req {
        method: Method,
        path: &'static str,
        headers: HeaderMap,
        query: Option<&'static str>,
    }

    impl Req {
        fn get(headers: &[(&str, &str)]) -> Req {
            let mut map = HeaderMap::new();
            for &(n, v) in headers {
                map.append(
                    HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            Req {
                method: Method::GET,
                path: "/",
                headers: map,
                query: None,
            }
        }

        fn view(&self) -> RequestView<'_, HeaderMap> {
            RequestView {
                method: &self.method,
                path: self.path,
                headers: &self.headers,
                query: LazyQuery::new(self.query),
            }
        }
    }

    fn indexed(t: &RouteTable, req: &Req) -> Option<usize> {
        t.find(&mut req.view()).map(|r| r.entry)
    }

    /// The reference: every entry in order, as the router did before the index.
    fn linear(t: &RouteTable, req: &Req) -> Option<usize> {
        let mut view = req.view();
        t.routes()
            .iter()
            .find(|r| r.matcher.matches(&mut view))
            .map(|r| r.entry)
    }

    #[test]
    fn fifty_values_of_one_header() {
        // Seed 001's shape as issue #3 states it: one path, `X-Match: value-N`, then a catch-all.
        let mut matches: Vec<_> = (1..=50)
            .map(|i| on_root(vec![exact("X-Match", &format!("value-{i}"))]))
            .collect();
        matches.push(on_root(vec![]));
        let t = table(&matches);
        assert_eq!(t.indexed_entries(), 50);
        assert_eq!(indexed(&t, &Req::get(&[("x-match", "value-1")])), Some(0));
        assert_eq!(indexed(&t, &Req::get(&[("X-MATCH", "value-50")])), Some(49));
        assert_eq!(indexed(&t, &Req::get(&[("x-match", "VALUE-50")])), Some(50));
        assert_eq!(indexed(&t, &Req::get(&[])), Some(50));
        let both = [("x-match", "value-50"), ("x-match", "value-7")];
        assert_eq!(indexed(&t, &Req::get(&both)), Some(6));
    }

    #[test]
    fn fifty_header_names() {
        // Seed 001's shape as bench/dataplane runs it: `header-N: header-N-val`.
        let matches: Vec<_> = (1..=50)
            .map(|i| {
                on_root(vec![exact(
                    &format!("header-{i}"),
                    &format!("header-{i}-val"),
                )])
            })
            .collect();
        let t = table(&matches);
        assert_eq!(t.indexed_entries(), 50);
        let last = [("header-50", "header-50-val"), ("user-agent", "x")];
        assert_eq!(indexed(&t, &Req::get(&last)), Some(49));
        let two = [("header-50", "header-50-val"), ("header-3", "header-3-val")];
        assert_eq!(indexed(&t, &Req::get(&two)), Some(2));
        assert_eq!(
            indexed(&t, &Req::get(&[("header-3", "header-4-val")])),
            None
        );
    }

    #[test]
    fn a_common_pair_is_verified_not_trusted() {
        // Every entry shares `x-env: prod`; each is filed under its rarer pair.
        let mut matches: Vec<_> = (0..8)
            .map(|i| {
                on_root(vec![
                    exact("x-env", "prod"),
                    exact("x-user", &i.to_string()),
                ])
            })
            .collect();
        matches.push(on_root(vec![exact("x-env", "prod")]));
        let t = table(&matches);
        let req = Req::get(&[("x-env", "prod"), ("x-user", "5")]);
        assert_eq!(indexed(&t, &req), Some(5));
        assert_eq!(indexed(&t, &Req::get(&[("x-user", "5")])), None);
        assert_eq!(indexed(&t, &Req::get(&[("x-env", "prod")])), Some(8));
    }

    const NAMES: [&str; 4] = ["x-a", "X-B", "x-c", "x-match"];
    const VALUES: [&str; 5] = ["v0", "v1", "v2", "V1", "v 3"];
    const PATHS: [&str; 6] = ["/", "/a", "/a/", "/a/b", "/ab", "/b"];

    fn pick<'a>(rng: &mut fastrand::Rng, from: &[&'a str]) -> &'a str {
        from[rng.usize(..from.len())]
    }

    fn random_header(rng: &mut fastrand::Rng, many_names: bool) -> ir::HeaderMatch {
        let name = if many_names && rng.bool() {
            format!("h{}", rng.usize(..20))
        } else {
            pick(rng, &NAMES).to_owned()
        };
        let value = if rng.u8(..10) == 0 {
            ir::StringMatch::Regex("v[01]".into())
        } else {
            ir::StringMatch::Exact(pick(rng, &VALUES).into())
        };
        ir::HeaderMatch { name, value }
    }

    fn random_path(rng: &mut fastrand::Rng) -> ir::PathMatch {
        match rng.u8(..6) {
            0 => ir::PathMatch::Exact("/a".into()),
            1 => ir::PathMatch::Exact("/a/b".into()),
            2 => ir::PathMatch::Regex("/a.*".into()),
            3 => ir::PathMatch::Prefix("/a".into()),
            _ => ir::PathMatch::Prefix("/".into()),
        }
    }

    /// A route list made of blocks: runs that differ only by one header's value, runs that
    /// differ by header name, and entries with anything (methods, several headers, repeated
    /// names, regexes, query parameters) in between.
    fn random_matches(rng: &mut fastrand::Rng) -> Vec<ir::HttpMatch> {
        let mut out = Vec::new();
        let many_names = rng.bool();
        for _ in 0..rng.usize(1..8) {
            let path = random_path(rng);
            let method = (rng.u8(..4) == 0).then(|| pick(rng, &["GET", "POST"]).to_owned());
            let len = rng.usize(1..14);
            match rng.u8(..3) {
                0 => {
                    let name = pick(rng, &NAMES);
                    for _ in 0..len {
                        let mut m = ir::HttpMatch {
                            path: path.clone(),
                            method: method.clone(),
                            headers: vec![exact(name, pick(rng, &VALUES))],
                            query_params: vec![],
                        };
                        if rng.u8(..5) == 0 {
                            m.headers.push(random_header(rng, many_names));
                        }
                        out.push(m);
                    }
                }
                1 => {
                    for _ in 0..len {
                        let name = format!("h{}", rng.usize(..20));
                        out.push(ir::HttpMatch {
                            path: path.clone(),
                            method: method.clone(),
                            headers: vec![exact(&name, pick(rng, &VALUES))],
                            query_params: vec![],
                        });
                    }
                }
                _ => {
                    for _ in 0..len {
                        let headers = (0..rng.usize(..4))
                            .map(|_| random_header(rng, many_names))
                            .collect();
                        let query_params = (0..rng.usize(..2))
                            .map(|_| ir::QueryParamMatch {
                                name: "q".into(),
                                value: if rng.bool() {
                                    ir::StringMatch::Exact(pick(rng, &["1", "2"]).into())
                                } else {
                                    ir::StringMatch::Regex("[0-9]".into())
                                },
                            })
                            .collect();
                        out.push(ir::HttpMatch {
                            path: random_path(rng),
                            method: (rng.u8(..3) == 0)
                                .then(|| pick(rng, &["GET", "POST"]).to_owned()),
                            headers,
                            query_params,
                        });
                    }
                }
            }
        }
        if rng.bool() {
            // Translate's precedence (path kind and length, method, header and query counts);
            // the stable sort keeps generation order as the creation-order tie-break.
            out.sort_by_key(|m| {
                let (rank, len) = match &m.path {
                    ir::PathMatch::Exact(p) => (0, p.len()),
                    ir::PathMatch::Regex(p) => (1, p.len()),
                    ir::PathMatch::Prefix(p) => (2, p.len()),
                };
                (
                    rank,
                    std::cmp::Reverse(len),
                    m.method.is_none(),
                    std::cmp::Reverse(m.headers.len()),
                    std::cmp::Reverse(m.query_params.len()),
                )
            });
        }
        out
    }

    fn random_request(rng: &mut fastrand::Rng) -> Req {
        let mut headers = HeaderMap::new();
        for _ in 0..rng.usize(..7) {
            let name = if rng.u8(..3) == 0 {
                format!("H{}", rng.usize(..20))
            } else {
                pick(rng, &["x-a", "X-A", "x-b", "x-c", "X-Match", "user-agent"]).to_owned()
            };
            // `append`: a name drawn twice carries two values.
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(pick(rng, &VALUES)).unwrap(),
            );
        }
        Req {
            method: [Method::GET, Method::POST, Method::PUT][rng.usize(..3)].clone(),
            path: pick(rng, &PATHS),
            headers,
            query: [None, Some("q=1"), Some("q=2&q=1"), Some("x=1")][rng.usize(..4)],
        }
    }

    #[test]
    fn indexed_router_agrees_with_a_linear_scan() {
        let mut rng = fastrand::Rng::with_seed(0x6a7e_4045e);
        let (mut indexed_entries, mut found, mut found_by_header) = (0, 0, 0);
        for _ in 0..400 {
            let matches = random_matches(&mut rng);
            let t = table(&matches);
            indexed_entries += t.indexed_entries();
            for _ in 0..200 {
                let req = random_request(&mut rng);
                let want = linear(&t, &req);
                assert_eq!(
                    indexed(&t, &req),
                    want,
                    "routes {matches:#?}\nrequest {} {} {:?} {:?}",
                    req.method,
                    req.path,
                    req.query,
                    req.headers
                );
                if let Some(i) = want {
                    found += 1;
                    found_by_header += usize::from(indexable(&t.routes()[i]));
                }
            }
        }
        // The generator must actually exercise the indexes.
        assert!(indexed_entries > 5_000, "{indexed_entries} indexed entries");
        assert!(found_by_header > 10_000, "{found_by_header} of {found}");
    }
}
