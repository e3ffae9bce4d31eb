//! The leader of an App role: the rules by which the herd leader grants,
//! renews and moves a role's lease, and by which the holder's side fences
//! itself. At most one member instance of a role holds its lease, with a
//! term that only rises.
//!
//! As in the control plane's election, expiry is judged on each side's
//! own monotonic clock, never by comparing another host's wall clock:
//! - the granting side grants a new term only once `leaseDuration` has
//!   passed since it last saw the lease renewed (a new herd leader counts
//!   from when it first read the lease);
//! - the holder's side fences (demote, then the member's processes end)
//!   `renewDeadline` after it sent the report that the last renewal
//!   answered. That report was sent before the renewal was written, so the
//!   holder has fenced at least `leaseDuration - renewDeadline` (one
//!   `retryPeriod` or more, by the lease rules) before anyone may be
//!   granted the next term.
//!
//! Monotonic times are `Duration`s since an origin the caller picks; only
//! differences between them matter.

use std::cmp::Reverse;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::kinds::cluster_config::{Breach, lease_time_breaches};
use crate::time::HumanDuration;

/// A lease's times (the control plane's election keeps the same rules).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTimes {
    pub lease_duration: HumanDuration,
    pub renew_deadline: HumanDuration,
    pub retry_period: HumanDuration,
}

impl LeaseTimes {
    /// The rules that do not hold (none: the times are usable).
    pub fn breaches(&self) -> Vec<Breach> {
        lease_time_breaches(self.lease_duration, self.renew_deadline, self.retry_period)
    }
}

/// Who holds a role's lease: one run of one member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub member: String,
    pub instance: String,
}

/// A role's lease as the granting side last read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoleLease {
    /// None: never granted, or given up.
    pub holder: Option<Holder>,
    /// The term of the holder's grant (0: never granted). Each grant is
    /// the term before plus one.
    pub term: u64,
}

/// How far a member has come (for PostgreSQL its WAL position): what its
/// `position` command printed, as a decimal number or as an LSN
/// (`16/B374D848`, two hexadecimal halves).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position(pub u64);

/// A `position` command's output that is not a position.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a position (a decimal number, or an LSN such as 16/B374D848): {0:?}")]
pub struct BadPosition(pub String);

impl FromStr for Position {
    type Err = BadPosition;

    fn from_str(text: &str) -> Result<Position, BadPosition> {
        let trimmed = text.trim();
        let bad = || BadPosition(trimmed.chars().take(64).collect());
        match trimmed.split_once('/') {
            Some((high, low)) if (1..=8).contains(&high.len()) && (1..=8).contains(&low.len()) => {
                let high = u64::from_str_radix(high, 16).map_err(|_| bad())?;
                let low = u64::from_str_radix(low, 16).map_err(|_| bad())?;
                Ok(Position(high << 32 | low))
            }
            Some(_) => Err(bad()),
            None if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) => {
                trimmed.parse().map(Position).map_err(|_| bad())
            }
            None => Err(bad()),
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// A member of the role, as the granting side sees it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contender {
    pub member: String,
    /// The run its node reports (None: not running, or its node is not
    /// Ready or not heard from lately, so nothing it last said is current).
    pub instance: Option<String>,
    /// Its readiness check passes.
    pub ready: bool,
    /// It is in config error: it leads nothing.
    pub config_error: bool,
    /// What its `position` command last printed (None: no command, or no
    /// answer yet).
    pub position: Option<Position>,
    /// The leader reports it a synchronous replica: it has every
    /// acknowledged commit.
    pub in_sync: bool,
    /// An unsettled Command holds it: it keeps a lease it has, but is
    /// granted none now (its promote would run beside that Command).
    pub busy: bool,
    /// Its promote hook failed in the lease's term: its lease is not
    /// renewed, and the next term goes to another member if one may lead
    /// (to it again only when none may).
    pub promote_failed: bool,
    /// It stood down in the lease's term (its agent fenced it, or it
    /// was demoted for a handover): it does not lead now, and a lease of
    /// its in that term ends at once.
    pub demoted: bool,
}

/// Everything a decision on one role's lease is made from.
#[derive(Clone, Debug)]
pub struct RoleView<'a> {
    pub lease: &'a RoleLease,
    /// Since the granting side last saw the lease renewed (or first read it).
    pub since_renewed: Duration,
    pub contenders: &'a [Contender],
    /// Only the last holder or a member in sync may be granted the next term.
    pub synchronous: bool,
    pub times: LeaseTimes,
    /// The member a switchover asks for: granted the next term when it
    /// may lead, before any more advanced one.
    pub preferred: Option<&'a str>,
}

/// What to do with a role's lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The holder runs and is ready: renew its lease (for the run it is
    /// now: a member restarted in place within its lease keeps it). Its
    /// lease runs for `remaining` yet unless a renewal comes first.
    Renew { instance: String, remaining: Duration },
    /// The holder does not renew; its lease runs for `remaining` yet, and
    /// no one else may lead before.
    Wait { remaining: Duration, why: String },
    /// The next term, for this member's run.
    Grant { holder: Holder, term: u64, why: String },
    /// No member may lead; the role has no leader until one may.
    Leaderless { why: String },
}

const BUSY: &str = "busy with a Command";

/// Why a contender may not be granted a new term (None: it may). With
/// `synchronous`, a member must be in sync, or be the last holder (who
/// had every acknowledged write).
pub fn not_eligible(contender: &Contender, last_holder: Option<&str>, synchronous: bool) -> Option<&'static str> {
    if contender.config_error {
        Some("in config error")
    } else if contender.instance.is_none() {
        Some("not running, or its node is not heard from")
    } else if !contender.ready {
        Some("not ready")
    } else if contender.busy {
        Some(BUSY)
    } else if synchronous && !contender.in_sync && last_holder != Some(contender.member.as_str()) {
        Some("not a synchronous replica")
    } else {
        None
    }
}

/// The decision for one role's lease, the first rule that applies:
///
/// | # | when | decision |
/// |---|---|---|
/// | 1 | the holder's member runs and is ready, its lease not expired | renew (for its current run: one restarted in place keeps it) |
/// | 2 | a holder that has not stood down, and its lease not expired | wait for the expiry |
/// | 3 | no member may lead | leaderless, saying why for each |
/// | 4 | otherwise | the next term to the member a switchover asks for if it may lead, else to the most advanced member that may lead (the last holder, then the lowest name, on a tie) |
///
/// An expired lease is never renewed: its holder has fenced itself, and
/// comes back only with a new term. With `synchronous`, the first term
/// may go to any member (nothing was acknowledged before it). A holder that stood down (its agent
/// says so: fenced, or demoted for a handover) ends its lease at once. With `synchronous`, a new term goes
/// only to a member in sync or to the last holder: a replica that is
/// behind is never promoted.
pub fn decide(view: &RoleView<'_>) -> Decision {
    let holder = view.lease.holder.as_ref();
    let lease_duration = view.times.lease_duration.get();
    let live = view.since_renewed < lease_duration;
    let holding = holder.and_then(|h| view.contenders.iter().find(|c| c.member == h.member));
    let stood_down = holding.is_some_and(|c| c.demoted);
    let live = live && !stood_down;
    let remaining = lease_duration.saturating_sub(view.since_renewed);
    if live
        && let Some(contender) = holding
        && let Some(instance) = &contender.instance
        && contender.ready
        && !contender.config_error
        && !contender.promote_failed
        && !contender.demoted
    {
        return Decision::Renew { instance: instance.clone(), remaining };
    }
    if let Some(holder) = holder
        && live
    {
        let state = match holding {
            None => "is no member of the role any more".to_string(),
            Some(contender) => not_eligible(contender, None, false).unwrap_or("not renewing").to_string(),
        };
        // The reason names no countdown: it is kept in the cluster's
        // status and told in an Event when it changes, so it must not
        // change while nothing but time passes.
        let why = format!(
            "leader {} (term {}) {state}; waiting for its lease to run out ({} unrenewed)",
            holder.member,
            view.lease.term,
            HumanDuration(lease_duration)
        );
        return Decision::Wait { remaining, why };
    }
    let last = holder.map(|h| h.member.as_str());
    // Before the first term nothing was acknowledged: any member may lead.
    let synchronous = view.synchronous && view.lease.term > 0;
    let (eligible, refused): (Vec<&Contender>, Vec<&Contender>) =
        view.contenders.iter().partition(|c| not_eligible(c, last, synchronous).is_none());
    let preferred = eligible.iter().find(|c| Some(c.member.as_str()) == view.preferred).copied();
    // The member a switchover asks for, busy a moment (its configmeta
    // being written): waited for, not passed over.
    let asked_busy = refused
        .iter()
        .find(|c| Some(c.member.as_str()) == view.preferred && not_eligible(c, last, synchronous) == Some(BUSY));
    if let Some(asked) = asked_busy {
        let why = format!("waiting for {}, asked for by a switchover: {BUSY}", asked.member);
        return Decision::Leaderless { why };
    }
    // A last holder that stood down, or whose promote failed, leads again
    // only when no other may (with `synchronous`, it may be the only one
    // with every write): a failed promote is tried again a lease later.
    let stood_down_again = |c: &Contender| (c.demoted || c.promote_failed) && Some(c.member.as_str()) == last;
    let advanced = eligible
        .into_iter()
        .min_by_key(|c| (stood_down_again(c), Reverse(c.position), Some(c.member.as_str()) != last, &c.member));
    // Back to a last holder that stood down (or failed its promote) only
    // when no other member may lead for a lasting reason: one busy a
    // moment is waited for.
    if preferred.is_none()
        && advanced.is_some_and(stood_down_again)
        && let Some(busy) =
            refused.iter().find(|c| Some(c.member.as_str()) != last && not_eligible(c, last, synchronous) == Some(BUSY))
    {
        let why = format!("waiting for {}: {BUSY}", busy.member);
        return Decision::Leaderless { why };
    }
    let Some(chosen) = preferred.or(advanced) else {
        let reasons: Vec<String> = refused
            .iter()
            .map(|c| format!("{} {}", c.member, not_eligible(c, last, synchronous).unwrap_or("")))
            .collect();
        let why = match reasons.is_empty() {
            true => "the role has no members".to_string(),
            false => format!("no member may lead: {}", reasons.join("; ")),
        };
        return Decision::Leaderless { why };
    };
    let instance = chosen.instance.clone().unwrap_or_default();
    let position = chosen.position.map(|p| format!(" at {p}")).unwrap_or_default();
    let before = match holder {
        Some(h) if stood_down => format!("{} stood down (term {})", h.member, view.lease.term),
        Some(h) => format!("the lease of {} (term {}) expired", h.member, view.lease.term),
        None => "no member leads".to_string(),
    };
    let how = match preferred {
        Some(_) => "was asked for by a switchover and may lead",
        None => "is the most advanced member that may lead",
    };
    let why = format!("{before}; {} {how}{position}", chosen.member);
    Decision::Grant { holder: Holder { member: chosen.member.clone(), instance }, term: view.lease.term + 1, why }
}

/// When, on the holder's side's monotonic clock, it must have fenced
/// itself: `renewDeadline` after it sent the report that the last
/// renewal answered.
pub fn fence_at(report_sent: Duration, times: &LeaseTimes) -> Duration {
    report_sent + times.renew_deadline.get()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TIMES: LeaseTimes = LeaseTimes {
        lease_duration: HumanDuration(Duration::from_secs(10)),
        renew_deadline: HumanDuration(Duration::from_secs(7)),
        retry_period: HumanDuration(Duration::from_secs(2)),
    };

    fn contender(member: &str, position: u64) -> Contender {
        Contender {
            member: member.into(),
            instance: Some(format!("{member}-run")),
            ready: true,
            config_error: false,
            position: Some(Position(position)),
            in_sync: false,
            busy: false,
            promote_failed: false,
            demoted: false,
        }
    }

    fn held_by(member: &str, term: u64) -> RoleLease {
        RoleLease { holder: Some(Holder { member: member.into(), instance: format!("{member}-run") }), term }
    }

    fn view<'a>(lease: &'a RoleLease, since: u64, contenders: &'a [Contender]) -> RoleView<'a> {
        RoleView {
            lease,
            since_renewed: Duration::from_secs(since),
            contenders,
            synchronous: false,
            times: TIMES,
            preferred: None,
        }
    }

    #[test]
    fn positions_are_numbers_or_lsns_and_print_as_lsns() {
        assert_eq!("42".parse(), Ok(Position(42)));
        assert_eq!(" 16/B374D848\n".parse(), Ok(Position(0x16_B374_D848)));
        assert_eq!(Position(0x16_B374_D848).to_string(), "16/B374D848");
        assert!(Position(0x1_0000_0000) > Position(0xFFFF_FFFF), "the high half counts first");
        for bad in ["", "-1", "0x10", "1/", "/1", "G/0", "123456789/0", "1/2/3", "1.5"] {
            assert!(bad.parse::<Position>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn row1_a_running_ready_holder_is_renewed_for_its_current_run() {
        let lease = held_by("a", 3);
        let mut members = [contender("a", 5), contender("b", 9)];
        assert_eq!(
            decide(&view(&lease, 4, &members)),
            Decision::Renew { instance: "a-run".into(), remaining: Duration::from_secs(6) }
        );
        // Restarted in place, back within its lease: it keeps it.
        members[0].instance = Some("a-second-run".into());
        assert_eq!(
            decide(&view(&lease, 9, &members)),
            Decision::Renew { instance: "a-second-run".into(), remaining: Duration::from_secs(1) }
        );
        // Back after its lease expired: not renewed (it has fenced itself);
        // the next term, to the most advanced.
        let Decision::Grant { holder, term, .. } = decide(&view(&lease, 10, &members)) else { panic!("grants") };
        assert_eq!((holder.member.as_str(), term), ("b", 4));
    }

    #[test]
    fn row2_a_holder_that_does_not_renew_keeps_its_lease_until_it_expires() {
        let lease = held_by("a", 3);
        let mut members = [contender("a", 5), contender("b", 9)];
        members[0].instance = None;
        let Decision::Wait { remaining, why } = decide(&view(&lease, 4, &members)) else { panic!("waits") };
        assert_eq!(remaining, Duration::from_secs(6));
        assert_eq!(
            why,
            "leader a (term 3) not running, or its node is not heard from; waiting for its lease to run out (10s unrenewed)"
        );
        let Decision::Wait { why: later, .. } = decide(&view(&lease, 5, &members)) else { panic!("waits") };
        assert_eq!(later, why, "the same reason while only time passes");
        members[0].instance = Some("a-run".into());
        members[0].ready = false;
        assert!(matches!(decide(&view(&lease, 9, &members)), Decision::Wait { .. }), "not ready: no renewal");
        let gone = [contender("b", 9)];
        let Decision::Wait { why, .. } = decide(&view(&lease, 1, &gone)) else { panic!("waits") };
        assert!(why.contains("is no member of the role any more"), "{why}");
    }

    #[test]
    fn row3_no_member_that_may_lead_leaves_the_role_leaderless_saying_why() {
        let lease = held_by("a", 3);
        let mut members = [contender("a", 5), contender("b", 9), contender("c", 1)];
        members[0].instance = None;
        members[1].ready = false;
        members[2].config_error = true;
        let Decision::Leaderless { why } = decide(&view(&lease, 10, &members)) else { panic!("leaderless") };
        assert_eq!(
            why,
            "no member may lead: a not running, or its node is not heard from; b not ready; c in config error"
        );
        let none = RoleLease::default();
        assert_eq!(decide(&view(&none, 0, &[])), Decision::Leaderless { why: "the role has no members".into() });
    }

    #[test]
    fn row3_synchronous_grants_a_new_term_only_to_a_replica_in_sync() {
        let lease = held_by("a", 3);
        let synchronous = |members: &[Contender]| decide(&RoleView { synchronous: true, ..view(&lease, 10, members) });
        let mut members = [contender("a", 5), contender("b", 9)];
        members[0].instance = None;
        let Decision::Leaderless { why } = synchronous(&members) else { panic!("no stale promotion") };
        assert!(why.contains("b not a synchronous replica"), "{why}");
        let mut in_sync = members.clone();
        in_sync[1].in_sync = true;
        assert!(matches!(synchronous(&in_sync), Decision::Grant { term: 4, .. }));
        // The holder back after its lease ended, no one granted meanwhile:
        // it had every acknowledged write, and leads again in a new term.
        members[0].instance = Some("a-second-run".into());
        let Decision::Grant { holder, term, .. } = synchronous(&members) else { panic!("grants") };
        assert_eq!((holder.member.as_str(), holder.instance.as_str(), term), ("a", "a-second-run", 4));
    }

    #[test]
    fn row4_a_holder_whose_promote_failed_is_tried_again_a_lease_later_only_when_no_other_may_lead() {
        let lease = held_by("a", 3);
        let mut members = [contender("a", 9), contender("b", 7)];
        members[0].promote_failed = true;
        assert!(matches!(decide(&view(&lease, 4, &members)), Decision::Wait { .. }), "not renewed; waits");
        let Decision::Grant { holder, .. } = decide(&view(&lease, 10, &members)) else { panic!("grants") };
        assert_eq!(holder.member, "b", "another member first");
        // b busy a moment: waited for, not a again.
        members[1].busy = true;
        let Decision::Leaderless { why } = decide(&view(&lease, 10, &members)) else { panic!("waits for b") };
        assert_eq!(why, "waiting for b: busy with a Command");
        members[1].busy = false;
        // Synchronous, b not in sync: a (the last holder, every write on it) again.
        let v = RoleView { synchronous: true, ..view(&lease, 10, &members) };
        let Decision::Grant { holder, term, .. } = decide(&v) else { panic!("grants") };
        assert_eq!((holder.member.as_str(), term), ("a", 4));
    }

    #[test]
    fn row4_synchronous_may_grant_the_first_term_to_any_member() {
        let none = RoleLease::default();
        let members = [contender("a", 5), contender("b", 9)];
        let v = RoleView { synchronous: true, ..view(&none, 0, &members) };
        let Decision::Grant { holder, term, .. } = decide(&v) else { panic!("nothing acknowledged yet: grants") };
        assert_eq!((holder.member.as_str(), term), ("b", 1));
    }

    #[test]
    fn row4_the_next_term_goes_to_the_most_advanced_member_that_may_lead() {
        let lease = held_by("a", 3);
        let mut members = [contender("a", 5), contender("b", 7), contender("c", 9)];
        members[0].instance = None;
        members[2].ready = false;
        let Decision::Grant { holder, term, why } = decide(&view(&lease, 10, &members)) else { panic!("grants") };
        assert_eq!((holder.member.as_str(), holder.instance.as_str(), term), ("b", "b-run", 4));
        assert_eq!(why, "the lease of a (term 3) expired; b is the most advanced member that may lead at 0/7");
        // A tie: the last holder, then by name.
        let tie = [contender("c", 7), contender("b", 7), contender("d", 3)];
        let lapsed = RoleLease { holder: None, term: 3 };
        let Decision::Grant { holder, .. } = decide(&view(&lapsed, 0, &tie)) else { panic!("grants") };
        assert_eq!(holder.member, "b");
        let Decision::Grant { holder, .. } = decide(&view(&held_by("c", 3), 10, &tie)) else { panic!("grants") };
        assert_eq!(holder.member, "c");
        // No position at all: by name.
        let mut unknown = [contender("c", 0), contender("b", 0)];
        unknown.iter_mut().for_each(|c| c.position = None);
        let none = RoleLease::default();
        let Decision::Grant { holder, term, .. } = decide(&view(&none, 0, &unknown)) else { panic!("grants") };
        assert_eq!((holder.member.as_str(), term), ("b", 1));
    }

    #[test]
    fn a_holder_that_stood_down_ends_its_lease_at_once_and_a_switchover_names_the_next() {
        let lease = held_by("a", 3);
        let mut members = [contender("a", 9), contender("b", 7), contender("c", 8)];
        members[0].demoted = true;
        let mut v = view(&lease, 1, &members);
        let Decision::Grant { holder, term, why } = decide(&v) else { panic!("grants at once") };
        assert_eq!((holder.member.as_str(), term), ("c", 4), "the most advanced of the others");
        assert_eq!(why, "a stood down (term 3); c is the most advanced member that may lead at 0/8");
        v.preferred = Some("b");
        let Decision::Grant { holder, why, .. } = decide(&v) else { panic!("grants at once") };
        assert_eq!(holder.member, "b");
        assert_eq!(why, "a stood down (term 3); b was asked for by a switchover and may lead at 0/7");
        // One asked for that is busy a moment: waited for.
        members[1].busy = true;
        let v = RoleView { preferred: Some("b"), ..view(&lease, 1, &members) };
        let Decision::Leaderless { why } = decide(&v) else { panic!("waits for b") };
        assert_eq!(why, "waiting for b, asked for by a switchover: busy with a Command");
        members[1].busy = false;
        // One asked for that may not lead: the most advanced instead.
        members[1].ready = false;
        let v = RoleView { preferred: Some("b"), ..view(&lease, 1, &members) };
        let Decision::Grant { holder, .. } = decide(&v) else { panic!("grants") };
        assert_eq!(holder.member, "c");
    }

    #[test]
    fn lease_times_keep_the_control_planes_rules() {
        assert!(TIMES.breaches().is_empty());
        let tight = LeaseTimes { lease_duration: HumanDuration::from_secs(8), ..TIMES };
        let fields: Vec<&str> = tight.breaches().iter().map(|b| b.field).collect();
        assert_eq!(fields, ["leaseDuration"], "at least renewDeadline + retryPeriod");
    }

    fn contenders() -> impl Strategy<Value = Vec<Contender>> {
        let one = (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(0u64..4),
            any::<bool>(),
            any::<bool>(),
            (any::<bool>(), any::<bool>()),
        );
        proptest::collection::vec(one, 0..5).prop_map(|members| {
            members
                .into_iter()
                .enumerate()
                .map(|(i, (running, ready, config_error, position, in_sync, busy, (promote_failed, demoted)))| {
                    Contender {
                        member: format!("m{i}"),
                        instance: running.then(|| format!("m{i}-run")),
                        ready,
                        config_error,
                        position: position.map(Position),
                        in_sync,
                        busy,
                        promote_failed,
                        demoted,
                    }
                })
                .collect()
        })
    }

    proptest! {
        /// The term only rises, by one a grant; no grant while a holder's
        /// lease runs; only an eligible member is granted, the most
        /// advanced of them; a holder renewed is the holder.
        #[test]
        fn grants_keep_the_rules(
            members in contenders(),
            holder in proptest::option::of(0usize..6),
            term in 0u64..100,
            since in 0u64..20,
            synchronous in any::<bool>(),
            preferred in proptest::option::of(0usize..6),
        ) {
            let lease = RoleLease {
                holder: holder.map(|i| Holder { member: format!("m{i}"), instance: format!("m{i}-run") }),
                term,
            };
            let preferred = preferred.map(|i| format!("m{i}"));
            let mut v = view(&lease, since, &members);
            v.synchronous = synchronous;
            v.preferred = preferred.as_deref();
            let synchronous = synchronous && term > 0;
            let last = lease.holder.as_ref().map(|h| h.member.as_str());
            let holding = last.and_then(|h| members.iter().find(|c| c.member == h));
            let stood_down = holding.is_some_and(|c| c.demoted);
            match decide(&v) {
                Decision::Renew { instance, remaining } => {
                    prop_assert!(Duration::from_secs(since) < TIMES.lease_duration.get(), "an expired lease is never renewed");
                    prop_assert_eq!(remaining + Duration::from_secs(since), TIMES.lease_duration.get());
                    let held = lease.holder.as_ref().expect("only a holder is renewed");
                    let member = members.iter().find(|c| c.member == held.member).expect("a member");
                    prop_assert_eq!(member.instance.as_deref(), Some(instance.as_str()));
                    prop_assert!(member.ready && !member.config_error && !member.promote_failed && !member.demoted);
                }
                Decision::Wait { remaining, .. } => {
                    prop_assert!(lease.holder.is_some() && !stood_down);
                    prop_assert_eq!(remaining + Duration::from_secs(since), TIMES.lease_duration.get());
                }
                Decision::Grant { holder: granted, term: next, .. } => {
                    prop_assert_eq!(next, term + 1);
                    prop_assert!(
                        lease.holder.is_none() || stood_down || Duration::from_secs(since) >= TIMES.lease_duration.get(),
                        "no grant while a holder that did not stand down holds its lease"
                    );
                    let others = members.iter().any(|c| Some(c.member.as_str()) != last && not_eligible(c, last, synchronous).is_none());
                    prop_assert!(
                        !stood_down || Some(granted.member.as_str()) != last || !others,
                        "one that stood down is granted again only when no other may lead"
                    );
                    let chosen = members.iter().find(|c| c.member == granted.member).expect("a member");
                    prop_assert_eq!(not_eligible(chosen, last, synchronous), None);
                    prop_assert!(!synchronous || chosen.in_sync || Some(chosen.member.as_str()) == last, "no stale replica promoted");
                    let eligible = |c: &&Contender| not_eligible(c, last, synchronous).is_none();
                    let asked = members.iter().filter(eligible).find(|c| Some(c.member.as_str()) == preferred.as_deref());
                    match asked {
                        Some(asked) => prop_assert_eq!(&asked.member, &chosen.member, "the member asked for, when it may lead"),
                        None => {
                            let again =
                                |c: &&Contender| (c.demoted || c.promote_failed) && Some(c.member.as_str()) == last;
                            let fresh: Vec<&Contender> = members.iter().filter(eligible).filter(|c| !again(c)).collect();
                            let best = match fresh.is_empty() {
                                true => Some(chosen.position),
                                false => fresh.iter().map(|c| c.position).max(),
                            };
                            prop_assert_eq!(Some(chosen.position), best);
                        }
                    }
                }
                Decision::Leaderless { .. } => {
                    let asked_busy = members.iter().any(|c| {
                        Some(c.member.as_str()) == preferred.as_deref() && not_eligible(c, last, synchronous) == Some(BUSY)
                    });
                    let again = |c: &Contender| (c.demoted || c.promote_failed) && Some(c.member.as_str()) == last;
                    let fresh_eligible = members.iter().filter(|c| !again(c)).any(|c| not_eligible(c, last, synchronous).is_none());
                    let other_busy = members.iter().any(|c| Some(c.member.as_str()) != last && not_eligible(c, last, synchronous) == Some(BUSY));
                    prop_assert!(
                        asked_busy || (other_busy && !fresh_eligible) || members.iter().all(|c| not_eligible(c, last, synchronous).is_some())
                    );
                }
            }
        }

        /// The holder's side has fenced at least a retry period before
        /// the granting side may grant the next term, whenever its report
        /// went out before the renewal it answered was seen.
        #[test]
        fn the_holder_fences_before_the_next_term_can_be_granted(
            sent in 0u64..1_000_000,
            seen_after in 0u64..5_000,
            lease_s in 1u64..120,
            renew_ms in 1u64..120,
            retry_ms in 1u64..60,
        ) {
            let times = LeaseTimes {
                lease_duration: HumanDuration(Duration::from_secs(lease_s)),
                renew_deadline: HumanDuration(Duration::from_millis(renew_ms * 250)),
                retry_period: HumanDuration(Duration::from_millis(retry_ms * 100)),
            };
            prop_assume!(times.breaches().is_empty());
            let sent = Duration::from_millis(sent);
            let renewal_seen = sent + Duration::from_millis(seen_after);
            let grantable = renewal_seen + times.lease_duration.get();
            prop_assert!(fence_at(sent, &times) + times.retry_period.get() <= grantable);
        }
    }
}
