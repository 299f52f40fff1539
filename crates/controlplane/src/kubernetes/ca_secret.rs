//! The control plane's CA, kept in a Secret of the controller's namespace so that every
//! replica and every restart signs with the same key (data planes keep trusting it), and the
//! issuer of the data planes' bootstrap credentials.
//!
//! Only the controller's ServiceAccount can read that Secret; data planes never see the CA
//! key, only their own certificate and the CA certificate.

use crate::provision::{CredentialsIssuer, IssuedCredentials};
use anyhow::Context as _;
use gatehouse_sync::{Ca, DataPlaneIdentity};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, PostParams};
use std::sync::Arc;
use std::time::Duration;

const CERT_KEY: &str = "ca.crt";
const KEY_KEY: &str = "ca.key";

/// Reads the CA from Secret `namespace/name`, or generates one and creates the Secret. Two
/// replicas starting together race on the create; the loser reads the winner's.
pub async fn load_or_create(client: &Client, namespace: &str, name: &str) -> anyhow::Result<Ca> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for _ in 0..3 {
        if let Some(secret) = api
            .get_opt(name)
            .await
            .with_context(|| format!("cannot read the CA Secret {namespace}/{name}"))?
        {
            return from_secret(&secret)
                .with_context(|| format!("the CA Secret {namespace}/{name} holds no usable CA"));
        }
        let ca = Ca::generate("gatehouse control plane CA");
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                labels: Some(
                    [(
                        "app.kubernetes.io/managed-by".to_string(),
                        "gatehouse".to_string(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            type_: Some("Opaque".into()),
            data: Some(
                [
                    (
                        CERT_KEY.to_string(),
                        ByteString(ca.cert_pem().as_bytes().to_vec()),
                    ),
                    (
                        KEY_KEY.to_string(),
                        ByteString(ca.key_pem().as_bytes().to_vec()),
                    ),
                ]
                .into(),
            ),
            ..Secret::default()
        };
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => {
                tracing::info!(secret = %format!("{namespace}/{name}"), "generated the control plane's CA");
                return Ok(ca);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot create the CA Secret {namespace}/{name}"));
            }
        }
    }
    anyhow::bail!("the CA Secret {namespace}/{name} keeps appearing and disappearing")
}

fn from_secret(secret: &Secret) -> anyhow::Result<Ca> {
    let field = |k: &str| -> anyhow::Result<String> {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .with_context(|| format!("no {k}"))?;
        String::from_utf8(bytes.0.clone()).with_context(|| format!("{k} is not PEM"))
    };
    Ok(Ca::from_pem(&field(CERT_KEY)?, &field(KEY_KEY)?)?)
}

/// Issues bootstrap credentials with the CA: a client certificate naming the Gateway.
pub struct CaIssuer {
    pub ca: Arc<Ca>,
    pub validity: Duration,
}

impl CredentialsIssuer for CaIssuer {
    fn issue(&self, namespace: &str, name: &str) -> Result<IssuedCredentials, String> {
        let id = DataPlaneIdentity::new(namespace, name).map_err(|e| e.to_string())?;
        let c = self.ca.issue_dataplane(&id, self.validity);
        let renew_at = c.renew_at();
        Ok(IssuedCredentials {
            cert_pem: c.cert_pem,
            key_pem: c.key_pem,
            ca_pem: c.ca_pem,
            renew_at,
        })
    }
}
