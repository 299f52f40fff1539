//! Status as users see it: the objects with their status, like `kubectl get -o yaml`.

use gatehouse_translate::{Input, ObjectKey, Status, conditions};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

/// Give each condition its lastTransitionTime: kept from `previous` while unchanged, else `now`.
pub fn stamp(status: &mut Status, previous: &Status, now: Timestamp) {
    fn each(new: Option<&mut Vec<Condition>>, old: Option<&Vec<Condition>>, now: Timestamp) {
        if let Some(new) = new {
            conditions::stamp(new, old.map(Vec::as_slice).unwrap_or_default(), now);
        }
    }
    for (name, s) in &mut status.gateway_classes {
        let old = previous
            .gateway_classes
            .get(name)
            .and_then(|p| p.conditions.as_ref());
        each(s.conditions.as_mut(), old, now);
    }
    for (key, s) in &mut status.gateways {
        let old = previous.gateways.get(key);
        each(
            s.conditions.as_mut(),
            old.and_then(|p| p.conditions.as_ref()),
            now,
        );
        for l in s.listeners.iter_mut().flatten() {
            let old_l = old
                .and_then(|p| p.listeners.as_ref())
                .and_then(|ls| ls.iter().find(|o| o.name == l.name));
            each(Some(&mut l.conditions), old_l.map(|o| &o.conditions), now);
        }
    }
    for (key, s) in &mut status.http_routes {
        let old = previous.http_routes.get(key);
        for p in &mut s.parents {
            let old_p = old.and_then(|o| o.parents.iter().find(|op| op.parent_ref == p.parent_ref));
            each(Some(&mut p.conditions), old_p.map(|o| &o.conditions), now);
        }
    }
    for (key, s) in &mut status.tls_routes {
        let old = previous.tls_routes.get(key);
        for p in &mut s.parents {
            let old_p = old.and_then(|o| o.parents.iter().find(|op| op.parent_ref == p.parent_ref));
            each(Some(&mut p.conditions), old_p.map(|o| &o.conditions), now);
        }
    }
    for (key, s) in &mut status.backend_tls_policies {
        let old = previous.backend_tls_policies.get(key);
        for a in &mut s.ancestors {
            let old_a = old.and_then(|o| {
                o.ancestors
                    .iter()
                    .find(|oa| oa.ancestor_ref == a.ancestor_ref)
            });
            each(Some(&mut a.conditions), old_a.map(|o| &o.conditions), now);
        }
    }
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
