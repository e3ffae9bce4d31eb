//! The server side of the command protocol (no HTTP here): issuing
//! Commands in a leadership's term, recording what agents report of their
//! journals, and keeping two unsettled Commands off the same member or
//! volume.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use herd_core::Resource;
use herd_core::api::{CommandAck, CommandReport};
use herd_core::backoff::Contention;
use herd_core::kinds::{Action, Command, CommandSpec, EventReason, EventType, ManagementState, NodeRole, NodeSpec};

use crate::error::ApiError;
use crate::events::EventRecorder;
use crate::metrics::Metrics;
use herd_store::{Compare, Revision, Txn};

use crate::objects::{Guard, Objects, ObjectsError, Part, decode, now, object_key, try_again};
use crate::peers::PeerAuthority;
use crate::reflector::Reflector;

/// Issues Commands in one leadership's term: the command controller
/// issues those it finds unissued (made through the API, or retried), and
/// the app-cluster controller creates its own already issued when their
/// node is Ready (a write and a command-controller pass less per Command).
#[derive(Clone)]
pub struct Issuer {
    pub term: u64,
    /// Signs the grants a Command's action needs on another node.
    pub peers: Arc<PeerAuthority>,
    /// The nodes as the leader caches them: the roles its creations are
    /// admitted against (no read of a node per Command).
    pub nodes: Reflector<NodeSpec>,
}

impl Issuer {
    /// Marks `command` issued for its next attempt; `from` is the agent
    /// endpoint of the node its action takes data from, if it has one.
    pub fn issue(&self, command: &mut Command, from: Option<String>) {
        let mut peers = BTreeMap::new();
        if let (Action::CopyVolume { from_node, .. } | Action::MigrateMember { from_node, .. }, Some(address)) =
            (&command.spec.action, from)
        {
            peers.insert(from_node.clone(), address);
        }
        let grants = self.peers.command_grants(command, command.status.attempts + 1, SystemTime::now());
        command.status.issue(self.term, peers, grants, now());
    }
}

/// Whether `command` is the attempt that `report` is about: the same
/// Command (not one made again under its name) issued for that attempt.
fn is_reported_attempt(command: &Command, report: &CommandReport) -> bool {
    command.metadata.uid.as_deref() == Some(report.uid.as_str())
        && command.status.issued.as_ref().map(|i| i.attempt) == Some(report.attempt)
}

/// The Commands that a node's reports name (None: gone), read once for
/// [`foreign_report`] and [`record_reports`]: the cached copy when it is
/// the attempt reported, else the stored one (a cache that has not seen
/// the attempt yet must not make its report look stale). A cached copy
/// older than the store fails its write and is read again.
pub async fn reported(
    objects: &Objects,
    cache: &Reflector<CommandSpec>,
    reports: &[CommandReport],
) -> Result<Vec<Option<Command>>, ApiError> {
    let mut current = Vec::with_capacity(reports.len());
    for report in reports {
        let cached = cache.get_shared(&report.name).filter(|c| is_reported_attempt(c, report));
        current.push(match cached {
            Some(command) => Some(Command::clone(&command)),
            None => objects.get::<CommandSpec>(&report.name).await?,
        });
    }
    Ok(current)
}

/// The refusal for a report on another node's Command, if there is one.
pub fn foreign_report(node: &str, current: &[Option<Command>]) -> Option<ApiError> {
    current.iter().flatten().find(|command| command.spec.node != node).map(|command| {
        ApiError::Forbidden(format!(
            "command {} is for node {}; node {node} may not answer it",
            command.metadata.name, command.spec.node
        ))
    })
}

/// Records `node`'s reports on its Commands, `current` as [`reported`]
/// read them (checked by [`foreign_report`] first); returns what the
/// agent may forget.
pub async fn record_reports(
    objects: &Objects,
    (events, metrics): (&EventRecorder, &Metrics),
    node: &str,
    reports: &[CommandReport],
    current: Vec<Option<Command>>,
) -> Result<Vec<CommandAck>, ApiError> {
    let mut acks = Vec::new();
    for (report, command) in reports.iter().zip(current) {
        let ack = CommandAck { name: report.name.clone(), attempt: report.attempt };
        let command = command.filter(|c| c.spec.node == node);
        let Some(Recorded { command, before, forget }) = record_report(objects, command, report).await? else {
            // Deleted, replaced by a Command of the same name, or an older
            // attempt: nothing to record; a finished one can be forgotten.
            tracing::info!(node, command = %report.name, attempt = report.attempt, "a report on a command attempt that is no longer current");
            if report.state.is_over() {
                acks.push(ack);
            }
            continue;
        };
        metrics.observe_settling(&command, before);
        tell_outcome(events, &command, before).await;
        if forget {
            acks.push(ack);
        }
    }
    Ok(acks)
}

/// A report recorded: the Command as written, its management state
/// before, and whether the agent may forget the attempt.
struct Recorded {
    command: Command,
    before: ManagementState,
    forget: bool,
}

/// Records `report` on `command`; None when it is not the attempt
/// reported. Checked on every read, the first included: a copy that
/// moved meanwhile may be another attempt, or gone.
async fn record_report(
    objects: &Objects,
    command: Option<Command>,
    report: &CommandReport,
) -> Result<Option<Recorded>, ApiError> {
    let Some(command) = command else { return Ok(None) };
    let (mut current, mut forget, mut before) = (false, false, ManagementState::default());
    let written = objects.modify_from::<CommandSpec, ApiError>(command, Part::Status, |command| {
        current = is_reported_attempt(command, report);
        if !current {
            return Ok(false);
        }
        let was = command.status.clone();
        before = was.state_by_management;
        forget = command.status.record_agent_report(report.state, report.answer.clone(), now());
        command.status.progress = if report.state.is_over() { Default::default() } else { report.progress.clone() };
        Ok(command.status != was)
    });
    match written.await {
        Ok(command) => Ok(current.then_some(Recorded { command, before, forget })),
        Err(ApiError::NotFound { .. }) => Ok(None),
        Err(error) => Err(error),
    }
}

/// How much of a failed script's standard error an Event keeps.
const EVENT_STDERR_TAIL: usize = 400;

/// An Event when an agent's report ended a Command badly (or ended an
/// abandon): `herd events` shows every failure. It says all that the
/// Command said (whose member, the answer, a script's standard error):
/// Commands an app cluster made are deleted once read.
async fn tell_outcome(events: &EventRecorder, command: &Command, before: ManagementState) {
    let state = command.status.state_by_management;
    if state == before {
        return;
    }
    let reason = match state {
        ManagementState::Failed => EventReason::CommandFailed,
        ManagementState::TimedOut => EventReason::CommandTimedOut,
        ManagementState::Abandoned => EventReason::CommandAbandoned,
        _ => return,
    };
    let answer = command.status.answer.as_ref();
    let said = answer.map_or("no answer", |a| a.message.as_str());
    let stderr = answer.and_then(|a| a.stderr_tail(EVENT_STDERR_TAIL)).map(|tail| format!(": {tail}"));
    let action = &command.spec.action;
    let message = format!(
        "{} of member {} on node {} {state}: {said}{}",
        action.type_name(),
        action.member(),
        command.spec.node,
        stderr.unwrap_or_default()
    );
    events.record(command, EventType::Warning, reason, message).await;
}

/// Each member's hold list: the Commands created for it that may still
/// hold it. Every Command created is added to its member's list in the
/// same transaction (which moves the list's revision), so two creations
/// checked against the same list cannot both land; a creation drops the
/// settled and deleted ones. A Command holds only its own member, so
/// creations for different members never wait for each other.
const HOLDS_PREFIX: &str = "/guards/command-holds/";

/// The single guard of stores written before the per-member lists.
const LEGACY_HOLDS_GUARD: &str = "/guards/command-holds";

fn holds_key(member: &str) -> String {
    format!("{HOLDS_PREFIX}{member}")
}

/// A member's hold list as stored: its revision and the Commands it names
/// that still exist.
async fn hold_list(objects: &Objects, member: &str) -> Result<(Option<Revision>, Vec<Command>), ObjectsError> {
    let key = holds_key(member);
    let Some(kv) = objects.store().get(&key).await? else { return Ok((None, Vec::new())) };
    let names: Vec<String> =
        serde_json::from_slice(&kv.value).map_err(|e| ObjectsError::Corrupt { key, reason: e.to_string() })?;
    let mut unsettled = Vec::with_capacity(names.len());
    for name in names {
        let key = object_key(CommandSpec::PLURAL, &name);
        let Some(stored) = objects.store().get(&key).await? else { continue };
        // Most listed ones have settled: only those that have not are read whole.
        if !stored_state(&key, &stored.value)?.is_settled() {
            unsettled.push(decode::<CommandSpec>(&stored)?);
        }
    }
    Ok((Some(kv.mod_revision), unsettled))
}

/// A stored Command's management state, read without the rest of it.
fn stored_state(key: &str, value: &[u8]) -> Result<ManagementState, ObjectsError> {
    #[derive(serde::Deserialize)]
    struct Stored {
        #[serde(default)]
        status: Status,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Status {
        #[serde(default)]
        state_by_management: ManagementState,
    }
    let stored: Stored =
        serde_json::from_slice(value).map_err(|e| ObjectsError::Corrupt { key: key.into(), reason: e.to_string() })?;
    Ok(stored.status.state_by_management)
}

/// A node's role as stored (None: no such node), read without the rest of
/// the node (its status carries every member's report).
async fn stored_role(objects: &Objects, node: &str) -> Result<Option<NodeRole>, ObjectsError> {
    #[derive(serde::Deserialize)]
    struct Stored {
        #[serde(default)]
        spec: Spec,
    }
    #[derive(serde::Deserialize, Default)]
    struct Spec {
        #[serde(default)]
        role: NodeRole,
    }
    let key = object_key(NodeSpec::PLURAL, node);
    let Some(kv) = objects.store().get(&key).await? else { return Ok(None) };
    let stored: Stored =
        serde_json::from_slice(&kv.value).map_err(|e| ObjectsError::Corrupt { key, reason: e.to_string() })?;
    Ok(Some(stored.spec.role))
}

/// The node whose agent must see a stored Command event: the Command's
/// node (from the label the server sets and never changes; a Command's
/// spec is immutable) when the event asks something of its agent, an
/// attempt to take up (an issued Command not yet taken up) or an abandon
/// to carry out. None for the rest (reports recorded, outcomes,
/// deletions), which an agent's watch need not carry: most of a
/// Command's events are those.
pub fn agent_to_tell(event: &herd_store::Event) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Stored {
        #[serde(default)]
        metadata: Metadata,
        #[serde(default)]
        status: Status,
    }
    #[derive(serde::Deserialize, Default)]
    struct Metadata {
        #[serde(default)]
        labels: BTreeMap<String, String>,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Status {
        #[serde(default)]
        state_by_management: ManagementState,
        #[serde(default)]
        abandon: Option<serde::de::IgnoredAny>,
    }
    if event.kind == herd_store::EventKind::Delete {
        return None;
    }
    let Stored { mut metadata, status } = serde_json::from_slice(&event.value).ok()?;
    let asks = status.state_by_management == ManagementState::Created || status.abandon.is_some();
    asks.then(|| metadata.labels.remove(herd_core::kinds::command::NODE_LABEL)).flatten()
}

/// Admits and creates a Command: it carries its node's label, and nothing
/// it would hold is held by an unsettled Command (the 409 names it). The
/// check and the create are one transaction, through its member's hold list.
pub async fn create(objects: &Objects, command: Command, dry_run: bool) -> Result<Command, ObjectsError> {
    admit(objects, command, dry_run, None).await
}

/// Admits and creates a Command issued already (its action takes nothing
/// from another node): for a caller that knows the node Ready.
pub async fn create_issued(objects: &Objects, issuer: &Issuer, mut command: Command) -> Result<Command, ObjectsError> {
    issuer.issue(&mut command, None);
    admit(objects, command, false, Some(&issuer.nodes)).await
}

/// [`create`], keeping the status given when `issued_against` names the
/// issuer's cached nodes, whose roles it is admitted against (else the
/// stored ones). Neither is read in the creating transaction: either
/// may be a moment old when the Command commits.
async fn admit(
    objects: &Objects,
    command: Command,
    dry_run: bool,
    issued_against: Option<&Reflector<NodeSpec>>,
) -> Result<Command, ObjectsError> {
    for node in command.spec.nodes() {
        let role = match issued_against {
            Some(nodes) => nodes.get_shared(node).map(|n| n.spec.role),
            None => stored_role(objects, node).await?,
        };
        if role == Some(NodeRole::Offline) {
            return Err(ObjectsError::Held(format!(
                "node {node} is offline: no Command involves an offline node (`herd node modify {node} --role regular` first)"
            )));
        }
    }
    let member = command.spec.action.member().to_string();
    // A creation for the same member that landed between the check and
    // the write moves the hold list: checked again.
    let mut contention = Contention::new(std::time::Instant::now());
    loop {
        let (revision, listed) = hold_list(objects, &member).await?;
        check_holds(&command, &listed)?;
        if dry_run {
            return objects.create(command, false, true).await;
        }
        let mut still: Vec<&str> = listed
            .iter()
            .filter(|c| !c.status.state_by_management.is_settled() && c.metadata.name != command.metadata.name)
            .map(|c| c.metadata.name.as_str())
            .collect();
        still.push(&command.metadata.name);
        let value = serde_json::to_vec(&still).unwrap_or_default();
        let guard = Guard { key: holds_key(&member), revision, value };
        match objects.create_guarded(command.clone(), &guard, issued_against.is_some()).await {
            Err(ObjectsError::GuardMoved { .. }) if try_again(&mut contention).await => {}
            Err(ObjectsError::GuardMoved { .. }) => {
                return Err(ObjectsError::Held(format!(
                    "commands for member {member} kept being created meanwhile; command {} was not created: try again",
                    command.metadata.name
                )));
            }
            other => return other,
        }
    }
}

/// Deletes a gone member's hold list once nothing it names holds it (a
/// creation that lands meanwhile keeps it: the delete compares revisions).
pub async fn forget_holds(objects: &Objects, member: &str) -> Result<(), ObjectsError> {
    let (Some(revision), listed) = hold_list(objects, member).await? else { return Ok(()) };
    if listed.iter().any(|c| !c.status.state_by_management.is_settled()) {
        return Ok(());
    }
    let txn = Txn::new().when(Compare::ModRevision { key: holds_key(member), revision }).delete(holds_key(member));
    objects.store().txn(txn).await?;
    Ok(())
}

/// Moves a store from the single guard to per-member hold lists (once, at
/// startup): every unsettled Command is listed under its member, in the
/// same transaction that deletes the old guard.
pub async fn index_legacy_holds(objects: &Objects) -> Result<(), ObjectsError> {
    let Some(legacy) = objects.store().get(LEGACY_HOLDS_GUARD).await? else { return Ok(()) };
    let (commands, _) = objects.list_where::<CommandSpec>(|_| true).await?;
    let mut lists: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for command in commands.iter().filter(|c| !c.status.state_by_management.is_settled()) {
        lists.entry(command.spec.action.member()).or_default().push(&command.metadata.name);
    }
    let mut txn = Txn::new()
        .when(Compare::ModRevision { key: LEGACY_HOLDS_GUARD.into(), revision: legacy.mod_revision })
        .delete(LEGACY_HOLDS_GUARD);
    for (member, names) in lists {
        txn = txn.put(holds_key(member), serde_json::to_vec(&names).unwrap_or_default());
    }
    objects.store().txn(txn).await?;
    Ok(())
}

/// Refuses `command` when an unsettled other Command holds what it would.
fn check_holds(command: &Command, others: &[Command]) -> Result<(), ObjectsError> {
    let holds = command.spec.action.holds(&command.spec.node);
    let unsettled = others
        .iter()
        .filter(|o| !o.status.state_by_management.is_settled() && o.metadata.name != command.metadata.name);
    for other in unsettled {
        let their = other.spec.action.holds(&other.spec.node);
        if let Some(hold) = holds.iter().find(|h| their.iter().any(|t| t.overlaps(h))) {
            return Err(ObjectsError::Held(format!(
                "{hold} is held by command {} ({}, {}{}): wait for it to settle, or `herd command abandon {}`",
                other.metadata.name,
                other.spec.action.type_name(),
                other.status.state_by_management,
                other.status.state_by_agent.map(|a| format!(", agent {a:?}")).unwrap_or_default(),
                other.metadata.name
            )));
        }
    }
    Ok(())
}

/// What an operator may do to a stuck Command.
#[derive(Clone, Copy, Debug)]
pub enum OperatorAction {
    Retry,
    Abandon { keep_staging: bool },
}

impl std::fmt::Display for OperatorAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OperatorAction::Retry => "retried",
            OperatorAction::Abandon { .. } => "abandoned",
        })
    }
}

/// Applies an operator's retry or abandon, recorded as an Event; a 409
/// says why it is not possible now.
pub async fn operator_action(
    objects: &Objects,
    events: &EventRecorder,
    name: &str,
    action: OperatorAction,
) -> Result<Command, ApiError> {
    let command = objects.require::<CommandSpec>(name).await?;
    if let OperatorAction::Retry = action {
        // A retried Command holds again what it held: nothing else may.
        let (others, _) = objects.list::<CommandSpec>().await?;
        check_holds(&command, &others)?;
    }
    let host_up = objects.get::<NodeSpec>(&command.spec.node).await?.is_some_and(|n| n.status.ready);
    let written = objects
        .modify::<CommandSpec, ApiError>(name, Part::Status, |command| {
            let done = match action {
                OperatorAction::Retry => command.status.operator_retry(now()),
                OperatorAction::Abandon { keep_staging } => {
                    command.status.operator_abandon(host_up, keep_staging, now())
                }
            };
            done.map(|()| true).map_err(|why| ApiError::Conflict(format!("command {name} cannot be {action}: {why}")))
        })
        .await?;
    let (type_, reason) = match (action, written.status.state_by_management) {
        (OperatorAction::Retry, _) => (EventType::Normal, EventReason::CommandRetried),
        (OperatorAction::Abandon { .. }, ManagementState::Abandoning) => {
            (EventType::Warning, EventReason::CommandAbandoning)
        }
        (OperatorAction::Abandon { .. }, _) => (EventType::Warning, EventReason::CommandAbandoned),
    };
    events.record(&written, type_, reason, written.status.reason.clone()).await;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use herd_core::kinds::AgentState;
    use herd_core::kinds::command::{AbandonRequest, NODE_LABEL};
    use herd_store::{Event, EventKind, Store};

    use super::*;

    fn command(node: &str) -> Command {
        let spec = CommandSpec {
            node: node.into(),
            timeout: None,
            action: Action::StopMember { member: "m1".into() },
            origin: None,
        };
        let mut command = Command::new("c1", spec);
        command.metadata.labels.insert(NODE_LABEL.into(), node.into());
        command
    }

    fn event(kind: EventKind, command: &Command) -> Event {
        let value = serde_json::to_vec(command).unwrap().into();
        Event { revision: 7, kind, key: object_key(CommandSpec::PLURAL, "c1"), value, create_revision: 7 }
    }

    /// An agent's watch carries what it acts on: an attempt to take up or
    /// an abandon; not the recording of its reports, nor deletions.
    #[test]
    fn an_agent_is_told_of_attempts_and_abandons_only() {
        let now = now();
        let mut issued = command("n1");
        issued.status.issue(1, BTreeMap::new(), Vec::new(), now);
        assert_eq!(agent_to_tell(&event(EventKind::Put, &issued)).as_deref(), Some("n1"), "an attempt to take up");
        let mut taken_up = issued.clone();
        taken_up.status.record_agent_report(AgentState::Started, None, now);
        assert_ne!(taken_up.status.state_by_management, ManagementState::Created);
        assert_eq!(agent_to_tell(&event(EventKind::Put, &taken_up)), None, "its own report, recorded");
        let mut abandoned = taken_up.clone();
        abandoned.status.abandon = Some(AbandonRequest { attempt: 1, keep_staging: false });
        assert_eq!(agent_to_tell(&event(EventKind::Put, &abandoned)).as_deref(), Some("n1"), "an abandon");
        assert_eq!(agent_to_tell(&event(EventKind::Delete, &issued)), None, "a deletion");
    }

    /// A report is recorded only on the attempt it is about: a cached copy
    /// of that attempt, when the stored Command moved on to the next one
    /// meanwhile, records nothing (its write fails, and the Command read
    /// again is another attempt).
    #[tokio::test]
    async fn a_report_on_an_attempt_a_retry_replaced_is_not_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let objects = Objects::new(Store::open(dir.path().join("s.db").to_str().unwrap()).await.unwrap());
        let mut first = command("n1");
        first.status.issue(1, BTreeMap::new(), Vec::new(), now());
        let cached = objects.create(first, true, false).await.unwrap();
        let report = CommandReport {
            name: "c1".into(),
            uid: cached.metadata.uid.clone().unwrap(),
            attempt: 1,
            state: AgentState::Completed,
            answer: None,
            updated: now(),
            progress: BTreeMap::new(),
        };
        let again = objects.modify::<CommandSpec, ObjectsError>("c1", Part::Status, |c| {
            c.status.issue(1, BTreeMap::new(), Vec::new(), now());
            Ok(true)
        });
        let second = again.await.unwrap();
        assert!(record_report(&objects, Some(cached), &report).await.unwrap().is_none(), "not the attempt reported");
        let stored = objects.require::<CommandSpec>("c1").await.unwrap();
        assert_eq!(stored.status, second.status, "the second attempt is as issued");

        let current = CommandReport { attempt: 2, ..report };
        let recorded = record_report(&objects, Some(stored), &current).await.unwrap().expect("its own attempt");
        assert_eq!(recorded.command.status.state_by_agent, Some(AgentState::Completed));
    }
}
