//! The addresses Gateways listen on and report, in controller mode.

use crate::reconcile::AdjustOptions;
use gatehouse_translate::conditions::names::ROUTABILITY_CLUSTER;
use gatehouse_translate::{
    Input, ObjectKey, Options as TranslateOptions, PublishedAddress, ServiceAddresses,
};
use k8s_openapi::api::core::v1::Service;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};

/// Per snapshot: with `local_addresses`, each Gateway gets a loopback address of its own
/// ([`AddressBook`]); with `publish_service`, Gateways report that Service's addresses.
pub fn adjust_options(local_addresses: bool, publish_service: Option<ObjectKey>) -> AdjustOptions {
    let mut book = AddressBook::default();
    Box::new(move |input: &Input, options: &mut TranslateOptions| {
        if local_addresses {
            options.gateway_addresses = book.assign(input);
        }
        if let Some(key) = &publish_service {
            options.published_addresses = published_addresses(input, key);
        }
    })
}

/// Provisioned mode: each Gateway gets a loopback address of its own in the configuration (so
/// that Gateways sharing a port never conflict: each has its own data plane, which binds all
/// of its pod's addresses) and reports the addresses of its own Service, named by
/// `service_name` from the Gateway's name. A Gateway whose Service does not exist yet has
/// none.
pub fn provisioned_options(service_name: fn(&str) -> String) -> AdjustOptions {
    let mut book = AddressBook::default();
    Box::new(move |input: &Input, options: &mut TranslateOptions| {
        options.gateway_addresses = book.assign(input);
        // One pass over the Services, not one per Gateway.
        let services: HashMap<ObjectKey, &Service> = input
            .services
            .iter()
            .map(|s| (ObjectKey::of(&s.metadata), &**s))
            .collect();
        options.gateway_published_addresses = input
            .gateways
            .iter()
            .map(|g| {
                let key = ObjectKey::of(&g.metadata);
                let service = ObjectKey::new(key.namespace.clone(), service_name(&key.name));
                let published = services
                    .get(&service)
                    .map_or_else(ServiceAddresses::default, |svc| own_service_addresses(svc));
                (key, published)
            })
            .collect();
    })
}

/// A provisioned Gateway's Service's addresses. By default a LoadBalancer's ingress only (its
/// cluster IP is no address for clients outside the cluster, and reporting it while the load
/// balancer is still assigning one would send them nowhere), else the cluster IPs; routability
/// `Cluster` asks for the cluster IPs whatever the type.
fn own_service_addresses(svc: &Service) -> ServiceAddresses {
    let load_balancer = svc
        .spec
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .is_some_and(|t| t == "LoadBalancer");
    let ingress = ingress_addresses(svc);
    let cluster = cluster_ips(svc);
    ServiceAddresses {
        default: if load_balancer || !ingress.is_empty() {
            ingress
        } else {
            cluster.clone()
        },
        cluster,
    }
}

/// Stable loopback addresses per Gateway: derived from its name, so they survive restarts,
/// and sticky while running, so a new Gateway never moves an existing one.
#[derive(Default)]
pub struct AddressBook {
    assigned: BTreeMap<ObjectKey, IpAddr>,
}

impl AddressBook {
    pub fn assign(&mut self, input: &Input) -> BTreeMap<ObjectKey, IpAddr> {
        let live: BTreeSet<ObjectKey> = input
            .gateways
            .iter()
            .map(|g| ObjectKey::of(&g.metadata))
            .collect();
        self.assigned.retain(|k, _| live.contains(k));
        for key in live {
            if self.assigned.contains_key(&key) {
                continue;
            }
            // FNV-1a over namespace/name picks a slot in 127.1.0.1 .. 127.255.255.254.
            let mut h: u32 = 0x811c_9dc5;
            for b in key.to_string().bytes() {
                h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
            }
            const SLOTS: u32 = 255 * 256 * 254;
            let mut slot = h % SLOTS;
            loop {
                let (a, rest) = (1 + slot / (256 * 254), slot % (256 * 254));
                let ip = IpAddr::V4(Ipv4Addr::new(
                    127,
                    a as u8,
                    (rest / 254) as u8,
                    (1 + rest % 254) as u8,
                ));
                if !self.assigned.values().any(|v| *v == ip) {
                    self.assigned.insert(key.clone(), ip);
                    break;
                }
                slot = (slot + 1) % SLOTS;
            }
        }
        self.assigned.clone()
    }
}

/// The addresses clients reach the data plane at: the Service's load-balancer ingress if it has
/// one, else its cluster IPs. `None` until the Service exists (status then shows the bind
/// address).
pub fn published_addresses(input: &Input, service: &ObjectKey) -> Option<Vec<PublishedAddress>> {
    let svc = input
        .services
        .iter()
        .find(|s| ObjectKey::of(&s.metadata) == *service)?;
    let ingress = ingress_addresses(svc);
    if !ingress.is_empty() {
        return Some(ingress);
    }
    let ips = cluster_ips(svc);
    (!ips.is_empty()).then_some(ips)
}

/// The Service's load-balancer ingress.
fn ingress_addresses(svc: &Service) -> Vec<PublishedAddress> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| match (&i.ip, &i.hostname) {
            (Some(ip), _) => Some(("IPAddress", ip)),
            (None, Some(h)) => Some(("Hostname", h)),
            _ => None,
        })
        .map(|(type_, value)| PublishedAddress {
            type_: type_.to_string(),
            value: value.clone(),
            routability: None,
        })
        .collect()
}

/// The Service's cluster IPs (none for a headless one), reported with routability `Cluster`:
/// they are reachable from inside the cluster only.
fn cluster_ips(svc: &Service) -> Vec<PublishedAddress> {
    let Some(spec) = svc.spec.as_ref() else {
        return Vec::new();
    };
    spec.cluster_ips
        .clone()
        .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
        .into_iter()
        .flatten()
        .filter(|ip| ip != "None" && !ip.is_empty())
        .map(|ip| PublishedAddress {
            type_: "IPAddress".to_string(),
            value: ip,
            routability: Some(ROUTABILITY_CLUSTER.to_string()),
        })
        .collect()
}
