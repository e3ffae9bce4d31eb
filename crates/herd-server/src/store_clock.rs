//! Object time: the store's clock, where the store has one of its own.
//!
//! Replicas sharing a PostgreSQL store stamp objects (an approval, the
//! start of a deadline, a retry's last try) and judge their age by one
//! clock: each measures how far its wall clock is from the database's, and
//! [`crate::objects::now`] adds that offset. Judged by its own clock, a
//! replica an hour ahead would take every standing disruption approval
//! for lapsed (the chaos soak skews replicas' clocks so), and one behind
//! would write times no other replica could judge. Liveness is judged on
//! each process's monotonic clock instead ([`crate::change_clock`]).
//! SQLite's replicas share a host, and its clock.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use herd_store::{Store, StoreError};
use tokio_util::sync::CancellationToken;

/// How often the offset is measured again (a clock stepped by NTP, or by
/// hand, is followed within this).
const MEASURE_EVERY: Duration = Duration::from_secs(5);

/// An offset past this is told to the operator.
const TOLD_PAST: Duration = Duration::from_secs(1);

/// The store's clock minus this process's wall clock, in nanoseconds.
static OFFSET_NANOS: AtomicI64 = AtomicI64::new(0);

/// `local`, a time on this process's wall clock, on the store's clock.
pub fn on_store_clock(local: SystemTime) -> SystemTime {
    moved(local, OFFSET_NANOS.load(Ordering::Relaxed))
}

/// `local` moved by `offset` nanoseconds, either way.
fn moved(local: SystemTime, offset: i64) -> SystemTime {
    let magnitude = Duration::from_nanos(offset.unsigned_abs());
    let moved = if offset >= 0 { local.checked_add(magnitude) } else { local.checked_sub(magnitude) };
    moved.unwrap_or(local)
}

/// The store's clock minus this process's wall clock, in nanoseconds
/// (None: the store has no clock of its own). The store's time is taken
/// as read in the middle of the round trip that asked for it.
async fn measure(store: &Store) -> Result<Option<i64>, StoreError> {
    let (asked, asked_at) = (SystemTime::now(), Instant::now());
    let Some(store_time) = store.clock().await? else { return Ok(None) };
    let local = asked + asked_at.elapsed() / 2;
    let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    Ok(Some(match store_time.duration_since(local) {
        Ok(ahead) => nanos(ahead),
        Err(behind) => -nanos(behind.duration()),
    }))
}

/// Measures the offset now and keeps it (None: the store has no clock of
/// its own); a store that cannot be asked leaves it as it was.
pub async fn anchor(store: &Store) -> Result<Option<i64>, StoreError> {
    let measured = measure(store).await;
    match &measured {
        Ok(Some(offset)) => {
            let before = OFFSET_NANOS.swap(*offset, Ordering::Relaxed);
            let told = |nanos: i64| Duration::from_nanos(nanos.unsigned_abs()) > TOLD_PAST;
            if told(*offset) && (!told(before) || Duration::from_nanos(offset.abs_diff(before)) > TOLD_PAST) {
                tracing::warn!(
                    offset_seconds = *offset as f64 / 1e9,
                    "this replica's wall clock is off the store's: objects are stamped and judged on the store's clock"
                );
            }
        }
        Ok(None) => {}
        Err(error) => tracing::warn!(%error, "the store's clock could not be read; the last offset from it stands"),
    }
    measured
}

/// Measures the offset again every [`MEASURE_EVERY`] until `shutdown`
/// (started for a store that [`anchor`] found has a clock of its own).
pub async fn keep_anchored(store: Store, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(MEASURE_EVERY) => {}
        }
        let _ = anchor(&store).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_moves_local_times_either_way() {
        let local = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(moved(local, -3_600_000_000_000), local - Duration::from_secs(3600));
        assert_eq!(moved(local, 90_000_000_000), local + Duration::from_secs(90));
        assert_eq!(moved(local, 0), local);
    }
}
