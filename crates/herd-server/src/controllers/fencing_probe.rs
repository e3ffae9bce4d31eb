//! The fencing probe, a diagnostic that is off by default (`herd server
//! --fencing-probe 100ms`). While this replica leads, it writes a count
//! under [`probe_key`]`(term)` at every interval, through the fenced path
//! like every leader-only write. Each term's key is created by the leader
//! of that term and written only by it, so the store shows whether two
//! leaders' writes ever interleaved: each term's last write must come
//! before the next term's first. The election tests and `bench/failover`
//! read it.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::objects::{Objects, ObjectsError};

pub const PROBE_PREFIX: &str = "/probe/leader/";

/// The key of one term's record; zero-padded so that keys sort by term.
pub fn probe_key(term: u64) -> String {
    format!("{PROBE_PREFIX}{term:020}")
}

/// What the probe writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeRecord {
    pub holder: String,
    pub term: u64,
    /// Writes made in this term so far, this one included.
    pub count: u64,
}

/// Writes until `stop` fires. Refused writes are logged and counted by
/// [`Objects`]; the probe keeps trying, as a deposed leader's controllers
/// would until they are stopped. A write that is due is made before
/// `stop` is looked at: a replica resumed after a pause (its tick long
/// due, its step-down under way) tries once, as a controller in the
/// middle of a pass would, and is refused; missed ticks are skipped, so
/// that is one write, not one per tick of the pause.
pub async fn run(objects: Objects, holder: String, term: u64, every: Duration, stop: CancellationToken) {
    let key = probe_key(term);
    let mut revision = None;
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    for count in 1.. {
        tokio::select! {
            biased;
            _ = ticks.tick() => {}
            _ = stop.cancelled() => return,
        }
        let record = ProbeRecord { holder: holder.clone(), term, count };
        let value = serde_json::to_vec(&record).expect("a probe record always serialises");
        match objects.put_key(&key, revision, value).await {
            Ok(written) => revision = Some(written),
            Err(ObjectsError::Fenced { .. }) => {}
            Err(ObjectsError::Conflict { .. } | ObjectsError::AlreadyExists { .. }) => {
                // A write that timed out may have landed: go on from what is stored.
                revision = objects.store().get(&key).await.ok().flatten().map(|kv| kv.mod_revision);
            }
            Err(error) => tracing::warn!(%error, "the fencing probe could not write"),
        }
    }
}
