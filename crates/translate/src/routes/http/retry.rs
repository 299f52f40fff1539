//! An HTTPRoute rule's `retry`, checked and turned into [`ir::Retry`].
//!
//! The CRD already bounds codes (400–599) and attempts (≥ 0); the checks are repeated here
//! because a manifest read from a file, or an object stored under an older CRD, was never
//! validated by the API server. A value out of range makes the rule invalid with a message
//! naming it, like any other bad rule field.

use gatehouse_ir as ir;

/// The most retries one request may make. Far beyond any useful setting (each retry waits at
/// least the backoff), but it keeps a typo such as `attempts: 1000000` from turning one client
/// request into an unbounded number of backend requests.
pub const MAX_ATTEMPTS: i64 = 1000;

/// `retry` as the rule spells it, whatever type the generated API struct gives it.
pub struct RawRetry<'a> {
    pub codes: &'a [i64],
    /// `None`: the API's default, one retry.
    pub attempts: Option<i64>,
    pub backoff: Option<&'a str>,
}

/// The rule's retry policy; `Ok(None)` when it allows no retry (`attempts: 0`).
pub fn policy(raw: &RawRetry<'_>) -> Result<Option<ir::Retry>, String> {
    let attempts = raw.attempts.unwrap_or(1);
    if !(0..=MAX_ATTEMPTS).contains(&attempts) {
        return Err(format!(
            "retry attempts {attempts} is out of range (0 to {MAX_ATTEMPTS})"
        ));
    }
    let mut codes = Vec::with_capacity(raw.codes.len());
    for &code in raw.codes {
        match u16::try_from(code) {
            Ok(c @ 400..=599) => codes.push(c),
            _ => {
                return Err(format!(
                    "retry code {code} is not an HTTP status from 400 to 599"
                ));
            }
        }
    }
    codes.sort_unstable();
    codes.dedup();
    let backoff_ms = match raw.backoff {
        None => None,
        Some(text) => {
            let d: gateway_api::Duration = text
                .parse()
                .map_err(|e| format!("invalid retry backoff {text:?}: {e}"))?;
            Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        }
    };
    // Checked after the other fields, so that a rule with `attempts: 0` and a bad code is
    // still reported.
    if attempts == 0 {
        return Ok(None);
    }
    Ok(Some(ir::Retry {
        codes,
        attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
        backoff_ms,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(
        codes: &'static [i64],
        attempts: Option<i64>,
        backoff: Option<&'static str>,
    ) -> RawRetry<'static> {
        RawRetry {
            codes,
            attempts,
            backoff,
        }
    }

    #[test]
    fn valid_policies() {
        let cases: &[(RawRetry<'static>, Option<ir::Retry>)] = &[
            // The API's default: one retry, connection failures only.
            (
                raw(&[], None, None),
                Some(ir::Retry {
                    codes: vec![],
                    attempts: 1,
                    backoff_ms: None,
                }),
            ),
            (
                raw(&[503, 500, 503], Some(3), Some("100ms")),
                Some(ir::Retry {
                    codes: vec![500, 503],
                    attempts: 3,
                    backoff_ms: Some(100),
                }),
            ),
            (
                raw(&[429], Some(MAX_ATTEMPTS), Some("1m")),
                Some(ir::Retry {
                    codes: vec![429],
                    attempts: 1000,
                    backoff_ms: Some(60_000),
                }),
            ),
            (raw(&[500], Some(0), None), None),
        ];
        for (input, want) in cases {
            assert_eq!(policy(input).as_ref(), Ok(want), "{:?}", input.codes);
        }
    }

    #[test]
    fn invalid_values_are_named() {
        let cases: &[(RawRetry<'static>, &str)] = &[
            (
                raw(&[], Some(-1), None),
                "retry attempts -1 is out of range",
            ),
            (
                raw(&[], Some(1001), None),
                "retry attempts 1001 is out of range",
            ),
            (
                raw(&[200], None, None),
                "retry code 200 is not an HTTP status",
            ),
            (raw(&[600], None, None), "retry code 600"),
            (
                raw(&[500], Some(0), Some("soon")),
                "invalid retry backoff \"soon\"",
            ),
            (
                raw(&[], Some(2), Some("1d")),
                "invalid retry backoff \"1d\"",
            ),
        ];
        for (input, want) in cases {
            let err = policy(input).unwrap_err();
            assert!(err.starts_with(want), "{err:?} should start with {want:?}");
        }
    }
}
