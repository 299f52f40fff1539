//! Line numbers in YAML text: splitting a file into documents, and finding the line of a
//! key path (`spec.rules[0].matches[1].path.value`) with a small block-style heuristic.
//!
//! serde_yaml reports locations for syntax and type errors, but nothing for things found
//! after deserialization (an unknown field, a bad regular expression, a duplicate name).
//! For those, this module walks the text: good enough for block-style YAML as people write
//! it; when it cannot find a key it answers with the deepest ancestor it found.

/// One YAML document of a file: a slice of the file text and the file line it starts on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Document<'a> {
    pub text: &'a str,
    /// 1-based line of the file on which `text` starts.
    pub first_line: usize,
}

impl Document<'_> {
    /// Converts a 1-based line of the document to a 1-based line of the file.
    pub fn file_line(&self, doc_line: usize) -> usize {
        self.first_line + doc_line.max(1) - 1
    }

    /// True if the document holds nothing but blank lines, comments, markers and directives.
    pub fn is_blank(&self) -> bool {
        self.text.lines().all(|l| !is_content(l))
    }

    /// 1-based document line of the first line with content (the start of the object).
    pub fn first_content_line(&self) -> usize {
        self.text.lines().position(is_content).map_or(1, |i| i + 1)
    }
}

/// A line that carries YAML content (not blank, not a comment, not a bare marker).
fn is_content(line: &str) -> bool {
    let t = line.trim();
    if t.is_empty() || t.starts_with('#') || t.starts_with('%') || t == "..." {
        return false;
    }
    if is_document_marker(line) {
        // `--- # comment` is no content; `--- !tag` or `--- {a: 1}` is.
        let rest = line[3..].trim();
        return !(rest.is_empty() || rest.starts_with('#'));
    }
    true
}

/// `---` at column 0, alone or followed by whitespace.
fn is_document_marker(line: &str) -> bool {
    let line = line.trim_end_matches(['\n', '\r']);
    line.starts_with("---") && matches!(line.as_bytes().get(3), None | Some(b' ' | b'\t'))
}

/// Splits a multi-document YAML file on its `---` lines. Each document keeps its own
/// marker line (serde_yaml accepts a document that starts with `---`), so document line 1
/// is the marker line and offsets stay exact. Blank documents are kept; callers skip them.
pub(crate) fn split_documents(content: &str) -> Vec<Document<'_>> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut start_line = 1;
    let mut offset = 0;
    for (i, line) in content.split_inclusive('\n').enumerate() {
        if is_document_marker(line) && offset > start {
            docs.push(Document {
                text: &content[start..offset],
                first_line: start_line,
            });
            start = offset;
            start_line = i + 1;
        }
        offset += line.len();
    }
    docs.push(Document {
        text: &content[start..],
        first_line: start_line,
    });
    docs
}

/// One step of a path into a YAML object (the registry's field path segment).
pub(crate) use gatehouse_translate::kinds::PathSegment as Seg;
pub(crate) use gatehouse_translate::kinds::display_path;

pub(crate) fn key(k: &str) -> Seg {
    Seg::Key(k.to_owned())
}

/// Converts a serde_ignored path to segments (dropping `Option`/newtype wrappers).
pub(crate) fn segments(path: &serde_ignored::Path<'_>) -> Vec<Seg> {
    fn walk(path: &serde_ignored::Path<'_>, out: &mut Vec<Seg>) {
        use serde_ignored::Path;
        match path {
            Path::Root => {}
            Path::Seq { parent, index } => {
                walk(parent, out);
                out.push(Seg::Index(*index));
            }
            Path::Map { parent, key } => {
                walk(parent, out);
                out.push(Seg::Key(key.clone()));
            }
            Path::Some { parent }
            | Path::NewtypeStruct { parent }
            | Path::NewtypeVariant { parent } => walk(parent, out),
        }
    }
    let mut out = Vec::new();
    walk(path, &mut out);
    out
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn is_dash_item(line: &str) -> bool {
    let t = line.trim_start_matches(' ').trim_end_matches(['\n', '\r']);
    t == "-" || t.starts_with("- ")
}

/// The mapping key a block-style line starts with (after any `- ` sequence indicators).
fn line_key(line: &str) -> Option<&str> {
    let mut rest = line.trim_end_matches(['\n', '\r']).trim_start_matches(' ');
    while let Some(r) = rest.strip_prefix('-') {
        if r.is_empty() || r.starts_with(' ') {
            rest = r.trim_start_matches(' ');
        } else {
            break;
        }
    }
    let first = rest.chars().next()?;
    if matches!(first, '#' | '{' | '[') {
        return None;
    }
    if first == '"' || first == '\'' {
        let end = rest[1..].find(first)? + 1;
        let after = rest[end + 1..].trim_start_matches(' ');
        return after.starts_with(':').then(|| &rest[1..end]);
    }
    let colon = rest
        .match_indices(':')
        .find(|(i, _)| matches!(rest.as_bytes().get(i + 1), None | Some(b' ' | b'\t')))?
        .0;
    Some(rest[..colon].trim_end())
}

/// 1-based line (in `text`) of the value at `path`, or of its deepest ancestor found;
/// `None` if not even the first key is found.
pub(crate) fn find_path_line(text: &str, path: &[Seg]) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let mut lo = 0;
    let mut found: Option<usize> = None;
    for seg in path {
        match seg {
            Seg::Key(k) => {
                let Some(i) = (lo..lines.len()).find(|&i| line_key(lines[i]) == Some(k)) else {
                    break;
                };
                found = Some(i);
                lo = i + 1;
            }
            Seg::Index(n) => {
                let Some(first) = (lo..lines.len()).find(|&i| is_content(lines[i])) else {
                    break;
                };
                if !is_dash_item(lines[first]) {
                    break;
                }
                let d = indent(lines[first]);
                let mut count = 0;
                let mut hit = None;
                for (j, line) in lines.iter().enumerate().skip(first) {
                    if !is_content(line) {
                        continue;
                    }
                    let ind = indent(line);
                    if ind < d || (ind == d && !is_dash_item(line)) {
                        break;
                    }
                    if ind == d {
                        if count == *n {
                            hit = Some(j);
                            break;
                        }
                        count += 1;
                    }
                }
                let Some(j) = hit else { break };
                found = Some(j);
                // The item's first key may sit on the dash line itself.
                lo = j;
            }
        }
    }
    found.map(|i| i + 1)
}

/// 1-based line (in `text`) of the first line containing `value`, as written plain or
/// inside a double-quoted YAML string (backslashes doubled).
pub(crate) fn find_value_line(text: &str, value: &str) -> Option<usize> {
    if value.is_empty() {
        return None;
    }
    let escaped = value.replace('\\', "\\\\");
    text.lines()
        .position(|l| l.contains(value) || l.contains(&escaped))
        .map(|i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_documents_and_keeps_offsets() {
        let text = "# leading comment\n---\na: 1\n--- # two\nb: 2\n---\n";
        let docs = split_documents(text);
        assert_eq!(docs.len(), 4);
        assert_eq!(docs[0].first_line, 1);
        assert!(docs[0].is_blank());
        assert_eq!(docs[1].first_line, 2);
        assert_eq!(docs[1].text, "---\na: 1\n");
        assert_eq!(docs[1].first_content_line(), 2);
        assert_eq!(docs[2].first_line, 4);
        assert_eq!(docs[3].first_line, 6);
        assert!(docs[3].is_blank());
        // A trailing marker starts an empty document that is blank.
        let docs = split_documents("a: 1\n---\n");
        assert_eq!(docs.len(), 2);
        assert!(docs[1].is_blank());
        // `----` and `---x` are not markers.
        assert_eq!(split_documents("a: |\n  ----\n  ---x\n").len(), 1);
    }

    #[test]
    fn finds_key_paths() {
        let text = "\
apiVersion: v1
kind: X
metadata:
  name: a
spec:
  rules:
  - matches:
    - path:
        value: /one
    - path:
        value: /two
  - matches:
      - headers:
          - name: h
            value: v
";
        let p = |s: &[Seg]| find_path_line(text, s);
        assert_eq!(p(&[key("metadata"), key("name")]), Some(4));
        assert_eq!(p(&[key("kind")]), Some(2));
        let rule = |r, m| {
            vec![
                key("spec"),
                key("rules"),
                Seg::Index(r),
                key("matches"),
                Seg::Index(m),
            ]
        };
        let mut two = rule(0, 1);
        two.extend([key("path"), key("value")]);
        assert_eq!(p(&two), Some(11));
        let mut h = rule(1, 0);
        h.extend([key("headers"), Seg::Index(0), key("value")]);
        assert_eq!(p(&h), Some(15));
        // Missing leaf: the deepest ancestor.
        let mut missing = rule(0, 0);
        missing.push(key("nothere"));
        assert_eq!(p(&missing), Some(8));
        assert_eq!(p(&[key("nothere")]), None);
    }

    #[test]
    fn line_keys() {
        assert_eq!(line_key("  - name: x"), Some("name"));
        assert_eq!(line_key("\"quoted key\": 1"), Some("quoted key"));
        assert_eq!(line_key("url: http://x"), Some("url"));
        assert_eq!(line_key("- just a scalar"), None);
        assert_eq!(line_key("# c: 1"), None);
    }
}
