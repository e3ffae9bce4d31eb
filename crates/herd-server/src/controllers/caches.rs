//! [`Caches`]: the reflectors the leader's controllers share, one per
//! kind, started the first time a controller asks for its kind (each
//! write decoded once, not once per controller). What follows from the
//! kinds' descriptors is derived here: the configuration keeper wakes on
//! a change of any kind that is replicated.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use herd_core::Resource;
use herd_core::kinds::KindVisitor;
use herd_store::Store;
use tokio_util::sync::CancellationToken;

use crate::controllers::runtime::Trigger;
use crate::reflector::Reflector;

#[derive(Clone)]
pub struct Caches {
    store: Store,
    stop: CancellationToken,
    by_kind: Arc<Mutex<HashMap<&'static str, Box<dyn Any + Send + Sync>>>>,
}

impl Caches {
    pub fn new(store: Store, stop: CancellationToken) -> Self {
        Caches { store, stop, by_kind: Arc::default() }
    }

    /// Shares a reflector started elsewhere (the replica's own caches).
    pub fn with<S: Resource>(self, reflector: Reflector<S>) -> Self {
        self.kinds().insert(S::KIND, Box::new(reflector));
        self
    }

    fn kinds(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, Box<dyn Any + Send + Sync>>> {
        self.by_kind.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The reflector of kind `S`, started if none is yet.
    pub fn of<S: Resource>(&self) -> Reflector<S> {
        let mut kinds = self.kinds();
        if let Some(reflector) = kinds.get(S::KIND).and_then(|any| any.downcast_ref::<Reflector<S>>()) {
            return reflector.clone();
        }
        let reflector = Reflector::<S>::start(self.store.clone(), self.stop.clone());
        kinds.insert(S::KIND, Box::new(reflector.clone()));
        reflector
    }

    /// A trigger for each kind its descriptor says is replicated: the
    /// changes that matter of each (a Node's heartbeat time does not).
    pub fn replicated(&self) -> Vec<Trigger> {
        struct Replicated<'a>(&'a Caches, Vec<Trigger>);
        impl KindVisitor for Replicated<'_> {
            fn visit<S: Resource>(&mut self) {
                if S::REPLICATED {
                    self.1.push(self.0.of::<S>().changes_that_matter());
                }
            }
        }
        let mut triggers = Replicated(self, Vec::new());
        herd_core::kinds::visit(&mut triggers);
        triggers.1
    }
}
