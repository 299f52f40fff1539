//! Applies each Gateway's rendered data-plane objects to the API server.
//!
//! Server-side apply as field manager `gatehouse`, and only what changed since the last apply
//! of this process: an unchanged Gateway costs no request. Objects of Gateways that are no
//! longer ours (deleted Gateways are garbage-collected by their owner reference; a Gateway
//! whose class changed is not) are deleted. At start the controller knows nothing it applied,
//! so every Gateway is applied once and generated objects whose Gateway is not desired are
//! found by label and deleted.

use super::credentials::{CredentialsIssuer, renew_at};
use super::names::Names;
use super::render::{CONTROLLER_ANNOTATION, Owner, ProxySpec, Rendered, Settings, render};
use gatehouse_translate::ObjectKey;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::{ByteString, Resource};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::SystemTime;

/// What a Gateway's data plane should be, as the reconcile loop computed it.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub uid: String,
    pub spec: ProxySpec,
}

/// The outcome of one [`Provisioner::sync`]: the Gateways whose objects could not be applied,
/// with why (status says so instead of claiming a data plane that does not exist).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Provisioned {
    pub errors: BTreeMap<ObjectKey, String>,
    /// Requests sent (0 when nothing changed).
    pub applied: usize,
}

pub struct Provisioner {
    client: Client,
    settings: Settings,
    credentials: Arc<dyn CredentialsIssuer>,
    /// What this process applied last, per Gateway.
    last: HashMap<ObjectKey, Rendered>,
    /// When each Gateway's bootstrap credentials must be issued again.
    renew_at: HashMap<ObjectKey, SystemTime>,
    /// Whether leftovers of Gateways that are not desired were looked for since start.
    swept: bool,
}

const MANAGER: &str = "gatehouse";

impl Provisioner {
    pub fn new(
        client: Client,
        settings: Settings,
        credentials: Arc<dyn CredentialsIssuer>,
    ) -> Self {
        Provisioner {
            client,
            settings,
            credentials,
            last: HashMap::new(),
            renew_at: HashMap::new(),
            swept: false,
        }
    }

    /// Brings every desired Gateway's objects up to date and removes those of Gateways that
    /// are no longer desired.
    pub async fn sync(&mut self, desired: &BTreeMap<ObjectKey, Desired>) -> Provisioned {
        let mut out = Provisioned::default();
        for (key, d) in desired {
            let owner = Owner {
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                uid: d.uid.clone(),
            };
            if let Err(e) = self.ensure_credentials(key, &owner, &mut out).await {
                out.errors.insert(key.clone(), e);
                continue;
            }
            let rendered = render(&owner, &d.spec, &self.settings);
            if self.last.get(key) == Some(&rendered) {
                continue;
            }
            match self.apply_rendered(key, &rendered, &mut out).await {
                Ok(()) => {
                    tracing::info!(gateway = %key, "data plane objects applied");
                    self.last.insert(key.clone(), rendered);
                }
                Err(e) => {
                    tracing::warn!(gateway = %key, "cannot apply the data plane's objects: {e}");
                    out.errors.insert(key.clone(), e);
                }
            }
        }
        let gone: Vec<ObjectKey> = self
            .last
            .keys()
            .filter(|k| !desired.contains_key(k))
            .cloned()
            .collect();
        for key in gone {
            self.last.remove(&key);
            self.renew_at.remove(&key);
            self.delete_all(&key).await;
        }
        if !self.swept {
            match self.sweep(desired).await {
                Ok(()) => self.swept = true,
                Err(e) => tracing::warn!("cannot look for data planes of removed Gateways: {e}"),
            }
        }
        out
    }

    /// The bootstrap Secret: issued when missing, unreadable or due for renewal. The data
    /// plane then gets fresh certificates over its stream; the Secret matters for new pods.
    async fn ensure_credentials(
        &mut self,
        key: &ObjectKey,
        owner: &Owner,
        out: &mut Provisioned,
    ) -> Result<(), String> {
        let now = SystemTime::now();
        if self.renew_at.get(key).is_some_and(|&t| t > now) {
            return Ok(());
        }
        let names = Names::of(&key.name);
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &key.namespace);
        let existing = api
            .get_opt(&names.credentials)
            .await
            .map_err(|e| format!("cannot read Secret {}: {e}", names.credentials))?;
        if let Some(renew) = existing
            .as_ref()
            .and_then(|s| renew_at(&s.data.as_ref()?.get("tls.crt")?.0))
            .filter(|&t| t > now)
        {
            self.renew_at.insert(key.clone(), renew);
            return Ok(());
        }
        let issued = self
            .credentials
            .issue(&key.namespace, &key.name)
            .map_err(|e| format!("cannot issue the data plane's certificate: {e}"))?;
        let secret = Secret {
            metadata: super::render::credentials_meta(owner, &names),
            type_: Some("kubernetes.io/tls".into()),
            data: Some(BTreeMap::from([
                ("tls.crt".into(), ByteString(issued.cert_pem.into_bytes())),
                ("tls.key".into(), ByteString(issued.key_pem.into_bytes())),
                ("ca.crt".into(), ByteString(issued.ca_pem.into_bytes())),
            ])),
            ..Secret::default()
        };
        apply(&api, &names.credentials, &secret).await?;
        out.applied += 1;
        tracing::info!(gateway = %key, "data plane credentials issued");
        self.renew_at.insert(key.clone(), issued.renew_at);
        Ok(())
    }

    async fn apply_rendered(
        &self,
        key: &ObjectKey,
        r: &Rendered,
        out: &mut Provisioned,
    ) -> Result<(), String> {
        let ns = &key.namespace;
        let names = Names::of(&key.name);
        let c = &self.client;
        apply(
            &Api::<ServiceAccount>::namespaced(c.clone(), ns),
            &names.object,
            &r.service_account,
        )
        .await?;
        apply(
            &Api::<Service>::namespaced(c.clone(), ns),
            &names.object,
            &r.service,
        )
        .await?;
        apply(
            &Api::<Deployment>::namespaced(c.clone(), ns),
            &names.object,
            &r.deployment,
        )
        .await?;
        out.applied += 3;
        let pdb = Api::<PodDisruptionBudget>::namespaced(c.clone(), ns);
        match &r.pod_disruption_budget {
            Some(p) => apply(&pdb, &names.object, p).await?,
            None => delete(&pdb, &names.object).await?,
        }
        let hpa = Api::<HorizontalPodAutoscaler>::namespaced(c.clone(), ns);
        match &r.autoscaler {
            Some(h) => apply(&hpa, &names.object, h).await?,
            None => delete(&hpa, &names.object).await?,
        }
        out.applied += 2;
        Ok(())
    }

    /// Deletes every object generated for `key` (a Gateway that is no longer ours).
    async fn delete_all(&self, key: &ObjectKey) {
        let names = Names::of(&key.name);
        let (c, ns) = (&self.client, &key.namespace);
        let results = [
            delete(&Api::<Deployment>::namespaced(c.clone(), ns), &names.object).await,
            delete(&Api::<Service>::namespaced(c.clone(), ns), &names.object).await,
            delete(
                &Api::<ServiceAccount>::namespaced(c.clone(), ns),
                &names.object,
            )
            .await,
            delete(
                &Api::<PodDisruptionBudget>::namespaced(c.clone(), ns),
                &names.object,
            )
            .await,
            delete(
                &Api::<HorizontalPodAutoscaler>::namespaced(c.clone(), ns),
                &names.object,
            )
            .await,
            delete(
                &Api::<Secret>::namespaced(c.clone(), ns),
                &names.credentials,
            )
            .await,
        ];
        match results.into_iter().find_map(Result::err) {
            None => {
                tracing::info!(gateway = %key, "data plane of a Gateway that is no longer ours deleted")
            }
            Some(e) => {
                tracing::warn!(gateway = %key, "cannot delete the data plane of a Gateway that is no longer ours: {e}")
            }
        }
    }

    /// Generated Deployments whose Gateway is not desired (found by label): left by a previous
    /// controller that stopped before deleting them. Only those marked with our controllerName:
    /// another Gatehouse installation in the cluster (another controllerName, other
    /// GatewayClasses) provisions with the same labels, and its Gateways are never in our
    /// desired set. Deployments without the mark (made before it existed) are left alone:
    /// what cannot be shown to be ours is not deleted.
    async fn sweep(&self, desired: &BTreeMap<ObjectKey, Desired>) -> Result<(), String> {
        let api: Api<Deployment> = Api::all(self.client.clone());
        let list = api
            .list(&ListParams::default().labels(
                "app.kubernetes.io/name=gatehouse-proxy,app.kubernetes.io/managed-by=gatehouse",
            ))
            .await
            .map_err(|e| e.to_string())?;
        for d in list {
            if !is_ours(&d, &self.settings.controller_name) {
                continue;
            }
            let ns = d.metadata.namespace.clone().unwrap_or_default();
            let Some(owner) = d
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.kind == "Gateway" && o.controller == Some(true))
            else {
                continue;
            };
            let key = ObjectKey::new(ns, owner.name.clone());
            if !desired.contains_key(&key) {
                self.delete_all(&key).await;
            }
        }
        Ok(())
    }
}

fn is_ours(d: &Deployment, controller_name: &str) -> bool {
    d.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONTROLLER_ANNOTATION))
        .is_some_and(|c| c == controller_name)
}

/// Server-side apply of `object` (its apiVersion and kind are added).
async fn apply<K>(api: &Api<K>, name: &str, object: &K) -> Result<(), String>
where
    K: Resource + Serialize + DeserializeOwned + Clone + Debug,
{
    let mut body = serde_json::to_value(object).map_err(|e| e.to_string())?;
    body["apiVersion"] = K::API_VERSION.into();
    body["kind"] = K::KIND.into();
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map(drop)
    .map_err(|e| format!("cannot apply {} {name}: {e}", K::KIND))
}

/// Deletes `name`; a missing object is fine.
async fn delete<K>(api: &Api<K>, name: &str) -> Result<(), String>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(format!("cannot delete {} {name}: {e}", K::KIND)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(annotation: Option<&str>) -> Deployment {
        let mut d = Deployment::default();
        if let Some(a) = annotation {
            d.metadata.annotations =
                Some(BTreeMap::from([(CONTROLLER_ANNOTATION.into(), a.into())]));
        }
        d
    }

    #[test]
    fn only_deployments_marked_with_our_controller_name_are_ours() {
        let ours = "gatehouse.dev/gateway-controller";
        assert!(is_ours(&deployment(Some(ours)), ours));
        assert!(!is_ours(&deployment(Some("gatehouse.dev/internal")), ours));
        assert!(
            !is_ours(&deployment(None), ours),
            "unmarked: not provably ours"
        );
    }
}
