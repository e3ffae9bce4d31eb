//! The store conformance suite: every backend must pass every test here.
//! `tests/sqlite.rs` and `tests/postgres.rs` run it through `conformance_suite!`.

use std::collections::BTreeSet;
use std::time::Duration;

use herd_store::{Compare, EventKind, ListOptions, Store, StoreError, Txn, TxnOutcome};

mod partition;
pub use partition::*;

/// A fresh, empty database for one test.
pub trait Harness {
    /// A store handle on the test's database.
    async fn open(&self) -> Store;
    /// A handle as a second process would open it, if the backend allows
    /// several processes at once.
    async fn peer(&self) -> Option<Store>;
}

/// Generates one `#[tokio::test]` per conformance test for a harness
/// expression of type `Option<impl Harness>` (None: skip, said loudly).
#[macro_export]
macro_rules! conformance_suite {
    ($harness:expr) => {
        $crate::conformance_suite!(@tests $harness;
            crud_and_revisions, write_conflicts, txn_is_atomic, list_prefix_paging_and_filter,
            watch_delivers_puts_and_deletes, watch_from_mid_revision, compaction_expires_old_watches,
            a_watch_from_a_revision_not_reached_fails,
            concurrent_creates_have_one_winner, concurrent_writers_are_group_committed,
            writes_whose_writers_went_away_are_committed_and_watched,
            concurrent_watch_sees_every_write_once_in_order, a_peer_s_commits_reach_watches_promptly,
            reopen_keeps_everything, invalid_keys_are_refused,
            random_transactions_match_a_model, partitioned_watches_see_their_partition_once_in_order,
            a_partition_watch_revision_follows_writes_elsewhere, partition_watches_end_at_compaction);
    };
    (@tests $harness:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let Some(harness) = $harness else { return };
                conformance::$name(&harness).await;
            }
        )*
    };
}

fn key(i: usize) -> String {
    format!("/registry/things/t{i:05}")
}

pub async fn crud_and_revisions(h: &impl Harness) {
    let store = h.open().await;
    let r1 = store.create("/a", b"one".to_vec()).await.unwrap();
    let r2 = store.create("/b", b"two".to_vec()).await.unwrap();
    assert!(r2 > r1, "revisions increase: {r1} then {r2}");
    let a = store.get("/a").await.unwrap().unwrap();
    assert_eq!((a.value.as_slice(), a.create_revision, a.mod_revision), (&b"one"[..], r1, r1));

    let r3 = store.update("/a", b"uno".to_vec(), r1).await.unwrap();
    assert_eq!(r3, r2 + 1);
    let a = store.get("/a").await.unwrap().unwrap();
    assert_eq!((a.value.as_slice(), a.create_revision, a.mod_revision), (&b"uno"[..], r1, r3));

    let r4 = store.delete("/a", Some(r3)).await.unwrap();
    assert_eq!(r4, r3 + 1);
    assert_eq!(store.get("/a").await.unwrap(), None);
    assert_eq!(store.get("/missing").await.unwrap(), None);
}

pub async fn write_conflicts(h: &impl Harness) {
    let store = h.open().await;
    let r1 = store.create("/k", b"v1".to_vec()).await.unwrap();
    assert_eq!(store.create("/k", b"again".to_vec()).await, Err(StoreError::AlreadyExists("/k".into())));
    let r2 = store.update("/k", b"v2".to_vec(), r1).await.unwrap();
    assert_eq!(
        store.update("/k", b"stale".to_vec(), r1).await,
        Err(StoreError::Conflict { key: "/k".into(), expected: r1, actual: Some(r2) })
    );
    assert_eq!(store.get("/k").await.unwrap().unwrap().value, b"v2", "a refused write changes nothing");
    assert_eq!(store.update("/nope", b"x".to_vec(), 5).await, Err(StoreError::NotFound("/nope".into())));
    assert!(matches!(store.delete("/k", Some(r1)).await, Err(StoreError::Conflict { .. })));
    assert_eq!(store.delete("/nope", None).await, Err(StoreError::NotFound("/nope".into())));
    store.delete("/k", None).await.unwrap();
}

pub async fn txn_is_atomic(h: &impl Harness) {
    let store = h.open().await;
    let r = store.create("/x", b"1".to_vec()).await.unwrap();
    let failing = Txn::new()
        .when(Compare::ModRevision { key: "/x".into(), revision: r })
        .when(Compare::ModRevision { key: "/y".into(), revision: 99 })
        .put("/x", b"2".to_vec())
        .put("/z", b"3".to_vec());
    assert_eq!(
        store.txn(failing).await.unwrap(),
        TxnOutcome::CompareFailed { index: 1, key: "/y".into(), actual: None }
    );
    assert_eq!(store.get("/z").await.unwrap(), None, "nothing of a failed txn applies");
    assert_eq!(store.get("/x").await.unwrap().unwrap().mod_revision, r);

    let ok = Txn::new()
        .when(Compare::ModRevision { key: "/x".into(), revision: r })
        .when(Compare::ModRevision { key: "/y".into(), revision: 0 })
        .put("/x", b"2".to_vec())
        .put("/y", b"3".to_vec())
        .delete("/x")
        .delete("/never-existed");
    assert_eq!(store.txn(ok).await.unwrap(), TxnOutcome::Committed { revision: r + 3 });
    assert_eq!(store.get("/y").await.unwrap().unwrap().mod_revision, r + 2);
    assert_eq!(store.get("/x").await.unwrap(), None);
}

pub async fn list_prefix_paging_and_filter(h: &impl Harness) {
    let store = h.open().await;
    for i in 0..25 {
        store.create(&key(i), format!("{}", i % 3).into_bytes()).await.unwrap();
    }
    store.create("/registry/thingsx/other", b"0".to_vec()).await.unwrap();
    store.create("/registry/otherthings/t0", b"0".to_vec()).await.unwrap();

    let all = store.list("/registry/things/", &ListOptions::default(), |_| true).await.unwrap();
    assert_eq!(all.items.len(), 25);
    assert_eq!(all.next_key, None);
    assert_eq!(all.revision, 27);
    assert!(all.items.windows(2).all(|w| w[0].key < w[1].key), "key order");

    let mut seen = Vec::new();
    let mut options = ListOptions { limit: 4, start_after: None };
    loop {
        let page = store.list("/registry/things/", &options, |kv| kv.value == b"0").await.unwrap();
        assert!(page.items.len() <= 4);
        seen.extend(page.items.iter().map(|kv| kv.key.clone()));
        match page.next_key {
            Some(next) => options.start_after = Some(next),
            None => break,
        }
    }
    let expected: Vec<_> = (0..25).filter(|i| i % 3 == 0).map(key).collect();
    assert_eq!(seen, expected, "pages cover every match exactly once");

    let exact = store.list("/registry/things/", &ListOptions { limit: 25, start_after: None }, |_| true).await.unwrap();
    assert_eq!((exact.items.len(), exact.next_key), (25, None), "a page that holds the rest has no next");
}

pub async fn watch_delivers_puts_and_deletes(h: &impl Harness) {
    let store = h.open().await;
    let start = store.create("/other", b"x".to_vec()).await.unwrap();
    let mut watcher = store.watch("/w/", start).await.unwrap();
    let r1 = store.create("/w/a", b"1".to_vec()).await.unwrap();
    store.create("/elsewhere", b"x".to_vec()).await.unwrap();
    let r2 = store.update("/w/a", b"2".to_vec(), r1).await.unwrap();
    let r3 = store.delete("/w/a", None).await.unwrap();

    let mut events = Vec::new();
    while events.len() < 3 {
        let batch =
            tokio::time::timeout(Duration::from_secs(10), watcher.next()).await.expect("watch stalled").unwrap();
        events.extend(batch.events);
    }
    let summary: Vec<_> = events.iter().map(|e| (e.revision, e.kind, e.value.to_vec(), e.is_create())).collect();
    assert_eq!(
        summary,
        vec![
            (r1, EventKind::Put, b"1".to_vec(), true),
            (r2, EventKind::Put, b"2".to_vec(), false),
            (r3, EventKind::Delete, b"2".to_vec(), false),
        ]
    );
    assert_eq!(watcher.revision(), r3);
}

async fn collect_keys(watcher: &mut herd_store::Watcher, count: usize) -> Vec<(u64, String)> {
    let mut seen = Vec::with_capacity(count);
    while seen.len() < count {
        let batch = tokio::time::timeout(Duration::from_secs(30), watcher.next())
            .await
            .unwrap_or_else(|_| panic!("watch stalled after {} of {count} events", seen.len()))
            .unwrap();
        seen.extend(batch.events.into_iter().map(|e| (e.revision, e.key)));
    }
    seen
}

pub async fn watch_from_mid_revision(h: &impl Harness) {
    let store = h.open().await;
    let mut mid = 0;
    for i in 0..20 {
        let r = store.create(&key(i), b"v".to_vec()).await.unwrap();
        if i == 9 {
            mid = r;
        }
    }
    let mut watcher = store.watch("/registry/", mid).await.unwrap();
    let seen = collect_keys(&mut watcher, 10).await;
    assert_eq!(seen.iter().map(|(_, k)| k.clone()).collect::<Vec<_>>(), (10..20).map(key).collect::<Vec<_>>());
    assert_eq!(seen.first().unwrap().0, mid + 1);
}

pub async fn compaction_expires_old_watches(h: &impl Harness) {
    let store = h.open().await;
    let mut last = 0;
    for i in 0..10 {
        last = store.create(&key(i), b"v".to_vec()).await.unwrap();
    }
    store.compact(last - 3).await.unwrap();
    match store.watch("/", last - 5).await {
        Err(StoreError::Compacted { requested, compacted }) => assert_eq!((requested, compacted), (last - 5, last - 3)),
        Err(other) => panic!("expected Compacted, got {other}"),
        Ok(_) => panic!("expected Compacted, got a watch"),
    }
    let mut watcher = store.watch("/", last - 3).await.unwrap();
    assert_eq!(collect_keys(&mut watcher, 3).await.len(), 3, "history after the compaction point is kept");
    assert_eq!(store.get(&key(0)).await.unwrap().unwrap().value, b"v", "compaction keeps current values");
}

/// A revision from elsewhere (another store, one since restored) is
/// refused at once, as a compacted one is, rather than waited on for ever;
/// one a peer reached and this process has not seen yet is taken.
pub async fn a_watch_from_a_revision_not_reached_fails(h: &impl Harness) {
    let store = h.open().await;
    let head = store.create(&key(0), b"v".to_vec()).await.unwrap();
    match store.watch("/", head + 100).await {
        Err(StoreError::FutureRevision { requested, head: newest }) => {
            assert_eq!((requested, newest), (head + 100, head))
        }
        Err(other) => panic!("expected FutureRevision, got {other}"),
        Ok(_) => panic!("expected FutureRevision, got a watch"),
    }
    store.watch("/", head).await.expect("a watch from the head waits for what comes next");
    let Some(peer) = h.peer().await else { return };
    let written = peer.create(&key(1), b"v".to_vec()).await.unwrap();
    let mut watch = store.watch("/", written).await.expect("a peer's revision is reached");
    store.create(&key(2), b"v".to_vec()).await.unwrap();
    assert_eq!(collect_keys(&mut watch, 1).await[0].1, key(2));
}

pub async fn concurrent_creates_have_one_winner(h: &impl Harness) {
    let store = h.open().await;
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.create("/contended", format!("{i}").into_bytes()).await })
        })
        .collect();
    let mut wins = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => wins += 1,
            Err(StoreError::AlreadyExists(_)) => {}
            Err(other) => panic!("unexpected {other}"),
        }
    }
    assert_eq!(wins, 1);
}

pub async fn concurrent_writers_are_group_committed(h: &impl Harness) {
    let store = h.open().await;
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.create(&key(i), b"v".to_vec()).await.unwrap() })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let commits = store.stats().commits.load(std::sync::atomic::Ordering::Relaxed);
    let txns = store.stats().txns.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(txns, 200);
    assert!(commits < 100, "200 concurrent writes took {commits} commits: no group commit");
}

/// A writer may go away (a cancelled request) while its write is queued
/// behind another writer's commit, or while it is itself committing for
/// others: the write still commits soon, the others get their answers, and
/// a watch sees every event once, in order.
pub async fn writes_whose_writers_went_away_are_committed_and_watched(h: &impl Harness) {
    let store = h.open().await;
    let start = store.create("/start", b"".to_vec()).await.unwrap();
    let mut watch = store.watch("/gone/", start).await.unwrap();
    let mut expected = BTreeSet::new();
    for round in 0..10 {
        // A writer that stays, with a large transaction, so that the one
        // that leaves is queued behind its commit.
        let mut large = Txn::new();
        for i in 0..500 {
            let key = format!("/gone/stay-{round:02}-{i:03}");
            expected.insert(key.clone());
            large = large.put(&key, b"v".to_vec());
        }
        let stay = {
            let store = store.clone();
            tokio::spawn(async move { store.txn(large).await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(2)).await;
        let gone = format!("/gone/left-{round:02}");
        expected.insert(gone.clone());
        // Polled once (it queues its write, or starts committing it), then dropped.
        let left = tokio::time::timeout(Duration::from_nanos(1), store.create(&gone, b"v".to_vec())).await;
        if let Ok(created) = left {
            created.unwrap();
        }
        stay.await.unwrap();

        // A writer that leaves while it commits a batch that holds another
        // writer's transaction too: both are queued behind a large commit,
        // the leaving one first; it leaves after 1 to 10 ms, so in some
        // rounds in the middle of its commit. The other is still answered.
        let large = |name: &str, expected: &mut BTreeSet<String>| {
            let mut txn = Txn::new();
            for i in 0..500 {
                let key = format!("/gone/{name}-{round:02}-{i:03}");
                expected.insert(key.clone());
                txn = txn.put(&key, b"v".to_vec());
            }
            txn
        };
        let holder = {
            let (store, txn) = (store.clone(), large("hold", &mut expected));
            tokio::spawn(async move { store.txn(txn).await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(2)).await;
        let leaving = {
            let (store, txn) = (store.clone(), large("leave", &mut expected));
            let patience = Duration::from_millis(1 + round as u64);
            tokio::spawn(async move { tokio::time::timeout(patience, store.txn(txn)).await })
        };
        tokio::time::sleep(Duration::from_micros(300)).await;
        let after = format!("/gone/after-{round:02}");
        expected.insert(after.clone());
        tokio::time::timeout(Duration::from_secs(10), store.create(&after, b"v".to_vec()))
            .await
            .expect("a write batched with one whose writer left is answered")
            .unwrap();
        holder.await.unwrap();
        if let Ok(committed) = leaving.await.unwrap() {
            committed.unwrap();
        }
    }
    let mut seen = BTreeSet::new();
    let mut last = start;
    while seen.len() < expected.len() {
        let batch = tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .unwrap_or_else(|_| {
                panic!("no event in 5 s; missing: {:?}", expected.difference(&seen).collect::<Vec<_>>())
            })
            .unwrap();
        for event in batch.events {
            assert_eq!(event.revision, last + 1, "events in order, none skipped");
            last = event.revision;
            assert!(seen.insert(event.key.clone()), "{} delivered twice", event.key);
        }
    }
    assert_eq!(seen, expected);
    for key in &expected {
        assert!(store.get(key).await.unwrap().is_some(), "{key} committed");
    }
}

/// The acceptance test: 4 concurrent writers, 5,000 writes in all (spread
/// over two processes' handles where the backend allows it). A watcher
/// started before them and one started from a mid revision each see every
/// write exactly once, in revision order.
pub async fn concurrent_watch_sees_every_write_once_in_order(h: &impl Harness) {
    const WRITERS: usize = 4;
    const PER_WRITER: usize = 1250;
    let store = h.open().await;
    let peer = h.peer().await;
    let start = store.create("/start", b"".to_vec()).await.unwrap();
    let mut early = store.watch("/w/", start).await.unwrap();

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            // Writers 1 and 3 go through the peer handle when there is one.
            let handle = match (&peer, w % 2) {
                (Some(peer), 1) => peer.clone(),
                _ => store.clone(),
            };
            tokio::spawn(async move {
                let mut acked = Vec::with_capacity(PER_WRITER);
                let mut previous: Option<(String, u64)> = None;
                for i in 0..PER_WRITER {
                    // Every third write updates the key written before it.
                    let (k, r) = match previous.take() {
                        Some((k, r)) if i % 3 == 2 => {
                            let r = handle.update(&k, b"2".to_vec(), r).await.unwrap();
                            (k, r)
                        }
                        _ => {
                            let k = format!("/w/{w}/{i:05}");
                            let r = handle.create(&k, b"1".to_vec()).await.unwrap();
                            (k, r)
                        }
                    };
                    acked.push((r, k.clone()));
                    previous = Some((k, r));
                }
                acked
            })
        })
        .collect();

    // The mid watcher starts once a good part of the writes are in.
    let mid = loop {
        let head = store.head();
        if head >= start + 2000 {
            break head;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let mut late = store.watch("/w/", mid).await.unwrap();

    let mut acked = Vec::new();
    for writer in writers {
        acked.extend(writer.await.unwrap());
    }
    acked.sort();
    assert_eq!(acked.len(), WRITERS * PER_WRITER);

    let early_seen = collect_keys(&mut early, acked.len()).await;
    assert_eq!(early_seen, acked, "the early watcher saw every write once, in revision order");
    let late_expected: Vec<_> = acked.iter().filter(|(r, _)| *r > mid).cloned().collect();
    let late_seen = collect_keys(&mut late, late_expected.len()).await;
    assert_eq!(late_seen, late_expected, "the mid watcher saw every later write once, in order");
    let unique: BTreeSet<_> = early_seen.iter().map(|(r, _)| *r).collect();
    assert_eq!(unique.len(), acked.len());
    // Nothing more arrives: a duplicate would show up here.
    assert!(tokio::time::timeout(Duration::from_millis(300), early.next()).await.is_err());
}

/// Another process's commits wake this one's watches: once the first is
/// seen (by the poll, at the latest), those after it arrive well within
/// the poll interval (500 ms).
pub async fn a_peer_s_commits_reach_watches_promptly(h: &impl Harness) {
    let store = h.open().await;
    let Some(peer) = h.peer().await else { return };
    let start = store.create("/start", b"".to_vec()).await.unwrap();
    let mut watch = store.watch("/p/", start).await.unwrap();
    let (arrivals, mut arrived) = tokio::sync::mpsc::unbounded_channel();
    let watching = tokio::spawn(async move {
        while let Ok(batch) = watch.next().await {
            let _ = arrivals.send((batch.revision, std::time::Instant::now()));
        }
    });
    let mut waits = Vec::new();
    for i in 0..21 {
        // The watch has caught up and waits on this process's fan-out.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let began = std::time::Instant::now();
        let revision = peer.create(&format!("/p/{i:02}"), b"".to_vec()).await.unwrap();
        loop {
            let (seen, at) = tokio::time::timeout(Duration::from_secs(5), arrived.recv())
                .await
                .expect("the peer's commit reached the watch")
                .expect("the watch goes on");
            if seen >= revision {
                waits.push(at - began);
                break;
            }
        }
    }
    watching.abort();
    // The first may have waited for the poll.
    let mut after_first = waits.split_off(1);
    after_first.sort();
    let median = after_first[after_first.len() / 2];
    assert!(median < Duration::from_millis(150), "median wait {median:?} for a peer's commit: {after_first:?}");
}

pub async fn reopen_keeps_everything(h: &impl Harness) {
    let last = {
        let store = h.open().await;
        let mut last = 0;
        for i in 0..30 {
            last = store.create(&key(i), format!("{i}").into_bytes()).await.unwrap();
        }
        last
    };
    let store = h.open().await;
    let page = store.list("/registry/things/", &ListOptions::default(), |_| true).await.unwrap();
    assert_eq!(page.items.len(), 30);
    assert_eq!(page.revision, last);
    assert_eq!(store.create("/next", b"".to_vec()).await.unwrap(), last + 1, "revisions continue after reopen");
}

pub async fn invalid_keys_are_refused(h: &impl Harness) {
    let store = h.open().await;
    for bad in ["", "with space", "tab\t", "ünïcode"] {
        assert!(matches!(store.create(bad, b"".to_vec()).await, Err(StoreError::InvalidKey(_))), "{bad:?}");
    }
    assert_eq!(store.head(), 0, "nothing was written");
}

/// An obviously correct store, applied one transaction at a time: the
/// oracle for `random_transactions_match_a_model`.
#[derive(Default)]
struct Model {
    head: u64,
    kv: std::collections::BTreeMap<String, (Vec<u8>, u64, u64)>,
    events: Vec<(u64, EventKind, String, Vec<u8>, u64)>,
}

impl Model {
    fn revision(&self, key: &str) -> Option<u64> {
        self.kv.get(key).map(|(_, _, m)| *m)
    }

    fn apply(&mut self, txn: &Txn) -> TxnOutcome {
        for (index, compare) in txn.compares.iter().enumerate() {
            let actual = self.revision(compare.key());
            if !compare.holds(actual) {
                return TxnOutcome::CompareFailed { index, key: compare.key().to_string(), actual };
            }
        }
        for op in &txn.ops {
            match op {
                herd_store::Op::Put { key, value } => {
                    self.head += 1;
                    let create = self.kv.get(key).map_or(self.head, |(_, c, _)| *c);
                    self.kv.insert(key.clone(), (value.clone(), create, self.head));
                    self.events.push((self.head, EventKind::Put, key.clone(), value.clone(), create));
                }
                herd_store::Op::Delete { key } => {
                    if let Some((value, create, _)) = self.kv.remove(key) {
                        self.head += 1;
                        self.events.push((self.head, EventKind::Delete, key.clone(), value, create));
                    }
                }
            }
        }
        TxnOutcome::Committed { revision: self.head }
    }
}

/// A compare, resolved against the model when its group is submitted (so
/// that it sometimes holds and sometimes, after an earlier transaction of
/// the same group, fails).
#[derive(Clone, Debug)]
enum CompareSpec {
    Current(usize),
    Absent(usize),
    Exists(usize),
    Stale(usize),
}

/// An operation: a key, and Some(value) to put it or None to delete it.
type OpSpec = (usize, Option<u8>);
type TxnSpec = (Vec<CompareSpec>, Vec<OpSpec>);

fn random_groups() -> Vec<Vec<TxnSpec>> {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    let compare = prop_oneof![
        (0..4usize).prop_map(CompareSpec::Current),
        (0..4usize).prop_map(CompareSpec::Absent),
        (0..4usize).prop_map(CompareSpec::Exists),
        (0..4usize).prop_map(CompareSpec::Stale),
    ];
    let op = (0..4usize, proptest::option::weighted(0.7, any::<u8>()));
    let txn = (proptest::collection::vec(compare, 0..3), proptest::collection::vec(op, 1..4));
    let groups = proptest::collection::vec(proptest::collection::vec(txn, 1..6), 60);
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    groups.new_tree(&mut runner).unwrap().current()
}

/// Single writes (one compare and one operation on one key: creates,
/// updates, deletes, and each of them refused), one at a time.
fn random_single_writes() -> Vec<Vec<TxnSpec>> {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    let write = (0..4usize, 0..4usize, proptest::option::weighted(0.7, any::<u8>())).prop_map(|(kind, k, value)| {
        let compare = match kind {
            0 => CompareSpec::Current(k),
            1 => CompareSpec::Absent(k),
            2 => CompareSpec::Exists(k),
            _ => CompareSpec::Stale(k),
        };
        vec![(vec![compare], vec![(k, value)])]
    });
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    proptest::collection::vec(write, 200).new_tree(&mut runner).unwrap().current()
}

pub async fn random_transactions_match_a_model(h: &impl Harness) {
    let store = h.open().await;
    let mut watcher = store.watch("/m/", 0).await.unwrap();
    let mut model = Model::default();
    let key = |k: usize| format!("/m/{k}");
    for (number, group) in random_groups().into_iter().chain(random_single_writes()).enumerate() {
        let txns: Vec<Txn> = group
            .iter()
            .map(|(compares, ops)| {
                let mut txn = Txn::new();
                for spec in compares {
                    txn = txn.when(match *spec {
                        CompareSpec::Current(k) => {
                            Compare::ModRevision { key: key(k), revision: model.revision(&key(k)).unwrap_or(0) }
                        }
                        CompareSpec::Absent(k) => Compare::ModRevision { key: key(k), revision: 0 },
                        CompareSpec::Exists(k) => Compare::Exists { key: key(k) },
                        CompareSpec::Stale(k) => Compare::ModRevision { key: key(k), revision: model.head + 1000 },
                    });
                }
                for (k, value) in ops {
                    txn = match value {
                        Some(v) => txn.put(key(*k), vec![*v]),
                        None => txn.delete(key(*k)),
                    };
                }
                txn
            })
            .collect();
        // Every other group is submitted together, in order, so that its
        // transactions share batches as concurrent writers' do; the others
        // one at a time, each a batch of its own (a backend may take a
        // shorter way for those).
        let outcomes = if number % 2 == 0 {
            futures_util::future::join_all(txns.iter().cloned().map(|t| store.txn(t))).await
        } else {
            let mut outcomes = Vec::new();
            for txn in &txns {
                outcomes.push(store.txn(txn.clone()).await);
            }
            outcomes
        };
        for (txn, outcome) in txns.iter().zip(outcomes) {
            assert_eq!(outcome.unwrap(), model.apply(txn), "{txn:?}");
        }
    }
    let page = store.list("/m/", &ListOptions::default(), |_| true).await.unwrap();
    let state: Vec<_> =
        page.items.iter().map(|kv| (kv.key.clone(), (kv.value.clone(), kv.create_revision, kv.mod_revision))).collect();
    assert_eq!(state, model.kv.clone().into_iter().collect::<Vec<_>>(), "final state");
    let mut events = Vec::new();
    while events.len() < model.events.len() {
        let batch =
            tokio::time::timeout(Duration::from_secs(10), watcher.next()).await.expect("watch stalled").unwrap();
        events
            .extend(batch.events.into_iter().map(|e| (e.revision, e.kind, e.key, e.value.to_vec(), e.create_revision)));
    }
    assert_eq!(events, model.events, "event stream");
    assert!(model.events.len() > 100, "the random history is substantial ({} events)", model.events.len());
}
