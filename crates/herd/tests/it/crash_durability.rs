//! kill -9 of the server in the middle of a loop of acknowledged writes:
//! after a restart, every acknowledged write is there (SQLite).

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::TestServer;
use herd_core::Object;
use herd_core::kinds::LeaseSpec;

#[tokio::test(flavor = "multi_thread")]
async fn every_acknowledged_write_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("server");
    let mut server = TestServer::start(&data);
    let admin = server.admin();

    // Four writers create objects as fast as they can; each records what
    // the server acknowledged.
    let acked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (admin, acked) = (admin.clone(), acked.clone());
            tokio::spawn(async move {
                for i in 0.. {
                    let name = format!("w{w}-{i:06}");
                    let object = Object::new(
                        name.clone(),
                        LeaseSpec {
                            holder_identity: format!("writer-{w}"),
                            lease_duration_seconds: 15,
                            ..Default::default()
                        },
                    );
                    match admin.create(&object).await {
                        Ok(created) => acked.lock().unwrap().push((name, created.metadata.resource_version.unwrap())),
                        // The server died: this write's fate is unknown, stop.
                        Err(_) => return,
                    }
                }
            })
        })
        .collect();

    // Let a good number of writes land, then kill the server mid-stream.
    common::eventually(Duration::from_secs(60), "1000 acknowledged writes", || async {
        (acked.lock().unwrap().len() >= 1000).then_some(())
    })
    .await;
    server.proc.kill9();
    for writer in writers {
        writer.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 1000);

    let server = TestServer::start(&data);
    let admin = server.admin();
    let stored = admin.list::<LeaseSpec>("").await.unwrap();
    let by_name: std::collections::HashMap<_, _> =
        stored.iter().map(|l| (l.metadata.name.clone(), l.metadata.resource_version.clone().unwrap())).collect();
    let missing: Vec<_> = acked.iter().filter(|(name, rv)| by_name.get(name) != Some(rv)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged writes are missing after kill -9, e.g. {:?}",
        missing.len(),
        acked.len(),
        missing.first()
    );
    // And the store goes on from where it was.
    let next = admin
        .create(&Object::new("after-restart", LeaseSpec { lease_duration_seconds: 1, ..Default::default() }))
        .await
        .unwrap();
    let highest = acked.iter().map(|(_, rv)| rv.parse::<u64>().unwrap()).max().unwrap();
    assert!(next.metadata.resource_version.unwrap().parse::<u64>().unwrap() > highest);
}
