//! An agent's link to the control plane as a state machine: what a failed
//! join or heartbeat means (give up, join again, or retry), when a run of
//! failures is worth a log line, and when an outage has lasted long
//! enough for the disconnect hooks to run (once per outage). The agent
//! classifies what went wrong ([`Trouble`]) and passes its monotonic
//! time in; the decisions are here.

use std::time::Duration;

/// How a join or a heartbeat failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trouble {
    /// The server is not the cluster's (a wrong CA, or someone in between).
    Untrusted,
    /// The token was not taken (401): a bad or used-up join token, or a
    /// node token the cluster no longer knows (a new store, or the node
    /// was deleted).
    Unauthorized,
    /// The node is not known (404).
    NotFound,
    /// The request was refused as it stands (403, 422: a taken name, a
    /// report that does not check).
    Refused,
    /// The server answered for an older term than the master this node
    /// follows (a failover superseded it).
    Superseded,
    /// No answer, or an answer that is no refusal.
    Unreachable,
}

/// What the agent does after a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Stop: this node cannot be part of the cluster without an operator.
    GiveUp,
    /// Drop the node's token and join again with the join token.
    JoinAgain,
    /// Try again after the backoff. `say`: the first failure of a run,
    /// worth a log line; `run_hooks`: the outage just passed its grace.
    Retry { say: bool, run_hooks: bool },
}

/// When an attempt began and when it failed, on the agent's monotonic
/// clock: an outage counts from the start of its first failed attempt
/// (the server was heard from last before it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub began: Duration,
    pub failed: Duration,
}

/// The link's memory of the current run of failures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Link {
    /// A run of failures is under way (and was said).
    failing: bool,
    /// Since when (on the agent's monotonic clock) the server has been
    /// unreachable, and whether the disconnect hooks ran for it.
    outage: Option<(Duration, bool)>,
}

impl Link {
    /// A join or heartbeat went through: whether a run of failures just
    /// ended (worth saying).
    pub fn went_through(&mut self) -> bool {
        self.outage = None;
        std::mem::take(&mut self.failing)
    }

    /// A join (`joining`) or heartbeat `attempt` failed with `trouble`;
    /// `can_join`: the agent has a join token.
    pub fn failed(
        &mut self,
        trouble: Trouble,
        joining: bool,
        can_join: bool,
        attempt: Attempt,
        grace: Duration,
    ) -> Next {
        match trouble {
            Trouble::Untrusted => return Next::GiveUp,
            Trouble::Refused | Trouble::Unauthorized if joining => return Next::GiveUp,
            Trouble::Unauthorized | Trouble::NotFound if !joining && can_join => return Next::JoinAgain,
            Trouble::Unauthorized | Trouble::NotFound if !joining => return Next::GiveUp,
            _ => {}
        }
        let say = !std::mem::replace(&mut self.failing, true);
        let mut run_hooks = false;
        // Only silence counts toward the outage: a superseded master
        // answered, and the next one is tried at once.
        if trouble != Trouble::Superseded && !joining {
            let (since, ran) = self.outage.get_or_insert((attempt.began, false));
            if !*ran && attempt.failed.saturating_sub(*since) > grace {
                *ran = true;
                run_hooks = true;
            }
        }
        Next::Retry { say, run_hooks }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(30);

    /// An attempt that began at `s` and failed at once.
    fn secs(s: u64) -> Attempt {
        Attempt { began: Duration::from_secs(s), failed: Duration::from_secs(s) }
    }

    #[test]
    fn row_an_untrusted_server_or_a_refused_join_ends_the_agent() {
        let mut link = Link::default();
        assert_eq!(link.failed(Trouble::Untrusted, false, true, secs(0), GRACE), Next::GiveUp);
        assert_eq!(link.failed(Trouble::Untrusted, true, true, secs(0), GRACE), Next::GiveUp);
        assert_eq!(link.failed(Trouble::Refused, true, true, secs(0), GRACE), Next::GiveUp);
        assert_eq!(link.failed(Trouble::Unauthorized, true, true, secs(0), GRACE), Next::GiveUp);
        assert!(matches!(link.failed(Trouble::NotFound, true, true, secs(0), GRACE), Next::Retry { .. }));
    }

    #[test]
    fn row_a_node_the_server_forgot_joins_again_if_it_can() {
        let mut link = Link::default();
        for forgot in [Trouble::Unauthorized, Trouble::NotFound] {
            assert_eq!(link.failed(forgot, false, true, secs(0), GRACE), Next::JoinAgain);
            assert_eq!(link.failed(forgot, false, false, secs(0), GRACE), Next::GiveUp);
        }
        let refused = link.failed(Trouble::Refused, false, true, secs(0), GRACE);
        assert!(matches!(refused, Next::Retry { .. }), "a refused report is tried again");
    }

    #[test]
    fn row_silence_is_retried_said_once_and_runs_the_hooks_once_past_the_grace() {
        let mut link = Link::default();
        assert_eq!(
            link.failed(Trouble::Unreachable, false, true, secs(100), GRACE),
            Next::Retry { say: true, run_hooks: false }
        );
        assert_eq!(
            link.failed(Trouble::Unreachable, false, true, secs(130), GRACE),
            Next::Retry { say: false, run_hooks: false },
            "at the grace, not past it"
        );
        assert_eq!(
            link.failed(Trouble::Unreachable, false, true, secs(131), GRACE),
            Next::Retry { say: false, run_hooks: true }
        );
        assert_eq!(
            link.failed(Trouble::Unreachable, false, true, secs(500), GRACE),
            Next::Retry { say: false, run_hooks: false },
            "once per outage"
        );
        assert!(link.went_through(), "the run of failures ended");
        let slow = Attempt { began: Duration::from_secs(700), failed: Duration::from_secs(731) };
        assert_eq!(
            link.failed(Trouble::Unreachable, false, true, slow, GRACE),
            Next::Retry { say: true, run_hooks: true },
            "an attempt that waited out the grace itself"
        );
        assert!(link.went_through());
        assert!(!link.went_through());
        assert_eq!(
            link.failed(Trouble::Unreachable, false, true, secs(600), GRACE),
            Next::Retry { say: true, run_hooks: false },
            "a new outage counts from its start"
        );
    }

    #[test]
    fn row_a_superseded_master_or_a_failed_join_is_no_outage() {
        let mut link = Link::default();
        for now in [0, 100, 200] {
            let next = link.failed(Trouble::Superseded, false, true, secs(now), GRACE);
            assert_eq!(next, Next::Retry { say: now == 0, run_hooks: false });
            let next = link.failed(Trouble::Unreachable, true, true, secs(now), GRACE);
            assert!(matches!(next, Next::Retry { run_hooks: false, .. }), "a join has no disconnect hooks");
        }
    }
}
