//! CopyVolume throughput between two agents on this machine, beside `cp`
//! of the same data on the same disk (followed by a sync, as the copy
//! fsyncs every file), as a ratio, with the CPU each side of the copy
//! used (both ends share this host's cores); and the cost of one journal state
//! transition (an atomic rewrite: temp file, fsync, rename, fsync of the
//! directory) beside a plain write and fsync of the same bytes.
//!
//! `cargo build --release -p herd -p herd-bench && target/release/copy`
//! Options (environment): BENCH_COPY_MIB (default 1024), BENCH_ROUNDS
//! (default 5), BENCH_TRANSITIONS (default 200), HERD_BIN. Before each
//! measured copy, `sync` flushes what earlier rounds left dirty. The first
//! CopyVolume round also hashes the source (later rounds find the hashes
//! cached by the source agent, as a reconciler's second look does).

mod tls_reference;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use anyhow::bail;
use herd_bench::processes::{ADMIN, Killed, env_u64, herd_binary, start, wait_for};
use herd_client::Client;
use herd_core::kinds::{Action, AgentState, CommandSpec, ManagementState, NodeSpec};
use herd_core::{HumanDuration, Object, Timestamp};

/// Writes `mib` MiB of incompressible data in 64 MiB files.
fn make_data(dir: &Path, mib: u64) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut state = 0x9e3779b97f4a7c15u64;
    let mut block = vec![0u8; 1 << 20];
    for file in 0..mib.div_ceil(64) {
        let mut out = std::io::BufWriter::new(std::fs::File::create(dir.join(format!("part-{file:03}")))?);
        for _ in 0..64.min(mib - file * 64) {
            for chunk in block.chunks_mut(8) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                chunk.copy_from_slice(&state.to_le_bytes());
            }
            out.write_all(&block)?;
        }
        out.into_inner()?.sync_all()?;
    }
    Ok(())
}

/// Flushes everything dirty, so that each measured copy starts clean and
/// pays only for its own writes.
fn settle() -> anyhow::Result<()> {
    if !Command::new("sync").status()?.success() {
        bail!("sync failed");
    }
    Ok(())
}

fn cp_and_sync(from: &Path, to: &Path) -> anyhow::Result<Duration> {
    let _ = std::fs::remove_dir_all(to);
    settle()?;
    let started = Instant::now();
    let status = Command::new("cp").arg("-r").arg(from).arg(to).status()?;
    let synced = Command::new("sync").arg("-f").arg(to).status()?;
    if !status.success() || !synced.success() {
        bail!("cp or sync failed");
    }
    Ok(started.elapsed())
}

async fn herd_copy(admin: &Client, volume: &str, round: u64) -> anyhow::Result<Duration> {
    let action = Action::CopyVolume { member: "m".into(), volume: volume.into(), from_node: "source".into() };
    let spec = CommandSpec {
        node: "target".into(),
        timeout: Some(HumanDuration(Duration::from_secs(600))),
        action,
        origin: None,
    };
    let name = format!("copy-{volume}-{round}");
    let started = Instant::now();
    admin.create(&Object::new(name.clone(), spec)).await?;
    let command = wait_for("the copy", Duration::from_secs(600), async || {
        admin.get::<CommandSpec>(&name).await.ok().filter(|c| c.status.state_by_management.is_settled())
    })
    .await?;
    if command.status.state_by_management != ManagementState::Completed {
        bail!("the copy ended {:?}: {:?}", command.status.state_by_management, command.status.answer);
    }
    Ok(started.elapsed())
}

/// CPU time used by process `pid` ("self" for this one) and its children
/// it has waited for (a copy worker is the target agent's; `cp` and `sync`
/// are this process's), from `/proc/<pid>/stat` (USER_HZ ticks).
fn cpu_of(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    // Fields 14-17 of the file: utime, stime, cutime, cstime.
    let ticks: u64 = after_name.split_whitespace().skip(11).take(4).filter_map(|t| t.parse::<u64>().ok()).sum();
    Duration::from_millis(ticks * 10)
}

fn journal_transitions(dir: &Path, count: u64) -> anyhow::Result<(Duration, Duration)> {
    use herd_agent::journal::{Entry, Journal};
    let journal = Journal::open(dir)?;
    let now = Timestamp::from_system_time(SystemTime::now());
    let spec = CommandSpec {
        node: "n".into(),
        timeout: None,
        action: Action::StopMember { member: "m".into() },
        origin: None,
    };
    let mut entry = Entry {
        name: "bench".into(),
        uid: "u".into(),
        attempt: 1,
        term: 1,
        spec,
        state: AgentState::Started,
        started: now,
        updated: now,
        deadline: now,
        answer: None,
        worker: None,
        peers: Default::default(),
        grants: Vec::new(),
        progress: Default::default(),
    };
    let bytes = serde_json::to_vec_pretty(&entry)?;
    let started = Instant::now();
    for i in 0..count {
        entry.state = if i % 2 == 0 { AgentState::Processing } else { AgentState::ProcessingInBackend };
        journal.write(&entry)?;
    }
    let journaled = started.elapsed() / count as u32;
    let plain = dir.join("plain.json");
    let started = Instant::now();
    for _ in 0..count {
        let mut file = std::fs::File::create(&plain)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
    }
    Ok((journaled, started.elapsed() / count as u32))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mib = env_u64("BENCH_COPY_MIB", 1024);
    let rounds = env_u64("BENCH_ROUNDS", 5);
    let herd = herd_binary()?;
    let dir = tempfile::tempdir_in(std::env::var_os("BENCH_DIR").map(PathBuf::from).unwrap_or(std::env::temp_dir()))?;
    let (server_dir, source_dir, target_dir) =
        (dir.path().join("server"), dir.path().join("source"), dir.path().join("target"));
    let volume = source_dir.join("volumes/m/data");
    println!("copy benchmark: {mib} MiB in 64 MiB files, {rounds} rounds; cp and herd alternate");
    make_data(&volume, mib)?;

    let (server, url) = start(&herd, &["server", "--listen", "127.0.0.1:0", "--insecure-http"], &server_dir)?;
    let mut children = Killed(vec![server]);
    let agent = |name: &str, data: &Path| start(&herd, &["--server", &url, "agent", "--name", name], data);
    children.0.push(agent("source", &source_dir)?.0);
    children.0.push(agent("target", &target_dir)?.0);
    let admin = Client::new(vec![url.clone()], Some(ADMIN.into()));
    wait_for("both agents Ready", Duration::from_secs(30), async || {
        let nodes = admin.list::<NodeSpec>("").await.unwrap_or_default();
        (nodes.iter().filter(|n| n.status.ready).count() == 2).then_some(())
    })
    .await?;

    let (source_pid, target_pid) = (children.0[1].id().to_string(), children.0[2].id().to_string());
    let reference = tls_reference::TlsReference::start(&volume, &dir.path().join("tls-reference"))?;
    let (mut cp, mut copy, mut over_tls) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cp_cpu, mut source_cpu, mut target_cpu) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let before = cpu_of("self");
        cp.push(cp_and_sync(&volume, &dir.path().join("cp-copy"))?);
        cp_cpu.push(cpu_of("self").saturating_sub(before));
        if let Some(reference) = &reference {
            over_tls.push(reference.fetch_and_sync(&dir.path().join("tls-copy"))?);
        }
        // Each round copies into a fresh volume: the previous copy goes.
        let _ = std::fs::remove_dir_all(target_dir.join("volumes/m/data"));
        settle()?;
        let before = (cpu_of(&source_pid), cpu_of(&target_pid));
        copy.push(herd_copy(&admin, "data", round).await?);
        source_cpu.push(cpu_of(&source_pid).saturating_sub(before.0));
        target_cpu.push(cpu_of(&target_pid).saturating_sub(before.1));
    }
    // The same Command around a copy of one small file: what it costs
    // besides moving the bytes.
    let small = source_dir.join("volumes/m/small");
    std::fs::create_dir_all(&small)?;
    std::fs::write(small.join("file"), [7u8; 4096])?;
    let mut overhead = Vec::new();
    for round in 0..rounds {
        let _ = std::fs::remove_dir_all(target_dir.join("volumes/m/small"));
        overhead.push(herd_copy(&admin, "small", round).await?);
    }
    let rate = |d: &Duration| mib as f64 / d.as_secs_f64();
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    // Each round's cp and CopyVolume run back to back, so they meet the
    // same disk: the ratio of each pair cancels the disk's drift between
    // rounds (this virtual disk's speed swings 3-4x).
    let mut paired: Vec<f64> = cp.iter().zip(&copy).map(|(c, h)| c.as_secs_f64() / h.as_secs_f64()).collect();
    paired.sort_by(f64::total_cmp);
    let paired_median = paired[paired.len() / 2];
    let rounds_shown = |v: &[Duration]| v.iter().map(|d| format!("{:.2}", d.as_secs_f64())).collect::<Vec<_>>();
    let (cp_rounds, copy_rounds) = (rounds_shown(&cp), rounds_shown(&copy));
    let copy_by_round = copy.clone();
    let (cp_median, copy_median) = (median(&mut cp), median(&mut copy));
    println!(
        "cp + sync:   median {:>7.2} s  {:>7.1} MiB/s   (rounds in order: {:?})",
        cp_median.as_secs_f64(),
        rate(&cp_median),
        cp_rounds
    );
    println!(
        "CopyVolume:  median {:>7.2} s  {:>7.1} MiB/s   (rounds in order: {:?})",
        copy_median.as_secs_f64(),
        rate(&copy_median),
        copy_rounds
    );
    println!(
        "CopyVolume of one 4 KiB file (the Command's own cost): median {:.1} ms",
        median(&mut overhead).as_secs_f64() * 1e3
    );
    println!(
        "ratio (CopyVolume throughput / cp throughput): median of the rounds' ratios {paired_median:.2} \
         (goal: at least 0.8; the rounds' {:.2}-{:.2}), ratio of the medians {:.2}",
        paired[0],
        paired[paired.len() - 1],
        rate(&copy_median) / rate(&cp_median)
    );

    // The fair baseline: the same bytes over TLS on loopback by standard
    // tools, paired with the CopyVolume of the same round.
    if !over_tls.is_empty() {
        let mut paired: Vec<f64> =
            over_tls.iter().zip(&copy_by_round).map(|(t, h)| t.as_secs_f64() / h.as_secs_f64()).collect();
        paired.sort_by(f64::total_cmp);
        let shown = rounds_shown(&over_tls);
        let tls_median = median(&mut over_tls);
        println!(
            "curl from openssl s_server over TLS + sync: median {:>7.2} s  {:>7.1} MiB/s   (rounds in order: {shown:?})",
            tls_median.as_secs_f64(),
            rate(&tls_median)
        );
        println!(
            "ratio (CopyVolume / the TLS baseline): median of the rounds' ratios {:.2} (the rounds' {:.2}-{:.2}), ratio of the medians {:.2}",
            paired[paired.len() / 2],
            paired[0],
            paired[paired.len() - 1],
            rate(&copy_median) / rate(&tls_median)
        );
    } else {
        println!("no TLS baseline: openssl or curl is missing");
    }
    // On one host both ends share the cores; on two, each pays its side.
    let (cp_cpu, source_cpu, target_cpu) = (median(&mut cp_cpu), median(&mut source_cpu), median(&mut target_cpu));
    println!(
        "CPU per copy (median): cp + sync {:.2} s; CopyVolume: serving agent {:.2} s, receiving agent and worker {:.2} s \
         (the busier side alone moves {:.0} MiB per CPU-second)",
        cp_cpu.as_secs_f64(),
        source_cpu.as_secs_f64(),
        target_cpu.as_secs_f64(),
        mib as f64 / source_cpu.max(target_cpu).as_secs_f64().max(1e-3)
    );

    let count = env_u64("BENCH_TRANSITIONS", 200);
    let (journaled, plain) = journal_transitions(&dir.path().join("journal-bench"), count)?;
    println!(
        "journal: {:.3} ms per state transition (atomic rewrite) vs {:.3} ms for a plain write + fsync ({:.2}x), {count} each",
        journaled.as_secs_f64() * 1e3,
        plain.as_secs_f64() * 1e3,
        journaled.as_secs_f64() / plain.as_secs_f64()
    );
    Ok(())
}
