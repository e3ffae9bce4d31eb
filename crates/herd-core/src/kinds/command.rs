//! `Command`: a long-running operation the server asks one node's agent to
//! carry out (CloudStack's Command/Answer, made durable on both sides).
//!
//! The spec says what to do and where; the status keeps the two views
//! apart, as CloudStack's reconcile table does: `stateByManagement` is the
//! server's, `stateByAgent` the agent's last report (from its journal),
//! with the answer, the retry count and why the last decision was taken.

use crate::descriptor::{Cell, Column};
use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Answer, CommandOrigin};
use crate::resource::{Object, Resource};
use crate::time::{HumanDuration, Timestamp};
use crate::validation::{FieldPath, ValidationErrors, check_duration, check_name};

pub type Command = Object<CommandSpec>;

/// The label every Command carries with its node's name: agents watch
/// their own Commands through it.
pub const NODE_LABEL: &str = "herd.io/node";

/// A Command's timeout: a second at least, a week at most (a copy of
/// terabytes).
pub const TIMEOUT_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(7 * 24 * 3600));

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandSpec {
    /// The node whose agent carries it out.
    pub node: String,
    /// How long the agent may take [default: per action].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<HumanDuration>,
    pub action: Action,
    /// Whose it is and why: the app-cluster controller's for one member
    /// of one cluster; none for an operator's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<CommandOrigin>,
}

/// What to do. Member and volume names are object names, so no path
/// built from them can leave the agent's data dir.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all_fields = "camelCase", deny_unknown_fields)]
pub enum Action {
    /// Start a member (a process) with fresh volumes where missing.
    StartMember {
        member: String,
        #[serde(deserialize_with = "crate::objects_only::object")]
        run: MemberRun,
    },
    /// Stop a member; its persistent volumes stay.
    StopMember { member: String },
    /// Pull a member's volume from the agent of `fromNode`, streamed and
    /// checksummed; resumable after an interruption.
    CopyVolume { member: String, volume: String, from_node: String },
    /// Move a member here from `fromNode`: stop it there, copy its
    /// persistent volumes, start it here, and remove the source copy only
    /// once this copy is verified.
    MigrateMember {
        member: String,
        from_node: String,
        #[serde(deserialize_with = "crate::objects_only::object")]
        run: MemberRun,
    },
    /// Delete a member's volume (the member must be stopped).
    DeleteVolume { member: String, volume: String },
    /// Run a shell script in a member's environment (its volumes, its
    /// environment variables), with the command's timeout. With
    /// `expectedInstance`, only while the member runs as that instance: a
    /// member that restarted meanwhile is refused (the caller handles the
    /// restart first).
    RunScript {
        member: String,
        script: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expected_instance: Option<String>,
    },
    /// Give an app-cluster member its configmeta (and its App's setup
    /// script, saved as `setup.sh`) in its `herd` volume and, with
    /// `runSetup`, launch `setup.sh --configure` detached, its outcome kept
    /// in the volume's `setup.status` (`<instance>=` at launch,
    /// `<instance>=<exit code>` at the end). Only while the member runs
    /// as `expectedInstance`.
    ConfigureMember {
        member: String,
        expected_instance: String,
        configmeta: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        setup_script: Option<String>,
        #[serde(default)]
        run_setup: bool,
        /// How long the setup may run [default: 5m].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        setup_timeout: Option<HumanDuration>,
    },
    /// Stop a member and remove it from the node: its volumes, logs and
    /// record. Repeatable.
    RemoveMember { member: String },
    /// Make a member its role's leader: once its `position` command says
    /// it has come as far as `catchUpTo` (the leader before it, which
    /// stood down there), run `script` (the promote hook) as RunScript
    /// does. Only while the member runs as `expectedInstance`.
    Promote {
        member: String,
        script: String,
        expected_instance: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        catch_up_to: Option<String>,
    },
    /// A leader stands down for a handover: its lease of `term` is given
    /// up on the agent, its demote hook runs (when that fails, its
    /// processes end, as at a fence), and the answer says the position
    /// it stood down at. Repeatable.
    Demote { member: String, term: u64 },
}

impl Default for Action {
    fn default() -> Self {
        Action::StopMember { member: String::new() }
    }
}

pub use super::member_run::{DrainHook, MemberRun, VolumeSpec};

impl Action {
    pub fn type_name(&self) -> &'static str {
        match self {
            Action::StartMember { .. } => "StartMember",
            Action::StopMember { .. } => "StopMember",
            Action::CopyVolume { .. } => "CopyVolume",
            Action::MigrateMember { .. } => "MigrateMember",
            Action::DeleteVolume { .. } => "DeleteVolume",
            Action::RunScript { .. } => "RunScript",
            Action::ConfigureMember { .. } => "ConfigureMember",
            Action::RemoveMember { .. } => "RemoveMember",
            Action::Promote { .. } => "Promote",
            Action::Demote { .. } => "Demote",
        }
    }

    pub fn member(&self) -> &str {
        match self {
            Action::StartMember { member, .. }
            | Action::StopMember { member }
            | Action::CopyVolume { member, .. }
            | Action::MigrateMember { member, .. }
            | Action::DeleteVolume { member, .. }
            | Action::RunScript { member, .. }
            | Action::ConfigureMember { member, .. }
            | Action::RemoveMember { member }
            | Action::Promote { member, .. }
            | Action::Demote { member, .. } => member,
        }
    }

    /// The default time the agent gets.
    pub fn default_timeout(&self) -> Duration {
        match self {
            Action::CopyVolume { .. } | Action::MigrateMember { .. } => Duration::from_secs(3600),
            Action::RunScript { .. } | Action::Promote { .. } | Action::Demote { .. } => Duration::from_secs(60),
            _ => Duration::from_secs(30),
        }
    }

    /// What this action holds while it is not settled: (node, member,
    /// volume), volume None meaning the whole member.
    pub fn holds(&self, node: &str) -> Vec<Hold> {
        let hold = |node: &str, volume: Option<&str>| Hold {
            node: node.to_string(),
            member: self.member().to_string(),
            volume: volume.map(str::to_string),
        };
        match self {
            Action::CopyVolume { volume, from_node, .. } => {
                vec![hold(node, Some(volume)), hold(from_node, Some(volume))]
            }
            Action::MigrateMember { from_node, .. } => vec![hold(node, None), hold(from_node, None)],
            Action::DeleteVolume { volume, .. } => vec![hold(node, Some(volume))],
            Action::StartMember { .. }
            | Action::StopMember { .. }
            | Action::RunScript { .. }
            | Action::ConfigureMember { .. }
            | Action::RemoveMember { .. }
            | Action::Promote { .. }
            | Action::Demote { .. } => vec![hold(node, None)],
        }
    }

    fn validate(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        check_name(&path.child("member"), self.member(), errors);
        match self {
            Action::StartMember { run, .. } => run.validate(&path.child("run"), errors),
            Action::MigrateMember { from_node, run, .. } => {
                check_name(&path.child("fromNode"), from_node, errors);
                run.validate(&path.child("run"), errors);
            }
            Action::CopyVolume { volume, from_node, .. } => {
                check_name(&path.child("volume"), volume, errors);
                check_name(&path.child("fromNode"), from_node, errors);
            }
            Action::DeleteVolume { volume, .. } => check_name(&path.child("volume"), volume, errors),
            Action::RunScript { script, .. } => {
                if script.trim().is_empty() {
                    errors.add(&path.child("script"), "must not be empty");
                }
            }
            Action::Promote { script, expected_instance, catch_up_to, .. } => {
                if script.trim().is_empty() {
                    errors.add(&path.child("script"), "must not be empty");
                }
                if expected_instance.is_empty() {
                    errors.add(&path.child("expectedInstance"), "must name the instance being promoted");
                }
                if let Some(position) = catch_up_to
                    && let Err(bad) = position.parse::<crate::role_leader::Position>()
                {
                    errors.add(&path.child("catchUpTo"), bad.to_string());
                }
            }
            Action::ConfigureMember { expected_instance, configmeta, .. } => {
                if expected_instance.is_empty() {
                    errors.add(&path.child("expectedInstance"), "must name the instance being configured");
                }
                if serde_json::from_str::<serde_json::Value>(configmeta).is_err() {
                    errors.add(&path.child("configmeta"), "must be a JSON document");
                }
            }
            Action::StopMember { .. } | Action::RemoveMember { .. } | Action::Demote { .. } => {}
        }
    }
}

/// Something a Command holds while it is not settled.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Hold {
    pub node: String,
    pub member: String,
    pub volume: Option<String>,
}

impl Hold {
    /// Whether two holds are on the same thing (a whole member covers each
    /// of its volumes).
    pub fn overlaps(&self, other: &Hold) -> bool {
        self.node == other.node
            && self.member == other.member
            && (self.volume.is_none() || other.volume.is_none() || self.volume == other.volume)
    }
}

impl std::fmt::Display for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.volume {
            Some(volume) => write!(f, "volume {}/{volume} on node {}", self.member, self.node),
            None => write!(f, "member {} on node {}", self.member, self.node),
        }
    }
}

/// What owns a volume or partial copy on `node`: an unsettled Command
/// that holds it, else the member it belongs to when the node knows that
/// member; None when nothing does (left by a failed or abandoned copy, or
/// a member gone without its volumes).
pub fn volume_owner(node: &str, stored: &crate::api::StoredVolume, commands: &[Command]) -> Option<String> {
    let hold = Hold { node: node.into(), member: stored.member.clone(), volume: Some(stored.volume.clone()) };
    let holder = commands.iter().find(|c| {
        !c.status.state_by_management.is_settled()
            && c.spec.action.holds(&c.spec.node).iter().any(|h| h.overlaps(&hold))
    });
    if let Some(command) = holder {
        return Some(format!(
            "command {} ({}, {})",
            command.metadata.name,
            command.spec.action.type_name(),
            command.status.state_by_management
        ));
    }
    match (stored.kind, stored.member_known) {
        (crate::api::StoredKind::Volume, true) => {
            Some(format!("member {} ({})", stored.member, if stored.member_running { "running" } else { "stopped" }))
        }
        // A partial copy belongs to no member: only a copy resumes it.
        _ => None,
    }
}

/// The server's state of a Command (CloudStack's state_by_management,
/// with two more: PROCESSING while the agent reports it works on it, and
/// ABANDONING/ABANDONED for the operator's way out).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ManagementState {
    /// Waiting to be issued, or issued and not yet taken up by the agent.
    #[default]
    Created,
    /// The agent reported that it works on the current attempt.
    Processing,
    /// The operator abandoned it while its agent worked on it: the agent
    /// is ending the work; what it holds stays held until it has.
    Abandoning,
    /// Given up by the operator, its work ended: it holds nothing.
    Abandoned,
    Completed,
    Failed,
    TimedOut,
    Interrupted,
    ReconcileRetry,
    Reconciling,
    Reconciled,
    ReconcileFailed,
    ReconcileSkipped,
}

impl ManagementState {
    /// Nothing more will happen to the Command by itself: it neither
    /// holds anything nor waits for the reconciler.
    pub fn is_settled(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Reconciled | Self::ReconcileSkipped | Self::Abandoned)
    }

    /// Issued and waiting for the agent's final answer.
    pub fn awaits_agent(self) -> bool {
        matches!(self, Self::Created | Self::Processing)
    }

    /// As the API writes it (`PROCESSING`), for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "CREATED",
            Self::Processing => "PROCESSING",
            Self::Abandoning => "ABANDONING",
            Self::Abandoned => "ABANDONED",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::TimedOut => "TIMED_OUT",
            Self::Interrupted => "INTERRUPTED",
            Self::ReconcileRetry => "RECONCILE_RETRY",
            Self::Reconciling => "RECONCILING",
            Self::Reconciled => "RECONCILED",
            Self::ReconcileFailed => "RECONCILE_FAILED",
            Self::ReconcileSkipped => "RECONCILE_SKIPPED",
        }
    }
}

impl std::fmt::Display for ManagementState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The agent's state of a Command, as its journal has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AgentState {
    Started,
    Processing,
    ProcessingInBackend,
    Completed,
    Failed,
    TimedOut,
    Interrupted,
    DangledInBackend,
}

impl AgentState {
    /// The agent is done with it, one way or another.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::TimedOut)
    }
    /// The agent is working on it.
    pub fn is_running(self) -> bool {
        matches!(self, Self::Started | Self::Processing | Self::ProcessingInBackend | Self::DangledInBackend)
    }

    /// Nothing more will happen to it in the agent: final, or interrupted
    /// (the server reconciles it). The agent forgets it once acknowledged.
    pub fn is_over(self) -> bool {
        self.is_final() || self == Self::Interrupted
    }
}

/// How the leader handed a Command to the agent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Issue {
    /// The issuing leader's term: an agent refuses a term older than the
    /// newest it has seen.
    pub term: u64,
    /// Counts issues of this Command; a retry issues it again.
    pub attempt: u32,
    pub at: Timestamp,
    /// The agent endpoints of the other nodes the action involves.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub peers: BTreeMap<String, String>,
    /// Signed grants for what the action needs from those agents, one per
    /// action (see `herd_core::grant`), valid while the attempt may run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandStatus {
    #[serde(default)]
    pub state_by_management: ManagementState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_by_agent: Option<AgentState>,
    /// Set by the leader when it hands the Command to the agent; the agent
    /// acts only on issued Commands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued: Option<Issue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<Answer>,
    /// Issues so far; the next issue is attempt `attempts + 1`.
    #[serde(default)]
    pub attempts: u32,
    /// Retries after the first attempt (by the reconciler or the operator).
    #[serde(default)]
    pub retry_count: u32,
    /// When either state last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<Timestamp>,
    /// Why the last decision was taken, for `herd describe`.
    #[serde(default)]
    pub reason: String,
    /// How far the agent got, while it works (a copy: `volume`, `bytes`
    /// staged, the volume's `totalBytes`); empty once it is over.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub progress: BTreeMap<String, String>,
    /// Set when the operator abandoned the Command while its agent worked
    /// on it: the agent ends the work of that attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abandon: Option<AbandonRequest>,
}

/// How the operator wants a running Command's work ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AbandonRequest {
    /// The attempt to end.
    pub attempt: u32,
    /// Keep a copy's partial staging (a later copy resumes from it);
    /// by default it is removed with the work.
    #[serde(default)]
    pub keep_staging: bool,
}

impl CommandStatus {
    /// Hands the Command to its agent as a new attempt.
    pub fn issue(&mut self, term: u64, peers: BTreeMap<String, String>, grants: Vec<String>, now: Timestamp) {
        self.attempts += 1;
        self.issued = Some(Issue { term, attempt: self.attempts, at: now, peers, grants });
        self.state_by_management = ManagementState::Created;
        self.state_by_agent = None;
        self.answer = None;
        self.abandon = None;
        self.updated = Some(now);
        self.reason = format!("issued (attempt {}, term {term})", self.attempts);
    }

    /// Makes the Command ready to be issued again, counting a retry.
    pub fn retry(&mut self, why: impl Into<String>, now: Timestamp) {
        self.issued = None;
        self.state_by_management = ManagementState::Created;
        self.retry_count += 1;
        self.updated = Some(now);
        self.reason = why.into();
    }

    /// `herd command retry`: issue the Command again. Refused (with why
    /// and what to do instead) while its agent is working on it, while it
    /// is being abandoned, and once it completed.
    pub fn operator_retry(&mut self, now: Timestamp) -> Result<(), String> {
        match (self.state_by_management, self.state_by_agent) {
            (ManagementState::Completed | ManagementState::Reconciled, _)
                if self.answer.as_ref().is_none_or(|a| a.success) =>
            {
                Err("it completed; there is nothing to retry (create a new Command to do it again)".into())
            }
            (ManagementState::Abandoning, _) => Err(format!(
                "its agent is still ending the work of attempt {}; retry once it is ABANDONED",
                self.attempts
            )),
            (state, Some(agent)) if state.awaits_agent() && agent.is_running() => Err(format!(
                "its agent is working on it (attempt {}, {agent:?}); wait for it, or `herd command abandon` it first",
                self.attempts
            )),
            (ManagementState::Created, _) if self.issued.is_none() => {
                Err("it has not been issued yet; the leader issues it shortly".into())
            }
            _ => {
                self.retry("retried by the operator", now);
                Ok(())
            }
        }
    }

    /// `herd command abandon`: give the Command up. When its agent works
    /// on it and its host is up, the Command is ABANDONING (holding what
    /// it holds) until the agent has ended the work; otherwise ABANDONED
    /// at once. Refused once it is settled.
    pub fn operator_abandon(&mut self, host_up: bool, keep_staging: bool, now: Timestamp) -> Result<(), String> {
        if self.state_by_management.is_settled() {
            return Err(format!(
                "it is already settled ({}) and holds nothing; `herd command retry` issues it again",
                self.state_by_management
            ));
        }
        if self.state_by_management == ManagementState::Abandoning {
            return Err("it is already being abandoned; its agent is ending the work".into());
        }
        let running = self.state_by_agent.is_some_and(AgentState::is_running);
        match self.issued.as_ref().map(|i| i.attempt) {
            Some(attempt) if running && host_up => {
                self.abandon = Some(AbandonRequest { attempt, keep_staging });
                let why = "abandoning: the agent is ending the work; what the Command holds is released once it has";
                self.mark(ManagementState::Abandoning, why, now);
            }
            Some(attempt) if running => {
                self.abandon = Some(AbandonRequest { attempt, keep_staging });
                let why = "abandoned while its node is down: the agent ends the work when it comes back";
                self.mark(ManagementState::Abandoned, why, now);
            }
            _ => self.mark(ManagementState::Abandoned, "abandoned by the operator", now),
        }
        Ok(())
    }

    /// Moves the management state, saying why.
    pub fn mark(&mut self, state: ManagementState, why: impl Into<String>, now: Timestamp) {
        self.state_by_management = state;
        self.updated = Some(now);
        self.reason = why.into();
    }

    /// Records what the agent reported of the current attempt; returns
    /// whether the agent may now forget it (its state is final, or it was
    /// interrupted, and that is recorded). A settled Command keeps its
    /// management state and its answer (a reconciler's finding is not
    /// overwritten by a repeated or late report); the agent's state is
    /// still shown.
    pub fn record_agent_report(&mut self, state: AgentState, answer: Option<Answer>, now: Timestamp) -> bool {
        if self.state_by_management.is_settled() {
            self.state_by_agent = Some(state);
            return state.is_over();
        }
        if self.state_by_management == ManagementState::Abandoning {
            self.state_by_agent = Some(state);
            if !state.is_over() {
                return false;
            }
            // What happened, happened: a copy that completed before the
            // abandon reached the agent is COMPLETED.
            let (next, why) = match state {
                AgentState::Completed => (ManagementState::Completed, "completed before the agent could end it"),
                _ => (ManagementState::Abandoned, "abandoned by the operator; the agent ended the work"),
            };
            self.answer = answer.or(self.answer.take());
            self.mark(next, why, now);
            return true;
        }
        if self.state_by_agent != Some(state) || (answer.is_some() && self.answer != answer) {
            self.updated = Some(now);
        }
        self.state_by_agent = Some(state);
        if answer.is_some() {
            self.answer = answer;
        }
        let management = match state {
            AgentState::Completed => Some(ManagementState::Completed),
            AgentState::Failed => Some(ManagementState::Failed),
            AgentState::TimedOut => Some(ManagementState::TimedOut),
            AgentState::Interrupted => Some(ManagementState::Interrupted),
            AgentState::Started
            | AgentState::Processing
            | AgentState::ProcessingInBackend
            | AgentState::DangledInBackend => None,
        };
        let working = state.is_running() && self.state_by_management == ManagementState::Created;
        let next = if working { Some(ManagementState::Processing) } else { management };
        if let Some(next) = next
            && self.state_by_management != next
        {
            self.state_by_management = next;
            self.reason = match &self.answer {
                Some(answer) if management.is_some() => format!("the agent reported {state:?}: {}", answer.message),
                _ => format!("the agent reported {state:?}"),
            };
            self.updated = Some(now);
        }
        management.is_some()
    }
}

impl Resource for CommandSpec {
    const KIND: &'static str = "Command";
    const PLURAL: &'static str = "commands";
    const SHORT: &'static str = "cmd";
    const REPLICATED: bool = true;
    const COLUMNS: &'static [Column] = &[
        Column::NAME,
        Column::of("NODE", Cell::Text { path: "/spec/node" }),
        Column::of("ACTION", Cell::Pair { a: "/spec/action/type", between: " ", b: "/spec/action/member" }),
        Column::of("MANAGEMENT", Cell::TextOr { path: "/status/stateByManagement", otherwise: "CREATED" }),
        Column::of("AGENT", Cell::Text { path: "/status/stateByAgent" }),
        Column::of("ATTEMPT", Cell::Text { path: "/status/issued/attempt" }),
        Column::of("RETRIES", Cell::Text { path: "/status/retryCount" }),
        Column::AGE,
        Column::wide("TERM", Cell::Text { path: "/status/issued/term" }),
        Column::wide("REASON", Cell::Text { path: "/status/reason" }),
        Column::wide("ANSWER", Cell::Text { path: "/status/answer/message" }),
    ];
    const HAS_STATUS: bool = true;
    type Status = CommandStatus;

    fn validate_spec(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        check_name(&path.child("node"), &self.node, errors);
        if let Some(timeout) = self.timeout {
            check_duration(&path.child("timeout"), timeout, TIMEOUT_RANGE, errors);
        }
        self.action.validate(&path.child("action"), errors);
        if let Some(origin) = &self.origin {
            let path = path.child("origin");
            check_name(&path.child("cluster"), &origin.cluster, errors);
            if origin.member != self.action.member() {
                errors.add(
                    &path.child("member"),
                    format!("{:?} is not the member the action is for, {:?}", origin.member, self.action.member()),
                );
            }
        }
    }

    fn owned_labels(&self) -> Vec<(&'static str, String)> {
        vec![(NODE_LABEL, self.node.clone())]
    }

    /// A Command is a record of what was asked: a different request is a
    /// new Command, so that no record tells a false story.
    fn validate_spec_update(&self, old: &Self, path: &FieldPath, errors: &mut ValidationErrors) {
        if self != old {
            errors.add(path, "is immutable once the Command is created: create a new Command for another request");
        }
    }
}

impl CommandSpec {
    pub fn timeout(&self) -> Duration {
        self.timeout.map_or_else(|| self.action.default_timeout(), HumanDuration::get)
    }

    /// Every node the Command involves: its own, and the source of a copy
    /// or migration.
    pub fn nodes(&self) -> Vec<&str> {
        let mut nodes = vec![self.node.as_str()];
        if let Action::CopyVolume { from_node, .. } | Action::MigrateMember { from_node, .. } = &self.action {
            nodes.push(from_node);
        }
        nodes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(spec: serde_json::Value) -> Result<Command, ValidationErrors> {
        let command = Command::from_json_value(serde_json::json!({"metadata": {"name": "c1"}, "spec": spec}))?;
        command.validate().map(|()| command)
    }

    fn fields(error: ValidationErrors) -> Vec<String> {
        error.errors.into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn an_unknown_action_is_named() {
        let error = parse(serde_json::json!({"node": "n1", "action": {"type": "FormatDisk", "member": "m"}}));
        let error = error.unwrap_err();
        assert_eq!(fields(error.clone()), ["spec.action.type"], "{error}");
        assert!(error.to_string().contains("FormatDisk"), "{error}");
    }

    #[test]
    fn names_that_could_escape_the_data_dir_are_refused() {
        let spec = serde_json::json!({"node": "n1", "action": {"type": "DeleteVolume", "member": "..", "volume": "../../etc"}});
        assert_eq!(fields(parse(spec).unwrap_err()), ["spec.action.member", "spec.action.volume"]);
        let spec = serde_json::json!({"node": "n1", "action": {"type": "CopyVolume", "member": "m", "volume": "a/b", "fromNode": "n2"}});
        assert_eq!(fields(parse(spec).unwrap_err()), ["spec.action.volume"]);
    }

    #[test]
    fn a_member_run_is_checked() {
        let spec = serde_json::json!({"node": "n1", "action": {"type": "StartMember", "member": "m",
            "run": {"command": [], "env": {"1X": "y"}, "volumes": [{"name": "d"}, {"name": "d"}]}}});
        assert_eq!(
            fields(parse(spec).unwrap_err()),
            ["spec.action.run.command", "spec.action.run.volumes[1].name", "spec.action.run.env[1X]"]
        );
        let ok = serde_json::json!({"node": "n1", "action": {"type": "StartMember", "member": "m",
            "run": {"command": ["sleep", "100"], "volumes": [{"name": "data", "persistent": true}]}}});
        assert!(parse(ok).is_ok());
    }

    #[test]
    fn agent_reports_move_the_management_state_until_it_is_settled() {
        let now = Timestamp::parse("2026-11-29T10:00:00Z").unwrap();
        let mut status = CommandStatus::default();
        assert!(!status.record_agent_report(AgentState::Processing, None, now), "running: keep it");
        assert_eq!(status.state_by_management, ManagementState::Processing, "the agent works on it: say so");
        assert!(status.record_agent_report(AgentState::Interrupted, None, now));
        assert_eq!(status.state_by_management, ManagementState::Interrupted);
        let done = Answer::said(true, "copied");
        assert!(status.record_agent_report(AgentState::Completed, Some(done.clone()), now));
        assert_eq!((status.state_by_management, status.answer.clone()), (ManagementState::Completed, Some(done)));
        // Settled: a late report is shown but changes nothing else.
        let late = Answer::said(false, "interrupted");
        assert!(status.record_agent_report(AgentState::Interrupted, Some(late), now));
        assert_eq!(status.state_by_management, ManagementState::Completed);
        assert_eq!(status.state_by_agent, Some(AgentState::Interrupted));
        assert_eq!(status.answer.as_ref().map(|a| a.message.as_str()), Some("copied"), "the recorded truth stays");
    }

    #[test]
    fn the_operator_retries_and_abandons_within_the_rules() {
        let now = Timestamp::parse("2026-11-29T10:00:00Z").unwrap();
        let mut status = CommandStatus::default();
        assert!(status.operator_retry(now).unwrap_err().contains("not been issued"));
        status.issue(1, BTreeMap::new(), Vec::new(), now);
        status.record_agent_report(AgentState::Processing, None, now);
        assert!(status.operator_retry(now).unwrap_err().contains("working on it"));
        status.operator_abandon(true, false, now).unwrap();
        assert_eq!(status.state_by_management, ManagementState::Abandoning, "the holds stay until the work ends");
        assert_eq!(status.abandon, Some(AbandonRequest { attempt: 1, keep_staging: false }));
        assert!(!status.state_by_management.is_settled());
        assert!(status.operator_retry(now).unwrap_err().contains("still ending the work"));
        assert!(status.operator_abandon(true, false, now).unwrap_err().contains("already being abandoned"));
        // The agent ends the work and reports it: ABANDONED, settled.
        let ended = Answer::said(false, "cancelled (abandoned)");
        assert!(status.record_agent_report(AgentState::Interrupted, Some(ended), now));
        assert_eq!(status.state_by_management, ManagementState::Abandoned);
        assert!(status.operator_abandon(true, false, now).unwrap_err().contains("already settled (ABANDONED)"));
        // An abandoned (or failed) Command can be retried: a new attempt.
        status.operator_retry(now).unwrap();
        assert_eq!(
            (status.state_by_management, status.issued.clone(), status.retry_count),
            (ManagementState::Created, None, 1)
        );
        status.issue(1, BTreeMap::new(), Vec::new(), now);
        assert_eq!(status.issued.as_ref().unwrap().attempt, 2);
        status.record_agent_report(AgentState::Completed, None, now);
        assert!(status.operator_retry(now).unwrap_err().contains("completed"));
    }

    #[test]
    fn abandoning_a_command_whose_host_is_down_or_that_is_not_running_is_immediate() {
        let now = Timestamp::parse("2026-11-29T10:00:00Z").unwrap();
        let mut status = CommandStatus::default();
        status.issue(1, BTreeMap::new(), Vec::new(), now);
        status.record_agent_report(AgentState::ProcessingInBackend, None, now);
        status.operator_abandon(false, true, now).unwrap();
        assert_eq!(status.state_by_management, ManagementState::Abandoned);
        assert_eq!(status.abandon, Some(AbandonRequest { attempt: 1, keep_staging: true }), "ended on its return");
        let mut waiting = CommandStatus::default();
        waiting.issue(1, BTreeMap::new(), Vec::new(), now);
        waiting.operator_abandon(true, false, now).unwrap();
        assert_eq!((waiting.state_by_management, waiting.abandon.clone()), (ManagementState::Abandoned, None));
        // A copy that completed before the abandon reached its agent completed.
        let mut late = CommandStatus::default();
        late.issue(1, BTreeMap::new(), Vec::new(), now);
        late.record_agent_report(AgentState::Processing, None, now);
        late.operator_abandon(true, false, now).unwrap();
        late.record_agent_report(AgentState::Completed, None, now);
        assert_eq!(late.state_by_management, ManagementState::Completed);
    }

    #[test]
    fn a_volume_is_owned_by_the_command_holding_it_or_by_its_known_member() {
        use crate::api::{StoredKind, StoredVolume};
        let stored = |kind, known| StoredVolume {
            member: "m".into(),
            volume: "data".into(),
            kind,
            bytes: 10,
            member_known: known,
            member_running: known,
            owner: None,
        };
        let copy = Command::new(
            "copy",
            CommandSpec {
                node: "n2".into(),
                timeout: None,
                action: Action::CopyVolume { member: "m".into(), volume: "data".into(), from_node: "n1".into() },
                origin: None,
            },
        );
        let owner = volume_owner("n2", &stored(StoredKind::Staging, false), std::slice::from_ref(&copy));
        assert_eq!(owner.as_deref(), Some("command copy (CopyVolume, CREATED)"));
        assert_eq!(volume_owner("n2", &stored(StoredKind::Volume, true), &[]).as_deref(), Some("member m (running)"));
        assert_eq!(volume_owner("n2", &stored(StoredKind::Staging, true), &[]), None, "a partial copy left behind");
        assert_eq!(volume_owner("n2", &stored(StoredKind::Volume, false), &[]), None, "a member gone");
        let mut settled = copy;
        settled.status.state_by_management = ManagementState::Failed;
        assert_eq!(volume_owner("n2", &stored(StoredKind::Staging, false), &[settled]), None);
    }

    #[test]
    fn holds_overlap_on_the_same_member_or_volume() {
        let copy = Action::CopyVolume { member: "m".into(), volume: "data".into(), from_node: "n2".into() };
        let holds = copy.holds("n1");
        assert_eq!(holds.len(), 2);
        let delete_source = Action::DeleteVolume { member: "m".into(), volume: "data".into() }.holds("n2");
        assert!(holds.iter().any(|h| h.overlaps(&delete_source[0])));
        let other_volume = Action::DeleteVolume { member: "m".into(), volume: "logs".into() }.holds("n2");
        assert!(!holds.iter().any(|h| h.overlaps(&other_volume[0])));
        let stop = Action::StopMember { member: "m".into() }.holds("n1");
        assert!(holds.iter().any(|h| h.overlaps(&stop[0])), "the whole member covers its volumes");
    }
}
