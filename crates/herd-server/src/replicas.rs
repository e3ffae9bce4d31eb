//! This replica's own `Replica` record, and the cluster status read from
//! all of them and the leader Lease.
//!
//! The record is written on start, refreshed every [`REPLICA_REFRESH`]
//! while the replica runs, and marked stopped on a clean stop. It carries
//! the store's liveness token for this process, so that another replica can
//! tell a crashed one from a paused one (see `herd_core::kinds::replica`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use herd_core::Timestamp;
use herd_core::api::{ClusterStatus, LeaderInfo, ReplicaInfo};
use herd_core::kinds::replica::{REPLICA_REFRESH, ReplicaFacts, replica_state};
use herd_core::kinds::{LeaseSpec, Replica, ReplicaSpec, ReplicaStatus};
use herd_core::time::HumanDuration;
use herd_store::Store;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::change_clock::ChangeClock;
use crate::error::ApiError;
use crate::objects::{Objects, Part, now};
use crate::reflector::Reflector;

/// Who this replica is, as the cluster status reports it.
#[derive(Clone, Debug)]
pub struct ReplicaIdentity {
    pub name: String,
    pub url: String,
    pub node: Option<String>,
    /// The leader Lease's name.
    pub lock_name: String,
}

/// Writes this replica's record, then keeps it fresh in a task until
/// `stop` fires, when the task marks it stopped; a change of leadership
/// (`leading`) is written at once. Failures are logged and retried at the
/// next refresh.
pub async fn keep_record(
    objects: Objects,
    me: ReplicaIdentity,
    mut leading: watch::Receiver<bool>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let started_at = now();
    let report = |error: ApiError| tracing::warn!(%error, "could not write this replica's record");
    refresh(&objects, &me, started_at, false, None).await.unwrap_or_else(report);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(REPLICA_REFRESH) => {}
                _ = leading.changed() => {}
            }
            let leads = *leading.borrow_and_update();
            refresh(&objects, &me, started_at, leads, None).await.unwrap_or_else(report);
        }
        refresh(&objects, &me, started_at, false, Some(now())).await.unwrap_or_else(report);
    })
}

async fn refresh(
    objects: &Objects,
    me: &ReplicaIdentity,
    started_at: Timestamp,
    leading: bool,
    stopped_at: Option<Timestamp>,
) -> Result<(), ApiError> {
    let status = ReplicaStatus {
        started_at,
        last_seen: now(),
        stopped_at,
        liveness: objects.store().liveness_token(),
        version: env!("CARGO_PKG_VERSION").into(),
        leading,
    };
    let Some(mut record) = objects.get::<ReplicaSpec>(&me.name).await? else {
        let mut record = Replica::new(&me.name, ReplicaSpec { url: me.url.clone(), node: me.node.clone() });
        record.status = status;
        objects.create(record, true, false).await?;
        return Ok(());
    };
    if record.spec.url != me.url || record.spec.node != me.node {
        record.spec.url = me.url.clone();
        record.spec.node = me.node.clone();
        record = objects.update(record, false).await?;
    }
    record.status = status;
    objects.write_part(record, Part::Status, false).await?;
    Ok(())
}

/// When this process saw each Replica record change: the other replicas'
/// liveness is judged on this clock, not on the times they write.
#[derive(Clone)]
pub struct ReplicaSightings {
    clock: Arc<Mutex<ChangeClock<Option<String>>>>,
}

impl ReplicaSightings {
    /// Follows every Replica record (through a watch-fed cache) until `stop`.
    pub fn start(store: Store, stop: CancellationToken) -> Self {
        let records = Reflector::<ReplicaSpec>::start(store, stop.clone());
        let sightings = ReplicaSightings { clock: Arc::default() };
        let noted = sightings.clone();
        tokio::spawn(async move {
            let mut changes = records.changes();
            loop {
                for record in records.list() {
                    noted.silent_for(&record);
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    changed = changes.changed() => if changed.is_err() { return },
                }
            }
        });
        sightings
    }

    /// Since this process saw `record` change (zero when it is news).
    fn silent_for(&self, record: &Replica) -> Duration {
        let mut clock = self.clock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        clock.since(&record.metadata.name, record.metadata.resource_version.clone(), Instant::now())
    }
}

/// The leader and every replica on record, with what each is doing.
/// The answering replica's own leadership is taken from `i_lead` (what it
/// knows now), not from its record, which follows a moment later.
pub async fn cluster_status(
    objects: &Objects,
    me: &ReplicaIdentity,
    sightings: &ReplicaSightings,
    i_lead: bool,
) -> Result<ClusterStatus, ApiError> {
    let lease = objects.get::<LeaseSpec>(&me.lock_name).await?;
    let (records, _) = objects.list::<ReplicaSpec>().await?;
    let holder = lease.as_ref().map(|l| l.spec.holder_identity.clone()).unwrap_or_default();
    let mut replicas = Vec::with_capacity(records.len());
    for record in records {
        let status = &record.status;
        let alive = match &status.liveness {
            Some(token) => objects.store().is_alive(token).await.ok(),
            None => None,
        };
        let silent_for = sightings.silent_for(&record);
        let facts = ReplicaFacts {
            holds_lease: !holder.is_empty() && record.metadata.name == holder,
            reports_leading: if record.metadata.name == me.name { i_lead } else { status.leading },
            stopped: status.stopped_at.is_some(),
            alive,
            silent_for,
        };
        let recorded_span = status.started_at.age(status.last_seen);
        replicas.push(ReplicaInfo {
            state: replica_state(facts),
            name: record.metadata.name,
            url: record.spec.url,
            started_at: status.started_at,
            last_seen: status.last_seen,
            stopped_at: status.stopped_at,
            version: status.version.clone(),
            silent_for: HumanDuration(silent_for),
            up_for: HumanDuration(recorded_span + silent_for),
        });
    }
    let leader = lease.as_ref().filter(|l| !l.spec.holder_identity.is_empty()).map(|l| LeaderInfo {
        identity: l.spec.holder_identity.clone(),
        term: l.spec.lease_transitions,
        since: l.spec.acquire_time,
        renewed: l.spec.renew_time,
        lease_duration_seconds: l.spec.lease_duration_seconds,
    });
    Ok(ClusterStatus {
        served_by: me.name.clone(),
        lock_name: me.lock_name.clone(),
        leader,
        lease_transitions: lease.map_or(0, |l| l.spec.lease_transitions),
        replicas,
        superseded: None,
    })
}
