//! `herd member replace`: recreate an app-cluster member on another node
//! with empty volumes. It says what would be lost, asks (unless `--yes`),
//! and records the request on the Member (`spec.requests.replace`); the leader
//! carries it out. `herd member skip-notify`: drop a pending notify that
//! cannot be delivered.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{Context, bail};
use herd_client::Client;
use herd_core::Resource;
use herd_core::kinds::{AppSpec, MemberSpec, NodeSpec};

pub async fn replace(client: &Client, name: &str, yes: bool) -> anyhow::Result<()> {
    let member = client.get::<MemberSpec>(name).await?;
    let cluster = client.get::<herd_core::kinds::AppClusterSpec>(&member.spec.cluster).await?;
    let app = client.get::<AppSpec>(&cluster.spec.app_ref).await?;
    let volumes: Vec<String> = app
        .spec
        .role(&member.spec.role)
        .map(|r| r.run.persistent_volumes().map(str::to_string).collect())
        .unwrap_or_default();
    let node = member.spec.node.clone().unwrap_or_else(|| "no node".into());
    let state = match client.get::<NodeSpec>(&node).await {
        Ok(n) if n.status.ready => "Ready",
        Ok(_) => "NotReady",
        Err(_) => "unknown",
    };
    println!("Member {name} (role {}) is on node {node} ({state}).", member.spec.role);
    if volumes.is_empty() {
        println!("It keeps no persistent data: it is set up afresh on another node.");
    } else {
        println!(
            "It is recreated on another node with empty volumes: {} (what they hold on {node} is lost).",
            volumes.join(", ")
        );
    }
    if !yes {
        if !std::io::stdin().is_terminal() {
            bail!("not replaced: confirm with --yes (stdin is not a terminal to ask on)");
        }
        print!("Replace {name}? [y/N] ");
        std::io::stdout().flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            bail!("not replaced");
        }
    }
    // A merge patch: the member's status, written all the while, does not
    // stand in its way.
    let asked = herd_core::Timestamp::from_system_time(std::time::SystemTime::now());
    let patch = serde_json::json!({"spec": {"requests": {"replace": asked}}});
    client.patch_value(MemberSpec::PLURAL, name, &patch).await.context("requesting the replacement")?;
    println!("member/{name}: replacement requested; follow it with `herd describe member {name}`");
    Ok(())
}

/// Drops member `name`'s first pending notify (every one, with `all`) and
/// says what is still pending.
pub async fn skip_notify(client: &Client, name: &str, all: bool) -> anyhow::Result<()> {
    let before = client.get::<MemberSpec>(name).await?;
    let pending: Vec<String> =
        before.status.state_detail.pending_notify_cmds.iter().map(|n| n.arguments.join(" ")).collect();
    let after = client.skip_notify(name, all).await?;
    let skipped = pending.len() - after.status.state_detail.pending_notify_cmds.len();
    for arguments in pending.iter().take(skipped) {
        println!("member/{name}: skipped `{arguments}`");
    }
    let left = after.status.state_detail.pending_notify_cmds.len();
    if left > 0 {
        println!("member/{name}: {left} notify(ies) still pending (`herd describe member {name}`)");
    }
    Ok(())
}
