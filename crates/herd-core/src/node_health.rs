//! When a node is Ready: the decision of the node-lifecycle controller.
//!
//! Liveness is judged on the controller's own monotonic clock, from the
//! moment it last saw the node's heartbeat change, never by comparing the
//! heartbeat's wall-clock time with the local clock. Clock skew between
//! server replicas therefore cannot mark a node lost early (the lesson of
//! fabric8 against client-go, applied to nodes).

use std::time::Duration;

use crate::api::{AgentReport, CgroupLayout, DiskReport, IsolationReport};
use crate::kinds::{ConditionStatus, Node, NodeStatus};
use crate::time::Timestamp;
use crate::units::human_bytes;

/// The Ready condition's type.
pub const READY: &str = "Ready";

/// What a heartbeat changed, so that the caller can tell the operator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeartbeatEffects {
    /// The node was NotReady (or new) and is Ready now.
    pub became_ready: bool,
    /// The agent process is a different one than last time.
    pub agent_restarted: bool,
    /// The host's kernel boot id changed: the host rebooted.
    pub host_rebooted: bool,
}

/// Applies an agent's report to its node's status: the node is Ready, its
/// heartbeat is `now` (server time), and address and boot ids are current.
pub fn apply_heartbeat(status: &mut NodeStatus, report: &AgentReport, now: Timestamp) -> HeartbeatEffects {
    let changed = |old: &Option<String>, new: &Option<String>| old.is_some() && new.is_some() && old != new;
    let new_agent = Some(report.agent_boot_id.clone());
    let effects = HeartbeatEffects {
        became_ready: !status.ready,
        agent_restarted: changed(&status.agent_boot_id, &new_agent),
        host_rebooted: changed(&status.host_boot_id, &report.host_boot_id),
    };
    status.ready = true;
    status.last_heartbeat = Some(now);
    status.agent_boot_id = new_agent;
    if report.host_boot_id.is_some() {
        status.host_boot_id = report.host_boot_id.clone();
    }
    if report.address.is_some() {
        status.address = report.address.clone();
    }
    if report.agent_version.is_some() {
        status.agent_version = report.agent_version.clone();
    }
    if let Some(resources) = report.resources {
        status.capacity = Some(resources.capacity);
        status.allocatable = Some(resources.capacity.minus(&resources.reserved));
    }
    status.members = report.members.clone();
    status.config_serial = report.config_serial.unwrap_or(0);
    status.set_condition(READY, ConditionStatus::True, "AgentHeartbeat", "the agent is sending heartbeats", now);
    if let Some(disk) = report.disk {
        let (state, reason, message) = disk_pressure(disk);
        status.set_condition(DISK_PRESSURE, state, reason, &message, now);
    }
    if let Some(isolation) = &report.isolation {
        let (state, reason, message) = isolation_condition(isolation);
        status.set_condition(RESOURCE_ISOLATION, state, reason, &message, now);
    }
    effects
}

/// The condition that says whether members are kept to their limits.
pub const RESOURCE_ISOLATION: &str = "ResourceIsolation";

/// True with the cgroup layout, False (members run unlimited) and why.
pub fn isolation_condition(report: &IsolationReport) -> (ConditionStatus, &'static str, String) {
    match report.layout {
        CgroupLayout::V1 => (ConditionStatus::True, "CgroupV1", report.detail.clone()),
        CgroupLayout::V2 => (ConditionStatus::True, "CgroupV2", report.detail.clone()),
        CgroupLayout::None => {
            (ConditionStatus::False, "NoCgroups", format!("members run without limits: {}", report.detail))
        }
    }
}

/// Whether a heartbeat's effect on a node's status is worth a store write:
/// anything but the heartbeat time changed, or the time written last is
/// `refresh` old (a fraction of the grace period, so that the node
/// lifecycle still sees the node beat well within it). A thousand nodes
/// beating every two seconds are then not a thousand writes every two
/// seconds (Kubernetes' node leases answer the same cost).
pub fn worth_writing(before: &NodeStatus, after: &NodeStatus, now: Timestamp, refresh: std::time::Duration) -> bool {
    let stale = before.last_heartbeat.is_none_or(|at| at.age(now) >= refresh);
    stale || NodeStatus { last_heartbeat: before.last_heartbeat, ..without_usage(after) } != without_usage(before)
}

/// The status without its members' usage, which moves at every heartbeat
/// and is written only with the rest or when the status is due anyway.
fn without_usage(status: &NodeStatus) -> NodeStatus {
    let mut status = status.clone();
    for member in &mut status.members {
        member.usage = None;
    }
    status
}

/// Whether a node changed in more than what its heartbeats keep moving
/// (the time, the configuration serial, its members' usage): what a
/// controller acting on members, readiness and addresses needs to wake for.
pub fn changed_beyond_heartbeat(before: &Node, after: &Node) -> bool {
    let beats = |status: &NodeStatus| NodeStatus { last_heartbeat: None, config_serial: 0, ..without_usage(status) };
    before.spec != after.spec
        || before.metadata.labels != after.metadata.labels
        || before.metadata.annotations != after.metadata.annotations
        || beats(&before.status) != beats(&after.status)
}

/// The condition set while the data dir's file system is (nearly) full.
pub const DISK_PRESSURE: &str = "DiskPressure";

/// Under pressure when less than 5% or 64 MB is free, whichever is less:
/// a copy or a member's writes may fail for want of space.
pub fn disk_pressure(disk: DiskReport) -> (ConditionStatus, &'static str, String) {
    let threshold = (disk.total_bytes / 20).min(64_000_000);
    let figures =
        format!("{} free of {} on the agent's data dir", human_bytes(disk.free_bytes), human_bytes(disk.total_bytes));
    if disk.free_bytes < threshold {
        (ConditionStatus::True, "DataDirFull", format!("{figures} (under {})", human_bytes(threshold)))
    } else {
        (ConditionStatus::False, "DataDirHasSpace", figures)
    }
}

/// Marks a node NotReady because its heartbeats stopped.
pub fn mark_not_ready(status: &mut NodeStatus, silent_for: Duration, grace: Duration, now: Timestamp) -> String {
    let message = format!("no heartbeat for {}s (grace period {}s)", silent_for.as_secs(), grace.as_secs());
    status.ready = false;
    status.set_condition(READY, ConditionStatus::False, "HeartbeatLost", &message, now);
    message
}

/// What the controller should do to a node's Ready status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadinessChange {
    /// Heartbeats stopped for longer than the grace period.
    MarkNotReady {
        silent_for: Duration,
    },
    Unchanged,
}

/// Decides from how long the heartbeat has been unchanged. A node that is
/// already NotReady stays so until a heartbeat arrives (the heartbeat handler
/// marks it Ready, so that recovery costs no controller round).
pub fn readiness_change(currently_ready: bool, unchanged_for: Duration, grace: Duration) -> ReadinessChange {
    if currently_ready && unchanged_for > grace {
        ReadinessChange::MarkNotReady { silent_for: unchanged_for }
    } else {
        ReadinessChange::Unchanged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn report(agent: &str, host: &str) -> AgentReport {
        AgentReport {
            agent_boot_id: agent.into(),
            host_boot_id: Some(host.into()),
            address: Some("127.0.0.1:1".into()),
            agent_version: None,
            members: Vec::new(),
            commands: Vec::new(),
            ..AgentReport::default()
        }
    }

    #[test]
    fn a_nearly_full_data_dir_is_disk_pressure_with_the_figures() {
        let (state, _, message) = disk_pressure(DiskReport { free_bytes: 1_000_000, total_bytes: 64_000_000 });
        assert_eq!(state, ConditionStatus::True);
        assert_eq!(message, "1.0 MB free of 64 MB on the agent's data dir (under 3.2 MB)");
        let (state, _, _) = disk_pressure(DiskReport { free_bytes: 70_000_000, total_bytes: 1_000_000_000_000 });
        assert_eq!(state, ConditionStatus::False, "64 MB is the most ever asked for");
    }

    #[test]
    fn heartbeat_effects() {
        let t = Timestamp::parse("2026-11-29T10:00:00Z").unwrap();
        let mut status = NodeStatus::default();
        let first = apply_heartbeat(&mut status, &report("a1", "h1"), t);
        assert_eq!(first, HeartbeatEffects { became_ready: true, agent_restarted: false, host_rebooted: false });
        assert_eq!(apply_heartbeat(&mut status, &report("a1", "h1"), t), HeartbeatEffects::default());
        let restarted = apply_heartbeat(&mut status, &report("a2", "h1"), t);
        assert!(restarted.agent_restarted && !restarted.host_rebooted && !restarted.became_ready);
        mark_not_ready(&mut status, Duration::from_secs(12), Duration::from_secs(10), t);
        assert!(!status.ready);
        assert_eq!(status.condition(READY).unwrap().reason, "HeartbeatLost");
        let back = apply_heartbeat(&mut status, &report("a3", "h2"), t);
        assert!(back.became_ready && back.agent_restarted && back.host_rebooted);
        assert_eq!(status.condition(READY).unwrap().status, ConditionStatus::True);
    }

    proptest! {
        #[test]
        fn not_ready_exactly_when_ready_and_silent_past_grace(ready: bool, silent_ms in 0u64..100_000, grace_ms in 1u64..100_000) {
            let change = readiness_change(ready, Duration::from_millis(silent_ms), Duration::from_millis(grace_ms));
            let expect_mark = ready && silent_ms > grace_ms;
            prop_assert_eq!(matches!(change, ReadinessChange::MarkNotReady { .. }), expect_mark);
        }
    }

    #[test]
    fn a_heartbeat_that_changes_nothing_but_its_time_is_written_only_once_stale() {
        let at = |s: u64| {
            Timestamp::from_system_time(
                std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000 + s),
            )
        };
        let report = AgentReport { agent_boot_id: "a".into(), ..AgentReport::default() };
        let mut before = NodeStatus::default();
        apply_heartbeat(&mut before, &report, at(0));
        let refresh = std::time::Duration::from_secs(5);
        let node = |status: &NodeStatus| {
            let mut node = Node::new("n1", crate::kinds::NodeSpec::default());
            node.status = status.clone();
            node
        };
        let mut after = before.clone();
        apply_heartbeat(&mut after, &report, at(2));
        assert!(!worth_writing(&before, &after, at(2), refresh), "only the time moved");
        assert!(worth_writing(&before, &after, at(5), refresh), "the time written last is stale");
        let moved = AgentReport { config_serial: Some(3), ..report.clone() };
        let mut changed = before.clone();
        apply_heartbeat(&mut changed, &moved, at(2));
        assert!(worth_writing(&before, &changed, at(2), refresh), "the serial changed");
        assert!(worth_writing(&NodeStatus::default(), &before, at(0), refresh), "a first heartbeat");
        let member = |cpu: u64| crate::api::MemberReport {
            name: "m".into(),
            usage: Some(crate::api::MemberUsage { cpu: Some(crate::quantity::Millicores(cpu)), memory: None }),
            ..Default::default()
        };
        let (mut using, mut using_more) = (before.clone(), before.clone());
        apply_heartbeat(&mut using, &AgentReport { members: vec![member(100)], ..report.clone() }, at(1));
        apply_heartbeat(&mut using_more, &AgentReport { members: vec![member(900)], ..report.clone() }, at(2));
        assert!(!worth_writing(&using, &using_more, at(2), refresh), "usage alone waits for the refresh");
        assert!(!changed_beyond_heartbeat(&node(&using), &node(&using_more)), "nor wakes a controller");

        let (first, beat, moved) = (node(&before), node(&after), node(&changed));
        assert!(!changed_beyond_heartbeat(&first, &beat), "a beat moves only the time");
        assert!(!changed_beyond_heartbeat(&first, &moved), "nor does a serial");
        let mut report = first.clone();
        report.status.members.push(crate::api::MemberReport { name: "m".into(), ..Default::default() });
        assert!(changed_beyond_heartbeat(&first, &report), "a member reported");
        let mut not_ready = first.clone();
        not_ready.status.ready = !first.status.ready;
        assert!(changed_beyond_heartbeat(&first, &not_ready), "readiness");
        let mut drained = first.clone();
        drained.spec.unschedulable = true;
        assert!(changed_beyond_heartbeat(&first, &drained), "the spec");
    }
}
