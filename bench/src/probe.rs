//! The write probe: one thread per PostgreSQL instance inserts a value
//! unique across the run every 10 ms (from inside the instance's network
//! namespace when it has one, so a cut-off primary is still sampled), and
//! records when each acknowledged write came back. The rest of this
//! module reads those timelines: how long no client could write, which
//! acknowledged values are missing, and when two instances took writes at
//! the same instant.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// How often each probe writes.
const EVERY: Duration = Duration::from_millis(10);
/// A write not acknowledged within this is given up (its connection too).
const WRITE_TIMEOUT: Duration = Duration::from_millis(500);
/// Acknowledged writes of one instance this close together belong to one
/// stretch in which it took writes.
const SAME_STRETCH: u128 = 100_000_000;

pub fn now_ns() -> u128 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos()
}

/// One acknowledged write: when its answer came back, and its value.
#[derive(Clone, Copy, Debug)]
pub struct Ack {
    pub at: u128,
    pub value: i64,
}

/// Where one instance is reached.
#[derive(Clone, Debug)]
pub struct Target {
    pub host: String,
    pub port: u16,
    /// The network namespace to connect from (`/var/run/netns/NAME`).
    pub netns: Option<String>,
}

/// One probe: a thread writing to one instance until stopped.
pub struct Probe {
    timeline: Arc<Mutex<Vec<Ack>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Probe {
    /// Starts a probe of `target`; values come from `next_value`, shared
    /// by every probe of the run.
    pub fn start(target: Target, next_value: Arc<AtomicI64>) -> Probe {
        let (timeline, stop) = (Arc::<Mutex<Vec<Ack>>>::default(), Arc::new(AtomicBool::new(false)));
        let (into, stopped) = (timeline.clone(), stop.clone());
        let thread = std::thread::spawn(move || probe(target, into, stopped, next_value));
        Probe { timeline, stop, thread: Some(thread) }
    }

    /// Stops it (a write in flight is waited for); its acknowledged writes.
    pub fn finish(&mut self) -> Vec<Ack> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.acks()
    }

    /// Its acknowledged writes so far, in order.
    pub fn acks(&self) -> Vec<Ack> {
        self.timeline.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The probes of one system's instances, running until dropped.
pub struct Probes(Vec<Probe>);

impl Probes {
    /// Starts a probe per target; values come from `next_value`, shared
    /// by every probe of the run.
    pub fn start(targets: &[Target], next_value: Arc<AtomicI64>) -> Probes {
        Probes(targets.iter().map(|target| Probe::start(target.clone(), next_value.clone())).collect())
    }

    /// Stops the probes (a write in flight is waited for) and gives every
    /// instance's acknowledged writes: what is read back afterwards was
    /// written before it is read.
    pub fn finish(&mut self) -> Vec<Vec<Ack>> {
        self.0.iter_mut().map(Probe::finish).collect()
    }

    /// Every instance's acknowledged writes so far, in order.
    pub fn timelines(&self) -> Vec<Vec<Ack>> {
        self.0.iter().map(Probe::acks).collect()
    }

    /// Every instance's acknowledged writes after `at`.
    pub fn timelines_since(&self, at: u128) -> Vec<Vec<Ack>> {
        let since = |acks: Vec<Ack>| acks[acks.partition_point(|a| a.at <= at)..].to_vec();
        self.0.iter().map(|p| since(p.acks())).collect()
    }
}

fn probe(target: Target, timeline: Arc<Mutex<Vec<Ack>>>, stop: Arc<AtomicBool>, next_value: Arc<AtomicI64>) {
    if let Some(netns) = &target.netns {
        use std::os::fd::AsRawFd;
        let Ok(file) = std::fs::File::open(format!("/var/run/netns/{netns}")) else {
            eprintln!("probe: network namespace {netns} is gone");
            return;
        };
        // SAFETY: setns on this thread only, with an open namespace fd; a
        // socket belongs to the namespace its thread was in when it was made.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            eprintln!("probe: setns into {netns} failed");
            return;
        }
    }
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
    runtime.block_on(async move {
        let mut client = None;
        while !stop.load(Ordering::SeqCst) {
            if client.as_ref().is_none_or(|c: &tokio_postgres::Client| c.is_closed()) {
                client = connect(&target.host, target.port).await;
            }
            if let Some(c) = &client {
                let value = next_value.fetch_add(1, Ordering::SeqCst);
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&value];
                let insert = c.execute("insert into probe (v) values ($1)", &params);
                match tokio::time::timeout(WRITE_TIMEOUT, insert).await {
                    Ok(Ok(_)) => timeline.lock().unwrap_or_else(|p| p.into_inner()).push(Ack { at: now_ns(), value }),
                    // A standby (read-only), a server shutting down, no table yet.
                    Ok(Err(_)) => {}
                    Err(_) => client = None,
                }
            }
            tokio::time::sleep(EVERY).await;
        }
    });
}

/// A connection as `postgres` (trusted), or None within about a second.
pub async fn connect(host: &str, port: u16) -> Option<tokio_postgres::Client> {
    let config = format!("host={host} port={port} user=postgres dbname=postgres connect_timeout=1");
    let connecting = tokio_postgres::connect(&config, tokio_postgres::NoTls);
    let (client, connection) = tokio::time::timeout(Duration::from_secs(2), connecting).await.ok()?.ok()?;
    tokio::spawn(connection);
    Some(client)
}

/// Writes have flowed again for this long after the longest gap: the
/// outage is over.
const FLOWING_AGAIN: u128 = 1_000_000_000;

/// The outage around a fault injected at `fault`: the longest time
/// between two writes a client could see acknowledged (any before the
/// fault; after it, only of instances `visible` allows: not a cut-off
/// one's), from the last before the fault on, once it has ended after the
/// fault and writes have flowed again for a second, up to `now`. A write a
/// dying primary still acknowledged just after the fault does not end it.
/// None while it has not ended.
pub fn outage(timelines: &[Vec<Ack>], fault: u128, visible: impl Fn(usize) -> bool, now: u128) -> Option<Duration> {
    let mut seen: Vec<u128> = timelines
        .iter()
        .enumerate()
        .flat_map(|(i, acks)| {
            let seen_after = visible(i);
            acks.iter().map(|a| a.at).filter(move |at| *at <= fault || seen_after)
        })
        .collect();
    seen.sort_unstable();
    let from = seen.partition_point(|at| *at <= fault).saturating_sub(1);
    let seen = &seen[from..];
    let (began, ended) =
        seen.windows(2).map(|w| (w[0], w[1])).max_by_key(|(began, ended)| ended - began).filter(|(_, e)| *e > fault)?;
    let last = *seen.last()?;
    let flowing = last + 100_000_000 >= now && last - ended >= FLOWING_AGAIN;
    flowing.then(|| Duration::from_nanos(u64::try_from(ended - began).unwrap_or(u64::MAX)))
}

/// An acknowledged write missing at the end: its value, the instance
/// that acknowledged it, and when.
#[derive(Clone, Copy, Debug)]
pub struct Lost {
    pub value: i64,
    pub instance: usize,
    pub at: u128,
}

/// The acknowledged writes whose values are missing from `stored`.
pub fn lost(timelines: &[Vec<Ack>], stored: &BTreeSet<i64>) -> Vec<Lost> {
    let acked = timelines.iter().enumerate().flat_map(|(instance, acks)| acks.iter().map(move |a| (instance, a)));
    acked
        .filter(|(_, a)| !stored.contains(&a.value))
        .map(|(instance, a)| Lost { value: a.value, instance, at: a.at })
        .collect()
}

/// The stretches (first and last acknowledged write) in which each
/// instance took writes.
fn stretches(acks: &[Ack]) -> Vec<(u128, u128)> {
    let mut out: Vec<(u128, u128)> = Vec::new();
    for ack in acks {
        match out.last_mut() {
            Some(last) if ack.at - last.1 <= SAME_STRETCH => last.1 = ack.at,
            _ => out.push((ack.at, ack.at)),
        }
    }
    out
}

/// The instants at which two instances both took writes: each pair of
/// overlapping stretches of two instances, as (instance, instance, from).
pub fn two_writable(timelines: &[Vec<Ack>]) -> Vec<(usize, usize, u128)> {
    let stretched: Vec<Vec<(u128, u128)>> = timelines.iter().map(|t| stretches(t)).collect();
    let mut found = Vec::new();
    for (a, ours) in stretched.iter().enumerate() {
        for (b, theirs) in stretched.iter().enumerate().skip(a + 1) {
            for (from, to) in ours {
                for (their_from, their_to) in theirs {
                    if from.max(their_from) <= to.min(their_to) {
                        found.push((a, b, *from.max(their_from)));
                    }
                }
            }
        }
    }
    found
}
