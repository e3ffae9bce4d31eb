//! [`EventReason`]: every reason herd's own parts record an Event for.
//! An Event's `reason` stays a word on the wire (an admin may record
//! Events of their own); herd writes and reads its own reasons through
//! this enum, so that a renamed reason is a compile error, not a test or
//! a script silently matching nothing.

use std::fmt;

/// Declares the reasons with the word each is written as.
macro_rules! reasons {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Why herd recorded an Event. Its word on the wire is its name.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum EventReason {
            $($(#[$doc])* $name,)*
        }

        impl EventReason {
            /// Every reason, in declaration order.
            pub const ALL: &'static [EventReason] = &[$(EventReason::$name,)*];

            /// The word an Event's `reason` holds.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(EventReason::$name => stringify!($name),)*
                }
            }
        }
    };
}

reasons! {
    // Nodes and their agents.
    /// A new host joined under its name.
    NodeRegistered,
    /// Heartbeats arrive again.
    NodeReady,
    /// No heartbeat within the grace period.
    NodeNotReady,
    /// The host's boot id changed.
    HostRebooted,
    /// The agent restarted on the same boot.
    AgentRestarted,
    /// An admin deleted the node.
    NodeDeleted,
    /// An admin let a deleted node's agent join again.
    NodeReadmitted,
    /// A join under a taken name, or with a revoked token, was refused.
    JoinRefused,
    /// A node's endpoint refused a caller without a fitting grant.
    PeerAccessRefused,
    /// A node's role changed (candidate, regular, drained, offline).
    NodeRoleChanged,
    /// The pool holds more candidates than its size.
    CandidatePoolAboveSize,
    // Join tokens.
    JoinTokenCreated,
    JoinTokenDeleted,
    // The control plane's leadership.
    /// This replica won the lease.
    StartedLeading,
    /// Another replica leads now.
    NewLeader,
    /// This replica gave the lease up or lost it.
    StoppedLeading,
    // Commands.
    /// An agent answered that the Command failed.
    CommandFailed,
    /// The Command ran past its timeout.
    CommandTimedOut,
    /// The Command was abandoned (by an operator, or its node is offline).
    CommandAbandoned,
    /// An abandon waits for the agent to stop the Command.
    CommandAbandoning,
    /// The Command is issued again (an operator's retry, or a reconcile).
    CommandRetried,
    /// The reconciler gave the Command up.
    CommandGivenUp,
    /// The reconciler found what really happened and recorded it.
    CommandReconciled,
    /// The reconciler will look again later.
    ReconcileRetry,
    /// The reconciler could not find out what happened.
    ReconcileFailed,
    // App-cluster members.
    /// The member is bound to a node.
    MemberPlaced,
    /// No node can take the member now.
    Unplaceable,
    /// The member's setup succeeded on its instance.
    MemberConfigured,
    /// The member is gone with its volumes.
    MemberRemoved,
    /// A new instance of the member runs.
    MemberRestarted,
    /// The member's process keeps exiting.
    MemberCrashLooping,
    /// The kernel killed the member's process for want of memory.
    MemberOOMKilled,
    /// Persistent volumes of the member were lost on its node.
    MemberVolumesLost,
    /// The member keeps data on a lost node: an operator must replace it.
    MemberWaitsForReplace,
    /// The member starts over as a new member.
    MemberReplaced,
    /// The member moves to another node with its data.
    MemberMoving,
    /// The member runs on its new node.
    MemberMoved,
    /// A move with its data failed; the member stays.
    MemberMoveFailed,
    /// An approved eviction could not start while its approval held.
    MemberEvictionLapsed,
    /// A rolling restart replaced the member's instance in place.
    MemberRestartedInPlace,
    /// The member was not restarted as the revision it is to run: its
    /// node has no room for what that revision requests.
    MemberRestartRefused,
    /// A member never configured takes its cluster's new revision.
    MemberTakesRevision,
    /// The budgets allowed the member's eviction.
    MemberEvicted,
    /// A drain past its deadline forced the member out.
    MemberForcedOut,
    /// An operator skipped a pending notify.
    NotifySkipped,
    /// An instance a member left behind is removed where it ran.
    OldInstanceRemoved,
    /// A node runs a member bound elsewhere: it is removed there.
    StrayMember,
    /// The member was granted its role's leader lease, in a new term.
    RoleLeaderGranted,
    /// The role's leader lease is not renewed, or no member may lead.
    RoleLeaderWaiting,
    // Disruption budgets.
    /// The budget can never allow an eviction as it stands.
    BudgetNeverAllows,
}

impl fmt::Display for EventReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for EventReason {
    type Err = String;

    fn from_str(word: &str) -> Result<Self, Self::Err> {
        EventReason::ALL
            .iter()
            .copied()
            .find(|r| r.as_str() == word)
            .ok_or_else(|| format!("{word:?} is no reason herd records"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::EventSpec;
    use crate::validation::FieldPath;
    use crate::{Resource, ValidationErrors};

    #[test]
    fn every_reason_reads_back_and_is_a_valid_event_reason() {
        let mut words = std::collections::BTreeSet::new();
        for &reason in EventReason::ALL {
            assert_eq!(reason.as_str().parse::<EventReason>(), Ok(reason));
            assert!(words.insert(reason.as_str()), "{reason} twice");
            let spec = EventSpec { reason: reason.to_string(), count: 1, ..Default::default() };
            let mut errors = ValidationErrors::default();
            spec.validate_spec(&FieldPath::root("spec"), &mut errors);
            assert!(!errors.to_string().contains("reason"), "{reason}: {errors}");
        }
        assert!("NoSuchReason".parse::<EventReason>().is_err());
    }

    #[test]
    fn the_words_are_todays() {
        assert_eq!(EventReason::NodeNotReady.as_str(), "NodeNotReady");
        assert_eq!(EventReason::MemberRestartedInPlace.to_string(), "MemberRestartedInPlace");
    }
}
