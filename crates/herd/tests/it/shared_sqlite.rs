//! Two `herd server` processes on one SQLite file (replicas on one host):
//! a write through either is seen by the other, and by a watch on the
//! other, in order.

use crate::common;

use std::time::Duration;

use common::TestServer;
use herd_core::Object;
use herd_core::api::WatchEventType;
use herd_core::kinds::LeaseSpec;

fn lease(name: &str) -> Object<LeaseSpec> {
    Object::new(name, LeaseSpec { lease_duration_seconds: 10, ..Default::default() })
}

#[tokio::test(flavor = "multi_thread")]
async fn two_servers_on_one_sqlite_file_see_each_others_writes() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestServer::start(dir.path());
    let b = TestServer::start(dir.path());
    let list = b.admin().list_values("leases", "").await.unwrap();
    let mut watch_on_b = b.admin().watch("leases", Some(&list.metadata.resource_version), "").await.unwrap();

    for i in 0..20 {
        let server = if i % 2 == 0 { &a } else { &b };
        server.admin().create(&lease(&format!("l{i:02}"))).await.unwrap();
    }
    let mut names = Vec::new();
    while names.len() < 20 {
        let event = tokio::time::timeout(Duration::from_secs(10), watch_on_b.next()).await.unwrap().unwrap().unwrap();
        // The leader election's own Lease is not one of ours.
        if event.type_ == WatchEventType::Added && event.object["metadata"]["name"] != "herd-leader" {
            names.push(event.object["metadata"]["name"].as_str().unwrap().to_string());
        }
    }
    let expected: Vec<_> = (0..20).map(|i| format!("l{i:02}")).collect();
    assert_eq!(names, expected, "the watch on B saw A's and B's writes, once each, in order");
    let ours = a.admin().list::<LeaseSpec>("").await.unwrap().into_iter().filter(|l| l.metadata.name != "herd-leader");
    assert_eq!(ours.count(), 20);

    // A stale write is refused whichever server it goes through.
    let on_a = a.admin().get::<LeaseSpec>("l01").await.unwrap();
    let mut changed = on_a.clone();
    changed.spec.holder_identity = "b".into();
    b.admin().update(&changed).await.unwrap();
    changed.spec.holder_identity = "a".into();
    let refused = a.admin().update(&changed).await.unwrap_err();
    assert_eq!(refused.reason(), Some(herd_core::api::StatusReason::Conflict));
}
