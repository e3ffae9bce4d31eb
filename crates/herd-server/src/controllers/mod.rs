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
use crate::reflector::Reflector;
use herd_core::kinds::{ClusterConfigSpec, NodeSpec};

/// Starts every controller; they stop when `stop` is cancelled.
pub fn start(
    objects: Objects,
    config: Reflector<ClusterConfigSpec>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> JoinSet<()> {
    let mut set = JoinSet::new();
    let events = EventRecorder::new(objects.clone(), "node-lifecycle");
    let nodes = Reflector::<NodeSpec>::start(objects.store().clone(), stop.clone());
    set.spawn(compactor::run(objects.store().clone(), stop.clone()));
    set.spawn(event_ttl::run(objects.clone(), stop.clone()));
    set.spawn(node_lifecycle::run(objects, nodes, config, events, metrics, stop));
    set
}
