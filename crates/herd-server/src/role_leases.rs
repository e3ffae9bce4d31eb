//! The leader's clock of the App role leader leases it renews: renewals
//! are not written to the store (a heartbeat answer carries them to the
//! holder's agent), so when each lease was last renewed lives here, on
//! this process's monotonic clock. A leadership starts it afresh
//! ([`RoleLeases::begin`]): a lease it has not renewed yet counts from
//! when it first looked at it, so a new leader never takes a lease that
//! the one before renewed a moment ago for expired. An expired lease is
//! never renewed ([`RoleLeases::renew`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herd_core::api::{AgentReport, LeaseRenewal};
use herd_core::kinds::AppClusterSpec;
use tokio::time::Instant;

use crate::elector::LeaderHealth;
use crate::reflector::Reflector;

/// A role's lease: (cluster, role).
type Key = (String, String);

#[derive(Default)]
pub struct RoleLeases {
    /// Per lease: the term last renewed or first seen, and when.
    seen: Mutex<HashMap<Key, (u64, Instant)>>,
    /// When each node's last heartbeat came (a member may be granted a
    /// lease only on a node heard from lately: a silent node's last
    /// report says nothing of now, though the node is not NotReady yet).
    heard: Mutex<HashMap<String, Instant>>,
}

impl RoleLeases {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, (u64, Instant)>> {
        self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn heard_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.heard.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A leadership begins: nothing renewed or heard before counts.
    pub fn begin(&self) {
        self.lock().clear();
        self.heard_lock().clear();
    }

    /// A heartbeat of `node` came at `at`.
    pub fn heard_from(&self, node: &str, at: Instant) {
        self.heard_lock().insert(node.to_string(), at);
    }

    /// How long since `node` was last heard from (None: not in this
    /// leadership).
    pub fn silent_for(&self, node: &str, now: Instant) -> Option<Duration> {
        self.heard_lock().get(node).map(|at| now.duration_since(*at))
    }

    /// Renews the lease of `role` in `cluster`, in `term`, at `now`, unless
    /// it expired (`lease` since its last renewal): an expired lease stays
    /// so, whatever comes late, and its holder leads again only in a new
    /// term. Whether it was renewed.
    pub fn renew(&self, cluster: &str, role: &str, term: u64, lease: Duration, now: Instant) -> bool {
        let mut seen = self.lock();
        let entry = sighting(&mut seen, cluster, role, term, now);
        let live = now.duration_since(entry.1) < lease;
        if live {
            entry.1 = now;
        }
        live
    }

    /// How long since the lease of `role` in `cluster`, in `term`, was
    /// last renewed, or first seen in that term (zero now).
    pub fn since(&self, cluster: &str, role: &str, term: u64, now: Instant) -> Duration {
        now.duration_since(sighting(&mut self.lock(), cluster, role, term, now).1)
    }
}

/// The lease's entry in `term`: as kept, or first seen now (a new term
/// starts afresh).
fn sighting<'a>(
    seen: &'a mut HashMap<Key, (u64, Instant)>,
    cluster: &str,
    role: &str,
    term: u64,
    now: Instant,
) -> &'a mut (u64, Instant) {
    let entry = seen.entry((cluster.to_string(), role.to_string())).or_insert((term, now));
    if entry.0 != term {
        *entry = (term, now);
    }
    entry
}

/// What a heartbeat renews: the leases of the members it reports running
/// and ready, as their clusters' statuses grant them, while this replica
/// leads (a replica that lost the lease, or has not renewed it within
/// the lease, renews nothing).
#[derive(Clone)]
pub struct Renewals {
    pub clusters: Reflector<AppClusterSpec>,
    pub leases: Arc<RoleLeases>,
    pub health: Arc<LeaderHealth>,
}

impl Renewals {
    /// The leases `node`'s heartbeat with `report` renews.
    pub fn renew(&self, node: &str, report: &AgentReport) -> Vec<LeaseRenewal> {
        if !self.health.is_leading() || self.health.stale().is_some() {
            return Vec::new();
        }
        let now = Instant::now();
        self.leases.heard_from(node, now);
        let renewed = report.members.iter().filter_map(|member| {
            let instance = member.instance_id.as_deref().filter(|_| member.running)?;
            if member.readiness.as_ref().is_some_and(|r| !r.passing || r.instance_id != instance) {
                return None;
            }
            let cluster = self.clusters.get_shared(member.cluster.as_deref()?)?;
            let leader = cluster.status.leaders.iter().find(|l| {
                l.member.as_deref() == Some(member.name.as_str())
                    && l.instance.as_deref() == Some(instance)
                    && !l.revoked
            })?;
            let (lease, renew_deadline) = (leader.lease_duration?, leader.renew_deadline?);
            let live = self.leases.renew(&cluster.metadata.name, &leader.role, leader.term, lease.get(), now);
            live.then(|| LeaseRenewal {
                member: member.name.clone(),
                instance: instance.to_string(),
                term: leader.term,
                renew_deadline,
                lease_duration: lease,
                in_sync: leader.in_sync.clone(),
            })
        });
        renewed.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_lease_counts_from_its_last_renewal_or_from_when_it_was_first_seen_in_its_term() {
        let leases = RoleLeases::default();
        let start = Instant::now();
        assert_eq!(leases.since("c", "db", 1, start), Duration::ZERO, "first seen");
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(leases.since("c", "db", 1, Instant::now()), Duration::from_secs(3));
        assert!(leases.renew("c", "db", 1, Duration::from_secs(10), Instant::now()));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(leases.since("c", "db", 1, Instant::now()), Duration::from_secs(2));
        tokio::time::advance(Duration::from_secs(8)).await;
        assert!(!leases.renew("c", "db", 1, Duration::from_secs(10), Instant::now()), "expired: not renewed");
        assert_eq!(leases.since("c", "db", 1, Instant::now()), Duration::from_secs(10), "and stays expired");
        assert_eq!(leases.since("c", "db", 2, Instant::now()), Duration::ZERO, "a new term starts afresh");
        tokio::time::advance(Duration::from_secs(5)).await;
        leases.begin();
        assert_eq!(leases.since("c", "db", 2, Instant::now()), Duration::ZERO, "a new leadership starts afresh");
    }
}
