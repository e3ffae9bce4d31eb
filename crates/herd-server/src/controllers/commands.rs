//! The command controller (leader only): issues new Commands to their
//! agents in this leader's term, and runs the decision table of
//! `herd_core::reconcile` on every unsettled one: waits, marks it timed
//! out, reconciles it, or gives it up, each time saying why. A Command is
//! a key of the keyed runtime, woken by its own changes and those of its
//! nodes; Commands are looked at side by side (each on its own object, so
//! their writes meet in the store's group commits), copies fewer at a
//! time than the rest.
//!
//! Time is judged on this process's monotonic clock from when it first saw
//! a Command's status as it is (as the node controller judges heartbeats):
//! a new leader gives every Command the full grace again.

use std::sync::Arc;
use std::time::Duration;

use herd_client::ClientError;
use herd_core::grant::Access;

use herd_core::findings::{CopyLook, Facts, Finding, LookError, find_out};
use herd_core::kinds::{
    Action, ClusterConfigSpec, Command, CommandSpec, EventReason, EventType, ManagementState, NodeSpec,
};
use herd_core::reconcile::{CommandView, DestinationLook, Step, copy_verdict, decide};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::change_clock::ChangeClock;
use crate::commands::Issuer;
use crate::controllers::keyed::{Action as Next, KeyedController, Watches};
use crate::events::EventRecorder;
use crate::metrics::Metrics;
use crate::nodes::cluster_config;
use crate::objects::ObjectsError;
use crate::objects::{Objects, Part, now};
use crate::reflector::Reflector;

/// Between the two looks at a copy's destination.
const SECOND_LOOK: Duration = Duration::from_secs(1);
/// Copies reconciled side by side: each waits a second between its two
/// looks and only reads from the agents, so hundreds of interrupted copies
/// (a host that went down) do not take hundreds of seconds.
const COPIES_AT_ONCE: usize = 16;
/// How soon a copy that found no turn free asks again.
const COPY_TURN: Duration = Duration::from_millis(250);
/// Commands looked at side by side, copies included: a burst of new
/// ones is issued in a few commits, not one commit each.
const AT_ONCE: usize = 80;

/// When this controller first saw each Command's status as it is now, and
/// its current attempt issued.
#[derive(Default)]
struct Sightings {
    updated: ChangeClock<Option<herd_core::Timestamp>>,
    issued: ChangeClock<u32>,
}

impl Sightings {
    fn forget(&mut self, name: &str) {
        self.updated.retain(|key| key != name);
        self.issued.retain(|key| key != name);
    }

    fn since_update(&mut self, command: &Command, now: Instant) -> Duration {
        self.updated.since(&command.metadata.name, command.status.updated, now)
    }

    fn since_issued(&mut self, command: &Command, now: Instant) -> Option<Duration> {
        let attempt = command.status.issued.as_ref()?.attempt;
        Some(self.issued.since(&command.metadata.name, attempt, now))
    }
}

pub struct CommandController {
    pub objects: Objects,
    /// Issues in this leadership's term.
    pub issuer: Issuer,
    pub commands: Reflector<CommandSpec>,
    pub nodes: Reflector<NodeSpec>,
    pub config: Reflector<ClusterConfigSpec>,
    pub events: EventRecorder,
    /// Looked at by Commands side by side, hence the lock.
    sightings: std::sync::Mutex<Sightings>,
    /// Copies looked at at once (see [`COPIES_AT_ONCE`]).
    copies: Semaphore,
    /// How long each Command this controller settles took.
    metrics: Arc<Metrics>,
}

impl KeyedController for CommandController {
    const NAME: &'static str = "commands";
    const CONCURRENCY: usize = AT_ONCE;

    async fn synced(&self) {
        self.commands.synced().await;
        self.nodes.synced().await;
        self.config.synced().await;
    }

    /// The unsettled Commands (a settled one needs no look).
    fn keys(&self) -> Vec<String> {
        let unsettled =
            self.commands.map(|c| (!c.status.state_by_management.is_settled()).then(|| c.metadata.name.clone()));
        unsettled.into_iter().flatten().collect()
    }

    /// Looks at one Command, again after the reconcile interval while it
    /// is unsettled (its timeouts are judged then).
    async fn reconcile(&self, name: &str) -> Result<Next, ObjectsError> {
        let command = self.commands.get_shared(name).filter(|c| !c.status.state_by_management.is_settled());
        let Some(command) = command else {
            self.sightings.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).forget(name);
            return Ok(Next::AwaitChange);
        };
        // A copy waiting for its turn holds no slot the others could use.
        let _copying = match command.spec.action {
            Action::CopyVolume { .. } => match self.copies.try_acquire() {
                Ok(permit) => Some(permit),
                Err(_) => return Ok(Next::Requeue(COPY_TURN)),
            },
            _ => None,
        };
        self.look_at(&command).await?;
        Ok(Next::Requeue(cluster_config(&self.config).commands.reconcile_interval.get()))
    }
}

impl CommandController {
    pub fn new(
        objects: Objects,
        issuer: Issuer,
        commands: Reflector<CommandSpec>,
        nodes: Reflector<NodeSpec>,
        config: Reflector<ClusterConfigSpec>,
        metrics: Arc<Metrics>,
    ) -> Self {
        CommandController {
            events: EventRecorder::new(objects.clone(), "commands"),
            objects,
            issuer,
            commands,
            nodes,
            config,
            sightings: Default::default(),
            copies: Semaphore::new(COPIES_AT_ONCE),
            metrics,
        }
    }

    /// A Command's own changes, and its nodes' beyond a heartbeat (a
    /// Command waits for its node to be Ready: a node coming back wakes
    /// it); every Command on a change of the cluster's settings.
    pub fn watches(&self) -> Watches {
        let commands = self.commands.clone();
        Watches::new().owns(&self.commands).all_on(&self.config).watches(&self.nodes, move |old, new| {
            if let (Some(old), Some(new)) = (old, new)
                && !herd_core::node_health::changed_beyond_heartbeat(old, new)
            {
                return Vec::new();
            }
            let node = old.or(new).map(|n| n.metadata.name.as_str()).unwrap_or_default();
            let on_it = commands.map(|c| {
                let unsettled = !c.status.state_by_management.is_settled();
                (unsettled && c.spec.nodes().contains(&node)).then(|| c.metadata.name.clone())
            });
            on_it.into_iter().flatten().collect()
        })
    }

    async fn look_at(&self, command: &Command) -> Result<(), ObjectsError> {
        if command.status.state_by_management.is_settled() {
            return Ok(());
        }
        let offline = command.spec.nodes().into_iter().find(|node| {
            self.nodes.get_shared(node).is_some_and(|n| n.spec.role == herd_core::kinds::NodeRole::Offline)
        });
        let node = self.nodes.get_shared(&command.spec.node);
        let settings = cluster_config(&self.config).commands;
        let now_mono = Instant::now();
        let (since_update, since_issued) = {
            let mut sightings = self.sightings.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            (sightings.since_update(command, now_mono), sightings.since_issued(command, now_mono))
        };
        let view = CommandView {
            management: command.status.state_by_management,
            issued: command.status.issued.is_some(),
            offline_node: offline,
            agent: command.status.state_by_agent,
            since_update,
            since_issued,
            timeout: command.spec.timeout(),
            retry_count: command.status.retry_count,
            host_up: node.is_some_and(|n| n.status.ready),
        };
        let (step, why) = decide(&view, &settings.reconcile());
        let marked = |state, reason| self.mark(command, state, &why, EventType::Warning, reason);
        match step {
            Step::Skip | Step::Wait => Ok(()),
            Step::Issue => self.issue(command).await,
            Step::MarkTimedOut => marked(ManagementState::TimedOut, EventReason::CommandTimedOut).await,
            Step::MarkRetry => marked(ManagementState::ReconcileRetry, EventReason::ReconcileRetry).await,
            Step::FinishAbandon => marked(ManagementState::Abandoned, EventReason::CommandAbandoned).await,
            Step::GiveUp => marked(ManagementState::ReconcileSkipped, EventReason::CommandGivenUp).await,
            Step::Reconcile => self.reconcile(command, &why).await,
        }
    }

    /// Hands a new Command to its agent, with the agent endpoint of the
    /// node its action takes data from.
    async fn issue(&self, command: &Command) -> Result<(), ObjectsError> {
        let from = match &command.spec.action {
            Action::CopyVolume { from_node, .. } | Action::MigrateMember { from_node, .. } => {
                self.nodes.get_shared(from_node).and_then(|n| n.status.address.clone())
            }
            _ => None,
        };
        self.objects
            .modify::<CommandSpec, ObjectsError>(&command.metadata.name, Part::Status, |c| {
                if c.status.issued.is_some() || c.status.state_by_management != ManagementState::Created {
                    return Ok(false);
                }
                self.issuer.issue(c, from.clone());
                Ok(true)
            })
            .await?;
        Ok(())
    }

    async fn mark(
        &self,
        command: &Command,
        state: ManagementState,
        why: &str,
        type_: EventType,
        reason: EventReason,
    ) -> Result<(), ObjectsError> {
        let mut before = ManagementState::default();
        let written = self
            .objects
            .modify::<CommandSpec, ObjectsError>(&command.metadata.name, Part::Status, |c| {
                before = c.status.state_by_management;
                c.status.mark(state, why, now());
                Ok(true)
            })
            .await?;
        self.metrics.observe_settling(&written, before);
        self.events.record(&written, type_, reason, format!("{state}: {why}")).await;
        Ok(())
    }

    /// Finds out what really happened, from what the agents report and
    /// what they hold, and records it: done (RECONCILED, with the facts),
    /// issued again, or looked at again later.
    async fn reconcile(&self, command: &Command, why: &str) -> Result<(), ObjectsError> {
        let finding = self.find_out(command).await;
        let name = &command.metadata.name;
        let (reason, message) = match &finding {
            Finding::Done(answer) => (EventReason::CommandReconciled, format!("{why}; found: {}", answer.message)),
            Finding::Again(found) => (EventReason::CommandRetried, format!("{why}; found: {found}; issuing it again")),
            Finding::Later(found) => {
                (EventReason::ReconcileRetry, format!("{why}; found: {found}; looking again later"))
            }
            Finding::Unknown(error) => (EventReason::ReconcileFailed, format!("{why}; could not find out: {error}")),
        };
        let mut before = ManagementState::default();
        let written = self
            .objects
            .modify::<CommandSpec, ObjectsError>(name, Part::Status, |c| {
                before = c.status.state_by_management;
                match &finding {
                    Finding::Done(answer) => {
                        c.status.answer = Some(answer.clone());
                        c.status.mark(ManagementState::Reconciled, message.clone(), now());
                    }
                    Finding::Again(_) => c.status.retry(message.clone(), now()),
                    Finding::Later(_) => c.status.mark(ManagementState::ReconcileRetry, message.clone(), now()),
                    Finding::Unknown(_) => {
                        c.status.retry_count += 1;
                        c.status.mark(ManagementState::ReconcileFailed, message.clone(), now());
                    }
                }
                Ok(true)
            })
            .await?;
        self.metrics.observe_settling(&written, before);
        let type_ = if matches!(finding, Finding::Unknown(_)) { EventType::Warning } else { EventType::Normal };
        self.events.record(&written, type_, reason, message).await;
        Ok(())
    }

    /// Gathers what the agents report (and, for a copy, what its two ends
    /// hold) and asks herd-core what it means.
    async fn find_out(&self, command: &Command) -> Finding {
        let node = self.nodes.get_shared(&command.spec.node);
        let action = &command.spec.action;
        let member = action.member();
        let report = node.as_ref().and_then(|n| n.status.members.iter().find(|m| m.name == member));
        let source_has_member = match action {
            Action::MigrateMember { from_node, .. } => {
                self.nodes.get_shared(from_node).is_none_or(|n| n.status.members.iter().any(|m| m.name == member))
            }
            _ => false,
        };
        let copy = match action {
            Action::CopyVolume { volume, from_node, .. } => {
                Some(self.look_at_copy(&command.spec.node, from_node, member, volume).await)
            }
            _ => None,
        };
        let facts = Facts {
            node: &command.spec.node,
            node_ready: node.as_ref().is_some_and(|n| n.status.ready),
            member: report,
            source_has_member,
            copy: copy.as_ref(),
        };
        find_out(action, &facts)
    }

    async fn look_at_copy(&self, to: &str, from: &str, member: &str, volume: &str) -> Result<CopyLook, LookError> {
        let agent = |node: &str| {
            let node = self
                .nodes
                .get(node)
                .ok_or(LookError { unreachable: false, message: format!("node {node} does not exist") })?;
            let read = vec![Access::read_volume(member, volume)];
            self.issuer
                .peers
                .agent(&node, read, "looking at a copy")
                .map_err(|e| LookError { unreachable: false, message: format!("asking {}: {e}", node.metadata.name) })
        };
        let asking = |node: &str| {
            let node = node.to_string();
            move |error: ClientError| LookError {
                unreachable: matches!(error, ClientError::AgentUnreachable { .. }),
                message: format!("asking {node}: {error}"),
            }
        };
        let (source, destination) = (agent(from)?, agent(to)?);
        let source = source.manifest(member, volume).await.map_err(asking(from))?;
        let look = async || {
            let manifest = destination.manifest(member, volume).await.map_err(asking(to))?;
            let staged = destination.staged(member, volume).await.map_err(asking(to))?;
            Ok::<_, LookError>(DestinationLook { manifest, staged })
        };
        let first = look().await?;
        tokio::time::sleep(SECOND_LOOK).await;
        let second = look().await?;
        let verdict = copy_verdict(source.as_ref(), &first, &second);
        Ok(CopyLook { verdict, checksum: second.manifest.map(|m| m.checksum).unwrap_or_default() })
    }
}
