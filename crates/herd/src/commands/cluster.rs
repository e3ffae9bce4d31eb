//! `herd cluster status`: who leads, since when, and every replica on
//! record; `herd cluster verify`: what is wrong with the nodes' roles
//! (`herd_core::verify`).

use std::time::SystemTime;

use comfy_table::{Table, presets};
use herd_client::Client;
use herd_core::Timestamp;
use herd_core::api::ClusterStatus;
use herd_core::verify::Severity;

use crate::cli::OutputFormat;
use crate::output::{self, short_duration};

pub async fn status(client: &Client, format: OutputFormat) -> anyhow::Result<()> {
    let status = client.cluster_status().await?;
    match format {
        OutputFormat::Table | OutputFormat::Wide => {
            println!("{}", render(&status, Timestamp::from_system_time(SystemTime::now())));
            Ok(())
        }
        OutputFormat::Name => Err(crate::output::no_names("herd cluster status")),
        OutputFormat::Json | OutputFormat::Yaml | OutputFormat::JsonPath(_) => {
            output::print("ClusterStatus", &serde_json::to_value(&status)?, &[], &format)
        }
    }
}

/// Prints the findings; returns the exit code (0 clean, 1 warnings, 2 errors).
pub async fn verify(client: &Client, format: OutputFormat) -> anyhow::Result<i32> {
    let report = client.cluster_verify().await?;
    match format {
        OutputFormat::Table | OutputFormat::Wide => {
            for finding in &report.findings {
                let severity = match finding.severity {
                    Severity::Warning => "WARNING",
                    Severity::Error => "ERROR",
                };
                println!("{severity}: {}", finding.message);
            }
            println!(
                "{} of {} master candidates wanted (pool size {}); offline, not checked: {}",
                report.candidates,
                report.wanted_candidates,
                report.pool_size,
                if report.offline.is_empty() { "none".to_string() } else { report.offline.join(", ") }
            );
        }
        OutputFormat::Name => return Err(crate::output::no_names("herd cluster verify")),
        OutputFormat::Json | OutputFormat::Yaml | OutputFormat::JsonPath(_) => {
            output::print("ClusterVerify", &serde_json::to_value(&report)?, &[], &format)?;
        }
    }
    Ok(report.exit_code())
}

fn ago(time: Option<Timestamp>, now: Timestamp) -> String {
    time.map_or_else(|| "never".into(), |t| format!("{} ago", short_duration(t.age(now))))
}

/// The status as text: a header on the leader, then a row per replica.
fn render(status: &ClusterStatus, now: Timestamp) -> String {
    let mut out = String::new();
    match &status.leader {
        Some(leader) => {
            let since = leader.since.map_or_else(String::new, |t| format!(", since {t} ({})", ago(Some(t), now)));
            out += &format!("Leader:       {} (term {}{since})\n", leader.identity, leader.term);
            out += &format!(
                "Lease:        {}, {}s, renewed {}\n",
                status.lock_name,
                leader.lease_duration_seconds,
                ago(leader.renewed, now)
            );
        }
        None => out += &format!("Leader:       none (lease {} is free)\n", status.lock_name),
    }
    out += &format!("Transitions:  {}\n", status.lease_transitions);
    if let Some(superseded) = &status.superseded {
        out += &format!("Superseded:   {superseded}\n");
    }
    out += &format!("Answered by:  {}\n\n", status.served_by);
    let mut table = Table::new();
    table.load_preset(presets::NOTHING);
    table.set_header(["REPLICA", "STATE", "URL", "STARTED", "LAST SEEN", "VERSION"]);
    for replica in &status.replicas {
        table.add_row([
            replica.name.clone(),
            format!("{:?}", replica.state),
            replica.url.clone(),
            format!("{} ago", short_duration(replica.up_for.get())),
            format!("{} ago", short_duration(replica.silent_for.get())),
            replica.version.clone(),
        ]);
    }
    let rows: Vec<String> = table.lines().map(|l| l.strip_prefix(' ').unwrap_or(&l).trim_end().to_string()).collect();
    out + &rows.join("\n")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use herd_core::api::{LeaderInfo, ReplicaInfo};
    use herd_core::kinds::ReplicaState;

    use super::*;

    #[test]
    fn renders_the_leader_and_each_replica() {
        let now = Timestamp::from_system_time(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000));
        let before = |secs| Timestamp::from_system_time(now.system_time() - Duration::from_secs(secs));
        let replica = |name: &str, state| ReplicaInfo {
            name: name.into(),
            url: format!("http://{name}:7700"),
            state,
            started_at: before(600),
            last_seen: before(2),
            stopped_at: None,
            version: "0.1.0".into(),
            silent_for: herd_core::time::HumanDuration::from_secs(2),
            up_for: herd_core::time::HumanDuration::from_secs(600),
        };
        let status = ClusterStatus {
            served_by: "r2".into(),
            lock_name: "herd-leader".into(),
            leader: Some(LeaderInfo {
                identity: "r1".into(),
                term: 3,
                since: Some(before(300)),
                renewed: Some(before(1)),
                lease_duration_seconds: 15,
            }),
            lease_transitions: 3,
            replicas: vec![replica("r1", ReplicaState::Leading), replica("r2", ReplicaState::Gone)],
            superseded: None,
        };
        let text = render(&status, now);
        assert!(text.contains("Leader:       r1 (term 3, since 1970-01-12T13:41:40.000Z (5m ago))"), "{text}");
        assert!(text.contains("Lease:        herd-leader, 15s, renewed 1s ago"), "{text}");
        assert!(text.contains("r2       Gone     http://r2:7700"), "{text}");
        let free = ClusterStatus { leader: None, ..status };
        assert!(render(&free, now).contains("Leader:       none (lease herd-leader is free)"));
    }
}
