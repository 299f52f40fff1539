//! BackendTLSPolicy status: one ancestor entry per Gateway that sends traffic to a Service port
//! the policy targets.

use crate::ObjectKey;
use crate::backends::PolicyOutcome;
use crate::conditions::{condition, names::*};
use crate::objects::GATEWAY_GROUP;
use gateway_api::apis::standard::backendtlspolicies::{
    BackendTlsPolicy, BackendTlsPolicyStatus, BackendTlsPolicyStatusAncestors,
    BackendTlsPolicyStatusAncestorsAncestorRef,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub fn policy_status(
    outcomes: &BTreeMap<ObjectKey, PolicyOutcome>,
    cluster_users: &BTreeMap<String, BTreeSet<ObjectKey>>,
    policies: &[Arc<BackendTlsPolicy>],
    controller: &str,
) -> BTreeMap<ObjectKey, BackendTlsPolicyStatus> {
    let mut out = BTreeMap::new();
    for (key, o) in outcomes {
        let generation = policies
            .iter()
            .find(|p| ObjectKey::of(&p.metadata) == *key)
            .and_then(|p| p.metadata.generation);
        let ancestors: BTreeSet<&ObjectKey> = o
            .clusters
            .iter()
            .chain(&o.conflicted)
            .filter_map(|c| cluster_users.get(c))
            .flatten()
            .collect();
        // A policy with a problem has no usable CA (policy_ca fails as a whole): it cannot
        // validate anything, and the backends it targets are not sent traffic (fail closed).
        let accepted = if o.clusters.is_empty() && !o.conflicted.is_empty() {
            condition(
                ACCEPTED,
                false,
                CONFLICTED_POLICY,
                "an older BackendTLSPolicy targets the same Service port",
                generation,
            )
        } else if let Some((_, message)) = &o.problem {
            condition(
                ACCEPTED,
                false,
                NO_VALID_CA_CERTIFICATE,
                message.clone(),
                generation,
            )
        } else {
            condition(ACCEPTED, true, ACCEPTED, "Accepted", generation)
        };
        let resolved = match &o.problem {
            Some((reason, message)) => {
                condition(RESOLVED_REFS, false, reason, message.clone(), generation)
            }
            None => condition(RESOLVED_REFS, true, RESOLVED_REFS, "Resolved", generation),
        };
        let status = BackendTlsPolicyStatus {
            ancestors: ancestors
                .into_iter()
                .map(|gw| BackendTlsPolicyStatusAncestors {
                    ancestor_ref: BackendTlsPolicyStatusAncestorsAncestorRef {
                        group: Some(GATEWAY_GROUP.to_string()),
                        kind: Some("Gateway".to_string()),
                        name: gw.name.clone(),
                        namespace: Some(gw.namespace.clone()),
                        ..Default::default()
                    },
                    conditions: vec![accepted.clone(), resolved.clone()],
                    controller_name: controller.to_string(),
                })
                .collect(),
        };
        out.insert(key.clone(), status);
    }
    out
}
