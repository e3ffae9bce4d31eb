//! Joining and heartbeating. The loop never gives up on an unreachable
//! server (it backs off, up to a few seconds, and tries every server URL);
//! it stops only when told to, or when the cluster refuses this node.
//! Every heartbeat carries the members and the unacknowledged journal; a
//! journal change sends one at once instead of at the next period.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use herd_client::{Client, ClientError};
use herd_core::agent_link::{Attempt, Link, Next, Trouble};
use herd_core::api::{AgentReport, JoinRequest};
use herd_core::backoff::{Backoff, Retries};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::configuration::{ConfigCopies, Taken};
use crate::credentials::{CredentialStore, Credentials};
use crate::executor::Executor;
use crate::members::Members;
use crate::peer_access::PeerAccess;
use crate::{AgentError, Identity};

/// The pauses between failed heartbeats and joins: 250 ms, doubling, at most 4 s.
const RETRIES: Backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(4));
/// A journal change is reported after this pause, with whatever else changed.
const REPORT_PAUSE: Duration = Duration::from_millis(10);

/// Sleeps until `deadline`; false if `stop` fired first.
async fn sleep_until(deadline: Instant, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep_until(deadline) => true,
    }
}

/// What went wrong, in the terms of the link's state machine.
fn trouble(error: &ClientError) -> Trouble {
    use herd_core::api::StatusReason;
    match (error, error.reason()) {
        (ClientError::Untrusted { .. }, _) => Trouble::Untrusted,
        (ClientError::Api(_), Some(StatusReason::Unauthorized)) => Trouble::Unauthorized,
        (ClientError::Api(_), Some(StatusReason::NotFound)) => Trouble::NotFound,
        (ClientError::Api(status), _) if matches!(status.code, 401 | 403 | 422) => Trouble::Refused,
        _ => Trouble::Unreachable,
    }
}

/// Sleeps until `deadline`, or until the journal changes (but not sooner
/// than a short pause, so that a burst of changes is one heartbeat); false
/// if `stop` fired first.
async fn sleep_or_report(deadline: Instant, executor: &Executor, members: &Members, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep_until(deadline) => true,
        _ = async { executor.changed().await; tokio::time::sleep(REPORT_PAUSE).await } => true,
        _ = async { members.changed().await; tokio::time::sleep(REPORT_PAUSE).await } => true,
    }
}

/// Everything the heartbeat loop needs.
pub struct Heartbeat {
    pub client: Client,
    pub store: CredentialStore,
    pub join_token: Option<String>,
    pub identity: Identity,
    pub endpoint: SocketAddr,
    pub members: Members,
    pub executor: Arc<Executor>,
    /// Its grant key is set from every answer of the server, its
    /// certificate from each new one; its refusals go with each heartbeat.
    pub access: PeerAccess,
    /// Where the node certificate is kept.
    pub data_dir: std::path::PathBuf,
    /// After the server has been unreachable this long, the disconnect hooks run.
    pub disconnect_grace: Duration,
    /// The configuration copies and the master this node follows.
    pub copies: ConfigCopies,
    /// The servers the agent was started with (tried after the masters).
    pub servers: Vec<String>,
}

impl Heartbeat {
    pub async fn run(self, stop: CancellationToken) -> Result<(), AgentError> {
        let Heartbeat {
            client,
            store,
            join_token,
            identity,
            endpoint,
            members,
            executor,
            access,
            data_dir,
            disconnect_grace,
            copies,
            servers,
        } = self;
        let mut report = AgentReport {
            agent_boot_id: identity.agent_boot_id.clone(),
            host_boot_id: identity.host_boot_id.clone(),
            address: Some(endpoint.to_string()),
            agent_version: Some(env!("CARGO_PKG_VERSION").to_string()),
            ..AgentReport::default()
        };
        let name = identity.node_name.clone();
        let mut credentials = store.load(&name)?;
        let mut certificate = crate::node_cert::NodeCertStore::open(&data_dir, &name)?;
        // The token the server stopped taking: shown when joining again, so
        // that the server knows a deleted node's agent.
        let mut previous_token: Option<String> = None;
        let mut backoff = Retries::new(RETRIES);
        let mut link = Link::default();
        let epoch = Instant::now();
        while !stop.is_cancelled() {
            let started = Instant::now();
            let failed = |link: &mut Link, trouble, joining| {
                let attempt = Attempt { began: started - epoch, failed: epoch.elapsed() };
                link.failed(trouble, joining, join_token.is_some(), attempt, disconnect_grace)
            };
            if let Some(masters) = copies.take_new_masters() {
                client.set_servers(crate::servers_in_order(masters, &servers));
            }
            report.csr = certificate.request_if_due(SystemTime::now())?;
            let Some(creds) = credentials.clone() else {
                let token = join_token.clone().ok_or(AgentError::NoJoinToken)?;
                match client
                    .with_token(Some(token))
                    .join(&JoinRequest {
                        node_name: name.clone(),
                        previous_node_token: previous_token.clone(),
                        report: report.clone(),
                    })
                    .await
                {
                    Ok(joined) => {
                        link.went_through();
                        certificate.answer(joined.certificate.as_ref(), SystemTime::now())?;
                        access.use_identity(certificate.identity());
                        let creds = Credentials { node_name: name.clone(), node_token: joined.node_token };
                        store.save(&creds)?;
                        access.remember_grant_key(&joined.grant_key);
                        credentials = Some(creds);
                        let period = joined.heartbeat_period.get();
                        backoff.reset();
                        tracing::info!(node = %name, "joined the cluster");
                        if !sleep_or_report(started + period, &executor, &members, &stop).await {
                            break;
                        }
                    }
                    Err(error) => match failed(&mut link, trouble(&error), true) {
                        Next::GiveUp if matches!(error, ClientError::Untrusted { .. }) => {
                            return Err(AgentError::UntrustedServer(error));
                        }
                        Next::GiveUp | Next::JoinAgain => return Err(AgentError::JoinRefused(error)),
                        Next::Retry { say, .. } => {
                            if say {
                                tracing::warn!(%error, "could not join yet; retrying");
                            }
                            if !sleep_until(started + backoff.failed(), &stop).await {
                                break;
                            }
                        }
                    },
                }
                continue;
            };
            report.members = members.report();
            report.commands = executor.reports();
            report.disk = crate::fsutil::disk_space(&data_dir)
                .map(|(free_bytes, total_bytes)| herd_core::api::DiskReport { free_bytes, total_bytes })
                .ok();
            report.config_serial = copies.serial();
            // Kept until a heartbeat carries them (the newest, if many).
            report.peer_refusals.extend(access.take_refusals());
            let excess = report.peer_refusals.len().saturating_sub(herd_core::api::MAX_PEER_REFUSALS);
            report.peer_refusals.drain(..excess);
            match client.with_token(Some(creds.node_token.clone())).heartbeat(&name, &report).await {
                Ok(answer) => {
                    match copies.take(&answer) {
                        Taken::Followed => {}
                        Taken::Refused { theirs, ours } => {
                            // A master a failover superseded: nothing it says counts.
                            if let Next::Retry { say: true, .. } = failed(&mut link, Trouble::Superseded, false) {
                                tracing::warn!(
                                    theirs,
                                    ours,
                                    "this server leads an older term than the master this node follows; trying the next"
                                );
                            }
                            client.skip_current();
                            if !sleep_until(started + backoff.failed(), &stop).await {
                                break;
                            }
                            continue;
                        }
                        // The new master's URLs are taken at the top of the loop.
                        Taken::Redirected => continue,
                    }
                    if link.went_through() {
                        tracing::info!("heartbeats go through again");
                    }
                    report.peer_refusals.clear();
                    if report.csr.is_some() {
                        certificate.answer(answer.certificate.as_ref(), SystemTime::now())?;
                        access.use_identity(certificate.identity());
                    }
                    executor.acknowledge(&answer.acknowledged);
                    access.remember_grant_key(&answer.grant_key);
                    access.end_attempts(&answer.ended_attempts);
                    let period = answer.heartbeat_period.get();
                    backoff.reset();
                    if !sleep_or_report(started + period, &executor, &members, &stop).await {
                        break;
                    }
                }
                Err(error) => match failed(&mut link, trouble(&error), false) {
                    Next::GiveUp => return Err(AgentError::JoinRefused(error)),
                    Next::JoinAgain => {
                        tracing::warn!(%error, "the server does not accept this node's identity; joining again");
                        previous_token = Some(creds.node_token);
                        credentials = None;
                    }
                    Next::Retry { say, run_hooks } => {
                        if say {
                            tracing::warn!(%error, "heartbeat failed; retrying with backoff");
                        }
                        if run_hooks {
                            let why = format!("the server has been unreachable for over {disconnect_grace:?}");
                            executor.run_disconnect_hooks(&why).await;
                        }
                        if !sleep_until(started + backoff.failed(), &stop).await {
                            break;
                        }
                    }
                },
            }
        }
        Ok(())
    }
}
