//! What the leader's command reconciler does with one unsettled Command:
//! CloudStack's decision table (first match wins), with a management-side
//! timeout in front of it for agents that went silent. Pure: the caller
//! passes what it observed and how long ago things changed.

use std::borrow::Cow;
use std::time::Duration;

use crate::api::VolumeManifest;
use crate::backoff::Backoff;
use crate::kinds::{AgentState, ManagementState};

/// The reconciler's knobs (ClusterConfig `spec.commands`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReconcileSettings {
    /// A reconciliation that has not finished after this is retried.
    pub reconciling_timeout: Duration,
    /// After an agent's final answer, how long the server waits for it to
    /// arrive before it looks for itself.
    pub answer_grace: Duration,
    /// Reconciliation attempts before the Command is given up
    /// (RECONCILE_SKIPPED, with the reason shown).
    pub max_attempts: u32,
    /// The pause before the first retry of a failed reconciliation; it
    /// doubles with each further retry, up to [`MAX_RETRY_DELAY`].
    pub retry_delay: Duration,
}

pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(300);

impl ReconcileSettings {
    /// The pause before retrying after `retries` failed reconciliations.
    pub fn retry_delay(&self, retries: u32) -> Duration {
        Backoff::new(self.retry_delay, MAX_RETRY_DELAY).pause(retries + 1)
    }
}

/// One Command as the reconciler sees it.
#[derive(Clone, Copy, Debug)]
pub struct CommandView<'a> {
    pub management: ManagementState,
    /// Whether it was handed to its agent.
    pub issued: bool,
    /// A node it involves that is offline (herd never contacts one).
    pub offline_node: Option<&'a str>,
    pub agent: Option<AgentState>,
    /// Since the status last changed.
    pub since_update: Duration,
    /// Since the Command was issued to the agent (None: not issued yet).
    pub since_issued: Option<Duration>,
    /// The action's timeout.
    pub timeout: Duration,
    pub retry_count: u32,
    /// The node exists and is Ready.
    pub host_up: bool,
}

/// What to do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing, for the reason given.
    Skip,
    /// Hand it to its agent (it was created, and never issued).
    Issue,
    /// The agent is working on it and its host is up: wait.
    Wait,
    /// Find out what really happened and record it.
    Reconcile,
    /// Mark it RECONCILE_RETRY (a reconciliation got stuck).
    MarkRetry,
    /// Mark it TIMED_OUT: issued longer ago than its timeout allows, and
    /// the agent has not finished it.
    MarkTimedOut,
    /// Mark it RECONCILE_SKIPPED: too many failed attempts, or a node it
    /// involves is offline.
    GiveUp,
    /// Mark an ABANDONING Command ABANDONED without the agent's word (its
    /// host is down, or it did not answer in time): it holds nothing more.
    FinishAbandon,
}

/// The step for `view`, and why (shown to the operator).
pub fn decide(view: &CommandView<'_>, settings: &ReconcileSettings) -> (Step, Cow<'static, str>) {
    if view.management.is_settled() {
        return (Step::Skip, "settled".into());
    }
    if let Some(node) = view.offline_node {
        return (
            Step::GiveUp,
            format!("node {node} is offline: herd does not contact it, so the Command is given up").into(),
        );
    }
    if !view.issued && view.management == ManagementState::Created {
        return (Step::Issue, "created, not issued yet".into());
    }
    match decide_unsettled(view, settings) {
        (Step::Reconcile, _) if view.retry_count >= settings.max_attempts => {
            (Step::GiveUp, "retried too many times".into())
        }
        (step, why) => (step, why.into()),
    }
}

/// [`decide`] for an unsettled Command whose nodes may be contacted and
/// which was issued.
fn decide_unsettled(view: &CommandView<'_>, settings: &ReconcileSettings) -> (Step, &'static str) {
    use AgentState as A;
    use ManagementState as M;
    if view.management == M::Abandoning {
        if !view.host_up {
            return (Step::FinishAbandon, "its node is down; its agent ends the work when it returns");
        }
        if view.since_update > settings.answer_grace {
            return (Step::FinishAbandon, "the agent did not confirm within the answer grace that it ended the work");
        }
        return (Step::Skip, "waiting for the agent to end the work");
    }
    if view.management.awaits_agent() {
        let Some(since_issued) = view.since_issued else { return (Step::Skip, "not issued yet") };
        let agent_done = view.agent.is_some_and(AgentState::is_final);
        if !agent_done && since_issued > view.timeout + settings.answer_grace {
            return (Step::MarkTimedOut, "the agent did not finish within the timeout");
        }
    }
    match (view.management, view.agent) {
        (M::TimedOut | M::Interrupted | M::ReconcileRetry, _) => (Step::Reconcile, "needs reconciling"),
        (M::Reconciling, _) if view.since_update < settings.reconciling_timeout => (Step::Skip, "being reconciled"),
        (M::Reconciling, _) => (Step::MarkRetry, "reconciling took too long"),
        (M::ReconcileFailed, _)
            if view.retry_count <= settings.max_attempts
                && view.since_update < settings.retry_delay(view.retry_count.saturating_sub(1)) =>
        {
            (Step::Skip, "waiting before retrying a failed reconciliation")
        }
        (M::ReconcileFailed, _) if view.retry_count <= settings.max_attempts => {
            (Step::Reconcile, "retrying a failed reconciliation")
        }
        (M::ReconcileFailed, _) => (Step::GiveUp, "too many failed reconciliation attempts"),
        (_, None) => (Step::Skip, "the agent has not reported it yet"),
        (_, Some(A::Started | A::Processing | A::ProcessingInBackend)) if view.host_up => {
            (Step::Wait, "the agent is working on it")
        }
        (_, Some(A::Started | A::Processing | A::ProcessingInBackend)) => {
            (Step::Reconcile, "the agent was working on it and its host is down")
        }
        (_, Some(A::Completed | A::Failed | A::TimedOut)) if view.since_update < settings.answer_grace => {
            (Step::Skip, "the agent's answer may still be on its way")
        }
        (_, Some(A::Completed | A::Failed | A::TimedOut)) => {
            (Step::Reconcile, "the agent finished but its answer never arrived")
        }
        (_, Some(A::Interrupted | A::DangledInBackend)) => (Step::Reconcile, "the agent was interrupted"),
    }
}

/// One look at a copy's destination: the volume's manifest (None: absent)
/// and how many bytes a copy in progress has staged (None: none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DestinationLook {
    pub manifest: Option<VolumeManifest>,
    pub staged: Option<u64>,
}

/// What a reconciler found of an interrupted copy, from the source's
/// manifest and two looks at the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyVerdict {
    /// The destination holds exactly the source's files, and held still
    /// between the two looks: the copy happened.
    Completed,
    /// The destination is changing: a copy is still running.
    StillChanging,
    /// The destination is missing or differs from the source: copy again.
    NotCopied,
    /// Neither side has the volume.
    Lost,
}

pub fn copy_verdict(source: Option<&VolumeManifest>, first: &DestinationLook, second: &DestinationLook) -> CopyVerdict {
    let checksum = |look: &DestinationLook| look.manifest.as_ref().map(|m| m.checksum.clone());
    if checksum(first) != checksum(second) || first.staged != second.staged {
        return CopyVerdict::StillChanging;
    }
    match (source, second.manifest.as_ref()) {
        (Some(source), Some(dest)) if source.checksum == dest.checksum => CopyVerdict::Completed,
        (None, Some(_)) => CopyVerdict::Completed,
        (None, None) => CopyVerdict::Lost,
        _ => CopyVerdict::NotCopied,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AgentState as A;
    use ManagementState as M;

    const SETTINGS: ReconcileSettings = ReconcileSettings {
        reconciling_timeout: Duration::from_secs(600),
        answer_grace: Duration::from_secs(60),
        max_attempts: 3,
        retry_delay: Duration::from_secs(2),
    };

    fn view(management: ManagementState, agent: Option<AgentState>) -> CommandView<'static> {
        CommandView {
            management,
            issued: true,
            offline_node: None,
            agent,
            since_update: Duration::from_secs(1),
            since_issued: Some(Duration::from_secs(1)),
            timeout: Duration::from_secs(30),
            retry_count: 0,
            host_up: true,
        }
    }

    fn step(view: CommandView) -> Step {
        decide(&view, &SETTINGS).0
    }

    fn manifest(content: &str) -> VolumeManifest {
        VolumeManifest::of(vec![crate::api::ManifestFile { path: "f".into(), size: 1, blake3: content.into() }])
    }

    #[test]
    fn copy_verdicts() {
        let (a, b) = (manifest("a"), manifest("b"));
        let look = |m: Option<&VolumeManifest>| DestinationLook { manifest: m.cloned(), staged: None };
        let staging = |bytes| DestinationLook { manifest: None, staged: Some(bytes) };
        assert_eq!(copy_verdict(Some(&a), &look(Some(&a)), &look(Some(&a))), CopyVerdict::Completed);
        assert_eq!(copy_verdict(Some(&a), &look(Some(&b)), &look(Some(&a))), CopyVerdict::StillChanging);
        assert_eq!(copy_verdict(Some(&a), &look(None), &look(Some(&a))), CopyVerdict::StillChanging, "it appeared");
        assert_eq!(copy_verdict(Some(&a), &staging(10), &staging(20)), CopyVerdict::StillChanging, "a copy is running");
        assert_eq!(
            copy_verdict(Some(&a), &staging(10), &staging(10)),
            CopyVerdict::NotCopied,
            "a copy stopped half-way"
        );
        assert_eq!(copy_verdict(Some(&a), &look(Some(&b)), &look(Some(&b))), CopyVerdict::NotCopied, "an old copy");
        assert_eq!(copy_verdict(Some(&a), &look(None), &look(None)), CopyVerdict::NotCopied);
        assert_eq!(
            copy_verdict(None, &look(Some(&b)), &look(Some(&b))),
            CopyVerdict::Completed,
            "source removed after"
        );
        assert_eq!(copy_verdict(None, &look(None), &look(None)), CopyVerdict::Lost);
    }

    #[test]
    fn settled_commands_are_left_alone() {
        for m in [M::Completed, M::Failed, M::Reconciled, M::ReconcileSkipped, M::Abandoned] {
            assert_eq!(step(view(m, Some(A::Interrupted))), Step::Skip, "{m:?}");
        }
    }

    #[test]
    fn row_an_abandoning_command_waits_for_its_agent_unless_the_host_is_down_or_silent() {
        let working = view(M::Abandoning, Some(A::ProcessingInBackend));
        assert_eq!(step(working), Step::Skip);
        assert_eq!(step(CommandView { host_up: false, ..working }), Step::FinishAbandon);
        let silent = CommandView { since_update: Duration::from_secs(61), ..working };
        assert_eq!(step(silent), Step::FinishAbandon);
    }

    #[test]
    fn row_a_processing_command_is_timed_out_like_a_created_one() {
        let late = Some(Duration::from_secs(30 + 61));
        let processing = CommandView { since_issued: late, ..view(M::Processing, Some(A::Processing)) };
        assert_eq!(step(processing), Step::MarkTimedOut);
        assert_eq!(step(view(M::Processing, Some(A::ProcessingInBackend))), Step::Wait);
    }

    #[test]
    fn unissued_commands_wait_for_the_leader() {
        assert_eq!(step(CommandView { since_issued: None, ..view(M::Created, None) }), Step::Skip);
    }

    #[test]
    fn a_silent_agent_past_the_timeout_times_the_command_out() {
        let late = Some(Duration::from_secs(30 + 61));
        assert_eq!(step(CommandView { since_issued: late, ..view(M::Created, None) }), Step::MarkTimedOut);
        assert_eq!(
            step(CommandView { since_issued: late, ..view(M::Created, Some(A::Processing)) }),
            Step::MarkTimedOut
        );
        // A final answer is not timed out: its row decides.
        assert_eq!(step(CommandView { since_issued: late, ..view(M::Created, Some(A::Completed)) }), Step::Skip);
        // Within timeout + grace: not yet.
        let edge = Some(Duration::from_secs(90));
        assert_eq!(step(CommandView { since_issued: edge, ..view(M::Created, None) }), Step::Skip);
    }

    #[test]
    fn row_timed_out_interrupted_or_retry_reconciles() {
        for m in [M::TimedOut, M::Interrupted, M::ReconcileRetry] {
            assert_eq!(step(view(m, None)), Step::Reconcile, "{m:?}");
            assert_eq!(step(view(m, Some(A::Processing))), Step::Reconcile, "{m:?}");
        }
    }

    #[test]
    fn row_reconciling_recently_skips() {
        assert_eq!(step(view(M::Reconciling, Some(A::Interrupted))), Step::Skip);
    }

    #[test]
    fn row_reconciling_for_too_long_is_marked_for_retry() {
        let stuck = CommandView { since_update: Duration::from_secs(601), ..view(M::Reconciling, None) };
        assert_eq!(step(stuck), Step::MarkRetry);
    }

    #[test]
    fn row_reconcile_failed_within_the_attempts_retries_after_a_growing_pause() {
        let failed = |retries, since| CommandView {
            retry_count: retries,
            since_update: Duration::from_secs(since),
            ..view(M::ReconcileFailed, Some(A::Interrupted))
        };
        assert_eq!(step(failed(1, 1)), Step::Skip, "the first retry waits 2s");
        assert_eq!(step(failed(1, 2)), Step::Reconcile);
        assert_eq!(step(failed(2, 3)), Step::Skip, "the second waits 4s");
        assert_eq!(step(failed(2, 4)), Step::Reconcile);
        assert_eq!(step(failed(3, 7)), Step::Skip, "the third waits 8s");
        assert_eq!(SETTINGS.retry_delay(30), MAX_RETRY_DELAY);
    }

    #[test]
    fn row_a_reconciliation_due_at_the_attempts_limit_gives_up() {
        let failed = CommandView {
            retry_count: 3,
            since_update: Duration::from_secs(8),
            ..view(M::ReconcileFailed, Some(A::Interrupted))
        };
        assert_eq!(decide(&failed, &SETTINGS), (Step::GiveUp, "retried too many times".into()));
        let interrupted = CommandView { retry_count: 3, ..view(M::Interrupted, Some(A::Interrupted)) };
        assert_eq!(step(interrupted), Step::GiveUp);
        assert_eq!(step(CommandView { retry_count: 2, ..interrupted }), Step::Reconcile);
    }

    #[test]
    fn row_a_command_on_an_offline_node_is_given_up_whatever_its_state() {
        for management in [M::Created, M::Processing, M::Abandoning, M::ReconcileFailed] {
            let offline = CommandView { offline_node: Some("n3"), issued: false, ..view(management, None) };
            let (step, why) = decide(&offline, &SETTINGS);
            assert_eq!(step, Step::GiveUp, "{management:?}");
            assert!(why.starts_with("node n3 is offline"), "{why}");
        }
        let settled = CommandView { offline_node: Some("n3"), ..view(M::Completed, None) };
        assert_eq!(step(settled), Step::Skip, "a settled one is left alone");
    }

    #[test]
    fn row_a_created_command_not_issued_yet_is_issued() {
        let created = CommandView { issued: false, since_issued: None, ..view(M::Created, None) };
        assert_eq!(step(created), Step::Issue);
        assert_eq!(step(CommandView { issued: true, ..created }), Step::Skip, "issued: the agent's turn");
    }

    #[test]
    fn row_reconcile_failed_past_the_attempts_gives_up() {
        let failed = CommandView { retry_count: 4, ..view(M::ReconcileFailed, Some(A::Interrupted)) };
        assert_eq!(decide(&failed, &SETTINGS), (Step::GiveUp, "too many failed reconciliation attempts".into()));
        let waited = CommandView { since_update: Duration::from_secs(1000), ..failed };
        assert_eq!(step(waited), Step::GiveUp);
    }

    #[test]
    fn row_agent_state_unknown_skips() {
        assert_eq!(step(view(M::Created, None)), Step::Skip);
    }

    #[test]
    fn row_agent_working_and_host_up_waits() {
        for a in [A::Started, A::Processing, A::ProcessingInBackend] {
            assert_eq!(step(view(M::Created, Some(a))), Step::Wait, "{a:?}");
        }
    }

    #[test]
    fn row_agent_working_and_host_down_reconciles() {
        for a in [A::Started, A::Processing, A::ProcessingInBackend] {
            assert_eq!(step(CommandView { host_up: false, ..view(M::Created, Some(a)) }), Step::Reconcile, "{a:?}");
        }
    }

    #[test]
    fn row_agent_finished_recently_skips() {
        for a in [A::Completed, A::Failed, A::TimedOut] {
            assert_eq!(step(view(M::Created, Some(a))), Step::Skip, "{a:?}");
        }
    }

    #[test]
    fn row_agent_finished_long_ago_reconciles() {
        for a in [A::Completed, A::Failed, A::TimedOut] {
            let old = CommandView { since_update: Duration::from_secs(61), ..view(M::Created, Some(a)) };
            assert_eq!(step(old), Step::Reconcile, "{a:?}");
        }
    }

    #[test]
    fn row_agent_interrupted_or_dangled_reconciles() {
        for a in [A::Interrupted, A::DangledInBackend] {
            assert_eq!(step(view(M::Created, Some(a))), Step::Reconcile, "{a:?}");
        }
    }
}
