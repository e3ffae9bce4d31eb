//! The node-lifecycle controller: marks a node NotReady, with an Event,
//! when its heartbeats stop for longer than the grace period.
//!
//! Silence is measured on this process's monotonic clock from when it last
//! saw the node's heartbeat change (see `herd_core::node_health`). A freshly
//! started controller therefore gives every node a full grace period.

use std::sync::Arc;
use std::time::Duration;

use herd_core::Timestamp;
use herd_core::kinds::{ClusterConfigSpec, EventReason, EventType, Node, NodeSpec};
use herd_core::node_health::{self, ReadinessChange};
use tokio::time::Instant;

use crate::change_clock::ChangeClock;
use crate::controllers::runtime::{Controller, Next, Trigger};
use crate::events::EventRecorder;
use crate::metrics::Metrics;
use crate::nodes::cluster_config;
use crate::objects::ObjectsError;
use crate::objects::{Objects, Part, now};
use crate::reflector::Reflector;

/// How often the controller looks at every node.
const PASS_INTERVAL: Duration = Duration::from_millis(500);

/// When this controller last saw each node's heartbeat change.
type Sightings = ChangeClock<Option<Timestamp>>;

/// Marks nodes NotReady when their heartbeats stop (leader only).
pub struct NodeLifecycle {
    pub objects: Objects,
    pub nodes: Reflector<NodeSpec>,
    pub config: Reflector<ClusterConfigSpec>,
    pub events: EventRecorder,
    pub metrics: Arc<Metrics>,
    sightings: Sightings,
}

impl NodeLifecycle {
    pub fn new(
        objects: Objects,
        nodes: Reflector<NodeSpec>,
        config: Reflector<ClusterConfigSpec>,
        events: EventRecorder,
        metrics: Arc<Metrics>,
    ) -> Self {
        NodeLifecycle { objects, nodes, config, events, metrics, sightings: Sightings::default() }
    }
}

impl Controller for NodeLifecycle {
    const NAME: &'static str = "node-lifecycle";

    async fn synced(&self) {
        self.nodes.synced().await;
        self.config.synced().await;
    }

    /// None: silence is what it looks for, so it looks on its own schedule.
    fn triggers(&self) -> Vec<Trigger> {
        Vec::new()
    }

    async fn reconcile(&mut self) -> Result<Next, ObjectsError> {
        let grace = cluster_config(&self.config).node_grace_period.get();
        let nodes = self.nodes.list();
        pass(&self.objects, &self.events, &self.metrics, &mut self.sightings, &nodes, grace).await?;
        Ok(Next::Requeue(PASS_INTERVAL))
    }
}

async fn pass(
    objects: &Objects,
    events: &EventRecorder,
    metrics: &Metrics,
    sightings: &mut Sightings,
    nodes: &[Node],
    grace: Duration,
) -> Result<(), ObjectsError> {
    let now_mono = Instant::now();
    sightings.retain(|name| nodes.iter().any(|n| n.metadata.name == name));
    let mut ready = 0;
    for node in nodes {
        let heartbeat = node.status.last_heartbeat;
        let silent_for = sightings.since(&node.metadata.name, heartbeat, now_mono);
        match node_health::readiness_change(node.status.ready, silent_for, grace) {
            ReadinessChange::Unchanged => ready += usize::from(node.status.ready),
            ReadinessChange::MarkNotReady { silent_for } => {
                mark_not_ready(objects, events, &node.metadata.name, heartbeat, silent_for, grace).await?
            }
        }
    }
    metrics.observe_nodes(ready, nodes.len() - ready);
    Ok(())
}

async fn mark_not_ready(
    objects: &Objects,
    events: &EventRecorder,
    name: &str,
    seen_heartbeat: Option<Timestamp>,
    silent_for: Duration,
    grace: Duration,
) -> Result<(), ObjectsError> {
    let mut message = String::new();
    let written = objects
        .modify::<NodeSpec, ObjectsError>(name, Part::Status, |node| {
            // A heartbeat that arrived meanwhile wins.
            if node.status.last_heartbeat != seen_heartbeat || !node.status.ready {
                return Ok(false);
            }
            message = node_health::mark_not_ready(&mut node.status, silent_for, grace, now());
            Ok(true)
        })
        .await;
    match written {
        Ok(node) if !message.is_empty() => {
            events.record(&node, EventType::Warning, EventReason::NodeNotReady, message).await;
            Ok(())
        }
        Ok(_) | Err(ObjectsError::NotFound { .. }) => Ok(()),
        Err(other) => Err(other),
    }
}
