//! Prometheus metrics in the text exposition format, kept by hand: a few
//! counters and gauges do not need a metrics framework.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use herd_store::Store;

#[derive(Default)]
struct RequestStats {
    count: u64,
    seconds: f64,
}

#[derive(Default)]
pub struct Metrics {
    /// (method, route, status code) to count and total time.
    requests: Mutex<BTreeMap<(String, String, u16), RequestStats>>,
    pub watches_active: AtomicI64,
    leadership: Mutex<Leadership>,
    /// Leader-only writes refused because this replica's leadership had ended.
    pub fenced_writes: AtomicU64,
    /// Calls to offline nodes' agents refused without connecting.
    pub offline_calls_refused: AtomicU64,
    /// Bytes of configuration (documents and deltas) heartbeat answers carried.
    pub configuration_bytes_sent: AtomicU64,
    pub nodes_ready: AtomicI64,
    pub nodes_not_ready: AtomicI64,
}

/// The leader election as this replica saw it.
#[derive(Default)]
struct Leadership {
    leading: bool,
    started: u64,
    stopped: u64,
    holder: String,
    lease_transitions: u64,
}

impl Metrics {
    pub fn started_leading(&self) {
        self.with_leadership(|l| {
            l.leading = true;
            l.started += 1;
        });
    }

    pub fn stopped_leading(&self) {
        self.with_leadership(|l| {
            l.leading = false;
            l.stopped += 1;
        });
    }

    /// The lease as last read: who holds it, how many times it changed hands.
    pub fn observe_lease(&self, holder: &str, transitions: u64) {
        self.with_leadership(|l| {
            if l.holder != holder {
                l.holder = holder.to_string();
            }
            l.lease_transitions = transitions;
        });
    }

    fn with_leadership(&self, change: impl FnOnce(&mut Leadership)) {
        if let Ok(mut leadership) = self.leadership.lock() {
            change(&mut leadership);
        }
    }

    pub fn observe_request(&self, method: &str, route: &str, code: u16, elapsed: Duration) {
        if let Ok(mut requests) = self.requests.lock() {
            let stats = requests.entry((method.to_string(), route.to_string(), code)).or_default();
            stats.count += 1;
            stats.seconds += elapsed.as_secs_f64();
        }
    }

    pub fn render(&self, store: &Store) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP herd_http_requests_total HTTP requests served.\n# TYPE herd_http_requests_total counter"
        );
        let mut durations = String::new();
        let _ = writeln!(
            durations,
            "# HELP herd_http_request_duration_seconds_total Time spent serving HTTP requests.\n# TYPE herd_http_request_duration_seconds_total counter"
        );
        if let Ok(requests) = self.requests.lock() {
            for ((method, route, code), stats) in requests.iter() {
                let labels = format!("method=\"{method}\",route=\"{route}\",code=\"{code}\"");
                let _ = writeln!(out, "herd_http_requests_total{{{labels}}} {}", stats.count);
                let _ =
                    writeln!(durations, "herd_http_request_duration_seconds_total{{{labels}}} {:.6}", stats.seconds);
            }
        }
        out.push_str(&durations);
        let stats = store.stats();
        let backend = store.backend_name();
        let mut counter = |name: &str, help: &str, value: u64| {
            let _ =
                writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{backend=\"{backend}\"}} {value}");
        };
        counter(
            "herd_store_commits_total",
            "Backend transactions committed (one fsync each).",
            stats.commits.load(Ordering::Relaxed),
        );
        counter(
            "herd_store_transactions_total",
            "Store transactions carried by those commits.",
            stats.txns.load(Ordering::Relaxed),
        );
        counter(
            "herd_store_commit_failures_total",
            "Backend commits that failed.",
            stats.commit_failures.load(Ordering::Relaxed),
        );
        let _ = writeln!(
            out,
            "# HELP herd_store_revision The newest store revision seen.\n# TYPE herd_store_revision gauge\nherd_store_revision {}",
            store.head()
        );
        if let Ok(l) = self.leadership.lock() {
            let _ = writeln!(
                out,
                "# HELP herd_leader 1 while this replica holds the leader lease.\n# TYPE herd_leader gauge\nherd_leader {}",
                u8::from(l.leading)
            );
            let _ = writeln!(
                out,
                "# HELP herd_leader_started_total Times this replica started leading.\n# TYPE herd_leader_started_total counter\nherd_leader_started_total {}\n# HELP herd_leader_stopped_total Times this replica stopped leading.\n# TYPE herd_leader_stopped_total counter\nherd_leader_stopped_total {}",
                l.started, l.stopped
            );
            let _ = writeln!(
                out,
                "# HELP herd_lease_transitions How many times the leader lease changed hands.\n# TYPE herd_lease_transitions gauge\nherd_lease_transitions {}\n# HELP herd_lease_holder The lease holder as this replica last read it.\n# TYPE herd_lease_holder gauge\nherd_lease_holder{{holder=\"{}\"}} 1",
                l.lease_transitions, l.holder
            );
        }
        let _ = writeln!(
            out,
            "# HELP herd_fenced_writes_total Leader-only writes refused because this replica no longer led.\n# TYPE herd_fenced_writes_total counter\nherd_fenced_writes_total {}",
            self.fenced_writes.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP herd_offline_calls_refused_total Calls to an offline node's agent refused without connecting.\n# TYPE herd_offline_calls_refused_total counter\nherd_offline_calls_refused_total {}",
            self.offline_calls_refused.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP herd_configuration_bytes_sent_total Bytes of configuration documents and deltas sent to master candidates.\n# TYPE herd_configuration_bytes_sent_total counter\nherd_configuration_bytes_sent_total {}",
            self.configuration_bytes_sent.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP herd_watches_active Open watch streams.\n# TYPE herd_watches_active gauge\nherd_watches_active {}",
            self.watches_active.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP herd_nodes Nodes by readiness, as last seen by the node controller.\n# TYPE herd_nodes gauge\nherd_nodes{{ready=\"true\"}} {}\nherd_nodes{{ready=\"false\"}} {}",
            self.nodes_ready.load(Ordering::Relaxed),
            self.nodes_not_ready.load(Ordering::Relaxed)
        );
        out
    }
}
