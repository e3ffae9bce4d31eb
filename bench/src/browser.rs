//! A real browser for the dashboard's tests and benchmark: Debian's
//! headless Chromium driven through chromedriver (WebDriver) by
//! fantoccini. chromedriver runs in a process group of its own, which is
//! killed on drop with the Chromium it started, also when a test fails;
//! the group's CPU time is what the dashboard costs the browser.

use std::collections::HashMap;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fantoccini::{Client, ClientBuilder};
use serde_json::{Value, json};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Whether Chromium and chromedriver are installed.
pub fn installed() -> bool {
    std::path::Path::new(CHROMIUM).exists() && std::path::Path::new(CHROMEDRIVER).exists()
}

struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        // The whole group: chromedriver and the Chromium it started.
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.0.wait();
    }
}

/// A headless Chromium with a fresh profile, ended on drop.
pub struct Chromium {
    pub client: Client,
    _profile: tempfile::TempDir,
    driver: Driver,
}

impl Chromium {
    /// Starts one trusting any certificate (the cluster CA is the
    /// caller's own) and reaching nothing but loopback.
    pub async fn start() -> anyhow::Result<Chromium> {
        use std::os::unix::process::CommandExt;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {CHROMEDRIVER}"))?;
        let driver = Driver(driver);
        let profile = tempfile::tempdir()?;
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1400,1000",
            &format!("--user-data-dir={}", profile.path().display()),
        ];
        let Value::Object(capabilities) = json!({
            "acceptInsecureCerts": true,
            "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
        }) else {
            bail!("capabilities are an object")
        };
        let url = format!("http://127.0.0.1:{port}");
        let mut last_error = String::new();
        for _ in 0..100 {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector).capabilities(capabilities.clone()).connect(&url).await {
                Ok(client) => return Ok(Chromium { client, _profile: profile, driver }),
                Err(error) => last_error = error.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("chromedriver did not start a browser: {last_error}")
    }

    /// CPU time (user and system, in clock ticks) that each process of
    /// chromedriver's group (it and the Chromium it started) has used.
    fn ticks_by_process(&self) -> HashMap<u32, u64> {
        let group = self.driver.0.id().to_string();
        let mut ticks = HashMap::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            // After the command's name (in parentheses): state, ppid, pgrp, ..., utime (14th), stime (15th).
            let Some((_, fields)) = stat.rsplit_once(')') else { continue };
            let fields: Vec<&str> = fields.split_whitespace().collect();
            if fields.len() > 12 && fields[2] == group {
                ticks.insert(pid, fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0));
            }
        }
        ticks
    }

    /// The share of one core the browser used over the next `span`: what
    /// each of its processes used meanwhile (a page's renderer that ends
    /// takes its time with it, so a sum over the group can go down).
    pub async fn cpu_share(&self, span: Duration) -> f64 {
        let (before, started) = (self.ticks_by_process(), Instant::now());
        tokio::time::sleep(span).await;
        let used: u64 =
            self.ticks_by_process().iter().map(|(pid, now)| now.saturating_sub(*before.get(pid).unwrap_or(&0))).sum();
        // SAFETY: sysconf reads a constant of the system.
        let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        used as f64 / ticks_per_second / started.elapsed().as_secs_f64()
    }
}
