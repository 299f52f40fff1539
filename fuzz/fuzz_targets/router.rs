//! The router's match path: the exact-header indexes of a virtual host must pick what a
//! linear scan in precedence order picks, for arbitrary entries and requests. Names and
//! values come from small alphabets so that entries and requests collide often.
#![no_main]
use arbitrary::Arbitrary;
use gatehouse_ir as ir;

#[derive(Arbitrary, Debug)]
struct Input {
    entries: Vec<Entry>,
    method: u8,
    path: u8,
    query: Vec<(u8, u8)>,
    headers: Vec<(u8, u8)>,
}

#[derive(Arbitrary, Debug)]
struct Entry {
    path: (u8, u8),
    method: Option<u8>,
    headers: Vec<(u8, u8, bool)>,
    query: Vec<(u8, u8, bool)>,
}

const NAMES: [&str; 4] = ["x-a", "x-b", "x-version", "user"];
const VALUES: [&str; 5] = ["1", "2", "v2", "admin", ""];
const PATHS: [&str; 6] = ["/", "/a", "/a/b", "/b", "/a/", "/c/d"];
const METHODS: [&str; 3] = ["GET", "POST", "PUT"];
const REGEXES: [&str; 3] = ["[0-9]+", "v.*", "adm.n"];

fn pick<'a>(list: &[&'a str], i: u8) -> &'a str {
    list[usize::from(i) % list.len()]
}

fn value(i: u8, regex: bool) -> ir::StringMatch {
    if regex {
        ir::StringMatch::Regex(pick(&REGEXES, i).into())
    } else {
        ir::StringMatch::Exact(pick(&VALUES, i).into())
    }
}

libfuzzer_sys::fuzz_target!(|input: Input| {
    let matches: Vec<ir::HttpMatch> = input
        .entries
        .iter()
        .take(64)
        .map(|e| ir::HttpMatch {
            path: match e.path.0 % 3 {
                0 => ir::PathMatch::Exact(pick(&PATHS, e.path.1).into()),
                1 => ir::PathMatch::Prefix(pick(&PATHS, e.path.1).into()),
                _ => ir::PathMatch::Regex("/[a-c].*".into()),
            },
            method: e.method.map(|m| pick(&METHODS, m).into()),
            headers: e
                .headers
                .iter()
                .take(4)
                .map(|&(n, v, re)| ir::HeaderMatch {
                    name: pick(&NAMES, n).into(),
                    value: value(v, re),
                })
                .collect(),
            query_params: e
                .query
                .iter()
                .take(2)
                .map(|&(n, v, re)| ir::QueryParamMatch {
                    name: pick(&NAMES, n).into(),
                    value: value(v, re),
                })
                .collect(),
        })
        .collect();
    let query: Vec<String> = input
        .query
        .iter()
        .map(|&(n, v)| format!("{}={}", pick(&NAMES, n), pick(&VALUES, v)))
        .collect();
    let query = query.join("&");
    let request = gatehouse_dataplane::fuzzing::Request {
        method: pick(&METHODS, input.method),
        path: pick(&PATHS, input.path),
        query: (!query.is_empty()).then_some(query.as_str()),
        headers: input
            .headers
            .iter()
            .take(8)
            .map(|&(n, v)| (pick(&NAMES, n), pick(&VALUES, v)))
            .collect(),
    };
    gatehouse_dataplane::fuzzing::router(&matches, &request);
});
