//! `herd top nodes|members`: what each node's members use (as their
//! cgroups count it) and request, against what the node has.

use herd_client::Client;
use herd_core::kinds::{MemberSpec, NodeSpec};
use herd_core::quantity::{Bytes, Millicores};
use herd_core::usage::{self, MemberUse, NodeUse};

use crate::cli::TopWhat;
use crate::output::plain_table;

pub async fn top(client: &Client, what: TopWhat) -> anyhow::Result<()> {
    let nodes = client.list::<NodeSpec>("").await?;
    let members = client.list::<MemberSpec>("").await?;
    let table = match what {
        TopWhat::Nodes => nodes_table(&usage::nodes(&nodes, &members)),
        TopWhat::Members => members_table(&usage::members(&nodes, &members)),
    };
    println!("{table}");
    Ok(())
}

/// `650m (32%)`: an amount, and its share of `of` when there is one.
fn with_share(shown: String, part: u64, of: Option<u64>) -> String {
    match of.and_then(|of| usage::percent(part, of)) {
        Some(percent) => format!("{shown} ({percent}%)"),
        None => shown,
    }
}

fn nodes_table(rows: &[NodeUse]) -> String {
    let header = ["NAME", "STATUS", "CPU", "MEMORY", "CPU-REQUESTS", "MEMORY-REQUESTS", "MEMBERS"];
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            let cpu_of = row.allocatable.map(|a| a.cpu.0);
            let memory_of = row.allocatable.map(|a| a.memory.0);
            vec![
                row.node.clone(),
                if row.ready { "Ready" } else { "NotReady" }.to_string(),
                with_share(row.cpu.to_string(), row.cpu.0, cpu_of),
                with_share(row.memory.approximate(), row.memory.0, memory_of),
                with_share(row.requested.cpu.to_string(), row.requested.cpu.0, cpu_of),
                with_share(row.requested.memory.approximate(), row.requested.memory.0, memory_of),
                row.members.to_string(),
            ]
        })
        .collect();
    plain_table(Some(header.to_vec()), rows.into_iter())
}

fn members_table(rows: &[MemberUse]) -> String {
    let header = ["NAME", "NODE", "CPU", "MEMORY", "CPU-REQUEST", "MEMORY-REQUEST"];
    let or_dash = |value: Option<String>| value.unwrap_or_else(|| "-".into());
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            let request = row.requested.filter(|r| !r.is_zero());
            vec![
                row.member.clone(),
                row.node.clone(),
                if row.running { or_dash(row.cpu.map(|c: Millicores| c.to_string())) } else { "stopped".into() },
                or_dash(row.memory.map(|m: Bytes| m.approximate())),
                or_dash(request.map(|r| r.cpu.to_string())),
                or_dash(request.map(|r| r.memory.approximate())),
            ]
        })
        .collect();
    plain_table(Some(header.to_vec()), rows.into_iter())
}
