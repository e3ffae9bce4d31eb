//! `Replica`: a control-plane server as it reported itself. Each server
//! keeps its own Replica up to date; `herd cluster status` reads them
//! beside the leader Lease, and [`replica_state`] says what each is doing.

use crate::descriptor::{Cell, Column};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::resource::{Object, Resource};
use crate::time::Timestamp;
use crate::validation::{FieldPath, ValidationErrors};

pub type Replica = Object<ReplicaSpec>;

/// How often a replica refreshes its `lastSeen`.
pub const REPLICA_REFRESH: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplicaSpec {
    /// Where this replica serves the API.
    pub url: String,
    /// The node it runs on (`herd server --node`): it campaigns only while
    /// that node is a master candidate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplicaStatus {
    pub started_at: Timestamp,
    /// Refreshed every few seconds while the replica runs.
    pub last_seen: Timestamp,
    /// Set when the replica stopped cleanly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<Timestamp>,
    /// The store's token for this replica's process (see the Lease's
    /// holderLiveness): another replica can ask whether it still lives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<String>,
    /// herd's version.
    #[serde(default)]
    pub version: String,
    /// It leads: it holds the lease and runs the leader-only work
    /// (written at once when that changes).
    #[serde(default)]
    pub leading: bool,
}

impl Resource for ReplicaSpec {
    const KIND: &'static str = "Replica";
    const PLURAL: &'static str = "replicas";
    const SHORT: &'static str = "rep";
    const COLUMNS: &'static [Column] = &[
        Column::NAME,
        Column::of("URL", Cell::Text { path: "/spec/url" }),
        Column::of("STARTED", Cell::Age { path: "/status/startedAt" }),
        Column::of("LAST SEEN", Cell::Age { path: "/status/lastSeen" }),
        Column::of("STOPPED", Cell::Age { path: "/status/stoppedAt" }),
        Column::wide("VERSION", Cell::Text { path: "/status/version" }),
    ];
    const HAS_STATUS: bool = true;
    type Status = ReplicaStatus;

    fn validate_spec(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            errors.add(&path.child("url"), format!("must be an http:// or https:// URL, is {:?}", self.url));
        }
    }
}

/// What a replica is doing, as far as the store can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ReplicaState {
    /// It holds the leader lease and refreshes its record.
    Leading,
    /// It runs and refreshes its record, and another leads.
    Standby,
    /// Its process lives but it has stopped refreshing (paused, or cut off
    /// from the store).
    Unresponsive,
    /// Its process is gone without a clean stop (crash, kill -9).
    Gone,
    /// It stopped cleanly.
    Stopped,
}

/// What the store knows of one replica.
#[derive(Clone, Copy, Debug)]
pub struct ReplicaFacts {
    /// The lease names it as holder.
    pub holds_lease: bool,
    /// Its own record says it leads.
    pub reports_leading: bool,
    pub stopped: bool,
    /// Whether its process lives (None: the store cannot tell).
    pub alive: Option<bool>,
    /// Since the observer saw its record change, on the observer's
    /// monotonic clock: never from the replica's own timestamps, which a
    /// skewed wall clock would make look old (or new).
    pub silent_for: Duration,
}

/// A replica's state. A record left unrefreshed for three refresh periods
/// is Unresponsive, or Gone when the store cannot tell liveness. Leading
/// takes both the lease and the replica's own fresh word: a replica the
/// lease still names but that stepped down is a Standby.
pub fn replica_state(facts: ReplicaFacts) -> ReplicaState {
    let silent = facts.silent_for > REPLICA_REFRESH * 3;
    match (facts.stopped, facts.alive, silent) {
        (true, Some(false) | None, _) => ReplicaState::Stopped,
        (_, Some(false), _) => ReplicaState::Gone,
        (_, None, true) => ReplicaState::Gone,
        (_, Some(true), true) => ReplicaState::Unresponsive,
        _ if facts.holds_lease && facts.reports_leading => ReplicaState::Leading,
        _ => ReplicaState::Standby,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(holds_lease: bool, stopped: bool, alive: Option<bool>, silent_secs: u64) -> ReplicaFacts {
        let silent_for = Duration::from_secs(silent_secs);
        ReplicaFacts { holds_lease, reports_leading: holds_lease, stopped, alive, silent_for }
    }

    #[test]
    fn states() {
        use ReplicaState::*;
        assert_eq!(replica_state(facts(true, false, Some(true), 1)), Leading);
        assert_eq!(replica_state(facts(false, false, Some(true), 1)), Standby);
        assert_eq!(replica_state(facts(false, false, None, 1)), Standby, "no liveness: trust a fresh record");
        assert_eq!(replica_state(facts(true, false, Some(true), 16)), Unresponsive, "a paused leader");
        assert_eq!(replica_state(facts(true, false, Some(false), 1)), Gone, "a killed leader, seen at once");
        assert_eq!(replica_state(facts(false, false, None, 16)), Gone);
        assert_eq!(replica_state(facts(false, true, Some(false), 100)), Stopped);
        assert_eq!(replica_state(facts(false, true, None, 100)), Stopped);
        assert_eq!(replica_state(facts(false, true, Some(true), 1)), Standby, "restarted under the same name");
        let stepped_down = ReplicaFacts { reports_leading: false, ..facts(true, false, Some(true), 1) };
        assert_eq!(replica_state(stepped_down), Standby, "named by the lease, but it says it does not lead");
    }

    #[test]
    fn the_url_must_be_http() {
        let replica = Replica::new("r1", ReplicaSpec { url: "127.0.0.1:7700".into(), node: None });
        assert_eq!(replica.validate().unwrap_err().errors[0].field, "spec.url");
    }
}
