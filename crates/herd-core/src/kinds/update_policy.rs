//! How an AppCluster takes a new revision of its App: an `Upgrade`
//! Operation restarts its members as the new revision, canaries first
//! and alone, then at most `maxParallel` at a time, each healthy only once
//! ready for `minHealthyTime` within `healthyDeadline` of its restart
//! (Nomad's update block). With `type: Rolling` a new revision starts
//! that Operation by itself; with `Manual` (the default) running members
//! keep their revision until `herd appcluster upgrade` (new members take
//! the cluster's revision either way). The same settings ride on each
//! Upgrade Operation, so one started by hand may change them.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::time::HumanDuration;
use crate::validation::{FieldPath, ValidationErrors, check_duration};

/// Whether a new revision is rolled out by itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum UpdateType {
    /// Running members keep their revision until an upgrade is asked for.
    #[default]
    Manual,
    /// A new revision the cluster is to run starts an upgrade.
    Rolling,
}

/// How members are upgraded, and by whom.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdatePolicy {
    #[serde(default, rename = "type")]
    pub type_: UpdateType,
    #[serde(default = "one")]
    pub max_parallel: u32,
    /// How many members go first, alone; the rest only once they are
    /// healthy.
    #[serde(default)]
    pub canary: u32,
    /// How long a restarted member must stay ready to count as healthy.
    #[serde(default = "min_healthy_time")]
    pub min_healthy_time: HumanDuration,
    /// How long after its restart a member may take to become healthy;
    /// one that does not stops the upgrade.
    #[serde(default = "healthy_deadline")]
    pub healthy_deadline: HumanDuration,
    /// A stopped upgrade returns every member it touched to the revision
    /// it ran before (no canaries: that revision ran here already).
    #[serde(default = "yes")]
    pub auto_revert: bool,
}

/// How one upgrade goes, as its Operation says: canaries, health, revert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpgradePace {
    pub canary: u32,
    pub min_healthy_time: HumanDuration,
    pub healthy_deadline: HumanDuration,
    pub auto_revert: bool,
}

fn one() -> u32 {
    1
}

pub(crate) fn yes() -> bool {
    true
}

pub(crate) fn min_healthy_time() -> HumanDuration {
    HumanDuration::from_secs(10)
}

pub(crate) fn healthy_deadline() -> HumanDuration {
    HumanDuration::from_secs(300)
}

impl Default for UpgradePace {
    fn default() -> Self {
        UpdatePolicy::default().pace()
    }
}

impl Default for UpdatePolicy {
    fn default() -> Self {
        UpdatePolicy {
            type_: UpdateType::default(),
            max_parallel: 1,
            canary: 0,
            min_healthy_time: min_healthy_time(),
            healthy_deadline: healthy_deadline(),
            auto_revert: true,
        }
    }
}

impl UpdatePolicy {
    pub fn is_default(&self) -> bool {
        *self == UpdatePolicy::default()
    }

    pub fn validate(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        if self.max_parallel == 0 {
            errors.add(&path.child("maxParallel"), "must be at least 1 (how many members restart at once)");
        }
        self.pace().validate(path, errors);
    }

    pub fn pace(&self) -> UpgradePace {
        UpgradePace {
            canary: self.canary,
            min_healthy_time: self.min_healthy_time,
            healthy_deadline: self.healthy_deadline,
            auto_revert: self.auto_revert,
        }
    }
}

/// How long a member may need to be healthy: up to a day to stay ready,
/// and a second to a day to get there.
const MIN_HEALTHY_RANGE: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(24 * 3600));
const HEALTHY_DEADLINE_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(24 * 3600));

impl UpgradePace {
    /// Checks its times, naming each field under `path`.
    pub fn validate(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        check_duration(&path.child("minHealthyTime"), self.min_healthy_time, MIN_HEALTHY_RANGE, errors);
        check_duration(&path.child("healthyDeadline"), self.healthy_deadline, HEALTHY_DEADLINE_RANGE, errors);
        if self.healthy_deadline.get() <= self.min_healthy_time.get() {
            errors.add(
                &path.child("healthyDeadline"),
                format!(
                    "must be longer than minHealthyTime ({}): no member could be healthy in time",
                    self.min_healthy_time
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_read_and_bad_times_are_named() {
        let policy: UpdatePolicy = serde_json::from_value(serde_json::json!({})).unwrap();
        assert!(policy.is_default());
        assert_eq!(policy.healthy_deadline, HumanDuration::from_secs(300));
        assert!(policy.auto_revert);
        let bad: UpdatePolicy = serde_json::from_value(serde_json::json!({
            "type": "Rolling", "maxParallel": 0, "minHealthyTime": "1m", "healthyDeadline": "30s"
        }))
        .unwrap();
        let mut errors = ValidationErrors::new();
        bad.validate(&FieldPath::root("spec.updatePolicy"), &mut errors);
        let said = errors.to_string();
        assert!(said.contains("spec.updatePolicy.maxParallel: must be at least 1"), "{said}");
        assert!(said.contains("spec.updatePolicy.healthyDeadline: must be longer than minHealthyTime (1m)"), "{said}");
        assert!(serde_json::from_value::<UpdatePolicy>(serde_json::json!({"type": "Sometimes"})).is_err());
    }
}
