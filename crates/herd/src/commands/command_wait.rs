//! `herd command wait NAME`: follows a Command until it is settled, with a
//! progress bar of what its agent reports while it works (a copy's bytes
//! staged of the volume's size; a migration's, volume by volume).

use std::time::Duration;

use anyhow::bail;
use herd_client::Client;
use herd_core::kinds::{CommandSpec, ManagementState};

/// How often the Command is read.
const LOOK_EVERY: Duration = Duration::from_millis(500);

pub async fn wait(client: &Client, name: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let bar = super::operation::progress_bar("{spinner} [{bar:30}] {bytes}/{total_bytes} {wide_msg}");
    loop {
        let command = client.get::<CommandSpec>(name).await?;
        let status = &command.status;
        let number = |key: &str| status.progress.get(key).and_then(|v| v.parse::<u64>().ok());
        if let Some(total) = number("totalBytes") {
            bar.set_length(total);
        }
        bar.set_position(number("bytes").unwrap_or(0));
        let what = status.progress.get("volume").map_or(String::new(), |v| format!("volume {v}; "));
        let agent = status.state_by_agent.map_or("not taken up yet".to_string(), |s| format!("{s:?}"));
        bar.set_message(format!("{what}{} ({agent})", status.state_by_management));
        if status.state_by_management.is_settled() {
            bar.finish_and_clear();
            let answer = status.answer.as_ref().map_or(status.reason.as_str(), |a| a.message.as_str());
            let action = command.spec.action.type_name();
            if status.state_by_management == ManagementState::Completed {
                println!("command/{name} completed: {action} on {}: {answer}", command.spec.node);
                return Ok(());
            }
            bail!("command/{name} {}: {action} on {}: {answer}", status.state_by_management, command.spec.node);
        }
        if tokio::time::Instant::now() >= deadline {
            bar.finish_and_clear();
            bail!(
                "command/{name} is not settled after {}: {}",
                humantime::format_duration(timeout),
                status.state_by_management
            );
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}
