//! The Commands the app-cluster controller gives members, and what their
//! outcomes mean for the members' statuses.
//!
//! Each Command carries annotations saying whose it is and why
//! (`herd.io/member`, `herd.io/purpose`, and for a configure the
//! generation, for a notify its arguments); a member has at most one
//! unsettled Command at a time. A settled one is read once, its outcome
//! written into the member's status, and then deleted.

use herd_core::kinds::app::{AppRole, HERD_VOLUME};
use herd_core::kinds::app_cluster::{AppCluster, ClusterRole};
use herd_core::kinds::command::{MemberRun, VolumeSpec};
use herd_core::kinds::{Action, Command, CommandSpec, ManagementState, Member, MemberStatus};
use herd_core::member_sync::{record_command, record_configure};
use herd_core::notifies::record_delivery;

pub const CLUSTER_ANNOTATION: &str = "herd.io/cluster";
pub const MEMBER_ANNOTATION: &str = "herd.io/member";
const PURPOSE_ANNOTATION: &str = "herd.io/purpose";
const GENERATION_ANNOTATION: &str = "herd.io/generation";
const NOTIFY_ANNOTATION: &str = "herd.io/notify";
const DIGEST_ANNOTATION: &str = "herd.io/configmeta-digest";

/// Why the controller gave a member a Command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    Start,
    Configure,
    Notify,
    Remove,
    /// A move with its data (MigrateMember, on the target node).
    Migrate,
    /// The stop of a restart in place.
    Restart,
}

impl Purpose {
    fn as_str(self) -> &'static str {
        match self {
            Purpose::Start => "start",
            Purpose::Configure => "configure",
            Purpose::Notify => "notify",
            Purpose::Remove => "remove",
            Purpose::Migrate => "migrate",
            Purpose::Restart => "restart",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [Purpose::Start, Purpose::Configure, Purpose::Notify, Purpose::Remove, Purpose::Migrate, Purpose::Restart]
            .into_iter()
            .find(|p| p.as_str() == text)
    }
}

/// How a member of `role` runs: the App's process with the cluster's
/// overrides, herd's variables (`HERD_CLUSTER`, `HERD_ROLE`, a
/// `HERD_PORT_<NAME>` per named port) and herd's own volume (persistent
/// when any of the role's volumes is).
pub fn member_run(cluster: &AppCluster, app_role: &AppRole, cluster_role: &ClusterRole, member: &Member) -> MemberRun {
    let mut run = app_role.run.clone();
    run.env.extend(cluster_role.env.clone());
    run.env.insert("HERD_CLUSTER".into(), cluster.metadata.name.clone());
    run.env.insert("HERD_ROLE".into(), app_role.name.clone());
    for port in &app_role.ports {
        if let Some(number) = member.spec.ports.get(&port.name) {
            run.env.insert(port.variable(), number.to_string());
        }
    }
    let persistent = app_role.run.volumes.iter().any(|v| v.persistent);
    run.volumes.push(VolumeSpec { name: HERD_VOLUME.into(), persistent });
    run.readiness = app_role.readiness.clone();
    run
}

/// A new Command for `member` on its node, annotated with its purpose.
pub fn command_for(
    cluster: &str,
    member: &Member,
    purpose: Purpose,
    action: Action,
    extra: &[(&str, String)],
) -> Option<Command> {
    let node = member.spec.node.clone()?;
    let name = format!("{}.{}.{}", member.metadata.name, purpose.as_str(), uuid::Uuid::now_v7().simple());
    let timeout = match &action {
        Action::RunScript { .. } => Some(herd_core::HumanDuration::from_secs(300)),
        _ => None,
    };
    let mut command = Command::new(name, CommandSpec { node, timeout, action });
    let annotations = &mut command.metadata.annotations;
    annotations.insert(CLUSTER_ANNOTATION.into(), cluster.into());
    annotations.insert(MEMBER_ANNOTATION.into(), member.metadata.name.clone());
    annotations.insert(PURPOSE_ANNOTATION.into(), purpose.as_str().into());
    for (key, value) in extra {
        annotations.insert((*key).into(), value.clone());
    }
    Some(command)
}

/// What a ConfigureMember's configmeta is of: the generation and the
/// document's digest.
pub fn configmeta_annotations(generation: i64, digest: String) -> [(&'static str, String); 2] {
    [(GENERATION_ANNOTATION, generation.to_string()), (DIGEST_ANNOTATION, digest)]
}

pub fn notify_annotation(arguments: &[String]) -> (&'static str, String) {
    (NOTIFY_ANNOTATION, serde_json::to_string(arguments).unwrap_or_default())
}

/// Whether a Command concerns the member's node: it runs there, or moves
/// the member away from there.
pub fn concerns(command: &Command, node: Option<&String>) -> bool {
    let from = match &command.spec.action {
        Action::MigrateMember { from_node, .. } => Some(from_node),
        _ => None,
    };
    node.is_some_and(|node| *node == command.spec.node || from == Some(node))
}

/// Why a Command of this controller exists.
pub fn purpose_of(command: &Command) -> Option<Purpose> {
    command.metadata.annotations.get(PURPOSE_ANNOTATION).and_then(|p| Purpose::parse(p))
}

/// The member a Command of this controller is for.
pub fn member_of(command: &Command) -> Option<&str> {
    command.metadata.annotations.get(MEMBER_ANNOTATION).map(String::as_str)
}

/// The outcome of a settled Command: Ok, or why not (the agent's message,
/// with a script's exit status and the tail of its standard error).
fn outcome(command: &Command) -> Result<(), String> {
    let status = &command.status;
    match (&status.answer, status.state_by_management) {
        (Some(answer), ManagementState::Completed | ManagementState::Reconciled) if answer.success => Ok(()),
        (Some(answer), _) => {
            let stderr = answer.details.get("stderr").map(|e| e.trim()).filter(|e| !e.is_empty());
            let tail: Option<String> = stderr.map(|e| {
                let start = e.char_indices().rev().nth(499).map_or(0, |(i, _)| i);
                e[start..].to_string()
            });
            Err(match tail {
                Some(tail) => format!("{}: {tail}", answer.message),
                None => answer.message.clone(),
            })
        }
        (None, state) => Err(format!("command {} ended {state}: {}", command.metadata.name, status.reason)),
    }
}

/// What reading a settled Command did.
#[derive(Debug, Default)]
pub struct Consumed {
    /// A RemoveMember succeeded for these members.
    pub removed: Vec<String>,
}

/// Writes a settled Command's outcome into its member's status.
pub fn consume(command: &Command, status: &mut MemberStatus, consumed: &mut Consumed) {
    let annotations = &command.metadata.annotations;
    let Some(purpose) = purpose_of(command) else { return };
    let result = outcome(command);
    if purpose != Purpose::Notify {
        record_command(status, result.is_ok(), crate::objects::now());
    }
    match (purpose, &command.spec.action) {
        (Purpose::Start, _) => {
            if let Err(why) = result {
                status.reason = Some(format!("starting it failed: {why}"));
            }
        }
        (Purpose::Configure, Action::ConfigureMember { expected_instance, run_setup, .. }) => {
            let generation = annotations.get(GENERATION_ANNOTATION).and_then(|g| g.parse().ok()).unwrap_or(0);
            let digest = annotations.get(DIGEST_ANNOTATION).map(String::as_str);
            record_configure(status, expected_instance, (generation, digest), *run_setup, result);
        }
        (Purpose::Notify, _) => {
            let arguments: Vec<String> =
                annotations.get(NOTIFY_ANNOTATION).and_then(|a| serde_json::from_str(a).ok()).unwrap_or_default();
            record_delivery(status, &arguments, result, crate::objects::now());
        }
        (Purpose::Remove, _) => match result {
            Ok(()) => consumed.removed.extend(member_of(command).map(str::to_string)),
            Err(why) => status.reason = Some(format!("removing it failed: {why}")),
        },
        (Purpose::Migrate, _) => herd_core::migration::record_migration(status, result),
        (Purpose::Restart, _) => {
            if let Err(why) = result {
                status.reason = Some(format!("stopping it for its restart failed: {why}"));
            }
        }
        (Purpose::Configure, _) => {}
    }
}
