//! Helpers for tests that run real `herd` processes on loopback. Every
//! process a test starts is killed and reaped when its handle drops, also
//! when the test fails.

pub mod apps;
pub mod browser;
pub mod budgets;
pub mod cluster;
pub use herd_bench::netns;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use herd_client::Client;

pub const ADMIN_TOKEN: &str = "test-admin-token";
pub const JOIN_TOKEN: &str = "test-join-token";

/// The CA hashes of every server this test process started: `herd`
/// commands (CLI and agents) trust all of them, as `--ca-hash` allows.
static CA_HASHES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn known_ca_hashes() -> String {
    CA_HASHES.lock().map(|hashes| hashes.join(",")).unwrap_or_default()
}

/// The `herd` binary, trusting the CAs of the servers this process started.
pub fn herd() -> Command {
    let mut command = herd_trusting_nothing();
    let hashes = known_ca_hashes();
    if !hashes.is_empty() {
        command.env("HERD_CA_HASH", hashes);
    }
    command
}

/// The `herd` binary with no CA to trust but what the caller gives it.
pub fn herd_trusting_nothing() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_herd"));
    command.env_remove("HERD_CA_HASH").env_remove("HERD_CA_FILE");
    command
}

/// A child process that is killed (SIGKILL) and reaped on drop.
pub struct Proc {
    pub child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    pub fn spawn(mut command: Command) -> Proc {
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = command.spawn().expect("the herd binary starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc { child, lines }
    }

    /// Waits for a stdout line containing `marker`; returns the line.
    pub fn wait_for_line(&mut self, marker: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(marker) => return line,
                Ok(_) => {}
                Err(_) => panic!("no line containing {marker:?} within {timeout:?}"),
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends a signal to the process (SIGINT, SIGTERM, SIGSTOP...).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([&format!("-{signal}"), &self.pid().to_string()]).status().unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "process {} did not exit within {timeout:?}", self.pid());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A `herd server` process on 127.0.0.1 with a port of its own.
pub struct TestServer {
    pub proc: Proc,
    pub url: String,
    pub data_dir: PathBuf,
    /// The cluster CA's hash (None for a plain-HTTP server).
    pub ca_hash: Option<String>,
}

impl TestServer {
    /// Runs the CLI against this server as the admin (no config file
    /// read), waiting for it to end.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        herd()
            .args(["--server", &self.url, "--token", ADMIN_TOKEN])
            .args(args)
            .env("HERD_CONFIG", "/nonexistent/herd-config.yaml")
            .output()
            .unwrap()
    }

    /// [`TestServer::cli`] off the test's runtime, for a command that
    /// follows something for a while (a drain, a restart).
    pub async fn cli_blocking(&self, args: &[&str]) -> std::process::Output {
        let (url, args) = (self.url.clone(), args.iter().map(|a| a.to_string()).collect::<Vec<_>>());
        tokio::task::spawn_blocking(move || {
            herd()
                .args(["--server", &url, "--token", ADMIN_TOKEN])
                .args(&args)
                .env("HERD_CONFIG", "/nonexistent/herd-config.yaml")
                .output()
                .unwrap()
        })
        .await
        .unwrap()
    }

    pub fn start(data_dir: &Path) -> TestServer {
        Self::start_at(data_dir, "127.0.0.1:0")
    }

    pub fn start_at(data_dir: &Path, listen: &str) -> TestServer {
        Self::start_with(data_dir, listen, &[])
    }

    /// A replica with a name of its own in the leader election, on the
    /// SQLite store in `data_dir` or on `store` (a PostgreSQL URL), with
    /// `flags` added to its command line.
    pub fn start_replica(data_dir: &Path, identity: &str, store: Option<&str>, flags: &[&str]) -> TestServer {
        let mut args = vec!["--identity", identity];
        if let Some(url) = store {
            args.extend(["--store", url]);
        }
        args.extend(flags);
        Self::start_with(data_dir, "127.0.0.1:0", &args)
    }

    /// A replica as [`Self::start_replica`] whose wall clock is off by
    /// `offset` (libfaketime's syntax, `-1h`); its monotonic clock is true.
    /// None (said loudly) where libfaketime is missing outside CI; in CI,
    /// whose .ci/run installs it, a missing one fails the test.
    pub fn start_skewed_replica(
        data_dir: &Path,
        identity: &str,
        store: Option<&str>,
        offset: &str,
    ) -> Option<TestServer> {
        let library = [
            "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
            "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        ]
        .into_iter()
        .find(|path| Path::new(path).exists());
        let Some(library) = library else {
            assert!(std::env::var_os("CI").is_none(), "libfaketime is missing: .ci/run must install faketime");
            eprintln!("!!! SKIPPED: libfaketime is not installed (apt-get install faketime); this test did not run");
            return None;
        };
        let mut command = herd();
        command.env("LD_PRELOAD", library).env("FAKETIME", offset).env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        let mut args = vec!["--identity", identity];
        if let Some(url) = store {
            args.extend(["--store", url]);
        }
        Some(Self::start_command(command, data_dir, "127.0.0.1:0", &args))
    }

    pub fn start_with(data_dir: &Path, listen: &str, extra: &[&str]) -> TestServer {
        Self::start_command(herd(), data_dir, listen, extra)
    }

    fn start_command(mut command: Command, data_dir: &Path, listen: &str, extra: &[&str]) -> TestServer {
        command.args(["server", "--listen", listen]).args(extra).arg("--data-dir").arg(data_dir);
        command.env("HERD_ADMIN_TOKEN", ADMIN_TOKEN).env("HERD_JOIN_TOKEN", JOIN_TOKEN).env_remove("HERD_STORE");
        let insecure = extra.contains(&"--insecure-http");
        let mut proc = Proc::spawn(command);
        let line = proc.wait_for_line("listening on", Duration::from_secs(30));
        let url = line.rsplit(' ').next().unwrap().to_string();
        let ca_hash = (!insecure).then(|| {
            let line = proc.wait_for_line("cluster CA: ", Duration::from_secs(5));
            let hash = line.split_whitespace().nth(2).unwrap().to_string();
            let mut known = CA_HASHES.lock().unwrap();
            if !known.contains(&hash) {
                known.push(hash.clone());
            }
            hash
        });
        TestServer { proc, url, data_dir: data_dir.to_path_buf(), ca_hash }
    }

    /// What a client of this server trusts.
    pub fn trust(&self) -> Option<herd_tls::Trust> {
        self.ca_hash.as_ref().map(|hash| herd_tls::Trust::Pinned(vec![hash.parse().unwrap()]))
    }

    /// A client of these servers (all of one cluster) trusting its CA.
    pub fn client_for(&self, servers: Vec<String>, token: Option<String>) -> Client {
        let client = Client::new(servers, token);
        match self.trust() {
            Some(trust) => client.with_trust(&trust).unwrap(),
            None => client,
        }
    }

    pub fn admin(&self) -> Client {
        self.client_for(vec![self.url.clone()], Some(ADMIN_TOKEN.into()))
    }

    pub fn anonymous(&self) -> Client {
        self.client_for(vec![self.url.clone()], None)
    }

    /// A raw HTTP client trusting this server's CA, for requests the typed
    /// client would not send.
    pub fn raw_http(&self) -> reqwest::Client {
        herd_tls::install_provider();
        let builder = reqwest::Client::builder();
        let builder = match self.trust() {
            Some(trust) => builder.tls_backend_preconfigured(herd_tls::client_config(&trust).unwrap()),
            None => builder,
        };
        builder.build().unwrap()
    }

    /// The address part, to restart on the same port.
    pub fn listen_addr(&self) -> String {
        self.url.trim_start_matches("https://").trim_start_matches("http://").to_string()
    }
}

/// A `herd agent` process.
pub fn start_agent(server_url: &str, data_dir: &Path, name: &str) -> Proc {
    start_agent_with(server_url, data_dir, name, &[])
}

/// A `herd agent` process with `flags` added.
pub fn start_agent_with(server_url: &str, data_dir: &Path, name: &str, flags: &[&str]) -> Proc {
    let mut command = herd();
    command.args(["agent", "--server", server_url, "--name", name]).args(flags).arg("--data-dir").arg(data_dir);
    command.env("HERD_JOIN_TOKEN", JOIN_TOKEN);
    Proc::spawn(command)
}

/// Polls `check` until it returns Some, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The first Event that `matches`, waited for: an Event is written after
/// the change it tells of, so a test that saw the change may list Events
/// a moment before it is there.
pub async fn event_where(
    admin: &Client,
    what: &str,
    matches: impl Fn(&herd_core::Object<herd_core::kinds::EventSpec>) -> bool,
) -> herd_core::Object<herd_core::kinds::EventSpec> {
    eventually(Duration::from_secs(5), what, || async {
        admin.list::<herd_core::kinds::EventSpec>("").await.ok()?.into_iter().find(|e| matches(e))
    })
    .await
}

/// A fresh PostgreSQL schema for one test, dropped afterwards. None (said
/// loudly) when HERD_TEST_POSTGRES_URL is not set outside CI; in CI a
/// missing database fails the test.
pub struct PostgresSchema {
    base: String,
    schema: String,
    pub url: String,
}

impl PostgresSchema {
    pub fn create() -> Option<PostgresSchema> {
        let Ok(base) = std::env::var("HERD_TEST_POSTGRES_URL") else {
            if std::env::var_os("CI").is_some() {
                panic!("HERD_TEST_POSTGRES_URL is not set: CI must run the PostgreSQL tests");
            }
            eprintln!("!!! SKIPPED: HERD_TEST_POSTGRES_URL is not set; this PostgreSQL test did not run");
            return None;
        };
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seconds = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let schema = format!("herd_test_{}_{n}_{seconds}", std::process::id());
        let status =
            Command::new("psql").args([base.as_str(), "-qc", &format!("CREATE SCHEMA {schema}")]).status().unwrap();
        assert!(status.success(), "could not create schema {schema}");
        let separator = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{separator}options=-csearch_path%3D{schema}");
        Some(PostgresSchema { base, schema, url })
    }
}

impl Drop for PostgresSchema {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([self.base.as_str(), "-qc", &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema)])
            .env("PGOPTIONS", "--client-min-messages=warning")
            .status();
    }
}

/// Kills, on drop, the process group of every member an agent recorded in
/// `agent_dir`: members outlive their agent by design, so a test must end
/// them itself, also when it fails.
pub struct MemberReaper(pub PathBuf);

impl Drop for MemberReaper {
    fn drop(&mut self) {
        let kill_group = |pid: u64| Command::new("kill").args(["-s", "KILL", "--", &format!("-{pid}")]).status();
        if let Ok(dirs) = std::fs::read_dir(self.0.join("members")) {
            for dir in dirs.flatten() {
                let Ok(text) = std::fs::read_to_string(dir.path().join("member.json")) else { continue };
                let Ok(record) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
                if let Some(pid) = record.pointer("/process/pid").and_then(serde_json::Value::as_u64) {
                    let _ = kill_group(pid);
                }
            }
        }
        // A member started just before its agent was killed may not have
        // been recorded: find it by its working directory, in the data dir.
        for (pid, _) in member_processes(&self.0) {
            let _ = kill_group(pid);
        }
        herd_agent::cgroups::remove_left(&self.0);
    }
}

/// The processes working in a member directory of the agent data dir
/// `data_dir`, with the member each belongs to (by its working directory),
/// whether or not the agent recorded them.
pub fn member_processes(data_dir: &std::path::Path) -> Vec<(u64, String)> {
    let members = data_dir.join("members");
    let Ok(processes) = std::fs::read_dir("/proc") else { return Vec::new() };
    processes
        .flatten()
        .filter_map(|process| {
            let pid = process.file_name().to_str()?.parse::<u64>().ok()?;
            let cwd = std::fs::read_link(process.path().join("cwd")).ok()?;
            let member = cwd.strip_prefix(&members).ok()?.iter().next()?.to_str()?.to_string();
            Some((pid, member))
        })
        .collect()
}

/// A small tmpfs mounted for one test (CI runs as root); unmounted on drop.
pub struct SmallDisk(PathBuf);

impl SmallDisk {
    pub fn mount(path: &Path, megabytes: u64) -> SmallDisk {
        std::fs::create_dir_all(path).unwrap();
        let size = format!("size={megabytes}m");
        let status =
            std::process::Command::new("mount").args(["-t", "tmpfs", "-o", &size, "tmpfs"]).arg(path).status().unwrap();
        assert!(status.success(), "this test mounts a {megabytes} MB tmpfs and needs root to");
        SmallDisk(path.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A process on this host, with its environment.
#[derive(Clone, Debug)]
pub struct HostProcess {
    pub pid: u32,
    pub command: String,
    pub env: std::collections::BTreeMap<String, String>,
}

/// Every live process on the host whose environment holds `key=value`
/// (zombies, which hold nothing, are left out).
pub fn host_processes_with(key: &str, value: &str) -> Vec<HostProcess> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            if stat.get(stat.rfind(')')? + 2..)?.starts_with('Z') {
                return None;
            }
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            let env: std::collections::BTreeMap<String, String> = environ
                .split(|b| *b == 0)
                .filter_map(|pair| {
                    let pair = String::from_utf8_lossy(pair);
                    let (k, v) = pair.split_once('=')?;
                    Some((k.to_string(), v.to_string()))
                })
                .collect();
            if env.get(key).map(String::as_str) != Some(value) {
                return None;
            }
            let command = std::fs::read(entry.path().join("cmdline")).ok()?;
            let command = String::from_utf8_lossy(&command).replace('\0', " ").trim().to_string();
            Some(HostProcess { pid, command, env })
        })
        .collect()
}

/// The tests that load the machine or time it take turns: the browser
/// tests (Chromium, and a thousand simulated nodes for one), the
/// PostgreSQL tests (three servers failing over), the CPU share and the
/// chaos soak.
/// Side by side under a busy test run they starved each other's pages past
/// their waits, and a loaded machine skews a page's measured cost. Hold
/// the guard for the whole test.
pub async fn take_turn() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}
