//! What a soak says: the faults done by kind with how long the cluster
//! took to be whole again after each (p50, p99), and, for a violation,
//! the faults that were on around it. Times are from one clock started
//! when the clients start (nanoseconds; printed in milliseconds).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::linearizable::{Operation, RegisterInput};
use crate::schedule::{Fault, FaultKind};

/// A violation seen while the soak ran, and when.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: u64,
    pub what: String,
}

impl fmt::Display for Seen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at {} ms: {}", self.at / 1_000_000, self.what)
    }
}

/// The faults, done or not, with when each was on.
#[derive(Clone)]
pub struct FaultLog {
    clock: Instant,
    entries: Arc<Mutex<Vec<Entry>>>,
}

struct Entry {
    fault: String,
    from: u64,
    to: Option<u64>,
    done: bool,
}

impl FaultLog {
    pub fn new(clock: Instant) -> Self {
        FaultLog { clock, entries: Arc::default() }
    }

    fn now(&self) -> u64 {
        self.clock.elapsed().as_nanos() as u64
    }

    /// A fault begun now; its place, to [`FaultLog::end`] it.
    pub fn begin(&self, fault: &Fault) -> usize {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.push(Entry { fault: fault.to_string(), from: self.now(), to: None, done: false });
        entries.len() - 1
    }

    pub fn end(&self, entry: usize, done: bool) {
        let now = self.now();
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = entries.get_mut(entry) {
            entry.to = Some(now);
            entry.done = done;
        }
    }

    /// The faults done that were on within 10 s of `from..=to`, one per line.
    pub fn around(&self, from: u64, to: u64) -> String {
        let margin = Duration::from_secs(10).as_nanos() as u64;
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let lines: Vec<String> = entries
            .iter()
            .filter(|e| e.done && e.from <= to + margin && e.to.is_none_or(|end| end + margin >= from))
            .map(|e| {
                let end = e.to.map_or("on".to_string(), |t| format!("{} ms", t / 1_000_000));
                format!("  {} ms to {end}: {}", e.from / 1_000_000, e.fault)
            })
            .collect();
        if lines.is_empty() { "  (none)".to_string() } else { lines.join("\n") }
    }
}

/// One client operation, for a violation's history.
pub fn operation_line(operation: &Operation<RegisterInput, Option<String>>) -> String {
    let ret = operation.ret.map_or("no answer".to_string(), |t| format!("{} ms", t / 1_000_000));
    format!("  {} ms to {ret}: {:?} -> {:?}", operation.call / 1_000_000, operation.input, operation.output)
}

/// A soak's figures.
#[derive(Clone, Debug)]
pub struct Report {
    pub seed: u64,
    /// Faults asked for, drawn, and done by kind.
    pub asked: u32,
    pub drawn: u32,
    pub done: BTreeMap<FaultKind, u32>,
    pub recoveries: HashMap<FaultKind, Vec<Duration>>,
    /// Client operations recorded (and checked).
    pub operations: usize,
    /// Disruptions granted, each checked against the budget.
    pub disruptions_checked: u32,
    /// Command issues stored, each checked against the lease's term.
    pub issues_checked: u32,
    /// Commits the PostgreSQL primaries acknowledged (each found on the
    /// last), when the workload ran and held.
    pub commits: Option<usize>,
}

impl Report {
    pub fn total_done(&self) -> u32 {
        self.done.values().sum()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {}: {} faults done ({} asked, {} drawn), {} client operations recorded, {} disruptions granted, \
             {} Command issues",
            self.seed,
            self.total_done(),
            self.asked,
            self.drawn,
            self.operations,
            self.disruptions_checked,
            self.issues_checked
        )?;
        if let Some(commits) = self.commits {
            writeln!(f, "{commits} PostgreSQL commits acknowledged, every one on the last primary")?;
        }
        writeln!(f, "{:<16} {:>6} {:>10} {:>10}", "fault", "done", "p50", "p99")?;
        for (kind, count) in &self.done {
            let mut times = self.recoveries.get(kind).cloned().unwrap_or_default();
            times.sort();
            let at = |q: f64| {
                times
                    .get(((times.len() as f64 - 1.0) * q).round() as usize)
                    .map_or("-".to_string(), |d| format!("{:.1}s", d.as_secs_f64()))
            };
            writeln!(f, "{:<16} {:>6} {:>10} {:>10}", format!("{kind:?}"), count, at(0.5), at(0.99))?;
        }
        Ok(())
    }
}
