//! Members that lead their role: the leases heartbeats renew, the term
//! file the app reads, and the fence. A leader's lease holds, on this
//! agent's monotonic clock, until its renew deadline after the heartbeat
//! that renewed it was sent; one not renewed by then is fenced: its
//! demote hook runs, then its processes end (the agent starts it again,
//! a follower; a hook that could not finish within the lease runs again
//! once they have, so that it does not start again leading). The herd leader grants the next term only once the lease
//! has gone unrenewed for its whole duration, on its own clock, so the
//! fence comes first (`herd_core::role_leader`).
//!
//! Members outlive their agent, so the fence must too: a guard, a small
//! shell in the leader's process group, ends the group at a deadline the
//! agent moves on with each renewal (`leader.deadline` in the member's
//! directory, in hundredths of a second of the host's boot clock, which
//! counts on while the agent is stopped or dead): halfway between the
//! agent's own fence and the earliest the next term can be granted. It
//! goes with the group, or when the agent removes the file (the member
//! leads no more).
//!
//! The demote hook of a fence or a handover runs while the guard is still
//! on watch, and is given no longer than the lease: a hook that hangs
//! never lets a leader go on past its lease. Standing down is whole
//! before anything else happens to the member: a run that ends meanwhile
//! (its guard ended it while the agent was stopped) is cleared away, and
//! the member started again, only once its demote hook has run.
//!
//! The term file, `leader.json` in the member's herd volume, says the
//! term the member last led in and whether it leads now; it is written
//! atomically when a term begins, and once a member stood down (after its
//! demote hook, and its processes' end when fenced): the server takes a
//! member that says it stood down in its lease's term as leading no more.
//! While it leads, the file also names the members the herd leader has on
//! record as in sync with it (`inSync`, rewritten when a renewal brings
//! another set): a synchronous app keeps every other replica holding up
//! its commits until it is no longer named there.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use herd_core::api::{LeaseRenewal, PositionReport};
use herd_core::role_leader::Position;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::{MemberRecord, Members};
use crate::fsutil::{SpaceReserve, write_atomic};
use crate::procs::RunMark;

/// The guard's deadline, in the member's directory.
const DEADLINE_FILE: &str = "leader.deadline";

/// How often leases are looked at for their deadline.
pub const FENCE_LOOK: Duration = Duration::from_millis(100);

/// The bound on a demote hook that races no running leader: none but
/// its own timeout.
const NOT_RACING: Duration = Duration::from_secs(24 * 3600);

/// How often a member being promoted is asked how far it has come.
const CATCH_UP_LOOK: Duration = Duration::from_millis(20);

/// How a leader stood down for a handover.
pub struct StoodDown {
    /// What its position command printed afterwards.
    pub position: Option<String>,
    /// Why its demote hook failed (its processes were ended instead).
    pub fenced: Option<String>,
}

/// A member's lease as this agent holds it.
#[derive(Clone, Debug)]
pub struct Lead {
    pub term: u64,
    /// Until when it leads, unless renewed again.
    pub deadline: Instant,
    /// When its guard ends it if the agent has not.
    pub guard_deadline: Instant,
    /// The process its guard watches over.
    guarded: Option<u32>,
    /// Who the herd leader has on record as in sync with it.
    in_sync: Vec<String>,
}

/// The guard: `$1` the deadline file, `$2` the process group (its leader's
/// pid). It ends the group once the host's boot clock (`/proc/uptime`, in
/// hundredths of a second) passes the deadline; it stops when the file is
/// gone, or the group's leader is (or its pid is another process's now,
/// another start time: pids come round fast, and a group id with them).
const GUARD: &str = r#"f=$1; g=$2
started() { read -r s < "/proc/$g/stat" 2>/dev/null || return 1; s=${s##*) }; set -- $s; echo "${20}"; }
s0=$(started) || exit 0
while [ "$(started)" = "$s0" ] && [ -f "$f" ]; do
  d=; read -r d < "$f"; [ -n "$d" ] || d=0
  read -r up _ < /proc/uptime
  now=${up%.*}${up#*.}
  if [ "$now" -ge "$d" ]; then kill -9 "-$g"; exit 0; fi
  sleep 0.05
done"#;

/// The host's boot clock now, in hundredths of a second.
fn uptime_centis() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/uptime").ok()?;
    let (whole, fraction) = text.split_whitespace().next()?.split_once('.')?;
    Some(whole.parse::<u64>().ok()? * 100 + fraction.parse::<u64>().ok()?)
}

/// What `leader.json` says.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct TermFile {
    term: u64,
    leading: bool,
    #[serde(default)]
    in_sync: Vec<String>,
}

impl Members {
    /// The leases a heartbeat sent at `sent` renewed: each holds until its
    /// renew deadline after `sent`. A new term, or another set of members
    /// in sync, is written to the member's term file.
    pub fn leases_renewed(&self, sent: Instant, renewals: &[LeaseRenewal]) {
        for renewal in renewals {
            // A term it stood down from is never taken up again here (a
            // renewal sent before the server heard of it, arriving late).
            if self.stood_down_in(&renewal.member).is_some_and(|term| term >= renewal.term) {
                continue;
            }
            let deadline = sent + renewal.renew_deadline.get();
            // An answer that comes after its own deadline (the agent was
            // stopped, or the answer slow) renews nothing: the fence is due.
            if deadline <= Instant::now() {
                continue;
            }
            let guard_deadline = sent + (renewal.renew_deadline.get() + renewal.lease_duration.get()) / 2;
            let (changed, began, lead) = {
                let mut leads = self.leads();
                let fresh = Lead { term: 0, deadline, guard_deadline, guarded: None, in_sync: Vec::new() };
                let lead = leads.entry(renewal.member.clone()).or_insert(fresh);
                let began = lead.term != renewal.term;
                let in_sync_changed = lead.in_sync != renewal.in_sync;
                lead.term = renewal.term;
                lead.deadline = deadline.max(lead.deadline);
                lead.guard_deadline = guard_deadline.max(lead.guard_deadline);
                lead.in_sync.clone_from(&renewal.in_sync);
                (began || in_sync_changed, began, lead.clone())
            };
            if began {
                tracing::info!(member = %renewal.member, term = renewal.term, "leads its role");
            }
            if changed {
                self.write_term(&renewal.member, renewal.term, true, &renewal.in_sync);
            }
            self.guard(&renewal.member, &lead);
        }
    }

    /// Fences every leader whose lease was not renewed in time: demote
    /// hook, then its processes end. One fence at a time: one that finds
    /// nothing due returns only once a fence under way has ended, so a
    /// member it fences is not started again before it was demoted.
    pub async fn fence_due(&self) {
        let _fencing = self.fencing.lock().await;
        let now = Instant::now();
        let due: Vec<(String, Lead)> = {
            let mut leads = self.leads();
            let due: Vec<(String, Lead)> =
                leads.iter().filter(|(_, l)| l.deadline <= now).map(|(m, l)| (m.clone(), l.clone())).collect();
            for (member, _) in &due {
                leads.remove(member);
            }
            due
        };
        for (member, lead) in due {
            tracing::warn!(member, term = lead.term, "its leader lease was not renewed in time: fencing it");
            let Some(record) = self.record(&member) else { continue };
            if self.demote_or_end(&record, lead.term, lead.guard_deadline).await.is_ok() {
                self.end_leader(&record);
            }
            self.stand_guard_down(&member);
            // Said only now: the server takes a demoted leader's lease as
            // ended, and grants the next term at once.
            self.write_term(&member, lead.term, false, &[]);
        }
    }

    /// Demotes the member from `term` while it runs, until `deadline`;
    /// when its hook has not done so by then (it hangs, or the lease had
    /// already run out: the agent was stopped), its processes end and
    /// the hook runs again, given its own timeout now that nothing races
    /// it, so that the member does not start again leading. Why the hook
    /// did not finish in time, if it did not.
    async fn demote_or_end(&self, record: &MemberRecord, term: u64, deadline: Instant) -> Result<(), String> {
        let demoted = self.demote_within(record, term, deadline).await;
        if let Err(why) = &demoted {
            self.end_leader(record);
            tracing::warn!(member = %record.name, term, %why, "its processes ended: demoting it again, in its own time");
            let _ = self.demote_within(record, term, Instant::now() + NOT_RACING).await;
        }
        demoted
    }

    /// Runs the member's demote hook (for `term`), given no longer than
    /// until `deadline`: its guard, still on watch, ends the member then
    /// whatever the hook does, so a hook that hangs never lets a leader
    /// go on past its lease.
    async fn demote_within(&self, record: &MemberRecord, term: u64, deadline: Instant) -> Result<(), String> {
        let Some(demote) = &record.run.demote else { return Ok(()) };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("its lease ran out before its demote hook could run".into());
        }
        let bounded = herd_core::kinds::command::DrainHook {
            script: demote.script.clone(),
            timeout: herd_core::time::HumanDuration(demote.timeout.get().min(left)),
        };
        self.hook(record, &bounded, "demote", &[("HERD_LEADER_TERM", term.to_string())]).await
    }

    /// The member leads no more: its guard stands down.
    fn stand_guard_down(&self, member: &str) {
        let _ = std::fs::remove_file(self.member_dir(member).join(DEADLINE_FILE));
    }

    /// Ends a leader's processes: only the run it knows (a pid whose
    /// process is gone may be another's by now: pids come round fast).
    fn end_leader(&self, record: &MemberRecord) {
        if let Some(process) = &record.process
            && let Err(error) = crate::procs::signal_run(process.pid, process.start_ticks, libc::SIGKILL)
        {
            tracing::error!(member = %record.name, %error, "could not end a fenced leader's processes");
        }
    }

    /// Stands `member` down as its role's leader of `term`, for a
    /// handover: its lease is given up here (no renewal of that term or
    /// an older one is taken up again) and its demote hook runs, given no
    /// longer than the lease's renew deadline (its guard stays on watch
    /// meanwhile); when that fails, its processes end and the hook runs
    /// again, as at a fence. Only
    /// then does its term file say it leads no more. What its position
    /// command prints afterwards is where it stood down.
    pub async fn stand_down(&self, member: &str, term: u64) -> Result<StoodDown, String> {
        let record = self.record(member).ok_or_else(|| format!("member {member} is not known on this node"))?;
        let _standing_down = self.fencing.lock().await;
        let lead = {
            let mut stood_down = self.stood_down.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let highest = stood_down.entry(member.to_string()).or_insert(term);
            *highest = term.max(*highest);
            let mut leads = self.leads();
            match leads.get(member) {
                Some(lead) if lead.term <= term => leads.remove(member),
                _ => None,
            }
        };
        tracing::info!(member, term, "standing down as its role's leader for a handover");
        // Not renewed any more: the hook has until the lease's own end here.
        let deadline = lead.map_or_else(|| Instant::now() + Duration::from_secs(3600), |l| l.deadline);
        let fenced = self.demote_or_end(&record, term, deadline).await.err();
        self.stand_guard_down(member);
        self.write_term(member, term, false, &[]);
        let position = self.position_now(&record).await.map(|p| p.position).filter(|p| !p.is_empty());
        Ok(StoodDown { position, fenced })
    }

    /// The highest term `member` stood down from for a handover.
    fn stood_down_in(&self, member: &str) -> Option<u64> {
        self.stood_down.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(member).copied()
    }

    /// The lease `member` holds now, if any.
    pub fn lead(&self, member: &str) -> Option<Lead> {
        self.leads().get(member).cloned()
    }

    fn leads(&self) -> std::sync::MutexGuard<'_, HashMap<String, Lead>> {
        self.leads.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Moves the guard's deadline on, and starts the guard over the
    /// member's current process when none watches it.
    fn guard(&self, member: &str, lead: &Lead) {
        let Some(process) = self.record(member).and_then(|r| r.process) else { return };
        let Some(now) = uptime_centis() else {
            tracing::error!(member, "no /proc/uptime: the leader has no guard");
            return;
        };
        let left = lead.guard_deadline.saturating_duration_since(Instant::now());
        let deadline = now + u64::try_from(left.as_millis() / 10).unwrap_or(u64::MAX);
        let file = self.member_dir(member).join(DEADLINE_FILE);
        if let Err(error) = write_atomic(&file, format!("{deadline}\n").as_bytes(), 0o644) {
            tracing::error!(member, %error, "could not move the guard's deadline on");
            return;
        }
        if lead.guarded == Some(process.pid) {
            return;
        }
        let Ok(group) = libc::pid_t::try_from(process.pid) else { return };
        let mut command = std::process::Command::new("sh");
        command.arg("-c").arg(GUARD).arg("herd-guard").arg(&file).arg(process.pid.to_string());
        command.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null());
        command.stderr(std::process::Stdio::null()).env_clear().env("PATH", super::DEFAULT_PATH);
        // In the leader's own group: it goes with the group.
        command.process_group(group);
        match command.spawn() {
            Ok(mut child) => {
                // Reaped by a thread of its own, so that it leaves no zombie.
                std::thread::spawn(move || child.wait());
                if let Some(lead) = self.leads().get_mut(member) {
                    lead.guarded = Some(process.pid);
                }
            }
            Err(error) => tracing::error!(member, %error, "could not start the leader's guard"),
        }
    }

    /// Runs the member's position command against its current run; what
    /// it printed is reported with the member from now on.
    pub async fn look_at_position(&self, record: &MemberRecord) {
        let Some(report) = self.position_now(record).await else { return };
        let changed = {
            let mut positions = self.positions.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            positions.insert(record.name.clone(), report.clone()).as_ref() != Some(&report)
        };
        if changed {
            self.tell_changed();
        }
    }

    /// What the member's position command prints now, for its current
    /// run (None: it has no command, or no run). A command that does not
    /// answer gives no position: the member is not chosen for one.
    async fn position_now(&self, record: &MemberRecord) -> Option<PositionReport> {
        let (Some(hook), Some(process)) = (&record.run.position, &record.process) else { return None };
        let silent = || PositionReport { instance_id: process.instance_id.clone(), ..PositionReport::default() };
        let mark = RunMark::fresh("position");
        let child = match self.shell(record, &hook.script, &["herd-position", "--position"], &mark).spawn() {
            Ok(child) => child,
            Err(error) => {
                tracing::warn!(member = %record.name, %error, "could not run the position command");
                return Some(silent());
            }
        };
        let pid = child.id();
        let outcome = tokio::time::timeout(hook.timeout.get(), child.wait_with_output()).await;
        crate::procs::end_run(pid, &mark);
        Some(match outcome {
            Ok(Ok(output)) if output.status.success() => {
                PositionReport::parse(&process.instance_id, &String::from_utf8_lossy(&output.stdout))
            }
            _ => silent(),
        })
    }

    /// Waits until the member's position command says it has come as far
    /// as `target` (asking every [`CATCH_UP_LOOK`]), at most until
    /// `deadline`; why not when it has not.
    pub async fn catch_up(&self, record: &MemberRecord, target: Position, deadline: Instant) -> Result<(), String> {
        let mut last = None;
        loop {
            let now = self.position_now(record).await.map(|p| p.position.parse::<Position>());
            match now {
                Some(Ok(position)) if position >= target => return Ok(()),
                Some(Ok(position)) => last = Some(position),
                _ => {}
            }
            if Instant::now() + CATCH_UP_LOOK >= deadline {
                let at = last.map_or_else(|| "no position".to_string(), |p| p.to_string());
                return Err(format!(
                    "it did not catch up to {target} (where the leader before it stood down): at {at}"
                ));
            }
            tokio::time::sleep(CATCH_UP_LOOK).await;
        }
    }

    /// The position reported for `record`'s current run.
    pub(super) fn position_of(&self, record: &MemberRecord) -> Option<PositionReport> {
        let instance = &record.process.as_ref()?.instance_id;
        let positions = self.positions.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        positions.get(&record.name).filter(|p| p.instance_id == *instance).cloned()
    }

    /// A member that led when it went down (its term file says so) and is
    /// started again by an agent that holds no lease of its: its demote
    /// hook runs first, and it is reported demoted in that term.
    pub async fn demote_if_leading(&self, record: &MemberRecord) {
        let Some(TermFile { term, leading: true, .. }) = self.term_file(record) else { return };
        let _standing_down = self.fencing.lock().await;
        tracing::warn!(member = %record.name, term, "it led when it went down: demoting it before it starts again");
        let _ = self.demote_within(record, term, Instant::now() + NOT_RACING).await;
        self.write_term(&record.name, term, false, &[]);
    }

    /// The term in which the member was demoted (fenced, or brought back
    /// after it went down leading), as its term file says.
    pub(super) fn demoted_in(&self, record: &MemberRecord) -> Option<u64> {
        // Only a leader role's member has a term file: no read for the others.
        record.run.demote.as_ref()?;
        self.term_file(record).filter(|t| !t.leading).map(|t| t.term)
    }

    fn term_file(&self, record: &MemberRecord) -> Option<TermFile> {
        let dir = crate::setup::herd_volume(self, record)?;
        serde_json::from_slice(&std::fs::read(dir.join("leader.json")).ok()?).ok()
    }

    fn write_term(&self, member: &str, term: u64, leading: bool, in_sync: &[String]) {
        let Some(record) = self.record(member) else { return };
        let Some(dir) = crate::setup::herd_volume(self, &record) else { return };
        let text = serde_json::to_vec(&TermFile { term, leading, in_sync: in_sync.to_vec() }).unwrap_or_default();
        // A fenced leader's file must say so on a full disk too: a member
        // started again from a stale one runs as the leader.
        let reserve = SpaceReserve::of(self.data_dir());
        if let Err(error) =
            std::fs::create_dir_all(&dir).and_then(|()| reserve.write_atomic(&dir.join("leader.json"), &text, 0o644))
        {
            tracing::error!(member, %error, "could not write the term file");
        }
    }
}

/// Fences leaders whose leases ran out, until the agent stops.
pub async fn run(members: Members, stop: tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(FENCE_LOOK) => members.fence_due().await,
        }
    }
}
