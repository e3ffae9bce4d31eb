//! PostgreSQL failover under herd's role leases beside Patroni's: three
//! PostgreSQL 15 instances on this host for each, synchronous (every
//! standby in sync), host 0 of each in a network namespace of its own.
//! Rounds alternate between the two and inject the same faults into the
//! primary: its process killed (kill -9 of the postmaster), its host lost
//! (the manager's process and every PostgreSQL process of the host
//! killed; the host is back once another primary takes writes), its host
//! cut off (the namespace's link down; healed likewise), and a planned
//! switchover to the next instance. A probe writes to every instance
//! every 10 ms; per fault it measures the time without a write any client
//! could see acknowledged, and over the run the acknowledged writes that
//! are missing at the end and the instants at which two instances both
//! took writes.
//!
//! `cargo build --release -p herd -p herd-bench && target/release/app-failover`
//! Needs root (network namespaces), Debian's postgresql (15) and
//! etcd-server, and Patroni (PATRONI_BIN, or installed from PyPI into a
//! virtual environment the first time). Options (environment):
//! BENCH_ROUNDS (default 2: each fault twice per system), BENCH_FAULTS
//! (default `crash,host-loss,cut-off,switchover`), BENCH_LEASE (seconds,
//! default 20: Patroni's ttl cannot be shorter), BENCH_HERD_LEASE (herd's
//! lease, default BENCH_LEASE), BENCH_RETRY (seconds, default 2),
//! BENCH_SYSTEMS (default `patroni,herd`; one alone for a long run of
//! faults without the baseline), BENCH_HERD_LOG (herd's log level, default
//! warn), HERD_BIN. A run that fails (or any, with BENCH_KEEP set) keeps
//! its directory: every process's log, each member's data and output
//! under its agent's.
//! The renew deadline (Patroni's retry_timeout) is (lease - retry) / 2,
//! the longest Patroni accepts.

mod herd_side;
mod patroni_side;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use anyhow::{Context, bail};
use herd_bench::netns::NetNs;
use herd_bench::probe::{self, Probes, now_ns};
use herd_bench::processes::{env_u64, wait_for};
use herd_side::HerdSide;
use patroni_side::PatroniSide;

/// A role lease's times, the same for both systems.
pub struct LeaseSettings {
    pub duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaseSettings {
    fn new(duration: u64, retry: u64) -> LeaseSettings {
        LeaseSettings {
            duration: Duration::from_secs(duration),
            renew_deadline: Duration::from_secs((duration - retry) / 2),
            retry_period: Duration::from_secs(retry),
        }
    }

    fn describe(&self) -> String {
        let (d, r, p) = (self.duration.as_secs(), self.renew_deadline.as_secs(), self.retry_period.as_secs());
        format!("lease {d}s, renew deadline {r}s, retry {p}s")
    }
}

/// Sends SIGKILL to `pid`, or to its whole process group.
pub fn signal_group(pid: u32, group: bool) -> anyhow::Result<()> {
    let target = match group {
        // /proc/PID/stat: pid (comm) state ppid pgrp ..., comm in parentheses.
        true => {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
            let after_comm = stat.rsplit_once(')').context("/proc stat")?.1;
            let pgrp = after_comm.split_whitespace().nth(2).context("/proc stat's pgrp")?;
            format!("-{pgrp}")
        }
        false => pid.to_string(),
    };
    let status = Command::new("kill").args(["-KILL", "--", &target]).status()?;
    if !status.success() {
        bail!("kill -KILL {target} failed");
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Crash,
    HostLoss,
    CutOff,
    Switchover,
}

impl Fault {
    fn parse(text: &str) -> anyhow::Result<Fault> {
        Ok(match text.trim() {
            "crash" => Fault::Crash,
            "host-loss" => Fault::HostLoss,
            "cut-off" => Fault::CutOff,
            "switchover" => Fault::Switchover,
            other => bail!("BENCH_FAULTS: unknown fault {other:?} (crash, host-loss, cut-off, switchover)"),
        })
    }

    fn label(self) -> &'static str {
        match self {
            Fault::Crash => "primary process crash",
            Fault::HostLoss => "primary host lost",
            Fault::CutOff => "primary host cut off",
            Fault::Switchover => "planned switchover",
        }
    }
}

enum Side {
    Herd(HerdSide),
    Patroni(PatroniSide),
}

impl Side {
    /// The leader's host and how many standbys are in sync with it.
    async fn leader(&self) -> Option<(usize, usize)> {
        match self {
            Side::Herd(herd) => herd.leader().await,
            Side::Patroni(patroni) => patroni.leader().await,
        }
    }

    fn netns(&self) -> &NetNs {
        match self {
            Side::Herd(herd) => &herd.netns,
            Side::Patroni(patroni) => &patroni.netns,
        }
    }

    async fn crash(&self, host: usize) -> anyhow::Result<()> {
        match self {
            Side::Herd(herd) => herd.crash(host).await,
            Side::Patroni(patroni) => patroni.crash(host),
        }
    }

    async fn lose_host(&mut self, host: usize) -> anyhow::Result<()> {
        match self {
            Side::Herd(herd) => herd.lose_host(host).await,
            Side::Patroni(patroni) => patroni.lose_host(host),
        }
    }

    fn restore_host(&mut self, host: usize) -> anyhow::Result<()> {
        match self {
            Side::Herd(herd) => herd.restore_host(host),
            Side::Patroni(patroni) => patroni.restore_host(host),
        }
    }

    /// Asks for a switchover; Patroni's answer comes when it is done, so
    /// the asking goes on apart while the probe measures.
    async fn switchover(&self, from: usize, to: usize) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<()>>> {
        match self {
            Side::Herd(herd) => {
                herd.switchover(to).await?;
                Ok(tokio::spawn(async { Ok(()) }))
            }
            Side::Patroni(patroni) => Ok(tokio::spawn(patroni.switchover(from, to))),
        }
    }
}

/// One system under test, its probes and what they measured.
struct System {
    label: String,
    side: Side,
    probes: Probes,
    outages: BTreeMap<Fault, Vec<Duration>>,
    /// Each fault injected, and when.
    injected: Vec<(Fault, u128)>,
}

/// How long a system may take to have a primary taking writes with both
/// standbys in sync (a member coming back may be rewound or cloned).
const STEADY_WITHIN: Duration = Duration::from_secs(240);
/// How long a fault may leave no primary before the run gives up.
const RECOVER_WITHIN: Duration = Duration::from_secs(180);

impl System {
    /// Waits until a primary (on `on`, when given) takes writes with both
    /// standbys in sync; returns its host.
    async fn steady(&self, on: Option<usize>) -> anyhow::Result<usize> {
        let what = format!("{}: a primary with both standbys in sync", self.label);
        wait_for(&what, STEADY_WITHIN, async || {
            let (leader, in_sync) = self.side.leader().await?;
            let recently = now_ns() - 300_000_000;
            let acked = !self.probes.timelines_since(recently)[leader].is_empty();
            let steady = in_sync == 2 && on.is_none_or(|h| h == leader) && acked;
            steady.then_some(leader)
        })
        .await
    }

    /// Injects `fault` into the primary at a moment picked at random
    /// within `phase` of the system being steady; the time no client
    /// could write.
    async fn inject(&mut self, fault: Fault, phase: Duration) -> anyhow::Result<Duration> {
        let mut leader = self.steady(None).await?;
        if fault == Fault::CutOff && leader != 0 {
            // Only host 0 can be cut off: its instance leads first.
            self.side.switchover(leader, 0).await?.await??;
            leader = self.steady(Some(0)).await?;
        }
        // Not in step with what `steady` watches (a status that a renewal
        // brings, say): a fault right after a renewal is the worst case
        // for a lease, one just before it the best.
        let nanos = u64::try_from(probe::now_ns() % phase.as_nanos().max(1)).unwrap_or_default();
        tokio::time::sleep(Duration::from_nanos(nanos)).await;
        // From when the primary is gone (a write it acknowledged while it
        // was being killed is no recovery), or the switchover asked.
        let mut asked = None;
        let asked_at = now_ns();
        let to = (leader + 1) % 3;
        match fault {
            Fault::Crash => self.side.crash(leader).await?,
            Fault::HostLoss => self.side.lose_host(leader).await?,
            Fault::CutOff => self.side.netns().cut(),
            Fault::Switchover => asked = Some(self.side.switchover(leader, to).await?),
        }
        let at = if asked.is_some() { asked_at } else { now_ns() };
        self.injected.push((fault, at));
        if fault == Fault::Switchover {
            // Done once the standby asked for takes writes: a switchover
            // refused at first and asked again (Patroni's 412) has not
            // begun to cost anything before.
            let what = format!("{}: host {to} taking writes after the switchover", self.label);
            wait_for(&what, RECOVER_WITHIN, async || (!self.probes.timelines_since(at)[to].is_empty()).then_some(()))
                .await?;
        }
        // A cut-off primary's writes after the cut reach no client outside.
        let visible = |host: usize| fault != Fault::CutOff || host != leader;
        let window = at.saturating_sub(5_000_000_000);
        let what = format!("{}: a primary taking writes after {}", self.label, fault.label());
        let outage = wait_for(&what, RECOVER_WITHIN, async || {
            probe::outage(&self.probes.timelines_since(window), at, visible, now_ns())
        })
        .await;
        match fault {
            Fault::HostLoss => self.side.restore_host(leader)?,
            Fault::CutOff => self.side.netns().heal(),
            _ => {}
        }
        if let Some(asked) = asked {
            asked.await??;
        }
        let unwritable = outage?;
        self.outages.entry(fault).or_default().push(unwritable);
        Ok(unwritable)
    }

    /// `at` as the time since the fault before it.
    fn when(&self, at: u128) -> String {
        match self.injected.iter().rev().find(|(_, injected)| *injected <= at) {
            Some((fault, injected)) => format!("{} ms after the {}", (at - injected) / 1_000_000, fault.label()),
            None => "before any fault".into(),
        }
    }

    /// Every value acknowledged that the primary does not have; the
    /// probes end first.
    async fn lost(&mut self, targets: &[probe::Target]) -> anyhow::Result<Vec<probe::Lost>> {
        let leader = self.steady(None).await?;
        let timelines = self.probes.finish();
        let target = &targets[leader];
        let client = probe::connect(&target.host, target.port).await.context("connecting to the primary")?;
        let rows = client.query("select v from probe", &[]).await?;
        let stored: BTreeSet<i64> = rows.iter().map(|r| r.get(0)).collect();
        Ok(probe::lost(&timelines, &stored))
    }
}

/// Creates the probe's table on the system's first primary, then starts
/// the probes.
async fn probed(
    label: String,
    side: Side,
    targets: Vec<probe::Target>,
    values: Arc<AtomicI64>,
) -> anyhow::Result<System> {
    let host =
        wait_for(&format!("{label}: a primary"), STEADY_WITHIN, async || side.leader().await.map(|(h, _)| h)).await?;
    let target = &targets[host];
    wait_for(&format!("{label}: the probe's table"), Duration::from_secs(60), async || {
        let client = probe::connect(&target.host, target.port).await?;
        client.execute("create table if not exists probe (v bigint primary key)", &[]).await.ok()
    })
    .await?;
    let probes = Probes::start(&targets, values);
    Ok(System { label, side, probes, outages: BTreeMap::new(), injected: Vec::new() })
}

fn seconds(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn median(values: &[Duration]) -> Option<Duration> {
    let mut sorted = values.to_vec();
    sorted.sort();
    sorted.get(sorted.len() / 2).copied()
}

fn summary(values: &[Duration]) -> String {
    match (median(values), values.iter().min(), values.iter().max()) {
        (Some(median), Some(min), Some(max)) => format!("{} ({}-{})", seconds(median), seconds(*min), seconds(*max)),
        _ => "-".into(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    herd_tls::install_provider();
    let rounds = env_u64("BENCH_ROUNDS", 2);
    let faults: Vec<Fault> = std::env::var("BENCH_FAULTS")
        .unwrap_or("crash,host-loss,cut-off,switchover".into())
        .split(',')
        .map(Fault::parse)
        .collect::<Result<_, _>>()?;
    let wanted = std::env::var("BENCH_SYSTEMS").unwrap_or("patroni,herd".into());
    let wanted: Vec<&str> = wanted.split(',').map(str::trim).collect();
    let (run_patroni, run_herd) = (wanted.contains(&"patroni"), wanted.contains(&"herd"));
    if let Some(other) = wanted.iter().find(|w| !["patroni", "herd"].contains(w)) {
        bail!("BENCH_SYSTEMS: unknown system {other:?} (patroni, herd)");
    }
    let retry = env_u64("BENCH_RETRY", 2);
    let lease = env_u64("BENCH_LEASE", 20);
    if lease < 20 && run_patroni {
        bail!("BENCH_LEASE={lease}: Patroni's ttl cannot be below 20 s (set BENCH_HERD_LEASE for herd alone)");
    }
    let patroni_lease = LeaseSettings::new(lease, retry);
    let herd_lease = LeaseSettings::new(env_u64("BENCH_HERD_LEASE", lease), retry);
    let mut running = Vec::new();
    if run_patroni {
        running.push(format!("Patroni ({})", patroni_lease.describe()));
    }
    if run_herd {
        running.push(format!("herd ({})", herd_lease.describe()));
    }
    println!(
        "app-failover: 3 PostgreSQL 15 instances each, synchronous; {}; {rounds} rounds of {faults:?}",
        running.join(" beside ")
    );
    let dir = tempfile::tempdir()?;
    // Patroni runs as postgres, and the example's members too.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let values = Arc::new(AtomicI64::new(0));

    let mut systems = Vec::new();
    let outcome = async {
        if run_patroni {
            let patroni = PatroniSide::start(dir.path(), NetNs::create(250), &patroni_lease).await?;
            let targets = patroni.targets();
            let version = Command::new(patroni_side::patroni_binary()?).arg("--version").output()?;
            let label = String::from_utf8_lossy(&version.stdout).trim().replace("patroni", "Patroni");
            systems.push((probed(label, Side::Patroni(patroni), targets.clone(), values.clone()).await?, targets));
        }
        if run_herd {
            let herd = HerdSide::start(&dir.path().join("herd"), NetNs::create(251), &herd_lease).await?;
            let targets = herd.targets().await?;
            systems.push((probed("herd".into(), Side::Herd(herd), targets.clone(), values.clone()).await?, targets));
        }
        measure(&mut systems, rounds, &faults, Duration::from_secs(retry)).await
    }
    .await;
    // The probes end first, then each system's processes (on drop).
    drop(systems);
    if outcome.is_err() || std::env::var_os("BENCH_KEEP").is_some() {
        // Every process's log, and each member's data, for a look.
        eprintln!("app-failover: kept {} (logs: *.log, each member's under its agent)", dir.keep().display());
    }
    outcome
}

/// Each round injects every fault into each system in turn, at a moment
/// picked at random within `phase` (the retry period: a renewal's cycle).
async fn measure(
    systems: &mut [(System, Vec<probe::Target>)],
    rounds: u64,
    faults: &[Fault],
    phase: Duration,
) -> anyhow::Result<()> {
    for round in 1..=rounds {
        for fault in faults {
            for (system, _) in systems.iter_mut() {
                let took = system.inject(*fault, phase).await?;
                println!("round {round}: {:<16} {:<24} no writes for {}", system.label, fault.label(), seconds(took));
            }
        }
    }
    let mut lost = Vec::new();
    let mut doubled = Vec::new();
    for (system, targets) in systems.iter_mut() {
        lost.push(system.lost(targets).await?);
        doubled.push(probe::two_writable(&system.probes.timelines()));
    }
    // One column per system; with both, herd's figure over Patroni's.
    let row = |what: &str, cells: Vec<String>, ratio: String| {
        let cells: String = cells.iter().map(|c| format!(" {c:<26}")).collect();
        println!("{what:<44}{cells} {ratio}");
    };
    let labels = systems.iter().map(|(s, _)| s.label.clone()).collect();
    let both = systems.len() == 2;
    println!();
    row("no writes for: median (min-max)", labels, if both { "herd / Patroni".into() } else { String::new() });
    for fault in faults {
        let outages: Vec<&[Duration]> =
            systems.iter().map(|(s, _)| s.outages.get(fault).map_or(&[][..], Vec::as_slice)).collect();
        let ratio = match (outages.first().and_then(|o| median(o)), outages.get(1).and_then(|o| median(o))) {
            (Some(theirs), Some(ours)) => format!("{:.2}x", ours.as_secs_f64() / theirs.as_secs_f64()),
            _ => String::new(),
        };
        row(fault.label(), outages.iter().map(|o| summary(o)).collect(), ratio);
    }
    let acknowledged = systems.iter().map(|(s, _)| s.probes.timelines().iter().map(Vec::len).sum::<usize>());
    let lost_of: Vec<String> = lost.iter().zip(acknowledged).map(|(l, a)| format!("{} of {a}", l.len())).collect();
    row("acknowledged writes lost", lost_of, String::new());
    let faults_each = rounds as usize * faults.len();
    let what = format!("instants two took writes ({faults_each} faults)");
    row(&what, doubled.iter().map(|d| d.len().to_string()).collect(), String::new());
    for (((system, _), doubled), lost) in systems.iter().zip(&doubled).zip(&lost) {
        for (a, b, at) in doubled.iter().take(5) {
            println!("  {}: hosts {a} and {b} both took writes {}", system.label, system.when(*at));
        }
        for lost in lost.iter().take(5) {
            let (value, host, when) = (lost.value, lost.instance, system.when(lost.at));
            println!("  {}: value {value}, acknowledged by host {host} {when}, is lost", system.label);
        }
    }
    Ok(())
}
