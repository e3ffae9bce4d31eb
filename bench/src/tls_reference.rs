//! A copy over TLS by standard tools, the fair baseline for a CopyVolume
//! over TLS on one host: `openssl s_server -WWW` serves the volume's
//! files on loopback (four of them: one s_server answers one connection at
//! a time), `curl` fetches them four at a time (as the copy worker does)
//! into a fresh directory, and `sync -f` waits for the disk.
//! Both ends run on this host's cores, as the two agents do; what it does
//! not do that herd does: hash and verify every file, journal, resume.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Files fetched at the same time, and servers answering them.
const AT_ONCE: usize = 4;

pub struct TlsReference {
    servers: Vec<(Child, u16)>,
    files: Vec<String>,
}

impl Drop for TlsReference {
    fn drop(&mut self) {
        for (server, _) in &mut self.servers {
            let _ = server.kill();
            let _ = server.wait();
        }
    }
}

fn run(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = command.stdout(Stdio::null()).stderr(Stdio::null()).status().with_context(|| what.to_string())?;
    if !status.success() {
        bail!("{what} failed: {status}");
    }
    Ok(())
}

impl TlsReference {
    /// Serves the files of `volume` (one level) with a fresh certificate
    /// kept in `work`; None when openssl or curl is missing.
    pub fn start(volume: &Path, work: &Path) -> anyhow::Result<Option<TlsReference>> {
        let found = |tool: &str, arg: &str| Command::new(tool).arg(arg).output().is_ok();
        if !found("curl", "--version") || !found("openssl", "version") {
            return Ok(None);
        }
        std::fs::create_dir_all(work)?;
        let (cert, key) = (work.join("cert.pem"), work.join("key.pem"));
        run(
            Command::new("openssl")
                .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"])
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&cert)
                .args(["-days", "1", "-subj", "/CN=localhost"]),
            "making a certificate with openssl",
        )?;
        let mut files: Vec<String> = std::fs::read_dir(volume)?
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let mut reference = TlsReference { servers: Vec::new(), files };
        for _ in 0..AT_ONCE {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let server = Command::new("openssl")
                .args(["s_server", "-WWW", "-quiet", "-accept", &format!("127.0.0.1:{port}")])
                .arg("-cert")
                .arg(&cert)
                .arg("-key")
                .arg(&key)
                .current_dir(volume)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting openssl s_server")?;
            reference.servers.push((server, port));
            let started = Instant::now();
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                if started.elapsed() > Duration::from_secs(10) {
                    bail!("openssl s_server did not start listening");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(Some(reference))
    }

    /// Fetches every file into `to` (made afresh) four at a time, then
    /// syncs; the time from the first request to the end of the sync.
    pub fn fetch_and_sync(&self, to: &Path) -> anyhow::Result<Duration> {
        let _ = std::fs::remove_dir_all(to);
        std::fs::create_dir_all(to)?;
        run(&mut Command::new("sync"), "sync")?;
        let started = Instant::now();
        let mut fetchers = Vec::new();
        for (group, (_, port)) in self.servers.iter().enumerate() {
            let mut curl = Command::new("curl");
            curl.args(["-sSfk", "--http1.1"]);
            for name in self.files.iter().skip(group).step_by(AT_ONCE) {
                curl.arg("-o").arg(to.join(name)).arg(format!("https://127.0.0.1:{port}/{name}"));
            }
            fetchers.push(curl.stdout(Stdio::null()).spawn().context("starting curl")?);
        }
        for mut fetcher in fetchers {
            if !fetcher.wait()?.success() {
                bail!("curl failed");
            }
        }
        run(Command::new("sync").arg("-f").arg(to), "sync -f")?;
        Ok(started.elapsed())
    }
}
