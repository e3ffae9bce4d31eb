//! Attacks by callers the server cannot trust with its store: anyone
//! without a token (joins with a garbage one), and a node writing what it
//! likes into its status and the refusals it reports. Against a real
//! server process.

use crate::common;

use std::time::Duration;

use common::{JOIN_TOKEN, TestServer, eventually};
use herd_client::{Client, ClientError};
use herd_core::api::{AgentReport, JoinRequest, PeerRefusal, StatusReason};
use herd_core::grant::{Access, Holder, Refusal};
use herd_core::kinds::{EventReason, EventSpec, NodeSpec};
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
    assert!(!events.contains(EventReason::JoinRefused.as_str()), "{events}");
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
    let refusal = |caller: &str, member: &str| PeerRefusal {
        caller: Some(Holder::Node(caller.into())),
        asked: Access::StopMember { member: member.into() },
        reason: Refusal::Missing,
        at: herd_core::Timestamp::from_system_time(std::time::SystemTime::now()),
    };
    // What a caller without a certificate asked is anyone's words: not kept.
    let anonymous = |member: &str| PeerRefusal { caller: None, reason: Refusal::Anonymous, ..refusal(member, member) };
    let refusals = vec![refusal("node-zz", "web-1"), refusal("node-b", "web-1"), anonymous("aa-1"), anonymous("aa-2")];
    let reported = AgentReport { peer_refusals: refusals, ..report("node-a", "127.0.0.1:1") };
    node_a.heartbeat("node-a", &reported).await.unwrap();
    let events = events_text(&server).await;
    assert!(!events.contains("node-zz") && !events.contains("aa-1"), "{events}");
    let all = server.admin().list::<EventSpec>("").await.unwrap();
    let anonymous: Vec<_> = all.iter().filter(|e| e.spec.message.contains("without a cluster certificate")).collect();
    assert_eq!(anonymous.iter().map(|e| e.spec.count).collect::<Vec<_>>(), [2], "one Event, counted");
    assert!(events.contains("refused a caller whose certificate names no node of this cluster to stop member web-1"));
    assert!(events.contains("refused node node-b to stop member web-1: no grant was shown"), "{events}");
}

/// Posts `body` to `path` over HTTP/2 (ALPN h2, as browsers do):
/// the status, or the error that ended the stream.
async fn post_over_http2(server: &TestServer, path: &str, body: Vec<u8>) -> Result<u16, String> {
    let mut config = herd_tls::client_config(&server.trust().unwrap()).unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(server.listen_addr()).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]), "HTTP/2 was negotiated");
    let io = hyper_util::rt::TokioIo::new(tls);
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io).await.unwrap();
    tokio::spawn(connection);
    let request = hyper::Request::post(format!("{}{path}", server.url))
        .header("authorization", format!("Bearer {}", common::ADMIN_TOKEN))
        .body(http_body_util::Full::new(hyper::body::Bytes::from(body)))
        .unwrap();
    sender.send_request(request).await.map(|answer| answer.status().as_u16()).map_err(|e| format!("{e:?}"))
}

/// A body over the limit is answered 413, over HTTP/2 and HTTP/1.1 alike,
/// however much more is coming: not a stream or connection broken off.
#[tokio::test]
async fn a_body_over_the_limit_is_a_413_however_large_and_over_either_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let url = format!("{}/api/v1/nodes", server.url);
    for megabytes in [3, 5, 8, 20] {
        let body = vec![b' '; megabytes << 20];
        let over_http2 = post_over_http2(&server, "/api/v1/nodes", body.clone()).await;
        assert_eq!(over_http2, Ok(413), "HTTP/2, {megabytes} MB");
        let sent = server.raw_http().post(&url).bearer_auth(common::ADMIN_TOKEN).body(body).send().await;
        let answer = sent.unwrap_or_else(|e| panic!("HTTP/1.1, {megabytes} MB: no answer: {e:?}"));
        assert_eq!(answer.status().as_u16(), 413, "HTTP/1.1, {megabytes} MB");
        let status: serde_json::Value = answer.json().await.unwrap();
        assert!(status["message"].as_str().unwrap().contains("too large"), "{status}");
    }
    assert!(server.admin().list::<NodeSpec>("").await.unwrap().is_empty());
}

/// Each bad input is refused naming its field, and nothing is stored.
#[tokio::test]
async fn bad_input_is_refused_naming_the_field_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let admin = server.admin();
    let refused = |error: ClientError| {
        let status = status(error);
        (status.code, status.causes.first().map(|c| c.field.clone()).unwrap_or_default(), status.message)
    };

    // Annotations: 256 KiB in all at most, on create and on a change.
    let big = "x".repeat(1 << 20);
    let node = json!({"metadata": {"name": "n1", "annotations": {"note": big}}});
    let (code, field, _) = refused(admin.create_value("nodes", &node, Default::default()).await.unwrap_err());
    assert_eq!((code, field.as_str()), (422, "metadata.annotations"));
    admin.create_value("nodes", &json!({"metadata": {"name": "n1"}}), Default::default()).await.unwrap();
    let patch = json!({"metadata": {"annotations": {"a": "x".repeat(200 << 10), "b": "x".repeat(100 << 10)}}});
    let (code, field, _) = refused(admin.patch_value("nodes", "n1", &patch).await.unwrap_err());
    assert_eq!((code, field.as_str()), (422, "metadata.annotations"));
    assert!(admin.get::<NodeSpec>("n1").await.unwrap().metadata.annotations.is_empty());

    // An Operation's deadline: not centuries, not a nanosecond.
    for (deadline, reason) in [("18446744073709551615s", "longer than 10years"), ("1ns", "must be from 1s to 30days")] {
        let drain = json!({"metadata": {"name": "d1"}, "spec": {"action": {"type": "Drain", "node": "n1"}, "deadline": deadline}});
        let (code, field, message) =
            refused(admin.create_value("operations", &drain, Default::default()).await.unwrap_err());
        assert_eq!((code, field.as_str()), (422, "spec.deadline"), "{deadline}: {message}");
        assert!(message.contains(reason), "{deadline}: {message}");
    }
    assert!(admin.list_values("operations", "").await.unwrap().items.is_empty());

    // A POST whose options are query parameters takes no fields.
    let url = format!("{}/api/v1/members/m1/eviction", server.url);
    let answer =
        server.raw_http().post(&url).bearer_auth(common::ADMIN_TOKEN).json(&json!({"x": 1})).send().await.unwrap();
    assert_eq!(answer.status().as_u16(), 422);
    let status: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(status["causes"][0]["field"], "x", "{status}");
    let empty = server.raw_http().post(&url).bearer_auth(common::ADMIN_TOKEN).json(&json!({})).send().await.unwrap();
    assert_eq!(empty.status().as_u16(), 404, "an empty object is no option: the member is looked for");

    // A watch from a revision the store has not reached: 410, as a
    // compacted one, so that the client lists again.
    let head: u64 = admin.list_values("nodes", "").await.unwrap().metadata.resource_version.parse().unwrap();
    let future = (head + 1000).to_string();
    let watch = admin.watch("nodes", Some(&future), "").await;
    let error = match watch {
        Ok(mut stream) => tokio::time::timeout(Duration::from_secs(2), stream.next())
            .await
            .expect("the watch answers at once")
            .expect("the watch says why it ends")
            .expect_err("an error, not an event"),
        Err(error) => error,
    };
    assert_eq!(error.reason(), Some(StatusReason::Gone), "{error}");
    assert!(error.to_string().contains("ahead of the store"), "{error}");
}
