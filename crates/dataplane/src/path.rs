//! Request paths normalised once, before anything matches on them, and forwarded as matched.
//!
//! A route for PathPrefix `/public` must not take `/public/../admin`: a backend that
//! normalises would serve `/admin` through it. So every request path is brought to one form
//! first (RFC 3986 §6.2.2, with the choices below), routing and filters see that form, and the
//! backend receives it. What cannot be normalised safely is refused with 400.
//!
//! - Percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded (`%7E` → `~`,
//!   `%2e` → `.`); other escapes stay encoded, with upper-case hex digits (`%c3` → `%C3`).
//! - An encoded `/` or `\` (`%2F`, `%5C`) is refused: decoding it would change which segments
//!   the path has, keeping it lets a backend that decodes it see segments the route did not.
//!   A raw `\` is refused too (some servers read it as `/`), as is a malformed escape.
//! - Dot segments are removed (`/a/./b` → `/a/b`, `/a/b/../c` → `/a/c`); one that would
//!   climb above the root is refused.
//! - Repeated slashes are merged (`/a//b` → `/a/b`), as nginx does by default: otherwise
//!   `//admin` slips past a route for `/admin` to a backend that merges them.
//!
//! The query is not touched. Written by hand: no crate normalises with these choices, and the
//! function is small, allocation-free for paths that are already normal (the common case is
//! one scan of the bytes), and fuzzed (`fuzz/fuzz_targets/path.rs`).

use std::fmt;

/// Why a path is refused (400).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathError {
    /// Not an origin-form path (does not start with `/`).
    NotAbsolute,
    /// `%` not followed by two hex digits.
    BadEscape,
    /// `%2F` or `%5C`.
    EncodedSlash,
    /// A raw `\`.
    Backslash,
    /// `..` above the root.
    AboveRoot,
}

impl PathError {
    pub fn reason(self) -> &'static str {
        match self {
            PathError::NotAbsolute => "the path does not start with /",
            PathError::BadEscape => "malformed percent-encoding in the path",
            PathError::EncodedSlash => "encoded / or \\ in the path",
            PathError::Backslash => "\\ in the path",
            PathError::AboveRoot => "the path climbs above the root with ..",
        }
    }
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

/// Whether `path` may need rewriting: it has an escape, a backslash, two slashes in a row,
/// or a segment starting with a dot. Paths without any of these are already normal.
fn needs_work(path: &[u8]) -> bool {
    let mut prev = 0u8;
    for &b in path {
        match b {
            b'%' | b'\\' => return true,
            b'/' if prev == b'/' => return true,
            b'.' if prev == b'/' => return true,
            _ => {}
        }
        prev = b;
    }
    false
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Normalises `path` (the path part of a request target, without the query). `Ok(None)`: it
/// is already normal. `Ok(Some(normal))`: the normal form.
pub fn normalize(path: &str) -> Result<Option<String>, PathError> {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    if !needs_work(bytes) {
        return Ok(None);
    }
    // Decode unreserved escapes and check the others, segment by segment, then resolve the
    // segments. Segments are kept as byte ranges of `decoded`.
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'%' => {
                let (Some(h), Some(l)) = (
                    bytes.get(i + 1).copied().and_then(hex),
                    bytes.get(i + 2).copied().and_then(hex),
                ) else {
                    return Err(PathError::BadEscape);
                };
                let c = h * 16 + l;
                if c == b'/' || c == b'\\' {
                    return Err(PathError::EncodedSlash);
                }
                if unreserved(c) {
                    decoded.push(c);
                } else {
                    decoded.push(b'%');
                    decoded.push(bytes[i + 1].to_ascii_uppercase());
                    decoded.push(bytes[i + 2].to_ascii_uppercase());
                }
                i += 3;
            }
            b'\\' => return Err(PathError::Backslash),
            _ => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    // Segments of the decoded path (it starts with '/', so the first split is empty).
    let ends_with_slash = decoded.last() == Some(&b'/');
    let mut segments: Vec<&[u8]> = Vec::new();
    let mut trailing_dir = ends_with_slash;
    let parts: Vec<&[u8]> = decoded.split(|&b| b == b'/').skip(1).collect();
    for (n, &segment) in parts.iter().enumerate() {
        let last = n + 1 == parts.len();
        match segment {
            b"" => {}
            b"." => trailing_dir |= last,
            b".." => {
                if segments.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
                trailing_dir |= last;
            }
            s => {
                segments.push(s);
                if last {
                    trailing_dir = ends_with_slash;
                }
            }
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        // Decoding only produced ASCII and kept every other byte as it was: still UTF-8.
        out.push_str(std::str::from_utf8(s).map_err(|_| PathError::BadEscape)?);
    }
    if out.is_empty() || trailing_dir {
        out.push('/');
    }
    Ok(if out == path { None } else { Some(out) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(p: &str) -> Result<String, PathError> {
        normalize(p).map(|n| n.unwrap_or_else(|| p.to_string()))
    }

    #[test]
    fn normal_paths_are_left_alone() {
        for p in [
            "/",
            "/coffee",
            "/a/b/c",
            "/a/b/",
            "/v1.2/x",
            "/.well-known/x",
            "/a.b",
        ] {
            if p.contains("/.") {
                assert_eq!(norm(p).unwrap(), p);
            } else {
                assert_eq!(normalize(p), Ok(None), "{p}");
            }
        }
    }

    #[test]
    fn the_review_findings_do_not_escape_their_prefix() {
        assert_eq!(norm("/public/../admin"), Ok("/admin".into()));
        assert_eq!(norm("/public/%2e%2e/admin"), Ok("/admin".into()));
        assert_eq!(norm("/public/%2E%2E/admin"), Ok("/admin".into()));
        assert_eq!(norm("/public/..%2fadmin"), Err(PathError::EncodedSlash));
        assert_eq!(norm("/public/..%2Fadmin"), Err(PathError::EncodedSlash));
        assert_eq!(norm("/public/..%5cadmin"), Err(PathError::EncodedSlash));
        assert_eq!(norm("/public/..\\admin"), Err(PathError::Backslash));
        assert_eq!(norm("//admin"), Ok("/admin".into()));
        assert_eq!(norm("/public/.%2e/admin"), Ok("/admin".into()));
    }

    #[test]
    fn dot_segments_and_slashes() {
        let cases = [
            ("/a/./b", "/a/b"),
            ("/a/b/../c", "/a/c"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/a/..", "/"),
            ("/.", "/"),
            ("/a//b///c", "/a/b/c"),
            ("/a//", "/a/"),
            ("///", "/"),
            ("/a/b/../../c/", "/c/"),
            ("/..a/b", "/..a/b"),
            ("/a/.b", "/a/.b"),
            ("/a/...", "/a/..."),
        ];
        for (input, want) in cases {
            assert_eq!(norm(input), Ok(want.into()), "{input}");
        }
        assert_eq!(norm("/.."), Err(PathError::AboveRoot));
        assert_eq!(norm("/a/../.."), Err(PathError::AboveRoot));
        assert_eq!(norm("a/b"), Err(PathError::NotAbsolute));
        assert_eq!(norm(""), Err(PathError::NotAbsolute));
    }

    #[test]
    fn escapes() {
        assert_eq!(norm("/%7Euser"), Ok("/~user".into()));
        assert_eq!(norm("/caf%c3%a9"), Ok("/caf%C3%A9".into()));
        assert_eq!(norm("/a%20b"), Ok("/a%20b".into()));
        assert_eq!(norm("/%41%42"), Ok("/AB".into()));
        assert_eq!(norm("/100%"), Err(PathError::BadEscape));
        assert_eq!(norm("/%zz"), Err(PathError::BadEscape));
        assert_eq!(norm("/%2"), Err(PathError::BadEscape));
        // Already normal escapes need no new string.
        assert_eq!(normalize("/a%20b"), Ok(None));
    }

    #[test]
    fn normalising_twice_changes_nothing() {
        for p in [
            "/a/./b//c/../d",
            "/%7e/%2e/x",
            "/a/b/..",
            "/caf%c3%a9/",
            "/x/%2e%2e",
        ] {
            let once = norm(p).unwrap();
            assert_eq!(normalize(&once), Ok(None), "{p} -> {once}");
        }
    }
}
