//! Lookups of referenced objects shared by every stage: Secrets, ConfigMaps,
//! ClusterTrustBundles, ReferenceGrants.

use crate::objects::{ObjectKey, namespace};
use gateway_api::apis::standard::referencegrants::ReferenceGrant;
use k8s_openapi::api::certificates::v1beta1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The object a reference comes from: (group, kind) in `namespace`, as ReferenceGrants name it.
#[derive(Clone, Copy)]
pub struct Referrer<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
}

pub struct Refs<'a> {
    pub secrets: BTreeMap<ObjectKey, &'a Secret>,
    pub config_maps: BTreeMap<ObjectKey, &'a ConfigMap>,
    /// Cluster-scoped: by name.
    pub cluster_trust_bundles: BTreeMap<&'a str, &'a ClusterTrustBundle>,
    grants: &'a [Arc<ReferenceGrant>],
}

impl<'a> Refs<'a> {
    pub fn new(input: &'a crate::Input) -> Self {
        let crate::Input {
            secrets,
            config_maps,
            cluster_trust_bundles,
            reference_grants: grants,
            ..
        } = input;
        Refs {
            secrets: secrets
                .iter()
                .map(|s| (ObjectKey::of(&s.metadata), &**s))
                .collect(),
            config_maps: config_maps
                .iter()
                .map(|c| (ObjectKey::of(&c.metadata), &**c))
                .collect(),
            cluster_trust_bundles: cluster_trust_bundles
                .iter()
                .filter_map(|b| Some((b.metadata.name.as_deref()?, &**b)))
                .collect(),
            grants,
        }
    }

    /// The CA bundle of ClusterTrustBundle `name`, or why there is none. Cluster-scoped, so
    /// no ReferenceGrant is involved: a ClusterTrustBundle holds only public certificates and
    /// is readable cluster-wide by design.
    pub fn trust_bundle(&self, name: &str) -> Result<String, String> {
        let bundle = self
            .cluster_trust_bundles
            .get(name)
            .ok_or_else(|| format!("ClusterTrustBundle {name} not found"))?;
        crate::certificates::trust_bundle(bundle)
            .map_err(|e| format!("ClusterTrustBundle {name}: {e}"))
    }

    /// The CA bundle under `ca.crt` of ConfigMap `key`, or why there is none.
    pub fn config_map_bundle(&self, key: &ObjectKey) -> Result<String, String> {
        let cm = self
            .config_maps
            .get(key)
            .ok_or_else(|| format!("ConfigMap {key} not found"))?;
        crate::certificates::ca_bundle(cm).map_err(|e| format!("ConfigMap {key}: {e}"))
    }

    /// May `from` refer to (group, kind, name) in `to_namespace`? Always within a namespace;
    /// across namespaces only with a ReferenceGrant in the target namespace.
    pub fn permitted(
        &self,
        from: Referrer,
        to_group: &str,
        to_kind: &str,
        to_namespace: &str,
        to_name: &str,
    ) -> bool {
        from.namespace == to_namespace
            || self
                .grants
                .iter()
                .filter(|g| namespace(&g.metadata) == to_namespace)
                .any(|g| {
                    g.spec.from.iter().any(|f| {
                        f.group == from.group
                            && f.kind == from.kind
                            && f.namespace == from.namespace
                    }) && g.spec.to.iter().any(|t| {
                        t.group == to_group
                            && t.kind == to_kind
                            && t.name.as_deref().is_none_or(|n| n == to_name)
                    })
                })
    }
}

/// Does a certificate reference (group, kind, both defaulted) name a core Secret?
fn names_secret(group: Option<&str>, kind: Option<&str>) -> bool {
    kind.unwrap_or("Secret") == "Secret" && group.unwrap_or("").is_empty()
}

/// The Secrets that Gateways reference: listener certificates and backend client certificates.
/// A source that cannot hold every Secret (the Kubernetes one) fetches exactly these.
pub fn referenced_secrets(input: &crate::Input) -> BTreeSet<ObjectKey> {
    let mut out = BTreeSet::new();
    for gw in &input.gateways {
        let ns = namespace(&gw.metadata);
        let certificate_refs = gw
            .spec
            .listeners
            .iter()
            .flat_map(|l| l.tls.iter())
            .flat_map(|t| t.certificate_refs.iter().flatten())
            .filter(|r| names_secret(r.group.as_deref(), r.kind.as_deref()))
            .map(|r| (r.namespace.as_ref(), &r.name));
        let client_certificate = gw
            .spec
            .tls
            .as_ref()
            .and_then(|t| t.backend.as_ref())
            .and_then(|b| b.client_certificate_ref.as_ref())
            .map(|r| (r.namespace.as_ref(), &r.name));
        for (r_ns, name) in certificate_refs.chain(client_certificate) {
            out.insert(ObjectKey::new(r_ns.unwrap_or(&ns).clone(), name.clone()));
        }
    }
    // ListenerSets' listener certificates, relative to the ListenerSet. Whether the set is
    // allowed to attach is translate's call; fetching a few Secrets too many is harmless.
    for ls in &input.listener_sets {
        let ns = namespace(&ls.metadata);
        let refs = ls
            .spec
            .listeners
            .iter()
            .flat_map(|l| l.tls.iter())
            .flat_map(|t| t.certificate_refs.iter().flatten())
            .filter(|r| names_secret(r.group.as_deref(), r.kind.as_deref()))
            .map(|r| (r.namespace.as_ref(), &r.name));
        for (r_ns, name) in refs {
            out.insert(ObjectKey::new(r_ns.unwrap_or(&ns).clone(), name.clone()));
        }
    }
    out
}

/// Every CA certificate reference of Gateways (client validation) and BackendTLSPolicies, as
/// (group, kind, the object it names): a namespaced target in the reference's namespace, or
/// else the referrer's.
fn ca_references(input: &crate::Input) -> Vec<(String, String, ObjectKey)> {
    let mut out = Vec::new();
    for gw in &input.gateways {
        let ns = namespace(&gw.metadata);
        for (_, validation) in crate::listener_tls::frontend_validations(gw) {
            for r in validation.ca_refs {
                let target = ObjectKey::new(r.namespace.unwrap_or_else(|| ns.clone()), r.name);
                out.push((r.group, r.kind, target));
            }
        }
    }
    for p in &input.backend_tls_policies {
        let ns = namespace(&p.metadata);
        for r in p.spec.validation.ca_certificate_refs.iter().flatten() {
            let target = ObjectKey::new(ns.clone(), r.name.clone());
            out.push((r.group.clone(), r.kind.clone(), target));
        }
    }
    out
}

/// The ClusterTrustBundles that CA certificate references name, keyed with an empty
/// namespace: the kind is cluster-scoped.
pub fn referenced_cluster_trust_bundles(input: &crate::Input) -> BTreeSet<ObjectKey> {
    ca_references(input)
        .into_iter()
        .filter(|(group, kind, _)| is_cluster_trust_bundle(group, kind))
        .map(|(_, _, target)| ObjectKey::new(String::new(), target.name))
        .collect()
}

/// Whether a CA certificate reference names a ClusterTrustBundle (`certificates.k8s.io`).
pub fn is_cluster_trust_bundle(group: &str, kind: &str) -> bool {
    use k8s_openapi::Resource as _;
    group == ClusterTrustBundle::GROUP && kind == ClusterTrustBundle::KIND
}

/// Why a CA certificate reference of another kind cannot be used.
pub fn unsupported_ca_kind(group: &str, kind: &str) -> String {
    format!(
        "caCertificateRef kind {group}/{kind} is not supported; use a ConfigMap or a \
         certificates.k8s.io/ClusterTrustBundle"
    )
}

/// The ConfigMaps that CA certificate references name (CA bundles).
pub fn referenced_config_maps(input: &crate::Input) -> BTreeSet<ObjectKey> {
    ca_references(input)
        .into_iter()
        .filter(|(group, kind, _)| group.is_empty() && kind == "ConfigMap")
        .map(|(_, _, target)| target)
        .collect()
}
