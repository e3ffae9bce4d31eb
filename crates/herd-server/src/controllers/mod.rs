//! Controllers: background loops that move observed state toward desired
//! state. Each runs until its cancellation token fires; leader election
//! (a later capability) will start and stop them as leadership comes and
//! goes, which is why they take a token and keep no state that outlives it.

pub mod compactor;
pub mod event_ttl;
pub mod node_lifecycle;

use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::events::EventRecorder;
use crate::metrics::Metrics;
use crate::objects::Objects;

/// Starts every controller; they stop when `stop` is cancelled.
pub fn start(objects: Objects, metrics: Arc<Metrics>, stop: CancellationToken) -> JoinSet<()> {
    let mut set = JoinSet::new();
    let events = EventRecorder::new(objects.clone(), "node-lifecycle");
    set.spawn(compactor::run(objects.store().clone(), stop.clone()));
    set.spawn(event_ttl::run(objects.clone(), stop.clone()));
    set.spawn(node_lifecycle::run(objects, events, metrics, stop));
    set
}
