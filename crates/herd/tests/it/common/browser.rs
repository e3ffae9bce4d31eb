//! A real browser for dashboard tests: Debian's headless Chromium driven
//! through chromedriver (WebDriver) by fantoccini. chromedriver runs in a
//! process group of its own, which is killed on drop with the Chromium it
//! started, also when the test fails.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Whether Chromium and chromedriver are installed; in CI (`CI` set) their
/// absence fails the test, elsewhere it is said loudly and the test skips.
pub fn available() -> bool {
    let present = std::path::Path::new(CHROMIUM).exists() && std::path::Path::new(CHROMEDRIVER).exists();
    if !present {
        assert!(
            std::env::var_os("CI").is_none(),
            "chromium and chromium-driver are not installed, and CI needs the browser tests (.ci/run installs them)"
        );
        eprintln!(
            "!!! SKIPPED: chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
        );
    }
    present
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

pub struct Browser {
    pub client: Client,
    /// Where screenshots go.
    pub shots: PathBuf,
    _profile: tempfile::TempDir,
    _driver: Driver,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Browser {
    /// A headless Chromium with a fresh profile, trusting any certificate
    /// (the cluster CA is the test's own) and reaching nothing but loopback.
    pub async fn start(shots: &str) -> Browser {
        use std::os::unix::process::CommandExt;
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver starts");
        let driver = Driver(driver);
        let profile = tempfile::tempdir().unwrap();
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
        let capabilities = json!({
            "acceptInsecureCerts": true,
            "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
        });
        let Value::Object(capabilities) = capabilities else { unreachable!() };
        let url = format!("http://127.0.0.1:{port}");
        let mut last_error = String::new();
        for _ in 0..100 {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector).capabilities(capabilities.clone()).connect(&url).await {
                Ok(client) => {
                    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(shots);
                    std::fs::create_dir_all(&shots).unwrap();
                    return Browser { client, shots, _profile: profile, _driver: driver };
                }
                Err(error) => last_error = error.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("chromedriver did not start a browser: {last_error}");
    }

    /// The text of the first element matching `css`, if there is one.
    pub async fn text(&self, css: &str) -> Option<String> {
        match self.client.find(Locator::Css(css)).await {
            Ok(element) => element.text().await.ok(),
            Err(_) => None,
        }
    }

    /// Waits until the element matching `css` has a text for which `want`
    /// holds; returns it. Panics, with a screenshot saved, after `timeout`.
    pub async fn wait_text(&self, css: &str, timeout: Duration, want: impl Fn(&str) -> bool) -> String {
        match self.try_wait_text(css, timeout, want).await {
            Ok(text) => text,
            Err(last) => {
                self.screenshot("failed").await;
                panic!("{css}: still {last:?} after {timeout:?}");
            }
        }
    }

    /// Waits until the element matching `css` has a text for which `want`
    /// holds; returns it, or after `timeout` the last text it had.
    pub async fn try_wait_text(
        &self,
        css: &str,
        timeout: Duration,
        want: impl Fn(&str) -> bool,
    ) -> Result<String, Option<String>> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = None;
        loop {
            last = self.text(css).await.or(last);
            if let Some(text) = last.as_deref().filter(|t| want(t)) {
                return Ok(text.to_string());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(last);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Clicks the element matching `css`, found again if the page redrew
    /// it between finding and clicking (as a person would click again).
    pub async fn click(&self, css: &str) {
        let mut last_error = String::new();
        for _ in 0..20 {
            let element = self.client.wait().at_most(Duration::from_secs(10)).for_element(Locator::Css(css)).await;
            match element.unwrap_or_else(|e| panic!("no {css}: {e}")).click().await {
                Ok(()) => return,
                Err(error) => last_error = error.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{css} could not be clicked: {last_error}");
    }

    /// CPU time (user and system, in seconds) that chromedriver and the
    /// Chromium it started (its process group) have used so far.
    pub fn cpu_seconds(&self) -> f64 {
        let group = self._driver.0.id().to_string();
        // SAFETY: sysconf reads a constant of the system.
        let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let mut ticks = 0u64;
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            // After the command's name (in parentheses): state, ppid, pgrp, ..., utime (14th), stime (15th).
            let Some((_, fields)) = stat.rsplit_once(')') else { continue };
            let fields: Vec<&str> = fields.split_whitespace().collect();
            if fields.len() > 12 && fields[2] == group {
                ticks += fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
            }
        }
        ticks as f64 / ticks_per_second
    }

    pub async fn count(&self, css: &str) -> usize {
        self.client.find_all(Locator::Css(css)).await.map_or(0, |found| found.len())
    }

    pub async fn run(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap()
    }

    /// Saves a screenshot as `<shots>/<name>.png`.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let path = self.shots.join(format!("{name}.png"));
        match self.client.screenshot().await {
            Ok(png) => {
                std::fs::write(&path, png).unwrap();
                eprintln!("screenshot: {}", path.display());
            }
            Err(error) => eprintln!("no screenshot {name}: {error}"),
        }
        path
    }
}
