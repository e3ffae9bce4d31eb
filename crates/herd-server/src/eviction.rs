//! The eviction API: a voluntary disruption of one member asks
//! every DisruptionBudget that selects it (`herd_core::disruption::verdict`),
//! each counted at that moment over the members it selects; all must
//! allow. The approval is one transaction: each budget's status (the
//! approval recorded, one allowed disruption taken) and the member's
//! request to be moved, each only if still at the revision read, and only
//! if none of the members counted changed, so two evictions can never both
//! take a budget's last allowed disruption, nor one take it from a member
//! that just went down; a lost race is decided again on what changed.
//!
//! What an approved eviction does: a member without persistent volumes is
//! placed again on another node, as a new member (the app-cluster
//! controller's replace path, `spec.requests.replace`); one with
//! persistent volumes is moved there with its data (`requests.migrate`:
//! the controller's migration, `herd_core::migration`). What is decided,
//! and asked of the member, is `herd_core::eviction`'s.

use herd_core::api::Eviction;
use herd_core::backoff::Contention;
use herd_core::disruption;
pub use herd_core::eviction::Disruption;
use herd_core::eviction::{self, Decision, Request};
use herd_core::kinds::{
    App, AppCluster, AppClusterSpec, AppSpec, DisruptionBudgetSpec, EventReason, EventType, Member, MemberSpec,
    NodeSpec,
};
use herd_core::placement::{self, Placement};

use crate::events::EventRecorder;
use crate::objects::{Objects, ObjectsError, Part, Staged, now, try_again};

/// Why an eviction was not approved. Only [`EvictionError::Refused`] is
/// an answer about the member; the others decided nothing, and asking
/// again may get one.
#[derive(Debug, thiserror::Error)]
pub enum EvictionError {
    /// A budget, or where the member could go, does not allow it now.
    #[error("cannot evict member {member}: {why}")]
    Refused { member: String, why: String },
    /// The member or its budgets kept changing under every attempt.
    #[error("member {0} or its budgets kept changing; try again")]
    Contended(String),
    /// Reading or writing the store failed, or the member is gone.
    #[error(transparent)]
    Objects(#[from] ObjectsError),
}

/// Asks the budgets to evict member `name` and, if all allow and this is
/// not a dry run, approves it and asks for the member to be moved.
pub async fn evict(
    objects: &Objects,
    events: &EventRecorder,
    name: &str,
    dry_run: bool,
) -> Result<Eviction, EvictionError> {
    disrupt(objects, events, name, dry_run, Disruption::Move).await
}

/// As [`evict`], for a disruption of either kind.
pub async fn disrupt(
    objects: &Objects,
    events: &EventRecorder,
    name: &str,
    dry_run: bool,
    how: Disruption,
) -> Result<Eviction, EvictionError> {
    // An approval that lost a race is decided again.
    let mut contention = Contention::new(std::time::Instant::now());
    loop {
        let member = objects.require::<MemberSpec>(name).await?;
        let (request, definition) = move_request(objects, &member, how).await?;
        let (budgets, _) = objects.list::<DisruptionBudgetSpec>().await?;
        let selecting: Vec<_> = budgets.into_iter().filter(|b| disruption::selects(b, &member)).collect();
        // Counted now, over the members as they are: the keeper's last
        // count may not have seen a member go down yet, and an approval on
        // it broke a budget (the chaos soak found it). The approval is
        // written only if none of the members counted changed meanwhile.
        let counted_members = match selecting.is_empty() {
            true => Vec::new(),
            false => objects.list::<MemberSpec>().await?.0,
        };
        let at = now();
        let counted: Vec<_> = selecting
            .iter()
            .map(|budget| {
                let mut counted = budget.clone();
                counted.status = disruption::count(budget, &counted_members, at);
                counted
            })
            .collect();
        let budget_names: Vec<String> = selecting.iter().map(|b| b.metadata.name.clone()).collect();
        let target = match &definition {
            Some((cluster, app)) => Some(target(objects, &member, cluster, app).await?),
            None => None,
        };
        let approvals = match eviction::decide(&member, &counted, target.as_ref()) {
            Decision::UnderWay => {
                let message = format!("member {name} is being evicted (or replaced) already");
                return Ok(Eviction { member: name.to_string(), budgets: budget_names, dry_run, message });
            }
            Decision::Refused(why) => return Err(EvictionError::Refused { member: name.to_string(), why }),
            Decision::Approved(approvals) => approvals,
        };
        let what = request.what(name);
        let message = if budget_names.is_empty() {
            format!("{what} (no budget selects it)")
        } else {
            format!("{what} (allowed by {})", budget_names.join(", "))
        };
        let answer = Eviction { member: name.to_string(), budgets: budget_names, dry_run, message };
        if dry_run {
            return Ok(answer);
        }
        let mut staged = Vec::new();
        for (i, counts) in approvals {
            let mut approved = selecting[i].clone();
            approved.status = disruption::approve(&counted[i].status, &member, counts, at);
            staged.push(Staged::of(&selecting[i], approved, Part::Status)?);
        }
        let mut moved = member.clone();
        request.ask(&mut moved, at);
        staged.push(Staged::of(&member, moved, Part::Spec)?);
        let others = counted_members.iter().filter(|m| m.metadata.name != member.metadata.name);
        staged.extend(others.filter(|m| selecting.iter().any(|b| disruption::selects(b, m))).map(Staged::unchanged));
        match objects.commit_staged(staged).await {
            Ok(()) => {
                events.record(&member, EventType::Normal, EventReason::MemberEvicted, answer.message.clone()).await;
                return Ok(answer);
            }
            Err(ObjectsError::Conflict { .. }) if try_again(&mut contention).await => {}
            Err(ObjectsError::Conflict { .. }) => return Err(EvictionError::Contended(name.to_string())),
            Err(other) => return Err(other.into()),
        }
    }
}

/// Evicts member `name` without asking its budgets: a drain whose deadline
/// passed with `onDeadline: force` (Nomad's). The budgets count it as they
/// count a crash.
pub async fn force(
    objects: &Objects,
    events: &EventRecorder,
    name: &str,
    how: Disruption,
) -> Result<String, ObjectsError> {
    let member = objects.require::<MemberSpec>(name).await?;
    let (request, _) = move_request(objects, &member, how).await?;
    let at = now();
    objects.modify::<MemberSpec, ObjectsError>(name, Part::Spec, |member| Ok(request.ask(member, at))).await?;
    let message = format!("{}; its budgets were not asked", request.what(name));
    events.record(&member, EventType::Warning, EventReason::MemberForcedOut, message.clone()).await;
    Ok(message)
}

/// What the disruption asks of `member` (`eviction::Request::of`), with
/// its AppCluster and App when both exist (where it may go is theirs to
/// say).
async fn move_request(
    objects: &Objects,
    member: &Member,
    how: Disruption,
) -> Result<(Request, Option<(AppCluster, App)>), ObjectsError> {
    if matches!(how, Disruption::Restart | Disruption::Upgrade { .. }) {
        return Ok((Request::of(how, None), None));
    }
    let Some(cluster) = objects.get::<AppClusterSpec>(&member.spec.cluster).await? else {
        return Ok((Request::of(how, None), None));
    };
    let Some(app) = objects.get::<AppSpec>(&cluster.spec.app_ref).await? else {
        return Ok((Request::of(how, None), None));
    };
    let persistent =
        app.spec.role(&member.spec.role).is_some_and(|role| role.run.persistent_volumes().next().is_some());
    Ok((Request::of(how, Some(persistent)), Some((cluster, app))))
}

/// Where `member` would go if it left its node now, as placement judges
/// it (its node excluded, its role's spread and node selector kept).
async fn target(
    objects: &Objects,
    member: &Member,
    cluster: &AppCluster,
    app: &App,
) -> Result<Placement, ObjectsError> {
    let Some(role) = app.spec.role(&member.spec.role) else {
        return Ok(Placement::Unplaceable(format!("App {} has no role {}", app.metadata.name, member.spec.role)));
    };
    let (nodes, _) = objects.list::<NodeSpec>().await?;
    let (members, _) = objects.list::<MemberSpec>().await?;
    let peers: Vec<&Member> =
        members.iter().filter(|m| m.spec.cluster == member.spec.cluster && m.spec.role == member.spec.role).collect();
    let mut leaving = member.clone();
    leaving.status.moved_from = leaving.spec.node.take();
    let no_selector = Default::default();
    let selector = cluster.spec.role(&member.spec.role).map_or(&no_selector, |r| &r.node_selector);
    leaving.spec.resources = role.run.resources.requests();
    let loads = placement::loads(members.iter().filter(|m| m.metadata.name != member.metadata.name));
    let load = |node: &str| loads.get(node).copied().unwrap_or_default();
    Ok(placement::place(&leaving, selector, role.placement.spread, &nodes, &peers, &load))
}

#[cfg(test)]
mod tests {
    use herd_core::Object;
    use herd_core::kinds::disruption_budget::Amount;
    use herd_core::kinds::member::{CLUSTER_LABEL, member_name};
    use herd_core::kinds::{DisruptionBudgetSpec, MemberState};

    use super::*;

    async fn set_ready(objects: &Objects, name: &str, ready: bool) {
        let set = |m: &mut Member| {
            m.status.ready = ready;
            Ok::<_, ObjectsError>(true)
        };
        objects.modify::<MemberSpec, ObjectsError>(name, Part::Status, set).await.unwrap();
    }

    /// A budget's status may lag a member going down (the keeper counts
    /// after the change is stored): the eviction counts the members as
    /// they are, so the lag never lets it take the budget below its
    /// minimum.
    #[tokio::test]
    async fn an_eviction_counts_the_members_as_they_are_not_as_the_budget_last_said() {
        let dir = tempfile::tempdir().unwrap();
        let store = herd_store::Store::open(dir.path().join("store.db").to_str().unwrap()).await.unwrap();
        let objects = Objects::new(store);
        let events = EventRecorder::new(objects.clone(), "test");
        let spec = DisruptionBudgetSpec {
            selector: format!("{CLUSTER_LABEL}=c"),
            min_available: Some(Amount::Count(2)),
            ..Default::default()
        };
        let budget = objects.create(Object::new("c", spec), false, false).await.unwrap();
        for index in 0..3 {
            let spec = MemberSpec { cluster: "c".into(), role: "db".into(), index, ..Default::default() };
            let mut member = Member::new(member_name("c", "db", index), spec);
            member.metadata.labels.insert(CLUSTER_LABEL.into(), "c".into());
            member.status.state = MemberState::Configured;
            member.status.ready = true;
            objects.create(member, true, false).await.unwrap();
        }
        // Counted with all three healthy: one disruption allowed.
        let (members, _) = objects.list::<MemberSpec>().await.unwrap();
        let mut counted = budget.clone();
        counted.status = disruption::count(&budget, &members, now());
        assert_eq!(counted.status.disruptions_allowed, 1);
        objects.update_status(counted, false).await.unwrap();

        // One goes down; nothing has counted the budget since.
        set_ready(&objects, "c-db-0", false).await;
        let refused = disrupt(&objects, &events, "c-db-1", false, Disruption::Restart).await;
        assert!(matches!(refused, Err(EvictionError::Refused { .. })), "{refused:?}");
        let stored = objects.require::<MemberSpec>("c-db-1").await.unwrap();
        assert!(stored.spec.requests.restart.is_none(), "nothing asked of it");

        set_ready(&objects, "c-db-0", true).await;
        let allowed = disrupt(&objects, &events, "c-db-1", false, Disruption::Restart).await;
        assert!(allowed.is_ok(), "{allowed:?}");
    }
}
