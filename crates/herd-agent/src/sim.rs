//! Simulated nodes for scale (Kubernetes' kubemark, Nomad's nodesim):
//! `herd sim-nodes --count N` runs N agents in one process. Each joins,
//! heartbeats at the cluster's period (the first one at a random offset
//! within it, so that they do not beat in step), watches its own
//! Commands, keeps the configuration serial it was given when it is a
//! master candidate, and carries out Commands on simulated members: a
//! start makes a running member with a fresh instance id, a setup
//! succeeds at once, scripts exit 0, a stop or remove takes the member
//! away. No process, file or endpoint: placement, app clusters and the
//! control plane can be driven at a thousand nodes on one machine.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use herd_client::{Client, ClientError};
use herd_core::api::{AgentReport, CommandAck, CommandReport, JoinRequest, MemberReport, WatchEventType};
use herd_core::configuration::SerialOnly;
use herd_core::kinds::{Action, AgentState, Answer, AnswerDetails, Command, ManagementState};
use herd_core::quantity::{Bytes, Millicores};
use herd_core::resources::Amounts;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// What each simulated node says it has: a small server's worth.
const SIMULATED_HOST: herd_core::api::NodeResources = herd_core::api::NodeResources {
    capacity: Amounts { cpu: Millicores(8000), memory: Bytes(32 << 30), disk: Bytes(1 << 40) },
    reserved: Amounts { cpu: Millicores(100), memory: Bytes(256 << 20), disk: Bytes(1 << 30) },
};

/// How long a failed call waits before it is tried again.
const RETRY: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct SimConfig {
    /// A client of the cluster's servers (trusting its CA).
    pub client: Client,
    pub join_token: String,
    /// Nodes are named `<prefix>-<i>`, i from 1.
    pub prefix: String,
    pub count: usize,
}

/// What one simulated node holds and does, without IO: the HTTP
/// simulation below drives it, and so do in-process test clusters.
#[derive(Default)]
pub struct SimulatedNode {
    members: BTreeMap<String, MemberReport>,
    /// Attempts carried out and not yet acknowledged, by (name, attempt).
    journal: BTreeMap<(String, u32), CommandReport>,
}

impl SimulatedNode {
    /// Carries out a new issued attempt of `command` at once; false when
    /// there was none to carry out (not issued, settled, or done before).
    pub fn accept(&mut self, command: &Command) -> bool {
        let Some(issued) = command.status.issued.as_ref() else { return false };
        if command.status.state_by_management != ManagementState::Created {
            return false;
        }
        let key = (command.metadata.name.clone(), issued.attempt);
        if self.journal.contains_key(&key) {
            return false;
        }
        let answer = carry_out(&mut self.members, &command.spec.action);
        let report = CommandReport {
            name: key.0.clone(),
            uid: command.metadata.uid.clone().unwrap_or_default(),
            attempt: key.1,
            state: if answer.success { AgentState::Completed } else { AgentState::Failed },
            answer: Some(answer),
            updated: crate::now(),
            progress: BTreeMap::new(),
        };
        self.journal.insert(key, report);
        true
    }

    /// The report of a node booted as `boot`: its members (a running one
    /// passes its readiness check) and the attempts not yet acknowledged.
    pub fn report(&mut self, boot: &str) -> AgentReport {
        for member in self.members.values_mut() {
            let checked = member.instance_id.clone().filter(|_| member.running).map(|instance_id| {
                herd_core::api::ReadinessReport {
                    instance_id,
                    passing: true,
                    detail: String::new(),
                    since: crate::now(),
                }
            });
            member.readiness = checked.map(|r| r.continuing(member.readiness.as_ref()));
        }
        AgentReport {
            agent_boot_id: boot.to_string(),
            host_boot_id: Some(boot.to_string()),
            agent_version: Some(format!("{} (simulated)", env!("CARGO_PKG_VERSION"))),
            members: self.members.values().cloned().collect(),
            commands: self.journal.values().cloned().collect(),
            resources: Some(SIMULATED_HOST),
            ..AgentReport::default()
        }
    }

    /// Forgets the attempts the server acknowledged.
    pub fn acknowledged(&mut self, acks: &[CommandAck]) {
        for ack in acks {
            self.journal.remove(&(ack.name.clone(), ack.attempt));
        }
    }

    /// A member's process exits by itself (it stays wanted: its agent
    /// would start it again).
    pub fn exit(&mut self, member: &str) {
        if let Some(report) = self.members.get_mut(member) {
            report.running = false;
        }
    }
}

struct SimNode {
    name: String,
    state: Mutex<SimulatedNode>,
    /// Wakes the heartbeat loop when a Command finished.
    reported: Notify,
}

impl SimNode {
    fn lock(&self) -> MutexGuard<'_, SimulatedNode> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn accept(&self, command: &Command) {
        if self.lock().accept(command) {
            self.reported.notify_one();
        }
    }
}

/// What a simulated agent does for `action`.
fn carry_out(members: &mut BTreeMap<String, MemberReport>, action: &Action) -> Answer {
    match action {
        Action::StartMember { member, run } => {
            let instance = uuid::Uuid::now_v7().to_string();
            let kept = members.remove(member).unwrap_or_default();
            members.insert(
                member.clone(),
                MemberReport {
                    name: member.clone(),
                    wanted: true,
                    running: true,
                    instance_id: Some(instance.clone()),
                    started_at: Some(crate::now()),
                    cluster: run.env.get("HERD_CLUSTER").cloned(),
                    setup_status: kept.setup_status,
                    ..MemberReport::default()
                },
            );
            let message = format!("member {member} runs as instance {instance} (simulated)");
            let details = AnswerDetails::Started { instance_id: instance, checksums: BTreeMap::new() };
            Answer { success: true, message, details }
        }
        Action::ConfigureMember { member, expected_instance, run_setup, .. } => match members.get_mut(member) {
            Some(report) if report.instance_id.as_deref() == Some(expected_instance.as_str()) => {
                if *run_setup {
                    report.setup_status = Some(format!("{expected_instance}=0"));
                }
                Answer::said(true, format!("member {member} is configured (simulated)"))
            }
            _ => Answer::said(false, format!("member {member} does not run as {expected_instance}")),
        },
        Action::RunScript { member, .. } | Action::Promote { member, .. } => {
            let message = format!("the script of member {member} exited with 0 (simulated)");
            let details = AnswerDetails::Script { exit_code: 0, stdout: String::new(), stderr: String::new() };
            Answer { success: true, message, details }
        }
        Action::StopMember { member } => {
            if let Some(report) = members.get_mut(member) {
                report.running = false;
                report.wanted = false;
            }
            Answer::said(true, format!("member {member} stopped (simulated)"))
        }
        Action::Demote { member, term } => {
            Answer::said(true, format!("member {member} stood down from term {term} (simulated)"))
        }
        Action::RemoveMember { member } => {
            members.remove(member);
            Answer::said(true, format!("member {member} removed (simulated)"))
        }
        other => Answer::said(false, format!("{} is not simulated", other.type_name())),
    }
}

/// Runs the simulated nodes until `stop` fires.
pub async fn run(config: SimConfig, stop: CancellationToken) {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 1..=config.count {
        let node = Arc::new(SimNode {
            name: format!("{}-{i}", config.prefix),
            state: Mutex::default(),
            reported: Notify::new(),
        });
        tasks.spawn(life(node, config.clone(), stop.clone()));
    }
    while tasks.join_next().await.is_some() {}
}

/// One node: join, then heartbeat and watch its Commands.
async fn life(node: Arc<SimNode>, config: SimConfig, stop: CancellationToken) {
    let boot = uuid::Uuid::now_v7().to_string();
    let report = |node: &SimNode| node.lock().report(&boot);
    let joining = config.client.with_token(Some(config.join_token.clone()));
    let joined = loop {
        let request = JoinRequest { node_name: node.name.clone(), previous_node_token: None, report: report(&node) };
        match joining.join(&request).await {
            Ok(joined) => break joined,
            Err(error) => {
                tracing::debug!(node = %node.name, %error, "a simulated node could not join yet");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(RETRY) => {}
                }
            }
        }
    };
    let client = config.client.with_token(Some(joined.node_token));
    tokio::spawn(watch_commands(node.clone(), client.clone(), stop.clone()));
    let mut period = joined.heartbeat_period.get();
    // Spread the nodes over the period.
    let offset = period.mul_f64(f64::from(uuid::Uuid::new_v4().as_u128() as u16) / f64::from(u16::MAX));
    tokio::select! {
        _ = stop.cancelled() => return,
        _ = tokio::time::sleep(offset) => {}
    }
    let mut serial = None;
    while !stop.is_cancelled() {
        let mut sent = report(&node);
        sent.config_serial = serial;
        // Only the serials: a thousand simulated nodes share the server's
        // cores, and decoding every delta whole cost more than the rest of
        // their work.
        match client.heartbeat_as::<SerialOnly, SerialOnly>(&node.name, &sent).await {
            Ok(answer) => {
                period = answer.heartbeat_period.get();
                node.lock().acknowledged(&answer.acknowledged);
                if let Some(configuration) = &answer.configuration {
                    serial = Some(configuration.serial);
                }
                if let Some(last) = answer.configuration_deltas.last() {
                    serial = Some(last.serial);
                }
                if answer.drop_configuration {
                    serial = None;
                }
            }
            Err(error) => tracing::debug!(node = %node.name, %error, "a simulated heartbeat failed"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
            _ = node.reported.notified() => {}
        }
    }
}

/// Lists and watches the node's Commands, as the real agent does.
async fn watch_commands(node: Arc<SimNode>, client: Client, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let watched = tokio::select! {
            _ = stop.cancelled() => return,
            watched = watch_once(&node, &client) => watched,
        };
        if let Err(error) = watched {
            tracing::debug!(node = %node.name, %error, "a simulated node's command watch ended");
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(RETRY) => {}
        }
    }
}

async fn watch_once(node: &SimNode, client: &Client) -> Result<(), ClientError> {
    let list = client.node_commands(&node.name).await?;
    for command in list.items {
        node.accept(&command);
    }
    let mut watch = client.watch_node_commands(&node.name, &list.metadata.resource_version).await?;
    while let Some(event) = watch.next_raw().await {
        let event = event?;
        if matches!(event.type_, WatchEventType::Added | WatchEventType::Modified)
            && let Ok(command) = serde_json::from_str::<Command>(event.object.get())
        {
            node.accept(&command);
        }
    }
    Ok(())
}
