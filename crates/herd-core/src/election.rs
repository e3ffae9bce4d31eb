//! Lease-based leader election: what a candidate does with the Lease it
//! sees (client-go semantics).
//!
//! Expiry is judged on the candidate's own monotonic clock, from the moment
//! it last saw the record change, with the record's own duration. A
//! replica's wall clock is only written into the record (acquire and renew
//! times, for people to read); it never decides anything, so clock skew
//! between hosts cannot make a replica take a valid lease early or wait
//! past a real expiry (fabric8 compared a remote timestamp with the local
//! clock, and once used its own duration instead of the record's).
//!
//! Monotonic times are `Duration`s since an origin the caller picks (its
//! process start, say); only differences between them matter.

use std::time::Duration;

use crate::kinds::LeaseSpec;
use crate::time::Timestamp;

/// The time now, as the caller's two clocks tell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    pub monotonic: Duration,
    pub wall: Timestamp,
}

/// The Lease as this candidate last read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub record: LeaseSpec,
    /// The store revision it was read at: the write's compare.
    pub revision: u64,
    /// When, on this candidate's monotonic clock, the record was last seen
    /// to change (a renewal changes it).
    pub changed_at: Duration,
    /// The store says the holder's process is gone (its liveness token is
    /// dead): the lease may be taken before it expires. Only a speed-up:
    /// safety rests on fencing.
    pub holder_dead: bool,
}

/// Who campaigns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub identity: String,
    /// This process's liveness token, written into the lease while held.
    pub liveness: Option<String>,
    /// It leads now: it acquired the lease in this run of its campaign and
    /// has not stepped down since. Only a leader renews.
    pub leading: bool,
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody created the lease yet: create it, holding it.
    Create(LeaseSpec),
    /// Write `record` if the lease is still at `revision`: a renewal when
    /// this candidate holds it, an acquisition otherwise. Whoever writes
    /// first wins; the others see a conflict.
    Write { record: LeaseSpec, revision: u64, acquiring: bool },
    /// Another candidate holds a valid lease until `expires_at` (monotonic),
    /// unless the record changes before.
    Follow { holder: String, expires_at: Duration },
}

fn seconds(duration: Duration) -> u32 {
    u32::try_from(duration.as_secs()).unwrap_or(u32::MAX).max(1)
}

/// When a held lease, last seen changing at `changed_at`, expires on this
/// candidate's clock: with the record's own duration, never ours.
pub fn expires_at(observed: &Observed) -> Duration {
    observed.changed_at + Duration::from_secs(u64::from(observed.record.lease_duration_seconds))
}

/// The candidate `me`'s move, given the lease it last saw (None: absent).
pub fn decide(me: &Candidate, observed: Option<&Observed>, now: Now, lease_duration: Duration) -> Decision {
    let held = |record: &LeaseSpec| LeaseSpec {
        holder_identity: me.identity.clone(),
        lease_duration_seconds: seconds(lease_duration),
        holder_liveness: me.liveness.clone(),
        ..record.clone()
    };
    let Some(observed) = observed else {
        return Decision::Create(LeaseSpec {
            acquire_time: Some(now.wall),
            renew_time: Some(now.wall),
            lease_transitions: 0,
            ..held(&LeaseSpec::default())
        });
    };
    let record = &observed.record;
    // A lease that names this candidate but that it does not lead under
    // (it stepped down, or an earlier process of the same name held it) is
    // not renewed: renewing it would keep everyone else out of a lease
    // nobody leads under. It is waited out, or taken anew once its holder
    // is known dead, with a new term, like anyone else's.
    if record.holder_identity == me.identity && me.leading {
        let renewed = LeaseSpec { renew_time: Some(now.wall), ..held(record) };
        return Decision::Write { record: renewed, revision: observed.revision, acquiring: false };
    }
    let expires = expires_at(observed);
    if !record.holder_identity.is_empty() && now.monotonic < expires && !observed.holder_dead {
        return Decision::Follow { holder: record.holder_identity.clone(), expires_at: expires };
    }
    // Released (no holder), expired, or its holder died: take it.
    let acquired = LeaseSpec {
        acquire_time: Some(now.wall),
        renew_time: Some(now.wall),
        lease_transitions: record.lease_transitions + 1,
        ..held(record)
    };
    Decision::Write { record: acquired, revision: observed.revision, acquiring: true }
}

/// The record a leader writes when it lets go (graceful shutdown): no
/// holder and a 1s duration, so that a standby takes it at once; the
/// transition count is kept.
pub fn release(record: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: String::new(),
        lease_duration_seconds: 1,
        acquire_time: Some(now),
        renew_time: Some(now),
        lease_transitions: record.lease_transitions,
        holder_liveness: None,
    }
}

/// A leader that has not renewed successfully for longer than the renew
/// deadline stops all leader-only work and steps down.
pub fn must_step_down(last_renewed: Duration, now: Duration, renew_deadline: Duration) -> bool {
    now.saturating_sub(last_renewed) > renew_deadline
}

/// A replica that believes it leads but has not renewed for longer than
/// the lease duration is unhealthy (the client-go watchdog): another
/// replica may already lead.
pub fn leadership_stale(last_renewed: Duration, now: Duration, lease_duration: Duration) -> bool {
    now.saturating_sub(last_renewed) > lease_duration
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LEASE: Duration = Duration::from_secs(15);

    fn wall(secs: u64) -> Timestamp {
        Timestamp::from_system_time(std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs))
    }

    fn now(mono: u64) -> Now {
        Now { monotonic: Duration::from_secs(mono), wall: wall(mono) }
    }

    fn observed(holder: &str, duration: u32, changed_at: u64, transitions: u64) -> Observed {
        Observed {
            record: LeaseSpec {
                holder_identity: holder.into(),
                lease_duration_seconds: duration,
                acquire_time: Some(wall(0)),
                renew_time: Some(wall(changed_at)),
                lease_transitions: transitions,
                holder_liveness: Some(format!("token-of-{holder}")),
            },
            revision: 7,
            changed_at: Duration::from_secs(changed_at),
            holder_dead: false,
        }
    }

    fn me(identity: &str) -> Candidate {
        Candidate { identity: identity.into(), liveness: Some(format!("token-of-{identity}")), leading: false }
    }

    fn leader(identity: &str) -> Candidate {
        Candidate { leading: true, ..me(identity) }
    }

    #[test]
    fn an_absent_lease_is_created_held_with_no_transitions() {
        let Decision::Create(record) = decide(&me("a"), None, now(5), LEASE) else { panic!("expected Create") };
        assert_eq!(record.holder_identity, "a");
        assert_eq!(record.lease_duration_seconds, 15);
        assert_eq!((record.acquire_time, record.renew_time), (Some(wall(5)), Some(wall(5))));
        assert_eq!(record.lease_transitions, 0);
    }

    #[test]
    fn the_holder_renews_keeping_acquire_time_and_transitions() {
        let decision = decide(&leader("a"), Some(&observed("a", 15, 10, 3)), now(12), LEASE);
        let Decision::Write { record, revision, acquiring } = decision else { panic!("expected Write") };
        assert!(!acquiring);
        assert_eq!(revision, 7, "the write compares the revision it read");
        assert_eq!((record.acquire_time, record.renew_time), (Some(wall(0)), Some(wall(12))));
        assert_eq!(record.lease_transitions, 3);
    }

    #[test]
    fn a_replica_that_stepped_down_does_not_renew_its_own_lease_but_takes_it_anew_once_expired() {
        // The lease still names "a", but "a" no longer leads under it.
        let decision = decide(&me("a"), Some(&observed("a", 15, 10, 3)), now(12), LEASE);
        assert_eq!(decision, Decision::Follow { holder: "a".into(), expires_at: Duration::from_secs(25) });
        let Decision::Write { record, acquiring, .. } =
            decide(&me("a"), Some(&observed("a", 15, 10, 3)), now(25), LEASE)
        else {
            panic!("expected Write")
        };
        assert!(acquiring, "taken anew: a new term and a new fence");
        assert_eq!(record.lease_transitions, 4);
        // An earlier process of the same name that is known dead: at once.
        let dead = Observed { holder_dead: true, ..observed("a", 15, 10, 3) };
        assert!(matches!(decide(&me("a"), Some(&dead), now(11), LEASE), Decision::Write { acquiring: true, .. }));
    }

    #[test]
    fn a_valid_lease_of_another_is_followed_until_it_expires() {
        let decision = decide(&me("b"), Some(&observed("a", 15, 10, 3)), now(24), LEASE);
        assert_eq!(decision, Decision::Follow { holder: "a".into(), expires_at: Duration::from_secs(25) });
    }

    #[test]
    fn an_expired_lease_is_taken_with_one_more_transition() {
        let Decision::Write { record, acquiring, .. } =
            decide(&me("b"), Some(&observed("a", 15, 10, 3)), now(25), LEASE)
        else {
            panic!("expected Write")
        };
        assert!(acquiring);
        assert_eq!(record.holder_identity, "b");
        assert_eq!((record.acquire_time, record.lease_transitions), (Some(wall(25)), 4));
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        let released =
            Observed { record: release(&observed("a", 15, 10, 3).record, wall(11)), ..observed("", 1, 11, 3) };
        let decision = decide(&me("b"), Some(&released), now(11), LEASE);
        let Decision::Write { record, acquiring, .. } = decision else { panic!("expected Write") };
        assert!(acquiring && record.holder_identity == "b" && record.lease_transitions == 4);
        assert_eq!(record.lease_duration_seconds, 15, "the new holder writes its own duration");
    }

    #[test]
    fn expiry_uses_the_records_duration_not_ours() {
        // The record says 60s; our setting is 15s: 20s of silence is not expiry.
        let decision = decide(&me("b"), Some(&observed("a", 60, 10, 0)), now(30), LEASE);
        assert!(matches!(decision, Decision::Follow { .. }), "{decision:?}");
    }

    #[test]
    fn a_lease_whose_holder_died_is_taken_before_it_expires() {
        let dead = Observed { holder_dead: true, ..observed("a", 15, 10, 3) };
        let Decision::Write { record, acquiring, .. } = decide(&me("b"), Some(&dead), now(11), LEASE) else {
            panic!("expected Write")
        };
        assert!(acquiring);
        assert_eq!(record.holder_liveness.as_deref(), Some("token-of-b"), "the new holder writes its own token");
        assert_eq!(record.lease_transitions, 4);
    }

    #[test]
    fn release_empties_the_holder_keeps_transitions() {
        let released = release(&observed("a", 15, 10, 3).record, wall(20));
        assert_eq!(released.holder_identity, "");
        assert_eq!(released.lease_duration_seconds, 1);
        assert_eq!((released.acquire_time, released.renew_time), (Some(wall(20)), Some(wall(20))));
        assert_eq!(released.lease_transitions, 3);
        assert_eq!(released.holder_liveness, None);
    }

    #[test]
    fn step_down_and_staleness_rules() {
        let s = Duration::from_secs;
        assert!(!must_step_down(s(100), s(110), s(10)));
        assert!(must_step_down(s(100), s(111), s(10)));
        assert!(!leadership_stale(s(100), s(115), s(15)));
        assert!(leadership_stale(s(100), s(116), s(15)));
    }

    proptest! {
        /// Only a leader renews: whatever a non-leading candidate sees, it
        /// never writes the lease as its holder without acquiring it.
        #[test]
        fn a_candidate_that_does_not_lead_never_renews(
            holder in prop_oneof![Just(""), Just("a"), Just("b")],
            duration in 1u32..120,
            changed_at in 0u64..1000,
            elapsed in 0u64..300,
            dead: bool,
        ) {
            let seen = Observed { holder_dead: dead, ..observed(holder, duration, changed_at, 2) };
            let decision = decide(&me("b"), Some(&seen), now(changed_at + elapsed), LEASE);
            prop_assert!(!matches!(decision, Decision::Write { acquiring: false, .. }), "{:?}", decision);
        }

        /// A wall clock off by up to an hour either way changes nothing but
        /// the timestamps written: the same candidate follows, renews or
        /// takes the lease at the same monotonic moments.
        #[test]
        fn wall_clock_skew_changes_no_decision(
            holder in prop_oneof![Just(""), Just("a"), Just("b")],
            duration in 1u32..120,
            changed_at in 0u64..1000,
            elapsed in 0u64..300,
            skew in -3600i64..3600,
        ) {
            let seen = observed(holder, duration, changed_at, 2);
            let mono = changed_at + elapsed;
            let true_now = now(mono);
            let skewed_wall = Timestamp::from_system_time(if skew >= 0 {
                true_now.wall.system_time() + Duration::from_secs(skew as u64)
            } else {
                true_now.wall.system_time() - Duration::from_secs(skew.unsigned_abs())
            });
            let skewed_now = Now { monotonic: true_now.monotonic, wall: skewed_wall };
            let kind = |d: Decision| match d {
                Decision::Create(_) => "create".to_string(),
                Decision::Write { acquiring, revision, .. } => format!("write {acquiring} {revision}"),
                Decision::Follow { holder, expires_at } => format!("follow {holder} {expires_at:?}"),
            };
            prop_assert_eq!(kind(decide(&me("b"), Some(&seen), true_now, LEASE)), kind(decide(&me("b"), Some(&seen), skewed_now, LEASE)));
            // And a held lease is taken exactly when the record's own duration
            // has passed since it was last seen to change.
            let taken = matches!(decide(&me("b"), Some(&seen), skewed_now, LEASE), Decision::Write { acquiring: true, .. });
            prop_assert_eq!(taken, holder.is_empty() || elapsed >= u64::from(duration));
        }
    }
}
