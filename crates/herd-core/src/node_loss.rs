//! What becomes of a member
//! whose node is lost (NotReady for longer than the grace) or that the
//! operator asked to replace. Without persistent storage it is recreated
//! elsewhere at once; with it, herd does not move it silently: it says
//! which volumes a replacement would lose and waits for `herd member
//! replace`. A replaced member starts over as a new member (the others
//! are told it left, and of it again once it is configured). Pure.

use std::time::Duration;

use crate::kinds::member::{MemberState, MemberStatus};
use crate::units::short_duration;

/// What to do with one member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// Its node is fine (or not lost for long enough), nothing asked.
    Nothing,
    /// Recreate it on another node; the reason says why.
    Replace(String),
    /// It keeps data on a lost node: say so, and what replacing it costs.
    WaitForReplace(String),
}

/// The facts about one member's node.
#[derive(Clone, Copy, Debug)]
pub struct NodeLoss<'a> {
    pub node: &'a str,
    /// How long this leader has seen the node NotReady (None: Ready).
    pub not_ready_for: Option<Duration>,
    pub grace: Duration,
}

/// Decides for a member bound to `loss.node` with these persistent
/// volumes, `replace_asked` when the operator asked for it.
pub fn recovery(
    name: &str,
    status: &MemberStatus,
    persistent_volumes: &[String],
    loss: NodeLoss<'_>,
    replace_asked: bool,
) -> Recovery {
    if matches!(status.state, MemberState::DeletePending | MemberState::Deleting) {
        return Recovery::Nothing;
    }
    if replace_asked {
        return Recovery::Replace(format!("the operator asked to replace it (it was on {})", loss.node));
    }
    let Some(lost_for) = loss.not_ready_for.filter(|d| *d >= loss.grace) else { return Recovery::Nothing };
    let lost = format!(
        "node {} has been NotReady for {} (grace {})",
        loss.node,
        short_duration(lost_for),
        short_duration(loss.grace)
    );
    if persistent_volumes.is_empty() {
        return Recovery::Replace(format!("{lost}; it keeps no data there, so it is placed again elsewhere"));
    }
    Recovery::WaitForReplace(format!(
        "{lost}; it keeps its data there, so herd does not move it: `herd member replace {name}` recreates it on \
         another node with empty volumes {} (what they hold on {} is lost), or bring the node back",
        persistent_volumes.join(", "),
        loss.node
    ))
}

/// How many of a member's instances from before its replacements are kept.
const RETIRED_KEPT: usize = 4;

/// The status a replaced member starts over with: a new member, create
/// pending, saying why, not to be placed on `from` again, and never to take
/// one of its old instances (`old`'s, and those it had retired) as its own.
pub fn replaced_status(why: String, from: &str, old: &MemberStatus) -> MemberStatus {
    MemberStatus {
        reason: Some(why),
        moved_from: Some(from.to_string()),
        retired_instances: retired(old),
        ..Default::default()
    }
}

/// The member's retired instances with the ones it runs or was configured
/// as now added (the last [`RETIRED_KEPT`]): it leaves them behind where
/// it was (a replace, a move).
pub fn retired(old: &MemberStatus) -> Vec<String> {
    let detail = &old.state_detail;
    let mut retired = old.retired_instances.clone();
    for instance in [&detail.configuring_instance, &detail.last_configured_instance].into_iter().flatten() {
        if !retired.contains(instance) {
            retired.push(instance.clone());
        }
    }
    let drop = retired.len().saturating_sub(RETIRED_KEPT);
    retired.drain(..drop);
    retired
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configured() -> MemberStatus {
        MemberStatus { state: MemberState::Configured, ..Default::default() }
    }

    fn loss(not_ready_for: Option<u64>) -> NodeLoss<'static> {
        NodeLoss { node: "n1", not_ready_for: not_ready_for.map(Duration::from_secs), grace: Duration::from_secs(60) }
    }

    #[test]
    fn rule_nothing_happens_before_the_grace_or_on_a_ready_node() {
        assert_eq!(recovery("m", &configured(), &[], loss(None), false), Recovery::Nothing);
        assert_eq!(recovery("m", &configured(), &[], loss(Some(59)), false), Recovery::Nothing);
    }

    #[test]
    fn rule_a_member_without_data_is_replaced_after_the_grace() {
        let Recovery::Replace(why) = recovery("m", &configured(), &[], loss(Some(60)), false) else { panic!() };
        assert_eq!(
            why,
            "node n1 has been NotReady for 60s (grace 60s); it keeps no data there, so it is placed again elsewhere"
        );
    }

    #[test]
    fn rule_a_member_with_data_waits_and_says_what_replacing_costs() {
        let volumes = ["data".to_string(), "herd".to_string()];
        let Recovery::WaitForReplace(why) = recovery("db-0", &configured(), &volumes, loss(Some(300)), false) else {
            panic!()
        };
        assert!(why.contains("`herd member replace db-0`") && why.contains("empty volumes data, herd"), "{why}");
        assert!(why.contains("what they hold on n1 is lost"), "{why}");
        let Recovery::Replace(why) = recovery("db-0", &configured(), &volumes, loss(Some(300)), true) else { panic!() };
        assert!(why.contains("the operator asked"), "{why}");
    }

    #[test]
    fn rule_a_leaving_member_is_left_to_leave() {
        let leaving = MemberStatus { state: MemberState::Deleting, ..Default::default() };
        assert_eq!(recovery("m", &leaving, &[], loss(Some(600)), true), Recovery::Nothing);
    }

    #[test]
    fn a_replaced_member_starts_over_as_a_new_one() {
        let mut old = MemberStatus::default();
        old.state_detail.last_configured_instance = Some("i1".into());
        old.retired_instances = (0..4).map(|i| format!("old{i}")).collect();
        let status = replaced_status("moved".into(), "n1", &old);
        assert_eq!(status.state, MemberState::CreatePending);
        assert_eq!(status.moved_from.as_deref(), Some("n1"), "placement keeps it off n1");
        assert_eq!(status.retired_instances, ["old1", "old2", "old3", "i1"], "the last four, newest last");
        assert!(!status.was_configured(), "it is announced again once configured");
        assert_eq!(status.reason.as_deref(), Some("moved"));
    }
}
