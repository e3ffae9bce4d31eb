//! The soak's faults, drawn from a seed: the same seed gives the same
//! schedule (which fault, on what, when, for how long), so a run that
//! found a violation is replayed by its printed seed. The PRNG is
//! SplitMix64, written out here so that no dependency's version changes
//! a schedule.

use std::fmt;
use std::time::Duration;

/// Something the soak does to the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// kill -9 of a member's process.
    KillMember,
    /// SIGSTOP of a member's process, SIGCONT after the fault's length.
    PauseMember,
    /// kill -9 of an agent (its members run on).
    KillAgent,
    /// SIGSTOP of an agent, SIGCONT after.
    PauseAgent,
    /// kill -9 of a server replica, started again after.
    KillServer,
    /// SIGSTOP of a server replica, SIGCONT after.
    PauseServer,
    /// A host's agent and members killed, started again after (a reboot).
    RebootHost,
    /// A host's link down, up again after.
    CutHost,
    /// A node's disk filled, freed after.
    FillDisk,
    /// A replica's wall clock skewed.
    SkewClock,
    /// The voluntary ones: a node drained (undrained after), a member
    /// evicted, a role restarted, a leader switched over, an upgrade.
    Drain,
    Evict,
    RollingRestart,
    Switchover,
    Upgrade,
}

impl FaultKind {
    pub const ALL: [FaultKind; 15] = [
        FaultKind::KillMember,
        FaultKind::PauseMember,
        FaultKind::KillAgent,
        FaultKind::PauseAgent,
        FaultKind::KillServer,
        FaultKind::PauseServer,
        FaultKind::RebootHost,
        FaultKind::CutHost,
        FaultKind::FillDisk,
        FaultKind::SkewClock,
        FaultKind::Drain,
        FaultKind::Evict,
        FaultKind::RollingRestart,
        FaultKind::Switchover,
        FaultKind::Upgrade,
    ];

    /// Whether it is asked of herd (its budgets are asked) rather than
    /// done to it.
    pub fn voluntary(self) -> bool {
        matches!(
            self,
            FaultKind::Drain
                | FaultKind::Evict
                | FaultKind::RollingRestart
                | FaultKind::Switchover
                | FaultKind::Upgrade
        )
    }
}

/// One fault of a schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Its place in the schedule, from 1.
    pub number: u32,
    pub kind: FaultKind,
    /// Which of the targets of its kind (a host, a replica, a member
    /// slot), as an index the soak takes modulo how many there are.
    pub target: u32,
    /// When it starts, from the start of the run.
    pub at: Duration,
    /// How long it lasts (for the faults that are undone).
    pub length: Duration,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{} at {:.1}s: {:?} of target {} for {:.1}s",
            self.number,
            self.at.as_secs_f64(),
            self.kind,
            self.target,
            self.length.as_secs_f64()
        )
    }
}

/// How faults are drawn.
#[derive(Clone, Debug)]
pub struct Plan {
    pub seed: u64,
    /// The kinds drawn from, each as likely.
    pub kinds: Vec<FaultKind>,
    /// The time between one fault's start and the next's, drawn between.
    pub gap: (Duration, Duration),
    /// How long a fault lasts, drawn between.
    pub length: (Duration, Duration),
}

/// SplitMix64 (Steele, Lea and Flood): small, fast, and the same
/// everywhere.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (n > 0); the bias is below 2^-32 for the
    /// small `n` a schedule uses.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A duration in `range` (inclusive of the lower end).
    pub fn between(&mut self, (low, high): (Duration, Duration)) -> Duration {
        let span = high.saturating_sub(low).as_millis() as u64;
        low + Duration::from_millis(if span == 0 { 0 } else { self.below(span) })
    }
}

/// The schedule `plan` gives, without end, in order of their start: the
/// soak draws until it has done as many faults as it was asked (some find
/// their host busy, or nothing to act on, and are not done).
pub fn schedule(plan: &Plan) -> Schedule {
    Schedule { random: SplitMix64::new(plan.seed), plan: plan.clone(), at: Duration::ZERO, number: 0 }
}

/// The faults a [`Plan`] draws, one after the other.
pub struct Schedule {
    random: SplitMix64,
    plan: Plan,
    at: Duration,
    number: u32,
}

impl Iterator for Schedule {
    type Item = Fault;

    fn next(&mut self) -> Option<Fault> {
        let random = &mut self.random;
        let kinds = if self.plan.kinds.is_empty() { &FaultKind::ALL[..] } else { &self.plan.kinds[..] };
        self.number += 1;
        self.at += random.between(self.plan.gap);
        let kind = kinds[random.below(kinds.len() as u64) as usize];
        let target = random.below(u64::from(u32::MAX)) as u32;
        let length = random.between(self.plan.length);
        Some(Fault { number: self.number, kind, target, at: self.at, length })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn plan(seed: u64) -> Plan {
        Plan {
            seed,
            kinds: Vec::new(),
            gap: (Duration::from_secs(2), Duration::from_secs(8)),
            length: (Duration::from_secs(1), Duration::from_secs(10)),
        }
    }

    #[test]
    fn splitmix_gives_the_published_sequence() {
        // The first outputs for seed 1234567 (the reference sequence).
        let mut random = SplitMix64::new(1234567);
        let first: Vec<u64> = (0..3).map(|_| random.next_u64()).collect();
        assert_eq!(first, [6457827717110365317, 3203168211198807973, 9817491932198370423]);
    }

    #[test]
    fn a_thousand_faults_use_every_kind_in_fair_shares() {
        let faults: Vec<Fault> = schedule(&plan(42)).take(1000).collect();
        let mut counts: BTreeMap<FaultKind, u32> = BTreeMap::new();
        for fault in &faults {
            *counts.entry(fault.kind).or_default() += 1;
        }
        assert_eq!(counts.len(), FaultKind::ALL.len());
        assert!(counts.values().all(|n| (35..=100).contains(n)), "{counts:?}");
        assert!(faults.windows(2).all(|w| w[1].at > w[0].at), "in order of their start");
        assert_eq!(
            faults[0].to_string().split(':').next(),
            Some(&*format!("#1 at {:.1}s", faults[0].at.as_secs_f64()))
        );
    }

    proptest! {
        #[test]
        fn a_seed_replays_its_schedule_and_every_draw_is_within_its_plan(seed in any::<u64>(), count in 1..200u32) {
            let draw = |plan: &Plan| schedule(plan).take(count as usize).collect::<Vec<Fault>>();
            let drawn = draw(&plan(seed));
            prop_assert_eq!(&drawn, &draw(&plan(seed)));
            prop_assert_eq!(drawn.len(), count as usize);
            let mut before = Duration::ZERO;
            for fault in &drawn {
                let gap = fault.at - before;
                prop_assert!(gap >= Duration::from_secs(2) && gap < Duration::from_secs(8));
                prop_assert!(fault.length >= Duration::from_secs(1) && fault.length < Duration::from_secs(10));
                before = fault.at;
            }
            let kinds = vec![FaultKind::KillMember, FaultKind::Drain];
            let narrow = draw(&Plan { kinds: kinds.clone(), ..plan(seed) });
            prop_assert!(narrow.iter().all(|f| kinds.contains(&f.kind)));
        }
    }
}
