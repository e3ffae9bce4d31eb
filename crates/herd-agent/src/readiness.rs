//! Readiness checks: for every running member whose run has one, the
//! agent runs it every period (a command in the member's environment, or
//! a TCP connection to one of its named ports on loopback) and keeps the
//! result, with the instance it was run against, for the heartbeat. The
//! same loop watches the members' setup status files, so that a setup
//! that ends is reported at once rather than with the next heartbeat, and
//! looks after setup runs an earlier agent run launched (their deadline,
//! their end: `setup::look`), and runs the position command of each
//! member of a leader role that has one, every second.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herd_core::api::ReadinessReport;
use herd_core::kinds::app::{NamedPort, Probe, ReadinessCheck};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::members::{MemberRecord, Members};
use crate::procs::{self, RunMark};

/// How often the agent looks for checks that are due.
const TICK: Duration = Duration::from_millis(250);
/// How often a leader role's member's position command runs.
const POSITION_PERIOD: Duration = Duration::from_secs(1);
/// How much of a failing command's output a result keeps.
const DETAIL_TAIL: usize = 512;

/// Runs the checks until `stop` fires.
pub async fn run(members: Members, stop: CancellationToken) {
    let mut next_due: BTreeMap<(String, String), Instant> = BTreeMap::new();
    let mut running: JoinSet<()> = JoinSet::new();
    let mut busy: BTreeSet<String> = BTreeSet::new();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    // Each member's failed runs in a row (of the instance named).
    let streaks: Arc<Mutex<BTreeMap<String, Streak>>> = Arc::default();
    let mut setup_seen: BTreeMap<String, Option<String>> = BTreeMap::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(TICK) => {}
        }
        while let Ok(member) = done_rx.try_recv() {
            busy.remove(&member);
        }
        while running.try_join_next().is_some() {}
        let now = Instant::now();
        let records = members.records();
        next_due.retain(|(member, _), _| records.iter().any(|r| &r.name == member));
        streaks.lock().unwrap_or_else(|p| p.into_inner()).retain(|member, _| records.iter().any(|r| &r.name == member));
        setup_seen.retain(|member, _| records.iter().any(|r| &r.name == member));
        let mut setup_changed = false;
        for record in &records {
            crate::setup::look(&members, record);
            let (status, _) = crate::setup::report(&members, record);
            // A member first seen here with a status has news too (its setup
            // may have run within one tick).
            setup_changed |= match setup_seen.insert(record.name.clone(), status.clone()) {
                None => status.is_some(),
                Some(before) => before != status,
            };
        }
        if setup_changed {
            members.tell_changed();
        }
        for record in &records {
            let (Some(_), Some(process)) = (&record.run.position, &record.process) else { continue };
            let key = (record.name.clone(), format!("position {}", process.instance_id));
            let busy_key = format!("position {}", record.name);
            if !record.wanted || busy.contains(&busy_key) || next_due.get(&key).is_some_and(|due| *due > now) {
                continue;
            }
            next_due.insert(key, now + POSITION_PERIOD);
            busy.insert(busy_key.clone());
            let (members, done, record) = (members.clone(), done_tx.clone(), record.clone());
            running.spawn(async move {
                members.look_at_position(&record).await;
                let _ = done.send(busy_key);
            });
        }
        for record in records {
            let (Some(check), Some(process)) = (record.run.readiness.clone(), record.process.clone()) else {
                continue;
            };
            if !record.wanted || !procs::is_alive(process.pid, process.start_ticks) || busy.contains(&record.name) {
                continue;
            }
            let key = (record.name.clone(), process.instance_id.clone());
            if next_due.get(&key).is_some_and(|due| *due > now) {
                continue;
            }
            next_due.insert(key, now + check.period.get());
            busy.insert(record.name.clone());
            let (members, done, streaks) = (members.clone(), done_tx.clone(), streaks.clone());
            running.spawn(async move {
                let (passing, detail) = probe(&members, &record, &check).await;
                let run =
                    ReadinessReport { instance_id: process.instance_id.clone(), passing, detail, since: crate::now() };
                let before = members.readiness_of(&record.name);
                let report = {
                    let mut streaks = streaks.lock().unwrap_or_else(|p| p.into_inner());
                    let streak = streaks.entry(record.name.clone()).or_default();
                    held(before.as_ref(), streak, run, check.failure_threshold)
                };
                members.set_readiness(&record.name, report);
                let _ = done.send(record.name);
            });
        }
    }
}

/// A member's failed runs in a row, of one instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Streak {
    instance_id: String,
    failed: u32,
}

/// A run's result held to `threshold`: while fewer than `threshold` runs
/// in a row failed, an instance whose verdict (`before`) passed keeps it;
/// a run that passes ends the streak at once.
fn held(
    before: Option<&ReadinessReport>,
    streak: &mut Streak,
    run: ReadinessReport,
    threshold: u32,
) -> ReadinessReport {
    if streak.instance_id != run.instance_id {
        *streak = Streak { instance_id: run.instance_id.clone(), failed: 0 };
    }
    if run.passing {
        streak.failed = 0;
        return run;
    }
    streak.failed = streak.failed.saturating_add(1);
    match before {
        Some(before) if before.passing && before.instance_id == run.instance_id && streak.failed < threshold => {
            tracing::info!(instance = %run.instance_id, failed = streak.failed, threshold, detail = %run.detail, "a readiness run failed; still ready until the threshold");
            before.clone()
        }
        _ => run,
    }
}

async fn probe(members: &Members, record: &MemberRecord, check: &ReadinessCheck) -> (bool, String) {
    let timeout = check.timeout.get();
    match &check.probe {
        Probe::TcpPort(name) => {
            let variable = NamedPort { name: name.clone() }.variable();
            let Some(port) = record.run.env.get(&variable).and_then(|p| p.parse::<u16>().ok()) else {
                return (false, format!("the member has no port {name:?} ({variable} is not set)"));
            };
            match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(("127.0.0.1", port))).await {
                Ok(Ok(_)) => (true, String::new()),
                Ok(Err(error)) => (false, format!("connecting to port {name} (127.0.0.1:{port}): {error}")),
                Err(_) => (false, format!("connecting to port {name} (127.0.0.1:{port}) took more than {timeout:?}")),
            }
        }
        Probe::Command(argv) => {
            let mark = RunMark::fresh("check");
            let mut command = members.command(record, &argv[0], None);
            command.args(&argv[1..]).env(procs::RUN_VAR, mark.as_str());
            command.stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
            let child = match command.spawn() {
                Ok(child) => child,
                Err(error) => return (false, format!("starting {:?}: {error}", argv[0])),
            };
            let pid = child.id();
            let outcome = tokio::time::timeout(timeout, child.wait_with_output()).await;
            // Whatever the check started ends with it.
            procs::end_run(pid, &mark);
            match outcome {
                Ok(Ok(output)) if output.status.success() => (true, String::new()),
                Ok(Ok(output)) => {
                    let mut text = String::from_utf8_lossy(&output.stderr).into_owned();
                    text.push_str(&String::from_utf8_lossy(&output.stdout));
                    let tail: String =
                        text.trim().chars().rev().take(DETAIL_TAIL).collect::<Vec<_>>().into_iter().rev().collect();
                    (false, format!("the check exited with {}: {tail}", output.status))
                }
                Ok(Err(error)) => (false, format!("waiting for the check: {error}")),
                Err(_) => (false, format!("the check took more than {timeout:?}; killed")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::members::MemberHost;
    use herd_core::HumanDuration;
    use herd_core::kinds::command::MemberRun;

    fn record(env: &[(&str, String)]) -> MemberRecord {
        MemberRecord {
            name: "m".into(),
            run: MemberRun {
                command: vec!["sleep".into(), "60".into()],
                env: env.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
                volumes: vec![],
                readiness: None,
                drain: None,
                demote: None,
                position: None,
                ..Default::default()
            },
            wanted: true,
            process: None,
            launching: None,
            restarts: 0,
            last_exit: None,
            short_runs: 0,
            next_start: None,
            cgroup: None,
            oom_kill: None,
        }
    }

    #[test]
    fn a_ready_instance_stays_ready_until_the_threshold_of_failed_runs_in_a_row() {
        let run = |instance: &str, passing: bool| ReadinessReport {
            instance_id: instance.into(),
            passing,
            detail: if passing { String::new() } else { "late".into() },
            since: crate::now(),
        };
        let mut streak = Streak::default();
        let mut verdict = None;
        let mut verdicts = Vec::new();
        for (instance, passing) in [
            ("a", true),
            ("a", false),
            ("a", false),
            ("a", true),
            ("a", false),
            ("a", false),
            ("a", false),
            ("b", false),
        ] {
            let held = held(verdict.as_ref(), &mut streak, run(instance, passing), 3);
            verdicts.push(held.passing);
            verdict = Some(held);
        }
        assert_eq!(verdicts, [true, true, true, true, true, true, false, false], "a new instance is not held");
        // Not ready: ready again at the first run that passes.
        assert!(held(verdict.as_ref(), &mut streak, run("b", true), 3).passing);
        // A threshold of one: the first failed run.
        let mut streak = Streak::default();
        let ready = held(None, &mut streak, run("c", true), 1);
        assert!(!held(Some(&ready), &mut streak, run("c", false), 1).passing);
    }

    fn check(probe: Probe) -> ReadinessCheck {
        ReadinessCheck {
            probe,
            period: HumanDuration::from_secs(1),
            timeout: HumanDuration(Duration::from_millis(500)),
            failure_threshold: 1,
        }
    }

    #[tokio::test]
    async fn a_check_passes_or_says_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let members =
            Members::open(dir.path(), MemberHost::bare("not in this test"), CancellationToken::new()).await.unwrap();
        std::fs::create_dir_all(members.member_dir("m")).unwrap();
        let command = |script: &str| check(Probe::Command(vec!["sh".into(), "-c".into(), script.into()]));
        let plain = record(&[]);
        assert_eq!(probe(&members, &plain, &command("test \"$HERD_MEMBER\" = m")).await, (true, String::new()));
        let (passing, detail) = probe(&members, &plain, &command("echo not yet >&2; exit 3")).await;
        assert!(!passing && detail.contains("exit status: 3") && detail.contains("not yet"), "{detail}");
        let (passing, detail) = probe(&members, &plain, &command("sleep 5")).await;
        assert!(!passing && detail.contains("took more than"), "{detail}");

        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let open = listener.local_addr().unwrap().port();
        let tcp = check(Probe::TcpPort("client".into()));
        assert!(probe(&members, &record(&[("HERD_PORT_CLIENT", open.to_string())]), &tcp).await.0);
        drop(listener);
        let (passing, detail) = probe(&members, &record(&[("HERD_PORT_CLIENT", open.to_string())]), &tcp).await;
        assert!(!passing && detail.contains("connecting to port client"), "{detail}");
        let (passing, detail) = probe(&members, &plain, &tcp).await;
        assert!(!passing && detail.contains("HERD_PORT_CLIENT is not set"), "{detail}");
    }

    #[tokio::test]
    async fn a_leader_roles_member_reports_what_its_position_command_printed_for_its_run() {
        use herd_core::kinds::command::DrainHook;
        let dir = tempfile::tempdir().unwrap();
        let stop = CancellationToken::new();
        let _stop = stop.clone().drop_guard();
        let members = Members::open(dir.path(), MemberHost::bare("not in this test"), stop.clone()).await.unwrap();
        let mut run = record(&[]).run;
        let said = "echo 0/2A; echo sync c-db-1 c-db-2";
        run.position = Some(DrainHook { script: said.into(), timeout: HumanDuration::from_secs(5) });
        let instance = members.start("m", run).await.unwrap();
        tokio::spawn(super::run(members.clone(), stop.clone()));
        let mut reported = None;
        for _ in 0..40 {
            reported = members.report().into_iter().next().and_then(|r| r.position);
            if reported.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let reported = reported.expect("a position within 4 s");
        assert_eq!(reported.instance_id, instance);
        assert_eq!(reported.position, "0/2A");
        assert_eq!(reported.in_sync, Some(vec!["c-db-1".to_string(), "c-db-2".to_string()]));
    }
}
