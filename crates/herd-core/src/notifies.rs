//! Notifies: who is told of members joining and leaving (KubeDirector's
//! generateNotifies), and of a leader role's new leader. When members of
//! role R join (first set up, never a restart) or leave, every configured
//! member of a role whose App role lists R in `notifies` gets
//! `--addnodes|--delnodes --role R --members a,b` queued in its
//! pendingNotifyCmds (`--leader --role R --members m --term N` when m is
//! granted R's lease in term N, so that followers follow it); they are
//! sent at the end of every
//! pass, one member of a role at a time unless its App role asks for all
//! at once (`notifyOrder`), and retried until they succeed. Pure.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::backoff::Backoff;
use crate::kinds::app::{AppSpec, NotifyOrder};
use crate::kinds::member::{LastKnownState, Member, MemberState, MemberStatus, PendingNotify};
use crate::time::Timestamp;

/// Members joining or leaving in this pass, or a role's new leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Added,
    Deleted,
    /// Granted its role's lease in this term.
    Leader {
        term: u64,
    },
}

impl Change {
    /// The notify's arguments, for members `names` of `role`.
    fn arguments(self, role: &str, names: &str) -> Vec<String> {
        let flag = match self {
            Change::Added => "--addnodes",
            Change::Deleted => "--delnodes",
            Change::Leader { .. } => "--leader",
        };
        let mut arguments = [flag, "--role", role, "--members", names].map(str::to_string).to_vec();
        if let Change::Leader { term } = self {
            arguments.extend(["--term".to_string(), term.to_string()]);
        }
        arguments
    }
}

/// Queues the notifies for `changed` (names of members of one role each,
/// any roles) on the configured members that asked; returns how many
/// were queued. A member never hears of itself.
pub fn queue_notifies(
    app: &AppSpec,
    members: &mut [Member],
    change: Change,
    changed: &[(String, String)],
    now: Timestamp,
) -> usize {
    let mut by_role: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (role, name) in changed {
        by_role.entry(role.as_str()).or_default().push(name.as_str());
    }
    let mut queued = 0;
    for member in members.iter_mut() {
        if member.status.state != MemberState::Configured {
            continue;
        }
        let Some(listens) = app.role(&member.spec.role).map(|r| &r.notifies) else { continue };
        for (role, names) in &by_role {
            if !listens.iter().any(|r| r == role) {
                continue;
            }
            let others: Vec<&str> = names.iter().copied().filter(|n| *n != member.metadata.name).collect();
            if others.is_empty() {
                continue;
            }
            let arguments = change.arguments(role, &others.join(","));
            member.status.state_detail.pending_notify_cmds.push(PendingNotify {
                arguments,
                attempts: 0,
                last_error: None,
                since: Some(now),
                last_attempt: None,
            });
            queued += 1;
        }
    }
    queued
}

/// The script a notify runs: the App's setup script with the notify's
/// arguments as its positional parameters.
pub fn notify_script(setup_script: &str, arguments: &[String]) -> String {
    let quoted: Vec<String> = arguments.iter().map(|a| format!("'{}'", a.replace('\'', "'\\''"))).collect();
    format!("set -- {}\n{setup_script}", quoted.join(" "))
}

/// The pauses after failed deliveries: 1 s, doubling, at most 1 min.
const RETRIES: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));

/// The pause after the `attempts`-th failed delivery.
pub fn retry_pause(attempts: u32) -> Duration {
    RETRIES.pause(attempts)
}

/// Whether a notify may be sent (again) at `now`.
pub fn notify_due(notify: &PendingNotify, now: Timestamp) -> bool {
    match notify.last_attempt {
        Some(at) if notify.attempts > 0 => at.age(now) >= retry_pause(notify.attempts),
        _ => true,
    }
}

/// Which members are sent their first pending notify at `now`, in the
/// order their App role asks for: configured members with a setup script,
/// on a Ready node, whose first notify is due and that have no Command on
/// its way (`busy`); of a role that takes them one at a time, only the
/// first of those by index, and none while one of the role's notifies is
/// on its way (`notifying`). Indexes into `members`.
pub fn to_send(
    app: &AppSpec,
    members: &[Member],
    busy: &dyn Fn(&str) -> bool,
    notifying: &dyn Fn(&str) -> bool,
    now: Timestamp,
) -> Vec<usize> {
    let mut sending = Vec::new();
    for role in &app.roles {
        if role.setup.is_none() {
            continue;
        }
        let mut of_role: Vec<usize> = (0..members.len()).filter(|&i| members[i].spec.role == role.name).collect();
        of_role.sort_by_key(|&i| members[i].spec.index);
        // A member whose node is not Ready (its state unknown) takes no
        // Command: it waits, and the others of its role go on.
        let due = of_role.iter().copied().filter(|&i| {
            let member = &members[i];
            member.status.state == MemberState::Configured
                && member.status.state_detail.last_known_state != LastKnownState::Unknown
                && !busy(&member.metadata.name)
                && member.status.state_detail.pending_notify_cmds.first().is_some_and(|n| notify_due(n, now))
        });
        match role.notify_order {
            NotifyOrder::Parallel => sending.extend(due),
            NotifyOrder::OneAtATime if of_role.iter().any(|&i| notifying(&members[i].metadata.name)) => {}
            NotifyOrder::OneAtATime => sending.extend(due.take(1)),
        }
    }
    sending
}

/// The operator's way out of a notify that cannot be delivered: the first
/// pending notify (or every one, with `all`) is dropped unsent. Returns
/// what was dropped (none: nothing was pending). A delivery of a dropped
/// notify already on its way is then recorded as nothing
/// ([`record_delivery`] matches the first pending one by its arguments).
pub fn skip(status: &mut MemberStatus, all: bool) -> Vec<PendingNotify> {
    let pending = &mut status.state_detail.pending_notify_cmds;
    let count = if all { pending.len() } else { pending.len().min(1) };
    pending.drain(..count).collect()
}

/// Records one delivery of the notify with `arguments` (the first pending
/// one, if it still is) at `now`: delivered, it goes; failed, its attempts,
/// last error and time say so. Returns whether anything changed.
pub fn record_delivery(
    status: &mut MemberStatus,
    arguments: &[String],
    outcome: Result<(), String>,
    now: Timestamp,
) -> bool {
    let pending = &mut status.state_detail.pending_notify_cmds;
    if pending.first().is_none_or(|n| n.arguments != arguments) {
        return false;
    }
    match outcome {
        Ok(()) => {
            pending.remove(0);
        }
        Err(error) => {
            pending[0].attempts += 1;
            pending[0].last_error = Some(error);
            pending[0].last_attempt = Some(now);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::app::{AppRole, SetupScript};
    use crate::kinds::member::{MemberSpec, member_name};

    fn app() -> AppSpec {
        let role = |name: &str, notifies: &[&str]| AppRole {
            name: name.into(),
            setup: Some(SetupScript { script: "x".into(), timeout: crate::time::HumanDuration::from_secs(5) }),
            notifies: notifies.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        AppSpec { roles: vec![role("member", &["member"]), role("worker", &[])], ..Default::default() }
    }

    fn member(role: &str, index: u32, state: MemberState) -> Member {
        let mut member = Member::new(
            member_name("db", role, index),
            MemberSpec { cluster: "db".into(), role: role.into(), index, ..Default::default() },
        );
        member.status.state = state;
        member.status.state_detail.last_known_state = LastKnownState::Running;
        member
    }

    fn now() -> Timestamp {
        Timestamp::parse("2026-12-01T10:00:00Z").unwrap()
    }

    #[test]
    fn rule_configured_members_of_roles_that_asked_hear_of_joins() {
        let mut members = vec![
            member("member", 0, MemberState::Configured),
            member("member", 1, MemberState::Configured),
            member("worker", 0, MemberState::Configured),
            member("member", 2, MemberState::Creating),
        ];
        let joined = [("member".to_string(), "db-member-3".to_string()), ("member".into(), "db-member-4".into())];
        assert_eq!(queue_notifies(&app(), &mut members, Change::Added, &joined, now()), 2);
        let args = &members[0].status.state_detail.pending_notify_cmds[0].arguments;
        assert_eq!(args.join(" "), "--addnodes --role member --members db-member-3,db-member-4");
        assert_eq!(members[0].status.state_detail.pending_notify_cmds[0].since, Some(now()));
        assert!(members[2].status.state_detail.pending_notify_cmds.is_empty(), "workers did not ask");
        assert!(members[3].status.state_detail.pending_notify_cmds.is_empty(), "not configured: its setup sees it");
    }

    #[test]
    fn rule_leaving_members_are_announced_and_nobody_hears_of_itself() {
        let mut members =
            vec![member("member", 0, MemberState::Configured), member("member", 1, MemberState::Configured)];
        let left = [("member".to_string(), "db-member-1".to_string())];
        assert_eq!(queue_notifies(&app(), &mut members, Change::Deleted, &left, now()), 1);
        assert_eq!(
            members[0].status.state_detail.pending_notify_cmds[0].arguments.join(" "),
            "--delnodes --role member --members db-member-1"
        );
        assert!(members[1].status.state_detail.pending_notify_cmds.is_empty());
    }

    #[test]
    fn rule_changes_of_a_role_nobody_listens_to_queue_nothing() {
        let mut members = vec![member("member", 0, MemberState::Configured)];
        let joined = [("worker".to_string(), "db-worker-1".to_string())];
        assert_eq!(queue_notifies(&app(), &mut members, Change::Added, &joined, now()), 0);
    }

    #[test]
    fn rule_a_delivery_removes_the_notify_and_a_failure_is_counted_with_its_error() {
        let mut members = vec![member("member", 0, MemberState::Configured)];
        let joined = [("member".to_string(), "db-member-1".to_string()), ("member".into(), "db-member-2".into())];
        queue_notifies(&app(), &mut members, Change::Added, &joined[..1], now());
        queue_notifies(&app(), &mut members, Change::Added, &joined[1..], now());
        let status = &mut members[0].status;
        let first = status.state_detail.pending_notify_cmds[0].arguments.clone();
        let second = status.state_detail.pending_notify_cmds[1].arguments.clone();
        assert!(!record_delivery(status, &second, Ok(()), now()), "only the first is delivered");
        assert!(notify_due(&status.state_detail.pending_notify_cmds[0], now()));
        assert!(record_delivery(status, &first, Err("exit status 120: busy".into()), now()));
        let notify = status.state_detail.pending_notify_cmds[0].clone();
        assert_eq!((notify.attempts, notify.last_error.as_deref()), (1, Some("exit status 120: busy")));
        let later = |secs: u64| Timestamp::from_system_time(now().system_time() + Duration::from_secs(secs));
        assert!(!notify_due(&notify, later(0)), "a failed notify waits");
        assert!(notify_due(&notify, later(1)));
        assert_eq!([1, 2, 3, 7, 20].map(|a| retry_pause(a).as_secs()), [1, 2, 4, 60, 60]);
        assert!(record_delivery(status, &first, Ok(()), later(1)));
        assert_eq!(status.state_detail.pending_notify_cmds.len(), 1);
        assert!(!record_delivery(status, &first, Ok(()), later(1)), "recorded twice, removed once");
        assert_eq!(
            notify_script("echo \"$@\"", &["--addnodes".into(), "it's".into()]),
            "set -- '--addnodes' 'it'\\''s'\necho \"$@\""
        );
    }

    #[test]
    fn rule_a_role_is_sent_its_notifies_one_member_at_a_time_unless_it_asks_for_all_at_once() {
        let at = Timestamp::parse("2026-12-01T10:00:00Z").unwrap();
        let mut members: Vec<Member> = (0..3).map(|i| member("member", i, MemberState::Configured)).collect();
        members.push(member("worker", 0, MemberState::Configured));
        queue_notifies(&app(), &mut members, Change::Deleted, &[("member".into(), "db-member-9".into())], at);
        let none = |_: &str| false;
        assert_eq!(to_send(&app(), &members, &none, &none, at), vec![0], "the lowest index first, alone");
        let on_its_way = |m: &str| m == "db-member-0";
        assert!(to_send(&app(), &members, &on_its_way, &on_its_way, at).is_empty(), "none while one is on its way");
        let busy_configuring = |m: &str| m == "db-member-0";
        assert_eq!(to_send(&app(), &members, &busy_configuring, &none, at), vec![1], "the next one not busy");
        let mut parallel = app();
        parallel.roles[0].notify_order = NotifyOrder::Parallel;
        assert_eq!(to_send(&parallel, &members, &none, &none, at), vec![0, 1, 2]);
        members[0].status.state_detail.last_known_state = LastKnownState::Unknown;
        assert_eq!(to_send(&app(), &members, &none, &none, at), vec![1], "one whose node is down waits, alone");
        members[0].status.state_detail.pending_notify_cmds.clear();
        assert_eq!(to_send(&app(), &members, &none, &none, at), vec![1]);
    }

    #[test]
    fn rule_a_skipped_notify_is_dropped_unsent_and_a_late_delivery_of_it_changes_nothing() {
        let at = Timestamp::parse("2026-12-01T10:00:00Z").unwrap();
        let mut members = vec![member("member", 0, MemberState::Configured)];
        queue_notifies(&app(), &mut members, Change::Deleted, &[("member".into(), "db-member-8".into())], at);
        queue_notifies(&app(), &mut members, Change::Deleted, &[("member".into(), "db-member-9".into())], at);
        let status = &mut members[0].status;
        let first = status.state_detail.pending_notify_cmds[0].arguments.clone();
        let skipped = skip(status, false);
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].arguments, first);
        assert!(!record_delivery(status, &first, Err("exit 120".into()), at), "its delivery, late, is nothing");
        assert_eq!(status.state_detail.pending_notify_cmds.len(), 1);
        assert_eq!(skip(status, true).len(), 1);
        assert!(skip(status, true).is_empty(), "nothing pending: nothing skipped");
    }
}
