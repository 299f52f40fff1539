//! Names of the objects generated for a Gateway. A Gateway's name may be 253 characters, a
//! Service's only 63 (a DNS label) and so is a label value: long names are cut and given a
//! hash of the whole name, so two long Gateway names never share objects.

/// The names of one Gateway's generated objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    /// Deployment, Service, ServiceAccount, PodDisruptionBudget, HorizontalPodAutoscaler.
    pub object: String,
    /// The Secret with the data plane's bootstrap credentials.
    pub credentials: String,
    /// The value of the `gateway.networking.k8s.io/gateway-name` label.
    pub gateway_label: String,
}

const SUFFIX: &str = "-gatehouse";
const MAX_LABEL: usize = 63;

impl Names {
    pub fn of(gateway: &str) -> Names {
        let object = fit(gateway, SUFFIX);
        Names {
            credentials: format!("{object}-credentials"),
            object,
            gateway_label: fit(gateway, ""),
        }
    }
}

/// `name` + `suffix` if it fits in a DNS label, else a prefix of `name`, a hash of all of it
/// and `suffix`.
fn fit(name: &str, suffix: &str) -> String {
    if name.len() + suffix.len() <= MAX_LABEL {
        return format!("{name}{suffix}");
    }
    let hash = format!("{:08x}", fnv1a(name.as_bytes()) as u32);
    let keep = MAX_LABEL - suffix.len() - hash.len() - 1;
    // Gateway names are DNS subdomains (ASCII), so any byte index is a char boundary; a cut
    // that ends on '.' or '-' would make an invalid label, so those are trimmed.
    let prefix = name[..keep].trim_end_matches(['.', '-']).replace('.', "-");
    format!("{prefix}-{hash}{suffix}")
}

/// FNV-1a: stable across builds and platforms (the names must not change when the
/// controller is upgraded), unlike std's hasher.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_kept() {
        let n = Names::of("web");
        assert_eq!(n.object, "web-gatehouse");
        assert_eq!(n.credentials, "web-gatehouse-credentials");
        assert_eq!(n.gateway_label, "web");
    }

    #[test]
    fn long_names_fit_a_label_and_stay_distinct() {
        let a = "a".repeat(100) + "x";
        let b = "a".repeat(100) + "y";
        let (na, nb) = (Names::of(&a), Names::of(&b));
        for n in [&na, &nb] {
            assert!(n.object.len() <= 63, "{}", n.object);
            assert!(n.gateway_label.len() <= 63);
            assert!(n.object.ends_with("-gatehouse"));
        }
        assert_ne!(na.object, nb.object);
        assert_ne!(na.gateway_label, nb.gateway_label);
        // Dots of a subdomain name do not end up in a DNS label.
        let dotted = Names::of(&format!("{}.example.com", "b".repeat(60)));
        assert!(!dotted.object.contains('.'), "{}", dotted.object);
        assert_eq!(Names::of(&a), na, "stable");
    }
}
