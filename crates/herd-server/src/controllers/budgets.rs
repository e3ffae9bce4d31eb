//! The disruption-budget keeper (leader only): counts each
//! DisruptionBudget over the members it selects (`herd_core::disruption`)
//! and writes the status when a count changed, woken by every change of a
//! budget or a member (a crash lowers the count at once; nothing asks the
//! budget about it). Each write re-counts on the stored budget, so an
//! approval recorded meanwhile is kept. A budget that can never allow an
//! eviction is said once, as a Warning Event, when it becomes so.

use std::collections::BTreeMap;
use std::time::Duration;

use herd_core::disruption;
use herd_core::kinds::{DisruptionBudgetSpec, DisruptionBudgetStatus, EventReason, EventType, MemberSpec};

use crate::controllers::runtime::{Controller, Next};
use crate::events::EventRecorder;
use crate::objects::{Objects, ObjectsError, Part, now};
use crate::reflector::Reflector;

/// How often the counts are taken when nothing changes (an approval
/// lapses after `disruption::APPROVAL_TIMEOUT`).
const PASS_INTERVAL: Duration = Duration::from_secs(5);

pub struct BudgetKeeper {
    objects: Objects,
    budgets: Reflector<DisruptionBudgetSpec>,
    members: Reflector<MemberSpec>,
    events: EventRecorder,
    /// The budgets last said to be unable to allow an eviction, and why.
    warned_never: BTreeMap<String, String>,
}

impl BudgetKeeper {
    pub fn new(
        objects: Objects,
        budgets: Reflector<DisruptionBudgetSpec>,
        members: Reflector<MemberSpec>,
        events: EventRecorder,
    ) -> Self {
        BudgetKeeper { objects, budgets, members, events, warned_never: BTreeMap::new() }
    }
}

/// Whether two statuses differ in more than when they were taken.
fn counts_differ(a: &DisruptionBudgetStatus, b: &DisruptionBudgetStatus) -> bool {
    let untimed = |s: &DisruptionBudgetStatus| DisruptionBudgetStatus { counted_at: None, ..s.clone() };
    a.counted_at.is_none() || untimed(a) != untimed(b)
}

impl Controller for BudgetKeeper {
    const NAME: &'static str = "disruption-budgets";

    async fn synced(&self) {
        self.budgets.synced().await;
        self.members.synced().await;
    }

    async fn reconcile(&mut self) -> Result<Next, ObjectsError> {
        let budgets = self.budgets.list();
        self.warned_never.retain(|name, _| budgets.iter().any(|b| &b.metadata.name == name));
        if budgets.is_empty() {
            // Every member change wakes this: with no budget, nothing to copy.
            return Ok(Next::Requeue(PASS_INTERVAL));
        }
        let members = self.members.list();
        for cached in budgets {
            if !counts_differ(&cached.status, &disruption::count(&cached, &members, now())) {
                continue;
            }
            let written = self
                .objects
                .modify::<DisruptionBudgetSpec, ObjectsError>(&cached.metadata.name, Part::Status, |budget| {
                    let counted = disruption::count(budget, &members, now());
                    let changed = counts_differ(&budget.status, &counted);
                    budget.status = counted;
                    Ok(changed)
                })
                .await;
            let budget = match written {
                Ok(budget) => budget,
                Err(ObjectsError::NotFound { .. }) => continue,
                Err(other) => return Err(other),
            };
            match disruption::never_allows(&budget) {
                // Once for each reason: one that changes (no member
                // selected yet, then too few of them) is told again.
                Some(why) if self.warned_never.get(&budget.metadata.name) != Some(&why) => {
                    self.warned_never.insert(budget.metadata.name.clone(), why.clone());
                    self.events.record(&budget, EventType::Warning, EventReason::BudgetNeverAllows, why).await;
                }
                Some(_) => {}
                None => {
                    self.warned_never.remove(&budget.metadata.name);
                }
            }
        }
        Ok(Next::Requeue(PASS_INTERVAL))
    }
}
