//! TLSRoute: SNI routing on TLS listeners, each rule a set of weighted backends.

use super::{
    ParentRef, RouteKind, RouteRule, RouteStatus, RuleCtx, parent_ref_from, route_status_from,
};
use crate::backends::backend_ref_of;
use gatehouse_ir as ir;
use gateway_api::apis::standard::tlsroutes::{
    TlsRoute, TlsRouteParentRefs, TlsRouteStatus, TlsRouteStatusParentsParentRef,
};

parent_ref_from!(TlsRouteParentRefs, TlsRouteStatusParentsParentRef);
route_status_from!(TlsRouteStatus);

impl RouteKind for TlsRoute {
    const PROTOCOLS: &'static [&'static str] = &["TLS"];

    fn parent_refs(&self) -> Vec<ParentRef> {
        self.spec
            .parent_refs
            .iter()
            .flatten()
            .map(Into::into)
            .collect()
    }

    fn hostnames(&self) -> &[String] {
        &self.spec.hostnames
    }

    fn carried_status(&self) -> Option<RouteStatus> {
        self.status.as_ref().map(Into::into)
    }

    fn rules(&self, ctx: &mut RuleCtx<'_, '_>) -> Vec<Result<RouteRule, String>> {
        self.spec
            .rules
            .iter()
            .enumerate()
            .map(|(index, rule)| {
                let backends = rule
                    .backend_refs
                    .iter()
                    .map(|b| ir::WeightedBackend {
                        weight: u32::try_from(b.weight.unwrap_or(1)).unwrap_or(0),
                        target: ctx.backend(&backend_ref_of!(b)).target,
                        filters: Vec::new(),
                    })
                    .collect();
                Ok(RouteRule::Tls {
                    route: ctx.route_ref(index),
                    backends,
                })
            })
            .collect()
    }
}
