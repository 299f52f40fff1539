//! What the data plane reports back, folded into status: a listener whose socket is not
//! listening is not Programmed, whatever translate concluded from the objects alone.

use crate::Status;
use crate::conditions::{condition, names::*};
use crate::objects::ObjectKey;
use gatehouse_ir as ir;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Addresses of the configuration that the data plane could not bind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Serving {
    /// TCP sockets (every listener protocol but UDP).
    pub unbound: BTreeMap<SocketAddr, BindProblem>,
    /// UDP sockets (UDP listeners): a port number of their own, apart from the TCP ones.
    pub unbound_udp: BTreeMap<SocketAddr, BindProblem>,
    /// Gateways whose data plane does not serve the current configuration at all (a
    /// provisioned data plane with no replica connected, or one still applying or refusing
    /// it), with why. Every listener and the Gateway are Programmed=False Pending.
    pub not_serving: BTreeMap<ObjectKey, String>,
    /// Listener ports (with their transport) that traffic cannot reach although the data plane
    /// may listen on them: the controller's data-plane Service lacks them (its apply was
    /// refused), with why. Their listeners are Programmed=False Pending. Unlike `unbound`, not
    /// a reason for the data plane to be unready: it serves its other ports, and an unready
    /// pod would leave the Service's endpoints too.
    pub unreachable: BTreeMap<(u16, ir::Transport), String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindProblem {
    /// The operating system's error.
    pub error: String,
    /// The host cannot use the address at all (not one of its addresses); otherwise the data
    /// plane keeps retrying and may succeed (a port another process holds, say).
    pub address_not_usable: bool,
}

/// Sets Programmed=False on every listener of `config` whose address is in
/// `serving.unbound` (reason Invalid when the host cannot use the address, Pending while the
/// bind is retried; the OS error in the message) or whose port is in `serving.unreachable`
/// (Pending, with why), and on its Gateway when none of its listeners is programmed any more
/// (AddressNotUsable, or Pending).
pub fn apply(status: &mut Status, config: &ir::Config, serving: &Serving) {
    for (key, why) in &serving.not_serving {
        let Some(gw_status) = status.gateways.get_mut(key) else {
            continue;
        };
        let conditions = gw_status.conditions.get_or_insert_with(Vec::new);
        // A Gateway that is not accepted keeps its own reason.
        if !is_true(conditions, PROGRAMMED) {
            continue;
        }
        set(conditions, PROGRAMMED, PENDING, why.clone());
        for l in gw_status.listeners.iter_mut().flatten() {
            if is_true(&l.conditions, PROGRAMMED) {
                set(&mut l.conditions, PROGRAMMED, PENDING, why.clone());
            }
        }
    }
    if serving.unbound.is_empty()
        && serving.unbound_udp.is_empty()
        && serving.unreachable.is_empty()
    {
        return;
    }
    for gateway in &config.gateways {
        let key = ObjectKey::new(gateway.namespace.clone(), gateway.name.clone());
        let Some(gw_status) = status.gateways.get_mut(&key) else {
            continue;
        };
        let mut unusable: Option<String> = None;
        let mut pending: Option<String> = None;
        for listener in &gateway.listeners {
            let address = listener.socket_addr();
            let unbound = match listener.transport() {
                ir::Transport::Tcp => &serving.unbound,
                ir::Transport::Udp => &serving.unbound_udp,
            };
            let problem = unbound.get(&address);
            let unreachable = serving
                .unreachable
                .get(&(listener.port, listener.transport()));
            if problem.is_none() && unreachable.is_none() {
                continue;
            }
            let Some(l) = gw_status
                .listeners
                .iter_mut()
                .flatten()
                .find(|l| l.name == listener.name)
            else {
                continue;
            };
            let (reason, message) = if let (None, Some(why)) = (problem, unreachable) {
                let m = format!("{why}; retrying");
                pending.get_or_insert(m.clone());
                (PENDING, m)
            } else if let Some(problem) = problem.filter(|p| p.address_not_usable) {
                let m = format!(
                    "cannot listen on {address}: {} (the address is not usable on this host)",
                    problem.error
                );
                unusable.get_or_insert(m.clone());
                (INVALID, m)
            } else {
                let error = problem.map(|p| p.error.as_str()).unwrap_or_default();
                let m = format!("cannot listen on {address}: {error}; retrying");
                pending.get_or_insert(m.clone());
                (PENDING, m)
            };
            set(&mut l.conditions, PROGRAMMED, reason, message);
        }
        if unusable.is_none() && pending.is_none() {
            continue;
        }
        let listeners = gw_status.listeners.as_deref().unwrap_or_default();
        let total = listeners.len();
        let programmed = listeners
            .iter()
            .filter(|l| is_true(&l.conditions, PROGRAMMED))
            .count();
        let conditions = gw_status.conditions.get_or_insert_with(Vec::new);
        if let Some(m) = unusable {
            set(conditions, PROGRAMMED, ADDRESS_NOT_USABLE, m);
        } else if programmed == 0 {
            set(conditions, PROGRAMMED, PENDING, pending.unwrap_or_default());
        } else if is_true(conditions, PROGRAMMED) {
            // Still serving on the other listeners: say how much.
            if let Some(c) = conditions.iter_mut().find(|c| c.type_ == PROGRAMMED) {
                c.message = format!(
                    "{programmed} of {total} listeners programmed; {}",
                    pending.unwrap_or_default()
                );
            }
        }
    }
}

fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// Replaces the condition of `type_` with a False one, keeping its observedGeneration.
fn set(conditions: &mut Vec<Condition>, type_: &str, reason: &str, message: String) {
    let generation = conditions
        .iter()
        .find(|c| c.type_ == type_)
        .and_then(|c| c.observed_generation);
    let new = condition(type_, false, reason, message, generation);
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => *c = new,
        None => conditions.push(new),
    }
}
