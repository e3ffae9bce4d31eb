//! When an agent starts a wanted member again after its process ended,
//! and when its runs are a crash loop: each run that ended within
//! [`STABLE_RUN`] of its start makes the next start wait longer
//! ([`RESTART_DELAYS`]); two such runs in a row are a loop, said in the
//! heartbeat until a run lasts. The agent passes the time its process
//! ran and what it recorded; nothing here reads a clock.

use std::time::Duration;

use crate::api::CrashLoop;
use crate::backoff::Backoff;
use crate::time::Timestamp;

/// A run this long was not a crash: the next start waits only the first
/// pause again.
pub const STABLE_RUN: Duration = Duration::from_secs(10);

/// The pauses before starting a member again after short runs in a row:
/// 500 ms, doubling, at most 30 s.
pub const RESTART_DELAYS: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));

/// After a run of a wanted member that lasted `ran` ended, with
/// `short_runs` short runs in a row before it: the streak to record, and
/// the pause before the next start.
pub fn after_exit(short_runs: u32, ran: Duration) -> (u32, Duration) {
    // A member that ran a while and then died is not crash-looping.
    let before = if ran >= STABLE_RUN { 0 } else { short_runs };
    (before + 1, RESTART_DELAYS.pause(before + 1))
}

/// What a member's runs so far say of it.
#[derive(Clone, Copy, Debug)]
pub struct Runs<'a> {
    pub wanted: bool,
    /// Short runs in a row (as [`after_exit`] counted them).
    pub short_runs: u32,
    pub last_exit: Option<&'a str>,
    /// When it is started again, while it waits.
    pub next_start: Option<Timestamp>,
    /// How long its current run has lasted (None: it does not run).
    pub running_for: Option<Duration>,
}

/// The crash loop a heartbeat reports of a member, if its last runs each
/// ended within [`STABLE_RUN`]: while it waits to be started again, or
/// runs again for less than that.
pub fn crash_loop(runs: &Runs<'_>) -> Option<CrashLoop> {
    if !runs.wanted || runs.short_runs < CrashLoop::RUNS {
        return None;
    }
    if runs.running_for.is_some_and(|ran| ran >= STABLE_RUN) {
        return None;
    }
    Some(CrashLoop {
        runs: runs.short_runs,
        last_exit: runs.last_exit.unwrap_or_default().to_string(),
        next_start: runs.next_start.filter(|_| runs.running_for.is_none()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_short_runs_in_a_row_wait_longer_each_time_up_to_the_cap() {
        let mut streak = 0;
        let mut delays = Vec::new();
        for _ in 0..8 {
            let (next, delay) = after_exit(streak, Duration::from_secs(1));
            streak = next;
            delays.push(delay.as_millis() as u64);
        }
        assert_eq!(delays, [500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]);
        assert_eq!(streak, 8);
    }

    #[test]
    fn row_a_run_that_lasted_starts_the_count_over() {
        assert_eq!(after_exit(7, STABLE_RUN), (1, Duration::from_millis(500)));
        assert_eq!(after_exit(7, STABLE_RUN - Duration::from_millis(1)), (8, Duration::from_secs(30)));
    }

    fn runs(short_runs: u32, running_for: Option<Duration>) -> Runs<'static> {
        let next_start = Some(Timestamp::parse("2026-12-01T10:00:00Z").unwrap());
        Runs { wanted: true, short_runs, last_exit: Some("exit status: 3"), next_start, running_for }
    }

    #[test]
    fn row_two_short_runs_in_a_row_are_a_loop_said_until_a_run_lasts() {
        assert_eq!(crash_loop(&runs(1, None)), None, "one crash is no loop");
        let waiting = crash_loop(&runs(2, None)).unwrap();
        assert_eq!((waiting.runs, waiting.last_exit.as_str()), (2, "exit status: 3"));
        assert!(waiting.next_start.is_some(), "it says when it starts again");
        let running = crash_loop(&runs(2, Some(Duration::from_secs(3)))).unwrap();
        assert_eq!(running.next_start, None, "it runs now");
        assert_eq!(crash_loop(&runs(5, Some(STABLE_RUN))), None, "a run that lasts ends the loop");
        assert_eq!(crash_loop(&Runs { wanted: false, ..runs(5, None) }), None, "a member stopped on purpose");
    }
}
