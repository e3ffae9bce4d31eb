//! Role sync: which members an AppCluster's spec asks to be created or
//! removed, given the members that exist (KubeDirector's syncClusterRoles).
//! Pure. Each role wants the slots `0..members`; a missing slot is
//! created; a slot past the count, or of a role no longer in the spec, is
//! removed highest index first. A member that never got past create
//! pending goes straight to deleting (nobody was told of it: a grow undone
//! before it happened); any other is marked
//! delete pending, so that the others hear of its leaving first. A slot
//! whose member is still leaving is not filled again until it is gone:
//! one slot never has two members.

use std::collections::BTreeSet;

use crate::kinds::app_cluster::AppClusterSpec;
use crate::kinds::member::{Member, MemberState, member_name};

/// A change role sync asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberChange {
    /// Create the member of this slot (create pending).
    Create { name: String, role: String, index: u32 },
    /// Mark it delete pending: it was (or may have been) announced.
    MarkDeletePending { name: String },
    /// Delete it at once: it never got past create pending.
    Delete { name: String },
}

/// The changes that bring `members` (the cluster's, any state) to what
/// `spec` asks for.
pub fn role_sync(cluster: &str, spec: &AppClusterSpec, members: &[Member]) -> Vec<MemberChange> {
    let leaving = |m: &Member| matches!(m.status.state, MemberState::DeletePending | MemberState::Deleting);
    let wanted = |m: &Member| spec.role(&m.spec.role).is_some_and(|r| m.spec.index < r.members);
    let existing: BTreeSet<&str> = members.iter().map(|m| m.metadata.name.as_str()).collect();
    let mut changes = Vec::new();
    for role in &spec.roles {
        for index in 0..role.members {
            let name = member_name(cluster, &role.name, index);
            if !existing.contains(name.as_str()) {
                changes.push(MemberChange::Create { name, role: role.name.clone(), index });
            }
        }
    }
    let mut surplus: Vec<&Member> = members.iter().filter(|m| !leaving(m) && !wanted(m)).collect();
    surplus.sort_by(|a, b| {
        (&a.spec.role, std::cmp::Reverse(a.spec.index)).cmp(&(&b.spec.role, std::cmp::Reverse(b.spec.index)))
    });
    for member in surplus {
        let name = member.metadata.name.clone();
        let announced = member.status.state != MemberState::CreatePending || member.status.was_configured();
        changes.push(if announced { MemberChange::MarkDeletePending { name } } else { MemberChange::Delete { name } });
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::app_cluster::ClusterRole;
    use crate::kinds::member::{MemberSpec, MemberStatus, StateDetail};
    use proptest::prelude::*;

    fn spec(roles: &[(&str, u32)]) -> AppClusterSpec {
        AppClusterSpec {
            app_ref: "app".into(),
            roles: roles
                .iter()
                .map(|(name, members)| ClusterRole { name: (*name).into(), members: *members, ..Default::default() })
                .collect(),
            ..Default::default()
        }
    }

    fn member(role: &str, index: u32, state: MemberState, configured_before: bool) -> Member {
        let mut member = Member::new(
            member_name("db", role, index),
            MemberSpec { cluster: "db".into(), role: role.into(), index, ..Default::default() },
        );
        member.status = MemberStatus {
            state,
            state_detail: StateDetail {
                last_configured_instance: configured_before.then(|| "i".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        member
    }

    fn names(changes: &[MemberChange]) -> Vec<String> {
        changes
            .iter()
            .map(|c| match c {
                MemberChange::Create { name, .. } => format!("create {name}"),
                MemberChange::MarkDeletePending { name } => format!("delete-pending {name}"),
                MemberChange::Delete { name } => format!("delete {name}"),
            })
            .collect()
    }

    #[test]
    fn rule_missing_slots_are_created() {
        let changes = role_sync("db", &spec(&[("member", 3)]), &[member("member", 1, MemberState::Configured, true)]);
        assert_eq!(names(&changes), ["create db-member-0", "create db-member-2"]);
    }

    #[test]
    fn rule_a_shrink_removes_the_highest_indexes_first_announced_ones_through_delete_pending() {
        let members: Vec<Member> = (0..5).map(|i| member("member", i, MemberState::Configured, true)).collect();
        let changes = role_sync("db", &spec(&[("member", 3)]), &members);
        assert_eq!(names(&changes), ["delete-pending db-member-4", "delete-pending db-member-3"]);
    }

    #[test]
    fn rule_a_member_still_create_pending_goes_straight_to_deleting() {
        // Grown 3 -> 5 and shrunk back before the new ones were set up.
        let mut members: Vec<Member> = (0..3).map(|i| member("member", i, MemberState::Configured, true)).collect();
        members.push(member("member", 3, MemberState::CreatePending, false));
        members.push(member("member", 4, MemberState::Creating, false));
        let changes = role_sync("db", &spec(&[("member", 3)]), &members);
        assert_eq!(names(&changes), ["delete-pending db-member-4", "delete db-member-3"]);
        // A restarting member (configured before) was announced: delete pending.
        let restarting = [member("member", 0, MemberState::CreatePending, true)];
        assert_eq!(names(&role_sync("db", &spec(&[("member", 0)]), &restarting)), ["delete-pending db-member-0"]);
    }

    #[test]
    fn rule_a_role_gone_from_the_spec_is_removed_whole() {
        let members =
            [member("worker", 0, MemberState::Configured, true), member("worker", 1, MemberState::Configured, true)];
        let changes = role_sync("db", &spec(&[]), &members);
        assert_eq!(names(&changes), ["delete-pending db-worker-1", "delete-pending db-worker-0"]);
    }

    #[test]
    fn rule_a_slot_still_being_vacated_is_not_filled_again() {
        let members = [member("member", 0, MemberState::Deleting, true)];
        assert!(role_sync("db", &spec(&[("member", 1)]), &members).is_empty(), "it waits for the old one to go");
        let leaving = [member("member", 1, MemberState::DeletePending, true)];
        assert!(
            role_sync("db", &spec(&[("member", 1)]), &leaving).iter().all(|c| matches!(c, MemberChange::Create { .. }))
        );
    }

    fn state() -> impl Strategy<Value = MemberState> {
        prop_oneof![
            Just(MemberState::CreatePending),
            Just(MemberState::Creating),
            Just(MemberState::Configured),
            Just(MemberState::ConfigError),
            Just(MemberState::DeletePending),
            Just(MemberState::Deleting),
        ]
    }

    proptest! {
        /// Whatever exists, after the changes are applied: every wanted slot
        /// has exactly one member or a leaving one that blocks it, no slot
        /// has two, and nothing wanted is removed.
        #[test]
        fn one_member_per_slot_and_exactly_the_wanted_slots_stay(
            counts in proptest::collection::vec(0u32..6, 1..3),
            present in proptest::collection::vec((0usize..3, 0u32..8, state(), any::<bool>()), 0..12),
        ) {
            let roles: Vec<(String, u32)> = counts.iter().enumerate().map(|(i, c)| (format!("r{i}"), *c)).collect();
            let role_refs: Vec<(&str, u32)> = roles.iter().map(|(n, c)| (n.as_str(), *c)).collect();
            let spec = spec(&role_refs);
            let mut members: Vec<Member> = Vec::new();
            for (role, index, state, before) in present {
                let m = member(&format!("r{role}"), index, state, before);
                if !members.iter().any(|o| o.metadata.name == m.metadata.name) {
                    members.push(m);
                }
            }
            let changes = role_sync("db", &spec, &members);
            let mut after = members.clone();
            for change in &changes {
                match change {
                    MemberChange::Create { name, role, index } => {
                        prop_assert!(!after.iter().any(|m| &m.metadata.name == name), "{} created twice", name);
                        after.push(member(role, *index, MemberState::CreatePending, false));
                    }
                    MemberChange::MarkDeletePending { name } | MemberChange::Delete { name } => {
                        let m = after.iter_mut().find(|m| &m.metadata.name == name).unwrap();
                        prop_assert!(spec.role(&m.spec.role).is_none_or(|r| m.spec.index >= r.members), "{} is wanted", name);
                        m.status.state = if matches!(change, MemberChange::Delete { .. }) { MemberState::Deleting } else { MemberState::DeletePending };
                    }
                }
            }
            let names: BTreeSet<&str> = after.iter().map(|m| m.metadata.name.as_str()).collect();
            prop_assert_eq!(names.len(), after.len(), "one member per slot");
            for m in &after {
                let leaving = matches!(m.status.state, MemberState::DeletePending | MemberState::Deleting);
                let wanted = spec.role(&m.spec.role).is_some_and(|r| m.spec.index < r.members);
                prop_assert!(leaving || wanted, "{} stays though it is not wanted", m.metadata.name);
            }
            for role in &spec.roles {
                for index in 0..role.members {
                    prop_assert!(names.contains(member_name("db", &role.name, index).as_str()), "slot {}/{} is empty", role.name, index);
                }
            }
            prop_assert!(role_sync("db", &spec, &after).is_empty(), "a second pass has nothing to do");
        }
    }
}
