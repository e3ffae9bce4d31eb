//! Leaders for App roles on real agents: a member granted its role's
//! lease is promoted by its hook; when its host is cut off, its agent
//! fences it (demote, then its processes end) before the next term is
//! granted elsewhere, so that two members never accept writes at once.
//!
//! The app is a shell loop that "accepts a write" every 10 ms while its
//! data volume holds the `primary` mark the promote hook writes and the
//! demote hook removes, logging the time and its term.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::apps::{configured, nodes_with_n1_apart};
use common::eventually;
use herd_core::kinds::{AppClusterSpec, NodeSpec};

/// A member that writes while it is primary.
const MEMBER: &str = r#"while :; do
  if [ -e "$HERD_VOLUME_DATA/primary" ]; then
    echo "$(date +%s%N) $(cat "$HERD_VOLUME_DATA/primary")" >>"$WRITES/$HERD_MEMBER"
  fi
  sleep 0.01
done"#;

fn app() -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": "lead"},
        "spec": {"roles": [{
            "name": "db",
            "run": {"command": ["sh", "-c", MEMBER], "volumes": [{"name": "data", "persistent": true}]},
            "leader": {
                "promote": {"script": "echo \"$HERD_LEADER_TERM\" >\"$HERD_VOLUME_DATA/primary\""},
                "demote": {"script": "rm -f \"$HERD_VOLUME_DATA/primary\""}
            }
        }]}
    })
}

/// Each write a member logged: (nanoseconds since the epoch, term).
fn writes(dir: &Path, member: &str) -> Vec<(u128, u64)> {
    let text = std::fs::read_to_string(dir.join(member)).unwrap_or_default();
    let parse = |line: &str| {
        let (at, term) = line.split_once(' ')?;
        Some((at.parse().ok()?, term.trim().parse().ok()?))
    };
    text.lines().filter_map(parse).collect()
}

/// (holder, term) of role `db` in cluster `c`.
async fn leader(server: &common::TestServer) -> Option<(String, u64)> {
    let cluster = server.admin().get::<AppClusterSpec>("c").await.ok()?;
    let leader = cluster.status.leaders.into_iter().find(|l| l.role == "db")?;
    Some((leader.member?, leader.term))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_off_leader_is_fenced_before_another_member_is_promoted_and_never_two_write_at_once() {
    let nodes = nodes_with_n1_apart(3).await;
    let server = &nodes.server;
    let admin = server.admin();
    let dir = nodes.dir.path().join("writes");
    std::fs::create_dir_all(&dir).unwrap();
    admin.create_value("apps", &app(), Default::default()).await.unwrap();
    // The first member, alone on n1 (the others cordoned), leads; then
    // two more join on n2 and n3.
    let cordon = async |node: &str, cordoned: bool| {
        let mut object = admin.get::<NodeSpec>(node).await.unwrap();
        object.spec.unschedulable = cordoned;
        admin.update(&object).await.unwrap();
    };
    cordon("n2", true).await;
    cordon("n3", true).await;
    let cluster = |members: u32| {
        serde_json::json!({
            "metadata": {"name": "c"},
            "spec": {"appRef": "lead", "roles": [{"name": "db", "members": members, "env": {"WRITES": dir}}]}
        })
    };
    admin.create_value("appclusters", &cluster(1), Default::default()).await.unwrap();
    configured(server, "c", 1, Duration::from_secs(30)).await;
    eventually(Duration::from_secs(20), "c-db-0 leads", || async { leader(server).await.filter(|(_, t)| *t == 1) })
        .await;
    cordon("n2", false).await;
    cordon("n3", false).await;
    let mut scaled = admin.get::<AppClusterSpec>("c").await.unwrap();
    scaled.spec.roles[0].members = 3;
    admin.update(&scaled).await.unwrap();
    let members = configured(server, "c", 3, Duration::from_secs(30)).await;
    let (first, term) =
        eventually(Duration::from_secs(20), "a leader", || async { leader(server).await.filter(|(_, t)| *t == 1) })
            .await;
    let on = |member: &str| members.iter().find(|m| m.metadata.name == member).and_then(|m| m.spec.node.clone());
    assert_eq!((first.as_str(), term, on(&first).as_deref()), ("c-db-0", 1, Some("n1")));
    eventually(Duration::from_secs(20), "the leader promoted and writing", || async {
        (!writes(&dir, &first).is_empty()).then_some(())
    })
    .await;

    // n1 is cut off: its agent cannot renew, and fences its leader.
    let netns = nodes.netns.as_ref().expect("n1 apart");
    netns.cut();
    let cut = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let (second, term) =
        eventually(Duration::from_secs(40), "a new leader", || async { leader(server).await.filter(|(_, t)| *t == 2) })
            .await;
    assert_ne!(second, first);
    eventually(Duration::from_secs(20), "the new leader promoted and writing", || async {
        writes(&dir, &second).iter().any(|(_, t)| *t == term).then_some(())
    })
    .await;
    let old = writes(&dir, &first);
    let new = writes(&dir, &second);
    let last_old = old.iter().map(|(at, _)| *at).max().unwrap();
    let first_new = new.iter().filter(|(_, t)| *t == 2).map(|(at, _)| *at).min().unwrap();
    assert!(
        last_old < first_new,
        "never two primaries at once: the old wrote until {last_old}, the new from {first_new}"
    );
    let ms = |ns: u128| ns / 1_000_000;
    eprintln!(
        "cut at 0 ms; the old leader's last write at {} ms, the new leader's first at {} ms",
        ms(last_old.saturating_sub(cut)),
        ms(first_new.saturating_sub(cut))
    );
    // Its agent fenced it within its renew deadline (7 s) of its last
    // renewal, which came at most a heartbeat before the cut.
    assert!(ms(last_old.saturating_sub(cut)) < 7_000 + 500, "fenced in time");

    // The cut heals: the old leader, demoted, stays a follower.
    netns.heal();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(writes(&dir, &first).len(), old.len(), "the old leader writes no more");
    assert_eq!(leader(server).await, Some((second, 2)));
}
