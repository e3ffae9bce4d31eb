//! The budget invariant, from the store's watch history of the members:
//! no voluntary disruption takes the budget below its minimum. A
//! disruption is granted in the revision that writes a request (restart,
//! replace, move) on a member that had none; at that revision, counted as
//! herd counts (`herd_core::disruption`: a ready member counts as healthy
//! unless a disruption granted to it has not yet taken it down), a healthy
//! member may be disrupted only while the others healthy are at least the
//! budget's desired number. A crash only lowers the count: it is never
//! asked about.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herd_client::Client;
use herd_core::api::{StatusReason, WatchEventType};
use herd_core::disruption::APPROVAL_TIMEOUT;
use herd_core::kinds::{DisruptionBudget, DisruptionBudgetSpec, Member, MemberState};

use super::report::Seen;

const BUDGET: &str = "etcd-quorum";

/// A member as the history has it so far.
#[derive(Clone, Debug)]
struct Slot {
    ready: bool,
    requested: bool,
    expected: bool,
    /// When a disruption was granted to it while it was ready, if it has
    /// not been seen down since.
    granted_up: Option<Instant>,
}

impl Slot {
    /// As herd counts it: a grant stops counting once it has lapsed
    /// (`APPROVAL_TIMEOUT`), as the member never went down.
    fn healthy(&self, now: Instant) -> bool {
        let granted = self.granted_up.is_some_and(|at| now.duration_since(at) < APPROVAL_TIMEOUT);
        self.expected && self.ready && !granted
    }
}

#[derive(Default)]
struct Findings {
    grants: u32,
    violation: Option<Seen>,
}

/// Follows the members' history in the background until dropped.
pub struct Watcher {
    seen: Arc<Mutex<Findings>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watcher {
    pub async fn start(admin: &Client, clock: Instant) -> anyhow::Result<Watcher> {
        let budget = admin.get::<DisruptionBudgetSpec>(BUDGET).await?;
        let selector = budget.spec.selector.clone();
        let listed = admin.list_values("members", &selector).await?;
        let mut history = History { budget, slots: BTreeMap::new() };
        for object in listed.items {
            history.apply(WatchEventType::Added, object, Instant::now());
        }
        let seen: Arc<Mutex<Findings>> = Arc::default();
        let mut following = admin.follow("members", &listed.metadata.resource_version, &selector);
        let (admin, into) = (admin.clone(), seen.clone());
        let task = tokio::spawn(async move {
            loop {
                match following.next().await {
                    Ok(event) => {
                        let granted = history.apply(event.type_, event.object, Instant::now());
                        let mut seen = into.lock().unwrap_or_else(|p| p.into_inner());
                        if let Some(grant) = granted {
                            seen.grants += 1;
                            if let Some(what) = grant {
                                let at = clock.elapsed().as_nanos() as u64;
                                println!("violation: {what}");
                                seen.violation.get_or_insert(Seen { at, what });
                            }
                        }
                    }
                    // The history was compacted past where it got: from now on.
                    Err(error) if error.reason() == Some(StatusReason::Gone) => {
                        println!("the budget's watch lost history ({error}); it follows from now on");
                        if let Ok(listed) = admin.list_values("members", &selector).await {
                            history.slots.clear();
                            for object in listed.items {
                                history.apply(WatchEventType::Added, object, Instant::now());
                            }
                            following = admin.follow("members", &listed.metadata.resource_version, &selector);
                        }
                    }
                    // Every server down for now: watch again from where it got.
                    Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                }
            }
        });
        Ok(Watcher { seen, task })
    }

    /// The first disruption granted below the budget, if any.
    pub fn violation(&self) -> Option<Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).violation.clone()
    }

    /// How many disruptions were granted (and checked).
    pub fn grants(&self) -> u32 {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).grants
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct History {
    budget: DisruptionBudget,
    slots: BTreeMap<String, Slot>,
}

impl History {
    /// Takes in one revision of a member. Some when it grants a
    /// disruption: Some(why) when that takes the budget below its minimum.
    fn apply(&mut self, kind: WatchEventType, object: serde_json::Value, now: Instant) -> Option<Option<String>> {
        let member: Member = herd_core::Object::from_json_value(object).ok()?;
        let name = member.metadata.name.clone();
        if kind == WatchEventType::Deleted {
            self.slots.remove(&name);
            return None;
        }
        let before = self.slots.get(&name).cloned();
        let mut slot = Slot {
            ready: member.status.ready,
            requested: !member.spec.requests.is_empty(),
            expected: !matches!(member.status.state, MemberState::DeletePending | MemberState::Deleting),
            granted_up: before.as_ref().and_then(|b| b.granted_up),
        };
        // Seen down, or no more asked: it counts by its readiness again.
        if !slot.ready || !slot.requested {
            slot.granted_up = None;
        }
        let granted = slot.requested && !before.as_ref().is_some_and(|b| b.requested);
        let mut verdict = None;
        if granted {
            let was_healthy = before.as_ref().is_some_and(|b| b.healthy(now));
            let others: Vec<&Slot> = self.slots.iter().filter(|(n, _)| **n != name).map(|(_, s)| s).collect();
            let expected = others.iter().filter(|s| s.expected).count() as u32 + u32::from(slot.expected);
            let desired = herd_core::disruption::desired_healthy(&self.budget, expected);
            let healthy_others = others.iter().filter(|s| s.healthy(now)).count() as u32;
            verdict = Some((was_healthy && healthy_others < desired).then(|| {
                format!(
                    "a disruption of {name} was granted ({:?}) with {healthy_others} other members healthy, \
                     below the {desired} budget {BUDGET} asks for",
                    member.spec.requests
                )
            }));
            slot.granted_up = slot.ready.then_some(now);
        }
        self.slots.insert(name, slot);
        verdict
    }
}

#[cfg(test)]
mod tests {
    use herd_core::kinds::MemberSpec;
    use herd_core::kinds::disruption_budget::Amount;
    use herd_core::time::Timestamp;

    use super::*;

    fn member(name: &str, ready: bool, requested: bool) -> serde_json::Value {
        let mut member = Member::new(name, MemberSpec::default());
        member.status.state = MemberState::Configured;
        member.status.ready = ready;
        if requested {
            member.spec.requests.restart = Some(Timestamp::default());
        }
        serde_json::to_value(member).unwrap()
    }

    fn history() -> History {
        let spec = DisruptionBudgetSpec { min_available: Some(Amount::Count(2)), ..Default::default() };
        let mut history = History { budget: DisruptionBudget::new(BUDGET, spec), slots: BTreeMap::new() };
        for name in ["a", "b", "c"] {
            assert_eq!(history.apply(WatchEventType::Added, member(name, true, false), Instant::now()), None);
        }
        history
    }

    #[test]
    fn one_at_a_time_under_min_available_2_of_3_holds() {
        let mut h = history();
        assert_eq!(h.apply(WatchEventType::Modified, member("a", true, true), Instant::now()), Some(None));
        h.apply(WatchEventType::Modified, member("a", false, true), Instant::now());
        h.apply(WatchEventType::Modified, member("a", true, false), Instant::now());
        assert_eq!(h.apply(WatchEventType::Modified, member("b", true, true), Instant::now()), Some(None));
    }

    #[test]
    fn a_second_grant_while_the_first_is_down_or_not_yet_down_is_a_violation() {
        let mut h = history();
        h.apply(WatchEventType::Modified, member("a", true, true), Instant::now());
        // Granted, not yet down: it no longer counts.
        assert!(matches!(h.apply(WatchEventType::Modified, member("b", true, true), Instant::now()), Some(Some(_))));
        let mut h = history();
        h.apply(WatchEventType::Modified, member("a", true, true), Instant::now());
        h.apply(WatchEventType::Modified, member("a", false, true), Instant::now());
        let verdict = h.apply(WatchEventType::Modified, member("c", true, true), Instant::now());
        assert!(verdict.unwrap().unwrap().contains("1 other members healthy, below the 2"));
    }

    #[test]
    fn a_grant_that_never_took_its_member_down_lapses_as_herd_counts_it() {
        let mut h = history();
        let then = Instant::now();
        h.apply(WatchEventType::Modified, member("a", true, true), then);
        let later = then + APPROVAL_TIMEOUT;
        assert_eq!(h.apply(WatchEventType::Modified, member("b", true, true), later), Some(None));
    }

    #[test]
    fn a_crashed_member_asked_about_while_the_rest_are_short_is_no_violation() {
        let mut h = history();
        h.apply(WatchEventType::Modified, member("a", false, false), Instant::now());
        h.apply(WatchEventType::Modified, member("b", false, false), Instant::now());
        // c is the only healthy one, but a (already down) is what is disrupted.
        assert_eq!(h.apply(WatchEventType::Modified, member("a", false, true), Instant::now()), Some(None));
    }
}
