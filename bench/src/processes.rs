//! What the benchmarks that run real `herd` processes share: finding the
//! binary, starting servers and agents (killed on drop), reading options
//! from the environment, and polling until something holds.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

pub const ADMIN: &str = "bench-admin-token";
pub const JOIN: &str = "bench-join";

/// Children killed and reaped on drop.
pub struct Killed(pub Vec<Child>);

impl Drop for Killed {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The release `herd` beside this benchmark, or `HERD_BIN`.
pub fn herd_binary() -> anyhow::Result<PathBuf> {
    let herd = match std::env::var_os("HERD_BIN") {
        Some(path) => PathBuf::from(path),
        None => std::env::current_exe()?.with_file_name("herd"),
    };
    if !herd.exists() {
        bail!("{} not found: build it first (cargo build --release -p herd) or set HERD_BIN", herd.display());
    }
    Ok(herd)
}

/// Starts `herd ARGS --data-dir DIR`, its log (at warn, or at the level
/// `BENCH_HERD_LOG` names) appended to `DIR.log`; for a server, also the
/// URL it printed.
pub fn start(herd: &Path, args: &[&str], data_dir: &Path) -> anyhow::Result<(Child, String)> {
    start_in(None, herd, args, data_dir)
}

/// As [`start`], inside network namespace `netns` when given.
pub fn start_in(netns: Option<&str>, herd: &Path, args: &[&str], data_dir: &Path) -> anyhow::Result<(Child, String)> {
    let command = match netns {
        Some(netns) => {
            let mut command = Command::new("ip");
            command.args(["netns", "exec", netns]).arg(herd);
            command
        }
        None => Command::new(herd),
    };
    start_with(command, args, data_dir)
}

/// As [`start`], from `command`: `herd` (or what runs it) with the
/// environment the caller set.
pub fn start_with(mut command: Command, args: &[&str], data_dir: &Path) -> anyhow::Result<(Child, String)> {
    if let Some(parent) = data_dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data_dir.with_extension("log"))
        .with_context(|| format!("opening {}.log", data_dir.display()))?;
    let mut child = command
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .env("HERD_ADMIN_TOKEN", ADMIN)
        .env("HERD_JOIN_TOKEN", JOIN)
        .env("HERD_LOG", std::env::var("BENCH_HERD_LOG").unwrap_or("warn".into()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {:?}", command.get_program()))?;
    let mut line = String::new();
    if args[0] == "server" {
        let stdout = child.stdout.take().context("stdout")?;
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)?;
    }
    Ok((child, line.trim().rsplit(' ').next().unwrap_or_default().to_string()))
}

/// Polls `check` every 5 ms until it gives a value, for at most `timeout`.
pub async fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
