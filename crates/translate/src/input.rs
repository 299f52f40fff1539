//! The typed objects translate reads: one consistent snapshot of the store.

use gateway_api::apis::standard::{
    backendtlspolicies::BackendTlsPolicy, gatewayclasses::GatewayClass, gateways::Gateway,
    httproutes::HttpRoute, referencegrants::ReferenceGrant, tlsroutes::TlsRoute,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// Everything translate needs to compute the IR and every status. Order does not matter:
/// translate sorts what it reads, so the same objects always give the same output.
#[derive(Clone, Debug, Default)]
pub struct Input {
    pub gateway_classes: Vec<GatewayClass>,
    pub gateways: Vec<Gateway>,
    pub http_routes: Vec<HttpRoute>,
    pub reference_grants: Vec<ReferenceGrant>,
    pub services: Vec<Service>,
    pub endpoint_slices: Vec<EndpointSlice>,
    pub namespaces: Vec<Namespace>,
    pub tls_routes: Vec<TlsRoute>,
    pub backend_tls_policies: Vec<BackendTlsPolicy>,
    /// Only the Secrets that Gateways reference need to be here (certificates).
    pub secrets: Vec<Secret>,
    /// Only the ConfigMaps that Gateways and policies reference need to be here (CA bundles).
    pub config_maps: Vec<ConfigMap>,
}
