//! `herd node volumes NAME`: what a node's data dir holds (volumes and
//! partial copies), each with what owns it, so that space left behind by
//! failed or abandoned copies can be found and removed; and `herd node
//! modify NAME --role R`: a role change under the pool's rules.

use comfy_table::{Table, presets};
use herd_client::Client;
use herd_core::api::{NodeRoleRequest, StoredKind, StoredVolume};
use herd_core::kinds::NodeRole;
use herd_core::units::human_bytes;

use crate::cli::OutputFormat;
use crate::output;

pub async fn modify(
    client: &Client,
    node: &str,
    role: Option<NodeRole>,
    master_capable: Option<bool>,
    auto_promote: bool,
) -> anyhow::Result<()> {
    let request = NodeRoleRequest { role, master_capable, auto_promote };
    let answer = client.change_node_role(node, &request).await?;
    if answer.changed.is_empty() {
        println!("node/{node} unchanged");
    }
    for changed in &answer.changed {
        let role = serde_json::to_value(changed.role)?;
        let role = role.as_str().unwrap_or_default();
        let capable = if changed.master_capable { "" } else { ", not master capable" };
        println!("node/{} {role}{capable} ({})", changed.name, changed.why);
    }
    Ok(())
}

pub async fn volumes(client: &Client, node: &str, format: OutputFormat) -> anyhow::Result<()> {
    let stored = client.node_volumes(node).await?;
    match format {
        OutputFormat::Table | OutputFormat::Wide => {
            // A fresh name: one of an earlier Command would be taken (and
            // `herd apply` of it would change nothing).
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            println!("{}", render(node, &stored, &now.as_secs().to_string()));
            Ok(())
        }
        OutputFormat::Name => Err(crate::output::no_names("herd node volumes")),
        OutputFormat::Json | OutputFormat::Yaml | OutputFormat::JsonPath(_) => {
            output::print("StoredVolumeList", &serde_json::to_value(&stored)?, &[], &format)
        }
    }
}

/// A row per volume or partial copy, then how to remove what nothing owns.
/// The node's volumes as a table; what nothing owns gets the DeleteVolume
/// that removes it, named with `suffix` (so the name is not taken).
fn render(node: &str, stored: &[StoredVolume], suffix: &str) -> String {
    if stored.is_empty() {
        return format!("node {node} holds no volumes");
    }
    let mut table = Table::new();
    table.load_preset(presets::NOTHING);
    table.set_header(["MEMBER", "VOLUME", "KIND", "SIZE", "OWNER"]);
    for entry in stored {
        let kind = match entry.kind {
            StoredKind::Volume => "volume",
            StoredKind::Staging => "partial copy",
        };
        let owner = entry.owner.clone().unwrap_or_else(|| "none".into());
        table.add_row([entry.member.clone(), entry.volume.clone(), kind.into(), human_bytes(entry.bytes), owner]);
    }
    let rows: Vec<String> = table.lines().map(|l| l.strip_prefix(' ').unwrap_or(&l).trim_end().to_string()).collect();
    let mut out = rows.join("\n");
    if let Some(orphan) = stored.iter().find(|e| e.owner.is_none()) {
        out += &format!(
            "\n\nNothing owns the rows marked none. A DeleteVolume Command removes a volume and its partial copy:\n  \
             apiVersion: herd/v1\n  kind: Command\n  metadata: {{name: delete-{m}-{v}-{suffix}}}\n  \
             spec: {{node: {node}, action: {{type: DeleteVolume, member: {m}, volume: {v}}}}}",
            m = orphan.member,
            v = orphan.volume
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_show_the_owner_and_how_to_remove_what_nothing_owns() {
        let entry = |volume: &str, kind, owner: Option<&str>| StoredVolume {
            member: "m1".into(),
            volume: volume.into(),
            kind,
            bytes: 268_000_000,
            member_known: owner.is_some(),
            member_running: false,
            owner: owner.map(str::to_string),
        };
        let text = render(
            "node-2",
            &[entry("data", StoredKind::Volume, Some("member m1 (stopped)")), entry("logs", StoredKind::Staging, None)],
            "1796350000",
        );
        assert!(text.contains("m1      data    volume        268 MB  member m1 (stopped)"), "{text}");
        assert!(text.contains("m1      logs    partial copy  268 MB  none"), "{text}");
        assert!(
            text.contains("spec: {node: node-2, action: {type: DeleteVolume, member: m1, volume: logs}}"),
            "{text}"
        );
        assert!(text.contains("metadata: {name: delete-m1-logs-1796350000}"), "a name not taken: {text}");
        assert_eq!(render("node-2", &[], "1"), "node node-2 holds no volumes");
    }
}
