//! Header access shared by the two request paths: `http::HeaderMap` (HTTP/2 and the hyper
//! fallback) and [`HeaderList`], the HTTP/1 path's flat list of fields over one byte buffer.
//!
//! The router reads headers through [`RequestHeaders`] and the header filters write through
//! [`HeaderEdit`], so both paths route and filter with the same code.

use http::{HeaderMap, HeaderName, HeaderValue};

/// What the router reads. Names are lower case on both paths (HTTP/2 requires it; the HTTP/1
/// parser lowercases them in place).
pub(crate) trait RequestHeaders {
    /// The values of every field called `name`, in order.
    fn values_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a;
    /// Every field, in order.
    fn fields(&self) -> impl Iterator<Item = (&str, &[u8])>;
    /// How many distinct names there are, or an upper bound (fields with repeated names may be
    /// counted more than once): the router picks the cheaper side of an index walk with it.
    fn names_hint(&self) -> usize;
}

impl RequestHeaders for HeaderMap {
    fn values_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.get_all(name).iter().map(HeaderValue::as_bytes)
    }

    fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.iter().map(|(n, v)| (n.as_str(), v.as_bytes()))
    }

    fn names_hint(&self) -> usize {
        self.keys_len()
    }
}

/// What header filters do: `RequestHeaderModifier` and `ResponseHeaderModifier`.
pub(crate) trait HeaderEdit {
    /// Replaces every field called `name` with one field.
    fn set(&mut self, name: &HeaderName, value: &HeaderValue);
    /// Adds a field, keeping the existing ones.
    fn add(&mut self, name: &HeaderName, value: &HeaderValue);
    fn remove(&mut self, name: &HeaderName);
}

impl HeaderEdit for HeaderMap {
    fn set(&mut self, name: &HeaderName, value: &HeaderValue) {
        self.insert(name.clone(), value.clone());
    }

    fn add(&mut self, name: &HeaderName, value: &HeaderValue) {
        self.append(name.clone(), value.clone());
    }

    fn remove(&mut self, name: &HeaderName) {
        HeaderMap::remove(self, name);
    }
}

/// Byte range in [`HeaderList`]'s buffer. `u32`: heads are bounded far below 4 GiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Span {
    start: u32,
    end: u32,
}

impl Span {
    pub(crate) fn new(start: usize, end: usize) -> Span {
        debug_assert!(start <= end && end <= u32::MAX as usize);
        Span {
            start: start as u32,
            end: end as u32,
        }
    }

    pub(crate) fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }
}

#[derive(Clone, Copy, Debug)]
struct Field {
    name: Span,
    value: Span,
}

/// The fields of one HTTP/1 message head, as spans over one buffer that holds the head's bytes
/// (copied once from the read buffer) and the bytes of fields added later. Cleared and reused
/// for every message of a connection, so a request allocates nothing once warm.
#[derive(Debug, Default)]
pub(crate) struct HeaderList {
    buf: Vec<u8>,
    fields: Vec<Field>,
}

impl HeaderList {
    pub(crate) fn clear(&mut self) {
        self.buf.clear();
        self.fields.clear();
    }

    /// The buffer the spans point into; the caller copies the raw head here first.
    pub(crate) fn buf_mut(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    pub(crate) fn bytes(&self, span: Span) -> &[u8] {
        &self.buf[span.range()]
    }

    /// Records a field whose name and value already sit in the buffer, lowercasing the name
    /// in place.
    pub(crate) fn push_spans(&mut self, name: Span, value: Span) {
        self.buf[name.range()].make_ascii_lowercase();
        self.fields.push(Field { name, value });
    }

    /// Records a field whose name and value already sit in the buffer, as they are.
    pub(crate) fn push_spans_as_is(&mut self, name: Span, value: Span) {
        self.fields.push(Field { name, value });
    }

    /// Lowercases every name (for edits, which compare lowercase names).
    pub(crate) fn lowercase_names(&mut self) {
        for f in &self.fields {
            self.buf[f.name.range()].make_ascii_lowercase();
        }
    }

    /// Appends a field, copying its bytes into the buffer. `name` must be lower case.
    pub(crate) fn push(&mut self, name: &[u8], value: &[u8]) {
        let n0 = self.buf.len();
        self.buf.extend_from_slice(name);
        let v0 = self.buf.len();
        self.buf.extend_from_slice(value);
        self.fields.push(Field {
            name: Span::new(n0, v0),
            value: Span::new(v0, self.buf.len()),
        });
    }

    pub(crate) fn remove_all(&mut self, name: &[u8]) {
        let buf = &self.buf;
        self.fields.retain(|f| &buf[f.name.range()] != name);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.fields.len()
    }

    /// The buffer the spans point into.
    pub(crate) fn buf(&self) -> &[u8] {
        &self.buf
    }

    /// Every field as (name, value) spans, in order.
    pub(crate) fn spans(&self) -> impl Iterator<Item = (Span, Span)> + '_ {
        self.fields.iter().map(|f| (f.name, f.value))
    }

    /// Every field as (name, value) bytes, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.fields
            .iter()
            .map(|f| (&self.buf[f.name.range()], &self.buf[f.value.range()]))
    }

    /// The first value of `name`.
    #[cfg(test)]
    pub(crate) fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

impl RequestHeaders for HeaderList {
    fn values_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        let name = name.as_bytes();
        self.iter().filter(move |(n, _)| *n == name).map(|(_, v)| v)
    }

    fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> {
        // Names are token bytes (ASCII), checked by the parser.
        self.iter()
            .map(|(n, v)| (std::str::from_utf8(n).unwrap_or(""), v))
    }

    fn names_hint(&self) -> usize {
        self.fields.len()
    }
}

impl HeaderEdit for HeaderList {
    fn set(&mut self, name: &HeaderName, value: &HeaderValue) {
        self.remove_all(name.as_str().as_bytes());
        self.push(name.as_str().as_bytes(), value.as_bytes());
    }

    fn add(&mut self, name: &HeaderName, value: &HeaderValue) {
        self.push(name.as_str().as_bytes(), value.as_bytes());
    }

    fn remove(&mut self, name: &HeaderName) {
        self.remove_all(name.as_str().as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(fields: &[(&str, &str)]) -> HeaderList {
        let mut l = HeaderList::default();
        for (n, v) in fields {
            l.push(n.as_bytes(), v.as_bytes());
        }
        l
    }

    #[test]
    fn spans_over_copied_head_lowercase_names() {
        let mut l = HeaderList::default();
        l.buf_mut().extend_from_slice(b"X-Version: v2");
        l.push_spans(Span::new(0, 9), Span::new(11, 13));
        assert_eq!(l.get(b"x-version"), Some(&b"v2"[..]));
        assert_eq!(l.values_of("x-version").collect::<Vec<_>>(), [b"v2"]);
        assert_eq!(l.fields().next(), Some(("x-version", &b"v2"[..])));
    }

    #[test]
    fn edits_match_header_map_semantics() {
        let name = HeaderName::from_static("x-a");
        let mut l = list(&[("x-a", "1"), ("x-b", "2"), ("x-a", "3")]);
        let mut m = HeaderMap::new();
        for (n, v) in l.iter() {
            m.append(
                HeaderName::from_bytes(n).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        let v = HeaderValue::from_static("9");
        HeaderEdit::set(&mut l, &name, &v);
        HeaderEdit::set(&mut m, &name, &v);
        assert_eq!(l.values_of("x-a").collect::<Vec<_>>(), [b"9"]);
        assert_eq!(m.values_of("x-a").collect::<Vec<_>>(), [b"9"]);
        HeaderEdit::add(&mut l, &name, &v);
        HeaderEdit::add(&mut m, &name, &v);
        assert_eq!(l.values_of("x-a").count(), 2);
        assert_eq!(m.values_of("x-a").count(), 2);
        HeaderEdit::remove(&mut l, &name);
        HeaderEdit::remove(&mut m, &name);
        assert_eq!(l.values_of("x-a").count(), 0);
        assert_eq!(l.len(), 1);
        assert!(!m.contains_key("x-a"));
    }
}
