//! Members of lost nodes, and members the operator asked to replace
//! (`herd_core::node_loss`): replaced ones are unbound and start over as
//! new members (the others told they left); those that keep data on a
//! lost node say what `herd member replace` would cost. Whatever still
//! runs on the old node is removed there as a stray once it is back.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use herd_core::kinds::{AppSpec, EventReason, EventType};
use herd_core::node_loss::{NodeLoss, Recovery, recovery, replaced_status};
use herd_core::notifies::{Change, queue_notifies};
use tokio::time::Instant;

use super::{AppClusterController, Nodes, Pass};
use crate::nodes::cluster_config;
use crate::objects::{ObjectsError, now};

impl AppClusterController {
    /// How long each node has been NotReady, as this leader saw it.
    /// How long each of `bound` (the nodes a cluster's members are on)
    /// has been NotReady, as this leader saw it: a node's change wakes the
    /// clusters with members on it, so it is seen when it happens.
    pub(super) fn not_ready_for<'a>(
        &self,
        bound: impl IntoIterator<Item = &'a str>,
        nodes: &Nodes,
    ) -> BTreeMap<String, Duration> {
        let now = Instant::now();
        let names: BTreeSet<&str> = bound.into_iter().collect();
        let mut clock = self.readiness.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // Nodes that are gone are forgotten once the clock holds more than there are.
        if clock.len() > nodes.list.len() {
            clock.retain(|name| nodes.get(name).is_some());
        }
        names
            .into_iter()
            .filter_map(|name| {
                let ready = nodes.get(name)?.status.ready;
                let held = clock.since(name, ready, now);
                (!ready).then(|| (name.to_string(), held))
            })
            .collect()
    }

    pub(super) async fn recover_members(&self, pass: &mut Pass<'_>, app: &AppSpec) -> Result<(), ObjectsError> {
        let grace = cluster_config(&self.config).app_clusters.node_loss_grace.get();
        for i in 0..pass.members.len() {
            let member = &pass.members[i];
            let Some(node) = member.spec.node.clone() else { continue };
            let Some(role) = app.role(&member.spec.role) else { continue };
            let mut persistent: Vec<String> = role.run.persistent_volumes().map(str::to_string).collect();
            if !persistent.is_empty() {
                persistent.push(herd_core::kinds::app::HERD_VOLUME.into());
            }
            let loss = NodeLoss { node: &node, not_ready_for: pass.not_ready.get(&node).copied(), grace };
            let asked = member.spec.requests.replace.is_some();
            match recovery(&member.metadata.name, &member.status, &persistent, loss, asked) {
                Recovery::Nothing => {}
                Recovery::WaitForReplace(why) => {
                    if member.status.reason.as_deref() != Some(why.as_str()) {
                        self.events
                            .record(member, EventType::Warning, EventReason::MemberWaitsForReplace, why.clone())
                            .await;
                        pass.members[i].status.reason = Some(why);
                    }
                }
                Recovery::Replace(why) => self.replace(pass, i, app, why).await?,
            }
        }
        Ok(())
    }

    /// Starts member `i` over as a new member and unbinds it (the request
    /// goes with the binding); the others hear it left.
    async fn replace(&self, pass: &mut Pass<'_>, i: usize, app: &AppSpec, why: String) -> Result<(), ObjectsError> {
        let mut member = pass.members[i].clone();
        let announced = member.status.was_configured();
        // The status first: no reader sees the new binding with the old state.
        let from = member.spec.node.clone().unwrap_or_default();
        member.status = replaced_status(why.clone(), &from, &member.status);
        let mut unbound = self.objects.update_status(member, false).await?;
        unbound.spec.node = None;
        unbound.spec.ports.clear();
        unbound.spec.requests.replace = None;
        let written = self.objects.update(unbound, false).await?;
        self.events.record(&written, EventType::Warning, EventReason::MemberReplaced, why).await;
        let left = [(written.spec.role.clone(), written.metadata.name.clone())];
        pass.members[i] = written;
        if announced {
            queue_notifies(app, &mut pass.members, Change::Deleted, &left, now());
        }
        Ok(())
    }
}
