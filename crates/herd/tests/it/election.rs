//! Leader election between server replicas (three `herd server` processes
//! on one SQLite file, and on one PostgreSQL schema): exactly one leads; a
//! graceful stop hands over at once; a killed leader is replaced at once
//! (its process is seen gone); a paused one only after its lease expires,
//! and none of the writes it attempts after resuming lands (fencing).

use crate::common;

use std::time::{Duration, Instant};

use common::{TestServer, eventually};
use herd_core::HumanDuration;
use herd_core::api::ClusterStatus;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{ClusterConfigSpec, EventReason, LeaseSpec, ReplicaState};
use herd_server::controllers::fencing_probe::{PROBE_PREFIX, ProbeRecord};
use herd_store::{ListOptions, Store};

const LEASE: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(500);
/// The same rules as the defaults, quicker: lease 3s, renew deadline 2s, retry 0.5s.
const SHORT: [&str; 6] = ["--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms"];

async fn holder(server: &TestServer) -> Option<(String, u32)> {
    let lease = server.admin().get::<LeaseSpec>("herd-leader").await.ok()?;
    Some((lease.spec.holder_identity, lease.spec.lease_duration_seconds))
}

async fn leads(server: &TestServer) -> bool {
    metric(server, "herd_leader").await == Some(1)
}

async fn metric(server: &TestServer, name: &str) -> Option<u64> {
    let metrics = server.admin().get_text("/metrics").await.ok()?;
    metrics.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

fn state_of(status: &ClusterStatus, name: &str) -> Option<ReplicaState> {
    status.replicas.iter().find(|r| r.name == name).map(|r| r.state)
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

/// Three replicas on one store (SQLite in a shared data dir, or `store`),
/// their election settings given as flags.
async fn one_leader_graceful_handover_and_takeover_after_a_crash(store: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let mut replicas: Vec<(String, TestServer)> = ["s1", "s2", "s3"]
        .iter()
        .map(|id| (id.to_string(), TestServer::start_replica(dir.path(), id, store, &SHORT)))
        .collect();

    // Exactly one leader, renewing with the flags' lease.
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
    // The leader's record says it leads a write after it took the lease.
    let status = eventually(Duration::from_secs(5), "the leader's record says it leads", || async {
        let status = replicas[0].1.admin().cluster_status().await.ok()?;
        (state_of(&status, &first) == Some(ReplicaState::Leading)).then_some(status)
    })
    .await;
    assert_eq!(status.leader.as_ref().map(|l| l.identity.as_str()), Some(first.as_str()));
    for (id, _) in &replicas {
        let expected = if *id == first { ReplicaState::Leading } else { ReplicaState::Standby };
        assert_eq!(state_of(&status, id), Some(expected), "{id} in {status:?}");
    }

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
    for reason in [EventReason::StartedLeading, EventReason::StoppedLeading, EventReason::NewLeader] {
        assert!(events.iter().any(|e| e.spec.reason_is(reason)), "a {reason} event");
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

    // The cluster status tells each replica's story.
    let status = replicas[0].1.admin().cluster_status().await.unwrap();
    assert_eq!(state_of(&status, &first), Some(ReplicaState::Stopped), "{status:?}");
    assert_eq!(state_of(&status, &second), Some(ReplicaState::Gone), "{status:?}");
    assert_eq!(state_of(&status, &third), Some(ReplicaState::Leading), "{status:?}");
    let leader = status.leader.unwrap();
    assert_eq!((leader.identity.as_str(), leader.term), (third.as_str(), 2), "two transitions since the first");
}

/// On PostgreSQL, the replicas' backend for real: a replica paused in the
/// middle of a SQLite write would hold the file's write lock, and no other
/// replica could write until it resumed (see README).
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_leader_is_fenced_steps_down_when_it_resumes_and_can_lead_again() {
    let Some(schema) = common::PostgresSchema::create() else { return };
    let store = Some(schema.url.as_str());
    let dir = tempfile::tempdir().unwrap();
    let probe = [&SHORT[..], &["--fencing-probe", "20ms"]].concat();
    let a = TestServer::start_replica(dir.path(), "a", store, &probe);
    eventually(Duration::from_secs(20), "a leads", || async { holder(&a).await.filter(|(h, _)| h == "a") }).await;
    let b = TestServer::start_replica(dir.path(), "b", store, &probe);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Paused for longer than the lease: b takes over meanwhile.
    a.proc.signal("STOP");
    let paused_at = Instant::now();
    eventually(Duration::from_secs(15), "b leads while a is paused", || async {
        holder(&b).await.filter(|(h, _)| h == "b")
    })
    .await;
    let takeover = paused_at.elapsed();
    // Its last renewal came up to one retry period before the pause.
    assert!(takeover >= LEASE - RETRY, "a live (paused) leader was replaced before its lease expired: {takeover:?}");
    assert!(takeover <= LEASE + RETRY.mul_f64(1.2) + Duration::from_secs(1), "takeover took {takeover:?}");
    let status = b.admin().cluster_status().await.unwrap();
    assert_eq!(state_of(&status, "b"), Some(ReplicaState::Leading), "{status:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    a.proc.signal("CONT");

    // a finds the lease taken, stops its leader-only work and follows;
    // the probe writes it attempted meanwhile were refused.
    eventually(Duration::from_secs(10), "a no longer says it leads", || async { (!leads(&a).await).then_some(()) })
        .await;
    assert_eq!(holder(&b).await.unwrap().0, "b", "b keeps the lease");
    assert!(leads(&b).await);
    let refused = metric(&a, "herd_fenced_writes_total").await.unwrap();
    assert!(refused >= 1, "the resumed replica attempted leader-only writes, and they were refused");

    // And a can lead again: b stops gracefully, a takes over at once.
    b.proc.signal("TERM");
    eventually(Duration::from_secs(5), "a leads again", || async { holder(&a).await.filter(|(h, _)| h == "a") }).await;
    eventually(Duration::from_secs(5), "a says it leads", || async { leads(&a).await.then_some(()) }).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The store's record of the probe: three terms (a, b, a again), and no
    // write of one term after the first write of the next.
    let store = Store::open(&schema.url).await.unwrap();
    let page = store.list(PROBE_PREFIX, &ListOptions::default(), |_| true).await.unwrap();
    let terms: Vec<(ProbeRecord, u64, u64)> = page
        .items
        .iter()
        .map(|kv| (serde_json::from_slice(&kv.value).unwrap(), kv.create_revision, kv.mod_revision))
        .collect();
    let holders: Vec<&str> = terms.iter().map(|(r, _, _)| r.holder.as_str()).collect();
    assert_eq!(holders, ["a", "b", "a"], "{terms:?}");
    for pair in terms.windows(2) {
        let ((earlier, _, last_write), (later, first_write, _)) = (&pair[0], &pair[1]);
        assert!(earlier.term < later.term);
        assert!(
            last_write < first_write,
            "term {} ({}) wrote at revision {last_write}, after term {} ({}) began at {first_write}",
            earlier.term,
            earlier.holder,
            later.term,
            later.holder
        );
    }
    assert!(terms.iter().all(|(r, _, _)| r.count >= 2), "every leader wrote several times: {terms:?}");
}

/// A leader that cannot renew within its renew deadline (the store holds
/// its writes: the test takes the store's commit lock for 3s) steps down,
/// and then never renews the lease it no longer leads under: it waits the
/// lease out and takes it anew, with a new term, before it leads again.
#[tokio::test(flavor = "multi_thread")]
async fn a_replica_that_stepped_down_does_not_renew_until_it_wins_the_lease_anew() {
    let Some(schema) = common::PostgresSchema::create() else { return };
    let dir = tempfile::tempdir().unwrap();
    let solo = TestServer::start_replica(dir.path(), "solo", Some(&schema.url), &SHORT);
    eventually(Duration::from_secs(20), "solo leads", || async { leads(&solo).await.then_some(()) }).await;
    let lease = solo.admin().get::<LeaseSpec>("herd-leader").await.unwrap();
    let term = lease.spec.lease_transitions;

    // Every commit takes this transaction-scoped advisory lock; holding it
    // in a session of our own stops them all.
    let url = schema.url.clone();
    let blocker = std::thread::spawn(move || {
        std::process::Command::new("psql")
            .args([url.as_str(), "-qAtc", "SELECT pg_advisory_lock(hashtext(current_schema())), pg_sleep(3)"])
            .output()
            .unwrap()
    });
    eventually(Duration::from_secs(10), "solo steps down", || async { (!leads(&solo).await).then_some(()) }).await;
    let blocked = blocker.join().unwrap();
    assert!(blocked.status.success(), "{}", String::from_utf8_lossy(&blocked.stderr));

    // Until it takes the lease anew, the lease does not move (at most the
    // one renewal that waited on the lock lands late).
    let mut revisions = std::collections::BTreeSet::new();
    let started = Instant::now();
    let retaken = loop {
        assert!(started.elapsed() < Duration::from_secs(15), "solo did not take the lease anew: {revisions:?}");
        if let Ok(lease) = solo.admin().get::<LeaseSpec>("herd-leader").await {
            if lease.spec.lease_transitions > term {
                break lease;
            }
            revisions.insert(lease.metadata.resource_version.clone().unwrap_or_default());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(revisions.len() <= 2, "a replica that does not lead renewed the lease: {revisions:?}");
    assert_eq!((retaken.spec.holder_identity.as_str(), retaken.spec.lease_transitions), ("solo", term + 1));
    eventually(Duration::from_secs(5), "solo leads again", || async { leads(&solo).await.then_some(()) }).await;
    let status = solo.admin().cluster_status().await.unwrap();
    assert_eq!(state_of(&status, "solo"), Some(ReplicaState::Leading), "{status:?}");
}

/// A replica whose wall clock is an hour behind (libfaketime) writes times
/// an hour old into its record; the cluster status judges it by when its
/// record last changed on the answering replica's clock, so it is a healthy
/// Standby, and it shows up for minutes, not an hour.
#[tokio::test(flavor = "multi_thread")]
async fn a_replica_with_a_skewed_wall_clock_is_shown_standby() {
    let dir = tempfile::tempdir().unwrap();
    let honest = TestServer::start_replica(dir.path(), "honest", None, &SHORT);
    eventually(Duration::from_secs(20), "honest leads", || async { leads(&honest).await.then_some(()) }).await;
    let Some(skewed) = TestServer::start_skewed_replica(dir.path(), "skewed", None, "-1h") else { return };
    let admin = honest.admin();
    let record = eventually(Duration::from_secs(10), "the skewed replica's record", || async {
        admin.get::<herd_core::kinds::ReplicaSpec>("skewed").await.ok()
    })
    .await;
    let behind = record.status.last_seen.age(herd_core::Timestamp::from_system_time(std::time::SystemTime::now()));
    assert!(
        behind > Duration::from_secs(3500),
        "its clock is an hour behind: last seen {behind:?} ago by its own word"
    );
    // Two refreshes later, it is still a healthy Standby.
    tokio::time::sleep(herd_core::kinds::replica::REPLICA_REFRESH * 2).await;
    let status = admin.cluster_status().await.unwrap();
    let info = status.replicas.iter().find(|r| r.name == "skewed").unwrap();
    assert_eq!(info.state, ReplicaState::Standby, "{status:?}");
    let refresh = herd_core::kinds::replica::REPLICA_REFRESH;
    assert!(info.silent_for.get() < refresh * 2, "silent {:?}", info.silent_for.get());
    assert!(info.up_for.get() < Duration::from_secs(60), "up for {:?}", info.up_for.get());
    assert_eq!(state_of(&status, "honest"), Some(ReplicaState::Leading), "{status:?}");
    // The CLI says so too.
    let out = common::herd()
        .args(["--server", &honest.url, "--token", common::ADMIN_TOKEN, "cluster", "status"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text.lines().find(|l| l.starts_with("skewed")).unwrap_or_default();
    assert!(row.contains("Standby") && !row.contains("60m"), "{text}");
    drop(skewed);
}

/// On PostgreSQL, a replica whose wall clock is an hour ahead stamps
/// objects on the database's clock: its record, and the lease it renews
/// once it leads, carry the time of day, not an hour from now, so that
/// every replica judges the ages of what it writes (an approval, a
/// deadline's start) as the others do. Judged by its own clock, such a
/// leader took every standing disruption approval for lapsed.
#[tokio::test(flavor = "multi_thread")]
async fn on_postgres_a_replica_with_a_skewed_wall_clock_stamps_objects_on_the_stores_clock() {
    let Some(schema) = common::PostgresSchema::create() else { return };
    let dir = tempfile::tempdir().unwrap();
    let honest = TestServer::start_replica(&dir.path().join("honest"), "honest", Some(&schema.url), &SHORT);
    eventually(Duration::from_secs(20), "honest leads", || async { leads(&honest).await.then_some(()) }).await;
    let Some(skewed) = TestServer::start_skewed_replica(&dir.path().join("skewed"), "skewed", Some(&schema.url), "+1h")
    else {
        return;
    };
    let off = |at: herd_core::Timestamp| {
        let now = herd_core::Timestamp::from_system_time(std::time::SystemTime::now());
        at.age(now).max(now.age(at))
    };
    let admin = skewed.admin();
    let record = eventually(Duration::from_secs(10), "the skewed replica's record", || async {
        admin.get::<herd_core::kinds::ReplicaSpec>("skewed").await.ok()
    })
    .await;
    assert!(off(record.status.started_at) < Duration::from_secs(30), "started at {:?}", record.status.started_at);
    drop(honest);
    eventually(Duration::from_secs(20), "the skewed replica leads", || async { leads(&skewed).await.then_some(()) })
        .await;
    let lease = admin.get::<LeaseSpec>("herd-leader").await.unwrap();
    assert_eq!(lease.spec.holder_identity, "skewed");
    let renewed = lease.spec.renew_time.expect("a held lease is renewed");
    assert!(off(renewed) < Duration::from_secs(30), "renewed at {renewed:?}, an hour off the time of day");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_election_settings_are_refused_at_start_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let refused_start = |flags: &[&str]| {
        let output = common::herd()
            .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path())
            .args(flags)
            .env("HERD_ADMIN_TOKEN", "t")
            .env("HERD_JOIN_TOKEN", "j")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "a usage error");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    // A rule broken between a flag and the ClusterConfig names the flag.
    let stderr = refused_start(&["--renew-deadline", "20s"]);
    assert!(
        stderr.contains(
            "--renew-deadline: does not go with ClusterConfig spec.leaderElection.leaseDuration: leaseDuration must be more than renewDeadline (20s), is 15s"
        ),
        "{stderr}"
    );
    // Settings that starve the election (a replica renewing 700 times a
    // second, stepping down for good, keeping the lease from the others).
    let stderr = refused_start(&["--lease-duration", "3s", "--renew-deadline", "10ms", "--retry-period", "1ms"]);
    assert!(stderr.contains("--retry-period: must be at least 100ms, is 1ms"), "{stderr}");
    let stderr = refused_start(&["--lease-duration", "3s", "--renew-deadline", "150ms", "--retry-period", "100ms"]);
    assert!(stderr.contains("--renew-deadline: must be at least 2 x retryPeriod (200ms), is 150ms"), "{stderr}");
    let stderr = refused_start(&["--retry-period", "1ns"]);
    assert!(stderr.contains("--retry-period: must be at least 100ms, is 1ns"), "{stderr}");
    let stderr = refused_start(&["--lease-duration", "99999999999999d"]);
    assert!(stderr.contains("--lease-duration") && stderr.contains("is longer than 10years"), "{stderr}");
    let stderr = refused_start(&["--lease-duration", "2h"]);
    assert!(stderr.contains("--lease-duration: must be at most 1h"), "{stderr}");
    let stderr = refused_start(&["--retry-period", "-1s"]);
    assert!(stderr.contains("--retry-period") && stderr.contains("is negative"), "{stderr}");

    // A ClusterConfig that the flags contradict is named as such too.
    let server = TestServer::start(dir.path());
    let admin = server.admin();
    let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await.unwrap();
    config.spec.leader_election.lease_duration = HumanDuration(Duration::from_secs(60));
    config.spec.leader_election.renew_deadline = HumanDuration(Duration::from_secs(50));
    admin.update(&config).await.unwrap();
    drop(server);
    let stderr = refused_start(&["--lease-duration", "30s"]);
    assert!(stderr.contains("--lease-duration: must be more than renewDeadline (50s), is 30s"), "{stderr}");
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
    let mut first = TestServer::start_replica(dir.path(), "first", store, &[]);
    eventually(Duration::from_secs(20), "first leads", || async {
        holder(&first).await.filter(|(h, d)| h == "first" && *d == 15)
    })
    .await;
    let second = TestServer::start_replica(dir.path(), "second", store, &[]);
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

#[tokio::test(flavor = "multi_thread")]
async fn herd_get_watch_shows_no_bookmarks_and_follows_the_next_replica_when_the_first_pauses() {
    let Some(schema) = common::PostgresSchema::create() else { return };
    let dir = tempfile::tempdir().unwrap();
    let a = TestServer::start_replica(&dir.path().join("a"), "a", Some(&schema.url), &SHORT);
    let b = TestServer::start_replica(&dir.path().join("b"), "b", Some(&schema.url), &SHORT);
    let mut watch = common::herd();
    watch.args(["get", "apps", "-w", "--server", &format!("{},{}", a.url, b.url), "--token", common::ADMIN_TOKEN]);
    watch.env("HERD_CONFIG", "/nonexistent/herd-config.yaml");
    let mut watch = common::Proc::spawn(watch);
    // Two bookmarks' time with nothing to show (no app yet): no row.
    let app = |name: &str| serde_json::json!({"metadata": {"name": name}, "spec": {"roles": [{"name": "r", "run": {"command": ["true"]}}]}});
    tokio::time::sleep(Duration::from_secs(11)).await;
    b.admin().create_value("apps", &app("one"), Default::default()).await.unwrap();
    let line = watch.wait_for_line("", Duration::from_secs(10));
    assert!(line.starts_with("one"), "the first row is the app, no bookmark: {line}");
    // The server it watches through pauses: it goes on from the other.
    a.proc.signal("STOP");
    b.admin().create_value("apps", &app("two"), Default::default()).await.unwrap();
    let started = Instant::now();
    let line = watch.wait_for_line("two", Duration::from_secs(30));
    a.proc.signal("CONT");
    assert!(line.starts_with("two"), "{line}");
    eprintln!("the watch moved to the next replica in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_keeps_well_inside_its_grace_when_the_replica_it_beats_to_pauses() {
    let Some(schema) = common::PostgresSchema::create() else { return };
    let dir = tempfile::tempdir().unwrap();
    // The defaults: heartbeats every 2 s, NotReady after 10 s of silence.
    let a = TestServer::start_replica(&dir.path().join("a"), "a", Some(&schema.url), &SHORT);
    let b = TestServer::start_replica(&dir.path().join("b"), "b", Some(&schema.url), &SHORT);
    let agent_dir = dir.path().join("n1");
    let _reaper = common::MemberReaper(agent_dir.clone());
    let _agent = common::start_agent(&format!("{},{}", a.url, b.url), &agent_dir, "n1");
    let admin = b.admin();
    let beat = || async {
        let node = admin.get::<herd_core::kinds::NodeSpec>("n1").await.ok()?;
        Some((node.status.ready, node.status.last_heartbeat?))
    };
    eventually(Duration::from_secs(20), "n1 Ready", || async { beat().await.filter(|(ready, _)| *ready) }).await;
    // Its agent beats to a first: a pauses, for longer than the grace.
    tokio::time::sleep(Duration::from_secs(3)).await;
    a.proc.signal("STOP");
    let (mut last, mut widest) = (beat().await.unwrap().1, Duration::ZERO);
    let until = Instant::now() + Duration::from_secs(14);
    while Instant::now() < until {
        let (ready, at) = beat().await.unwrap_or((true, last));
        assert!(ready, "n1 went NotReady while one of two replicas was paused");
        if at != last {
            widest = widest.max(at.system_time().duration_since(last.system_time()).unwrap_or_default());
            last = at;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.proc.signal("CONT");
    eprintln!("the widest gap between stored heartbeats across the pause: {widest:?}");
    assert!(widest <= Duration::from_secs(8), "the stored heartbeat went {widest:?} without moving (grace 10 s)");
}
