//! `herd cluster master-failover`, run on a master candidate whose master
//! (and, in SQLite mode, the store with it) is gone, as Ganeti's
//! `gnt-cluster master-failover`: it asks every node's agent which master
//! it follows and whether it still reaches it (with this node's own
//! certificate), lets `herd_core::failover::decide` judge the vote, starts
//! a server from the freshest configuration copy among the candidates at
//! the new term, tells every agent to follow it, and then serves. The
//! grants it shows are signed with the key the admin token derives, as
//! the server's are, so the operator's admin token is needed.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use herd_client::PeerClient;
use herd_core::configuration::Configuration;
use herd_core::failover::{Announcement, Answer, decide};
use herd_core::grant::{Access, Grant, Holder};
use herd_core::kinds::NodeSpec;
use herd_core::{Resource, Timestamp};
use herd_tls::ServingIdentity;
use herd_tls::grant::GrantSigner;
use serde_json::Value;
use tokio::task::JoinSet;

use super::modes::{serve_until_signal, start_server};
use crate::cli::FailoverArgs;

/// How long the grants this command signs last.
const GRANT_LIFETIME: Duration = Duration::from_secs(300);

/// What this node knows to ask the others: its name, its certificate,
/// and every node's agent address from its configuration copy.
struct Local {
    node: String,
    identity: ServingIdentity,
    agents: BTreeMap<String, Option<String>>,
}

fn local(args: &FailoverArgs) -> anyhow::Result<Local> {
    let node = args.server.node.clone().context("--node NAME is needed: the master candidate this runs on")?;
    let dir = &args.agent_data_dir;
    let identity = herd_agent::node_cert::NodeCertStore::open(dir, &node)?
        .identity()
        .with_context(|| format!("{} holds no certificate of node {node}", dir.display()))?;
    let path = dir.join("config.json");
    let bytes = std::fs::read(&path).with_context(|| {
        format!("reading {}: is {node} a master candidate (only they keep the copy)?", path.display())
    })?;
    let copy: Configuration =
        serde_json::from_slice(&bytes).with_context(|| format!("{} does not read", path.display()))?;
    let agents = copy
        .objects
        .iter()
        .filter(|o| o.get("kind").and_then(Value::as_str) == Some(NodeSpec::KIND))
        .filter(|o| o.pointer("/spec/role").and_then(Value::as_str) != Some("offline"))
        .filter_map(|o| {
            let name = o.pointer("/metadata/name")?.as_str()?.to_string();
            Some((name, o.pointer("/status/address").and_then(Value::as_str).map(str::to_string)))
        })
        .collect();
    Ok(Local { node, identity, agents })
}

fn signed(signer: &GrantSigner, me: &str, node: &str, access: Access) -> String {
    signer.sign(&Grant {
        holder: Holder::Node(me.to_string()),
        node: node.to_string(),
        access,
        expires: Timestamp::from_system_time(SystemTime::now() + GRANT_LIFETIME),
        purpose: format!("master failover run on node {me}"),
        attempt: None,
    })
}

/// The agent of `node` at `address`, holding `grants`.
fn agent(local: &Local, node: &str, address: Option<&String>, grants: &[String]) -> Result<PeerClient, String> {
    let address = address.ok_or("its address is not known")?;
    PeerClient::new(address, node, &local.identity, grants).map_err(|e| e.to_string())
}

pub async fn master_failover(args: FailoverArgs) -> anyhow::Result<()> {
    let admin_token = args.server.admin_token.clone().context(
        "the admin token is needed (--admin-token or HERD_ADMIN_TOKEN): the grants shown to agents are signed with it",
    )?;
    let signer = GrantSigner::derive(&admin_token)?;
    let local = local(&args)?;
    let me = local.node.clone();

    let mut asking = JoinSet::new();
    for (node, address) in &local.agents {
        let grants = [signed(&signer, &me, node, Access::ReadConfiguration)];
        let client = agent(&local, node, address.as_ref(), &grants);
        let node = node.clone();
        asking.spawn(async move {
            let answer = match client {
                Ok(client) => match client.master_view().await {
                    Ok(view) => Answer::Seen(view),
                    Err(error) => Answer::Unreachable(error.to_string()),
                },
                Err(why) => Answer::Unreachable(why),
            };
            (node, answer)
        });
    }
    let mut answers = BTreeMap::new();
    while let Some(answered) = asking.join_next().await {
        let (node, answer) = answered?;
        match &answer {
            Answer::Seen(view) => println!(
                "{node}: follows {} (term {}), {}, configuration {}",
                view.master_urls.join(", "),
                view.term,
                if view.master_reachable { "reaches it" } else { "lost it" },
                view.serial.map_or("none".to_string(), |s| format!("serial {s}"))
            ),
            Answer::Unreachable(why) => println!("{node}: did not answer: {why}"),
        }
        answers.insert(node, answer);
    }
    let won = match decide(&me, &answers, args.no_voting) {
        Ok(won) => won,
        Err(refusal) => bail!("master failover refused: {refusal}"),
    };
    for warning in &won.warnings {
        eprintln!("warning: {warning}");
    }
    println!(
        "the vote is won ({} of {} nodes agree); starting from node {}'s configuration (serial {}) at term {}",
        won.agreeing.len(),
        answers.len(),
        won.source,
        won.serial,
        won.term
    );
    let grants = [signed(&signer, &me, &won.source, Access::ReadConfiguration)];
    let source = agent(&local, &won.source, local.agents.get(&won.source).and_then(Option::as_ref), &grants)
        .map_err(anyhow::Error::msg)?;
    let configuration =
        source.configuration().await.with_context(|| format!("reading node {}'s configuration copy", won.source))?;

    let restore = herd_server::restore::Restore { configuration, term: won.term };
    let server = start_server(args.server.clone(), Some(restore)).await?;
    let announcement = Announcement { term: won.term, master_urls: vec![server.url().to_string()] };
    for (node, address) in &local.agents {
        let grants = [signed(&signer, &me, node, Access::AdoptMaster { term: won.term })];
        let told = match agent(&local, node, address.as_ref(), &grants) {
            Ok(client) => client.announce(&announcement).await.map_err(|e| e.to_string()),
            Err(why) => Err(why),
        };
        match told {
            Ok(()) => println!("{node}: follows the new master"),
            Err(why) => println!("{node}: not told ({why}); it learns of the new master when it reaches the old one"),
        }
    }
    serve_until_signal(server).await
}
