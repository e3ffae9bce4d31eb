//! The eviction API (seed 004): a voluntary disruption of one member asks
//! every DisruptionBudget that selects it (`herd_core::disruption::verdict`);
//! all must allow. The approval is one transaction: each budget's status
//! (the approval recorded, one allowed disruption taken) and the member's
//! request to be moved, each only if still at the revision read, so two
//! evictions can never both take a budget's last allowed disruption; a
//! lost race is decided again on what the winner wrote.
//!
//! What an approved eviction does: a member without persistent volumes is
//! placed again on another node, as a new member (the app-cluster
//! controller's replace path, `herd.io/replace`); one with persistent
//! volumes is moved there with its data (`herd.io/migrate`: the
//! controller's migration, `herd_core::migration`).

use herd_core::Timestamp;
use herd_core::api::Eviction;
use herd_core::disruption::{self, Verdict};
use herd_core::kinds::{
    App, AppCluster, AppClusterSpec, AppSpec, DisruptionBudgetSpec, EventReason, EventType, Member, MemberSpec,
    NodeSpec,
};
use herd_core::placement::{self, Placement};

use crate::events::EventRecorder;
use crate::objects::{Objects, ObjectsError, Part, Staged, now};

/// How many times an approval that lost a race is decided again.
const ATTEMPTS: usize = 16;

/// Why an eviction was not approved. Only [`EvictionError::Refused`] is
/// an answer about the member; the others decided nothing, and asking
/// again may get one.
#[derive(Debug, thiserror::Error)]
pub enum EvictionError {
    /// A budget, or where the member could go, does not allow it now.
    #[error("cannot evict member {member}: {why}")]
    Refused { member: String, why: String },
    /// The member or its budgets changed under every attempt.
    #[error("member {0} or its budgets kept changing; try again")]
    Contended(String),
    /// Reading or writing the store failed, or the member is gone.
    #[error(transparent)]
    Objects(#[from] ObjectsError),
}

/// What a voluntary disruption does to the member once its budgets allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disruption {
    /// Moved to another node (the eviction API, a drain).
    Move,
    /// Restarted in place (a rolling restart).
    Restart,
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
    for _ in 0..ATTEMPTS {
        let member = objects.require::<MemberSpec>(name).await?;
        let (request, definition) = move_request(objects, &member, how).await?;
        let (budgets, _) = objects.list::<DisruptionBudgetSpec>().await?;
        let selecting: Vec<_> = budgets.into_iter().filter(|b| disruption::selects(b, &member)).collect();
        // Asked again while the first eviction is under way (approved, asked
        // for, or moving and not configured since): the same one, not a
        // second move, which would chase the member from node to node.
        let budget_names: Vec<String> = selecting.iter().map(|b| b.metadata.name.clone()).collect();
        let approved = selecting.iter().any(|b| b.status.disrupted_members.contains_key(name));
        let moving = (member.status.moved_from.is_some() && !member.status.was_configured())
            || member.status.migration.is_some();
        if approved || moving || member.spec.requests.to_leave() {
            let message = format!("member {name} is being evicted (or replaced) already");
            return Ok(Eviction { member: name.to_string(), budgets: budget_names, dry_run, message });
        }
        let mut refusals = Vec::new();
        let mut approvals = Vec::new();
        for budget in &selecting {
            match disruption::verdict(budget, &member) {
                Verdict::Allowed { counts } => approvals.push((budget, counts)),
                Verdict::Refused(why) => refusals.push(why),
            }
        }
        // An approval and the move it allows are one thing: none is given
        // for a member no node can take now (it would go down and wait).
        if let Some((cluster, app)) = &definition
            && let Placement::Unplaceable(why) = target(objects, &member, cluster, app).await?
        {
            refusals.push(why);
        }
        if !refusals.is_empty() {
            return Err(EvictionError::Refused { member: name.to_string(), why: refusals.join("; and ") });
        }
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
        let at = now();
        let mut staged = Vec::new();
        for (budget, counts) in approvals {
            let mut approved = budget.clone();
            approved.status = disruption::approve(&budget.status, &member, counts, at);
            staged.push(Staged::of(budget, approved, Part::Status)?);
        }
        let mut moved = member.clone();
        request.ask(&mut moved, at);
        staged.push(Staged::of(&member, moved, Part::Spec)?);
        match objects.commit_staged(staged).await {
            Ok(()) => {
                events.record(&member, EventType::Normal, EventReason::MemberEvicted, answer.message.clone()).await;
                return Ok(answer);
            }
            Err(ObjectsError::Conflict { .. }) => continue,
            Err(other) => return Err(other.into()),
        }
    }
    Err(EvictionError::Contended(name.to_string()))
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

/// How an evicted member leaves its node.
#[derive(Clone, Copy)]
enum MoveRequest {
    /// Placed again elsewhere as a new member (no data to keep).
    Replace,
    /// Moved elsewhere with its persistent volumes.
    Migrate,
    /// Restarted where it is.
    Restart,
}

impl MoveRequest {
    /// Asks it of `member` as of `at`; whether it was not asked already.
    fn ask(self, member: &mut Member, at: Timestamp) -> bool {
        let requests = &mut member.spec.requests;
        let asked = match self {
            MoveRequest::Replace => &mut requests.replace,
            MoveRequest::Migrate => &mut requests.migrate,
            MoveRequest::Restart => &mut requests.restart,
        };
        asked.replace(at).is_none()
    }

    fn what(self, name: &str) -> String {
        match self {
            MoveRequest::Replace => format!("member {name} is placed again on another node"),
            MoveRequest::Migrate => format!("member {name} is moved to another node with its data"),
            MoveRequest::Restart => format!("member {name} is restarted where it is"),
        }
    }
}

/// A member whose role keeps persistent volumes is migrated; the others
/// are replaced; a restart is a restart. A move comes with the member's
/// AppCluster and App, when both exist (where it may go is theirs to say).
async fn move_request(
    objects: &Objects,
    member: &Member,
    how: Disruption,
) -> Result<(MoveRequest, Option<(AppCluster, App)>), ObjectsError> {
    if how == Disruption::Restart {
        return Ok((MoveRequest::Restart, None));
    }
    let Some(cluster) = objects.get::<AppClusterSpec>(&member.spec.cluster).await? else {
        return Ok((MoveRequest::Replace, None));
    };
    let Some(app) = objects.get::<AppSpec>(&cluster.spec.app_ref).await? else {
        return Ok((MoveRequest::Replace, None));
    };
    let persistent =
        app.spec.role(&member.spec.role).is_some_and(|role| role.run.persistent_volumes().next().is_some());
    let request = if persistent { MoveRequest::Migrate } else { MoveRequest::Replace };
    Ok((request, Some((cluster, app))))
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
    Ok(placement::place(&leaving, selector, role.placement.spread, &nodes, &peers, &|_| 0))
}
