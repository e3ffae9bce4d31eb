//! Partitioned watches (`herd_store::Partitioned`) on every backend: each
//! watch sees its partition's events once and in order, whether it started
//! early, mid-way or stalled past its channel; compaction still ends it.

use std::time::Duration;

use herd_store::{Event, PartitionWatch, Partitioned, Store, StoreError, Txn};
use tokio_util::sync::CancellationToken;

use super::Harness;

/// Keys are `/p/<partition>/<name>`.
fn partition_of(event: &Event) -> Option<String> {
    event.key.strip_prefix("/p/")?.split_once('/').map(|(partition, _)| partition.to_string())
}

fn partitioned(store: &Store, stop: &CancellationToken) -> Partitioned {
    Partitioned::start(store, "/p/", partition_of, stop).unwrap()
}

/// The next `count` events of a partition watch, as (revision, key).
async fn collect(watch: &mut PartitionWatch, count: usize) -> Vec<(u64, String)> {
    let mut seen = Vec::with_capacity(count);
    while seen.len() < count {
        let batch = tokio::time::timeout(Duration::from_secs(30), watch.next())
            .await
            .unwrap_or_else(|_| panic!("partition watch stalled after {} of {count} events", seen.len()))
            .unwrap();
        assert!(batch.events.iter().all(|e| e.revision <= batch.revision), "a batch's revision covers its events");
        seen.extend(batch.events.into_iter().map(|e| (e.revision, e.key)));
    }
    seen
}

/// Asserts that no event arrives for 300 ms. Batches that only move the
/// revision may: a watch still catching up from the log (its channel
/// overflowed) reads the other partitions' commits after its own last
/// event.
async fn no_more_events(watch: &mut PartitionWatch) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
    while let Ok(batch) = tokio::time::timeout_at(deadline, watch.next()).await {
        let events = batch.unwrap().events;
        assert!(events.is_empty(), "events after the last one written: {events:?}");
    }
}

/// Writers spread over four partitions (and keys outside the prefix); a
/// watch from the start, one from a mid revision and one that reads
/// nothing until the writers are done (its channel overflows, so it is
/// dropped and reads the log) each see exactly their partition's writes.
pub async fn partitioned_watches_see_their_partition_once_in_order(h: &impl Harness) {
    const WRITERS: usize = 4;
    const PER_WRITER: usize = 400;
    let store = h.open().await;
    let stop = CancellationToken::new();
    let partitions = partitioned(&store, &stop);
    let start = store.create("/start", b"".to_vec()).await.unwrap();
    let mut early = partitions.watch("a", start).await.unwrap();
    let mut stalled = partitions.watch("c", start).await.unwrap();

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut acked = Vec::with_capacity(PER_WRITER);
                for i in 0..PER_WRITER {
                    let partition = ["a", "b", "c", "d"][(i * 7 + w) % 4];
                    let key = format!("/p/{partition}/{w}-{i:04}");
                    acked.push((store.create(&key, b"v".to_vec()).await.unwrap(), key.clone()));
                    if i % 5 == 4 {
                        // A delete is its partition's event too.
                        acked.push((store.delete(&key, None).await.unwrap(), key));
                    }
                    store.txn(Txn::new().put(format!("/q/{w}"), b"elsewhere".to_vec())).await.unwrap();
                }
                acked
            })
        })
        .collect();
    let mid = loop {
        let head = store.head();
        if head >= start + 600 {
            break head;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let mut late = partitions.watch("b", mid).await.unwrap();
    let mut acked = Vec::new();
    for writer in writers {
        acked.extend(writer.await.unwrap());
    }
    acked.sort();
    // The stalled watch's partition alone, written one commit at a time,
    // more batches than its channel holds.
    for i in 0..300 {
        let key = format!("/p/c/single-{i:03}");
        acked.push((store.create(&key, b"v".to_vec()).await.unwrap(), key));
    }
    let of = |partition: &str, after: u64| -> Vec<(u64, String)> {
        acked.iter().filter(|(r, k)| *r > after && k.starts_with(&format!("/p/{partition}/"))).cloned().collect()
    };
    let want = of("a", start);
    assert_eq!(collect(&mut early, want.len()).await, want, "the early watch saw partition a once, in order");
    let want = of("b", mid);
    assert_eq!(collect(&mut late, want.len()).await, want, "the mid watch saw partition b after its start");
    let want = of("c", start);
    assert_eq!(collect(&mut stalled, want.len()).await, want, "the stalled watch lost nothing");
    // Nothing more arrives: a duplicate would show up here.
    no_more_events(&mut early).await;
    no_more_events(&mut stalled).await;
    stop.cancel();
}

/// With nothing of its own to deliver, a watch's revision follows the
/// router: writes elsewhere move it (bookmarks say how far a watch got).
pub async fn a_partition_watch_revision_follows_writes_elsewhere(h: &impl Harness) {
    let store = h.open().await;
    let stop = CancellationToken::new();
    let partitions = partitioned(&store, &stop);
    let start = store.create("/p/a/first", b"v".to_vec()).await.unwrap();
    let mut watch = partitions.watch("a", start).await.unwrap();
    let mut last = 0;
    for i in 0..5 {
        last = store.create(&format!("/p/b/{i}"), b"v".to_vec()).await.unwrap();
    }
    let caught_up = async {
        while watch.revision() < last {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), caught_up).await.expect("the watch's revision reached the head");
    let own = store.create("/p/a/second", b"v".to_vec()).await.unwrap();
    assert_eq!(collect(&mut watch, 1).await, vec![(own, "/p/a/second".to_string())]);
    assert_eq!(watch.revision(), own);
    stop.cancel();
}

/// A partition watch from compacted history fails at once; one that
/// stalled past its channel and then past a compaction delivers what its
/// channel held and then fails when it reads the log again.
pub async fn partition_watches_end_at_compaction(h: &impl Harness) {
    let store = h.open().await;
    let stop = CancellationToken::new();
    let partitions = partitioned(&store, &stop);
    let start = store.create("/start", b"".to_vec()).await.unwrap();
    let mut stalled = partitions.watch("a", start).await.unwrap();
    let mut last = 0;
    for i in 0..300 {
        last = store.create(&format!("/p/a/{i:03}"), b"v".to_vec()).await.unwrap();
    }
    store.compact(last - 3).await.unwrap();
    match partitions.watch("a", last - 5).await {
        Err(StoreError::Compacted { requested, compacted }) => assert_eq!((requested, compacted), (last - 5, last - 3)),
        Err(other) => panic!("expected Compacted, got {other}"),
        Ok(_) => panic!("expected Compacted, got a watch"),
    }
    let mut watch = partitions.watch("a", last - 3).await.unwrap();
    assert_eq!(collect(&mut watch, 3).await.len(), 3, "history after the compaction point is kept");

    let mut delivered = 0;
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(30), stalled.next()).await.expect("the stalled watch answers") {
            Ok(batch) => delivered += batch.events.len(),
            Err(error) => break error,
        }
    };
    assert!(matches!(ended, StoreError::Compacted { .. }), "the stalled watch ends with Compacted, not {ended}");
    assert!(delivered < 300, "the stalled watch cannot have had every event: {delivered}");
    stop.cancel();
    assert!(
        matches!(partitions.watch("a", last).await, Err(StoreError::Closed)),
        "no watch starts once the router stopped"
    );
}
