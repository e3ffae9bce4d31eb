//! App-cluster admission (KubeDirector's stricter validator): a change to an
//! AppCluster's spec is refused while the previous change has not had a
//! reconcile pass, or while any member has notifies pending (they were
//! made from the spec as it is, and only the need for them is kept).
//! Changes to metadata alone always pass. Pure.

use crate::kinds::app_cluster::AppCluster;
use crate::kinds::member::Member;

/// Whether `new` may replace `old`, given the cluster's members; the
/// refusal names what blocks it and what to do.
pub fn admit_cluster_change(old: &AppCluster, new: &AppCluster, members: &[Member]) -> Result<(), String> {
    if new.spec == old.spec {
        return Ok(());
    }
    let generation = old.metadata.generation;
    let seen = old.status.observed_generation.unwrap_or(0);
    if seen < generation {
        return Err(format!(
            "the previous change (generation {generation}) has not had a reconcile pass yet (the last pass saw \
             generation {seen}); try again once it has"
        ));
    }
    let mut blocking: Vec<String> = members
        .iter()
        .filter(|m| !m.status.state_detail.pending_notify_cmds.is_empty())
        .map(|m| {
            let notifies: Vec<String> = m
                .status
                .state_detail
                .pending_notify_cmds
                .iter()
                .map(|n| {
                    let since = n.since.map(|t| format!(" since {t}")).unwrap_or_default();
                    let error = n.last_error.as_deref().map(|e| format!(", last: {e}")).unwrap_or_default();
                    format!("`{}` ({} attempts{since}{error})", n.arguments.join(" "), n.attempts)
                })
                .collect();
            format!(
                "{} ({:?}, {:?}) has pending {}",
                m.metadata.name,
                m.status.state,
                m.status.state_detail.last_known_state,
                notifies.join(", ")
            )
        })
        .collect();
    if blocking.is_empty() {
        return Ok(());
    }
    blocking.sort();
    Err(format!(
        "members have notifies pending, made from the spec as it is: {}; bring them back (a notify to a member that \
         is down waits for it), fix the App's script if it fails, or drop a notify that cannot be delivered with \
         `herd member skip-notify MEMBER`; then change the spec",
        blocking.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::app_cluster::{AppClusterSpec, ClusterRole};
    use crate::kinds::member::{LastKnownState, MemberSpec, MemberState, PendingNotify};

    fn cluster(members: u32, generation: i64, observed: Option<i64>) -> AppCluster {
        let mut cluster = AppCluster::new(
            "db",
            AppClusterSpec {
                app_ref: "etcd".into(),
                roles: vec![ClusterRole { name: "member".into(), members, ..Default::default() }],
                ..Default::default()
            },
        );
        cluster.metadata.generation = generation;
        cluster.status.observed_generation = observed;
        cluster
    }

    fn with_pending(name: &str) -> Member {
        let mut member =
            Member::new(name, MemberSpec { cluster: "db".into(), role: "member".into(), ..Default::default() });
        member.status.state = MemberState::Configured;
        member.status.state_detail.last_known_state = LastKnownState::Terminated;
        member.status.state_detail.pending_notify_cmds.push(PendingNotify {
            arguments: vec![
                "--addnodes".into(),
                "--role".into(),
                "member".into(),
                "--members".into(),
                "db-member-3".into(),
            ],
            attempts: 4,
            last_error: Some("exit 120".into()),
            since: None,
            last_attempt: None,
        });
        member
    }

    #[test]
    fn rule_metadata_changes_always_pass() {
        let old = cluster(3, 2, Some(1));
        let mut new = old.clone();
        new.metadata.labels.insert("team".into(), "a".into());
        assert_eq!(admit_cluster_change(&old, &new, &[with_pending("db-member-0")]), Ok(()));
    }

    #[test]
    fn rule_a_spec_change_waits_for_a_pass_over_the_previous_one() {
        let error = admit_cluster_change(&cluster(3, 2, Some(1)), &cluster(5, 2, Some(1)), &[]).unwrap_err();
        assert!(error.starts_with("the previous change (generation 2) has not had a reconcile pass yet"), "{error}");
        assert_eq!(admit_cluster_change(&cluster(3, 2, Some(2)), &cluster(5, 2, Some(2)), &[]), Ok(()));
    }

    #[test]
    fn rule_pending_notifies_block_a_spec_change_naming_the_members() {
        let members = [with_pending("db-member-1"), Member::new("db-member-0", MemberSpec::default())];
        let error = admit_cluster_change(&cluster(3, 2, Some(2)), &cluster(5, 2, Some(2)), &members).unwrap_err();
        assert_eq!(
            error,
            "members have notifies pending, made from the spec as it is: db-member-1 (Configured, Terminated) has pending \
             `--addnodes --role member --members db-member-3` (4 attempts, last: exit 120); bring them back (a \
             notify to a member that is down waits for it), fix the App's script if it fails, or drop a notify that \
             cannot be delivered with `herd member skip-notify MEMBER`; then change the spec"
        );
    }
}
