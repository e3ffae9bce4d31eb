//! The first step of every app-cluster pass (the seed's
//! checkContainerStates): what the member's node reports of its process
//! sets `lastKnownState`, and a configured or config-error member whose
//! instance changed has restarted and goes back to create pending, as one
//! of the seed's three restarts. Pure.

use crate::api::MemberReport;
use crate::kinds::member::{LastKnownState, MemberState, MemberStatus};

/// How a restarted member is set up again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restart {
    /// It had reached configured and keeps its persistent storage: keep the
    /// generations and the queued notifies; the setup status file on its
    /// volume says whether setup must run again.
    Persistent,
    /// No persistent storage: forget the configmeta and setup generations
    /// and the queued notifies; set up from scratch.
    CleanSlate,
    /// It was in config error: forget the setup generation and the queued
    /// notifies (and, without persistent storage, the configmeta
    /// generation too); set up from scratch. The error's detail is kept
    /// until setup is tried again.
    ErrorRetry,
}

/// What the node reports of the member's process, and whether its
/// readiness check passes (None: no check).
#[derive(Clone, Copy, Debug)]
pub struct Seen<'a> {
    pub report: Option<&'a MemberReport>,
    pub check_passes: Option<bool>,
}

impl<'a> Seen<'a> {
    /// What a node's report says, the readiness result counted only when
    /// it was taken of the instance that runs now. With `has_check` (the
    /// role has a readiness check), an instance not checked yet does not
    /// pass: a member just restarted is not ready before its check says
    /// so (budgets count on it).
    pub fn from_report(report: Option<&'a MemberReport>, has_check: bool) -> Self {
        let result = report.and_then(|r| {
            let check = r.readiness.as_ref()?;
            (r.instance_id.as_deref() == Some(check.instance_id.as_str())).then_some(check.passing)
        });
        let check_passes = if has_check { Some(result.unwrap_or(false)) } else { result };
        Seen { report, check_passes }
    }
}

/// The last known state from what the node reports.
pub fn last_known_state(seen: Seen<'_>) -> LastKnownState {
    match seen.report {
        None => LastKnownState::Absent,
        Some(report) if !report.running => LastKnownState::Terminated,
        Some(_) if seen.check_passes == Some(false) => LastKnownState::Unresponsive,
        Some(_) => LastKnownState::Running,
    }
}

/// The instance the member's configuration belongs to: the one that
/// reached configured, or the one whose setup failed.
fn configured_instance(status: &MemberStatus) -> Option<&str> {
    match status.state {
        MemberState::Configured => status.state_detail.last_configured_instance.as_deref(),
        MemberState::ConfigError => status.state_detail.configuring_instance.as_deref(),
        _ => None,
    }
}

/// Applies what was seen to `status`; returns the restart, if the member
/// restarted. `persistent`: the member's role has persistent volumes.
pub fn check_member(status: &mut MemberStatus, seen: Seen<'_>, persistent: bool) -> Option<Restart> {
    status.state_detail.last_known_state = last_known_state(seen);
    let now_running = seen.report.filter(|r| r.running).and_then(|r| r.instance_id.as_deref());
    let restarted = match (configured_instance(status), now_running) {
        (Some(before), Some(now)) => before != now,
        _ => false,
    };
    status.ready = !restarted
        && status.state == MemberState::Configured
        && status.state_detail.last_known_state == LastKnownState::Running;
    if !restarted {
        return None;
    }
    let restart = match (status.state, persistent) {
        (MemberState::ConfigError, _) => Restart::ErrorRetry,
        (_, true) => Restart::Persistent,
        (_, false) => Restart::CleanSlate,
    };
    let detail = &mut status.state_detail;
    if restart != Restart::Persistent {
        detail.last_setup_generation = None;
        detail.pending_notify_cmds.clear();
    }
    if !persistent {
        detail.last_config_data_generation = None;
    }
    detail.configuring_instance = None;
    status.state = MemberState::CreatePending;
    Some(restart)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::member::{PendingNotify, StateDetail};
    use proptest::prelude::*;

    fn report(instance: &str, running: bool) -> MemberReport {
        MemberReport {
            name: "db-member-0".into(),
            wanted: true,
            running,
            instance_id: Some(instance.into()),
            pid: Some(1),
            started_at: None,
            restarts: 0,
            ..Default::default()
        }
    }

    fn seen(report: Option<&MemberReport>) -> Seen<'_> {
        Seen { report, check_passes: None }
    }

    fn configured(instance: &str) -> MemberStatus {
        MemberStatus {
            state: MemberState::Configured,
            state_detail: StateDetail {
                last_config_data_generation: Some(4),
                last_setup_generation: Some(4),
                last_configured_instance: Some(instance.into()),
                pending_notify_cmds: vec![PendingNotify { arguments: vec!["--addnodes".into()], ..Default::default() }],
                ..Default::default()
            },
            ready: true,
            ..Default::default()
        }
    }

    #[test]
    fn rule_the_last_known_state_follows_the_report() {
        assert_eq!(last_known_state(seen(None)), LastKnownState::Absent);
        assert_eq!(last_known_state(seen(Some(&report("a", false)))), LastKnownState::Terminated);
        let running = report("a", true);
        assert_eq!(last_known_state(seen(Some(&running))), LastKnownState::Running);
        let failing = Seen { report: Some(&running), check_passes: Some(false) };
        assert_eq!(last_known_state(failing), LastKnownState::Unresponsive);
        // A role with a readiness check: an instance not checked yet does not pass.
        assert_eq!(last_known_state(Seen::from_report(Some(&running), true)), LastKnownState::Unresponsive);
        assert_eq!(last_known_state(Seen::from_report(Some(&running), false)), LastKnownState::Running);
    }

    #[test]
    fn rule_the_same_instance_is_no_restart_and_a_configured_running_member_is_ready() {
        let mut status = configured("a");
        assert_eq!(check_member(&mut status, seen(Some(&report("a", true))), true), None);
        assert_eq!(status.state, MemberState::Configured);
        assert!(status.ready);
        assert_eq!(check_member(&mut status, seen(Some(&report("a", false))), true), None, "down is not a restart");
        assert!(!status.ready);
    }

    #[test]
    fn rule_a_persistent_restart_keeps_generations_and_notifies() {
        let mut status = configured("a");
        assert_eq!(check_member(&mut status, seen(Some(&report("b", true))), true), Some(Restart::Persistent));
        assert_eq!(status.state, MemberState::CreatePending);
        let detail = &status.state_detail;
        assert_eq!((detail.last_config_data_generation, detail.last_setup_generation), (Some(4), Some(4)));
        assert_eq!(detail.pending_notify_cmds.len(), 1);
        assert!(status.was_configured(), "it counts as restarting, never as a new member");
        assert!(!status.ready);
    }

    #[test]
    fn rule_a_clean_slate_restart_forgets_generations_and_notifies() {
        let mut status = configured("a");
        assert_eq!(check_member(&mut status, seen(Some(&report("b", true))), false), Some(Restart::CleanSlate));
        let detail = &status.state_detail;
        assert_eq!((detail.last_config_data_generation, detail.last_setup_generation), (None, None));
        assert!(detail.pending_notify_cmds.is_empty());
        assert!(status.was_configured());
    }

    #[test]
    fn rule_an_error_retry_restart_sets_up_again_and_keeps_the_error_detail() {
        let mut status = configured("a");
        status.state = MemberState::ConfigError;
        status.state_detail.configuring_instance = Some("a".into());
        status.state_detail.config_error_detail = Some("configure failed with exit status 1".into());
        assert_eq!(check_member(&mut status, seen(Some(&report("b", true))), true), Some(Restart::ErrorRetry));
        let detail = &status.state_detail;
        assert_eq!((detail.last_config_data_generation, detail.last_setup_generation), (Some(4), None));
        assert!(detail.pending_notify_cmds.is_empty());
        assert_eq!(detail.config_error_detail.as_deref(), Some("configure failed with exit status 1"));
        assert_eq!(status.state, MemberState::CreatePending);
    }

    #[test]
    fn rule_members_not_yet_configured_are_not_restarted_here() {
        for state in
            [MemberState::CreatePending, MemberState::Creating, MemberState::DeletePending, MemberState::Deleting]
        {
            let mut status = MemberStatus { state, ..configured("a") };
            assert_eq!(check_member(&mut status, seen(Some(&report("b", true))), true), None, "{state:?}");
            assert_eq!(status.state, state);
        }
    }

    proptest! {
        /// A member whose process now runs as another instance than its
        /// configuration's is never left configured or ready.
        #[test]
        fn a_changed_instance_never_stays_configured(
            configured_as in "[ab]",
            running_as in "[ab]",
            running: bool,
            persistent: bool,
            check in proptest::option::of(any::<bool>()),
        ) {
            let mut status = configured(&configured_as);
            let report = report(&running_as, running);
            let restart = check_member(&mut status, Seen { report: Some(&report), check_passes: check }, persistent);
            let changed = running && configured_as != running_as;
            prop_assert_eq!(restart.is_some(), changed);
            if changed {
                prop_assert_eq!(status.state, MemberState::CreatePending);
                prop_assert!(!status.ready);
            }
        }
    }
}
