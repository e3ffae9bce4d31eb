//! Printing objects: tables (with a wider variant), JSON and YAML.

use std::time::SystemTime;

use comfy_table::{Table, presets};
use herd_core::Timestamp;
use herd_core::descriptor::{Cell, Column};
pub use herd_core::units::short_duration;
use serde_json::Value;

use crate::cli::OutputFormat;

fn text(value: &Value, pointer: &str) -> String {
    match value.pointer(pointer) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// A count from the status, 0 when the status does not have it yet.
fn number(value: &Value, pointer: &str) -> String {
    value.pointer(pointer).and_then(Value::as_u64).unwrap_or(0).to_string()
}

fn or_dash(text: String) -> String {
    if text.is_empty() { "-".into() } else { text }
}

fn age_of(value: &Value, pointer: &str) -> String {
    Timestamp::parse(&text(value, pointer))
        .map(|t| short_duration(SystemTime::now().duration_since(t.system_time()).unwrap_or_default()))
        .unwrap_or_default()
}

fn labels(value: &Value) -> String {
    value
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect::<Vec<_>>().join(","))
        .unwrap_or_default()
}

/// What `cell` shows of `value` (the dashboard renders the same cells).
fn cell(cell: &Cell, value: &Value) -> String {
    let each = |path: &str| value.pointer(path).and_then(Value::as_array).cloned().unwrap_or_default();
    match *cell {
        Cell::Text { path } => text(value, path),
        Cell::TextOr { path, otherwise } => {
            let shown = text(value, path);
            if shown.is_empty() { otherwise.to_string() } else { shown }
        }
        Cell::FirstOf { paths } => paths.iter().map(|p| text(value, p)).find(|t| !t.is_empty()).unwrap_or_default(),
        Cell::Count { path } => number(value, path),
        Cell::Ratio { a, b } => format!("{}/{}", number(value, a), number(value, b)),
        Cell::Pair { a, between, b } => format!("{}{between}{}", text(value, a), text(value, b)),
        Cell::Seconds { path } => format!("{}s", text(value, path)),
        Cell::Age { path } => age_of(value, path),
        Cell::YesNo { path } => if value.pointer(path) == Some(&Value::Bool(true)) { "yes" } else { "no" }.to_string(),
        Cell::Each { path, field } => {
            or_dash(each(path).iter().map(|item| text(item, field)).collect::<Vec<_>>().join(","))
        }
        Cell::EachPair { path, key, value: of } => each(path)
            .iter()
            .map(|item| format!("{}={}", text(item, key), text(item, of)))
            .collect::<Vec<_>>()
            .join(","),
        Cell::TrueKeys { path } => {
            let object = value.pointer(path).and_then(Value::as_object).cloned().unwrap_or_default();
            let on: Vec<_> =
                object.iter().filter(|(_, set)| **set == Value::Bool(true)).map(|(k, _)| k.clone()).collect();
            if on.is_empty() { "-".into() } else { on.join(",") }
        }
        Cell::Labels => labels(value),
        Cell::NodeStatus => {
            let ready = if value.pointer("/status/ready") == Some(&Value::Bool(true)) { "Ready" } else { "NotReady" };
            if value.pointer("/spec/unschedulable") == Some(&Value::Bool(true)) {
                format!("{ready},SchedulingDisabled")
            } else {
                ready.into()
            }
        }
        Cell::NodeRole => {
            let role = text(value, "/spec/role");
            let role = if role.is_empty() { "regular".into() } else { role };
            if value.pointer("/status/master") == Some(&Value::Bool(true)) { format!("{role},master") } else { role }
        }
        Cell::MemberState => {
            let state = text(value, "/status/state");
            let state = if state.is_empty() { "createPending".into() } else { state };
            match value.pointer("/status/stateDetail/crashLoop") {
                Some(crash) => format!("{state} (crash loop, {} runs)", text(crash, "/runs")),
                None => state,
            }
        }
        Cell::EventObject => format!(
            "{}/{}",
            text(value, "/spec/involvedObject/kind").to_ascii_lowercase(),
            text(value, "/spec/involvedObject/name")
        ),
        Cell::OperationAction => {
            let target = match text(value, "/spec/action/type").as_str() {
                "Restart" | "Switchover" => {
                    format!("{}/{}", text(value, "/spec/action/cluster"), text(value, "/spec/action/role"))
                }
                "Upgrade" => {
                    format!(
                        "{} to revision {}",
                        text(value, "/spec/action/cluster"),
                        text(value, "/spec/action/toRevision")
                    )
                }
                _ => text(value, "/spec/action/node"),
            };
            format!("{} {target}", text(value, "/spec/action/type"))
        }
    }
}

/// The columns of `kind`'s table: its descriptor's, or the name, age and
/// labels of a kind this CLI does not know.
fn columns(kind: &str) -> &'static [Column] {
    herd_core::kinds::by_kind(kind).map_or(herd_core::descriptor::DEFAULT_COLUMNS, |d| d.columns)
}

pub fn table(kind: &str, items: &[Value], wide_output: bool) -> String {
    render(kind, items, wide_output, true)
}

fn render(kind: &str, items: &[Value], wide_output: bool, header: bool) -> String {
    let columns: Vec<&Column> = columns(kind).iter().filter(|c| wide_output || !c.wide).collect();
    let header = header.then(|| columns.iter().map(|c| c.header).collect());
    plain_table(header, items.iter().map(|item| columns.iter().map(|c| cell(&c.cell, item)).collect()))
}

/// Rows in aligned columns with no borders, as every table herd prints.
pub fn plain_table(header: Option<Vec<&str>>, rows: impl Iterator<Item = Vec<String>>) -> String {
    let mut table = Table::new();
    table.load_preset(presets::NOTHING);
    if let Some(header) = header {
        table.set_header(header);
    }
    for row in rows {
        table.add_row(row);
    }
    table.lines().map(|l| l.strip_prefix(' ').unwrap_or(&l).trim_end().to_string()).collect::<Vec<_>>().join("\n")
}

/// Prints one object or a list in the chosen format.
pub fn print(kind: &str, value: &Value, items: &[Value], format: &OutputFormat) -> anyhow::Result<()> {
    match format {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(value)?),
        OutputFormat::Yaml => {
            let text = serde_saphyr::to_string(value)?;
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
        }
        OutputFormat::Table | OutputFormat::Wide => {
            if items.is_empty() {
                eprintln!("No {kind} objects found.");
            } else {
                println!("{}", table(kind, items, *format == OutputFormat::Wide));
            }
        }
        OutputFormat::JsonPath(template) => print!("{}", template.render(value)),
        OutputFormat::Name => {
            let kind = kind.to_ascii_lowercase();
            for item in items {
                println!("{kind}/{}", text(item, "/metadata/name"));
            }
        }
    }
    Ok(())
}

/// One changed object of a watch, in the chosen format (a table row
/// without its header).
pub fn print_change(kind: &str, object: &Value, format: &OutputFormat) -> anyhow::Result<()> {
    match format {
        OutputFormat::Table | OutputFormat::Wide => {
            println!("{}", render(kind, std::slice::from_ref(object), *format == OutputFormat::Wide, false))
        }
        OutputFormat::Yaml => print!("---\n{}", serde_saphyr::to_string(object)?),
        OutputFormat::Json | OutputFormat::Name => print(kind, object, std::slice::from_ref(object), format)?,
        OutputFormat::JsonPath(template) => println!("{}", template.render(object)),
    }
    Ok(())
}

/// For commands whose output is not a list of objects.
pub fn no_names(command: &str) -> anyhow::Error {
    anyhow::anyhow!("-o name lists objects (herd get, herd events); {command} has none: use table, wide, json or yaml")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn node_table() {
        let node = json!({"metadata": {"name": "n1", "labels": {"zone": "a"}}, "spec": {"role": "candidate"}, "status": {"ready": true, "address": "127.0.0.1:9"}});
        let out = table("Node", std::slice::from_ref(&node), false);
        assert!(
            out.contains("NAME") && out.contains("n1") && out.contains("Ready") && out.contains("candidate"),
            "{out}"
        );
        assert!(!out.contains("zone=a"));
        assert!(table("Node", &[node], true).contains("zone=a"));
    }
}
