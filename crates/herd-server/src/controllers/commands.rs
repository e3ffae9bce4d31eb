//! The command controller (leader only): issues new Commands to their
//! agents in this leader's term, and runs the decision table of
//! `herd_core::reconcile` on every unsettled one: waits, marks it timed
//! out, reconciles it, or gives it up, each time saying why.
//!
//! Time is judged on this process's monotonic clock from when it first saw
//! a Command's status as it is (as the node controller judges heartbeats):
//! a new leader gives every Command the full grace again.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use herd_core::kinds::{Action, Answer, ClusterConfigSpec, Command, CommandSpec, EventType, ManagementState, NodeSpec};
use herd_core::reconcile::{CommandView, Step, decide};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;
use crate::events::EventRecorder;
use crate::nodes::cluster_config;
use crate::objects::{Objects, Part, now};
use crate::reflector::Reflector;

/// When this controller first saw each Command's status as it is now, and
/// its current attempt issued.
#[derive(Default)]
struct Sightings {
    updated: HashMap<String, (Option<herd_core::Timestamp>, Instant)>,
    issued: HashMap<String, (u32, Instant)>,
}

impl Sightings {
    fn since_update(&mut self, command: &Command, now: Instant) -> Duration {
        let key = command.metadata.name.clone();
        let seen = self.updated.entry(key).or_insert((command.status.updated, now));
        if seen.0 != command.status.updated {
            *seen = (command.status.updated, now);
        }
        now.duration_since(seen.1)
    }

    fn since_issued(&mut self, command: &Command, now: Instant) -> Option<Duration> {
        let attempt = command.status.issued.as_ref()?.attempt;
        let seen = self.issued.entry(command.metadata.name.clone()).or_insert((attempt, now));
        if seen.0 != attempt {
            *seen = (attempt, now);
        }
        Some(now.duration_since(seen.1))
    }
}

pub struct CommandController {
    pub objects: Objects,
    /// This leadership's term: every issue carries it.
    pub term: u64,
    pub commands: Reflector<CommandSpec>,
    pub nodes: Reflector<NodeSpec>,
    pub config: Reflector<ClusterConfigSpec>,
    pub events: EventRecorder,
}

impl CommandController {
    pub async fn run(self, stop: CancellationToken) {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = async { self.commands.synced().await; self.nodes.synced().await; self.config.synced().await } => {}
        }
        let mut sightings = Sightings::default();
        let mut changes = self.commands.changes();
        loop {
            let settings = cluster_config(&self.config).commands;
            for command in self.commands.list() {
                if let Err(error) = self.look_at(&command, &mut sightings).await {
                    tracing::warn!(%error, command = %command.metadata.name, "command controller");
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(settings.reconcile_interval.get()) => {}
                _ = changes.changed() => {}
            }
        }
    }

    async fn look_at(&self, command: &Command, sightings: &mut Sightings) -> Result<(), ApiError> {
        if command.status.state_by_management.is_settled() {
            return Ok(());
        }
        if command.status.issued.is_none() && command.status.state_by_management == ManagementState::Created {
            return self.issue(command).await;
        }
        let node = self.nodes.get(&command.spec.node);
        let settings = cluster_config(&self.config).commands;
        let now_mono = Instant::now();
        let view = CommandView {
            management: command.status.state_by_management,
            agent: command.status.state_by_agent,
            since_update: sightings.since_update(command, now_mono),
            since_issued: sightings.since_issued(command, now_mono),
            timeout: command.spec.timeout(),
            retry_count: command.status.retry_count,
            host_up: node.is_some_and(|n| n.status.ready),
        };
        let (step, why) = decide(&view, &settings.reconcile());
        match step {
            Step::Skip | Step::Wait => Ok(()),
            Step::MarkTimedOut => {
                self.mark(command, ManagementState::TimedOut, why, EventType::Warning, "CommandTimedOut").await
            }
            Step::MarkRetry => {
                self.mark(command, ManagementState::ReconcileRetry, why, EventType::Warning, "ReconcileRetry").await
            }
            Step::GiveUp => {
                self.mark(command, ManagementState::ReconcileSkipped, why, EventType::Warning, "CommandGivenUp").await
            }
            Step::Reconcile if command.status.retry_count >= settings.max_attempts => {
                let why = "retried too many times";
                self.mark(command, ManagementState::ReconcileSkipped, why, EventType::Warning, "CommandGivenUp").await
            }
            Step::Reconcile => self.reconcile(command, why).await,
        }
    }

    /// Hands a new Command to its agent, with the agent endpoints of the
    /// other nodes its action involves.
    async fn issue(&self, command: &Command) -> Result<(), ApiError> {
        let mut peers = BTreeMap::new();
        if let Action::CopyVolume { from_node, .. } | Action::MigrateMember { from_node, .. } = &command.spec.action
            && let Some(address) = self.nodes.get(from_node).and_then(|n| n.status.address)
        {
            peers.insert(from_node.clone(), address);
        }
        let term = self.term;
        self.objects
            .modify::<CommandSpec>(&command.metadata.name, Part::Status, |c| {
                if c.status.issued.is_some() || c.status.state_by_management != ManagementState::Created {
                    return Ok(false);
                }
                c.status.issue(term, peers.clone(), now());
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
        reason: &str,
    ) -> Result<(), ApiError> {
        let written = self
            .objects
            .modify::<CommandSpec>(&command.metadata.name, Part::Status, |c| {
                c.status.mark(state, why, now());
                Ok(true)
            })
            .await?;
        self.events.record(&written, type_, reason, format!("{state:?}: {why}")).await;
        Ok(())
    }

    /// Finds out what really happened, from what the agents report, and
    /// records it: done (RECONCILED, with the facts), or issued again.
    async fn reconcile(&self, command: &Command, why: &str) -> Result<(), ApiError> {
        let node = self.nodes.get(&command.spec.node);
        let member_state =
            |name: &str| node.as_ref().and_then(|n| n.status.members.iter().find(|m| m.name == name).cloned());
        let truth: Option<Answer> = match &command.spec.action {
            Action::StartMember { member, .. } => member_state(member).filter(|m| m.wanted && m.running).map(|m| {
                let instance = m.instance_id.unwrap_or_default();
                Answer {
                    success: true,
                    message: format!("member {member} runs (instance {instance})"),
                    details: BTreeMap::from([("instanceId".into(), instance)]),
                }
            }),
            Action::StopMember { member } => match member_state(member) {
                Some(m) if m.running => None,
                _ if node.as_ref().is_some_and(|n| n.status.ready) => Some(Answer {
                    success: true,
                    message: format!("member {member} is not running"),
                    details: BTreeMap::new(),
                }),
                _ => None,
            },
            // Whether a script ran cannot be told from outside: say so
            // rather than run it twice.
            Action::RunScript { member, .. } => Some(Answer {
                success: false,
                message: format!(
                    "interrupted: whether the script ran in member {member} is unknown; `herd command retry` runs it again"
                ),
                details: BTreeMap::new(),
            }),
            Action::DeleteVolume { .. } | Action::CopyVolume { .. } | Action::MigrateMember { .. } => None,
        };
        let name = &command.metadata.name;
        match truth {
            Some(answer) => {
                let message = answer.message.clone();
                let written = self
                    .objects
                    .modify::<CommandSpec>(name, Part::Status, |c| {
                        c.status.answer = Some(answer.clone());
                        c.status.mark(ManagementState::Reconciled, format!("{why}; found: {message}"), now());
                        Ok(true)
                    })
                    .await?;
                self.events.record(&written, EventType::Normal, "CommandReconciled", message).await;
            }
            None => {
                let written = self
                    .objects
                    .modify::<CommandSpec>(name, Part::Status, |c| {
                        c.status.retry(format!("{why}; issuing it again"), now());
                        Ok(true)
                    })
                    .await?;
                self.events
                    .record(&written, EventType::Normal, "CommandRetried", format!("{why}; issuing it again"))
                    .await;
            }
        }
        Ok(())
    }
}
