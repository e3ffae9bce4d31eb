//! `ClusterConfig`: the cluster-wide settings, a singleton named `cluster`.

use super::member_run::LogRotation;
use crate::descriptor::{Access, Cell, Column, NodeAccess};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::NoStatus;
use crate::resource::{Object, Resource};
use crate::time::HumanDuration;
use crate::validation::{FieldPath, ValidationErrors, check_name};

pub type ClusterConfig = Object<ClusterConfigSpec>;

/// The shortest heartbeat period, reconcile interval and retry delay.
const MIN_PERIOD: Duration = Duration::from_millis(100);

/// The one allowed name of the ClusterConfig object.
pub const CLUSTER_CONFIG_NAME: &str = "cluster";

/// The largest candidate pool a ClusterConfig may ask for.
pub const MAX_CANDIDATE_POOL: u32 = 10_000;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ClusterConfigSpec {
    /// How many master candidates the leader keeps (Ganeti's pool).
    pub candidate_pool_size: u32,
    pub leader_election: LeaderElectionSettings,
    /// How often agents send a heartbeat.
    pub heartbeat_period: HumanDuration,
    /// A node whose heartbeats stop for longer than this is NotReady.
    pub node_grace_period: HumanDuration,
    pub commands: CommandSettings,
    pub app_clusters: AppClusterSettings,
}

/// The most revisions of an App kept: each is a copy of its spec, in the
/// store and in every master candidate's configuration.
pub const MAX_REVISIONS_KEPT: u32 = 100;

/// How the leader runs app clusters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AppClusterSettings {
    /// The ports handed to members' named ports: first..=last on each host.
    pub first_member_port: u16,
    pub last_member_port: u16,
    /// A member whose node has been NotReady this long is recovered
    /// elsewhere (without persistent storage) or says it waits for
    /// `herd member replace` (with it).
    pub node_loss_grace: HumanDuration,
    /// How members' standard output and error are rotated, where their
    /// role does not say (`run.logs`).
    pub member_logs: LogRotation,
    /// How many revisions of each App are kept (`herd app history`),
    /// besides those a cluster or a member runs.
    pub revisions_kept: u32,
}

impl Default for AppClusterSettings {
    fn default() -> Self {
        AppClusterSettings {
            first_member_port: 20000,
            last_member_port: 29999,
            node_loss_grace: HumanDuration::from_secs(300),
            member_logs: LogRotation::default(),
            revisions_kept: 10,
        }
    }
}

impl AppClusterSettings {
    pub fn member_ports(&self) -> std::ops::RangeInclusive<u16> {
        self.first_member_port..=self.last_member_port
    }
}

/// How the leader reconciles Commands (CloudStack's reconcile settings).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CommandSettings {
    /// How often every unsettled Command is looked at.
    pub reconcile_interval: HumanDuration,
    /// A reconciliation still running after this is retried.
    pub reconciling_timeout: HumanDuration,
    /// How long an agent's final answer may take to arrive.
    pub answer_grace: HumanDuration,
    /// Reconciliation attempts before a Command is given up.
    pub max_attempts: u32,
    /// The pause before retrying a failed reconciliation, doubling with
    /// each retry (up to 5 minutes).
    pub retry_delay: HumanDuration,
}

impl Default for CommandSettings {
    fn default() -> Self {
        CommandSettings {
            reconcile_interval: HumanDuration::from_secs(2),
            reconciling_timeout: HumanDuration::from_secs(600),
            answer_grace: HumanDuration::from_secs(30),
            max_attempts: 30,
            retry_delay: HumanDuration::from_secs(2),
        }
    }
}

impl CommandSettings {
    pub fn reconcile(&self) -> crate::reconcile::ReconcileSettings {
        crate::reconcile::ReconcileSettings {
            reconciling_timeout: self.reconciling_timeout.get(),
            answer_grace: self.answer_grace.get(),
            max_attempts: self.max_attempts,
            retry_delay: self.retry_delay.get(),
        }
    }
}

impl Default for ClusterConfigSpec {
    fn default() -> Self {
        ClusterConfigSpec {
            candidate_pool_size: 10,
            leader_election: LeaderElectionSettings::default(),
            heartbeat_period: HumanDuration::from_secs(2),
            node_grace_period: HumanDuration::from_secs(10),
            commands: CommandSettings::default(),
            app_clusters: AppClusterSettings::default(),
        }
    }
}

/// How the control-plane replicas elect their leader: client-go's three
/// durations and fabric8's switches. A server's flags win over these
/// (see [`LeaderElectionOverrides`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LeaderElectionSettings {
    /// How long a lease holds without renewal before another may take it.
    pub lease_duration: HumanDuration,
    /// A leader that cannot renew within this steps down.
    pub renew_deadline: HumanDuration,
    /// How often the leader renews and the others look.
    pub retry_period: HumanDuration,
    /// The name of the Lease the replicas compete for (read at start).
    pub lock_name: String,
    /// Campaign only once the store answers and the caches are synced (read at start).
    pub wait_for_ready: bool,
    /// Record StartedLeading, StoppedLeading and NewLeader Events (read at start).
    pub publish_events: bool,
    /// On shutdown, give the lease up so that a standby takes over at once (read at start).
    pub release_on_shutdown: bool,
}

impl Default for LeaderElectionSettings {
    fn default() -> Self {
        LeaderElectionSettings {
            lease_duration: HumanDuration::from_secs(15),
            renew_deadline: HumanDuration::from_secs(10),
            retry_period: HumanDuration::from_secs(2),
            lock_name: "herd-leader".into(),
            wait_for_ready: true,
            publish_events: true,
            release_on_shutdown: true,
        }
    }
}

/// The shortest retry period: a tighter loop spins on the store for
/// nothing (1ms was accepted once and renewed 700 times a second).
pub const MIN_RETRY_PERIOD: Duration = Duration::from_millis(100);
/// The longest lease: a dead leader's lease may hold the cluster up this long.
pub const MAX_LEASE_DURATION: Duration = Duration::from_secs(3600);

/// A leader-election rule that does not hold: the field it is about, the
/// other fields whose values it compares with, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Breach {
    pub field: &'static str,
    pub others: &'static [&'static str],
    pub reason: String,
}

impl LeaderElectionSettings {
    /// The rules every setting must keep: retryPeriod at least
    /// [`MIN_RETRY_PERIOD`]; renewDeadline more than 1.2 x and at least
    /// 2 x retryPeriod (two renewals can fail before a step-down);
    /// leaseDuration whole seconds (the Lease records seconds), at most
    /// [`MAX_LEASE_DURATION`], and at least renewDeadline + retryPeriod (a
    /// leader that steps down at its deadline has stopped its work before
    /// anyone may take the lease); the lock name is an object name.
    pub fn breaches(&self) -> Vec<Breach> {
        lease_time_breaches(self.lease_duration, self.renew_deadline, self.retry_period)
    }

    /// [`Self::breaches`] and the lock name, as validation errors under `path`.
    pub fn validate(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        check_name(&path.child("lockName"), &self.lock_name, errors);
        for breach in self.breaches() {
            errors.add(&path.child(breach.field), breach.reason);
        }
    }
}

/// The rules of a lease's times, for the control plane's election and
/// an App role's leader alike: see [`LeaderElectionSettings::breaches`].
pub fn lease_time_breaches(
    lease_duration: HumanDuration,
    renew_deadline: HumanDuration,
    retry_period: HumanDuration,
) -> Vec<Breach> {
    let mut found = Vec::new();
    let mut breach = |field, others, reason: String| found.push(Breach { field, others, reason });
    let retry = retry_period.get();
    let renew = renew_deadline.get();
    let lease = lease_duration.get();
    if retry < MIN_RETRY_PERIOD {
        breach(
            "retryPeriod",
            &[],
            format!("must be at least {}, is {}", HumanDuration(MIN_RETRY_PERIOD), retry_period),
        );
    }
    if renew.as_secs_f64() <= retry.as_secs_f64() * 1.2 {
        let reason = format!(
            "must be more than 1.2 x retryPeriod ({}), is {}",
            HumanDuration(retry.mul_f64(1.2)),
            renew_deadline
        );
        breach("renewDeadline", &["retryPeriod"], reason);
    } else if renew < retry.saturating_mul(2) {
        let reason = format!(
            "must be at least 2 x retryPeriod ({}), is {}",
            HumanDuration(retry.saturating_mul(2)),
            renew_deadline
        );
        breach("renewDeadline", &["retryPeriod"], reason);
    }
    if lease <= renew {
        let reason = format!("must be more than renewDeadline ({}), is {}", renew_deadline, lease_duration);
        breach("leaseDuration", &["renewDeadline"], reason);
    } else if lease < renew.saturating_add(retry) {
        let reason = format!(
            "must be at least renewDeadline + retryPeriod ({}), is {}",
            HumanDuration(renew.saturating_add(retry)),
            lease_duration
        );
        breach("leaseDuration", &["renewDeadline", "retryPeriod"], reason);
    }
    if lease > MAX_LEASE_DURATION {
        breach(
            "leaseDuration",
            &[],
            format!("must be at most {}, is {}", HumanDuration(MAX_LEASE_DURATION), lease_duration),
        );
    } else if lease.subsec_nanos() != 0 {
        breach(
            "leaseDuration",
            &[],
            format!("must be whole seconds (the Lease records seconds), is {}", lease_duration),
        );
    }
    found
}

/// Leader-election settings given to one server (its command-line flags).
/// Each one given wins over the ClusterConfig's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaderElectionOverrides {
    pub lease_duration: Option<HumanDuration>,
    pub renew_deadline: Option<HumanDuration>,
    pub retry_period: Option<HumanDuration>,
    pub lock_name: Option<String>,
    pub wait_for_ready: Option<bool>,
    pub publish_events: Option<bool>,
    pub release_on_shutdown: Option<bool>,
}

/// Each overridable setting: its field, its flag, and whether a flag set it.
type Override = (&'static str, &'static str, fn(&LeaderElectionOverrides) -> bool);
const OVERRIDES: [Override; 7] = [
    ("leaseDuration", "--lease-duration", |o| o.lease_duration.is_some()),
    ("renewDeadline", "--renew-deadline", |o| o.renew_deadline.is_some()),
    ("retryPeriod", "--retry-period", |o| o.retry_period.is_some()),
    ("lockName", "--lock-name", |o| o.lock_name.is_some()),
    ("waitForReady", "--wait-for-ready", |o| o.wait_for_ready.is_some()),
    ("publishEvents", "--publish-events", |o| o.publish_events.is_some()),
    ("releaseOnShutdown", "--release-on-shutdown", |o| o.release_on_shutdown.is_some()),
];

impl LeaderElectionOverrides {
    /// The settings in effect: `base` (the ClusterConfig's) with these on
    /// top, validated. Each error names where its setting came from: the
    /// flag (`--renew-deadline`) or the ClusterConfig field
    /// (`ClusterConfig spec.leaderElection.renewDeadline`).
    pub fn apply(&self, base: &LeaderElectionSettings) -> Result<LeaderElectionSettings, ValidationErrors> {
        let merged = LeaderElectionSettings {
            lease_duration: self.lease_duration.unwrap_or(base.lease_duration),
            renew_deadline: self.renew_deadline.unwrap_or(base.renew_deadline),
            retry_period: self.retry_period.unwrap_or(base.retry_period),
            lock_name: self.lock_name.clone().unwrap_or_else(|| base.lock_name.clone()),
            wait_for_ready: self.wait_for_ready.unwrap_or(base.wait_for_ready),
            publish_events: self.publish_events.unwrap_or(base.publish_events),
            release_on_shutdown: self.release_on_shutdown.unwrap_or(base.release_on_shutdown),
        };
        let flag =
            |field: &str| OVERRIDES.iter().find(|(name, _, set)| *name == field && set(self)).map(|(_, flag, _)| *flag);
        let mut named = ValidationErrors::new();
        check_name(
            &FieldPath::root(flag("lockName").unwrap_or("ClusterConfig spec.leaderElection.lockName")),
            &merged.lock_name,
            &mut named,
        );
        for breach in merged.breaches() {
            // Name what the user passed: the rule's own flag, else the flag
            // of a setting it compares with, else the ClusterConfig field.
            let (field, reason) = match (flag(breach.field), breach.others.iter().find_map(|other| flag(other))) {
                (Some(own), _) => (own.to_string(), breach.reason),
                (None, Some(other)) => (
                    other.to_string(),
                    format!(
                        "does not go with ClusterConfig spec.leaderElection.{}: {} {}",
                        breach.field, breach.field, breach.reason
                    ),
                ),
                (None, None) => (format!("ClusterConfig spec.leaderElection.{}", breach.field), breach.reason),
            };
            named.add(&FieldPath::root(&field), reason);
        }
        named.into_result().map(|()| merged)
    }
}

impl Resource for ClusterConfigSpec {
    const KIND: &'static str = "ClusterConfig";
    const PLURAL: &'static str = "clusterconfigs";
    const SHORT: &'static str = "cc";
    const REPLICATED: bool = true;
    const ACCESS: Access = Access { node: NodeAccess::Get, viewer_reads: true };
    const COLUMNS: &'static [Column] = &[
        Column::NAME,
        Column::of("CANDIDATE-POOL", Cell::Text { path: "/spec/candidatePoolSize" }),
        Column::of("HEARTBEAT", Cell::Text { path: "/spec/heartbeatPeriod" }),
        Column::of("GRACE", Cell::Text { path: "/spec/nodeGracePeriod" }),
        Column::AGE,
        Column::wide("LEASE", Cell::Text { path: "/spec/leaderElection/leaseDuration" }),
        Column::wide("RENEW-DEADLINE", Cell::Text { path: "/spec/leaderElection/renewDeadline" }),
        Column::wide("RETRY", Cell::Text { path: "/spec/leaderElection/retryPeriod" }),
    ];
    const HAS_STATUS: bool = false;
    type Status = NoStatus;

    fn validate_name(name: &str, errors: &mut ValidationErrors) {
        if name != CLUSTER_CONFIG_NAME {
            errors.add(
                &FieldPath::root("metadata.name"),
                format!("ClusterConfig is a singleton and must be named {CLUSTER_CONFIG_NAME:?}"),
            );
        }
    }

    fn delete_refusal() -> Option<&'static str> {
        Some("the ClusterConfig holds the cluster's settings and cannot be deleted; change it with `herd apply`")
    }

    fn validate_spec(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        // Every node may be a candidate (Ganeti sets no bound); the bound
        // only keeps a typo from meaning "all nodes" by accident.
        if !(1..=MAX_CANDIDATE_POOL).contains(&self.candidate_pool_size) {
            errors.add(
                &path.child("candidatePoolSize"),
                format!("must be between 1 and {MAX_CANDIDATE_POOL}, is {}", self.candidate_pool_size),
            );
        }
        self.leader_election.validate(&path.child("leaderElection"), errors);
        // Below these, a setting only makes agents and the leader spin.
        let at_least = |errors: &mut ValidationErrors, path: FieldPath, value: HumanDuration, minimum: Duration| {
            if value.get() < minimum {
                errors.add(&path, format!("must be at least {}, is {value}", HumanDuration(minimum)));
            }
        };
        at_least(errors, path.child("heartbeatPeriod"), self.heartbeat_period, MIN_PERIOD);
        let commands = path.child("commands");
        at_least(errors, commands.child("reconcileInterval"), self.commands.reconcile_interval, MIN_PERIOD);
        at_least(errors, commands.child("retryDelay"), self.commands.retry_delay, MIN_PERIOD);
        at_least(errors, commands.child("answerGrace"), self.commands.answer_grace, MIN_PERIOD);
        at_least(
            errors,
            commands.child("reconcilingTimeout"),
            self.commands.reconciling_timeout,
            Duration::from_secs(1),
        );
        if self.commands.max_attempts == 0 {
            errors.add(&commands.child("maxAttempts"), "must be at least 1, is 0");
        }
        let ports = &self.app_clusters;
        if ports.first_member_port < 1024 || ports.last_member_port < ports.first_member_port {
            errors.add(
                &path.child("appClusters").child("lastMemberPort"),
                format!(
                    "the member ports must be a range of unprivileged ports (first at least 1024, last not before it), \
                     are {}-{}",
                    ports.first_member_port, ports.last_member_port
                ),
            );
        }
        ports.member_logs.validate(&path.child("appClusters").child("memberLogs"), errors);
        if !(1..=MAX_REVISIONS_KEPT).contains(&ports.revisions_kept) {
            errors.add(
                &path.child("appClusters").child("revisionsKept"),
                format!("must be from 1 (the App's own) to {MAX_REVISIONS_KEPT}, is {}", ports.revisions_kept),
            );
        }
        if self.node_grace_period <= self.heartbeat_period {
            errors.add(
                &path.child("nodeGracePeriod"),
                format!("must be more than heartbeatPeriod ({}), is {}", self.heartbeat_period, self.node_grace_period),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        ClusterConfig::new(CLUSTER_CONFIG_NAME, ClusterConfigSpec::default()).validate().unwrap();
    }

    #[test]
    fn periods_and_counts_have_minimums_named_in_the_error() {
        let spec = ClusterConfigSpec {
            heartbeat_period: HumanDuration(Duration::from_millis(1)),
            commands: CommandSettings { max_attempts: 0, ..Default::default() },
            ..Default::default()
        };
        let errors = ClusterConfig::new(CLUSTER_CONFIG_NAME, spec).validate().unwrap_err().to_string();
        assert!(errors.contains("spec.heartbeatPeriod: must be at least 100ms, is 1ms"), "{errors}");
        assert!(errors.contains("spec.commands.maxAttempts: must be at least 1, is 0"), "{errors}");
    }

    #[test]
    fn election_ordering_is_enforced_with_field_paths() {
        let mut config = ClusterConfig::new(CLUSTER_CONFIG_NAME, ClusterConfigSpec::default());
        config.spec.leader_election.renew_deadline = HumanDuration::from_secs(20);
        config.spec.leader_election.retry_period = HumanDuration::from_secs(17);
        let err = config.validate().unwrap_err();
        let fields: Vec<_> = err.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["spec.leaderElection.renewDeadline", "spec.leaderElection.leaseDuration"]);
    }

    #[test]
    fn flags_win_over_the_cluster_config() {
        let base = LeaderElectionSettings::default();
        let flags = LeaderElectionOverrides {
            lease_duration: Some(HumanDuration::from_secs(30)),
            release_on_shutdown: Some(false),
            ..Default::default()
        };
        let merged = flags.apply(&base).unwrap();
        assert_eq!(merged.lease_duration, HumanDuration::from_secs(30));
        assert_eq!(merged.renew_deadline, base.renew_deadline);
        assert!(!merged.release_on_shutdown);
        assert!(merged.publish_events);
    }

    #[test]
    fn a_bad_setting_is_named_by_where_it_came_from() {
        let mut base = LeaderElectionSettings::default();
        // From a flag: the flag is named.
        let flags = LeaderElectionOverrides { renew_deadline: Some(HumanDuration::from_secs(2)), ..Default::default() };
        let error = flags.apply(&base).unwrap_err();
        assert_eq!(error.to_string(), "--renew-deadline: must be more than 1.2 x retryPeriod (2s 400ms), is 2s");
        // The same rule broken by the ClusterConfig: its field is named.
        base.renew_deadline = HumanDuration::from_secs(20);
        let error = LeaderElectionOverrides::default().apply(&base).unwrap_err();
        assert_eq!(
            error.to_string(),
            "ClusterConfig spec.leaderElection.leaseDuration: must be more than renewDeadline (20s), is 15s"
        );
        // A flag can repair what the ClusterConfig broke.
        let flags =
            LeaderElectionOverrides { lease_duration: Some(HumanDuration::from_secs(25)), ..Default::default() };
        assert_eq!(flags.apply(&base).unwrap().lease_duration, HumanDuration::from_secs(25));
        let flags = LeaderElectionOverrides { lock_name: Some("Leader!".into()), ..Default::default() };
        let error = flags.apply(&LeaderElectionSettings::default()).unwrap_err();
        assert!(error.to_string().starts_with("--lock-name: may contain only"), "{error}");
    }

    #[test]
    fn a_zero_retry_period_is_refused() {
        let flags = LeaderElectionOverrides { retry_period: Some(HumanDuration::from_secs(0)), ..Default::default() };
        let error = flags.apply(&LeaderElectionSettings::default()).unwrap_err();
        assert_eq!(error.errors[0].field, "--retry-period");
    }

    #[test]
    fn settings_that_starve_the_election_are_refused() {
        let settings = |lease: u64, renew: u64, retry: u64| LeaderElectionSettings {
            lease_duration: HumanDuration(Duration::from_millis(lease)),
            renew_deadline: HumanDuration(Duration::from_millis(renew)),
            retry_period: HumanDuration(Duration::from_millis(retry)),
            ..Default::default()
        };
        let fields = |s: LeaderElectionSettings| s.breaches().into_iter().map(|b| b.field).collect::<Vec<_>>();
        assert_eq!(fields(settings(3000, 10, 1)), ["retryPeriod"]);
        assert_eq!(fields(settings(3000, 150, 100)), ["renewDeadline"], "two retries before a step-down");
        assert_eq!(
            fields(settings(2100, 2000, 500)),
            ["leaseDuration", "leaseDuration"],
            "too short, not whole seconds"
        );
        assert_eq!(fields(settings(2000, 1800, 500)), ["leaseDuration"], "the lease outlives the deadline by a retry");
        assert_eq!(fields(settings(7_200_000, 10_000, 2000)), ["leaseDuration"], "at most an hour");
        assert!(fields(settings(3000, 2000, 500)).is_empty(), "the tests' short settings");
        assert!(fields(LeaderElectionSettings::default()).is_empty());
    }

    #[test]
    fn singleton_name() {
        let err = ClusterConfig::new("other", ClusterConfigSpec::default()).validate().unwrap_err();
        assert_eq!(err.errors[0].field, "metadata.name");
    }

    #[test]
    fn grace_must_exceed_heartbeat() {
        let body = serde_json::json!({"metadata": {"name": "cluster"}, "spec": {"heartbeatPeriod": "5s", "nodeGracePeriod": "5s"}});
        let err = ClusterConfig::from_json_value(body).unwrap().validate().unwrap_err();
        assert_eq!(err.errors[0].field, "spec.nodeGracePeriod");
    }
}
