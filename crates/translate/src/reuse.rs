//! Work kept between passes: translation that follows the change.
//!
//! Most of a pass is each route's own work: its rules translated, its backendRefs resolved,
//! its listeners selected, its conditions written ([`crate::routes::RouteWork`]). That work
//! reads the route and the objects around it, never the other routes. So when the objects
//! around the routes read the same as in the last pass ([`Input::same_to_translate`] for
//! every kind that is not a route, and the same [`Options`]), a route that is the same object
//! as in the last pass (the stores keep an unchanged object behind the same `Arc`) has the same
//! work, and the pass takes it instead of doing it again. Anything else (a Gateway, a Service,
//! a ReferenceGrant changed) and every route's work is done afresh.
//!
//! What a pass builds from the work (attachments, attachedRoutes, the cluster registrations
//! its backend resolutions make, status, precedence, the listeners' tables) is still built
//! every pass, from all routes, in the same order as without reuse: the output is the one a
//! translation from nothing gives, which `tests/reuse.rs` checks over random sequences of
//! changes.

use crate::Options;
use crate::kinds::{Input, Kind, KindVisitor, for_each_kind};
use crate::routes::{Memo, RouteKind};
use foldhash::HashMap;
use std::sync::Arc;

/// What [`crate::translate_reusing`] keeps from one pass to the next. Starts empty; a pass
/// that cannot reuse anything simply fills it.
#[derive(Default)]
pub struct Reuse {
    /// The last pass's input and options: what the kept work was done against. The input is
    /// held, not only compared, so that no route the memo names by address can be freed and
    /// its address given to a new object.
    last: Option<(Input, Options)>,
    routes: RouteMemo,
}

/// How much of a pass's route work was reused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reused {
    pub routes: usize,
    pub worked: usize,
}

impl Reuse {
    /// Called before a pass: drops the kept work unless everything around the routes reads
    /// as it did in the last pass.
    pub(crate) fn begin(&mut self, input: &Input, options: &Options) -> &mut RouteMemo {
        let holds = self
            .last
            .as_ref()
            .is_some_and(|(last, o)| o == options && same_around_routes(last, input));
        if !holds {
            self.routes.previous.clear();
        }
        self.routes.reused = Reused::default();
        &mut self.routes
    }

    /// Called after a pass: what it worked out is what the next pass may take.
    pub(crate) fn end(&mut self, input: &Input, options: &Options) {
        // Swapped, not replaced: both maps keep their room, so a pass allocates no table.
        // What the pass did not take (routes that are gone) goes with the clear.
        std::mem::swap(&mut self.routes.previous, &mut self.routes.next);
        self.routes.next.clear();
        match &mut self.last {
            Some((last, o)) => {
                last.clone_from(input);
                o.clone_from(options);
            }
            None => self.last = Some((input.clone(), options.clone())),
        }
    }

    /// How much the last pass reused.
    pub fn reused(&self) -> Reused {
        self.routes.reused
    }
}

/// Each route's [`Memo`] by the address of its object.
#[derive(Default)]
pub struct RouteMemo {
    previous: HashMap<usize, Memo>,
    next: HashMap<usize, Memo>,
    reused: Reused,
}

fn address<R>(route: &Arc<R>) -> usize {
    Arc::as_ptr(route) as *const () as usize
}

impl RouteMemo {
    /// The route's memo from the last pass, if it is the same object and the memo holds.
    pub(crate) fn take<R: RouteKind>(&mut self, route: &Arc<R>) -> Option<Memo> {
        let memo = self.previous.remove(&address(route));
        match memo {
            Some(_) => self.reused.routes += 1,
            None => self.reused.worked += 1,
        }
        memo
    }

    /// Keeps the route's memo for the next pass.
    pub(crate) fn keep<R: RouteKind>(&mut self, route: &Arc<R>, memo: Memo) {
        self.next.insert(address(route), memo);
    }
}

/// Whether every kind a route's work reads ([`Kind::READ_BY_ROUTE_WORK`]) reads the same to
/// translate in `a` and `b`. The kinds that do not: the routes themselves, and EndpointSlices,
/// which only fill a cluster that a pass registers afresh from the current slices the first
/// time a route resolves to it (a reused route's calls are made again for that:
/// [`crate::routes`]). So pods coming and going, the most frequent change in a cluster, leave
/// every route's work as it was.
fn same_around_routes(a: &Input, b: &Input) -> bool {
    struct Visit<'i> {
        a: &'i Input,
        b: &'i Input,
        same: bool,
    }
    impl KindVisitor for Visit<'_> {
        fn visit<K: Kind>(&mut self) {
            if self.same && K::READ_BY_ROUTE_WORK {
                self.same = crate::kinds::same_objects(K::of(self.a), K::of(self.b));
            }
        }
    }
    let mut visit = Visit { a, b, same: true };
    for_each_kind(&mut visit);
    visit.same
}
