//! Leader election between server replicas (three `herd server` processes
//! on one SQLite file, and on one PostgreSQL schema): exactly one leads; a
//! graceful stop hands over at once; a killed leader is replaced at once
//! (its process is seen gone); a paused one only after its lease expires.

mod common;

use std::time::{Duration, Instant};

use common::{TestServer, eventually};
use herd_core::HumanDuration;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{ClusterConfigSpec, LeaseSpec};

const LEASE: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(500);

async fn holder(server: &TestServer) -> Option<(String, u32)> {
    let lease = server.admin().get::<LeaseSpec>("herd-leader").await.ok()?;
    Some((lease.spec.holder_identity, lease.spec.lease_duration_seconds))
}

/// Lease 3s, renew deadline 2s, retry 0.5s: the same rules, quicker.
async fn use_short_election_settings(admin: &herd_client::Client) {
    let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await.unwrap();
    config.spec.leader_election.lease_duration = HumanDuration(LEASE);
    config.spec.leader_election.renew_deadline = HumanDuration(Duration::from_secs(2));
    config.spec.leader_election.retry_period = HumanDuration(RETRY);
    admin.update(&config).await.unwrap();
}

async fn leads(server: &TestServer) -> bool {
    let metrics = server.anonymous().get_text("/metrics").await.unwrap_or_default();
    metrics.lines().any(|l| l == "herd_leader 1")
}

#[tokio::test(flavor = "multi_thread")]
async fn one_leader_graceful_handover_and_takeover_after_a_crash_on_sqlite() {
    one_leader_graceful_handover_and_takeover_after_a_crash(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_leader_graceful_handover_and_takeover_after_a_crash_on_postgres() {
    let Some(schema) = common::PostgresSchema::create() else { return };
    one_leader_graceful_handover_and_takeover_after_a_crash(Some(&schema.url)).await;
}

/// Three replicas on one store (SQLite in a shared data dir, or `store`).
async fn one_leader_graceful_handover_and_takeover_after_a_crash(store: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let mut replicas: Vec<(String, TestServer)> = ["s1", "s2", "s3"]
        .iter()
        .map(|id| (id.to_string(), TestServer::start_replica(dir.path(), id, store)))
        .collect();
    let admin = replicas[0].1.admin();
    use_short_election_settings(&admin).await;

    // Exactly one leader, renewing with the new settings.
    let first = eventually(Duration::from_secs(20), "a leader renewing with a 3s lease", || async {
        holder(&replicas[0].1).await.filter(|(h, d)| !h.is_empty() && *d == 3).map(|(h, _)| h)
    })
    .await;
    let mut leading = Vec::new();
    for (id, server) in &replicas {
        if leads(server).await {
            leading.push(id.clone());
        }
    }
    assert_eq!(leading, vec![first.clone()], "exactly one replica says it leads, the lease holder");

    // SIGTERM: the leader stops its work, releases, and a standby takes over at once.
    let index = replicas.iter().position(|(id, _)| *id == first).unwrap();
    let (_, old) = replicas.remove(index);
    old.proc.signal("TERM");
    let stopped_at = Instant::now();
    let second = eventually(Duration::from_secs(10), "a new leader after SIGTERM", || async {
        holder(&replicas[0].1).await.map(|(h, _)| h).filter(|h| !h.is_empty() && *h != first)
    })
    .await;
    let handover = stopped_at.elapsed();
    assert!(handover < Duration::from_secs(1), "graceful handover took {handover:?}");
    let mut old = old;
    assert!(old.proc.wait_exit(Duration::from_secs(10)).success());
    let events = replicas[0].1.admin().list::<herd_core::kinds::EventSpec>("").await.unwrap();
    for reason in ["StartedLeading", "StoppedLeading", "NewLeader"] {
        assert!(events.iter().any(|e| e.spec.reason == reason), "a {reason} event");
    }

    // kill -9: no release, but the standby sees the holder's process gone
    // (and would take over at expiry at the latest).
    let index = replicas.iter().position(|(id, _)| *id == second).unwrap();
    let (_, mut crashed) = replicas.remove(index);
    crashed.proc.kill9();
    let killed_at = Instant::now();
    let third = eventually(Duration::from_secs(15), "a new leader after kill -9", || async {
        holder(&replicas[0].1).await.map(|(h, _)| h).filter(|h| *h != second && !h.is_empty())
    })
    .await;
    let takeover = killed_at.elapsed();
    eprintln!("election: graceful handover {handover:?}, takeover after kill -9 {takeover:?}");
    assert!(takeover <= LEASE + RETRY.mul_f64(1.2) + Duration::from_secs(1), "takeover took {takeover:?}");
    assert_eq!(third, replicas[0].0);
    eventually(Duration::from_secs(5), "the survivor reports leading", || async {
        leads(&replicas[0].1).await.then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_leader_is_replaced_steps_down_when_it_resumes_and_can_lead_again() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestServer::start_replica(dir.path(), "a", None);
    let admin = a.admin();
    use_short_election_settings(&admin).await;
    eventually(Duration::from_secs(20), "a leads with a 3s lease", || async {
        holder(&a).await.filter(|(h, d)| h == "a" && *d == 3)
    })
    .await;
    let b = TestServer::start_replica(dir.path(), "b", None);

    // Paused for longer than the lease: b takes over meanwhile.
    a.proc.signal("STOP");
    let paused_at = Instant::now();
    eventually(Duration::from_secs(15), "b leads while a is paused", || async {
        holder(&b).await.filter(|(h, _)| h == "b")
    })
    .await;
    let takeover = paused_at.elapsed();
    assert!(takeover <= LEASE + RETRY.mul_f64(1.2) + Duration::from_secs(1), "takeover took {takeover:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    a.proc.signal("CONT");

    // a finds the lease taken, stops its leader-only work and follows.
    eventually(Duration::from_secs(10), "a no longer says it leads", || async { (!leads(&a).await).then_some(()) })
        .await;
    assert_eq!(holder(&b).await.unwrap().0, "b", "b keeps the lease");
    assert!(leads(&b).await);

    // And a can lead again: b stops gracefully, a takes over at once.
    b.proc.signal("TERM");
    eventually(Duration::from_secs(5), "a leads again", || async { holder(&a).await.filter(|(h, _)| h == "a") }).await;
    eventually(Duration::from_secs(5), "a says it leads", || async { leads(&a).await.then_some(()) }).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_leader_is_replaced_at_once_with_the_default_15s_lease_on_sqlite() {
    a_killed_leader_is_replaced_at_once(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_leader_is_replaced_at_once_with_the_default_15s_lease_on_postgres() {
    let Some(schema) = common::PostgresSchema::create() else { return };
    a_killed_leader_is_replaced_at_once(Some(&schema.url)).await;
}

/// The standby sees the holder's process die (its store session or its
/// locked file is gone) and does not wait out the 15s lease.
async fn a_killed_leader_is_replaced_at_once(store: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let mut first = TestServer::start_replica(dir.path(), "first", store);
    eventually(Duration::from_secs(20), "first leads", || async {
        holder(&first).await.filter(|(h, d)| h == "first" && *d == 15)
    })
    .await;
    let second = TestServer::start_replica(dir.path(), "second", store);
    first.proc.kill9();
    let killed_at = Instant::now();
    eventually(Duration::from_secs(20), "second leads", || async {
        holder(&second).await.filter(|(h, _)| h == "second")
    })
    .await;
    let takeover = killed_at.elapsed();
    eprintln!("election: takeover after kill -9 with a 15s lease {takeover:?}");
    assert!(takeover < Duration::from_secs(2), "takeover took {takeover:?}");
}
