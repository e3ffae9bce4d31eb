//! The server's Prometheus metrics, kept with the `prometheus-client`
//! crate and served at `/metrics` in the Prometheus text format: counters,
//! gauges, and latency histograms of API requests, store commits,
//! controllers' reconcile passes and Commands (created to settled). The
//! store's own counters are read at each scrape ([`StoreCollector`]); the
//! store reports each commit's duration through its commit observer.

use std::time::Duration;

use herd_core::kinds::NodeSpec;
use herd_core::quantity::Millicores;
use herd_store::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::reflector::Reflector;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: String,
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabels {
    action: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HolderLabels {
    holder: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JoinRefusalLabels {
    /// `refused`: the token was looked at and is not valid; `limited`:
    /// answered 429 without looking, the source being over its rate.
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReadyLabels {
    ready: &'static str,
}

/// From 0.5 ms doubling to about 16 s: API calls and commits are
/// milliseconds, a slow disk or a large list is seconds.
fn latency_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// From 50 ms doubling to about 14 minutes: Commands run from a start to
/// a copy of gigabytes.
fn command_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.05, 2.0, 15))
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    request_seconds: Family<RouteLabels, Histogram, fn() -> Histogram>,
    reconcile_seconds: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    command_seconds: Family<CommandLabels, Histogram, fn() -> Histogram>,
    pub watches_active: Gauge,
    leading: Gauge,
    started_leading: Counter,
    stopped_leading: Counter,
    lease_transitions: Gauge,
    lease_holder: Family<HolderLabels, Gauge>,
    /// Leader-only writes refused because this replica's leadership had ended.
    pub fenced_writes: Counter,
    /// Calls to offline nodes' agents refused without connecting.
    pub offline_calls_refused: Counter,
    /// Bytes of configuration (documents and deltas) heartbeat answers carried.
    pub configuration_bytes_sent: Counter,
    join_refusals: Family<JoinRefusalLabels, Counter>,
    nodes: Family<ReadyLabels, Gauge>,
}

impl Metrics {
    pub fn new(store: &Store) -> Metrics {
        let mut metrics = Metrics {
            registry: Registry::default(),
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(latency_buckets as fn() -> Histogram),
            reconcile_seconds: Family::new_with_constructor(latency_buckets as fn() -> Histogram),
            command_seconds: Family::new_with_constructor(command_buckets as fn() -> Histogram),
            watches_active: Gauge::default(),
            leading: Gauge::default(),
            started_leading: Counter::default(),
            stopped_leading: Counter::default(),
            lease_transitions: Gauge::default(),
            lease_holder: Family::default(),
            fenced_writes: Counter::default(),
            offline_calls_refused: Counter::default(),
            configuration_bytes_sent: Counter::default(),
            join_refusals: Family::default(),
            nodes: Family::default(),
        };
        let r = &mut metrics.registry;
        r.register("herd_http_requests", "HTTP requests served", metrics.requests.clone());
        r.register_with_unit(
            "herd_http_request_duration",
            "Time to answer an HTTP request (a watch: until its headers)",
            Unit::Seconds,
            metrics.request_seconds.clone(),
        );
        r.register_with_unit(
            "herd_reconcile_duration",
            "Time a leader's controller took for one reconcile pass",
            Unit::Seconds,
            metrics.reconcile_seconds.clone(),
        );
        r.register_with_unit(
            "herd_command_duration",
            "Time from a Command's creation to its settling, seen by the leader",
            Unit::Seconds,
            metrics.command_seconds.clone(),
        );
        let commit_seconds = latency_buckets();
        r.register_with_unit(
            "herd_store_commit_duration",
            "Time one backend commit took (a group of transactions, one fsync)",
            Unit::Seconds,
            commit_seconds.clone(),
        );
        store.stats().observe_commits(Box::new(move |took: Duration| commit_seconds.observe(took.as_secs_f64())));
        r.register_collector(Box::new(StoreCollector(store.clone())));
        r.register("herd_watches_active", "Open watch streams", metrics.watches_active.clone());
        r.register("herd_leader", "1 while this replica holds the leader lease", metrics.leading.clone());
        r.register("herd_leader_started", "Times this replica started leading", metrics.started_leading.clone());
        r.register("herd_leader_stopped", "Times this replica stopped leading", metrics.stopped_leading.clone());
        r.register(
            "herd_lease_transitions",
            "How many times the leader lease changed hands",
            metrics.lease_transitions.clone(),
        );
        r.register("herd_lease_holder", "The lease holder as this replica last read it", metrics.lease_holder.clone());
        r.register(
            "herd_fenced_writes",
            "Leader-only writes refused because this replica no longer led",
            metrics.fenced_writes.clone(),
        );
        r.register(
            "herd_offline_calls_refused",
            "Calls to an offline node's agent refused without connecting",
            metrics.offline_calls_refused.clone(),
        );
        r.register_with_unit(
            "herd_configuration_sent",
            "Configuration documents and deltas sent to master candidates",
            Unit::Bytes,
            metrics.configuration_bytes_sent.clone(),
        );
        r.register(
            "herd_join_refusals",
            "Joins refused for their token (refused), or unread because their source was over its rate (limited)",
            metrics.join_refusals.clone(),
        );
        r.register("herd_nodes", "Nodes by readiness, as last seen by the node controller", metrics.nodes.clone());
        metrics
    }

    pub fn started_leading(&self) {
        self.leading.set(1);
        self.started_leading.inc();
    }

    pub fn stopped_leading(&self) {
        self.leading.set(0);
        self.stopped_leading.inc();
    }

    /// The lease as last read: who holds it, how many times it changed hands.
    pub fn observe_lease(&self, holder: &str, transitions: u64) {
        let labels = HolderLabels { holder: holder.to_string() };
        if self.lease_holder.get(&labels).is_none() {
            self.lease_holder.clear();
            self.lease_holder.get_or_create(&labels).set(1);
        }
        self.lease_transitions.set(i64::try_from(transitions).unwrap_or(i64::MAX));
    }

    pub fn observe_request(&self, method: &str, route: &str, code: u16, elapsed: Duration) {
        let (method, route) = (method.to_string(), route.to_string());
        self.request_seconds
            .get_or_create(&RouteLabels { method: method.clone(), route: route.clone() })
            .observe(elapsed.as_secs_f64());
        self.requests.get_or_create(&RequestLabels { method, route, code }).inc();
    }

    /// A join refused for its token; `limited`: without looking at it.
    pub fn join_refused(&self, limited: bool) {
        let outcome = if limited { "limited" } else { "refused" };
        self.join_refusals.get_or_create(&JoinRefusalLabels { outcome }).inc();
    }

    /// One reconcile pass of `controller`, and whether it failed.
    pub fn observe_reconcile(&self, controller: &'static str, failed: bool, elapsed: Duration) {
        let labels = ControllerLabels { controller, outcome: if failed { "error" } else { "ok" } };
        self.reconcile_seconds.get_or_create(&labels).observe(elapsed.as_secs_f64());
    }

    /// `written`, a Command as just written over one that was in state
    /// `before`: if that write settled it, how long it took from its
    /// creation (observed where each settling is written, so once each).
    pub fn observe_settling(&self, written: &herd_core::kinds::Command, before: herd_core::kinds::ManagementState) {
        let status = &written.status;
        if before.is_settled() || !status.state_by_management.is_settled() {
            return;
        }
        let (Some(created), Some(settled)) = (written.metadata.creation_timestamp, status.updated) else { return };
        let Ok(took) = settled.system_time().duration_since(created.system_time()) else { return };
        let labels = CommandLabels {
            action: written.spec.action.type_name().to_string(),
            state: format!("{:?}", status.state_by_management),
        };
        self.command_seconds.get_or_create(&labels).observe(took.as_secs_f64());
    }

    pub fn observe_nodes(&self, ready: usize, not_ready: usize) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.nodes.get_or_create(&ReadyLabels { ready: "true" }).set(count(ready));
        self.nodes.get_or_create(&ReadyLabels { ready: "false" }).set(count(not_ready));
    }

    /// Exports what each node has for members and what they use, read
    /// from `nodes` at each scrape.
    pub fn collect_usage(&mut self, nodes: Reflector<NodeSpec>) {
        self.registry.register_collector(Box::new(UsageCollector(nodes)));
    }

    /// Everything, in the Prometheus text format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(error) = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry) {
            tracing::error!(%error, "encoding the metrics failed");
        }
        out
    }
}

/// The store's counters, read at each scrape.
struct StoreCollector(Store);

impl std::fmt::Debug for StoreCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreCollector")
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    backend: &'static str,
}

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let stats = self.0.stats();
        let backend = BackendLabels { backend: self.0.backend_name() };
        let counters = [
            ("herd_store_commits", "Backend transactions committed (one fsync each).", stats.commits.load(Relaxed)),
            ("herd_store_transactions", "Store transactions carried by those commits.", stats.txns.load(Relaxed)),
            ("herd_store_commit_failures", "Backend commits that failed.", stats.commit_failures.load(Relaxed)),
        ];
        for (name, help, value) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(family.encode_family(&backend)?)?;
        }
        let head = i64::try_from(self.0.head()).unwrap_or(i64::MAX);
        let metric = encoder.encode_descriptor(
            "herd_store_revision",
            "The newest store revision seen.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(head).encode(metric)
    }
}

/// What nodes have for members and what their members use (as the
/// members' cgroups count it, in the nodes' last reports), read at each
/// scrape.
struct UsageCollector(Reflector<NodeSpec>);

impl std::fmt::Debug for UsageCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UsageCollector")
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberLabels {
    node: String,
    member: String,
}

/// One gauge family: each value with its labels.
fn gauges<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: impl Iterator<Item = (L, f64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in values {
        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for UsageCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let nodes = self.0.list_shared();
        let cores = |millicores: Millicores| millicores.0 as f64 / 1000.0;
        let allocatable =
            || nodes.iter().filter_map(|n| Some((NodeLabels { node: n.metadata.name.clone() }, n.status.allocatable?)));
        gauges(
            &mut encoder,
            "herd_node_allocatable_cpu_cores",
            "CPU members may request of the node: its capacity less what its agent keeps back.",
            allocatable().map(|(labels, a)| (labels, cores(a.cpu))),
        )?;
        gauges(
            &mut encoder,
            "herd_node_allocatable_memory_bytes",
            "Memory members may request of the node.",
            allocatable().map(|(labels, a)| (labels, a.memory.0 as f64)),
        )?;
        // Members of Ready nodes only: a NotReady node's report is not current.
        let usage = || {
            nodes.iter().filter(|n| n.status.ready).flat_map(|n| {
                n.status.members.iter().filter(|r| r.running).filter_map(|r| {
                    Some((MemberLabels { node: n.metadata.name.clone(), member: r.name.clone() }, r.usage?))
                })
            })
        };
        gauges(
            &mut encoder,
            "herd_member_cpu_cores",
            "CPU the member uses, as its cgroup counts it (between its node's last two reads).",
            usage().filter_map(|(labels, u)| Some((labels, cores(u.cpu?)))),
        )?;
        gauges(
            &mut encoder,
            "herd_member_memory_working_set_bytes",
            "Memory the member uses less the page cache the kernel can drop at once.",
            usage().filter_map(|(labels, u)| Some((labels, u.memory?.0 as f64))),
        )
    }
}
