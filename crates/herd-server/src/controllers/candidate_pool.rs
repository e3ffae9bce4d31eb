//! The candidate-pool keeper (leader only): promotes eligible nodes while
//! the pool has fewer candidates than min(candidatePoolSize, eligible
//! nodes), after a demotion, a drained or offline node, a new node, or a
//! larger pool size (`herd_core::roles::fill_pool`, spreading over zones).
//! A pool above its size only warns (an Event on the ClusterConfig), once
//! per size: nobody is demoted.
//! It also says which node is the master's: this leader's own node
//! (`herd server --node`) gets `status.master`, every other loses it, and
//! that node is promoted first (the master's node is always a candidate).

use std::time::Duration;

use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{ClusterConfigSpec, EventReason, EventType, NodeRole, NodeSpec};
use herd_core::roles::{NodeFacts, fill_pool};

use crate::controllers::runtime::{Controller, Next, Trigger};
use crate::events::EventRecorder;
use crate::nodes::cluster_config;
use crate::objects::{Objects, ObjectsError, Part};
use crate::reflector::Reflector;

/// How often the pool is looked at when nothing wakes the keeper sooner.
const PASS_INTERVAL: Duration = Duration::from_secs(5);

pub struct CandidatePool {
    pub objects: Objects,
    pub nodes: Reflector<NodeSpec>,
    pub config: Reflector<ClusterConfigSpec>,
    pub events: EventRecorder,
    /// The pool size last warned about being exceeded.
    warned_above: Option<usize>,
    /// This leader's node, the master's.
    master_node: Option<String>,
}

impl CandidatePool {
    pub fn new(
        objects: Objects,
        nodes: Reflector<NodeSpec>,
        config: Reflector<ClusterConfigSpec>,
        events: EventRecorder,
        master_node: Option<String>,
    ) -> Self {
        CandidatePool { objects, nodes, config, events, warned_above: None, master_node }
    }

    /// Sets `status.master` on this leader's node and clears it elsewhere.
    async fn mark_master(&self) -> Result<(), ObjectsError> {
        let me = self.master_node.as_deref();
        let wrong: Vec<(String, bool)> = self
            .nodes
            .map(|n| {
                let master = me == Some(n.metadata.name.as_str());
                (n.status.master != master).then(|| (n.metadata.name.clone(), master))
            })
            .into_iter()
            .flatten()
            .collect();
        for (name, master) in wrong {
            self.objects
                .modify::<NodeSpec, ObjectsError>(&name, Part::Status, |n| {
                    let changed = n.status.master != master;
                    n.status.master = master;
                    Ok(changed)
                })
                .await?;
        }
        Ok(())
    }
}

impl Controller for CandidatePool {
    const NAME: &'static str = "candidate-pool";

    async fn synced(&self) {
        self.nodes.synced().await;
        self.config.synced().await;
    }

    /// Any change of a node (its heartbeat too: a candidate's copy of the
    /// configuration it reports) or of the pool's size.
    fn triggers(&self) -> Vec<Trigger> {
        vec![self.nodes.changes(), self.config.changes()]
    }

    async fn reconcile(&mut self) -> Result<Next, ObjectsError> {
        let pool = cluster_config(&self.config).candidate_pool_size as usize;
        // Woken by every heartbeat: decided from the cache, without copying
        // it, and the store read (every node and member) only when someone
        // is due.
        let facts: Vec<NodeFacts> = self.nodes.map(|n| NodeFacts::of(n, Vec::new()));
        let master = self.nodes.map(|n| n.status.master.then(|| n.metadata.name.clone())).into_iter().flatten().next();
        let candidates = facts.iter().filter(|n| n.role == NodeRole::Candidate).count();
        if candidates > pool && self.warned_above != Some(pool) {
            let message = format!(
                "{candidates} master candidates, more than candidatePoolSize {pool}: none is demoted by itself (`herd node modify NAME --role regular`)"
            );
            tracing::warn!(candidates, pool, "{message}");
            if let Some(config) = self.config.get(CLUSTER_CONFIG_NAME) {
                self.events.record(&config, EventType::Warning, EventReason::CandidatePoolAboveSize, message).await;
            }
            self.warned_above = Some(pool);
        }
        self.mark_master().await?;
        if !fill_pool(&facts, pool, master.as_deref()).is_empty() {
            crate::node_roles::keep_pool_full(&self.objects, &self.events, pool).await?;
        }
        Ok(Next::Requeue(PASS_INTERVAL))
    }
}
