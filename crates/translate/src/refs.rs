//! Lookups of referenced objects shared by every stage: Secrets, ConfigMaps, ReferenceGrants.

use crate::objects::{ObjectKey, namespace};
use gateway_api::apis::standard::referencegrants::ReferenceGrant;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use std::collections::BTreeMap;

/// A reference from an object of (group, kind) in `namespace`.
#[derive(Clone, Copy)]
pub struct From<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
}

pub struct Refs<'a> {
    pub secrets: BTreeMap<ObjectKey, &'a Secret>,
    pub config_maps: BTreeMap<ObjectKey, &'a ConfigMap>,
    grants: &'a [ReferenceGrant],
}

impl<'a> Refs<'a> {
    pub fn new(
        secrets: &'a [Secret],
        config_maps: &'a [ConfigMap],
        grants: &'a [ReferenceGrant],
    ) -> Self {
        Refs {
            secrets: secrets
                .iter()
                .map(|s| (ObjectKey::of(&s.metadata), s))
                .collect(),
            config_maps: config_maps
                .iter()
                .map(|c| (ObjectKey::of(&c.metadata), c))
                .collect(),
            grants,
        }
    }

    /// May `from` refer to (group, kind, name) in `to_namespace`? Always within a namespace;
    /// across namespaces only with a ReferenceGrant in the target namespace.
    pub fn permitted(
        &self,
        from: From,
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
