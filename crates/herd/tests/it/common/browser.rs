//! The dashboard tests' browser: `herd_bench::browser`'s Chromium, with
//! the waits, clicks and screenshots a test makes of it.

use std::path::PathBuf;
use std::time::Duration;

use fantoccini::{Client, Locator};
use herd_bench::browser::Chromium;
use serde_json::Value;

/// Whether Chromium and chromedriver are installed; in CI (`CI` set) their
/// absence fails the test, elsewhere it is said loudly and the test skips.
pub fn available() -> bool {
    let present = herd_bench::browser::installed();
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

pub struct Browser {
    pub client: Client,
    /// Where screenshots go.
    pub shots: PathBuf,
    pub chromium: Chromium,
}

impl Browser {
    /// A headless Chromium with a fresh profile; its screenshots go to
    /// `target/tmp/<shots>/`.
    pub async fn start(shots: &str) -> Browser {
        let chromium = Chromium::start().await.unwrap();
        let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(shots);
        std::fs::create_dir_all(&shots).unwrap();
        Browser { client: chromium.client.clone(), shots, chromium }
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
