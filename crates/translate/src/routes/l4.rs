//! What TCPRoute and UDPRoute share: a rule is a list of weighted backendRefs to Service ports
//! of the route's transport, forwarded as they are.

use super::{RouteRule, RuleCtx};
use crate::backends::BackendRef;
use gatehouse_ir as ir;

/// One backendRef as both kinds' generated types spell it.
pub(super) struct L4BackendRef<'a> {
    pub group: Option<&'a str>,
    pub kind: Option<&'a str>,
    pub name: &'a str,
    pub namespace: Option<&'a str>,
    pub port: Option<i32>,
    pub weight: Option<i32>,
}

/// A rule of weighted backends. Invalid backendRefs keep their weight (their share of the
/// connections is refused), as the spec asks of every route kind.
pub(super) fn rule<'a>(
    ctx: &mut RuleCtx<'_, '_>,
    index: usize,
    refs: impl Iterator<Item = L4BackendRef<'a>>,
    transport: ir::Transport,
) -> Result<RouteRule, String> {
    let backends = refs
        .map(|b| ir::WeightedBackend {
            weight: u32::try_from(b.weight.unwrap_or(1)).unwrap_or(0),
            target: ctx.l4_backend(
                &BackendRef {
                    group: b.group,
                    kind: b.kind,
                    name: b.name,
                    namespace: b.namespace,
                    port: b.port,
                },
                transport,
            ),
            filters: Vec::new(),
        })
        .collect();
    Ok(RouteRule::L4 {
        route: ctx.route_ref(index),
        backends,
    })
}
