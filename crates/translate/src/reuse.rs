//! Work kept between passes: translation that follows the change.
//!
//! Most of a pass is each route's own work: its rules translated, its backendRefs resolved,
//! its listeners selected, its conditions written ([`crate::routes::RouteWork`]). That work
//! reads the route and the objects around it, never the other routes. So when the objects
//! around the routes read the same as in the last pass ([`Input::same_to_translate`] for
//! every kind that is not a route, and the same [`Options`]), a route that is the same object
//! as in the last pass (the stores keep an unchanged object behind the same `Arc`) has the same
//! work, and the pass takes it instead of doing it again. A changed Service undoes only the work
//! of the routes whose backendRefs name it ([`crate::kinds::ReadByRouteWork::Named`]); anything
//! else (a Gateway, a ReferenceGrant, a policy changed) and every route's work is done afresh.
//!
//! What a pass builds from the work (attachments, attachedRoutes, the cluster registrations
//! its backend resolutions make, status, precedence, the listeners' tables) is still built
//! every pass, from all routes, in the same order as without reuse: the output is the one a
//! translation from nothing gives, which `tests/reuse.rs` checks over random sequences of
//! changes.

use crate::Options;
use crate::kinds::{
    Input, Kind, KindVisitor, ReadByRouteWork, by_key, for_each_kind, same_objects,
};
use crate::routes::{Memo, RouteKind};
use foldhash::{HashMap, HashSet};
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
        let around = match &self.last {
            Some((last, o)) if o == options => around_routes(last, input),
            _ => Around::Changed,
        };
        match around {
            Around::Same => {}
            Around::Named(names) => {
                self.routes
                    .previous
                    .retain(|_, memo| !memo.names_any(&names));
            }
            Around::Changed => self.routes.previous.clear(),
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

/// What changed around the routes since the last pass, as their work reads it.
enum Around<'i> {
    /// Nothing a route's work reads.
    Same,
    /// Only objects of kinds read by name ([`ReadByRouteWork::Named`]): these (namespace,
    /// name). Work whose backendRefs name none of them still holds.
    Named(HashSet<(&'i str, &'i str)>),
    /// Something any route's work may read.
    Changed,
}

/// Compares the kinds a route's work reads ([`Kind::READ_BY_ROUTE_WORK`]) in the last pass's
/// input `a` and this one's `b`. Not the routes themselves, nor EndpointSlices, which only fill
/// a cluster that a pass registers afresh from the current slices the first time a route
/// resolves to it (a reused route's calls are made again for that: [`crate::routes`]). So pods
/// coming and going, the most frequent change in a cluster, leave every route's work as it
/// was; and a Service changed undoes only the work of the routes that name it.
fn around_routes<'i>(a: &'i Input, b: &'i Input) -> Around<'i> {
    struct Visit<'i> {
        a: &'i Input,
        b: &'i Input,
        around: Around<'i>,
    }
    impl<'i> KindVisitor for Visit<'i> {
        fn visit<K: Kind>(&mut self) {
            if matches!(self.around, Around::Changed) {
                return;
            }
            let (a, b) = (K::of(self.a), K::of(self.b));
            match K::READ_BY_ROUTE_WORK {
                ReadByRouteWork::None => {}
                ReadByRouteWork::All => {
                    if !same_objects(a, b) {
                        self.around = Around::Changed;
                    }
                }
                ReadByRouteWork::Named if same_objects(a, b) => {}
                ReadByRouteWork::Named => match (changed_names(a, b), &mut self.around) {
                    (Some(changed), Around::Named(names)) => names.extend(changed),
                    (Some(changed), _) => {
                        self.around = Around::Named(changed.into_iter().collect())
                    }
                    (None, _) => self.around = Around::Changed,
                },
            }
        }
    }
    let mut visit = Visit {
        a,
        b,
        around: Around::Same,
    };
    for_each_kind(&mut visit);
    visit.around
}

/// The (namespace, name) of every object that is in only one of `a` and `b`, or in both but
/// reads otherwise. `None` when a list holds one name twice (a folder of files may; which one
/// counts is translate's to decide, so every route is worked out again).
fn changed_names<'i, K: Kind>(a: &'i [Arc<K>], b: &'i [Arc<K>]) -> Option<Vec<(&'i str, &'i str)>> {
    let (before, now) = (by_key(a)?, by_key(b)?);
    let changed = before
        .iter()
        .filter(|(key, x)| {
            !now.get(*key)
                .is_some_and(|y| std::ptr::eq(**x, *y) || x.same_to_translate(y))
        })
        .map(|(key, _)| *key)
        .chain(now.keys().filter(|key| !before.contains_key(*key)).copied())
        .collect();
    Some(changed)
}
