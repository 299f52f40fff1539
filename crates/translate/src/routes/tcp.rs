//! TCPRoute: a TCP listener forwards every connection to one of the rule's weighted
//! backends. One rule (the v1 CRD allows no more), no hostnames, no matches.

use super::l4::{self, L4BackendRef};
use super::{
    ParentRef, RouteKind, RouteRule, RouteStatus, RuleCtx, parent_ref_from, route_status_from,
};
use crate::generated::tcproutes::{
    TcpRoute, TcpRouteParentRefs, TcpRouteStatus, TcpRouteStatusParentsParentRef,
};
use gatehouse_ir as ir;

parent_ref_from!(TcpRouteParentRefs, TcpRouteStatusParentsParentRef);
route_status_from!(TcpRouteStatus);

impl RouteKind for TcpRoute {
    const PROTOCOLS: &'static [&'static str] = &["TCP"];

    fn parent_refs(&self) -> Vec<ParentRef> {
        self.spec
            .parent_refs
            .iter()
            .flatten()
            .map(Into::into)
            .collect()
    }

    fn hostnames(&self) -> &[String] {
        &[]
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
                let refs = rule.backend_refs.iter().map(|b| L4BackendRef {
                    group: b.group.as_deref(),
                    kind: b.kind.as_deref(),
                    name: &b.name,
                    namespace: b.namespace.as_deref(),
                    port: b.port,
                    weight: b.weight,
                });
                l4::rule(ctx, index, refs, ir::Transport::Tcp)
            })
            .collect()
    }
}
