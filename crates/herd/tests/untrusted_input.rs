//! Attacks by callers the server cannot trust with its store: anyone
//! without a token (joins with a garbage one), and a node writing what it
//! likes into its status and the refusals it reports. Against a real
//! server process.

mod common;

use std::time::Duration;

use common::{JOIN_TOKEN, TestServer, eventually};
use herd_client::{Client, ClientError};
use herd_core::api::{AgentReport, JoinRequest, PeerRefusal, StatusReason};
use herd_core::grant::{Access, Holder, Refusal};
use herd_core::kinds::{EventSpec, NodeSpec};
use serde_json::json;

fn report(boot: &str, address: &str) -> AgentReport {
    AgentReport { agent_boot_id: boot.into(), address: Some(address.into()), ..Default::default() }
}

/// Joins node `name`: a client with its node token, and the token.
async fn join(server: &TestServer, name: &str) -> (Client, String) {
    let request =
        JoinRequest { node_name: name.into(), previous_node_token: None, report: report(name, "127.0.0.1:1") };
    let joined = server.anonymous().with_token(Some(JOIN_TOKEN.into())).join(&request).await.unwrap();
    (server.anonymous().with_token(Some(joined.node_token.clone())), joined.node_token)
}

async fn events_text(server: &TestServer) -> String {
    let events = server.admin().list::<EventSpec>("").await.unwrap();
    events.iter().map(|e| format!("{} {} {}\n", e.metadata.name, e.spec.reason, e.spec.message)).collect()
}

fn metric(text: &str, line_start: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(line_start)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {line_start} in\n{text}"))
}

#[tokio::test]
async fn a_flood_of_joins_with_a_garbage_token_stores_nothing_and_is_limited() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let anyone = server.anonymous().with_token(Some("herdjoin.abcdef.0000".into()));
    let mut reasons = Vec::new();
    for i in 0..200 {
        let request = JoinRequest {
            node_name: format!("evil-{i}"),
            previous_node_token: None,
            report: report("b", &format!("<img src=x onerror=alert({i})>")),
        };
        reasons.push(anyone.join(&request).await.unwrap_err().reason());
    }
    let refused = reasons.iter().filter(|r| **r == Some(StatusReason::Unauthorized)).count();
    let limited = reasons.iter().filter(|r| **r == Some(StatusReason::TooManyRequests)).count();
    assert_eq!(refused + limited, 200, "{reasons:?}");
    assert!((10..=15).contains(&refused), "a burst, then limited: {refused} refused, {limited} limited");

    let events = events_text(&server).await;
    assert!(!events.contains("evil") && !events.contains("onerror"), "the bodies were stored:\n{events}");
    assert!(!events.contains("JoinRefused"), "{events}");
    let metrics = server.admin().get_text("/metrics").await.unwrap();
    assert_eq!(metric(&metrics, "herd_join_refusals_total{outcome=\"refused\"}") as usize, refused);
    assert_eq!(metric(&metrics, "herd_join_refusals_total{outcome=\"limited\"}") as usize, limited);

    // The real token from the same address: let in once the flood's
    // bucket has a token again (a second).
    let request =
        JoinRequest { node_name: "n1".into(), previous_node_token: None, report: report("b1", "127.0.0.1:1") };
    let real = server.anonymous().with_token(Some(JOIN_TOKEN.into()));
    eventually(Duration::from_secs(5), "the real join let in", || async { real.join(&request).await.ok() }).await;
}

fn status(error: ClientError) -> herd_core::api::Status {
    match error {
        ClientError::Api(status) => status,
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn a_node_cannot_write_markup_into_its_status_nor_blame_nodes_the_cluster_does_not_know() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let (node_a, node_a_token) = join(&server, "node-a").await;
    join(&server, "node-b").await;

    let markup = report("node-a", "<img src=x onerror=alert(10)>");
    let refused = status(node_a.heartbeat("node-a", &markup).await.unwrap_err());
    assert_eq!((refused.code, refused.causes[0].field.as_str()), (422, "address"), "{refused:?}");
    let node = server.admin().get::<NodeSpec>("node-a").await.unwrap();
    assert_eq!(node.status.address.as_deref(), Some("127.0.0.1:1"), "the status is unchanged");

    // A refusal in words of the node's choosing is not one.
    let worded = json!({
        "agentBootId": "node-a",
        "peerRefusals": [{"caller": "node node-b, who is evil", "asked": "x", "reason": "y", "at": "2026-12-04T00:00:00Z"}],
    });
    let url = format!("{}/api/v1/nodes/node-a/heartbeat", server.url);
    let answer = server.raw_http().post(&url).bearer_auth(&node_a_token).json(&worded).send().await.unwrap();
    assert_eq!(answer.status().as_u16(), 422);

    // A caller that is no node of the cluster is not named; one that is, is.
    let refusal = |caller: &str| PeerRefusal {
        caller: Some(Holder::Node(caller.into())),
        asked: Access::StopMember { member: "web-1".into() },
        reason: Refusal::Missing,
        at: herd_core::Timestamp::from_system_time(std::time::SystemTime::now()),
    };
    let reported =
        AgentReport { peer_refusals: vec![refusal("node-zz"), refusal("node-b")], ..report("node-a", "127.0.0.1:1") };
    node_a.heartbeat("node-a", &reported).await.unwrap();
    let events = events_text(&server).await;
    assert!(!events.contains("node-zz"), "{events}");
    assert!(events.contains("refused a caller whose certificate names no node of this cluster to stop member web-1"));
    assert!(events.contains("refused node node-b to stop member web-1: no grant was shown"), "{events}");
}
