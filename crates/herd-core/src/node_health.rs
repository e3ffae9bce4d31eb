//! When a node is Ready: the decision of the node-lifecycle controller.
//!
//! Liveness is judged on the controller's own monotonic clock, from the
//! moment it last saw the node's heartbeat change, never by comparing the
//! heartbeat's wall-clock time with the local clock. Clock skew between
//! server replicas therefore cannot mark a node lost early (the lesson of
//! fabric8 against client-go, applied to nodes).

use std::time::Duration;

/// What the controller should do to a node's Ready status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadinessChange {
    /// Heartbeats stopped for longer than the grace period.
    MarkNotReady { silent_for: Duration },
    Unchanged,
}

/// Decides from how long the heartbeat has been unchanged. A node that is
/// already NotReady stays so until a heartbeat arrives (the heartbeat handler
/// marks it Ready, so that recovery costs no controller round).
pub fn readiness_change(currently_ready: bool, unchanged_for: Duration, grace: Duration) -> ReadinessChange {
    if currently_ready && unchanged_for > grace {
        ReadinessChange::MarkNotReady { silent_for: unchanged_for }
    } else {
        ReadinessChange::Unchanged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn not_ready_exactly_when_ready_and_silent_past_grace(ready: bool, silent_ms in 0u64..100_000, grace_ms in 1u64..100_000) {
            let change = readiness_change(ready, Duration::from_millis(silent_ms), Duration::from_millis(grace_ms));
            let expect_mark = ready && silent_ms > grace_ms;
            prop_assert_eq!(matches!(change, ReadinessChange::MarkNotReady { .. }), expect_mark);
        }
    }
}
