//! Printing objects: tables (with a wider variant), JSON and YAML.

use std::time::SystemTime;

use comfy_table::{Table, presets};
use herd_core::Timestamp;
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

struct Column {
    header: &'static str,
    wide_only: bool,
    cell: fn(&Value) -> String,
}

const fn col(header: &'static str, cell: fn(&Value) -> String) -> Column {
    Column { header, wide_only: false, cell }
}

const fn wide(header: &'static str, cell: fn(&Value) -> String) -> Column {
    Column { header, wide_only: true, cell }
}

fn columns(kind: &str) -> Vec<Column> {
    let name = col("NAME", |v| text(v, "/metadata/name"));
    let age = col("AGE", |v| age_of(v, "/metadata/creationTimestamp"));
    match kind {
        "Node" => vec![
            name,
            col("STATUS", |v| {
                let ready = if v.pointer("/status/ready") == Some(&Value::Bool(true)) { "Ready" } else { "NotReady" };
                if v.pointer("/spec/unschedulable") == Some(&Value::Bool(true)) {
                    format!("{ready},SchedulingDisabled")
                } else {
                    ready.into()
                }
            }),
            col("ROLE", |v| {
                let role = text(v, "/spec/role");
                let role = if role.is_empty() { "regular".into() } else { role };
                if v.pointer("/status/master") == Some(&Value::Bool(true)) { format!("{role},master") } else { role }
            }),
            col("ADDRESS", |v| text(v, "/status/address")),
            age,
            wide("MASTER-CAPABLE", |v| text(v, "/spec/masterCapable")),
            wide("LAST-HEARTBEAT", |v| age_of(v, "/status/lastHeartbeat")),
            wide("AGENT-BOOT-ID", |v| text(v, "/status/agentBootId")),
            wide("VERSION", |v| text(v, "/status/agentVersion")),
            wide("LABELS", labels),
        ],
        "Event" => vec![
            col("LAST SEEN", |v| age_of(v, "/spec/lastTimestamp")),
            col("TYPE", |v| text(v, "/spec/type")),
            col("REASON", |v| text(v, "/spec/reason")),
            col("OBJECT", |v| {
                format!(
                    "{}/{}",
                    text(v, "/spec/involvedObject/kind").to_ascii_lowercase(),
                    text(v, "/spec/involvedObject/name")
                )
            }),
            col("COUNT", |v| text(v, "/spec/count")),
            col("MESSAGE", |v| text(v, "/spec/message")),
            wide("SOURCE", |v| text(v, "/spec/source")),
            wide("FIRST SEEN", |v| age_of(v, "/spec/firstTimestamp")),
        ],
        "ClusterConfig" => vec![
            name,
            col("CANDIDATE-POOL", |v| text(v, "/spec/candidatePoolSize")),
            col("HEARTBEAT", |v| text(v, "/spec/heartbeatPeriod")),
            col("GRACE", |v| text(v, "/spec/nodeGracePeriod")),
            age,
            wide("LEASE", |v| text(v, "/spec/leaderElection/leaseDuration")),
            wide("RENEW-DEADLINE", |v| text(v, "/spec/leaderElection/renewDeadline")),
            wide("RETRY", |v| text(v, "/spec/leaderElection/retryPeriod")),
        ],
        "Lease" => vec![
            name,
            col("HOLDER", |v| text(v, "/spec/holderIdentity")),
            col("DURATION", |v| format!("{}s", text(v, "/spec/leaseDurationSeconds"))),
            col("RENEWED", |v| age_of(v, "/spec/renewTime")),
            col("TRANSITIONS", |v| text(v, "/spec/leaseTransitions")),
        ],
        "Command" => vec![
            name,
            col("NODE", |v| text(v, "/spec/node")),
            col("ACTION", |v| format!("{} {}", text(v, "/spec/action/type"), text(v, "/spec/action/member"))),
            col("MANAGEMENT", |v| {
                let state = text(v, "/status/stateByManagement");
                if state.is_empty() { "CREATED".into() } else { state }
            }),
            col("AGENT", |v| text(v, "/status/stateByAgent")),
            col("ATTEMPT", |v| text(v, "/status/issued/attempt")),
            col("RETRIES", |v| text(v, "/status/retryCount")),
            age,
            wide("TERM", |v| text(v, "/status/issued/term")),
            wide("REASON", |v| text(v, "/status/reason")),
            wide("ANSWER", |v| text(v, "/status/answer/message")),
        ],
        "Replica" => vec![
            name,
            col("URL", |v| text(v, "/spec/url")),
            col("STARTED", |v| age_of(v, "/status/startedAt")),
            col("LAST SEEN", |v| age_of(v, "/status/lastSeen")),
            col("STOPPED", |v| age_of(v, "/status/stoppedAt")),
            wide("VERSION", |v| text(v, "/status/version")),
        ],
        "App" => vec![
            name,
            col("ROLES", |v| {
                let roles = v.pointer("/spec/roles").and_then(Value::as_array).cloned().unwrap_or_default();
                roles.iter().map(|r| text(r, "/name")).collect::<Vec<_>>().join(",")
            }),
            age,
            wide("DESCRIPTION", |v| text(v, "/spec/description")),
        ],
        "AppCluster" => vec![
            name,
            col("APP", |v| text(v, "/spec/appRef")),
            col("STATE", |v| {
                let state = text(v, "/status/state");
                if state.is_empty() { "creating".into() } else { state }
            }),
            col("MEMBERS", |v| {
                let roles = v.pointer("/spec/roles").and_then(Value::as_array).cloned().unwrap_or_default();
                roles
                    .iter()
                    .map(|r| format!("{}={}", text(r, "/name"), text(r, "/members")))
                    .collect::<Vec<_>>()
                    .join(",")
            }),
            col("ROLLUP", |v| {
                let rollup =
                    v.pointer("/status/memberStateRollup").and_then(Value::as_object).cloned().unwrap_or_default();
                let on: Vec<_> =
                    rollup.iter().filter(|(_, set)| **set == Value::Bool(true)).map(|(k, _)| k.clone()).collect();
                if on.is_empty() { "-".into() } else { on.join(",") }
            }),
            age,
        ],
        "Member" => vec![
            name,
            col("CLUSTER", |v| text(v, "/spec/cluster")),
            col("ROLE", |v| text(v, "/spec/role")),
            col("STATE", |v| {
                let state = text(v, "/status/state");
                let state = if state.is_empty() { "createPending".into() } else { state };
                match v.pointer("/status/stateDetail/crashLoop") {
                    Some(crash) => format!("{state} (crash loop, {} runs)", text(crash, "/runs")),
                    None => state,
                }
            }),
            col("READY", |v| {
                if v.pointer("/status/ready") == Some(&Value::Bool(true)) { "yes" } else { "no" }.to_string()
            }),
            col("NODE", |v| text(v, "/spec/node")),
            col("INSTANCE", |v| {
                let configured = text(v, "/status/stateDetail/lastConfiguredInstance");
                if configured.is_empty() { text(v, "/status/stateDetail/configuringInstance") } else { configured }
            }),
            age,
            wide("LAST-KNOWN", |v| text(v, "/status/stateDetail/lastKnownState")),
            wide("REASON", |v| {
                let why = text(v, "/status/notReadyReason");
                if why.is_empty() { text(v, "/status/reason") } else { why }
            }),
        ],
        "DisruptionBudget" => vec![
            name,
            col("SELECTOR", |v| text(v, "/spec/selector")),
            col("MIN-AVAILABLE", |v| or_dash(text(v, "/spec/minAvailable"))),
            col("MAX-UNAVAILABLE", |v| or_dash(text(v, "/spec/maxUnavailable"))),
            col("HEALTHY", |v| {
                format!("{}/{}", number(v, "/status/currentHealthy"), number(v, "/status/expectedMembers"))
            }),
            col("ALLOWED", |v| number(v, "/status/disruptionsAllowed")),
            age,
            wide("DESIRED", |v| number(v, "/status/desiredHealthy")),
            wide("UNHEALTHY", |v| {
                let unhealthy = v.pointer("/status/unhealthy").and_then(Value::as_array).cloned().unwrap_or_default();
                or_dash(unhealthy.iter().map(|u| text(u, "/name")).collect::<Vec<_>>().join(","))
            }),
        ],
        "Operation" => vec![
            name,
            col("ACTION", |v| {
                let target = match text(v, "/spec/action/type").as_str() {
                    "Restart" => format!("{}/{}", text(v, "/spec/action/cluster"), text(v, "/spec/action/role")),
                    _ => text(v, "/spec/action/node"),
                };
                format!("{} {target}", text(v, "/spec/action/type"))
            }),
            col("PHASE", |v| {
                let phase = text(v, "/status/phase");
                if phase.is_empty() { "Pending".into() } else { phase }
            }),
            col("DONE", |v| format!("{}/{}", number(v, "/status/done"), number(v, "/status/total"))),
            col("BLOCKER", |v| or_dash(text(v, "/status/blocker/message"))),
            age,
            wide("DEADLINE", |v| or_dash(text(v, "/spec/deadline"))),
            wide("MESSAGE", |v| or_dash(text(v, "/status/message"))),
        ],
        _ => vec![name, age, wide("LABELS", labels)],
    }
}

pub fn table(kind: &str, items: &[Value], wide_output: bool) -> String {
    render(kind, items, wide_output, true)
}

fn render(kind: &str, items: &[Value], wide_output: bool, header: bool) -> String {
    let columns: Vec<Column> = columns(kind).into_iter().filter(|c| wide_output || !c.wide_only).collect();
    let mut table = Table::new();
    table.load_preset(presets::NOTHING);
    if header {
        table.set_header(columns.iter().map(|c| c.header));
    }
    for item in items {
        table.add_row(columns.iter().map(|c| (c.cell)(item)));
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
