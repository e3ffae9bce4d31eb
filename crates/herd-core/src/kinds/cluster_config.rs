//! `ClusterConfig`: the cluster-wide settings, a singleton named `cluster`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::NoStatus;
use crate::resource::{Object, Resource};
use crate::time::HumanDuration;
use crate::validation::{FieldPath, ValidationErrors};

pub type ClusterConfig = Object<ClusterConfigSpec>;

/// The one allowed name of the ClusterConfig object.
pub const CLUSTER_CONFIG_NAME: &str = "cluster";

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
}

impl Default for ClusterConfigSpec {
    fn default() -> Self {
        ClusterConfigSpec {
            candidate_pool_size: 10,
            leader_election: LeaderElectionSettings::default(),
            heartbeat_period: HumanDuration::from_secs(2),
            node_grace_period: HumanDuration::from_secs(10),
        }
    }
}

/// client-go's three durations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LeaderElectionSettings {
    pub lease_duration: HumanDuration,
    pub renew_deadline: HumanDuration,
    pub retry_period: HumanDuration,
}

impl Default for LeaderElectionSettings {
    fn default() -> Self {
        LeaderElectionSettings {
            lease_duration: HumanDuration::from_secs(15),
            renew_deadline: HumanDuration::from_secs(10),
            retry_period: HumanDuration::from_secs(2),
        }
    }
}

impl LeaderElectionSettings {
    /// leaseDuration > renewDeadline > 1.2 x retryPeriod, all positive.
    pub fn validate(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        let retry = self.retry_period.get();
        if retry.is_zero() {
            errors.add(&path.child("retryPeriod"), "must be positive");
        }
        if self.renew_deadline.get().as_secs_f64() <= retry.as_secs_f64() * 1.2 {
            errors.add(
                &path.child("renewDeadline"),
                format!(
                    "must be more than 1.2 x retryPeriod ({}), is {}",
                    HumanDuration(retry.mul_f64(1.2)),
                    self.renew_deadline
                ),
            );
        }
        if self.lease_duration <= self.renew_deadline {
            errors.add(
                &path.child("leaseDuration"),
                format!("must be more than renewDeadline ({}), is {}", self.renew_deadline, self.lease_duration),
            );
        }
    }
}

impl Resource for ClusterConfigSpec {
    const KIND: &'static str = "ClusterConfig";
    const PLURAL: &'static str = "clusterconfigs";
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

    fn validate_spec(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        if !(1..=100).contains(&self.candidate_pool_size) {
            errors.add(
                &path.child("candidatePoolSize"),
                format!("must be between 1 and 100, is {}", self.candidate_pool_size),
            );
        }
        self.leader_election.validate(&path.child("leaderElection"), errors);
        if self.heartbeat_period.get().is_zero() {
            errors.add(&path.child("heartbeatPeriod"), "must be positive");
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
    fn election_ordering_is_enforced_with_field_paths() {
        let mut config = ClusterConfig::new(CLUSTER_CONFIG_NAME, ClusterConfigSpec::default());
        config.spec.leader_election.renew_deadline = HumanDuration::from_secs(20);
        config.spec.leader_election.retry_period = HumanDuration::from_secs(17);
        let err = config.validate().unwrap_err();
        let fields: Vec<_> = err.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["spec.leaderElection.renewDeadline", "spec.leaderElection.leaseDuration"]);
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
