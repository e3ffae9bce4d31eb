//! Member sync (KubeDirector's syncMembers): what one member needs next, from
//! its state, what its node reports and what its commands did. Each call
//! moves the member as far as the facts allow and returns the one action
//! the controller should take for it now. Pure.
//!
//! The path of a member: create pending (placed, then started) → creating
//! (its configmeta written; `setup.sh --configure` launched and its status
//! file read) → configured, or config error. Leaving: a member that may be
//! known to the others (delete pending) is removed from its node first, so
//! that no setup of it still runs, and the others are told (`--delnodes`)
//! as its object goes; one never announced (deleting) just goes.

use crate::api::MemberReport;
use crate::kinds::member::{LastKnownState, MemberState, MemberStatus};
use crate::notifies::retry_pause;
use crate::setup_status::{SetupOutcome, setup_outcome, status_instance};
use crate::time::Timestamp;

/// What the controller knows about one member this pass.
#[derive(Clone, Copy, Debug)]
pub struct MemberFacts<'a> {
    /// The cluster's generation (what configmeta is written for).
    pub generation: i64,
    /// It is bound to a node.
    pub bound: bool,
    /// Its node's report of it.
    pub report: Option<&'a MemberReport>,
    /// Its App role has a setup script.
    pub has_setup: bool,
    /// Its role has persistent storage.
    pub persistent: bool,
    /// One of its commands is not settled yet (one at a time per member).
    pub busy: bool,
    /// Its RemoveMember succeeded.
    pub removed: bool,
    /// The digest of the configmeta it would be given now (None: not
    /// known, only generations count).
    pub digest: Option<&'a str>,
}

/// The action a member needs now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do until something changes.
    Wait,
    /// Bind it to a node (and allocate its ports).
    Place,
    /// Start its process on its node.
    Start,
    /// Write its configmeta for the current generation and, with
    /// `run_setup`, launch its setup for the instance it runs as.
    Configure { run_setup: bool },
    /// Stop it and remove it (volumes and all) from its node.
    Remove,
    /// Delete the Member object: nothing of it is left on a node. With
    /// `announce`, queue `--delnodes` for it on the others.
    Forget { announce: bool },
}

/// The instance the report says runs now.
fn running_instance(report: Option<&MemberReport>) -> Option<&str> {
    report.filter(|r| r.running).and_then(|r| r.instance_id.as_deref())
}

/// Moves `status` as far as `facts` allow and says what to do next.
pub fn member_sync(status: &mut MemberStatus, facts: &MemberFacts<'_>) -> Step {
    match status.state {
        MemberState::CreatePending => {
            if !facts.bound {
                return Step::Place;
            }
            if facts.busy {
                return Step::Wait;
            }
            match running_instance(facts.report) {
                // Its old instance, still running where it is being removed.
                Some(instance) if status.retired_instances.iter().any(|r| r == instance) => {
                    status.reason = Some(format!(
                        "its old instance {instance} still runs on its node: waiting for it to be removed there"
                    ));
                    Step::Wait
                }
                Some(instance) => {
                    status.state = MemberState::Creating;
                    status.state_detail.configuring_instance = Some(instance.to_string());
                    status.reason = None;
                    creating(status, facts)
                }
                // Wanted but not running: its agent is starting it again
                // (unless herd's start failed: then it is started again).
                None if facts.report.is_some_and(|r| r.wanted) && status.failed_commands == 0 => Step::Wait,
                None => Step::Start,
            }
        }
        MemberState::Creating => creating(status, facts),
        MemberState::Configured => {
            let detail = &status.state_detail;
            let changed = facts.digest.is_some_and(|d| detail.config_data_digest.as_deref() != Some(d));
            let stale = detail.last_config_data_generation != Some(facts.generation) || changed;
            if stale && !facts.busy { Step::Configure { run_setup: false } } else { Step::Wait }
        }
        MemberState::ConfigError => Step::Wait,
        MemberState::DeletePending | MemberState::Deleting => {
            status.ready = false;
            status.not_ready_reason = Some("it is being removed".into());
            let announce = status.state == MemberState::DeletePending && facts.bound;
            if facts.removed || !facts.bound {
                Step::Forget { announce }
            } else if facts.busy {
                Step::Wait
            } else {
                Step::Remove
            }
        }
    }
}

fn creating(status: &mut MemberStatus, facts: &MemberFacts<'_>) -> Step {
    let Some(instance) = status.state_detail.configuring_instance.clone() else {
        status.state = MemberState::CreatePending;
        return member_sync(status, facts);
    };
    match running_instance(facts.report) {
        Some(now) if now != instance => {
            // It restarted while being set up: set up the new instance.
            status.state = MemberState::CreatePending;
            status.state_detail.configuring_instance = None;
            status.state_detail.setup_launched_instance = None;
            return member_sync(status, facts);
        }
        Some(_) => {}
        None => return Step::Wait,
    }
    if facts.busy {
        return Step::Wait;
    }
    let detail = &status.state_detail;
    let configmeta_current = detail.last_config_data_generation == Some(facts.generation);
    if !facts.has_setup {
        if !configmeta_current {
            return Step::Configure { run_setup: false };
        }
        configured(status, &instance, None);
        return member_sync(status, facts);
    }
    let line = facts.report.and_then(|r| r.setup_status.as_deref());
    let outcome = setup_outcome(line, &instance);
    if status_instance(line) == Some(instance.as_str()) {
        match outcome {
            SetupOutcome::Running => Step::Wait,
            SetupOutcome::Succeeded => {
                let generation = status.state_detail.last_config_data_generation;
                configured(status, &instance, generation);
                // A spec change during setup: its configmeta follows.
                member_sync(status, facts)
            }
            SetupOutcome::Failed { code, note } => {
                let stderr = facts.report.and_then(|r| r.setup_stderr.as_deref()).unwrap_or("");
                config_error(status, SetupOutcome::error_detail(code, note.as_deref(), stderr));
                Step::Wait
            }
            SetupOutcome::Unreadable(why) => {
                config_error(status, format!("the setup status file does not read: {why}"));
                Step::Wait
            }
            SetupOutcome::NotStarted | SetupOutcome::Interrupted { .. } => Step::Configure { run_setup: true },
        }
    } else if status.state_detail.setup_launched_instance.as_deref() == Some(instance.as_str()) {
        // Launched; the node has not reported its status file since.
        Step::Wait
    } else if facts.persistent
        && status.state_detail.last_setup_generation.is_some()
        && outcome == SetupOutcome::Succeeded
    {
        // A persistent restart after a successful setup: no second setup.
        if !configmeta_current {
            return Step::Configure { run_setup: false };
        }
        configured(status, &instance, None);
        member_sync(status, facts)
    } else {
        Step::Configure { run_setup: true }
    }
}

fn configured(status: &mut MemberStatus, instance: &str, setup_generation: Option<i64>) {
    status.state = MemberState::Configured;
    status.upgraded_from = None;
    let detail = &mut status.state_detail;
    detail.last_configured_instance = Some(instance.to_string());
    detail.configuring_instance = None;
    detail.setup_launched_instance = None;
    detail.config_error_detail = None;
    if setup_generation.is_some() {
        detail.last_setup_generation = setup_generation;
    }
    status.ready = detail.last_known_state == LastKnownState::Running;
    status.reason = None;
}

fn config_error(status: &mut MemberStatus, detail: String) {
    status.state = MemberState::ConfigError;
    status.state_detail.config_error_detail = Some(detail);
    status.state_detail.setup_launched_instance = None;
    status.ready = false;
}

/// Whether a start, configure or remove Command may be issued for the
/// member at `now`: at once, or after a pause once some failed in a row
/// (the same pauses as a notify's).
pub fn command_due(status: &MemberStatus, now: Timestamp) -> bool {
    match status.last_failure {
        Some(at) if status.failed_commands > 0 => at.age(now) >= retry_pause(status.failed_commands),
        _ => true,
    }
}

/// Counts a start, configure or remove Command's outcome toward the pause.
pub fn record_command(status: &mut MemberStatus, succeeded: bool, now: Timestamp) {
    if succeeded {
        status.failed_commands = 0;
        status.last_failure = None;
    } else {
        status.failed_commands += 1;
        status.last_failure = Some(now);
    }
}

/// Records a ConfigureMember's outcome: the configmeta of `generation` is
/// in place for `instance` (and its setup launched, with `run_setup`), or
/// why it is not. An outcome for an instance the member no longer runs as
/// changes nothing but the reason.
pub fn record_configure(
    status: &mut MemberStatus,
    instance: &str,
    (generation, digest): (i64, Option<&str>),
    run_setup: bool,
    outcome: Result<(), String>,
) {
    let detail = &mut status.state_detail;
    let current = match status.state {
        MemberState::Creating => detail.configuring_instance.as_deref() == Some(instance),
        MemberState::Configured => detail.last_configured_instance.as_deref() == Some(instance),
        _ => false,
    };
    match outcome {
        Ok(()) if current => {
            if detail.last_config_data_generation <= Some(generation) {
                detail.last_config_data_generation = Some(generation);
                detail.config_data_digest = digest.map(str::to_string);
            }
            if run_setup && status.state == MemberState::Creating {
                detail.setup_launched_instance = Some(instance.to_string());
            }
        }
        Ok(()) => {}
        Err(why) => status.reason = Some(format!("configuring it failed: {why}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member_check::{Seen, check_member};
    use crate::setup_status::{finished, launched};
    use proptest::prelude::*;

    fn report(instance: &str, setup: Option<String>) -> MemberReport {
        MemberReport {
            name: "db-member-0".into(),
            wanted: true,
            running: true,
            instance_id: Some(instance.into()),
            setup_status: setup,
            ..Default::default()
        }
    }

    fn facts(report: Option<&MemberReport>) -> MemberFacts<'_> {
        MemberFacts {
            generation: 1,
            bound: true,
            report,
            has_setup: true,
            persistent: true,
            busy: false,
            removed: false,
            digest: None,
        }
    }

    #[test]
    fn rule_a_replaced_member_never_takes_an_old_instance_as_its_own() {
        let mut status = MemberStatus { retired_instances: vec!["old".into()], ..Default::default() };
        let old = report("old", Some(finished("old", 0)));
        assert_eq!(member_sync(&mut status, &facts(Some(&old))), Step::Wait);
        assert_eq!(status.state, MemberState::CreatePending);
        assert!(status.reason.as_deref().is_some_and(|r| r.contains("old instance old still runs")));
        assert_eq!(member_sync(&mut status, &facts(None)), Step::Start, "once it is gone, a new one starts");
        let new = report("new", None);
        assert_eq!(member_sync(&mut status, &facts(Some(&new))), Step::Configure { run_setup: true });
        assert_eq!(status.state_detail.configuring_instance.as_deref(), Some("new"));
    }

    /// A member that has been through setup as instance `a`.
    fn configured_as_a() -> MemberStatus {
        let mut status = MemberStatus::default();
        let running = report("a", None);
        assert_eq!(member_sync(&mut status, &facts(Some(&running))), Step::Configure { run_setup: true });
        record_configure(&mut status, "a", (1, None), true, Ok(()));
        let done = report("a", Some(finished("a", 0)));
        assert_eq!(member_sync(&mut status, &facts(Some(&done))), Step::Wait);
        assert_eq!(status.state, MemberState::Configured);
        status
    }

    #[test]
    fn rule_a_new_member_is_placed_then_started_then_set_up() {
        let mut status = MemberStatus::default();
        let unbound = MemberFacts { bound: false, ..facts(None) };
        assert_eq!(member_sync(&mut status, &unbound), Step::Place);
        assert_eq!(member_sync(&mut status, &facts(None)), Step::Start);
        let starting = MemberReport { running: false, ..report("a", None) };
        assert_eq!(member_sync(&mut status, &facts(Some(&starting))), Step::Wait, "its agent is starting it");
        let mut failed = MemberStatus { failed_commands: 1, ..status.clone() };
        assert_eq!(member_sync(&mut failed, &facts(Some(&starting))), Step::Start, "herd's start failed: again");
        let running = report("a", None);
        assert_eq!(member_sync(&mut status, &facts(Some(&running))), Step::Configure { run_setup: true });
        assert_eq!(status.state, MemberState::Creating);
        assert_eq!(status.state_detail.configuring_instance.as_deref(), Some("a"));
    }

    #[test]
    fn rule_a_launched_setup_is_waited_for_and_its_exit_code_decides() {
        let mut status = MemberStatus::default();
        let running = report("a", None);
        member_sync(&mut status, &facts(Some(&running)));
        record_configure(&mut status, "a", (1, None), true, Ok(()));
        assert_eq!(member_sync(&mut status, &facts(Some(&running))), Step::Wait, "not reported yet: no second launch");
        let runs = report("a", Some(launched("a")));
        assert_eq!(member_sync(&mut status, &facts(Some(&runs))), Step::Wait);
        let mut failed = report("a", Some(finished("a", 3)));
        failed.setup_stderr = Some("etcdctl: no quorum\n".into());
        let mut failing = status.clone();
        member_sync(&mut failing, &facts(Some(&failed)));
        assert_eq!(failing.state, MemberState::ConfigError);
        assert_eq!(
            failing.state_detail.config_error_detail.as_deref(),
            Some("configure failed with exit status 3: etcdctl: no quorum")
        );
        let done = report("a", Some(finished("a", 0)));
        member_sync(&mut status, &facts(Some(&done)));
        assert_eq!(status.state, MemberState::Configured);
        let detail = &status.state_detail;
        assert_eq!((detail.last_config_data_generation, detail.last_setup_generation), (Some(1), Some(1)));
        assert_eq!(detail.last_configured_instance.as_deref(), Some("a"));
    }

    #[test]
    fn rule_a_member_without_setup_is_configured_once_it_has_its_configmeta() {
        let mut status = MemberStatus::default();
        let running = report("a", None);
        let no_setup = MemberFacts { has_setup: false, ..facts(Some(&running)) };
        assert_eq!(member_sync(&mut status, &no_setup), Step::Configure { run_setup: false });
        record_configure(&mut status, "a", (1, None), false, Ok(()));
        assert_eq!(member_sync(&mut status, &no_setup), Step::Wait);
        assert_eq!(status.state, MemberState::Configured);
    }

    #[test]
    fn rule_a_persistent_restart_after_a_successful_setup_sets_up_nothing() {
        let mut status = configured_as_a();
        let again = report("b", Some(finished("a", 0)));
        check_member(&mut status, Seen::from_report(Some(&again), false), true, Timestamp::default());
        assert_eq!(member_sync(&mut status, &facts(Some(&again))), Step::Wait);
        assert_eq!(status.state, MemberState::Configured);
        assert_eq!(status.state_detail.last_configured_instance.as_deref(), Some("b"));
    }

    #[test]
    fn rule_a_clean_slate_restart_sets_up_again() {
        let mut status = configured_as_a();
        let again = report("b", None);
        check_member(&mut status, Seen::from_report(Some(&again), false), false, Timestamp::default());
        let ephemeral = MemberFacts { persistent: false, ..facts(Some(&again)) };
        assert_eq!(member_sync(&mut status, &ephemeral), Step::Configure { run_setup: true });
    }

    #[test]
    fn rule_a_setup_interrupted_by_a_restart_runs_again_for_the_new_instance() {
        let mut status = MemberStatus::default();
        let running = report("a", None);
        member_sync(&mut status, &facts(Some(&running)));
        record_configure(&mut status, "a", (1, None), true, Ok(()));
        let restarted = report("b", Some(launched("a")));
        assert_eq!(member_sync(&mut status, &facts(Some(&restarted))), Step::Configure { run_setup: true });
        assert_eq!(status.state_detail.configuring_instance.as_deref(), Some("b"));
    }

    #[test]
    fn rule_an_error_retry_restart_sets_up_again() {
        let mut status = MemberStatus::default();
        let running = report("a", None);
        member_sync(&mut status, &facts(Some(&running)));
        record_configure(&mut status, "a", (1, None), true, Ok(()));
        let failed = report("a", Some(finished("a", 1)));
        member_sync(&mut status, &facts(Some(&failed)));
        assert_eq!(status.state, MemberState::ConfigError);
        let again = report("b", Some(finished("a", 1)));
        check_member(&mut status, Seen::from_report(Some(&again), false), true, Timestamp::default());
        assert_eq!(member_sync(&mut status, &facts(Some(&again))), Step::Configure { run_setup: true });
    }

    #[test]
    fn rule_a_configured_member_gets_the_new_generation_and_a_refusal_is_kept_as_the_reason() {
        let mut status = configured_as_a();
        let running = report("a", Some(finished("a", 0)));
        let newer = MemberFacts { generation: 2, ..facts(Some(&running)) };
        assert_eq!(member_sync(&mut status, &newer), Step::Configure { run_setup: false });
        assert_eq!(member_sync(&mut status, &MemberFacts { busy: true, ..newer }), Step::Wait);
        record_configure(&mut status, "a", (2, None), false, Err("refused: it restarted".into()));
        assert_eq!(status.reason.as_deref(), Some("configuring it failed: refused: it restarted"));
        record_configure(&mut status, "z", (2, None), false, Ok(()));
        assert_eq!(status.state_detail.last_config_data_generation, Some(1), "another instance's outcome");
        record_configure(&mut status, "a", (2, None), false, Ok(()));
        assert_eq!(member_sync(&mut status, &newer), Step::Wait);
    }

    #[test]
    fn rule_a_leaving_member_is_removed_first_then_announced_if_it_may_be_known() {
        let mut status = configured_as_a();
        status.state = MemberState::DeletePending;
        let running = report("a", None);
        assert_eq!(member_sync(&mut status, &facts(Some(&running))), Step::Remove);
        assert_eq!(member_sync(&mut status, &MemberFacts { busy: true, ..facts(Some(&running)) }), Step::Wait);
        let removed = MemberFacts { removed: true, ..facts(None) };
        assert_eq!(member_sync(&mut status, &removed), Step::Forget { announce: true });
        let mut never_announced = MemberStatus { state: MemberState::Deleting, ..Default::default() };
        assert_eq!(member_sync(&mut never_announced, &facts(Some(&running))), Step::Remove);
        assert_eq!(member_sync(&mut never_announced, &removed), Step::Forget { announce: false });
        let unbound = MemberFacts { bound: false, ..facts(None) };
        let mut unplaced = MemberStatus { state: MemberState::DeletePending, ..Default::default() };
        assert_eq!(member_sync(&mut unplaced, &unbound), Step::Forget { announce: false }, "it never ran");
    }

    #[test]
    fn rule_a_configured_member_is_given_a_fresh_configmeta_when_a_member_moved() {
        let mut status = configured_as_a();
        record_configure(&mut status, "a", (1, Some("t1")), false, Ok(()));
        let running = report("a", Some(finished("a", 0)));
        let same = MemberFacts { digest: Some("t1"), ..facts(Some(&running)) };
        assert_eq!(member_sync(&mut status, &same), Step::Wait);
        let moved = MemberFacts { digest: Some("t2"), ..facts(Some(&running)) };
        assert_eq!(member_sync(&mut status, &moved), Step::Configure { run_setup: false });
        record_configure(&mut status, "a", (1, Some("t2")), false, Ok(()));
        assert_eq!(member_sync(&mut status, &moved), Step::Wait);
    }

    #[test]
    fn rule_failed_commands_in_a_row_make_the_next_wait() {
        let mut status = MemberStatus::default();
        let at = Timestamp::parse("2026-12-01T10:00:00Z").unwrap();
        let later = |secs: u64| Timestamp::from_system_time(at.system_time() + std::time::Duration::from_secs(secs));
        assert!(command_due(&status, at));
        record_command(&mut status, false, at);
        record_command(&mut status, false, at);
        assert!(!command_due(&status, later(1)), "two failures: 2 s");
        assert!(command_due(&status, later(2)));
        record_command(&mut status, true, later(2));
        assert!(command_due(&status, later(2)));
        assert_eq!(status.failed_commands, 0);
    }

    /// A member's world: what runs, its setup status file, the command in flight.
    #[derive(Debug, Clone, Copy)]
    enum Event {
        /// The member process dies and its agent starts it again.
        Restart,
        /// The setup that runs ends with this code.
        SetupEnds(i32),
        /// The command in flight completes.
        CommandDone,
        /// A spec change.
        SpecChange,
        /// A reconcile pass.
        Pass,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            1 => Just(Event::Restart),
            2 => (0..2i32).prop_map(Event::SetupEnds),
            3 => Just(Event::CommandDone),
            1 => Just(Event::SpecChange),
            4 => Just(Event::Pass),
        ]
    }

    proptest! {
        /// Over random sequences: setup is launched at most once per
        /// instance; with persistent storage never again after it
        /// succeeded unless it failed since; and a configured member is
        /// never left with stale configmeta once a pass saw it idle.
        #[test]
        fn setup_runs_once_per_instance_and_configured_members_are_current(
            events in prop::collection::vec(event(), 1..80),
            persistent in any::<bool>(),
        ) {
            let mut status = MemberStatus::default();
            let (mut instance, mut generation) = (0u32, 1i64);
            let mut file: Option<String> = None;
            let mut in_flight: Option<(String, bool, i64)> = None;
            let mut launched_for: Vec<String> = Vec::new();
            let mut setup_succeeded = false;
            for event in events {
                let me = format!("i{instance}");
                match event {
                    Event::Restart => {
                        instance += 1;
                        // A setup that ran died with its member; without
                        // persistent storage its file went with the volume.
                        if !persistent { file = None; }
                    }
                    Event::SetupEnds(code) => {
                        if file.as_deref() == Some(launched(&me).trim()) {
                            file = Some(finished(&me, code).trim().to_string());
                            setup_succeeded = code == 0;
                        }
                    }
                    Event::CommandDone => {
                        if let Some((target, run_setup, for_generation)) = in_flight.take() {
                            let refused = target != me;
                            if run_setup && !refused {
                                file = Some(launched(&me).trim().to_string());
                            }
                            let outcome = if refused { Err("refused".to_string()) } else { Ok(()) };
                            record_configure(&mut status, &target, (for_generation, None), run_setup, outcome);
                        }
                    }
                    Event::SpecChange => generation += 1,
                    Event::Pass => {
                        let seen = report(&me, file.clone());
                        check_member(&mut status, Seen::from_report(Some(&seen), false), persistent, Timestamp::default());
                        let facts = MemberFacts {
                            generation,
                            persistent,
                            busy: in_flight.is_some(),
                            ..facts(Some(&seen))
                        };
                        let step = member_sync(&mut status, &facts);
                        if let Step::Configure { run_setup } = step {
                            if run_setup {
                                prop_assert!(!launched_for.contains(&me), "a second setup for {me}");
                                prop_assert!(
                                    !(persistent && setup_succeeded && status.state_detail.last_setup_generation.is_some()),
                                    "set up again after a successful setup with persistent storage"
                                );
                                launched_for.push(me.clone());
                            }
                            in_flight = Some((me.clone(), run_setup, generation));
                        }
                        if status.state == MemberState::Configured && !facts.busy {
                            prop_assert!(
                                status.state_detail.last_config_data_generation == Some(generation)
                                    || matches!(step, Step::Configure { .. }),
                                "configured with stale configmeta and nothing sent"
                            );
                            prop_assert_eq!(status.state_detail.last_configured_instance.as_deref(), Some(me.as_str()));
                        }
                    }
                }
            }
        }
    }
}
