//! `MemberRun`: how a member runs (its process, environment, volumes,
//! readiness check, drain hook, resources and log rotation), as a StartMember or MigrateMember
//! Command carries it and an App's role declares it.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::quantity::Bytes;
use crate::resources::Resources;
use crate::time::HumanDuration;
use crate::validation::{FieldPath, ValidationErrors, check_duration, check_env, check_unique_names};

/// A script's timeout (a setup, a drain hook): a second at least, a day
/// at most.
pub const SCRIPT_TIMEOUT_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(24 * 3600));

/// How a member runs: the process and its volumes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemberRun {
    /// The program and its arguments.
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub volumes: Vec<VolumeSpec>,
    /// Run by the agent while the member runs; its result is reported
    /// with the member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<super::app::ReadinessCheck>,
    /// BOSH's drain script: run by the agent before it stops the member
    /// (a restart, a move, a removal), with `--drain`, for at most its
    /// timeout; the member is stopped afterwards whatever it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainHook>,
    /// For a member of a leader role: run by the agent, with `--demote`,
    /// when the member's lease ends unrenewed, before its processes are
    /// ended (so that it comes back as a follower).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demote: Option<DrainHook>,
    /// For a member of a leader role whose App says how far a member has
    /// come: run by the agent every second while the member runs; what it
    /// prints is reported with the member (`crate::api::PositionReport`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<DrainHook>,
    /// What the member requests of its node and may use at most.
    #[serde(default, skip_serializing_if = "Resources::is_empty")]
    pub resources: Resources,
    /// How its standard output and error are rotated [default: the
    /// ClusterConfig's `appClusters.memberLogs`; 10Mi, 3 kept].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<LogRotation>,
}

/// How a member's standard output and error (and its setup's) are kept: each rotated once
/// it reaches `maxSize`, with `keep` rotated files besides the current
/// one, so that a stream never has more than `maxSize × (keep + 1)` on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogRotation {
    #[serde(default = "default_log_size")]
    pub max_size: Bytes,
    #[serde(default = "default_log_keep")]
    pub keep: u32,
}

fn default_log_size() -> Bytes {
    Bytes(10 << 20)
}

fn default_log_keep() -> u32 {
    3
}

impl Default for LogRotation {
    fn default() -> Self {
        LogRotation { max_size: default_log_size(), keep: default_log_keep() }
    }
}

/// The smallest file size a log rotates at: under it, it would rotate
/// more than it writes.
pub const MIN_LOG_SIZE: Bytes = Bytes(64 << 10);
/// The most rotated files a log keeps.
pub const MAX_LOGS_KEPT: u32 = 100;

impl LogRotation {
    /// The most a stream keeps on disk.
    pub fn budget(&self) -> Bytes {
        Bytes(self.max_size.0.saturating_mul(u64::from(self.keep) + 1))
    }

    pub fn validate(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        if self.max_size < MIN_LOG_SIZE {
            errors.add(&path.child("maxSize"), format!("must be at least {MIN_LOG_SIZE}, is {}", self.max_size));
        }
        if self.keep > MAX_LOGS_KEPT {
            errors.add(&path.child("keep"), format!("must be at most {MAX_LOGS_KEPT}, is {}", self.keep));
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DrainHook {
    /// The script's text, run by `sh` in the member's environment as
    /// `<script> --drain`.
    pub script: String,
    /// How long it may take before the member is stopped anyway [default: 30s].
    #[serde(default = "default_drain_timeout")]
    pub timeout: HumanDuration,
}

fn default_drain_timeout() -> HumanDuration {
    HumanDuration::from_secs(30)
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeSpec {
    pub name: String,
    /// Persistent volumes survive member restarts; the others are wiped at
    /// every start.
    #[serde(default)]
    pub persistent: bool,
}

impl MemberRun {
    /// The names of its persistent volumes (those a restart keeps and a
    /// move must carry).
    pub fn persistent_volumes(&self) -> impl Iterator<Item = &str> {
        self.volumes.iter().filter(|v| v.persistent).map(|v| v.name.as_str())
    }

    pub(crate) fn validate(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        if self.command.first().is_none_or(|program| program.is_empty()) {
            errors.add(&path.child("command"), "must name a program to run");
        }
        check_unique_names(&path.child("volumes"), self.volumes.iter().map(|v| v.name.as_str()), errors);
        check_env(&path.child("env"), &self.env, errors);
        if let Some(check) = &self.readiness {
            check.validate(&path.child("readiness"), errors);
        }
        if let Some(drain) = &self.drain {
            check_duration(&path.child("drain").child("timeout"), drain.timeout, SCRIPT_TIMEOUT_RANGE, errors);
        }
        self.resources.validate(&path.child("resources"), errors);
        if let Some(logs) = &self.logs {
            logs.validate(&path.child("logs"), errors);
        }
    }
}
