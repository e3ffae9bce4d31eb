//! Joining: join tokens with a lifetime, and a deleted node kept out until
//! an admin readmits it. Against a real server, a real agent and the CLI.

use crate::common;

use std::time::Duration;

use common::{ADMIN_TOKEN, JOIN_TOKEN, TestServer, eventually, start_agent};
use herd_client::Client;
use herd_core::api::{AgentReport, JoinRequest, JoinTokenRequest, StatusReason};
use herd_core::kinds::{EventReason, EventSpec, NodeSpec};
use herd_core::{HumanDuration, Object};

fn join_request(name: &str, boot: &str) -> JoinRequest {
    JoinRequest {
        node_name: name.into(),
        previous_node_token: None,
        report: AgentReport { agent_boot_id: boot.into(), ..Default::default() },
    }
}

fn with(server: &TestServer, token: &str) -> Client {
    server.anonymous().with_token(Some(token.into()))
}

async fn events(server: &TestServer, reason: EventReason, about: &str) -> Vec<Object<EventSpec>> {
    let all = server.admin().list::<EventSpec>("").await.unwrap();
    all.into_iter().filter(|e| e.spec.reason_is(reason) && e.spec.involved_object.name == about).collect()
}

#[tokio::test]
async fn join_tokens_expire_can_be_revoked_and_only_admins_make_them() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let admin = server.admin();
    let short =
        JoinTokenRequest { ttl: Some(HumanDuration::from_secs(2)), description: "short".into(), ..Default::default() };
    let short = admin.create_join_token(&short).await.unwrap();
    let short_token = short.token.clone().expect("the secret is in the answer to its creation");
    assert!(short_token.starts_with(&format!("herdjoin.{}.", short.id)), "{short_token}");
    let lasting = admin
        .create_join_token(&JoinTokenRequest { description: "rack 4".into(), ..Default::default() })
        .await
        .unwrap();
    let lasting_token = lasting.token.clone().unwrap();

    let listed = admin.join_tokens().await.unwrap().items;
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|t| t.token.is_none()), "a list never shows a secret: {listed:?}");
    assert!(listed.iter().any(|t| t.id == lasting.id && t.expires.is_none() && t.description == "rack 4"));

    let n1 = with(&server, &short_token).join(&join_request("n1", "b1")).await.expect("a fresh token joins");
    // A node may not make or see join tokens; a join token is only for joining.
    let node = with(&server, &n1.node_token);
    let refused = node.create_join_token(&JoinTokenRequest::default()).await.unwrap_err();
    assert_eq!(refused.reason(), Some(StatusReason::Forbidden), "{refused}");
    assert_eq!(node.join_tokens().await.unwrap_err().reason(), Some(StatusReason::Forbidden));
    assert_eq!(
        with(&server, &lasting_token).join_tokens().await.unwrap_err().reason(),
        Some(StatusReason::Unauthorized)
    );
    let too_short = JoinTokenRequest { ttl: Some(HumanDuration(Duration::from_millis(10))), ..Default::default() };
    let invalid = admin.create_join_token(&too_short).await.unwrap_err();
    assert_eq!(invalid.reason(), Some(StatusReason::Invalid), "{invalid}");
    assert!(invalid.to_string().contains("ttl"), "{invalid}");

    // Revoked: refused at once; a second delete finds nothing.
    admin.delete_join_token(&lasting.id).await.unwrap();
    let revoked = with(&server, &lasting_token).join(&join_request("n2", "b2")).await.unwrap_err();
    assert_eq!(revoked.reason(), Some(StatusReason::Unauthorized), "{revoked}");
    assert_eq!(admin.delete_join_token(&lasting.id).await.unwrap_err().reason(), Some(StatusReason::NotFound));

    // Expired: refused, saying so. The server's own token still joins.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let expired = with(&server, &short_token).join(&join_request("n3", "b3")).await.unwrap_err();
    assert_eq!(expired.reason(), Some(StatusReason::Unauthorized), "{expired}");
    assert!(expired.to_string().contains("expired at"), "{expired}");
    with(&server, JOIN_TOKEN).join(&join_request("n3", "b3")).await.expect("the server's own token");
    assert_eq!(admin.join_tokens().await.unwrap().items.len(), 1, "an expired token is listed until deleted");

    // A join whose signing request is not one is refused naming it, and
    // registers nothing.
    let mut bad_csr = join_request("n4", "b4");
    bad_csr.report.csr = Some("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n".into());
    let refused_csr = with(&server, JOIN_TOKEN).join(&bad_csr).await.unwrap_err();
    assert_eq!(refused_csr.reason(), Some(StatusReason::Invalid), "{refused_csr}");
    assert!(refused_csr.to_string().contains("csr"), "{refused_csr}");
    assert!(admin.get::<NodeSpec>("n4").await.unwrap_err().is_not_found());

    // A join refused for its token stores nothing of its body (anyone may
    // send one): it is counted. Every token's life is an Event.
    assert!(events(&server, EventReason::JoinRefused, "n3").await.is_empty());
    assert!(events(&server, EventReason::JoinRefused, "n2").await.is_empty());
    let metrics = admin.get_text("/metrics").await.unwrap();
    assert!(metrics.contains("herd_join_refusals_total{outcome=\"refused\"} 2"), "{metrics}");
    assert_eq!(events(&server, EventReason::JoinTokenCreated, &short.id).await.len(), 1);
    assert_eq!(events(&server, EventReason::JoinTokenDeleted, &lasting.id).await.len(), 1);

    // The CLI: the token alone on stdout, the join command on stderr; list and delete by id.
    let created = server.cli(&["token", "create", "--ttl", "1h", "--description", "from the cli"]);
    assert!(created.status.success(), "{created:?}");
    let token = String::from_utf8(created.stdout).unwrap().trim().to_string();
    let id = herd_core::join::join_token_id(&token).expect("a join token on stdout").to_string();
    assert!(String::from_utf8_lossy(&created.stderr).contains(&format!("--join-token {token}")));
    let listed = server.cli(&["token", "list"]);
    let listed = String::from_utf8(listed.stdout).unwrap();
    assert!(listed.contains(&id) && listed.contains("in 59m") && listed.contains("from the cli"), "{listed}");
    assert!(!listed.contains(&token), "the list shows no secret: {listed}");
    assert!(server.cli(&["token", "delete", &id]).status.success());
    assert_eq!(server.cli(&["token", "delete", &id]).status.code(), Some(3), "a missing token is exit code 3");
}

#[tokio::test]
async fn a_deleted_node_is_kept_out_until_readmitted_and_a_new_host_may_take_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    let admin = server.admin();
    let agent_dir = dir.path().join("agent");
    let mut agent = start_agent(&server.url, &agent_dir, "node-1");
    let ready = async || admin.get::<NodeSpec>("node-1").await.ok().filter(|n| n.status.ready);
    eventually(Duration::from_secs(20), "node-1 Ready", ready).await;

    admin.delete_value("nodes", "node-1", Default::default()).await.unwrap();
    let deleted = events(&server, EventReason::NodeDeleted, "node-1").await;
    assert!(deleted.iter().any(|e| e.spec.message.contains("herd node readmit node-1")), "{deleted:?}");
    // Its agent is told its token is revoked, tries to join again and is
    // refused, again and again (with backoff), while it keeps running.
    let refused_once = async || {
        let refused = events(&server, EventReason::JoinRefused, "node-1").await;
        refused.iter().any(|e| e.spec.message.contains("deleted by an admin")).then_some(())
    };
    eventually(Duration::from_secs(20), "the deleted node's rejoin refused", refused_once).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(admin.get::<NodeSpec>("node-1").await.unwrap_err().is_not_found(), "the node did not come back");
    assert!(agent.child.try_wait().unwrap().is_none(), "the agent keeps running, waiting to be let in");

    // Readmitted, the same agent joins again by itself.
    let readmitted = server.cli(&["node", "readmit", "node-1"]);
    assert!(readmitted.status.success(), "{readmitted:?}");
    assert_eq!(events(&server, EventReason::NodeReadmitted, "node-1").await.len(), 1);
    eventually(Duration::from_secs(20), "node-1 Ready again", ready).await;
    assert_eq!(server.cli(&["node", "readmit", "node-1"]).status.code(), Some(3), "nothing left to readmit");

    // A new host, with no old token, may take a deleted node's name at once.
    let old = with(&server, JOIN_TOKEN).join(&join_request("node-2", "old-host")).await.unwrap();
    admin.delete_value("nodes", "node-2", Default::default()).await.unwrap();
    let stale = with(&server, &old.node_token).get::<NodeSpec>("node-2").await.unwrap_err();
    assert!(stale.to_string().contains("deleted by an admin"), "the revoked token is told why: {stale}");
    let comeback =
        JoinRequest { previous_node_token: Some(old.node_token.clone()), ..join_request("node-2", "old-host-2") };
    let refused = with(&server, JOIN_TOKEN).join(&comeback).await.unwrap_err();
    assert_eq!(refused.reason(), Some(StatusReason::Conflict), "{refused}");
    with(&server, JOIN_TOKEN).join(&join_request("node-2", "new-host")).await.expect("a new host");
    let registered = events(&server, EventReason::NodeRegistered, "node-2").await;
    assert!(registered.iter().any(|e| e.spec.message.contains("a new host")), "{registered:?}");
}

/// The agent command `herd token create` prints joins as printed: it names
/// the hash of the CA the CLI trusts (here from a CA file), which an agent
/// needs to trust the server.
#[tokio::test]
async fn the_join_command_token_create_prints_joins_as_printed() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    let created = common::herd_trusting_nothing()
        .args(["--server", &server.url, "--token", ADMIN_TOKEN, "--ca-file"])
        .arg(server.data_dir.join("ca.pem"))
        .args(["token", "create", "--ttl", "10m"])
        .output()
        .unwrap();
    assert!(created.status.success(), "{created:?}");
    let said = String::from_utf8(created.stderr).unwrap();
    let printed = said.lines().find_map(|line| line.trim().strip_prefix("herd agent ")).expect("the agent command");
    let hash = server.ca_hash.clone().unwrap();
    assert!(printed.contains(&format!("--ca-hash {hash}")), "{printed}");

    let args: Vec<String> = printed.split_whitespace().map(|arg| arg.replace("NODE", "printed")).collect();
    let mut command = common::herd_trusting_nothing();
    command.arg("agent").args(&args).arg("--data-dir").arg(dir.path().join("agent"));
    let _agent = common::Proc::spawn(command);
    let admin = server.admin();
    let ready = async || admin.get::<NodeSpec>("printed").await.ok().filter(|n| n.status.ready);
    eventually(Duration::from_secs(20), "the agent joined as printed", ready).await;
}

/// Readmitting a node whose agent's join token is gone says so, rather
/// than that its agent may join again.
#[tokio::test]
async fn a_readmission_says_when_the_agents_join_token_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let admin = server.admin();
    for (node, expired) in [("n1", false), ("n2", true)] {
        let ttl = Some(HumanDuration::from_secs(if expired { 1 } else { 3600 }));
        let made = admin.create_join_token(&JoinTokenRequest { ttl, ..Default::default() }).await.unwrap();
        with(&server, made.token.as_deref().unwrap()).join(&join_request(node, node)).await.unwrap();
        admin.delete_value("nodes", node, Default::default()).await.unwrap();
        if expired {
            tokio::time::sleep(Duration::from_millis(1100)).await;
        } else {
            admin.delete_join_token(&made.id).await.unwrap();
        }
        let readmitted = admin.readmit_node(node).await.unwrap();
        assert!(!readmitted.agent_can_join, "{readmitted:?}");
        let why = if expired { "expired at" } else { "was deleted" };
        assert!(readmitted.message.contains(why) && readmitted.message.contains("herd token create"), "{readmitted:?}");
    }
    // Joined with the server's own token, which lasts: it may.
    with(&server, JOIN_TOKEN).join(&join_request("n3", "n3")).await.unwrap();
    admin.delete_value("nodes", "n3", Default::default()).await.unwrap();
    let readmitted = server.cli(&["node", "readmit", "n3"]);
    assert_eq!(String::from_utf8_lossy(&readmitted.stdout).trim(), "node/n3 readmitted: its agent may join again");
}
