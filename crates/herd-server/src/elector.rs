//! The elector: campaigns for the leader Lease, renews it while leading,
//! and runs the leader-only work (the controllers) exactly while it leads.
//!
//! The decisions come from `herd_core::election`; this shell reads the
//! Lease (from a watch-fed cache, so a release is seen at once), writes it
//! with a compare on the revision it read (the loser of a race gets a
//! conflict), and keeps time on the monotonic clock. Leader-only work is
//! stopped, and awaited, before leadership is given up: on losing the
//! lease, on failing to renew within the renew deadline, and on shutdown,
//! where the lease is then released so that a standby takes over at once.

use std::sync::Arc;
use std::time::Duration;

use herd_core::Object;
use herd_core::election::{self, Candidate, Decision, Now, Observed};
use herd_core::kinds::{
    ClusterConfigSpec, EventReason, EventType, LeaderElectionOverrides, LeaderElectionSettings, Lease, LeaseSpec, Node,
    NodeRole, NodeSpec,
};
use herd_store::Op;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;
use crate::events::EventRecorder;
use crate::metrics::Metrics;
use crate::nodes::cluster_config;
use crate::objects::{Fence, Objects, now};
use crate::reflector::Reflector;

/// How often a standby checks that a leader whose death it can tell lives.
const HOLDER_CHECK: Duration = Duration::from_millis(100);

/// The key written only when a replica acquires lease `lock_name`
/// (renewals leave it), in the same transaction: leader-only writes
/// compare it (see `Fence`).
pub fn fence_key(lock_name: &str) -> String {
    format!("/fence/{lock_name}")
}

/// What `/healthz` needs to know of this replica's leadership: when it
/// last renewed, and with what lease duration, while it leads.
pub struct LeaderHealth {
    renewed: std::sync::Mutex<Option<(Instant, Duration)>>,
    /// Whether this replica leads; its Replica record follows this.
    leading: tokio::sync::watch::Sender<bool>,
}

impl Default for LeaderHealth {
    fn default() -> Self {
        LeaderHealth { renewed: Default::default(), leading: tokio::sync::watch::Sender::new(false) }
    }
}

impl LeaderHealth {
    fn set(&self, value: Option<(Instant, Duration)>) {
        self.leading.send_if_modified(|leading| std::mem::replace(leading, value.is_some()) != value.is_some());
        if let Ok(mut renewed) = self.renewed.lock() {
            *renewed = value;
        }
    }

    /// Leads as if it had just renewed a lease of `lease` (tests that
    /// run the leader's work without an election).
    #[cfg(test)]
    pub(crate) fn leading_for_tests(&self, lease: Duration) {
        self.set(Some((Instant::now(), lease)));
    }

    /// Whether this replica leads now.
    pub fn is_leading(&self) -> bool {
        *self.leading.borrow()
    }

    /// Changes when this replica starts or stops leading.
    pub fn leading(&self) -> tokio::sync::watch::Receiver<bool> {
        self.leading.subscribe()
    }

    /// Why this replica is unhealthy as a leader, if it is: it believes it
    /// leads but has not renewed for longer than the lease (another replica
    /// may lead already).
    pub fn stale(&self) -> Option<String> {
        let (renewed, lease) = (*self.renewed.lock().ok()?)?;
        let silent = renewed.elapsed();
        election::leadership_stale(Duration::ZERO, silent, lease)
            .then(|| format!("this replica leads but has not renewed its lease for {silent:?} (lease {lease:?})"))
    }
}

/// Leader-only work: started with a token and this leadership's fence
/// (every write it makes must be fenced), stopped by cancelling the token.
pub type LeaderWork = Box<dyn Fn(CancellationToken, Fence) -> JoinSet<()> + Send + Sync>;

pub struct Elector {
    pub objects: Objects,
    pub leases: Reflector<LeaseSpec>,
    pub config: Reflector<ClusterConfigSpec>,
    pub events: EventRecorder,
    pub identity: String,
    /// The node this replica runs on; it campaigns only while that node is
    /// a master candidate (or while no node is one, to bootstrap).
    pub node: Option<String>,
    pub nodes: Reflector<NodeSpec>,
    /// Whether a master failover superseded this server (SQLite only): it
    /// then never leads.
    pub supersession: Option<crate::supersession::Supersession>,
    /// The settings as validated at start: the lock name and the switches
    /// are read from here only.
    pub settings: LeaderElectionSettings,
    /// This replica's flags, applied again to every ClusterConfig change
    /// (the durations follow it).
    pub overrides: LeaderElectionOverrides,
    pub work: LeaderWork,
    pub health: Arc<LeaderHealth>,
    pub metrics: Arc<Metrics>,
}

/// The leader-only work while it runs.
struct Running {
    stop: CancellationToken,
    tasks: JoinSet<()>,
}

impl Running {
    async fn stop(mut self) {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
    }
}

impl Elector {
    /// Campaigns until `stop` fires, then stops the leader-only work and
    /// (releaseOnShutdown) releases the lease before the task ends.
    pub fn start(self, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.run(stop))
    }

    async fn run(self, stop: CancellationToken) {
        let origin = Instant::now();
        let mono = || origin.elapsed();
        let mut observed: Option<Observed> = None;
        let mut last_renewed: Option<Duration> = None;
        let mut running: Option<Running> = None;
        let mut lease_changes = self.leases.changes();
        if self.settings.wait_for_ready {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = async { self.leases.synced().await; self.config.synced().await } => {}
            }
        }
        // Which nodes are candidates must be known before deciding to campaign.
        if self.node.is_some() {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.nodes.synced() => {}
            }
        }
        // And whether a failover replaced this master while it was away.
        if let Some(supersession) = &self.supersession {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = supersession.checked() => {}
            }
        }
        let mut settings = self.settings.clone();
        let mut refused = None;
        while !stop.is_cancelled() {
            settings = self.current_settings(&settings, &mut refused);
            let previous_holder = observed.as_ref().map(|o| o.record.holder_identity.clone());
            observed = observe(self.leases.get(&self.settings.lock_name), observed, mono());
            if let Some(seen) = &observed {
                self.metrics.observe_lease(&seen.record.holder_identity, seen.record.lease_transitions);
            }
            self.tell_new_leader(previous_holder, observed.as_ref()).await;
            let leading = running.is_some();
            let watching_holder = match observed.as_mut() {
                Some(seen) if !leading => self.check_holder(seen).await,
                _ => false,
            };
            let me =
                Candidate { identity: self.identity.clone(), liveness: self.objects.store().liveness_token(), leading };
            let decision = election::decide(
                &me,
                observed.as_ref(),
                Now { monotonic: mono(), wall: now() },
                settings.lease_duration.get(),
            );
            // Taking the lease is for candidates' replicas; one that leads
            // keeps it (only a failover moves the master).
            let acquiring = matches!(decision, Decision::Create(_) | Decision::Write { acquiring: true, .. });
            if acquiring && running.is_none() && !self.may_campaign() {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = tokio::time::sleep(settings.retry_period.get()) => {}
                }
                continue;
            }
            // A write that hangs must not keep a leader from noticing that
            // its renew deadline passed.
            let written = match tokio::time::timeout(settings.retry_period.get(), self.write(&decision)).await {
                Ok(result) => result,
                Err(_) => Err(ApiError::Unavailable("writing the lease timed out".into())),
            };
            match (written, &decision) {
                (Ok(Some((lease, fence))), _) => {
                    last_renewed = Some(mono());
                    self.health.set(Some((Instant::now(), settings.lease_duration.get())));
                    if let (None, Some(fence)) = (&running, fence) {
                        let term = fence.term;
                        tracing::info!(identity = %self.identity, term, "started leading");
                        let message = format!("{} leads (term {term})", self.identity);
                        self.publish(&lease, EventType::Normal, EventReason::StartedLeading, message).await;
                        let token = stop.child_token();
                        running = Some(Running { tasks: (self.work)(token.clone(), fence), stop: token });
                        self.metrics.started_leading();
                    }
                }
                (Ok(None), Decision::Follow { .. }) => {
                    if let Some(work) = running.take() {
                        self.step_down(work, "another replica holds the lease").await;
                        last_renewed = None;
                    }
                }
                (Ok(None), _) => {}
                (Err(error), _) => tracing::debug!(%error, "lease write did not go through"),
            }
            if let Some(renewed) = last_renewed
                && election::must_step_down(renewed, mono(), settings.renew_deadline.get())
                && let Some(work) = running.take()
            {
                self.step_down(work, "could not renew the lease within the renew deadline").await;
                last_renewed = None;
            }
            if let Some(superseded) = self.supersession.as_ref().and_then(|s| s.superseded())
                && let Some(work) = running.take()
            {
                self.step_down(work, &superseded.to_string()).await;
                last_renewed = None;
            }
            // Following a holder whose death can be told: look often, so
            // that a crashed leader is replaced in well under a second.
            let pause = if watching_holder && running.is_none() {
                settings.retry_period.get().min(HOLDER_CHECK)
            } else {
                settings.retry_period.get()
            };
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(pause) => {}
                // A follower looks again as soon as the lease changes (a release).
                _ = lease_changes.changed(), if running.is_none() => {}
            }
        }
        if let Some(work) = running.take() {
            // Release before anything else is written: a standby is waiting.
            work.stop().await;
            if self.settings.release_on_shutdown {
                self.release().await;
            }
            self.stepped_down("shutting down").await;
        }
    }

    /// Whether this replica may take the lease: no failover superseded it,
    /// and it names no node, its node
    /// is a master candidate, or no node is one yet (someone must lead to
    /// promote the first).
    fn may_campaign(&self) -> bool {
        if let Some(superseded) = self.supersession.as_ref().and_then(|s| s.superseded()) {
            tracing::debug!(%superseded, "not campaigning");
            return false;
        }
        let Some(node) = &self.node else { return true };
        let nodes = self.nodes.list();
        let candidate = |n: &Node| n.spec.role == NodeRole::Candidate;
        let allowed = nodes.iter().any(|n| n.metadata.name == *node && candidate(n)) || !nodes.iter().any(candidate);
        if !allowed {
            tracing::debug!(node = %node, "not campaigning: this replica's node is not a master candidate");
        }
        allowed
    }

    /// The settings for this round: the durations from the ClusterConfig
    /// with this replica's flags on top, the rest as at start. A
    /// ClusterConfig that does not go with the flags is reported once
    /// (`refused` remembers it) and the previous settings stay.
    fn current_settings(
        &self,
        previous: &LeaderElectionSettings,
        refused: &mut Option<LeaderElectionSettings>,
    ) -> LeaderElectionSettings {
        let config = cluster_config(&self.config).leader_election;
        match self.overrides.apply(&config) {
            Ok(current) => {
                *refused = None;
                LeaderElectionSettings {
                    lease_duration: current.lease_duration,
                    renew_deadline: current.renew_deadline,
                    retry_period: current.retry_period,
                    ..self.settings.clone()
                }
            }
            Err(error) => {
                if refused.as_ref() != Some(&config) {
                    tracing::warn!(%error, "the ClusterConfig's leader election settings do not go with this replica's flags; keeping the previous ones");
                    *refused = Some(config);
                }
                previous.clone()
            }
        }
    }

    /// Records a leadership Event, unless publishEvents is off.
    async fn publish(&self, lease: &Lease, type_: EventType, reason: EventReason, message: String) {
        if self.settings.publish_events {
            self.events.record(lease, type_, reason, message).await;
        }
    }

    /// Makes the write a decision calls for. Some when this replica holds
    /// the lease afterwards, with the new fence when it just acquired it.
    async fn write(&self, decision: &Decision) -> Result<Option<(Lease, Option<Fence>)>, ApiError> {
        let (record, revision, acquiring) = match decision {
            Decision::Create(record) => (record, None, true),
            Decision::Write { record, revision, acquiring } => (record, Some(*revision), *acquiring),
            Decision::Follow { .. } => return Ok(None),
        };
        let mut lease = Object::new(&self.settings.lock_name, record.clone());
        lease.metadata.resource_version = revision.map(|r| r.to_string());
        if !acquiring {
            return Ok(Some((self.objects.update(lease, false).await?, None)));
        }
        // The fence moves in the acquiring transaction, just before the
        // lease: its revision is the lease's minus one.
        let term = record.lease_transitions;
        let value = serde_json::json!({ "holder": self.identity, "term": term }).to_string().into_bytes();
        let key = fence_key(&self.settings.lock_name);
        let lease = self.objects.write_with(lease, vec![Op::Put { key: key.clone(), value }]).await?;
        let lease_revision = lease.metadata.revision().ok().flatten().unwrap_or_default();
        let fence = Fence { key, revision: lease_revision.saturating_sub(1), term };
        Ok(Some((lease, Some(fence))))
    }

    /// Asks the store whether the holder's process still lives (a
    /// follower asks; the holder may be an earlier process of this
    /// replica's name), and marks the observation; true when there is such
    /// a holder to watch.
    async fn check_holder(&self, seen: &mut Observed) -> bool {
        let holder = &seen.record.holder_identity;
        let Some(token) = seen.record.holder_liveness.as_deref() else { return false };
        if holder.is_empty() {
            return false;
        }
        seen.holder_dead = match self.objects.store().is_alive(token).await {
            Ok(alive) => !alive,
            Err(error) => {
                tracing::debug!(%error, "could not tell whether the leader lives");
                false
            }
        };
        if seen.holder_dead {
            tracing::warn!(holder = %holder, "the leader's process is gone; taking over without waiting for the lease");
        }
        true
    }

    /// Records a NewLeader event when the lease changed hands to another.
    async fn tell_new_leader(&self, previous: Option<String>, observed: Option<&Observed>) {
        let Some(observed) = observed else { return };
        let holder = &observed.record.holder_identity;
        if holder.is_empty() || *holder == self.identity || previous.as_ref() == Some(holder) {
            return;
        }
        if let Some(lease) = self.leases.get(&self.settings.lock_name) {
            let message = format!("{holder} leads (term {})", observed.record.lease_transitions);
            self.publish(&lease, EventType::Normal, EventReason::NewLeader, message).await;
        }
    }

    /// Stops the leader-only work, waits for it, then says so.
    async fn step_down(&self, work: Running, why: &str) {
        work.stop().await;
        self.stepped_down(why).await;
    }

    /// Tells that this replica no longer leads (health, metrics, log, Event).
    async fn stepped_down(&self, why: &str) {
        self.health.set(None);
        self.metrics.stopped_leading();
        tracing::warn!(identity = %self.identity, why, "stopped leading");
        if let Some(lease) = self.leases.get(&self.settings.lock_name) {
            let message = format!("{} stopped leading: {why}", self.identity);
            self.publish(&lease, EventType::Warning, EventReason::StoppedLeading, message).await;
        }
    }

    /// Gives the lease up (holder "", 1s), retrying on conflict while this
    /// replica still holds it.
    async fn release(&self) {
        for _ in 0..5 {
            let Ok(Some(lease)) = self.objects.get::<LeaseSpec>(&self.settings.lock_name).await else { return };
            if lease.spec.holder_identity != self.identity {
                return;
            }
            let mut released = lease.clone();
            released.spec = election::release(&lease.spec, now());
            match self.objects.update(released, false).await {
                Ok(_) => {
                    tracing::info!(identity = %self.identity, "released the lease");
                    return;
                }
                Err(error) => tracing::warn!(%error, "releasing the lease failed; retrying"),
            }
        }
    }
}

/// The observation after reading `lease`: its change time moves only when
/// its revision does.
fn observe(lease: Option<Lease>, previous: Option<Observed>, now: Duration) -> Option<Observed> {
    let lease = lease?;
    let revision = lease.metadata.revision().ok().flatten().unwrap_or_default();
    match previous {
        Some(previous) if previous.revision == revision => Some(previous),
        _ => Some(Observed { record: lease.spec, revision, changed_at: now, holder_dead: false }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_stops_renewing_turns_unhealthy_after_one_lease() {
        let health = LeaderHealth::default();
        assert_eq!(health.stale(), None, "a follower is healthy");
        health.set(Some((Instant::now(), Duration::from_secs(15))));
        tokio::time::advance(Duration::from_secs(15)).await;
        assert_eq!(health.stale(), None);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(health.stale().unwrap().contains("has not renewed its lease"));
        health.set(None);
        assert_eq!(health.stale(), None, "after stepping down it is healthy again");
    }
}
