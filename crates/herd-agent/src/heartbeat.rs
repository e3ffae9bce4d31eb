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
    /// What the host has for members, and what is kept back.
    pub resources: crate::host_resources::ResourceFlags,
}

/// What the loop does after a step.
enum Then {
    /// Wait for the heartbeat period, or less when there is news to report.
    Beat(Instant),
    /// Back off after a failure.
    Retry(Instant),
    /// Go on at once.
    Now,
}

impl Heartbeat {
    /// Joins (again, when the server stops taking this node's token) and
    /// heartbeats until `stop` fires; an error when the cluster refuses
    /// this node or its CA is not the one trusted.
    pub async fn run(self, stop: CancellationToken) -> Result<(), AgentError> {
        let mut session = Session::new(self)?;
        while !stop.is_cancelled() {
            let started = Instant::now();
            let then = match session.credentials.clone() {
                None => session.join(started).await?,
                Some(credentials) => session.beat(credentials, started).await?,
            };
            let went_on = match then {
                Then::Beat(until) => {
                    sleep_or_report(until, &session.agent.executor, &session.agent.members, &stop).await
                }
                Then::Retry(until) => sleep_until(until, &stop).await,
                Then::Now => true,
            };
            if !went_on {
                break;
            }
        }
        Ok(())
    }
}

/// The loop's state from one step to the next.
struct Session {
    agent: Heartbeat,
    name: String,
    /// Sent with every join and heartbeat; refreshed before each.
    report: AgentReport,
    credentials: Option<Credentials>,
    certificate: crate::node_cert::NodeCertStore,
    /// The token the server stopped taking: shown when joining again, so
    /// that the server knows a deleted node's agent.
    previous_token: Option<String>,
    backoff: Retries,
    /// Servers passed over in a row for answering 503 (a standby replica,
    /// or one whose store is down): the next one is asked at once, until
    /// each was.
    passed_over: usize,
    link: Link,
    epoch: Instant,
}

impl Session {
    fn new(agent: Heartbeat) -> Result<Session, AgentError> {
        let identity = &agent.identity;
        let report = AgentReport {
            agent_boot_id: identity.agent_boot_id.clone(),
            host_boot_id: identity.host_boot_id.clone(),
            address: Some(agent.endpoint.to_string()),
            agent_version: Some(env!("CARGO_PKG_VERSION").to_string()),
            isolation: Some(agent.members.isolation()),
            ..AgentReport::default()
        };
        let name = identity.node_name.clone();
        Ok(Session {
            credentials: agent.store.load(&name)?,
            certificate: crate::node_cert::NodeCertStore::open(&agent.data_dir, &name)?,
            agent,
            name,
            report,
            previous_token: None,
            backoff: Retries::new(RETRIES),
            passed_over: 0,
            link: Link::default(),
            epoch: Instant::now(),
        })
    }

    /// What the link's rules say of a failed attempt begun at `started`.
    fn failed(&mut self, started: Instant, trouble: Trouble, joining: bool) -> Next {
        let attempt = Attempt { began: started - self.epoch, failed: self.epoch.elapsed() };
        let can_join = self.agent.join_token.is_some();
        self.link.failed(trouble, joining, can_join, attempt, self.agent.disconnect_grace)
    }

    /// Before each attempt: the servers in the order of the newest masters,
    /// a certificate request when the node's is due, and what the host has.
    fn prepare(&mut self) -> Result<(), AgentError> {
        if let Some(masters) = self.agent.copies.take_new_masters() {
            self.agent.client.set_servers(crate::servers_in_order(masters, &self.agent.servers));
        }
        self.report.csr = self.certificate.request_if_due(SystemTime::now())?;
        self.report.resources = Some(self.agent.resources.report(&self.agent.data_dir));
        Ok(())
    }

    async fn join(&mut self, started: Instant) -> Result<Then, AgentError> {
        self.prepare()?;
        let token = self.agent.join_token.clone().ok_or(AgentError::NoJoinToken)?;
        let request = JoinRequest {
            node_name: self.name.clone(),
            previous_node_token: self.previous_token.clone(),
            report: self.report.clone(),
        };
        let error = match self.agent.client.with_token(Some(token)).join(&request).await {
            Ok(joined) => {
                self.link.went_through();
                self.certificate.answer(joined.certificate.as_ref(), SystemTime::now())?;
                self.agent.access.use_identity(self.certificate.identity());
                let credentials = Credentials { node_name: self.name.clone(), node_token: joined.node_token };
                self.agent.store.save(&credentials)?;
                self.agent.access.remember_grant_key(&joined.grant_key);
                self.credentials = Some(credentials);
                self.backoff.reset();
                tracing::info!(node = %self.name, "joined the cluster");
                return Ok(Then::Beat(started + joined.heartbeat_period.get()));
            }
            Err(error) => error,
        };
        match self.failed(started, trouble(&error), true) {
            Next::GiveUp if matches!(error, ClientError::Untrusted { .. }) => Err(AgentError::UntrustedServer(error)),
            Next::GiveUp | Next::JoinAgain => Err(AgentError::JoinRefused(error)),
            Next::Retry { say, .. } => {
                if say {
                    tracing::warn!(%error, "could not join yet; retrying");
                }
                Ok(Then::Retry(started + self.backoff.failed()))
            }
        }
    }

    async fn beat(&mut self, credentials: Credentials, started: Instant) -> Result<Then, AgentError> {
        self.prepare()?;
        let agent = &self.agent;
        let report = &mut self.report;
        report.members = agent.members.report();
        report.commands = agent.executor.reports();
        report.disk = crate::fsutil::disk_space(&agent.data_dir)
            .map(|(free_bytes, total_bytes)| herd_core::api::DiskReport { free_bytes, total_bytes })
            .ok();
        report.config_serial = agent.copies.serial();
        // Kept until a heartbeat carries them (the newest, if many).
        report.peer_refusals.extend(agent.access.take_refusals());
        let excess = report.peer_refusals.len().saturating_sub(herd_core::api::MAX_PEER_REFUSALS);
        report.peer_refusals.drain(..excess);
        let answer =
            match agent.client.with_token(Some(credentials.node_token.clone())).heartbeat(&self.name, report).await {
                Ok(answer) => answer,
                Err(error) => return self.beat_failed(error, credentials, started).await,
            };
        match self.agent.copies.take(&answer) {
            Taken::Followed => {}
            Taken::Refused { theirs, ours } => {
                // A master a failover superseded: nothing it says counts.
                if let Next::Retry { say: true, .. } = self.failed(started, Trouble::Superseded, false) {
                    tracing::warn!(
                        theirs,
                        ours,
                        "this server leads an older term than the master this node follows; trying the next"
                    );
                }
                self.agent.client.skip_current();
                return Ok(Then::Retry(started + self.backoff.failed()));
            }
            // The new master's URLs are taken before the next attempt.
            Taken::Redirected => return Ok(Then::Now),
        }
        if self.link.went_through() {
            tracing::info!("heartbeats go through again");
        }
        self.report.peer_refusals.clear();
        if self.report.csr.is_some() {
            self.certificate.answer(answer.certificate.as_ref(), SystemTime::now())?;
            self.agent.access.use_identity(self.certificate.identity());
        }
        self.agent.executor.acknowledge(&answer.acknowledged);
        self.agent.members.leases_renewed(started, &answer.leases);
        self.agent.access.remember_grant_key(&answer.grant_key);
        self.agent.access.end_attempts(&answer.ended_attempts);
        self.backoff.reset();
        self.passed_over = 0;
        Ok(Then::Beat(started + answer.heartbeat_period.get()))
    }

    async fn beat_failed(
        &mut self,
        error: ClientError,
        credentials: Credentials,
        started: Instant,
    ) -> Result<Then, AgentError> {
        // Only the leading replica takes heartbeats (it renews the members'
        // role leases and must hear the node); the others answer 503: the
        // next server is asked at once, each once, before any backoff.
        let servers = self.agent.client.servers().len();
        if error.reason() == Some(herd_core::api::StatusReason::ServiceUnavailable) && self.passed_over + 1 < servers {
            tracing::debug!(%error, "the server does not take heartbeats now; asking the next one");
            self.passed_over += 1;
            self.agent.client.skip_current();
            return Ok(Then::Now);
        }
        self.passed_over = 0;
        match self.failed(started, trouble(&error), false) {
            Next::GiveUp => Err(AgentError::JoinRefused(error)),
            Next::JoinAgain => {
                tracing::warn!(%error, "the server does not accept this node's identity; joining again");
                self.previous_token = Some(credentials.node_token);
                self.credentials = None;
                Ok(Then::Now)
            }
            Next::Retry { say, run_hooks } => {
                if say {
                    tracing::warn!(%error, "heartbeat failed; retrying with backoff");
                }
                if run_hooks {
                    let why = format!("the server has been unreachable for over {:?}", self.agent.disconnect_grace);
                    self.agent.executor.run_disconnect_hooks(&why).await;
                }
                Ok(Then::Retry(started + self.backoff.failed()))
            }
        }
    }
}
