//! Patroni's side, the peer measured against: Patroni 4.1 (from PyPI, in a
//! virtual environment) on Debian's etcd, running three PostgreSQL 15
//! instances on this host with the same lease settings as herd's side
//! (ttl = lease duration, loop_wait = retry period, retry_timeout = renew
//! deadline) and the same PostgreSQL settings as the herd example, in
//! synchronous mode with every standby synchronous (as the example's
//! `FIRST n`). Host 0's Patroni (and so its PostgreSQL) runs inside the
//! network namespace. Faults are the same as herd's side: the postmaster
//! killed, Patroni and PostgreSQL's process group killed, host 0's link cut.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::{LeaseSettings, signal_group};
use herd_bench::netns::NetNs;
use herd_bench::probe::Target;
use herd_bench::processes::Killed;

/// Ports apart from herd's member ports (20000-29999) and the tests'
/// (10000-19999), below the kernel's ephemeral ones.
const FIRST_PG_PORT: u16 = 30432;
const FIRST_API_PORT: u16 = 30008;
const ETCD_PORT: u16 = 30379;
const ETCD_PEER_PORT: u16 = 30380;
const VERSION: &str = "4.1.*";

pub struct PatroniSide {
    patroni: PathBuf,
    dir: PathBuf,
    /// Killed last, after every Patroni and PostgreSQL.
    _etcd: Killed,
    patronis: Vec<Option<Child>>,
    http: reqwest::Client,
    pub netns: NetNs,
}

fn name(host: usize) -> String {
    format!("p{host}")
}

/// Patroni from `PATRONI_BIN`, or installed from PyPI into a virtual
/// environment of Debian's Python under the temporary directory (where
/// user `postgres` may run it) the first time.
pub fn patroni_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("PATRONI_BIN") {
        return Ok(PathBuf::from(path));
    }
    let venv = std::env::temp_dir().join("herd-bench-patroni");
    let patroni = venv.join("bin/patroni");
    if patroni.exists() {
        return Ok(patroni);
    }
    println!("installing Patroni {VERSION} into {} (once)", venv.display());
    run(Command::new("/usr/bin/python3").args(["-m", "venv"]).arg(&venv))?;
    let package = format!("patroni[etcd3]=={VERSION}");
    run(Command::new(venv.join("bin/pip")).args(["install", "-q", &package, "psycopg2-binary"]))?;
    Ok(patroni)
}

fn run(command: &mut Command) -> anyhow::Result<()> {
    let status = command.status().with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed: {status}");
    }
    Ok(())
}

impl PatroniSide {
    pub async fn start(dir: &Path, netns: NetNs, lease: &LeaseSettings) -> anyhow::Result<PatroniSide> {
        let patroni = patroni_binary()?;
        let dir = dir.join("patroni");
        std::fs::create_dir_all(&dir)?;
        run(Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir))?;
        let etcd_url = format!("http://{}:{ETCD_PORT}", netns.outside);
        let log = std::fs::File::create(dir.join("etcd.log"))?;
        let etcd = Command::new("etcd")
            .args(["--name", "bench", "--data-dir"])
            .arg(dir.join("etcd"))
            .arg("--listen-client-urls")
            .arg(format!("http://127.0.0.1:{ETCD_PORT},{etcd_url}"))
            .args(["--advertise-client-urls", &etcd_url])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{ETCD_PEER_PORT}")])
            .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{ETCD_PEER_PORT}")])
            .args(["--initial-cluster", &format!("bench=http://127.0.0.1:{ETCD_PEER_PORT}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting etcd (apt-get install -y etcd-server)")?;
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        let mut side = PatroniSide { patroni, dir, _etcd: Killed(vec![etcd]), patronis: Vec::new(), http, netns };
        for host in 0..3 {
            side.write_config(host, lease, &etcd_url)?;
        }
        // The first bootstraps the cluster alone, so that it is the leader
        // the others clone, as herd's first member is.
        side.patronis.push(Some(side.start_patroni(0)?));
        herd_bench::processes::wait_for("Patroni's first primary", Duration::from_secs(120), async || {
            side.leader().await.filter(|(host, _)| *host == 0)
        })
        .await?;
        for host in 1..3 {
            let patroni = side.start_patroni(host)?;
            side.patronis.push(Some(patroni));
        }
        Ok(side)
    }

    /// Host `host`'s address: inside the namespace for host 0, the
    /// namespace's address outside for the others (both sides reach it).
    fn address(&self, host: usize) -> String {
        match host {
            0 => self.netns.inside(),
            _ => self.netns.outside.clone(),
        }
    }

    fn api(&self, host: usize) -> String {
        format!("http://{}:{}", self.address(host), FIRST_API_PORT + host as u16)
    }

    fn data_dir(&self, host: usize) -> PathBuf {
        self.dir.join(format!("data{host}"))
    }

    fn write_config(&self, host: usize, lease: &LeaseSettings, etcd_url: &str) -> anyhow::Result<()> {
        let address = self.address(host);
        let api = format!("{address}:{}", FIRST_API_PORT + host as u16);
        let pg = format!("{address}:{}", FIRST_PG_PORT + host as u16);
        let user = serde_json::json!({"username": "postgres", "password": "bench"});
        let sockets = self.dir.join(format!("sockets{host}"));
        std::fs::create_dir_all(&sockets)?;
        // JSON is YAML: Patroni reads it as its configuration file.
        let config = serde_json::json!({
            "scope": "bench",
            "namespace": "/herd-bench/",
            "name": name(host),
            "restapi": {"listen": api, "connect_address": api},
            "etcd3": {"hosts": etcd_url.trim_start_matches("http://")},
            "bootstrap": {
                "dcs": {
                    "ttl": lease.duration.as_secs(),
                    "loop_wait": lease.retry_period.as_secs(),
                    "retry_timeout": lease.renew_deadline.as_secs(),
                    "synchronous_mode": true,
                    "synchronous_node_count": 2,
                    "postgresql": {
                        "use_pg_rewind": true,
                        "remove_data_directory_on_rewind_failure": true,
                        "remove_data_directory_on_diverged_timelines": true,
                        "parameters": {
                            "wal_level": "replica",
                            "hot_standby": "on",
                            "wal_log_hints": "on",
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_keep_size": "512MB",
                            "shared_buffers": "32MB",
                            "wal_sender_timeout": "5s",
                            "wal_receiver_timeout": "5s",
                            "wal_retrieve_retry_interval": "200ms"
                        }
                    }
                },
                "initdb": ["data-checksums", {"encoding": "UTF8"}]
            },
            "postgresql": {
                "listen": pg,
                "connect_address": pg,
                "data_dir": self.data_dir(host),
                "bin_dir": "/usr/lib/postgresql/15/bin",
                "pgpass": self.dir.join(format!("pgpass{host}")),
                "authentication": {"superuser": user, "replication": user, "rewind": user},
                "parameters": {"unix_socket_directories": sockets},
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host all all 10.213.0.0/16 trust",
                    "host replication all 10.213.0.0/16 trust"
                ]
            }
        });
        let path = self.dir.join(format!("{}.yml", name(host)));
        std::fs::write(&path, serde_json::to_string_pretty(&config)?)?;
        run(Command::new("chown").args(["-R", "postgres:postgres"]).arg(&sockets).arg(&path))
    }

    /// Starts host `host`'s Patroni as user postgres (host 0's inside the
    /// namespace), its log appended to `p<host>.log`.
    fn start_patroni(&self, host: usize) -> anyhow::Result<Child> {
        let setpriv = Path::new("/usr/bin/setpriv");
        let mut command = match host {
            0 => self.netns.command(setpriv),
            _ => Command::new(setpriv),
        };
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(format!("{}.log", name(host))))?;
        command
            .args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"])
            .arg(&self.patroni)
            .arg(self.dir.join(format!("{}.yml", name(host))))
            .env("HOME", &self.dir)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        command.spawn().with_context(|| format!("starting {}", self.patroni.display()))
    }

    /// Patroni's view of the cluster, from the first host that answers.
    async fn cluster(&self) -> Option<serde_json::Value> {
        for host in [1, 2, 0] {
            let answer = self.http.get(format!("{}/cluster", self.api(host))).send().await;
            if let Ok(cluster) = async { answer?.json::<serde_json::Value>().await }.await {
                return Some(cluster);
            }
        }
        None
    }

    /// The host of the leader, and how many standbys are synchronous
    /// and streaming.
    pub async fn leader(&self) -> Option<(usize, usize)> {
        let cluster = self.cluster().await?;
        let members = cluster["members"].as_array()?;
        let host_of = |m: &serde_json::Value| m["name"].as_str()?.strip_prefix('p')?.parse::<usize>().ok();
        let leader = members.iter().find(|m| m["role"] == "leader" && m["state"] == "running")?;
        let in_sync = members.iter().filter(|m| m["role"] == "sync_standby" && m["state"] == "streaming").count();
        Some((host_of(leader)?, in_sync))
    }

    pub fn targets(&self) -> Vec<Target> {
        (0..3)
            .map(|host| Target {
                host: self.address(host),
                port: FIRST_PG_PORT + host as u16,
                netns: (host == 0).then(|| self.netns.name.clone()),
            })
            .collect()
    }

    /// The postmaster's pid, from its pid file, if it still runs (a pid
    /// file left by one killed may name another process by now).
    fn postmaster(&self, host: usize) -> anyhow::Result<u32> {
        let data_dir = self.data_dir(host);
        let file = std::fs::read_to_string(data_dir.join("postmaster.pid"))?;
        let pid: u32 = file.lines().next().context("an empty postmaster.pid")?.trim().parse()?;
        let command_line = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&command_line).contains(&*data_dir.to_string_lossy()) {
            bail!("host {host}'s postmaster (pid {pid}) no longer runs");
        }
        Ok(pid)
    }

    pub fn crash(&self, host: usize) -> anyhow::Result<()> {
        signal_group(self.postmaster(host)?, false)
    }

    /// Patroni and every PostgreSQL process of the host die at once.
    pub fn lose_host(&mut self, host: usize) -> anyhow::Result<()> {
        let postmaster = self.postmaster(host);
        if let Some(mut patroni) = self.patronis[host].take() {
            patroni.kill()?;
            patroni.wait()?;
        }
        signal_group(postmaster?, true)
    }

    pub fn restore_host(&mut self, host: usize) -> anyhow::Result<()> {
        self.patronis[host] = Some(self.start_patroni(host)?);
        Ok(())
    }

    /// Asks the leader's Patroni for a switchover to host `to`
    /// (its REST API, as `patronictl switchover` does); it answers once the
    /// switchover is done. Asked again while Patroni finds the candidate
    /// not good yet (412: a standby just back may not have reported its
    /// position), for up to a minute: the primary takes writes meanwhile,
    /// so the outage measured does not grow.
    pub fn switchover(&self, from: usize, to: usize) -> impl Future<Output = anyhow::Result<()>> + Send + 'static {
        let body = serde_json::json!({"leader": name(from), "candidate": name(to)});
        let (http, url) = (self.http.clone(), format!("{}/switchover", self.api(from)));
        async move {
            let asked = std::time::Instant::now();
            loop {
                let answer = http.post(&url).json(&body).timeout(Duration::from_secs(60)).send().await?;
                let status = answer.status();
                if status.is_success() {
                    return Ok(());
                }
                let text = answer.text().await.unwrap_or_default();
                if status != reqwest::StatusCode::PRECONDITION_FAILED || asked.elapsed() > Duration::from_secs(60) {
                    bail!("Patroni refused the switchover: {status} {text}");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

impl Drop for PatroniSide {
    /// Ends etcd, every Patroni and every PostgreSQL process.
    fn drop(&mut self) {
        for host in 0..3 {
            let postmaster = self.postmaster(host);
            if let Some(mut patroni) = self.patronis.get_mut(host).and_then(Option::take) {
                let _ = patroni.kill();
                let _ = patroni.wait();
            }
            if let Ok(pid) = postmaster {
                let _ = signal_group(pid, true);
            }
        }
    }
}
