//! The server side of the command protocol (no HTTP here): recording what
//! agents report of their journals, and keeping two unsettled Commands
//! off the same member or volume.

use herd_core::api::{CommandAck, CommandReport};
use herd_core::kinds::command::NODE_LABEL;
use herd_core::kinds::{Command, CommandSpec};

use crate::error::ApiError;
use crate::objects::{Guard, Objects, Part, now};

/// The refusal for a report on another node's Command, if there is one.
pub async fn foreign_report(
    objects: &Objects,
    node: &str,
    reports: &[CommandReport],
) -> Result<Option<ApiError>, ApiError> {
    for report in reports {
        if let Some(command) = objects.get::<CommandSpec>(&report.name).await?
            && command.spec.node != node
        {
            return Ok(Some(ApiError::Forbidden(format!(
                "command {} is for node {}; node {node} may not answer it",
                report.name, command.spec.node
            ))));
        }
    }
    Ok(None)
}

/// Records `node`'s reports on its Commands (checked by [`foreign_report`]
/// first); returns what the agent may forget.
pub async fn record_reports(
    objects: &Objects,
    node: &str,
    reports: &[CommandReport],
) -> Result<Vec<CommandAck>, ApiError> {
    let mut current = Vec::with_capacity(reports.len());
    for report in reports {
        current.push(objects.get::<CommandSpec>(&report.name).await?);
    }
    let mut acks = Vec::new();
    for (report, command) in reports.iter().zip(current) {
        let ack = CommandAck { name: report.name.clone(), attempt: report.attempt };
        let is_current = command.as_ref().is_some_and(|c| {
            c.spec.node == node
                && c.metadata.uid.as_deref() == Some(report.uid.as_str())
                && c.status.issued.as_ref().map(|i| i.attempt) == Some(report.attempt)
        });
        if !is_current {
            // Deleted, replaced by a Command of the same name, or an older
            // attempt: nothing to record; a finished one can be forgotten.
            tracing::info!(node, command = %report.name, attempt = report.attempt, "a report on a command attempt that is no longer current");
            if report.state.is_over() {
                acks.push(ack);
            }
            continue;
        }
        let mut forget = false;
        objects
            .modify::<CommandSpec>(&report.name, Part::Status, |command| {
                let before = command.status.clone();
                forget = command.status.record_agent_report(report.state, report.answer.clone(), now());
                Ok(command.status != before)
            })
            .await?;
        if forget {
            acks.push(ack);
        }
    }
    Ok(acks)
}

/// Stands for the set of unsettled Commands' holds: every Command created
/// moves it, so two creations checked against the same holds cannot both land.
const HOLDS_GUARD: &str = "/guards/command-holds";

/// How many times a creation is checked again when another one landed
/// between its check and its write.
const ADMIT_ATTEMPTS: usize = 8;

/// Admits and creates a Command: it carries its node's label, and nothing
/// it would hold is held by an unsettled Command (the 409 names it). The
/// check and the create are one transaction, through [`HOLDS_GUARD`].
pub async fn create(objects: &Objects, mut command: Command, dry_run: bool) -> Result<Command, ApiError> {
    command.metadata.labels.insert(NODE_LABEL.into(), command.spec.node.clone());
    for _ in 0..ADMIT_ATTEMPTS {
        let revision = objects.store().get(HOLDS_GUARD).await?.map(|kv| kv.mod_revision);
        let (others, _) = objects.list::<CommandSpec>().await?;
        check_holds(&command, &others)?;
        if dry_run {
            return objects.create(command, false, true).await;
        }
        let guard = Guard { key: HOLDS_GUARD.into(), revision };
        match objects.create_guarded(command.clone(), &guard).await {
            Err(ApiError::Conflict(_)) => continue,
            other => return other,
        }
    }
    Err(ApiError::Conflict(format!(
        "commands kept being created meanwhile; command {} was not created: try again",
        command.metadata.name
    )))
}

/// Refuses `command` when an unsettled other Command holds what it would.
fn check_holds(command: &Command, others: &[Command]) -> Result<(), ApiError> {
    let holds = command.spec.action.holds(&command.spec.node);
    let unsettled = others
        .iter()
        .filter(|o| !o.status.state_by_management.is_settled() && o.metadata.name != command.metadata.name);
    for other in unsettled {
        let their = other.spec.action.holds(&other.spec.node);
        if let Some(hold) = holds.iter().find(|h| their.iter().any(|t| t.overlaps(h))) {
            return Err(ApiError::Conflict(format!(
                "{hold} is held by command {} ({}, {:?}): wait for it to settle, or `herd command abandon {}`",
                other.metadata.name,
                other.spec.action.type_name(),
                other.status.state_by_management,
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
    Abandon,
}

/// Applies an operator's retry or abandon, recorded as an Event; a 409
/// says why it is not possible now.
pub async fn operator_action(
    objects: &Objects,
    events: &crate::events::EventRecorder,
    name: &str,
    action: OperatorAction,
) -> Result<Command, ApiError> {
    if let OperatorAction::Retry = action {
        // A retried Command holds again what it held: nothing else may.
        let command = objects.require::<CommandSpec>(name).await?;
        let (others, _) = objects.list::<CommandSpec>().await?;
        check_holds(&command, &others)?;
    }
    let written = objects
        .modify::<CommandSpec>(name, Part::Status, |command| {
            let done = match action {
                OperatorAction::Retry => command.status.operator_retry(now()),
                OperatorAction::Abandon => command.status.operator_abandon(now()),
            };
            done.map(|()| true)
                .map_err(|why| ApiError::Conflict(format!("command {name} cannot be {action:?}ed: {why}")))
        })
        .await?;
    let (type_, reason) = match action {
        OperatorAction::Retry => (herd_core::kinds::EventType::Normal, "CommandRetried"),
        OperatorAction::Abandon => (herd_core::kinds::EventType::Warning, "CommandAbandoned"),
    };
    events.record(&written, type_, reason, written.status.reason.clone()).await;
    Ok(written)
}
