//! What a served Gateway's status.addresses reports, and whether every `spec.addresses` entry
//! got an address of the routability it asks for (the AddressesAssigned condition, GEP-5093).
//!
//! An entry of the default routability is satisfied by what clients outside reach the data
//! plane at (the Service's load-balancer ingress, or its cluster IPs when it has no load
//! balancer; where Gatehouse binds, when no Service is published); a `Cluster` entry by one of
//! the Service's cluster IPs. An entry with a value is satisfied only by that address. Which
//! routabilities translate accepts at all is decided earlier (`gateways::address`).
//!
//! `status.addresses[].routability` is written only for a Gateway whose spec.addresses sets
//! routability: that proves the experimental CRD is installed. On the standard CRD the API
//! server prunes the unknown field, the written status never equals the computed one, and
//! every pass would patch the Gateway again.

use crate::PublishedAddress;
use crate::conditions::names::*;
use crate::generated::gateways::{Gateway, GatewayAddresses, GatewayStatusAddresses};
use std::net::IpAddr;

/// The addresses to report and the AddressesAssigned condition.
#[derive(Debug, PartialEq)]
pub(crate) struct Assignment {
    pub addresses: Vec<GatewayStatusAddresses>,
    /// A Service is published but has no address for what is asked yet (a load balancer
    /// still assigning one): clients cannot reach the Gateway.
    pub waiting: bool,
    /// (status, reason, message), when spec.addresses asks for anything.
    pub assigned: Option<(bool, &'static str, String)>,
}

/// `bind` is where the data plane listens; `published` the Service's (default, cluster)
/// addresses, when one is published.
pub(crate) fn assign(
    gw: &Gateway,
    bind: IpAddr,
    published: Option<(&[PublishedAddress], &[PublishedAddress])>,
) -> Assignment {
    let requested = gw.spec.addresses.as_deref().unwrap_or_default();
    let bound = [PublishedAddress {
        type_: "IPAddress".into(),
        value: bind.to_string(),
        routability: None,
    }];
    let (default, cluster) = published.unwrap_or((&bound, &[]));
    let wants_cluster = requested.iter().any(is_cluster);
    let wants_default = requested.is_empty() || requested.iter().any(|a| !is_cluster(a));

    let mut reported: Vec<&PublishedAddress> = Vec::new();
    if wants_default {
        reported.extend(default);
    }
    if wants_cluster {
        for a in cluster {
            if !reported.iter().any(|r| r.value == a.value) {
                reported.push(a);
            }
        }
    }
    let waiting = published.is_some() && reported.is_empty();
    let with_routability = requested.iter().any(|a| a.routability.is_some());

    let assigned = (!requested.is_empty()).then(|| {
        // Each address satisfies one entry per pool: two entries need two addresses.
        let mut used: Vec<(bool, &str)> = Vec::new();
        let mut missing = Vec::new();
        for entry in requested {
            let in_cluster = is_cluster(entry);
            let pool = if in_cluster { cluster } else { default };
            let want = entry.value.as_deref().filter(|v| !v.is_empty());
            let hit = pool.iter().find(|a| {
                !used.contains(&(in_cluster, a.value.as_str())) && want.is_none_or(|v| v == a.value)
            });
            match hit {
                Some(a) => used.push((in_cluster, a.value.as_str())),
                None => missing.push(describe(entry)),
            }
        }
        if missing.is_empty() {
            (
                true,
                ADDRESSES_ASSIGNED,
                "every requested address is assigned".to_string(),
            )
        } else {
            let reason = if missing.len() == requested.len() {
                NOT_ASSIGNED
            } else {
                PARTIALLY_ASSIGNED
            };
            (
                false,
                reason,
                format!("not assigned: {}", missing.join("; ")),
            )
        }
    });

    Assignment {
        addresses: reported
            .into_iter()
            .map(|a| GatewayStatusAddresses {
                r#type: Some(a.type_.clone()),
                value: a.value.clone(),
                routability: a.routability.clone().filter(|_| with_routability),
            })
            .collect(),
        waiting,
        assigned,
    }
}

fn is_cluster(a: &GatewayAddresses) -> bool {
    a.routability.as_deref() == Some(ROUTABILITY_CLUSTER)
}

/// `IPAddress 10.0.0.7`, `an IPAddress of routability Cluster`, ...
fn describe(a: &GatewayAddresses) -> String {
    let type_ = a.r#type.as_deref().unwrap_or("IPAddress");
    let routability = match a.routability.as_deref().unwrap_or_default() {
        "" => String::new(),
        r => format!(" of routability {r}"),
    };
    match a.value.as_deref().filter(|v| !v.is_empty()) {
        Some(v) => format!("{type_} {v}{routability}"),
        None => format!("an {type_}{routability}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gateway(addresses: &str) -> Gateway {
        serde_yaml::from_str(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: g}}\n\
             spec: {{gatewayClassName: c, listeners: [], addresses: {addresses}}}\n"
        ))
        .unwrap()
    }

    fn ip(value: &str, routability: Option<&str>) -> PublishedAddress {
        PublishedAddress {
            type_: "IPAddress".into(),
            value: value.into(),
            routability: routability.map(str::to_string),
        }
    }

    fn values(a: &Assignment) -> Vec<(String, Option<String>)> {
        a.addresses
            .iter()
            .map(|s| (s.value.clone(), s.routability.clone()))
            .collect()
    }

    const BIND: IpAddr = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);

    #[test]
    fn no_request_reports_the_default_addresses_and_no_condition() {
        let lb = [ip("203.0.113.9", None)];
        let cluster = [ip("10.96.0.12", Some("Cluster"))];
        let a = assign(&gateway("[]"), BIND, Some((&lb, &cluster)));
        assert_eq!(values(&a), vec![("203.0.113.9".into(), None)]);
        assert_eq!(a.assigned, None);
        assert!(!a.waiting);
    }

    #[test]
    fn a_cluster_entry_is_given_the_cluster_ip_with_its_routability() {
        let lb = [ip("203.0.113.9", None)];
        let cluster = [ip("10.96.0.12", Some("Cluster"))];
        let a = assign(
            &gateway("[{routability: Cluster}]"),
            BIND,
            Some((&lb, &cluster)),
        );
        assert_eq!(
            values(&a),
            vec![("10.96.0.12".into(), Some("Cluster".into()))]
        );
        assert_eq!(a.assigned.as_ref().map(|c| c.1), Some(ADDRESSES_ASSIGNED));
    }

    #[test]
    fn both_routabilities_report_both_and_a_missing_load_balancer_is_partial() {
        let cluster = [ip("10.96.0.12", Some("Cluster"))];
        let a = assign(
            &gateway("[{routability: Cluster}, {type: IPAddress}]"),
            BIND,
            Some((&[], &cluster)),
        );
        assert_eq!(values(&a).len(), 1);
        assert!(!a.waiting, "the cluster IP reaches it");
        let (ok, reason, message) = a.assigned.unwrap();
        assert!(!ok);
        assert_eq!(reason, PARTIALLY_ASSIGNED);
        assert_eq!(message, "not assigned: an IPAddress");
    }

    #[test]
    fn a_value_is_satisfied_only_by_that_address() {
        let cluster = [ip("10.96.0.12", Some("Cluster"))];
        let a = assign(
            &gateway("[{value: 10.96.0.50, routability: Cluster}]"),
            BIND,
            Some((&cluster, &cluster)),
        );
        let (ok, reason, message) = a.assigned.unwrap();
        assert!(!ok);
        assert_eq!(reason, NOT_ASSIGNED);
        assert_eq!(
            message,
            "not assigned: IPAddress 10.96.0.50 of routability Cluster"
        );
    }

    #[test]
    fn two_entries_need_two_addresses() {
        let lb = [ip("203.0.113.9", None)];
        let a = assign(
            &gateway("[{type: IPAddress}, {type: IPAddress}]"),
            BIND,
            Some((&lb, &[])),
        );
        assert_eq!(a.assigned.unwrap().1, PARTIALLY_ASSIGNED);
    }

    #[test]
    fn without_a_service_the_bind_address_is_what_is_assigned() {
        let bind: IpAddr = "127.0.0.7".parse().unwrap();
        let a = assign(&gateway("[{value: 127.0.0.7}]"), bind, None);
        assert_eq!(values(&a), vec![("127.0.0.7".into(), None)]);
        assert_eq!(a.assigned.unwrap().1, ADDRESSES_ASSIGNED);
        let a = assign(&gateway("[{value: 127.0.0.8}]"), bind, None);
        assert_eq!(a.assigned.unwrap().1, NOT_ASSIGNED);
    }

    #[test]
    fn routability_is_reported_only_to_gateways_that_use_the_field() {
        let cluster = [ip("10.96.0.12", Some("Cluster"))];
        let a = assign(&gateway("[]"), BIND, Some((&cluster, &cluster)));
        assert_eq!(values(&a), vec![("10.96.0.12".into(), None)]);
        let a = assign(
            &gateway("[{type: IPAddress, routability: \"\"}]"),
            BIND,
            Some((&cluster, &cluster)),
        );
        assert_eq!(
            values(&a),
            vec![("10.96.0.12".into(), Some("Cluster".into()))]
        );
    }

    #[test]
    fn a_load_balancer_still_assigning_is_waiting() {
        let cluster = [ip("10.96.0.12", Some("Cluster"))];
        let a = assign(&gateway("[]"), BIND, Some((&[], &cluster)));
        assert!(a.waiting);
        assert!(a.addresses.is_empty());
    }
}
