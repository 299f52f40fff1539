//! Status as users see it: the objects with their status, like `kubectl get -o yaml`.

use gatehouse_translate::{Input, ObjectKey, Status};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

/// Give each condition its lastTransitionTime: kept from `previous` while unchanged, else `now`.
pub fn stamp(status: &mut Status, previous: &Status, now: Timestamp) {
    gatehouse_translate::stamp_status(status, previous, now);
}

fn strip_managed_fields(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
}

/// Every object Gatehouse is responsible for, with its status filled in, in a stable order.
pub fn objects(input: &Input, status: &Status) -> Vec<Value> {
    let mut out = Vec::new();
    let mut classes: Vec<_> = input.gateway_classes.iter().collect();
    classes.sort_by_key(|c| c.metadata.name.clone());
    for class in classes {
        let name = class.metadata.name.clone().unwrap_or_default();
        if let Some(s) = status.gateway_classes.get(&name) {
            let mut c = class.clone();
            strip_managed_fields(&mut c.metadata);
            c.status = Some(s.clone());
            out.push(serde_json::to_value(c).unwrap_or_default());
        }
    }
    let mut gateways: Vec<_> = input.gateways.iter().collect();
    gateways.sort_by_key(|g| ObjectKey::of(&g.metadata));
    for gw in gateways {
        if let Some(s) = status.gateways.get(&ObjectKey::of(&gw.metadata)) {
            let mut g = gw.clone();
            strip_managed_fields(&mut g.metadata);
            g.status = Some(s.clone());
            out.push(serde_json::to_value(g).unwrap_or_default());
        }
    }
    let mut routes: Vec<_> = input.http_routes.iter().collect();
    routes.sort_by_key(|r| ObjectKey::of(&r.metadata));
    for route in routes {
        if let Some(s) = status.http_routes.get(&ObjectKey::of(&route.metadata)) {
            let mut r = route.clone();
            strip_managed_fields(&mut r.metadata);
            r.status = Some(s.clone());
            out.push(serde_json::to_value(r).unwrap_or_default());
        }
    }
    let mut tls_routes: Vec<_> = input.tls_routes.iter().collect();
    tls_routes.sort_by_key(|r| ObjectKey::of(&r.metadata));
    for route in tls_routes {
        if let Some(s) = status.tls_routes.get(&ObjectKey::of(&route.metadata)) {
            let mut r = route.clone();
            strip_managed_fields(&mut r.metadata);
            r.status = Some(s.clone());
            out.push(serde_json::to_value(r).unwrap_or_default());
        }
    }
    let mut policies: Vec<_> = input.backend_tls_policies.iter().collect();
    policies.sort_by_key(|p| ObjectKey::of(&p.metadata));
    for policy in policies {
        if let Some(s) = status
            .backend_tls_policies
            .get(&ObjectKey::of(&policy.metadata))
        {
            let mut p = policy.clone();
            strip_managed_fields(&mut p.metadata);
            p.status = Some(s.clone());
            out.push(serde_json::to_value(p).unwrap_or_default());
        }
    }
    out
}

/// Multi-document YAML of [`objects`].
pub fn to_yaml(objects: &[Value]) -> String {
    objects
        .iter()
        .map(|o| serde_yaml::to_string(o).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("---\n")
}
