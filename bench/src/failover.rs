//! Leader failover between three `herd server` replicas with the default
//! election settings (lease 15s, renew deadline 10s, retry 2s), on SQLite
//! and on PostgreSQL: graceful handover (SIGTERM), process crash (kill -9)
//! and pause (SIGSTOP past the lease, then SIGCONT). Each is printed as
//! min/median/max beside its theoretical bound. The time is from the
//! signal to the new holder's lease being readable in the store (polled
//! every millisecond). The replicas run the fencing probe; at the end the
//! store is checked for any leader-only write of one term after the next
//! term began.
//!
//! `cargo build --release -p herd && cargo run --release -p herd-bench --bin failover`
//! PostgreSQL runs too when HERD_BENCH_POSTGRES_URL (or HERD_TEST_POSTGRES_URL)
//! is set. Options (environment): BENCH_FAILOVERS (per scenario, default 20),
//! BENCH_SCENARIOS (default `graceful,crash,pause`), BENCH_BACKENDS (default
//! `sqlite,postgres`), HERD_BIN (default: the `herd` binary beside this one).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use herd_client::Client;
use herd_core::kinds::{LeaderElectionSettings, LeaseSpec};
use herd_core::{Object, kinds::cluster_config::ClusterConfigSpec};
use herd_server::controllers::fencing_probe::{PROBE_PREFIX, ProbeRecord};
use herd_server::objects::object_key;
use herd_store::{ListOptions, Store};

const ADMIN_TOKEN: &str = "bench-admin-token";

/// One `herd server` process, killed on drop.
struct Replica {
    identity: String,
    child: Child,
    url: String,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = signal(self.child.id(), "CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal(pid: u32, name: &str) -> anyhow::Result<()> {
    let status = Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).stderr(Stdio::null()).status()?;
    if !status.success() {
        bail!("kill -{name} {pid} failed");
    }
    Ok(())
}

struct Cluster {
    herd: PathBuf,
    dir: PathBuf,
    store_url: Option<String>,
    store: Store,
    replicas: Vec<Replica>,
}

impl Cluster {
    fn start_replica(&self, identity: &str) -> anyhow::Result<Replica> {
        let mut command = Command::new(&self.herd);
        command.args([
            "server",
            "--listen",
            "127.0.0.1:0",
            "--insecure-http",
            "--identity",
            identity,
            "--fencing-probe",
            "100ms",
        ]);
        command.arg("--data-dir").arg(&self.dir);
        if let Some(url) = &self.store_url {
            command.args(["--store", url]);
        }
        command.env("HERD_ADMIN_TOKEN", ADMIN_TOKEN).env("HERD_JOIN_TOKEN", "bench-join-token");
        command.env("HERD_LOG", "warn").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = command.spawn().with_context(|| format!("starting {}", self.herd.display()))?;
        let stdout = child.stdout.take().context("stdout is piped")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut replica = Replica { identity: identity.into(), child, url: String::new() };
        loop {
            let line = lines.recv_timeout(Duration::from_secs(30)).context("the server did not start")?;
            if let Some(url) = line.strip_prefix("herd server listening on ") {
                replica.url = url.trim().to_string();
                return Ok(replica);
            }
        }
    }

    /// The lease holder and its term, read from the store.
    async fn holder(&self) -> anyhow::Result<Option<(String, u64)>> {
        let Some(kv) = self.store.get(&object_key("leases", "herd-leader")).await? else { return Ok(None) };
        let lease: Object<LeaseSpec> = serde_json::from_slice(&kv.value)?;
        Ok(Some((lease.spec.holder_identity, lease.spec.lease_transitions)).filter(|(h, _)| !h.is_empty()))
    }

    /// Polls every millisecond until a holder other than `old` appears.
    async fn wait_for_new_holder(&self, old: &str, since: Instant) -> anyhow::Result<Duration> {
        loop {
            if let Some((holder, _)) = self.holder().await?
                && holder != old
            {
                return Ok(since.elapsed());
            }
            if since.elapsed() > Duration::from_secs(60) {
                bail!("no new leader within 60s after {old} was stopped");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn wait_for_leader(&self) -> anyhow::Result<(String, u64)> {
        let started = Instant::now();
        loop {
            if let Some(holder) = self.holder().await? {
                return Ok(holder);
            }
            if started.elapsed() > Duration::from_secs(60) {
                bail!("no leader within 60s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn index_of(&self, identity: &str) -> anyhow::Result<usize> {
        self.replicas.iter().position(|r| r.identity == identity).context("the leader is not one of ours")
    }

    /// One failover of `scenario`; the stopped leader is started again (or
    /// resumed) and has stepped down when this returns.
    async fn failover(&mut self, scenario: Scenario) -> anyhow::Result<Duration> {
        let (leader, _) = self.wait_for_leader().await?;
        let index = self.index_of(&leader)?;
        let pid = self.replicas[index].child.id();
        let since = Instant::now();
        signal(pid, scenario.signal())?;
        let took = self.wait_for_new_holder(&leader, since).await?;
        match scenario {
            Scenario::Graceful | Scenario::Crash => {
                let mut old = self.replicas.remove(index);
                let _ = old.child.wait();
                self.replicas.push(self.start_replica(&leader)?);
            }
            Scenario::Pause => {
                signal(pid, "CONT")?;
                let client = Client::new(vec![self.replicas[index].url.clone()], Some(ADMIN_TOKEN.into()));
                let deadline = Instant::now() + Duration::from_secs(30);
                while client.get_text("/metrics").await.map_or(true, |m| !m.lines().any(|l| l == "herd_leader 0")) {
                    if Instant::now() > deadline {
                        bail!("the resumed replica {leader} did not step down within 30s");
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        // Let the standbys see the new lease (and its holder's liveness token).
        tokio::time::sleep(Duration::from_millis(1000)).await;
        Ok(took)
    }

    /// Every term's probe record; fails if one term wrote after the next began.
    async fn check_fencing(&self) -> anyhow::Result<usize> {
        let page = self.store.list(PROBE_PREFIX, &ListOptions::default(), |_| true).await?;
        let mut terms = Vec::new();
        for kv in &page.items {
            let record: ProbeRecord = serde_json::from_slice(&kv.value)?;
            terms.push((record, kv.create_revision, kv.mod_revision));
        }
        for pair in terms.windows(2) {
            let ((earlier, _, last_write), (later, first_write, _)) = (&pair[0], &pair[1]);
            if last_write >= first_write {
                bail!(
                    "FENCING BROKEN: term {} ({}) wrote at revision {last_write}, after term {} ({}) began at {first_write}",
                    earlier.term,
                    earlier.holder,
                    later.term,
                    later.holder
                );
            }
        }
        Ok(terms.len())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    Graceful,
    Crash,
    Pause,
}

impl Scenario {
    fn parse(name: &str) -> anyhow::Result<Self> {
        Ok(match name.trim() {
            "graceful" => Scenario::Graceful,
            "crash" => Scenario::Crash,
            "pause" => Scenario::Pause,
            other => bail!("BENCH_SCENARIOS: unknown scenario {other:?} (graceful, crash, pause)"),
        })
    }

    fn signal(self) -> &'static str {
        match self {
            Scenario::Graceful => "TERM",
            Scenario::Crash => "KILL",
            Scenario::Pause => "STOP",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Scenario::Graceful => "graceful (SIGTERM)",
            Scenario::Crash => "crash (kill -9)",
            Scenario::Pause => "pause (SIGSTOP)",
        }
    }

    /// The theoretical bound with `settings`, and the goal.
    fn bound(self, settings: &LeaderElectionSettings) -> (String, &'static str) {
        let lease = settings.lease_duration.get();
        let retry = settings.retry_period.get();
        let expiry = lease + retry.mul_f64(1.2);
        match self {
            Scenario::Graceful => (
                format!("{} (one retry period x 1.2, if the release went unseen)", ms(retry.mul_f64(1.2))),
                "median <= 20 ms on PostgreSQL",
            ),
            Scenario::Crash => (format!("{} (lease + 1.2 x retry, without fast failover)", ms(expiry)), "median < 1 s"),
            Scenario::Pause => (
                format!("{}..{} (lease - retry .. lease + 1.2 x retry)", ms(lease - retry), ms(expiry)),
                "never above the upper bound",
            ),
        }
    }
}

fn ms(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

async fn bench_backend(
    herd: &Path,
    backend: &str,
    store_url: Option<String>,
    scenarios: &[Scenario],
    count: usize,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(store_url.as_deref().unwrap_or(&dir.path().join("herd.db").display().to_string())).await?;
    let mut cluster =
        Cluster { herd: herd.to_path_buf(), dir: dir.path().to_path_buf(), store_url, store, replicas: Vec::new() };
    for identity in ["r1", "r2", "r3"] {
        let replica = cluster.start_replica(identity)?;
        cluster.replicas.push(replica);
    }
    cluster.wait_for_leader().await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let settings = ClusterConfigSpec::default().leader_election;
    for &scenario in scenarios {
        let mut times = Vec::with_capacity(count);
        for _ in 0..count {
            times.push(cluster.failover(scenario).await?);
        }
        times.sort();
        let (bound, goal) = scenario.bound(&settings);
        println!(
            "{backend:<11} {:<19} n={count:<3} min {:>9}  median {:>9}  max {:>9}   bound {bound}; goal {goal}",
            scenario.label(),
            ms(times[0]),
            ms(times[times.len() / 2]),
            ms(times[times.len() - 1]),
        );
    }
    let terms = cluster.check_fencing().await?;
    println!(
        "{backend:<11} fencing: {terms} leadership terms checked on the store, no write of a term after the next began"
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let count: usize = std::env::var("BENCH_FAILOVERS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let scenarios = std::env::var("BENCH_SCENARIOS")
        .unwrap_or_else(|_| "graceful,crash,pause".into())
        .split(',')
        .map(Scenario::parse)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let herd = match std::env::var_os("HERD_BIN") {
        Some(path) => PathBuf::from(path),
        None => std::env::current_exe()?.with_file_name("herd"),
    };
    if !herd.exists() {
        bail!("{} not found: build it first (cargo build --release -p herd) or set HERD_BIN", herd.display());
    }
    let defaults = ClusterConfigSpec::default().leader_election;
    println!(
        "failover benchmark: 3 replicas, lease {}, renew deadline {}, retry {}; {count} failovers per scenario",
        defaults.lease_duration, defaults.renew_deadline, defaults.retry_period
    );
    println!("time: from the signal to the new holder's lease being readable in the store");
    let backends = std::env::var("BENCH_BACKENDS").unwrap_or_else(|_| "sqlite,postgres".into());
    if backends.contains("sqlite") {
        bench_backend(&herd, "SQLite", None, &scenarios, count).await?;
    }
    let postgres = std::env::var("HERD_BENCH_POSTGRES_URL").or_else(|_| std::env::var("HERD_TEST_POSTGRES_URL"));
    match postgres.ok().filter(|_| backends.contains("postgres")) {
        Some(url) => {
            let schema = format!("herd_failover_{}", std::process::id());
            let admin = |sql: String| {
                Command::new("psql")
                    .args([url.as_str(), "-qc", &sql])
                    .env("PGOPTIONS", "--client-min-messages=warning")
                    .status()
            };
            if !admin(format!("CREATE SCHEMA {schema}"))?.success() {
                bail!("could not create schema {schema}");
            }
            let separator = if url.contains('?') { '&' } else { '?' };
            let schema_url = format!("{url}{separator}options=-csearch_path%3D{schema}");
            let result = bench_backend(&herd, "PostgreSQL", Some(schema_url), &scenarios, count).await;
            admin(format!("DROP SCHEMA {schema} CASCADE"))?;
            result?;
        }
        None => println!("PostgreSQL: skipped (set HERD_BENCH_POSTGRES_URL, and BENCH_BACKENDS to include it)"),
    }
    Ok(())
}
