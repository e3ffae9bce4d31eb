//! Agent-to-agent access, tried as an attacker holding one node's own
//! credentials (its node token, certificate and key) would: without a
//! grant signed by the server for exactly that caller, node and action,
//! another node's agent reads and stops nothing (403, and a
//! PeerAccessRefused Event on the node that refused); a forged, stolen,
//! out-of-scope or expired grant is refused the same way; a caller
//! without a cluster certificate is refused, and an agent will not talk to
//! an endpoint that is not the node it meant.

use crate::common;

use std::path::Path;
use std::time::{Duration, SystemTime};

use common::cluster::{TwoNodes, command, fill_volume, settled, two_nodes};
use common::{ADMIN_TOKEN, MemberReaper, TestServer, event_where, eventually, start_agent};
use herd_client::PeerClient;
use herd_core::grant::{Access, Grant, Holder};
use herd_core::kinds::command::{MemberRun, VolumeSpec};
use herd_core::kinds::{Action, CommandSpec, EventReason, EventSpec, ManagementState, NodeSpec};
use herd_core::{Object, Timestamp};
use herd_tls::ServingIdentity;
use herd_tls::grant::GrantSigner;

/// What node `dir`'s agent holds: its certificate and key.
fn identity_of(dir: &Path) -> ServingIdentity {
    let kept: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("node-cert.json")).unwrap()).unwrap();
    ServingIdentity {
        chain_pem: kept["chainPem"].as_str().unwrap().into(),
        key_pem: kept["keyPem"].as_str().unwrap().into(),
    }
}

fn grant(holder: &str, node: &str, access: Access, lasts: Duration) -> Grant {
    Grant {
        holder: Holder::Node(holder.into()),
        node: node.into(),
        access,
        expires: Timestamp::from_system_time(SystemTime::now() + lasts),
        purpose: "test".into(),
        attempt: None,
    }
}

fn refused(result: Result<impl std::fmt::Debug, herd_client::ClientError>, why: &str) {
    let error = result.expect_err(why).to_string();
    assert!(error.contains("status 403"), "{why}: {error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_reads_and_stops_nothing_on_another_without_a_grant_for_exactly_that() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    let admin = server.admin();
    let (n1_dir, n2_dir) = (dir.path().join("n1"), dir.path().join("n2"));
    let _reapers = (MemberReaper(n1_dir.clone()), MemberReaper(n2_dir.clone()));
    let _n1 = start_agent(&server.url, &n1_dir, "n1");
    let _n2 = start_agent(&server.url, &n2_dir, "n2");
    let n1_address = eventually(Duration::from_secs(20), "both nodes Ready", || async {
        let n2 = admin.get::<NodeSpec>("n2").await.ok().filter(|n| n.status.ready)?;
        let n1 = admin.get::<NodeSpec>("n1").await.ok().filter(|n| n.status.ready)?;
        n2.status.address.as_ref()?;
        n1.status.address
    })
    .await;
    let run = MemberRun {
        command: vec!["sleep".into(), "600".into()],
        env: Default::default(),
        volumes: vec![VolumeSpec { name: "data".into(), persistent: true }],
        readiness: None,
        drain: None,
        demote: None,
        position: None,
        ..Default::default()
    };
    let start = Action::StartMember { member: "m1".into(), run };
    admin
        .create(&Object::new("start-m1", CommandSpec { node: "n1".into(), timeout: None, action: start, origin: None }))
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "m1 runs on n1", || async {
        let command = admin.get::<CommandSpec>("start-m1").await.ok()?;
        (command.status.state_by_management == ManagementState::Completed).then_some(())
    })
    .await;
    std::fs::write(n1_dir.join("volumes/m1/data/secret"), "n1's data").unwrap();

    let n2 = identity_of(&n2_dir);
    let read = Access::read_volume("m1", "data");
    let stop = Access::StopMember { member: "m1".into() };
    let signer = GrantSigner::derive(ADMIN_TOKEN).unwrap();
    let hour = Duration::from_secs(3600);
    let as_n2 = |grants: Vec<Grant>, signer: &GrantSigner| {
        let signed: Vec<String> = grants.iter().map(|g| signer.sign(g)).collect();
        PeerClient::new(&n1_address, "n1", &n2, &signed).unwrap()
    };

    // n2's own credentials and no grant: nothing.
    let bare = as_n2(Vec::new(), &signer);
    refused(bare.manifest("m1", "data").await, "a manifest without a grant");
    refused(bare.file("m1", "data", "secret", 0).await.map(|_| ()), "a file without a grant");
    refused(bare.stop_member("m1").await, "a stop without a grant");
    refused(bare.stored_volumes().await, "the volume list without a grant");
    refused(bare.member_log("m1", herd_core::api::LogStream::Stdout, 100, None).await, "a log without a grant");

    // A grant signed with another key, one for n3 (stolen by n2), one for
    // n2 on another node, one for another action, one expired.
    let forged =
        as_n2(vec![grant("n2", "n1", stop.clone(), hour)], &GrantSigner::derive("not the admin token").unwrap());
    refused(forged.stop_member("m1").await, "a forged grant");
    let stolen = as_n2(vec![grant("n3", "n1", stop.clone(), hour)], &signer);
    refused(stolen.stop_member("m1").await, "another node's grant");
    let elsewhere = as_n2(vec![grant("n2", "n3", stop.clone(), hour)], &signer);
    refused(elsewhere.stop_member("m1").await, "a grant for another node's agent");
    let reader = as_n2(vec![grant("n2", "n1", read.clone(), hour)], &signer);
    // Shown for another action than its own (a PeerClient never does that).
    let tls = herd_tls::peer::client_config(&n2, "n1").unwrap();
    let raw = reqwest::Client::builder().tls_backend_preconfigured(tls).build().unwrap();
    let shown = |access: Access| signer.sign(&grant("n2", "n1", access, hour));
    for (url, grant, why) in [
        (format!("https://{n1_address}/members/m1/stop"), shown(read.clone()), "a read grant used to stop"),
        (
            format!("https://{n1_address}/members/m1/stop"),
            shown(Access::StopMember { member: "m2".into() }),
            "another member's grant",
        ),
    ] {
        let answer = raw.post(url).header("herd-grant", grant).send().await.unwrap();
        assert_eq!(answer.status(), 403, "{why}");
    }
    let expired = as_n2(vec![grant("n2", "n1", stop.clone(), Duration::ZERO)], &signer);
    refused(expired.stop_member("m1").await, "an expired grant");

    // The right grant reads exactly that volume, and m1 was never stopped.
    let manifest = reader.manifest("m1", "data").await.unwrap().expect("the volume is there");
    assert!(manifest.files.iter().any(|f| f.path == "secret"));
    let node = admin.get::<NodeSpec>("n1").await.unwrap();
    assert!(
        node.status.members.iter().any(|m| m.name == "m1" && m.running),
        "m1 still runs: {:?}",
        node.status.members
    );

    // No certificate of the cluster at all.
    let anonymous = reqwest::Client::builder().tls_danger_accept_invalid_certs(true).build().unwrap();
    let answer = anonymous.post(format!("https://{n1_address}/members/m1/stop")).send().await.unwrap();
    assert_eq!(answer.status(), 403);
    assert!(answer.text().await.unwrap().contains("without a cluster certificate"));

    // The agent reached must be the node meant: n2's grants, dialled at n1.
    let misdirected = PeerClient::new(&n1_address, "n3", &n2, &[]).unwrap();
    let error = misdirected.manifest("m1", "data").await.unwrap_err().to_string();
    assert!(error.contains("not node n3's"), "{error}");

    // Each refusal is an Event on n1, naming the caller and the reason.
    let expected = [
        "node n2",
        "no grant was shown",
        "not the server's",
        "the grant is for node n3, but the caller is node n2",
        "not this one (n1)",
        "the grant allows to read volume m1/data, not to stop member m1",
        "the grant allows to stop member m2, not to stop member m1",
        "expired",
        "without a cluster certificate",
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let events = admin.list::<EventSpec>("").await.unwrap();
        let refusals: Vec<String> = events
            .into_iter()
            .filter(|e| e.spec.reason_is(EventReason::PeerAccessRefused) && e.spec.involved_object.name == "n1")
            .map(|e| e.spec.message)
            .collect();
        let all = refusals.join("\n");
        let missing: Vec<&str> = expected.iter().copied().filter(|e| !all.contains(e)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no PeerAccessRefused Event on n1 says {missing:?}:\n{all}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_copys_grant_replayed_after_the_copy_completed_reads_nothing() {
    let TwoNodes { server, a_dir, b_dir, .. } = &two_nodes(&[]).await;
    let admin = server.admin();
    fill_volume(&a_dir.join("volumes/m1/data"), 7, 3, 64 << 10);
    let copy = Action::CopyVolume { member: "m1".into(), volume: "data".into(), from_node: "n1".into() };
    admin.create(&command("copy", "n2", copy)).await.unwrap();
    let copied = settled(server, "copy").await;
    assert_eq!(copied.status.state_by_management, ManagementState::Completed, "{:?}", copied.status);
    let grants = copied.status.issued.expect("it was issued").grants;
    assert!(!grants.is_empty(), "the copy was given a grant to read n1's volume");

    // n2 (its own key and certificate) shows the copy's grant again: its
    // expiry is an hour away, but the attempt it was for is over.
    let n1_address = admin.get::<NodeSpec>("n1").await.unwrap().status.address.unwrap();
    let replay = PeerClient::new(&n1_address, "n1", &identity_of(b_dir), &grants).unwrap();
    eventually(Duration::from_secs(15), "the replayed grant refused", || async {
        let error = replay.manifest("m1", "data").await.err()?.to_string();
        error.contains("status 403").then_some(())
    })
    .await;
    refused(replay.file("m1", "data", "f0", 0).await.map(|_| ()), "a file with the replayed grant");
    event_where(&admin, "a PeerAccessRefused Event saying the attempt ended", |e| {
        e.spec.reason_is(EventReason::PeerAccessRefused)
            && e.spec.involved_object.name == "n1"
            && e.spec.message.contains("ended with command copy attempt 1")
    })
    .await;
}
