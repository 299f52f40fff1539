//! The `Date` field for responses that lack one (RFC 9110 §6.6.1), formatted once per second
//! per thread.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

struct Cached {
    second: u64,
    value: [u8; 29],
}

thread_local! {
    static CACHE: RefCell<Cached> = const { RefCell::new(Cached { second: u64::MAX, value: [0; 29] }) };
}

/// Appends `date: <IMF-fixdate>\r\n`.
pub(crate) fn append_date_field(out: &mut Vec<u8>) {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.second != second {
            let text = httpdate::fmt_http_date(now);
            if text.len() == 29 {
                c.value.copy_from_slice(text.as_bytes());
                c.second = second;
            }
        }
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(&c.value);
        out.extend_from_slice(b"\r\n");
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn imf_fixdate() {
        let mut out = Vec::new();
        super::append_date_field(&mut out);
        let text = String::from_utf8(out).unwrap();
        let value = text
            .strip_prefix("date: ")
            .unwrap()
            .strip_suffix("\r\n")
            .unwrap();
        assert!(httpdate::parse_http_date(value).is_ok(), "{value}");
        assert!(value.ends_with(" GMT"));
    }
}
