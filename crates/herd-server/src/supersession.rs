//! Whether a master failover superseded this server. Only with SQLite,
//! where each master has a store of its own: a master whose host was lost
//! and that comes back must not lead again beside the one the failover
//! started. It asks the master candidates' agents which master they
//! follow, before it first campaigns and every few seconds after; one
//! that follows a master of a newer term than this store has seen, at
//! other URLs, means this server was superseded. It then never takes the
//! lease (and lets go of it if it leads), says why in the cluster status,
//! and tells agents that still reach it where the master is now.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use herd_core::kinds::{LeaseSpec, NodeRole, NodeSpec};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::peers::PeerAuthority;
use crate::reflector::Reflector;

const CHECK_INTERVAL: Duration = Duration::from_secs(3);
/// A round waits this long at most for the candidates' answers (the first
/// one holds up campaigning).
const ROUND_TIMEOUT: Duration = Duration::from_secs(2);

/// The master a failover started instead of this server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superseded {
    pub term: u64,
    pub master_urls: Vec<String>,
    /// The node whose agent said so.
    pub node: String,
}

impl std::fmt::Display for Superseded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "superseded by a master failover: node {} follows the master at {} (term {}); this server does not lead",
            self.node,
            self.master_urls.join(", "),
            self.term
        )
    }
}

#[derive(Clone)]
pub struct Supersession {
    superseded: Arc<RwLock<Option<Superseded>>>,
    checked: watch::Receiver<bool>,
}

/// What the check needs.
pub struct Check {
    pub nodes: Reflector<NodeSpec>,
    pub leases: Reflector<LeaseSpec>,
    pub lock_name: String,
    pub peers: Arc<PeerAuthority>,
    /// Where this server serves.
    pub url: String,
}

impl Supersession {
    /// Starts checking until `stop` fires.
    pub fn start(check: Check, stop: CancellationToken) -> Supersession {
        let (done, checked) = watch::channel(false);
        let supersession = Supersession { superseded: Arc::default(), checked };
        let shared = supersession.superseded.clone();
        tokio::spawn(async move {
            check.nodes.synced().await;
            check.leases.synced().await;
            loop {
                if let Ok(Some(found)) = tokio::time::timeout(ROUND_TIMEOUT, check.once()).await {
                    let mut slot = shared.write().unwrap_or_else(|p| p.into_inner());
                    if slot.as_ref() != Some(&found) {
                        tracing::error!("{found}");
                        *slot = Some(found);
                    }
                }
                done.send_replace(true);
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(CHECK_INTERVAL) => {}
                }
            }
        });
        supersession
    }

    /// Resolves once the candidates were asked a first time.
    pub async fn checked(&self) {
        let mut checked = self.checked.clone();
        let _ = checked.wait_for(|done| *done).await;
    }

    pub fn superseded(&self) -> Option<Superseded> {
        self.superseded.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Check {
    /// One round: the first candidate that follows a newer master, if any.
    async fn once(&self) -> Option<Superseded> {
        let own_term = self.leases.get(&self.lock_name).map_or(0, |lease| lease.spec.lease_transitions);
        let mut asking = JoinSet::new();
        for node in self.nodes.list().into_iter().filter(|n| n.spec.role == NodeRole::Candidate) {
            let Ok(agent) = self.peers.agent(&node, Vec::new(), "which master it follows") else { continue };
            asking.spawn(async move { agent.master_view().await });
        }
        while let Some(answered) = asking.join_next().await {
            let Ok(Ok(view)) = answered else { continue };
            if view.term > own_term && !view.master_urls.contains(&self.url) {
                return Some(Superseded { term: view.term, master_urls: view.master_urls, node: view.node });
            }
        }
        None
    }
}
