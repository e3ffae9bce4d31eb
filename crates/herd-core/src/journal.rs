//! The agent's command journal as a state machine: which moves an entry
//! may make, what an attempt's end makes of it, and what an unfinished
//! entry becomes when the agent starts again.

use crate::kinds::{Action, AgentState, Answer};

/// Whether a journal entry may move from `from` to `to`.
pub fn may_move(from: AgentState, to: AgentState) -> bool {
    use AgentState::*;
    match from {
        // Interrupted: a disconnect hook cancelled the work (or the agent
        // found it unfinished at start, see `recover`).
        Started => matches!(to, Processing | ProcessingInBackend | Completed | Failed | TimedOut | Interrupted),
        // A backend step may be followed by more work in the agent itself
        // (MigrateMember: copy in a worker, then start the member).
        Processing | ProcessingInBackend => {
            matches!(to, Processing | ProcessingInBackend | Completed | Failed | TimedOut | Interrupted) && to != from
        }
        // Re-attached to a live worker, or found it gone.
        DangledInBackend => matches!(to, ProcessingInBackend | Completed | Failed | Interrupted),
        Completed | Failed | TimedOut | Interrupted => false,
    }
}

/// What is known, at start, of the detached worker of an entry that was
/// processing in the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The worker process still runs.
    Alive,
    /// The worker is gone and left its result: success or failure.
    Finished { success: bool },
    /// The worker is gone without a result.
    Gone,
}

/// The state of an entry found on start. Finished entries stay as they
/// are (their answer may not have been acknowledged yet); an entry that
/// was being processed in the agent is INTERRUPTED; one that was
/// processing in a backend worker is DANGLED_IN_BACKEND while the worker
/// lives (the agent re-attaches), takes the worker's result if it left
/// one, and is INTERRUPTED otherwise.
pub fn recover(state: AgentState, backend: Backend) -> AgentState {
    use AgentState::*;
    match (state, backend) {
        (Completed | Failed | TimedOut | Interrupted, _) => state,
        (Started | Processing, _) => Interrupted,
        (ProcessingInBackend | DangledInBackend, Backend::Alive) => DangledInBackend,
        (ProcessingInBackend | DangledInBackend, Backend::Finished { success: true }) => Completed,
        (ProcessingInBackend | DangledInBackend, Backend::Finished { success: false }) => Failed,
        (ProcessingInBackend | DangledInBackend, Backend::Gone) => Interrupted,
    }
}

/// What a worker found at start means for the entry of `action`: a
/// migration has steps after its copies, so its copy worker alive or
/// finished is not its end (the entry is interrupted, and issued again).
pub fn backend_for(action: &Action, worker: Backend) -> Backend {
    match (action, worker) {
        (Action::MigrateMember { .. }, Backend::Alive | Backend::Finished { .. }) => Backend::Gone,
        (_, worker) => worker,
    }
}

/// How an attempt's work ended in the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkEnd {
    /// It ran past its timeout (the work, and its worker, were stopped).
    TimedOut(std::time::Duration),
    /// It answered: success or not.
    Answered(Answer),
    /// It could not be done, for this reason.
    Failed(String),
}

/// The state and answer an attempt ends with. `cancelled`: why a
/// disconnect hook cancelled it, which is not a failure of the action but
/// an interruption, for the server to reconcile.
pub fn ending(end: WorkEnd, cancelled: Option<&str>) -> (AgentState, Answer) {
    match (end, cancelled) {
        (WorkEnd::TimedOut(after), _) => {
            (AgentState::TimedOut, Answer::said(false, format!("timed out after {after:?}")))
        }
        (WorkEnd::Answered(answer), _) if answer.success => (AgentState::Completed, answer),
        (WorkEnd::Answered(mut answer), Some(why)) => {
            answer.message = format!("cancelled ({why}); {}", answer.message);
            (AgentState::Interrupted, answer)
        }
        (WorkEnd::Answered(answer), None) => (AgentState::Failed, answer),
        (WorkEnd::Failed(failure), Some(why)) => {
            (AgentState::Interrupted, Answer::said(false, format!("cancelled ({why}); {failure}")))
        }
        (WorkEnd::Failed(failure), None) => (AgentState::Failed, Answer::said(false, failure)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AgentState::*;
    use proptest::prelude::*;

    #[test]
    fn row_a_migrations_copy_worker_is_not_its_end() {
        let migrate = Action::MigrateMember { member: "m".into(), from_node: "n1".into(), run: Default::default() };
        let copy = Action::CopyVolume { member: "m".into(), volume: "data".into(), from_node: "n1".into() };
        for worker in [Backend::Alive, Backend::Finished { success: true }, Backend::Gone] {
            assert_eq!(backend_for(&migrate, worker), Backend::Gone, "{worker:?}");
            assert_eq!(backend_for(&copy, worker), worker);
        }
        let found = backend_for(&migrate, Backend::Finished { success: true });
        assert_eq!(recover(ProcessingInBackend, found), Interrupted);
    }

    #[test]
    fn row_an_attempts_end_is_its_journal_state() {
        let ok = Answer::said(true, "done");
        let no = Answer::said(false, "refused");
        let timed_out = ending(WorkEnd::TimedOut(std::time::Duration::from_secs(30)), None);
        assert_eq!(timed_out, (TimedOut, Answer::said(false, "timed out after 30s")));
        assert_eq!(ending(WorkEnd::Answered(ok.clone()), Some("lost the server")), (Completed, ok), "done is done");
        assert_eq!(ending(WorkEnd::Answered(no.clone()), None), (Failed, no.clone()));
        assert_eq!(
            ending(WorkEnd::Answered(no), Some("lost the server")),
            (Interrupted, Answer::said(false, "cancelled (lost the server); refused"))
        );
        assert_eq!(ending(WorkEnd::Failed("disk full".into()), None), (Failed, Answer::said(false, "disk full")));
        assert_eq!(
            ending(WorkEnd::Failed("disk full".into()), Some("shutdown")),
            (Interrupted, Answer::said(false, "cancelled (shutdown); disk full"))
        );
    }

    const ALL: [AgentState; 8] =
        [Started, Processing, ProcessingInBackend, Completed, Failed, TimedOut, Interrupted, DangledInBackend];

    #[test]
    fn the_happy_paths() {
        assert!(may_move(Started, Processing) && may_move(Processing, Completed));
        assert!(may_move(Processing, ProcessingInBackend) && may_move(ProcessingInBackend, Processing));
        assert!(may_move(DangledInBackend, ProcessingInBackend));
        assert!(!may_move(Completed, Processing), "a final entry never moves");
        assert!(may_move(ProcessingInBackend, Interrupted), "a disconnect hook cancelled it");
        assert!(!may_move(Interrupted, Processing), "the server reconciles it; a retry is a new attempt");
    }

    #[test]
    fn recovery() {
        assert_eq!(recover(Processing, Backend::Gone), Interrupted);
        assert_eq!(recover(Started, Backend::Alive), Interrupted, "no backend was started yet");
        assert_eq!(recover(ProcessingInBackend, Backend::Alive), DangledInBackend);
        assert_eq!(recover(ProcessingInBackend, Backend::Finished { success: true }), Completed);
        assert_eq!(recover(ProcessingInBackend, Backend::Finished { success: false }), Failed);
        assert_eq!(recover(ProcessingInBackend, Backend::Gone), Interrupted);
        assert_eq!(recover(Completed, Backend::Gone), Completed);
    }

    fn any_state() -> impl Strategy<Value = AgentState> {
        prop::sample::select(ALL.to_vec())
    }

    fn any_backend() -> impl Strategy<Value = Backend> {
        prop_oneof![
            Just(Backend::Alive),
            Just(Backend::Gone),
            any::<bool>().prop_map(|success| Backend::Finished { success })
        ]
    }

    proptest! {
        /// Whatever a crash leaves behind, and however often the agent
        /// restarts, recovery ends in a state that is final or being
        /// re-attached, never in one that claims work is running in the
        /// agent; and it is idempotent.
        #[test]
        fn recovery_never_leaves_an_entry_running(state in any_state(), backend in any_backend()) {
            let once = recover(state, backend);
            prop_assert!(!matches!(once, Started | Processing | ProcessingInBackend));
            prop_assert_eq!(recover(once, backend), once);
            prop_assert!(once == state || once.is_final() || once == Interrupted || once == DangledInBackend);
        }

        /// Every run of allowed moves from STARTED ends in at most one final state.
        #[test]
        fn final_states_are_absorbing(path in prop::collection::vec(any_state(), 0..12)) {
            let mut state = Started;
            for next in path {
                if may_move(state, next) {
                    prop_assert!(!state.is_final());
                    state = next;
                }
            }
            if state.is_final() {
                for next in ALL {
                    prop_assert!(!may_move(state, next));
                }
            }
        }
    }
}
