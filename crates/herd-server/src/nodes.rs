//! Nodes joining and heartbeating: the server side of the agent protocol.

use std::time::Duration;

use herd_core::api::{AgentReport, HeartbeatResponse, JoinRequest, JoinResponse, PeerRefusal, Readmission};
use herd_core::configuration::{SerialOnly, Ssconf};
use herd_core::grant::{self, Holder};
use herd_core::join::{JoinVerdict, Joiner, join_verdict};
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{
    ClusterConfigSpec, CommandSpec, EventReason, EventType, InvolvedObject, Node, NodeRole, NodeSpec,
};
use herd_core::node_health::{self, HeartbeatEffects};
use herd_core::validation::{self, FieldPath};
use herd_core::{Object, Resource, ValidationErrors};
use serde_json::value::RawValue;

use crate::auth::Authenticator;
use crate::error::ApiError;
use crate::events::EventRecorder;
use crate::objects::{Objects, ObjectsError, Part, now};
use crate::reflector::{RawCache, Reflector};

/// The cluster settings in force: the ClusterConfig in the cache, or the
/// defaults if it was never written.
pub fn cluster_config(config: &Reflector<ClusterConfigSpec>) -> ClusterConfigSpec {
    config.get(CLUSTER_CONFIG_NAME).map(|c| c.spec).unwrap_or_default()
}

async fn tell(events: &EventRecorder, node: &Node, effects: HeartbeatEffects) {
    if effects.became_ready {
        events
            .record(node, EventType::Normal, EventReason::NodeReady, "the node's agent is sending heartbeats".into())
            .await;
    }
    if effects.host_rebooted {
        events
            .record(
                node,
                EventType::Warning,
                EventReason::HostRebooted,
                "the host's boot id changed: it rebooted".into(),
            )
            .await;
    } else if effects.agent_restarted {
        let boot = node.status.agent_boot_id.clone().unwrap_or_default();
        events
            .record(
                node,
                EventType::Normal,
                EventReason::AgentRestarted,
                format!("the agent restarted (boot id {boot})"),
            )
            .await;
    }
}

/// The Event subject for node `name`, which need not exist.
pub fn node_named(name: &str, node: Option<&Node>) -> InvolvedObject {
    InvolvedObject { kind: NodeSpec::KIND.into(), name: name.into(), uid: node.and_then(|n| n.metadata.uid.clone()) }
}

/// Deletes node `name` as an admin asked: its token is revoked and a record
/// of it kept in the same transaction, so that its agent cannot join again
/// until readmitted (`herd_core::join`); a NodeDeleted Event says so.
pub async fn delete(
    objects: &Objects,
    auth: &Authenticator,
    events: &EventRecorder,
    name: &str,
    precondition: Option<herd_store::Revision>,
    dry_run: bool,
) -> Result<serde_json::Value, ApiError> {
    let node = objects.require::<NodeSpec>(name).await?;
    let ops = auth.node_deletion_ops(name, node.status.ready).await?;
    let last = objects.delete_value_with(NodeSpec::KIND, NodeSpec::PLURAL, name, precondition, dry_run, ops).await?;
    if !dry_run {
        auth.note_token_changed(name);
        let state = if node.status.ready { "Ready" } else { "NotReady" };
        let message = format!(
            "an admin deleted the node ({state}); its token is revoked and its agent may not join again until \
             `herd node readmit {name}`"
        );
        let type_ = if node.status.ready { EventType::Warning } else { EventType::Normal };
        events.record(&node, type_, EventReason::NodeDeleted, message).await;
    }
    Ok(last)
}

/// Lets a deleted node's agent join again (`herd node readmit`), saying
/// whether it can by itself: not when the join token it joined with was
/// deleted or has expired since.
pub async fn readmit(auth: &Authenticator, events: &EventRecorder, name: &str) -> Result<Readmission, ApiError> {
    let Some(deleted) = auth.readmit(name).await? else {
        return Err(ApiError::NotFound { kind: "DeletedNode".into(), name: name.into() });
    };
    let refusal = match &deleted.join_token {
        Some(id) => auth.join_token_refusal(id).await?,
        None => None,
    };
    let message = match &refusal {
        None => "its agent may join again".to_string(),
        Some(why) => format!(
            "its agent may join again, but not with the token it holds ({why}): give it a new join token \
             (`herd token create`)"
        ),
    };
    let said = format!("an admin readmitted the node: {message}");
    events.record_about(node_named(name, None), EventType::Normal, EventReason::NodeReadmitted, said).await;
    Ok(Readmission { node: name.to_string(), agent_can_join: refusal.is_none(), message })
}

/// Registers a node and issues its node token; a name that has joined is
/// refused (409, and a JoinRefused Event on it) unless the same agent run
/// is retrying (`herd_core::join`).
pub async fn join(
    objects: &Objects,
    config: &Reflector<ClusterConfigSpec>,
    auth: &Authenticator,
    events: &EventRecorder,
    certificates: &crate::tls::NodeCertificates,
    (request, join_token): (JoinRequest, Option<String>),
) -> Result<JoinResponse, ApiError> {
    let name = request.node_name.clone();
    let mut errors = ValidationErrors::new();
    validation::check_node_name(&FieldPath::root("nodeName"), &name, &mut errors);
    if let Err(report) = herd_core::agent_report::check(&request.report) {
        errors.errors.extend(report.errors);
    }
    errors.into_result().map_err(|e| ApiError::invalid(NodeSpec::KIND, &name, e))?;

    let existing = objects.get::<NodeSpec>(&name).await?;
    let deleted = auth.deleted_node(&name).await?;
    let joiner =
        Joiner { boot_id: &request.report.agent_boot_id, previous_token: request.previous_node_token.as_deref() };
    if let JoinVerdict::Refuse(why) = join_verdict(&name, existing.as_ref(), deleted.as_ref(), joiner) {
        let from = request.report.address.as_deref().map(|a| format!(" from {a}")).unwrap_or_default();
        let message = format!("a join for this name{from} was refused: {why}");
        events
            .record_about(node_named(&name, existing.as_ref()), EventType::Warning, EventReason::JoinRefused, message)
            .await;
        return Err(ApiError::Conflict(why));
    }
    // Signed before anything is written: a bad request changes nothing.
    let certificate = certificates.answer(&name, &request.report)?;
    let token = auth.issue_node_token(&name, join_token).await?;
    let node = match existing {
        None => {
            let mut node = Object::new(name.clone(), NodeSpec::default());
            node_health::apply_heartbeat(&mut node.status, &request.report, now());
            match objects.create(node, true, false).await {
                Ok(node) => {
                    let message = match &deleted {
                        Some(d) => format!(
                            "the node joined the cluster (a new host under the name of a node deleted at {})",
                            d.deleted_at
                        ),
                        None => "the node joined the cluster".into(),
                    };
                    events.record(&node, EventType::Normal, EventReason::NodeRegistered, message).await;
                    node
                }
                // Joined concurrently by a retry of the same agent: fall through to a heartbeat.
                Err(ObjectsError::AlreadyExists { .. }) => {
                    heartbeat_node(objects, events, (&name, None), &request.report, Duration::ZERO).await?
                }
                Err(other) => return Err(other.into()),
            }
        }
        Some(_) => heartbeat_node(objects, events, (&name, None), &request.report, Duration::ZERO).await?,
    };
    let config = cluster_config(config);
    tracing::info!(node = %node.metadata.name, "node joined");
    Ok(JoinResponse {
        node_name: name,
        node_token: token,
        heartbeat_period: config.heartbeat_period,
        grant_key: certificates.grant_key.clone(),
        certificate,
    })
}

/// Records a heartbeat in the node's status: written when it changes
/// anything but the time, or when the time written last is a quarter of
/// the grace period old (`refresh`; `node_health::worth_writing`).
/// `held` is the node as a cache holds it, if it does: judged against
/// that copy without reading the store (a copy that moved meanwhile
/// fails its write and is read again; a heartbeat that finds nothing
/// worth writing on a copy a moment old is judged again by the next).
async fn heartbeat_node(
    objects: &Objects,
    events: &EventRecorder,
    (name, held): (&str, Option<Node>),
    report: &AgentReport,
    refresh: std::time::Duration,
) -> Result<Node, ApiError> {
    let mut effects = HeartbeatEffects::default();
    let change = |node: &mut Node| {
        let before = node.status.clone();
        let at = now();
        effects = node_health::apply_heartbeat(&mut node.status, report, at);
        Ok(node_health::worth_writing(&before, &node.status, at, refresh))
    };
    let written = match held {
        Some(held) => objects.modify_from::<NodeSpec, ApiError>(held, Part::Status, change).await,
        None => objects.modify::<NodeSpec, ApiError>(name, Part::Status, change).await,
    };
    let node = written.map_err(|e| match e {
        ApiError::NotFound { .. } => ApiError::NotFound {
            kind: NodeSpec::KIND.into(),
            name: format!("{name} (the node was deleted: join again)"),
        },
        other => other,
    })?;
    tell(events, &node, effects).await;
    Ok(node)
}

/// A heartbeat answer as the server makes it: the configuration document
/// and deltas are passed on as stored (JSON the keeper wrote), not decoded
/// and encoded again for each candidate.
pub type HeartbeatAnswer = HeartbeatResponse<Box<RawValue>, Box<RawValue>>;

/// A heartbeat's answer, and how many bytes of configuration (documents
/// and deltas, as stored) it carries.
pub struct Heartbeat {
    pub response: HeartbeatAnswer,
    pub configuration_bytes: usize,
}

/// What a heartbeat reads and writes through.
pub struct HeartbeatServices<'a> {
    pub objects: &'a Objects,
    pub config: &'a Reflector<ClusterConfigSpec>,
    /// The nodes as cached: who a refusal's caller may be.
    pub nodes: &'a Reflector<NodeSpec>,
    /// The Commands as cached: a report on an attempt the cache holds
    /// costs no read.
    pub commands: &'a Reflector<CommandSpec>,
    /// The configuration's document, deltas and facts, as stored.
    pub configuration: &'a RawCache,
    pub events: &'a EventRecorder,
    pub metrics: &'a crate::metrics::Metrics,
    pub certificates: &'a crate::tls::NodeCertificates,
    pub renewals: &'a crate::role_leases::Renewals,
}

/// A heartbeat: the node's status, then the reports on its Commands (a
/// report on another node's Command refuses the heartbeat, changing
/// nothing). `held`: the node as a cache holds it (see [`heartbeat_node`]).
pub async fn heartbeat(
    services: HeartbeatServices<'_>,
    (name, held): (&str, Option<Node>),
    report: AgentReport,
) -> Result<Heartbeat, ApiError> {
    let HeartbeatServices { objects, config, nodes, commands, configuration, events, metrics, certificates, renewals } =
        services;
    herd_core::agent_report::check(&report).map_err(|e| ApiError::invalid(NodeSpec::KIND, name, e))?;
    let at = now();
    let ended_attempts =
        commands.map(|command| grant::ended_attempts(command, name, at)).into_iter().flatten().collect();
    let commands = crate::commands::reported(objects, commands, &report.commands).await?;
    if let Some(refusal) = crate::commands::foreign_report(name, &commands) {
        return Err(refusal);
    }
    let certificate = certificates.answer(name, &report)?;
    let refresh = cluster_config(config).node_grace_period.get() / 4;
    let node = heartbeat_node(objects, events, (name, held), &report, refresh).await?;
    for refusal in &report.peer_refusals {
        // Without the time: the same refusal again counts up one Event.
        let message = refusal_message(refusal, |node| nodes.get(node).is_some());
        events.record(&node, EventType::Warning, EventReason::PeerAccessRefused, message).await;
    }
    let acknowledged =
        crate::commands::record_reports(objects, (events, metrics), name, &report.commands, commands).await?;
    let configuration = configuration_for(configuration, &node, &report).await?;
    let response = HeartbeatAnswer {
        heartbeat_period: cluster_config(config).heartbeat_period,
        grant_key: certificates.grant_key.clone(),
        acknowledged,
        certificate,
        ssconf: configuration.ssconf,
        configuration: configuration.configuration,
        configuration_deltas: configuration.deltas,
        drop_configuration: configuration.drop_configuration,
        ended_attempts,
        superseded: false,
        leases: renewals.renew(name, &report),
    };
    Ok(Heartbeat { response, configuration_bytes: configuration.bytes })
}

/// The Event's words for a refusal a node reports, as its agent saw it:
/// the caller is named only if it is a node of the cluster (`known`), so
/// that a node's report names no one the server does not know; what a
/// caller without a cluster certificate asked is anyone's words, and is
/// not kept (its refusals fold into one Event, counted).
fn refusal_message(refusal: &PeerRefusal, known: impl Fn(&str) -> bool) -> String {
    let caller = match &refusal.caller {
        None => return "the node's agent reports it refused a caller without a cluster certificate".into(),
        Some(Holder::Node(node)) if !known(node) => "a caller whose certificate names no node of this cluster".into(),
        Some(holder) => holder.to_string(),
    };
    format!("the node's agent reports it refused {caller} to {}: {}", refusal.asked, refusal.reason)
}

/// What a heartbeat answer carries of the configuration: the small facts
/// for every node; for a master candidate whose copy is older, the deltas
/// since its serial when they are all kept, or else the document (read
/// only then: it may be large); and to a node that is no candidate but
/// keeps a copy, that it must drop it.
struct ConfigurationAnswer {
    ssconf: Option<Ssconf>,
    configuration: Option<Box<RawValue>>,
    deltas: Vec<Box<RawValue>>,
    drop_configuration: bool,
    bytes: usize,
}

fn damaged(key: &str, e: serde_json::Error) -> ApiError {
    ApiError::Internal(format!("{key} is damaged: {e}"))
}

/// A stored configuration document or delta, checked to be JSON.
fn checked_json(key: &str, value: &[u8]) -> Result<Box<RawValue>, ApiError> {
    serde_json::from_slice(value).map_err(|e| damaged(key, e))
}

/// Every delta from serial `from` to `to`, and their size, if all are kept.
async fn deltas_after(stored: &RawCache, from: u64, to: u64) -> Result<Option<(Vec<Box<RawValue>>, usize)>, ApiError> {
    use crate::controllers::configuration::delta_key;
    let (mut deltas, mut bytes) = (Vec::new(), 0);
    for serial in from + 1..=to {
        let key = delta_key(serial);
        let Some(value) = stored.get(&key).await? else { return Ok(None) };
        deltas.push(checked_json(&key, &value)?);
        bytes += value.len();
    }
    Ok(Some((deltas, bytes)))
}

async fn configuration_for(
    stored: &RawCache,
    node: &Node,
    report: &AgentReport,
) -> Result<ConfigurationAnswer, ApiError> {
    use crate::controllers::configuration::{DOCUMENT_KEY, FACTS_KEY, KEPT_DELTAS};
    let mut answer = ConfigurationAnswer {
        ssconf: None,
        configuration: None,
        deltas: Vec::new(),
        drop_configuration: false,
        bytes: 0,
    };
    let Some(facts) = stored.get(FACTS_KEY).await? else { return Ok(answer) };
    let ssconf: Ssconf = serde_json::from_slice(&facts).map_err(|e| damaged(FACTS_KEY, e))?;
    let serial = ssconf.serial;
    answer.ssconf = Some(ssconf);
    let candidate = node.spec.role == NodeRole::Candidate;
    answer.drop_configuration = !candidate && report.config_serial.is_some();
    if !candidate || report.config_serial.is_some_and(|held| held >= serial) {
        return Ok(answer);
    }
    let held = report.config_serial;
    if let Some(held) = held.filter(|held| serial - held <= KEPT_DELTAS)
        && let Some((deltas, bytes)) = deltas_after(stored, held, serial).await?
    {
        (answer.deltas, answer.bytes) = (deltas, bytes);
        return Ok(answer);
    }
    // The document may be some serials behind: the deltas after it follow.
    let Some(document) = stored.get(DOCUMENT_KEY).await? else { return Ok(answer) };
    let SerialOnly { serial: document_serial } =
        serde_json::from_slice(&document).map_err(|e| damaged(DOCUMENT_KEY, e))?;
    if held.is_some_and(|held| held >= document_serial) {
        return Ok(answer);
    }
    if let Some((deltas, bytes)) = deltas_after(stored, document_serial, serial).await? {
        (answer.deltas, answer.bytes) = (deltas, bytes);
    }
    answer.bytes += document.len();
    answer.configuration = Some(checked_json(DOCUMENT_KEY, &document)?);
    Ok(answer)
}
