//! The floors the app-cluster benchmarks measure beside herd: a member's
//! own work done directly, without a control plane.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::bail;

/// The floor of a member's start: `run` started and `setup` run with
/// `--configure` directly (in `dir`, as `HERD_VOLUME_HERD`); the time it
/// took, the member's process killed after.
pub fn start_and_set_up(dir: &Path, setup: &str, run: [&str; 2]) -> anyhow::Result<Duration> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("setup.sh"), setup)?;
    let started = Instant::now();
    let mut member = Command::new(run[0]).arg(run[1]).stdin(Stdio::null()).spawn()?;
    let configured =
        Command::new("sh").arg(dir.join("setup.sh")).arg("--configure").env("HERD_VOLUME_HERD", dir).status()?;
    let took = started.elapsed();
    let _ = member.kill();
    let _ = member.wait();
    if !configured.success() {
        bail!("the setup script failed when run directly");
    }
    Ok(took)
}
