//! Resources, with real agents: each node says what it has (its
//! `--capacity-*` and `--reserve-*` flags), placement never puts more
//! requested than allocatable on a node and says which resource is short
//! on which node, evictions place by the same rule, and bad requests are
//! refused naming the field.

use crate::common;

use std::time::Duration;

use common::apps::{list_members, nodes_with};
use common::eventually;
use herd_client::ClientError;
use herd_core::kinds::NodeSpec;
use herd_core::quantity::Bytes;

/// Each node has 1 CPU and 1 GiB, 256 MiB of it kept back.
const SMALL_HOST: [&str; 8] =
    ["--capacity-cpu", "1", "--capacity-memory", "1Gi", "--reserve-cpu", "0", "--reserve-memory", "256Mi"];

fn app(name: &str, resources: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"metadata": {"name": name}, "spec": {"roles": [{
        "name": "db", "run": {"command": ["sleep", "600"], "resources": resources}
    }]}})
}

#[tokio::test(flavor = "multi_thread")]
async fn placement_never_overcommits_a_node_and_says_which_resource_is_short_where() {
    let nodes = nodes_with(2, &SMALL_HOST).await;
    let server = &nodes.server;
    let admin = server.admin();
    let n1 = admin.get::<NodeSpec>("n1").await.unwrap();
    assert_eq!(n1.status.allocatable.map(|a| a.memory), Some(Bytes(768 << 20)), "{:?}", n1.status);

    admin
        .create_value("apps", &app("hungry", serde_json::json!({"cpu": "500m", "memory": "512Mi"})), Default::default())
        .await
        .unwrap();
    let cluster = serde_json::json!({"metadata": {"name": "hungry"},
        "spec": {"appRef": "hungry", "roles": [{"name": "db", "members": 3}]}});
    admin.create_value("appclusters", &cluster, Default::default()).await.unwrap();

    let short = "memory 512Mi requested, 256Mi of 768Mi allocatable left";
    let (bound, refused) = eventually(Duration::from_secs(30), "two placed, the third refused", || async {
        let members = list_members(server, "hungry").await;
        let (bound, unbound): (Vec<_>, Vec<_>) = members.into_iter().partition(|m| m.spec.node.is_some());
        let reason = unbound.first()?.status.reason.clone()?;
        (bound.len() == 2 && unbound.len() == 1).then_some((bound, reason))
    })
    .await;
    assert_ne!(bound[0].spec.node, bound[1].spec.node, "one member per node: {bound:?}");
    assert_eq!(refused, format!("no node can take hungry-db-2: n1: {short}; n2: {short}"));

    let described = String::from_utf8_lossy(&server.cli(&["describe", "node", "n1"]).stdout).into_owned();
    assert!(described.contains("requested by 1 members: cpu 500m (50%), memory 512Mi (66%)"), "{described}");

    // An eviction places by the same rule: the other node has no room.
    let error = admin.evict_member(&bound[0].metadata.name, true).await.unwrap_err();
    let ClientError::Api(status) = error else { panic!("not an API error: {error}") };
    assert!(status.message.contains(short), "{}", status.message);

    // Requests that fit what is left place the member.
    let app = app("hungry", serde_json::json!({"cpu": "500m", "memory": "256Mi"}));
    let mut current = admin.get_value("apps", "hungry").await.unwrap();
    current["spec"] = app["spec"].clone();
    admin.replace_value("apps", "hungry", &current, Default::default()).await.unwrap();
    eventually(Duration::from_secs(30), "the third placed once its request fits", || async {
        let members = list_members(server, "hungry").await;
        members.iter().all(|m| m.spec.node.is_some()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn bad_requests_are_refused_naming_the_field_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::TestServer::start(dir.path());
    let admin = server.admin();
    let cases = [
        (serde_json::json!({"cpu": -1}), "cpu", "negative"),
        (serde_json::json!({"memory": "12XB"}), "memory", "\"12XB\" is not a number with an optional suffix"),
        (serde_json::json!({"memory": "1Gi", "memoryMax": "512Mi"}), "memoryMax", "less than the memory request"),
        (serde_json::json!({"cpu": 2, "cpuMax": "1500m"}), "cpuMax", "less than the cpu request"),
    ];
    for (resources, field, reason) in cases {
        let error = admin.create_value("apps", &app("bad", resources.clone()), Default::default()).await.unwrap_err();
        let ClientError::Api(status) = error else { panic!("not an API error") };
        assert_eq!(status.code, 422, "{resources}");
        assert_eq!(status.causes[0].field, format!("spec.roles[0].run.resources.{field}"), "{resources}");
        assert!(status.causes[0].reason.contains(reason), "{resources}: {}", status.causes[0].reason);
    }
    assert!(admin.list_values("apps", "").await.unwrap().items.is_empty(), "nothing stored");
}
