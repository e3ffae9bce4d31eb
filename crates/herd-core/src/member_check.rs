//! The first step of every app-cluster pass (KubeDirector's
//! checkContainerStates): what the member's node reports of its process
//! sets `lastKnownState` and whether it is ready (and since when, and why
//! not), and a configured or config-error member whose instance changed
//! has restarted and goes back to create pending, as one of three
//! restarts (persistent, clean slate, error retry). A node that is not Ready reports nothing current: its
//! members' state is unknown and none of them is ready (what it last said
//! is not taken as true now). Pure.

use crate::api::{CrashLoop, MemberReport, OomKill};
use crate::kinds::member::{LastKnownState, MemberState, MemberStatus};
use crate::time::Timestamp;

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

/// The member's node as a pass sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeSeen<'a> {
    Ready,
    /// Not Ready (since when, and why, as its Ready condition says): what
    /// it last reported is not current.
    NotReady {
        node: &'a str,
        since: Option<Timestamp>,
        why: &'a str,
    },
}

/// What the node reports of the member's process, whether its readiness
/// check passes (None: no check), and whether the node is Ready.
#[derive(Clone, Copy, Debug)]
pub struct Seen<'a> {
    pub report: Option<&'a MemberReport>,
    pub check_passes: Option<bool>,
    pub node: NodeSeen<'a>,
}

impl<'a> Seen<'a> {
    /// What a Ready node's report says, the readiness result counted only
    /// when it was taken of the instance that runs now. With `has_check`
    /// (the role has a readiness check), an instance not checked yet does
    /// not pass: a member just restarted is not ready before its check
    /// says so (budgets count on it).
    pub fn from_report(report: Option<&'a MemberReport>, has_check: bool) -> Self {
        let result = report.and_then(|r| {
            let check = r.readiness.as_ref()?;
            (r.instance_id.as_deref() == Some(check.instance_id.as_str())).then_some(check.passing)
        });
        let check_passes = if has_check { Some(result.unwrap_or(false)) } else { result };
        Seen { report, check_passes, node: NodeSeen::Ready }
    }

    /// The same, reported by a node that is as `node` says.
    pub fn on(self, node: NodeSeen<'a>) -> Self {
        Seen { node, ..self }
    }
}

/// The last known state from what the node reports.
pub fn last_known_state(seen: Seen<'_>) -> LastKnownState {
    match (seen.node, seen.report) {
        (NodeSeen::NotReady { .. }, _) => LastKnownState::Unknown,
        (_, None) => LastKnownState::Absent,
        (_, Some(report)) if !report.running => LastKnownState::Terminated,
        _ if seen.check_passes == Some(false) => LastKnownState::Unresponsive,
        _ => LastKnownState::Running,
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

/// Applies what was seen at `now` to `status`; returns the restart, if
/// the member restarted. `persistent`: the member's role has persistent
/// volumes.
pub fn check_member(status: &mut MemberStatus, seen: Seen<'_>, persistent: bool, now: Timestamp) -> Option<Restart> {
    status.state_detail.last_known_state = last_known_state(seen);
    // A NotReady node's report is not current: no crash loop, no restart
    // is read from it.
    let current = seen.report.filter(|_| seen.node == NodeSeen::Ready);
    status.state_detail.crash_loop = current.and_then(|r| r.crash_loop.clone());
    status.state_detail.lost_volumes = current.map(|r| r.lost_volumes.clone()).unwrap_or_default();
    // Kept when a node says nothing of one (a member moved keeps its past).
    if let Some(kill) = current.and_then(|r| r.oom_kill.clone()) {
        status.state_detail.last_oom_kill = Some(kill);
    }
    let now_running = current.filter(|r| r.running).and_then(|r| r.instance_id.as_deref());
    let restarted = match (configured_instance(status), now_running) {
        (Some(before), Some(now)) => before != now,
        _ => false,
    };
    let ready = !restarted
        && status.state == MemberState::Configured
        && status.state_detail.last_known_state == LastKnownState::Running;
    set_ready(status, ready, now);
    let restart = restarted.then(|| restart(status, persistent));
    status.not_ready_reason = (!status.ready).then(|| not_ready_reason(status, seen));
    restart
}

/// Sets `ready`, moving the time it changed only when it changes.
pub fn set_ready(status: &mut MemberStatus, ready: bool, now: Timestamp) {
    if status.ready != ready || status.ready_changed_at.is_none() {
        status.ready_changed_at = Some(now);
    }
    status.ready = ready;
}

/// Starts a restarted member over: what it keeps depends on which restart it is.
fn restart(status: &mut MemberStatus, persistent: bool) -> Restart {
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
    restart
}

/// Why a member that is not ready is not, for the operator: the first of
/// its node down, its process down or crash-looping, its readiness check
/// failing, or its state.
fn not_ready_reason(status: &MemberStatus, seen: Seen<'_>) -> String {
    if let NodeSeen::NotReady { node, since, why } = seen.node {
        let since = since.map(|t| format!(" since {t}")).unwrap_or_default();
        return format!("node {node} is NotReady{since} ({why}): what it last reported of this member is not current");
    }
    if !status.state_detail.lost_volumes.is_empty() {
        return lost_message(&status.state_detail.lost_volumes);
    }
    if let Some(crash) = &status.state_detail.crash_loop {
        return crash_message(crash);
    }
    match status.state_detail.last_known_state {
        LastKnownState::Absent => return "its node does not run it".into(),
        LastKnownState::Terminated => {
            let exit = seen.report.and_then(|r| r.last_exit.as_deref()).unwrap_or("exit unknown");
            return format!("its process is not running (last run: {exit})");
        }
        LastKnownState::Unresponsive => {
            let detail = seen.report.and_then(|r| r.readiness.as_ref()).map(|c| c.detail.trim()).unwrap_or("");
            return match detail {
                "" => "its readiness check has not passed".into(),
                detail => format!("its readiness check fails: {detail}"),
            };
        }
        _ => {}
    }
    match status.state {
        MemberState::Configured => "it restarted and is set up again".into(),
        MemberState::ConfigError => "its setup failed (config error)".into(),
        MemberState::CreatePending | MemberState::Creating => "it is not configured yet".into(),
        MemberState::DeletePending | MemberState::Deleting => "it is being removed".into(),
    }
}

/// What lost volumes mean, in words.
pub fn lost_message(volumes: &[String]) -> String {
    format!(
        "its node lost its persistent volume(s) {}: it is not started on empty ones; `herd member replace` \
         recreates it with empty volumes",
        volumes.join(", ")
    )
}

/// The Event a pass records when a member's node says it lost volumes
/// that it did not say it lost before.
pub fn lost_news(before: &[String], after: &[String]) -> Option<String> {
    after.iter().any(|v| !before.contains(v)).then(|| lost_message(after))
}

/// The Event a pass records when the member's node reports an OOM kill
/// other than the one in the status it read (`before`).
pub fn oom_news(before: Option<&OomKill>, after: Option<&OomKill>) -> Option<String> {
    let after = after.filter(|after| before != Some(*after))?;
    Some(match after.survived {
        true => format!("a process of it was {after}, in instance {}; the member runs on", after.instance_id),
        false => format!("its process was {after}, in instance {}; its restart policy applies", after.instance_id),
    })
}

/// What a crash loop is, in words: its runs, how the last ended, the next try.
pub fn crash_message(crash: &CrashLoop) -> String {
    let next = crash.next_start.map(|t| format!("; the agent starts it again at {t}")).unwrap_or_default();
    format!(
        "crash loop: its process exited within seconds of starting {} times in a row (last: {}){next}",
        crash.runs, crash.last_exit
    )
}

/// The Event a pass records when the crash loop grew since the status it
/// read (`before`): its message, with how the last run ended and the next
/// try (`now` gives how soon).
pub fn crash_news(before: Option<&CrashLoop>, after: Option<&CrashLoop>, now: Timestamp) -> Option<String> {
    let after = after?;
    if before.is_some_and(|b| b.runs >= after.runs) {
        return None;
    }
    let next = match after.next_start {
        Some(at) => format!(
            "; next start in {}s",
            at.system_time().duration_since(now.system_time()).unwrap_or_default().as_secs()
        ),
        None => String::new(),
    };
    Some(format!(
        "its process exited ({}) within seconds of starting, {} times in a row{next}",
        after.last_exit, after.runs
    ))
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
        Seen { report, check_passes: None, node: NodeSeen::Ready }
    }

    fn t(secs: u64) -> Timestamp {
        Timestamp::from_system_time(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000 + secs))
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
    fn an_oom_kill_is_kept_and_news_once() {
        let kill = OomKill {
            instance_id: "i1".into(),
            survived: false,
            at: t(3),
            limit: Some(crate::quantity::Bytes(64 << 20)),
            peak: Some(crate::quantity::Bytes(64 << 20)),
        };
        let mut status = MemberStatus::default();
        let killed = MemberReport { oom_kill: Some(kill.clone()), ..report("i2", true) };
        check_member(&mut status, Seen::from_report(Some(&killed), false), false, t(4));
        assert_eq!(status.state_detail.last_oom_kill.as_ref(), Some(&kill));
        let news = oom_news(None, Some(&kill)).unwrap();
        assert_eq!(
            news,
            "its process was killed for want of memory (limit 64Mi, peak 64Mi), in instance i1; its restart policy applies"
        );
        assert_eq!(oom_news(Some(&kill), Some(&kill)), None, "told once");
        let child = OomKill { survived: true, at: t(5), ..kill.clone() };
        assert_eq!(
            oom_news(Some(&kill), Some(&child)).unwrap(),
            "a process of it was killed for want of memory (limit 64Mi, peak 64Mi), in instance i1; the member runs on"
        );
        check_member(&mut status, Seen::from_report(Some(&report("i2", true)), false), false, t(5));
        assert!(status.state_detail.last_oom_kill.is_some(), "kept when the node says nothing of one");
    }

    #[test]
    fn rule_the_last_known_state_follows_the_report() {
        assert_eq!(last_known_state(seen(None)), LastKnownState::Absent);
        assert_eq!(last_known_state(seen(Some(&report("a", false)))), LastKnownState::Terminated);
        let running = report("a", true);
        assert_eq!(last_known_state(seen(Some(&running))), LastKnownState::Running);
        let failing = Seen { report: Some(&running), check_passes: Some(false), node: NodeSeen::Ready };
        assert_eq!(last_known_state(failing), LastKnownState::Unresponsive);
        // A role with a readiness check: an instance not checked yet does not pass.
        assert_eq!(last_known_state(Seen::from_report(Some(&running), true)), LastKnownState::Unresponsive);
        assert_eq!(last_known_state(Seen::from_report(Some(&running), false)), LastKnownState::Running);
    }

    #[test]
    fn rule_the_same_instance_is_no_restart_and_a_configured_running_member_is_ready() {
        let mut status = configured("a");
        assert_eq!(check_member(&mut status, seen(Some(&report("a", true))), true, t(0)), None);
        assert_eq!(status.state, MemberState::Configured);
        assert!(status.ready);
        assert_eq!(
            check_member(&mut status, seen(Some(&report("a", false))), true, t(0)),
            None,
            "down is not a restart"
        );
        assert!(!status.ready);
    }

    #[test]
    fn rule_a_persistent_restart_keeps_generations_and_notifies() {
        let mut status = configured("a");
        assert_eq!(check_member(&mut status, seen(Some(&report("b", true))), true, t(0)), Some(Restart::Persistent));
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
        assert_eq!(check_member(&mut status, seen(Some(&report("b", true))), false, t(0)), Some(Restart::CleanSlate));
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
        assert_eq!(check_member(&mut status, seen(Some(&report("b", true))), true, t(0)), Some(Restart::ErrorRetry));
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
            assert_eq!(check_member(&mut status, seen(Some(&report("b", true))), true, t(0)), None, "{state:?}");
            assert_eq!(status.state, state);
        }
    }

    #[test]
    fn rule_a_member_on_a_node_that_is_not_ready_is_unknown_and_not_ready_and_says_since_when() {
        let mut status = configured("a");
        assert_eq!(check_member(&mut status, seen(Some(&report("a", true))), true, t(0)), None);
        assert!(status.ready && status.not_ready_reason.is_none());
        assert_eq!(status.ready_changed_at, Some(t(0)));
        // The node stops beating: its last report still says running, ready.
        let down =
            NodeSeen::NotReady { node: "n3", since: Some(t(12)), why: "no heartbeat for 12s (grace period 10s)" };
        let stale = report("a", true);
        assert_eq!(check_member(&mut status, seen(Some(&stale)).on(down), true, t(15)), None);
        assert_eq!(status.state_detail.last_known_state, LastKnownState::Unknown);
        assert!(!status.ready);
        assert_eq!(status.ready_changed_at, Some(t(15)));
        let reason = status.not_ready_reason.clone().unwrap();
        assert!(
            reason.starts_with("node n3 is NotReady since ") && reason.contains("no heartbeat for 12s"),
            "{reason}"
        );
        // Nor is a restart read from a stale report.
        assert_eq!(check_member(&mut status, seen(Some(&report("b", true))).on(down), true, t(16)), None);
        assert_eq!(status.state, MemberState::Configured);
        assert_eq!(status.ready_changed_at, Some(t(15)), "the change time stays while ready does");
        // Back: ready again, from then.
        assert_eq!(check_member(&mut status, seen(Some(&report("a", true))), true, t(20)), None);
        assert!(status.ready && status.not_ready_reason.is_none());
        assert_eq!(status.ready_changed_at, Some(t(20)));
    }

    #[test]
    fn rule_a_crash_loop_is_kept_in_the_state_detail_and_said_with_its_exit_and_next_start() {
        let mut status = MemberStatus { state: MemberState::CreatePending, ..Default::default() };
        let crash = CrashLoop { runs: 3, last_exit: "exit status: 3".into(), next_start: Some(t(8)) };
        let down = MemberReport { crash_loop: Some(crash.clone()), ..report("a", false) };
        check_member(&mut status, seen(Some(&down)), true, t(4));
        assert_eq!(status.state_detail.crash_loop.as_ref(), Some(&crash));
        let reason = status.not_ready_reason.clone().unwrap();
        assert!(
            reason.contains("crash loop") && reason.contains("3 times") && reason.contains("exit status: 3"),
            "{reason}"
        );
        assert!(reason.contains("starts it again at"), "{reason}");
        let news = crash_news(None, Some(&crash), t(4)).unwrap();
        assert!(
            news.contains("exit status: 3") && news.contains("3 times") && news.contains("next start in 4s"),
            "{news}"
        );
        assert_eq!(crash_news(Some(&crash), Some(&crash), t(5)), None, "no news until it exits again");
        let more = CrashLoop { runs: 4, ..crash.clone() };
        assert!(crash_news(Some(&crash), Some(&more), t(9)).is_some());
        // Its run lasted: the loop is over.
        check_member(&mut status, seen(Some(&report("a", true))), true, t(30));
        assert_eq!(status.state_detail.crash_loop, None);
    }

    #[test]
    fn rule_a_member_whose_node_lost_its_volumes_says_so_once() {
        let mut status = configured("a");
        let lost = MemberReport {
            lost_volumes: vec!["data".into()],
            last_exit: Some("not started".into()),
            ..report("a", false)
        };
        check_member(&mut status, seen(Some(&lost)), true, t(0));
        assert_eq!(status.state_detail.lost_volumes, ["data"]);
        let why = status.not_ready_reason.clone().unwrap();
        assert!(why.contains("lost its persistent volume(s) data") && why.contains("herd member replace"), "{why}");
        assert!(lost_news(&[], &status.state_detail.lost_volumes).is_some());
        assert_eq!(lost_news(&status.state_detail.lost_volumes.clone(), &status.state_detail.lost_volumes), None);
    }

    #[test]
    fn rule_a_member_that_is_not_ready_says_why() {
        let why = |report: Option<&MemberReport>, check: Option<bool>| {
            let mut status = configured("a");
            let seen = Seen { report, check_passes: check, node: NodeSeen::Ready };
            check_member(&mut status, seen, true, t(0));
            status.not_ready_reason.unwrap_or_default()
        };
        assert_eq!(why(None, None), "its node does not run it");
        let stopped = MemberReport { last_exit: Some("exit status: 1".into()), ..report("a", false) };
        assert_eq!(why(Some(&stopped), None), "its process is not running (last run: exit status: 1)");
        let failing = MemberReport {
            readiness: Some(crate::api::ReadinessReport {
                instance_id: "a".into(),
                passing: false,
                detail: "connection refused".into(),
                since: t(0),
            }),
            ..report("a", true)
        };
        assert_eq!(why(Some(&failing), Some(false)), "its readiness check fails: connection refused");
        assert_eq!(why(Some(&report("a", true)), None), "");
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
            let seen = Seen { report: Some(&report), check_passes: check, node: NodeSeen::Ready };
            let restart = check_member(&mut status, seen, persistent, t(0));
            let changed = running && configured_as != running_as;
            prop_assert_eq!(restart.is_some(), changed);
            if changed {
                prop_assert_eq!(status.state, MemberState::CreatePending);
                prop_assert!(!status.ready);
            }
        }
    }
}
