//! The disruption-budget keeper (leader only): counts each
//! DisruptionBudget over the members it selects (`herd_core::disruption`)
//! and writes the status when a count changed, woken by every change of
//! the budget or of a member it selects (a crash lowers the count at
//! once; nothing asks the budget about it). Each write re-counts on the
//! stored budget, so an approval recorded meanwhile is kept. A budget that
//! can never allow an eviction is said once, as a Warning Event, when it
//! becomes so.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use herd_core::disruption;
use herd_core::kinds::{DisruptionBudgetSpec, DisruptionBudgetStatus, EventReason, EventType, MemberSpec};

use crate::controllers::keyed::{Action, KeyedController, Watches};
use crate::events::EventRecorder;
use crate::objects::{Objects, ObjectsError, Part, now};
use crate::reflector::Reflector;

/// How often a budget is counted when nothing changes (an approval
/// lapses after `disruption::APPROVAL_TIMEOUT`).
const PASS_INTERVAL: Duration = Duration::from_secs(5);

pub struct BudgetKeeper {
    objects: Objects,
    budgets: Reflector<DisruptionBudgetSpec>,
    members: Reflector<MemberSpec>,
    events: EventRecorder,
    /// The budgets last said to be unable to allow an eviction, and why.
    warned_never: Mutex<BTreeMap<String, String>>,
}

impl BudgetKeeper {
    pub fn new(
        objects: Objects,
        budgets: Reflector<DisruptionBudgetSpec>,
        members: Reflector<MemberSpec>,
        events: EventRecorder,
    ) -> Self {
        BudgetKeeper { objects, budgets, members, events, warned_never: Mutex::default() }
    }

    /// What wakes a budget: a change of itself, or of a member it selects
    /// (as it was, or is).
    pub fn watches(&self) -> Watches {
        let budgets = self.budgets.clone();
        Watches::new().owns(&self.budgets).watches(&self.members, move |old, new| {
            budgets
                .map(|b| {
                    let selected = old.into_iter().chain(new).any(|member| disruption::selects(b, member));
                    selected.then(|| b.metadata.name.clone())
                })
                .into_iter()
                .flatten()
                .collect()
        })
    }

    /// Says, once per reason, that a budget can never allow an eviction.
    async fn warn_never(&self, budget: &herd_core::kinds::DisruptionBudget) {
        let name = &budget.metadata.name;
        let why = disruption::never_allows(budget);
        let news = {
            let mut warned = self.warned_never.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match &why {
                // Once for each reason: one that changes (no member
                // selected yet, then too few of them) is told again.
                Some(why) => warned.insert(name.clone(), why.clone()).as_ref() != Some(why),
                None => {
                    warned.remove(name);
                    false
                }
            }
        };
        if let (true, Some(why)) = (news, why) {
            self.events.record(budget, EventType::Warning, EventReason::BudgetNeverAllows, why).await;
        }
    }
}

/// Whether two statuses differ in more than when they were taken.
fn counts_differ(a: &DisruptionBudgetStatus, b: &DisruptionBudgetStatus) -> bool {
    let untimed = |s: &DisruptionBudgetStatus| DisruptionBudgetStatus { counted_at: None, ..s.clone() };
    a.counted_at.is_none() || untimed(a) != untimed(b)
}

impl KeyedController for BudgetKeeper {
    const NAME: &'static str = "disruption-budgets";

    async fn synced(&self) {
        self.budgets.synced().await;
        self.members.synced().await;
    }

    fn keys(&self) -> Vec<String> {
        self.budgets.map(|b| b.metadata.name.clone())
    }

    async fn reconcile(&self, name: &str) -> Result<Action, ObjectsError> {
        let Some(cached) = self.budgets.get_shared(name) else {
            self.warned_never.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(name);
            return Ok(Action::AwaitChange);
        };
        let members = self.members.list();
        if counts_differ(&cached.status, &disruption::count(&cached, &members, now())) {
            let written = self
                .objects
                .modify::<DisruptionBudgetSpec, ObjectsError>(name, Part::Status, |budget| {
                    let counted = disruption::count(budget, &members, now());
                    let changed = counts_differ(&budget.status, &counted);
                    budget.status = counted;
                    Ok(changed)
                })
                .await;
            match written {
                Ok(budget) => self.warn_never(&budget).await,
                Err(ObjectsError::NotFound { .. }) => return Ok(Action::AwaitChange),
                Err(other) => return Err(other),
            }
        }
        Ok(Action::Requeue(PASS_INTERVAL))
    }
}
