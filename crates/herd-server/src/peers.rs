//! The server's part in agent-to-agent access: it signs the grants of the
//! Commands it issues (one per action the target needs from the source:
//! read volume V of member M, stop, start or forget member M, valid while
//! the attempt may run and ended with it, `herd_core::grant`) and of its
//! own requests to agents (a log, the volumes, a look at a copy: valid
//! for a couple of minutes), and calls agents with its own certificate
//! (`server.herd`, made by each replica from the shared CA at start). The
//! signing key is derived from the admin token, as the CA key's seal is:
//! replicas sign alike. An offline node is never called: the refusal is
//! immediate and counted.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use herd_client::{ClientError, PeerClient};
use herd_core::Timestamp;
use herd_core::grant::{Access, Grant, GrantedAttempt, Holder, accesses_for, command_grant_expiry};
use herd_core::kinds::{Command, Node, NodeRole};
use herd_tls::grant::GrantSigner;
use herd_tls::peer::SERVER_DNS_NAME;
use herd_tls::{ClusterCa, ServingIdentity, TlsError};

use crate::metrics::Metrics;

/// How long the server's own certificate lasts (made again at each start).
const IDENTITY_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long a grant for the server's own request lasts.
const OWN_GRANT_LIFETIME: Duration = Duration::from_secs(120);

pub struct PeerAuthority {
    signer: GrantSigner,
    identity: ServingIdentity,
    metrics: Arc<Metrics>,
}

impl PeerAuthority {
    pub fn new(ca: &ClusterCa, admin_token: &str, metrics: Arc<Metrics>) -> Result<PeerAuthority, TlsError> {
        let identity = ca.issue("herd server", &[SERVER_DNS_NAME.into()], SystemTime::now(), IDENTITY_LIFETIME)?;
        Ok(PeerAuthority { signer: GrantSigner::derive(admin_token)?, identity, metrics })
    }

    /// The public key agents verify grants with.
    pub fn grant_key(&self) -> String {
        self.signer.public_key()
    }

    /// The grants `command`'s node needs from other agents for one attempt
    /// issued at `now`.
    pub fn command_grants(&self, command: &Command, attempt: u32, now: SystemTime) -> Vec<String> {
        let Some((from_node, accesses)) = accesses_for(&command.spec.action) else { return Vec::new() };
        let expires = command_grant_expiry(Timestamp::from_system_time(now), command.spec.timeout());
        let attempt = GrantedAttempt { command: command.metadata.name.clone(), attempt };
        let holder = Holder::Node(command.spec.node.clone());
        self.sign_all(holder, from_node, accesses, expires, (&attempt.to_string(), Some(attempt)))
    }

    fn sign_all(
        &self,
        holder: Holder,
        node: &str,
        accesses: Vec<Access>,
        expires: Timestamp,
        (purpose, attempt): (&str, Option<GrantedAttempt>),
    ) -> Vec<String> {
        accesses
            .into_iter()
            .map(|access| {
                self.signer.sign(&Grant {
                    holder: holder.clone(),
                    node: node.to_string(),
                    access,
                    expires,
                    purpose: purpose.to_string(),
                    attempt: attempt.clone(),
                })
            })
            .collect()
    }

    /// A client for `node`'s agent, granted `accesses` for a couple of
    /// minutes, for the server's own request (`purpose`). An offline node
    /// is never contacted: `ClientError::Offline` at once, counted.
    pub fn agent(&self, node: &Node, accesses: Vec<Access>, purpose: &str) -> Result<PeerClient, ClientError> {
        let name = &node.metadata.name;
        if node.spec.role == NodeRole::Offline {
            self.metrics.offline_calls_refused.inc();
            return Err(ClientError::Offline { node: name.clone() });
        }
        let address = node.status.address.as_deref().ok_or_else(|| ClientError::AgentUnreachable {
            agent: name.clone(),
            reason: "its agent has not reported its address yet".into(),
        })?;
        let expires = Timestamp::from_system_time(SystemTime::now() + OWN_GRANT_LIFETIME);
        let grants = self.sign_all(Holder::Server, name, accesses, expires, (purpose, None));
        PeerClient::new(address, name, &self.identity, &grants)
    }
}
