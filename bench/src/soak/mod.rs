//! The chaos soak: an etcd cluster under herd (the example App, three
//! members on three agents, its quorum budget; server replicas on one
//! store; with the PostgreSQL example beside it, under a write probe)
//! hit with faults drawn from a printed seed
//! ([`crate::schedule`]), several at once, while clients record every
//! operation; checked by the clients' own history
//! ([`crate::linearizable`]) and by herd's invariants, all along: no
//! member slot runs twice on any host (a scan of every process), no
//! voluntary disruption takes the budget below its minimum (the store's
//! watch history of the members), no Command issue by a deposed leader
//! is stored (the watch history of the lease and the Commands); and at
//! the end: every Operation ended,
//! every Command settled, every member configured and every node Ready.
//!
//! [`run`] gives the [`Report`] (the faults done by kind, how long the
//! cluster took to be whole again after each); a violation is an error
//! naming the first one, what happened around it, and the seed that
//! replays the schedule. Every process it started is ended when it
//! returns, also when it fails or is dropped.

mod budget;
mod checks;
mod clients;
mod faults;
mod fencing;
mod hosts;
mod postgres;
mod report;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio_util::sync::CancellationToken;

use crate::linearizable::{Register, check};
use crate::schedule::{FaultKind, Plan, schedule};
pub use hosts::faketime_library;
pub use postgres::{SERVER as POSTGRES_SERVER, quick_failovers};
pub use report::Report;

/// What a soak runs on and how hard.
#[derive(Clone, Debug)]
pub struct Options {
    pub plan: Plan,
    /// How many faults to do; a drawn fault whose host has one on already,
    /// or that finds nothing to act on, is not done, and more are drawn.
    pub faults: u32,
    /// The `herd` binary.
    pub herd: PathBuf,
    /// How many server replicas, on one store.
    pub replicas: usize,
    /// The replicas' store: a PostgreSQL URL (the soak makes a schema of
    /// its own there, dropped at the end), or None: one SQLite file.
    pub postgres: Option<String>,
    /// The ports the members are given (None: the server's default range).
    pub member_ports: Option<(u16, u16)>,
    /// Whether the first host runs in a network namespace of its own, to
    /// be cut off (needs root).
    pub netns: bool,
    /// libfaketime, for a replica's skewed clock (None: not done).
    pub faketime: Option<PathBuf>,
    /// Whether each host's data dir is a small disk of its own (a tmpfs),
    /// to be filled (needs root).
    pub disks: bool,
    /// Whether the PostgreSQL example runs too (a leader role under a
    /// write probe; switchovers), on Debian's PostgreSQL 15.
    pub postgres_app: bool,
    /// How long each of the three etcd clients waits between operations
    /// (the history to check grows with it).
    pub client_pause: Duration,
    /// Whether the logs are kept when no violation was found too (they
    /// always are on one).
    pub keep_logs: bool,
}

impl Options {
    /// The fault kinds these options allow: a cut link needs the
    /// namespace, a skewed clock libfaketime, a full disk disks of the
    /// hosts' own, a switchover the PostgreSQL example (etcd elects its own
    /// leader: there is no herd leader role to switch).
    pub fn possible(&self) -> Vec<FaultKind> {
        FaultKind::ALL
            .into_iter()
            .filter(|kind| match kind {
                FaultKind::CutHost => self.netns,
                FaultKind::SkewClock => self.faketime.is_some(),
                FaultKind::FillDisk => self.disks,
                FaultKind::Switchover => self.postgres_app,
                _ => true,
            })
            .collect()
    }
}

/// Runs the soak; the report, or the first violation.
pub async fn run(options: &Options) -> anyhow::Result<Report> {
    if let Some(kind) = options.plan.kinds.iter().find(|k| !options.possible().contains(k)) {
        bail!("{kind:?} cannot be done with these options (possible: {:?})", options.possible());
    }
    println!(
        "soak: seed {} (SOAK_SEED={} replays this schedule), {} faults of {:?}, {} replicas on {}",
        options.plan.seed,
        options.plan.seed,
        options.faults,
        options.plan.kinds,
        options.replicas,
        if options.postgres.is_some() { "PostgreSQL" } else { "SQLite" }
    );
    let cluster = hosts::Cluster::start(options).context("starting the servers and agents")?;
    let outcome = soak(&cluster, options).await;
    // What a violation is read from outlives the soak's directory.
    let kept = (outcome.is_err() || options.keep_logs).then(|| {
        let to = std::env::temp_dir().join(format!("herd-soak-{}", options.plan.seed));
        match cluster.keep_logs(&to) {
            Ok(()) => format!("\nthe logs (replicas', agents', members'): {}", to.display()),
            Err(error) => format!("\nthe logs were not kept: {error}"),
        }
    });
    cluster.stop().await;
    match outcome {
        Ok(report) => {
            if let Some(kept) = kept {
                println!("{}", kept.trim_start());
            }
            Ok(report)
        }
        Err(error) => {
            Err(anyhow::anyhow!("{error:#}\nreplay: SOAK_SEED={}{}", options.plan.seed, kept.unwrap_or_default()))
        }
    }
}

async fn soak(cluster: &Arc<hosts::Cluster>, options: &Options) -> anyhow::Result<Report> {
    let admin = cluster.admin();
    let expected = checks::Expected { nodes: cluster.nodes.len(), postgres: options.postgres_app };
    checks::set_up(&admin, options, &expected).await?;
    let netns = cluster.netns.as_ref().map(|ns| (cluster.nodes[0].clone(), ns.name.clone()));
    let workload = match options.postgres_app {
        true => Some(postgres::Workload::start(&admin, netns).await.context("the PostgreSQL write probe")?),
        false => None,
    };
    // One clock for the clients' operations, the faults and the checks.
    let clock = Instant::now();
    let budget = budget::Watcher::start(&admin, clock).await?;
    let fencing = fencing::Watcher::start(&admin, clock).await?;
    let recorder = clients::Recorder::new(checks::client_endpoints(&admin).await?, clock);
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    for id in 0..3 {
        tasks.push(tokio::spawn(recorder.clone().run(id, options.plan.seed, options.client_pause, stop.clone())));
    }
    let twice = Arc::new(Mutex::new(None));
    let scan = tokio::spawn(checks::scan_for_twice(twice.clone(), cluster.root(), clock, stop.clone()));
    let log = report::FaultLog::new(clock);
    let done: Arc<Mutex<BTreeMap<FaultKind, u32>>> = Arc::default();
    let recoveries: Arc<Mutex<HashMap<FaultKind, Vec<Duration>>>> = Arc::default();
    let count =
        |done: &Mutex<BTreeMap<FaultKind, u32>>| done.lock().unwrap_or_else(|p| p.into_inner()).values().sum::<u32>();
    let started = Instant::now();
    let mut running: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    // Faults begun whose doing has not ended (done or not).
    let undecided = Arc::new(AtomicU32::new(0));
    let mut drawn = 0;
    let mut faults = schedule(&options.plan);
    // A long run says how far it is, every hundred faults done.
    let mut told = 0;
    while count(&done) < options.faults {
        running.retain(|task| !task.is_finished());
        if count(&done) / 100 > told {
            told = count(&done) / 100;
            println!("{} faults done ({drawn} drawn) after {:.0?}", told * 100, started.elapsed());
        }
        // Enough on their way: draw more only if some turn out not done.
        if count(&done) + undecided.load(Ordering::SeqCst) >= options.faults {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let Some(fault) = faults.next() else { break };
        drawn += 1;
        if let Some(wait) = fault.at.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        // A violation seen: the rest would only bury it.
        let violated = budget.violation().or(fencing.violation());
        if twice.lock().unwrap_or_else(|p| p.into_inner()).is_some() || violated.is_some() {
            break;
        }
        let (on, done, recoveries, log) = (cluster.clone(), done.clone(), recoveries.clone(), log.clone());
        undecided.fetch_add(1, Ordering::SeqCst);
        let decided = undecided.clone();
        running.push(tokio::spawn(async move {
            let begun = Instant::now();
            let entry = log.begin(&fault);
            let outcome = on.run(&fault).await;
            if let Ok(Some(_)) = outcome {
                *done.lock().unwrap_or_else(|p| p.into_inner()).entry(fault.kind).or_default() += 1;
            }
            decided.fetch_sub(1, Ordering::SeqCst);
            match outcome {
                Ok(Some(awaited)) => {
                    log.end(entry, true);
                    // How long from the fault's start until the cluster is
                    // whole again, after what the fault awaits.
                    if checks::recovered(&on.admin(), &expected, &awaited, Duration::from_secs(300)).await.is_ok() {
                        let mut recoveries = recoveries.lock().unwrap_or_else(|p| p.into_inner());
                        recoveries.entry(fault.kind).or_default().push(begun.elapsed());
                    }
                }
                Ok(None) => log.end(entry, false),
                Err(error) => {
                    log.end(entry, false);
                    println!("fault {fault} could not be done: {error:#}");
                }
            }
        }));
        // Where the clients go follows the members.
        if let Ok(endpoints) = checks::client_endpoints(&cluster.admin()).await {
            recorder.set_endpoints(endpoints);
        }
    }
    for task in running {
        let _ = task.await;
    }
    cluster.heal();
    let whole = checks::whole_again(&cluster.admin(), &expected, Duration::from_secs(300)).await;
    let commits = match workload {
        Some(workload) => Some(workload.finish().await),
        None => None,
    };
    stop.cancel();
    for task in tasks {
        let _ = task.await;
    }
    let _ = scan.await;
    let history = recorder.history();
    let report = Report {
        seed: options.plan.seed,
        asked: options.faults,
        drawn,
        done: done.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        recoveries: recoveries.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        operations: history.len(),
        disruptions_checked: budget.grants(),
        issues_checked: fencing.checked(),
        commits: commits.as_ref().and_then(|c| c.as_ref().ok().copied()),
    };
    println!("{report}");
    if let Some(seen) = twice.lock().unwrap_or_else(|p| p.into_inner()).clone() {
        bail!("violation: {seen}\nthe faults around it:\n{}", log.around(seen.at, seen.at));
    }
    if let Some(seen) = budget.violation().or(fencing.violation()) {
        bail!("violation: {seen}\nthe faults around it:\n{}", log.around(seen.at, seen.at));
    }
    whole.context("violation: the cluster did not come back whole")?;
    checks::ended(&cluster.admin()).await?;
    if let Some(Err(violation)) = commits {
        return Err(violation);
    }
    let checking = Instant::now();
    let linearizable = check(&Register, &history);
    println!("{} operations checked for linearizability in {:.1?}", history.len(), checking.elapsed());
    if let Err(violation) = linearizable {
        let ops: Vec<_> = violation.operations.iter().map(|&i| &history[i]).collect();
        let from = ops.iter().map(|o| o.call).min().unwrap_or_default();
        let to = ops.iter().filter_map(|o| o.ret).max().unwrap_or(from);
        let lines: Vec<String> = ops.iter().take(40).map(|o| report::operation_line(o)).collect();
        bail!(
            "violation: key {} is not linearizable; its operations (times in ms from the start):\n{}\nthe faults around them:\n{}",
            violation.key,
            lines.join("\n"),
            log.around(from, to)
        );
    }
    println!(
        "no violation: {} operations linearizable, {} disruptions within the budget, {} Command issues in their \
         leader's term, every member configured, every node Ready",
        history.len(),
        report.disruptions_checked,
        report.issues_checked
    );
    Ok(report)
}
