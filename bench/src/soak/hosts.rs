//! The processes a soak runs and faults: the server replicas on their
//! store, the agents (the first in a network namespace of its own, when
//! asked), and so their members. Which host has a fault on now. Every
//! process is ended, the schema dropped and the namespace removed when
//! the [`Cluster`] is dropped, also after a failure.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use herd_client::Client;

use super::Options;
use crate::netns::NetNs;
use crate::processes::{self, ADMIN};

/// The size of each host's disk, when it has one: room for etcd's
/// preallocated 64 MB write-ahead log files and PostgreSQL's data and
/// kept WAL (80 MB at least), for two members of each at a time.
const DISK_MB: u64 = 768;

/// The election's timings: a leader lost is replaced within seconds.
const LEASE: [&str; 6] = ["--lease-duration", "4s", "--renew-deadline", "3s", "--retry-period", "500ms"];

/// libfaketime's preload library, where Debian's `faketime` put it.
pub fn faketime_library() -> Option<PathBuf> {
    ["/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1", "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1"]
        .into_iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
}

/// One server replica: its process, where it listens and its URL.
pub struct Replica {
    pub child: Child,
    listen: String,
    pub url: String,
}

/// The soak's processes.
pub struct Cluster {
    herd: PathBuf,
    faketime: Option<PathBuf>,
    pub nodes: Vec<String>,
    pub replicas: Mutex<Vec<Replica>>,
    pub agents: Mutex<Vec<Child>>,
    /// The replicas' store: a PostgreSQL URL (its own schema), or None.
    store: Option<Schema>,
    /// The first host's namespace.
    pub netns: Option<NetNs>,
    /// The hosts' data dirs, each a tmpfs of its own (to be filled), when asked.
    disks: Vec<PathBuf>,
    /// Hosts (by index: nodes, then replicas, then one for the voluntary
    /// faults) with a fault on now.
    busy: Mutex<BTreeSet<usize>>,
    /// Whether the PostgreSQL example runs too.
    pub postgres_app: bool,
    // Last: removed after every process in it has ended.
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts the replicas and the agents (not yet Ready).
    pub fn start(options: &Options) -> anyhow::Result<Arc<Cluster>> {
        let dir = tempfile::tempdir()?;
        let store = match &options.postgres {
            Some(url) => Some(Schema::create(url)?),
            None => None,
        };
        let netns = options.netns.then(|| NetNs::create(100));
        let nodes: Vec<String> = (1..=3).map(|i| format!("node-{i}")).collect();
        let mut disks = Vec::new();
        if options.disks {
            for node in &nodes {
                let path = dir.path().join(node);
                std::fs::create_dir_all(&path)?;
                let size = format!("size={DISK_MB}m");
                let status = Command::new("mount").args(["-t", "tmpfs", "-o", &size, "tmpfs"]).arg(&path).status()?;
                if !status.success() {
                    bail!("mounting a tmpfs on {} (a disk of its own per host needs root)", path.display());
                }
                disks.push(path);
            }
        }
        let mut cluster = Cluster {
            herd: options.herd.clone(),
            faketime: options.faketime.clone(),
            nodes,
            replicas: Mutex::default(),
            agents: Mutex::default(),
            store,
            netns,
            disks,
            busy: Mutex::default(),
            postgres_app: options.postgres_app,
            dir,
        };
        // Reached from the namespace at its outside address, from here on loopback.
        let host = if cluster.netns.is_some() { "0.0.0.0" } else { "127.0.0.1" };
        let mut replicas = Vec::new();
        for index in 0..options.replicas {
            let listen = {
                let probe = std::net::TcpListener::bind(format!("{host}:0"))?;
                probe.local_addr()?.to_string()
            };
            replicas.push(cluster.start_replica(index, &listen, None)?);
        }
        cluster.replicas = Mutex::new(replicas);
        let agents = (0..cluster.nodes.len()).map(|i| cluster.start_agent(i)).collect::<anyhow::Result<_>>()?;
        cluster.agents = Mutex::new(agents);
        Ok(Arc::new(cluster))
    }

    /// Every replica's URL.
    pub fn urls(&self) -> Vec<String> {
        self.replicas.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|r| r.url.clone()).collect()
    }

    pub fn admin(&self) -> Client {
        Client::new(self.urls(), Some(ADMIN.into()))
    }

    /// Where every process of the soak keeps its data.
    pub fn root(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// Copies every log of the soak (`*.log`: the replicas', the agents',
    /// the members') under `to`, keeping where each was.
    pub fn keep_logs(&self, to: &Path) -> std::io::Result<()> {
        fn copy(from: &Path, to: &Path) -> std::io::Result<()> {
            for entry in std::fs::read_dir(from)? {
                let entry = entry?;
                let path = entry.path();
                if entry.file_type()?.is_dir() {
                    copy(&path, &to.join(entry.file_name()))?;
                } else if path.extension().is_some_and(|e| e == "log") {
                    std::fs::create_dir_all(to)?;
                    std::fs::copy(&path, to.join(entry.file_name()))?;
                }
            }
            Ok(())
        }
        copy(self.dir.path(), to)
    }

    pub fn node_dir(&self, index: usize) -> PathBuf {
        self.dir.path().join(&self.nodes[index])
    }

    /// Takes host `host` for a fault: false if it has one on already.
    pub fn take(&self, host: usize) -> bool {
        self.busy.lock().unwrap_or_else(|p| p.into_inner()).insert(host)
    }

    pub fn give_back(&self, host: usize) {
        self.busy.lock().unwrap_or_else(|p| p.into_inner()).remove(&host);
    }

    /// Replica `index` listening at `listen`, its wall clock off by
    /// `skew` (libfaketime's syntax) when given.
    fn start_replica(&self, index: usize, listen: &str, skew: Option<&str>) -> anyhow::Result<Replica> {
        let mut command = Command::new(&self.herd);
        if let Some(offset) = skew {
            let library = self.faketime.as_ref().context("a skewed clock needs libfaketime")?;
            command.env("LD_PRELOAD", library).env("FAKETIME", offset).env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let identity = format!("replica-{}", index + 1);
        let mut args = vec!["server", "--listen", listen, "--insecure-http", "--identity", &identity];
        args.extend(LEASE);
        // On SQLite the replicas share one data dir, and so one store file.
        let data = match &self.store {
            Some(schema) => {
                args.extend(["--store", &schema.url]);
                self.dir.path().join(&identity)
            }
            None => self.dir.path().join("server"),
        };
        let (child, url) = processes::start_with(command, &args, &data)?;
        let url = url.replace("0.0.0.0", "127.0.0.1");
        Ok(Replica { child, listen: listen.to_string(), url })
    }

    /// Starts replica `index` again where it listened (skewed, or not).
    pub fn restart_replica(&self, index: usize, skew: Option<&str>) -> anyhow::Result<()> {
        let listen = self.replicas.lock().unwrap_or_else(|p| p.into_inner())[index].listen.clone();
        {
            let mut replicas = self.replicas.lock().unwrap_or_else(|p| p.into_inner());
            let _ = replicas[index].child.kill();
            let _ = replicas[index].child.wait();
        }
        let replica = self.start_replica(index, &listen, skew)?;
        self.replicas.lock().unwrap_or_else(|p| p.into_inner())[index] = replica;
        Ok(())
    }

    pub fn replica_pid(&self, index: usize) -> u32 {
        self.replicas.lock().unwrap_or_else(|p| p.into_inner())[index].child.id()
    }

    /// The agent of host `index`: the first inside the namespace (when
    /// there is one), listening there, and the others at the namespace's
    /// outside address, which both sides reach.
    fn start_agent(&self, index: usize) -> anyhow::Result<Child> {
        let data = self.node_dir(index);
        let name = &self.nodes[index];
        let urls = self.urls();
        let (netns, servers, listen) = match &self.netns {
            Some(ns) if index == 0 => {
                let outside: Vec<String> = urls.iter().map(|u| u.replace("127.0.0.1", &ns.outside)).collect();
                (Some(ns.name.as_str()), outside.join(","), format!("{}:0", ns.inside()))
            }
            Some(ns) => (None, urls.join(","), format!("{}:0", ns.outside)),
            None => (None, urls.join(","), "127.0.0.1:0".to_string()),
        };
        let args = ["--server", &servers, "agent", "--name", name, "--listen", &listen];
        Ok(processes::start_in(netns, &self.herd, &args, &data)?.0)
    }

    /// Starts host `index`'s agent again.
    pub fn restart_agent(&self, index: usize) -> anyhow::Result<()> {
        let child = self.start_agent(index)?;
        let mut agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        let mut old = std::mem::replace(&mut agents[index], child);
        let _ = old.kill();
        let _ = old.wait();
        Ok(())
    }

    pub fn agent_pid(&self, index: usize) -> u32 {
        self.agents.lock().unwrap_or_else(|p| p.into_inner())[index].id()
    }

    /// Fills host `index`'s disk to the last block (a file that takes all
    /// that is free); the file's path, to be removed.
    pub fn fill_disk(&self, index: usize) -> anyhow::Result<PathBuf> {
        let dir = self.node_dir(index);
        if !self.disks.contains(&dir) {
            bail!("a full disk needs the hosts' data dirs on disks of their own");
        }
        let out = Command::new("df").args(["--output=avail", "-B1"]).arg(&dir).output()?;
        let free: u64 = String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|line| line.trim().parse().ok())
            .context("df's free bytes")?;
        // Most of what is free at once, less what the members may write
        // meanwhile (with 1 MB left, a busy host's fallocate failed), then
        // the rest a block at a time until none is left.
        let file = dir.join("soak-fill");
        let most = free.saturating_sub(32 << 20).to_string();
        let status = Command::new("fallocate").args(["-l", &most]).arg(&file).stderr(Stdio::null()).status()?;
        if !status.success() {
            // Then dd fills all of it.
            std::fs::write(&file, b"")?;
        }
        let rest = format!("of={}", file.display());
        // dd ends at "no space left", as meant.
        let _ = Command::new("dd")
            .args(["if=/dev/zero", &rest, "bs=4k", "oflag=append", "conv=notrunc"])
            .stderr(Stdio::null())
            .status()?;
        Ok(file)
    }

    /// Every paused process let go and the link up: the end of a run.
    pub fn heal(&self) {
        let pids: Vec<u32> = {
            let replicas = self.replicas.lock().unwrap_or_else(|p| p.into_inner());
            let agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
            replicas.iter().map(|r| r.child.id()).chain(agents.iter().map(Child::id)).collect()
        };
        for pid in pids {
            signal_pid(pid, "CONT");
        }
        if let Some(netns) = &self.netns {
            netns.heal();
        }
    }

    /// Ends the agents and replicas, then the members (as a host's
    /// shutdown would: SIGTERM, then SIGKILL after the agent's grace).
    pub async fn stop(&self) {
        self.heal();
        self.end_servers_and_agents();
        for index in 0..self.nodes.len() {
            herd_agent::members::stop_processes(&self.node_dir(index)).await;
        }
    }

    fn end_servers_and_agents(&self) {
        let mut agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        let mut replicas = self.replicas.lock().unwrap_or_else(|p| p.into_inner());
        for child in agents.iter_mut().chain(replicas.iter_mut().map(|r| &mut r.child)) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.heal();
        self.end_servers_and_agents();
        for index in 0..self.nodes.len() {
            let dir = self.node_dir(index);
            // Members outlive their agent by design: each process group.
            for pid in member_processes_of(&dir) {
                signal_pid(pid, "KILL");
                let group = format!("-{pid}");
                let _ = Command::new("kill").args(["-s", "KILL", "--", &group]).stderr(Stdio::null()).status();
            }
            herd_agent::cgroups::remove_left(&dir);
        }
        for disk in &self.disks {
            let _ = Command::new("umount").arg("-l").arg(disk).status();
        }
    }
}

/// A schema of the soak's own in a PostgreSQL database, dropped on drop.
struct Schema {
    base: String,
    name: String,
    url: String,
}

impl Schema {
    fn create(base: &str) -> anyhow::Result<Schema> {
        let seconds = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
        let name = format!("herd_soak_{}_{seconds}", std::process::id());
        psql(base, &format!("CREATE SCHEMA {name}"))?;
        let separator = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{separator}options=-csearch_path%3D{name}");
        Ok(Schema { base: base.to_string(), name, url })
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let _ = psql(&self.base, &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
    }
}

fn psql(url: &str, sql: &str) -> anyhow::Result<()> {
    let out = Command::new("psql")
        .args([url, "-qc", sql])
        .env("PGOPTIONS", "--client-min-messages=warning")
        .output()
        .context("running psql")?;
    if !out.status.success() {
        bail!("psql {sql:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Sends `signal` to `pid`; a pid already gone is no matter (its fault is moot).
pub fn signal_pid(pid: u32, signal: &str) {
    let _ = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).stderr(Stdio::null()).status();
}

/// The processes of the members of the agent whose data dir is `dir`
/// (setups too): those whose `HERD_VOLUME_HERD` lies under it.
pub fn member_processes_of(dir: &Path) -> Vec<u32> {
    let under = dir.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                env.split(|b| *b == 0).any(|var| {
                    let var = String::from_utf8_lossy(var);
                    var.strip_prefix("HERD_VOLUME_HERD=").is_some_and(|path| path.starts_with(&under))
                })
            })
        })
        .collect()
}
