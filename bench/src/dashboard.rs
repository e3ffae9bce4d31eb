//! The dashboard's cost to the browser: Chromium's CPU (its process
//! group's, from /proc) on an idle overview of a thousand simulated nodes
//! (`herd sim-nodes`, heartbeating every 5 s: two hundred status changes a
//! second for the page to follow), beside the same browser on the login
//! page, which follows nothing, measured in the same run. The two take
//! turns over several rounds (a fresh page each), so that a change in the
//! machine's load shows in both; the page's own time in script (what its
//! renders took) is read from the page.
//!
//! `cargo build --release -p herd -p herd-bench && target/release/dashboard`
//! Options (environment): BENCH_NODES (1000), BENCH_ROUNDS (3),
//! BENCH_SECONDS (each measure, 10), HERD_BIN. Plain HTTP
//! (`--insecure-http`), SQLite store; needs Debian's chromium and
//! chromium-driver.

use std::time::Duration;

use anyhow::{Context, bail};
use fantoccini::Locator;
use herd_bench::browser::Chromium;
use herd_bench::processes::{ADMIN, JOIN, Killed, env_u64, herd_binary, start, wait_for};
use herd_client::Client;
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{ClusterConfigSpec, NodeSpec};

/// The milliseconds the page has spent rendering (app.js counts them).
const RENDER_MS: &str = "return herd.renderMs;";

/// Chromium's share of one core over `span`, and the page's render time
/// in milliseconds a second.
async fn measure(chromium: &Chromium, span: Duration) -> anyhow::Result<(f64, f64)> {
    let before = chromium.client.execute(RENDER_MS, vec![]).await?.as_f64().unwrap_or(0.0);
    let share = chromium.cpu_share(span).await;
    let after = chromium.client.execute(RENDER_MS, vec![]).await?.as_f64().unwrap_or(0.0);
    Ok((share, (after - before) / span.as_secs_f64()))
}

async fn text(chromium: &Chromium, css: &str) -> Option<String> {
    chromium.client.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

/// A fresh login page; logged in with the admin token, the overview.
async fn open(chromium: &Chromium, url: &str, logged_in: bool, nodes: usize) -> anyhow::Result<()> {
    // A fresh page, with no token kept from the last round.
    chromium.client.goto(&format!("{url}/ui")).await?;
    chromium.client.execute("sessionStorage.clear();", vec![]).await?;
    chromium.client.goto("about:blank").await?;
    chromium.client.goto(&format!("{url}/ui")).await?;
    let input = chromium.client.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css("#token")).await?;
    if logged_in {
        input.send_keys(ADMIN).await?;
        chromium.client.find(Locator::Css("#login-submit")).await?.click().await?;
        let ready = format!("{nodes} of {nodes} Ready");
        wait_for("the overview shows every node Ready", Duration::from_secs(60), async || {
            (text(chromium, "#ready-nodes").await.as_deref() == Some(ready.as_str())).then_some(())
        })
        .await?;
    }
    // Past the first paint and the first burst of changes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if !herd_bench::browser::installed() {
        bail!("chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)");
    }
    let herd = herd_binary()?;
    let nodes = env_u64("BENCH_NODES", 1000) as usize;
    let rounds = env_u64("BENCH_ROUNDS", 3).max(1);
    let span = Duration::from_secs(env_u64("BENCH_SECONDS", 10).max(1));
    let dir = tempfile::tempdir()?;
    let (server, url) =
        start(&herd, &["server", "--listen", "127.0.0.1:0", "--insecure-http"], &dir.path().join("server"))?;
    let mut children = Killed(vec![server]);
    let admin = Client::new(vec![url.clone()], Some(ADMIN.into()));
    let mut config = admin.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await?;
    config.spec.heartbeat_period = herd_core::HumanDuration::from_secs(5);
    config.spec.node_grace_period = herd_core::HumanDuration::from_secs(30);
    admin.update(&config).await?;
    let sim = std::process::Command::new(&herd)
        .args(["--server", &url, "sim-nodes", "--count", &nodes.to_string()])
        .env("HERD_JOIN_TOKEN", JOIN)
        .env("HERD_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("starting the simulated nodes")?;
    children.0.push(sim);
    wait_for(&format!("{nodes} Ready nodes"), Duration::from_secs(120), async || {
        let listed = admin.list::<NodeSpec>("").await.ok()?;
        (listed.iter().filter(|n| n.status.ready).count() == nodes).then_some(())
    })
    .await?;
    let chromium = Chromium::start().await?;
    println!("dashboard: {nodes} simulated nodes heartbeating every 5 s; {rounds} rounds of {span:?} each");
    let (mut login, mut overview, mut renders) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        open(&chromium, &url, false, nodes).await?;
        let (login_share, _) = measure(&chromium, span).await?;
        open(&chromium, &url, true, nodes).await?;
        let (share, render_ms) = measure(&chromium, span).await?;
        println!(
            "  round {round}: idle overview {:.1}% of one core (renders {render_ms:.1} ms/s); login page {:.1}%",
            share * 100.0,
            login_share * 100.0
        );
        login.push(login_share);
        overview.push(share);
        renders.push(render_ms);
    }
    let (login, overview) = (median(login), median(overview));
    println!(
        "median: idle overview {:.1}% of one core, {:.1}% above the login page ({:.1}%); renders {:.1} ms/s",
        overview * 100.0,
        (overview - login) * 100.0,
        login * 100.0,
        median(renders)
    );
    drop(chromium);
    drop(children);
    Ok(())
}
