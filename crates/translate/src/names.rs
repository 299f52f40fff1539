//! Kubernetes' syntax for label and annotation keys and label values, checked by hand: objects
//! that reach translate from files never met the API server's validation, and a provisioned
//! object with a bad key would be refused by it only later, far from the Gateway that asked.

/// Longest prefix of a qualified name (a DNS subdomain).
const MAX_PREFIX: usize = 253;
/// Longest name part of a qualified name, and longest label value.
const MAX_NAME: usize = 63;

/// A label or annotation key: an optional DNS-subdomain prefix and `/`, then a name of up to 63
/// characters (alphanumerics, `-`, `_`, `.`; alphanumeric at both ends). `Err` says why not.
pub fn qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err("the prefix before '/' is empty".to_string());
        }
        if prefix.len() > MAX_PREFIX {
            return Err(format!(
                "the prefix is {} characters long; at most {MAX_PREFIX} are allowed",
                prefix.len()
            ));
        }
        if let Err(why) = dns_subdomain(prefix) {
            return Err(format!(
                "the prefix {prefix:?} is not a DNS subdomain: {why}"
            ));
        }
    }
    if name.is_empty() {
        return Err("the name is empty".to_string());
    }
    if name.len() > MAX_NAME {
        return Err(format!(
            "the name is {} characters long; at most {MAX_NAME} are allowed",
            name.len()
        ));
    }
    name_chars(name).map_err(|why| format!("the name {name:?} {why}"))
}

/// A label value: empty, or up to 63 characters as the name part of a key.
pub fn label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > MAX_NAME {
        return Err(format!(
            "it is {} characters long; at most {MAX_NAME} are allowed",
            value.len()
        ));
    }
    name_chars(value).map_err(|why| format!("it {why}"))
}

/// Alphanumerics, `-`, `_` and `.`, alphanumeric at both ends.
fn name_chars(s: &str) -> Result<(), String> {
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "contains {c:?}; only letters, digits, '-', '_' and '.' are allowed"
        ));
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alnum(s.chars().next()) || !alnum(s.chars().last()) {
        return Err("must begin and end with a letter or digit".to_string());
    }
    Ok(())
}

/// Dot-separated labels of lowercase alphanumerics and `-`, alphanumeric at both ends.
fn dns_subdomain(s: &str) -> Result<(), String> {
    for label in s.split('.') {
        if label.is_empty() {
            return Err("it has an empty label".to_string());
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
        {
            return Err(format!(
                "it contains {c:?}; only lowercase letters, digits, '-' and '.' are allowed"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("its label {label:?} begins or ends with '-'"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        for ok in [
            "app",
            "example.com/tier",
            "app.kubernetes.io/name",
            "a_b.c-d",
            "service.beta.kubernetes.io/aws-load-balancer-type",
            "1",
        ] {
            assert_eq!(qualified_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "/name",
            "example.com/",
            "Example.com/name",
            "example..com/name",
            "-example.com/name",
            "name~",
            "-name",
            "name.",
            "a/b/c",
        ] {
            assert!(qualified_name(bad).is_err(), "{bad}");
        }
        assert!(qualified_name(&"a".repeat(64)).is_err());
        assert!(qualified_name(&"a".repeat(63)).is_ok());
        assert!(qualified_name(&format!("{}/n", "a".repeat(254))).is_err());
    }

    #[test]
    fn values() {
        for ok in ["", "v", "MyValue", "my.name", "123-my-value", "a_b"] {
            assert_eq!(label_value(ok), Ok(()), "{ok}");
        }
        for bad in ["-a", "a-", "a b", "a/b", "ä"] {
            assert!(label_value(bad).is_err(), "{bad}");
        }
        assert!(label_value(&"a".repeat(64)).is_err());
    }
}
