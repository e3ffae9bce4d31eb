//! Detached copy workers. A CopyVolume runs in a process of its own
//! (`herd agent-worker <job>`, in its own process group), which outlives
//! the agent: an agent that restarts re-attaches to it, and reads the
//! result it leaves in a file.
//!
//! The copy pulls the source's manifest, then each file into a staging
//! directory kept across attempts (`<data>/volumes/.incoming/<member>/<volume>`),
//! resuming a partial file from its length; every file is checked against
//! its blake3 hash, the source's manifest is read again at the end (a
//! source that changed meanwhile fails the copy), and only a complete,
//! verified copy is renamed into place.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use futures_util::StreamExt;
use herd_client::PeerClient;
use herd_core::api::{ManifestFile, VolumeManifest};
use herd_core::kinds::{Answer, AnswerDetails};
use herd_tls::ServingIdentity;
use serde::{Deserialize, Serialize};

use herd_core::units::human_bytes;

use crate::fsutil::{SpaceReserve, write_atomic};
use crate::volumes;

/// What a copy worker is asked to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyJob {
    /// The source agent's endpoint (`host:port`) and its node.
    pub source: String,
    pub source_node: String,
    /// The grants to read the volume there.
    pub grants: Vec<String>,
    /// This node's certificate and key (PEM), shown to the source; the
    /// job file has the key file's mode.
    pub certificate_chain: String,
    pub certificate_key: String,
    pub member: String,
    pub volume: String,
    pub staging: PathBuf,
    pub destination: PathBuf,
    /// Where the worker leaves its [`Answer`].
    pub result: PathBuf,
    /// At most this many bytes per second (None: as fast as it goes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<u64>,
    /// The node it copies to, for its messages.
    #[serde(default)]
    pub node: String,
    /// The agent's data dir, whose space reserve the result may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Where the worker writes the volume's size once it knows it
    /// ([`CopyTotal`]): with what is staged, the copy's progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<PathBuf>,
}

/// What a copy worker writes once it read the source's manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyTotal {
    pub bytes: u64,
}

/// A copy's progress as an agent reports it: the volume, the bytes staged
/// so far and the volume's size (once the worker knows it).
pub fn progress(job_path: &Path) -> Option<BTreeMap<String, String>> {
    let job: CopyJob = serde_json::from_slice(&std::fs::read(job_path).ok()?).ok()?;
    let staged = volumes::staged_bytes(&job.staging).ok()?;
    let mut progress = BTreeMap::from([
        ("volume".to_string(), format!("{}/{}", job.member, job.volume)),
        ("bytes".to_string(), staged.to_string()),
    ]);
    let total = job.total.and_then(|path| std::fs::read(path).ok());
    if let Some(total) = total.and_then(|text| serde_json::from_slice::<CopyTotal>(&text).ok()) {
        progress.insert("totalBytes".into(), total.bytes.to_string());
    }
    Some(progress)
}

/// Why a copy failed, and so what becomes of its staging area.
#[derive(Debug)]
enum CopyFailure {
    /// The source could not be read (unreachable, gone mid-way): what is
    /// staged stays, for a retry to resume from.
    Source(String),
    /// Anything here or about the data (a full disk, a failed check, a
    /// source that changed): the staging is removed.
    Local(String),
}

impl CopyFailure {
    /// A request to the source failed: resumable only when the source could
    /// not be reached; an answer that refuses (the volume is gone there)
    /// leaves nothing to resume.
    fn asking_source(message: String, error: &herd_client::ClientError) -> CopyFailure {
        match error {
            herd_client::ClientError::AgentUnreachable { .. } => CopyFailure::Source(message),
            _ => CopyFailure::Local(message),
        }
    }
}

impl From<String> for CopyFailure {
    fn from(message: String) -> Self {
        CopyFailure::Local(message)
    }
}

/// The failure of an IO step here, naming a full disk as such.
fn local_io(job: &CopyJob, what: &str, path: &Path) -> impl Fn(std::io::Error) -> CopyFailure + Send + use<> {
    let (what, node, data_dir) = (format!("{what} {}", path.display()), job.node.clone(), job.staging.clone());
    move |error| CopyFailure::Local(crate::fsutil::io_failure(&node, &data_dir, &what, &error))
}

/// The result a worker left, if it finished.
pub fn read_result(path: &Path) -> Option<Answer> {
    let text = std::fs::read(path).ok()?;
    serde_json::from_slice(&text).ok()
}

/// The worker process: runs the job in `job_path`, leaves the result next
/// to it, and exits 0 when the copy succeeded.
pub async fn main(job_path: &Path) -> i32 {
    let job: CopyJob = match std::fs::read(job_path)
        .map_err(|e| e.to_string())
        .and_then(|text| serde_json::from_slice(&text).map_err(|e| e.to_string()))
    {
        Ok(job) => job,
        Err(error) => {
            eprintln!("copy worker: reading {}: {error}", job_path.display());
            return 2;
        }
    };
    let answer = match copy(&job).await {
        Ok(answer) => answer,
        Err(CopyFailure::Source(why)) => {
            let staged = volumes::staged_bytes(&job.staging).unwrap_or(0);
            let kept = if staged > 0 {
                format!("; the {} copied so far are kept for a retry to resume", human_bytes(staged))
            } else {
                String::new()
            };
            Answer::said(false, format!("{why}{kept}"))
        }
        Err(CopyFailure::Local(why)) => {
            // Nothing to resume from: the space goes back at once.
            let removed = match remove_staging(&job.staging) {
                Ok(0) => String::new(),
                Ok(bytes) => format!("; the partial copy ({}) was removed", human_bytes(bytes)),
                Err(error) => format!("; removing the partial copy failed: {error}"),
            };
            Answer::said(false, format!("{why}{removed}"))
        }
    };
    // The data dir's reserve gives the result room on a full disk.
    let reserve = job.data_dir.as_deref().map(SpaceReserve::of);
    let written = serde_json::to_vec_pretty(&answer).map_err(std::io::Error::other).and_then(|json| match &reserve {
        Some(reserve) => reserve.write_atomic(&job.result, &json, 0o644),
        None => write_atomic(&job.result, &json, 0o644),
    });
    if let Err(error) = written {
        // Its log may sit on the same full disk: a failed write to it is
        // no reason to panic.
        let _ = writeln!(std::io::stderr(), "copy worker: writing the result: {error}");
        return 2;
    }
    if answer.success { 0 } else { 1 }
}

/// Fails at once when the volume cannot fit: what the source holds beyond
/// what is staged already, against the free space here.
fn check_space(job: &CopyJob, manifest: &VolumeManifest) -> Result<(), CopyFailure> {
    let staged = volumes::staged_bytes(&job.staging).unwrap_or(0);
    let needed = manifest.size.saturating_sub(staged);
    let room = job.staging.ancestors().find(|dir| dir.exists()).unwrap_or(Path::new("/"));
    let (free, _) = crate::fsutil::disk_space(room).map_err(local_io(job, "reading the free space of", room))?;
    if needed > free {
        return Err(CopyFailure::Local(format!(
            "no space left on {}'s data dir for volume {}/{}: needs {}, {} free",
            job.node,
            job.member,
            job.volume,
            human_bytes(needed),
            human_bytes(free)
        )));
    }
    Ok(())
}

async fn copy(job: &CopyJob) -> Result<Answer, CopyFailure> {
    let (member, volume) = (&job.member, &job.volume);
    // One copy of a volume at a time: a worker of an earlier attempt that
    // still runs finishes first.
    let lock = lock_staging(&job.staging).await?;
    let identity = ServingIdentity { chain_pem: job.certificate_chain.clone(), key_pem: job.certificate_key.clone() };
    let source = PeerClient::new(&job.source, &job.source_node, &identity, &job.grants)
        .map_err(|e| CopyFailure::Local(format!("talking to {}: {e}", job.source_node)))?;
    let manifest = source
        .manifest(member, volume)
        .await
        .map_err(|e| CopyFailure::asking_source(format!("reading the source manifest: {e}"), &e))?
        .ok_or_else(|| format!("volume {member}/{volume} does not exist on the source"))?;
    if job.destination.is_dir()
        && volumes::manifest(&job.destination).is_ok_and(|here| here.checksum == manifest.checksum)
    {
        let _ = std::fs::remove_dir_all(&job.staging);
        lock.release_and_remove();
        return Ok(done(job, &manifest, 0));
    }
    check_space(job, &manifest)?;
    std::fs::create_dir_all(&job.staging).map_err(local_io(job, "creating", &job.staging))?;
    if let Some(path) = &job.total {
        // Progress only: a copy goes on without it.
        let total = serde_json::to_vec(&CopyTotal { bytes: manifest.size }).unwrap_or_default();
        if let Err(error) = write_atomic(path, &total, 0o644) {
            tracing::warn!(%error, "could not write the copy's size for its progress");
        }
    }
    let pace = Pace::new(job.bandwidth);
    // A few files at once: the receiving, writing and hashing of one
    // overlap with another's.
    let fetches = futures_util::stream::iter(&manifest.files)
        .map(|file| copy_file(&source, job, file, &pace))
        .buffer_unordered(FILES_AT_ONCE);
    let fetched: Vec<u64> = fetches.collect::<Vec<_>>().await.into_iter().collect::<Result<_, CopyFailure>>()?;
    let fetched: u64 = fetched.into_iter().sum();
    // Every listed file is verified; anything else goes, so the copy holds
    // exactly the manifest.
    remove_extra_files(&job.staging, &manifest).map_err(local_io(job, "tidying", &job.staging))?;
    let again = source
        .manifest(member, volume)
        .await
        .map_err(|e| CopyFailure::asking_source(format!("reading the source manifest again: {e}"), &e))?;
    if again.as_ref().map(|m| &m.checksum) != Some(&manifest.checksum) {
        return Err(format!("volume {member}/{volume} changed on the source during the copy").into());
    }
    sync_directories(&job.staging).map_err(local_io(job, "syncing", &job.staging))?;
    install(&job.staging, &job.destination).map_err(local_io(
        job,
        "moving the copy into place at",
        &job.destination,
    ))?;
    lock.release_and_remove();
    Ok(done(job, &manifest, fetched))
}

/// The answer of a copy that holds the source's files.
fn done(job: &CopyJob, manifest: &VolumeManifest, fetched: u64) -> Answer {
    let details = AnswerDetails::Copied {
        checksum: manifest.checksum.clone(),
        size: Some(manifest.size),
        files: Some(manifest.files.len() as u64),
        bytes_fetched: Some(fetched),
    };
    let message =
        format!("copied volume {}/{}: {} bytes, checksum {}", job.member, job.volume, manifest.size, manifest.checksum);
    Answer { success: true, message, details }
}

/// The lock on a volume's staging area (`<staging>.lock`): one worker per
/// volume. A failed copy keeps it (with its staging area, to resume); an
/// installed one removes it.
struct StagingLock {
    file: std::fs::File,
    path: PathBuf,
}

impl StagingLock {
    /// Removes the lock file while still holding it, then unlocks: a
    /// worker waiting on the removed file sees that and takes a new one.
    fn release_and_remove(self) {
        let _ = std::fs::remove_file(&self.path);
        drop(self.file);
    }
}

/// Waits for the lock on a volume's staging area.
async fn lock_staging(staging: &Path) -> Result<StagingLock, String> {
    use std::os::unix::fs::MetadataExt;
    let parent = staging.parent().ok_or("the staging directory has no parent")?;
    std::fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    let path = lock_path(staging).ok_or("the staging directory has no name")?;
    loop {
        let file = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| format!("opening {}: {e}", path.display()))?;
        let file = tokio::task::spawn_blocking(move || file.lock().map(|()| file))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("locking {}: {e}", path.display()))?;
        // The worker before may have removed the file once its copy was
        // installed: a lock on a removed file guards nothing.
        let held = file.metadata().map_err(|e| format!("locking {}: {e}", path.display()))?;
        if std::fs::metadata(&path).is_ok_and(|now| (now.dev(), now.ino()) == (held.dev(), held.ino())) {
            return Ok(StagingLock { file, path });
        }
    }
}

/// Removes a staging area and its lock file (no worker may hold it: the
/// copy failed, or its worker was ended); returns the bytes it held.
pub fn remove_staging(staging: &Path) -> std::io::Result<u64> {
    let bytes = volumes::staged_bytes(staging).unwrap_or(0);
    match std::fs::remove_dir_all(staging) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    if let Some(lock) = lock_path(staging) {
        let _ = std::fs::remove_file(lock);
    }
    Ok(bytes)
}

/// Removes the lock files under `incoming` that guard no staging area and
/// that no worker holds: a worker that died between installing its copy
/// and removing its lock, or before it staged anything, leaves one behind.
/// A lock beside a staging area stays (a later copy resumes from it).
/// Returns how many went.
pub fn remove_stale_locks(incoming: &Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let files_in = |dir: &Path| std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path());
    let mut removed = 0;
    for member in files_in(incoming).filter(|p| p.is_dir()) {
        for lock in files_in(&member).filter(|p| p.extension().is_some_and(|e| e == "lock")) {
            let staging = lock.with_extension("");
            // Opened without create: a lock removed meanwhile is not made again.
            let Ok(file) = std::fs::File::open(&lock) else { continue };
            if staging.exists() || file.try_lock().is_err() {
                continue;
            }
            // Held now, so no worker stages meanwhile; still the same file?
            let same = file.metadata().ok().map(|m| (m.dev(), m.ino()))
                == std::fs::metadata(&lock).ok().map(|m| (m.dev(), m.ino()));
            if same && !staging.exists() && std::fs::remove_file(&lock).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// `<staging>.lock`, beside the staging area.
fn lock_path(staging: &Path) -> Option<PathBuf> {
    let mut name = staging.file_name()?.to_os_string();
    name.push(".lock");
    Some(staging.with_file_name(name))
}

/// Files fetched at the same time.
const FILES_AT_ONCE: usize = 4;

/// Brings one file of the manifest into the staging area and verifies it;
/// returns the bytes fetched.
async fn copy_file(source: &PeerClient, job: &CopyJob, file: &ManifestFile, pace: &Pace) -> Result<u64, CopyFailure> {
    let target =
        volumes::inside(&job.staging, &file.path).ok_or(format!("the source listed a bad path {:?}", file.path))?;
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(local_io(job, "creating", parent))?;
    }
    // Twice at most: a resumed file that does not verify is fetched whole.
    let mut fetched = 0;
    for _ in 0..2 {
        let (bytes, size, hash) = fetch(source, job, &file.path, file.size, &target, pace).await?;
        fetched += bytes;
        if size == file.size && hash == file.blake3 {
            return Ok(fetched);
        }
        std::fs::remove_file(&target).map_err(local_io(job, "removing", &target))?;
    }
    Err(format!("{} does not match the source's checksum after two tries", file.path).into())
}

/// Brings `target` to `size` bytes from the source, resuming from what it
/// holds; returns the bytes fetched, and the size and blake3 hash of the
/// whole file (hashed as it arrives: the bytes are not read again).
async fn fetch(
    source: &PeerClient,
    job: &CopyJob,
    path: &str,
    size: u64,
    target: &Path,
    pace: &Pace,
) -> Result<(u64, u64, String), CopyFailure> {
    let have = std::fs::metadata(target).map(|m| m.len()).unwrap_or(0);
    let from = if have <= size { have } else { 0 };
    let mut hasher = blake3::Hasher::new();
    if from > 0 {
        volumes::hash_into(target, &mut hasher).map_err(local_io(job, "hashing", target))?;
    }
    if from == size {
        // Fetched whole by an earlier attempt (perhaps not yet on disk), or
        // an empty file, made here (opened to append: nothing is cut).
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(target)
            .and_then(|file| file.sync_data())
            .map_err(local_io(job, "syncing", target))?;
        return Ok((0, size, hasher.finalize().to_hex().to_string()));
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(from > 0)
        .write(true)
        .truncate(from == 0)
        .open(target)
        .map_err(local_io(job, "opening", target))?;
    let response = source
        .file(&job.member, &job.volume, path, from)
        .await
        .map_err(|e| CopyFailure::asking_source(format!("fetching {path}: {e}"), &e))?;
    // Writing and hashing run on a thread of their own, so that receiving
    // the next chunks overlaps with them.
    let (chunks, mut received) = tokio::sync::mpsc::channel::<bytes::Bytes>(64);
    let failed_write = local_io(job, "writing", target);
    let writer = tokio::task::spawn_blocking(move || {
        // Chunks come gathered (see below), larger than this buffer: they
        // are written straight from memory.
        let mut file = std::io::BufWriter::with_capacity(64 << 10, file);
        let mut written = 0u64;
        let mut flushing = 0u64;
        while let Some(chunk) = received.blocking_recv() {
            file.write_all(&chunk).map_err(&failed_write)?;
            hasher.update(&chunk);
            written += chunk.len() as u64;
            if written - flushing >= WRITEBACK_WINDOW {
                file.flush().map_err(&failed_write)?;
                start_writeback(file.get_ref(), from + flushing, written - flushing);
                flushing = written;
            }
        }
        file.flush().map_err(&failed_write)?;
        // On disk before the copy is installed; most of it is already
        // written by now.
        file.get_ref().sync_data().map_err(&failed_write)?;
        Ok::<_, CopyFailure>((written, hasher))
    });
    // Over TLS a chunk is one record (16 KiB): handing each to the writer
    // would wake its thread 65,000 times a GiB. They are gathered into
    // pieces of GATHERED bytes first (one copy, which the writer's buffer
    // no longer makes).
    let mut body = response.bytes_stream();
    let mut gathered = bytes::BytesMut::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| CopyFailure::Source(format!("fetching {path}: {e}")))?;
        pace.after(chunk.len() as u64).await;
        let piece = if gathered.is_empty() && chunk.len() >= GATHERED {
            chunk
        } else {
            if gathered.capacity() == 0 {
                gathered.reserve(2 * GATHERED);
            }
            gathered.extend_from_slice(&chunk);
            if gathered.len() < GATHERED {
                continue;
            }
            gathered.split().freeze()
        };
        if chunks.send(piece).await.is_err() {
            break;
        }
    }
    if !gathered.is_empty() {
        let _ = chunks.send(gathered.freeze()).await;
    }
    drop(chunks);
    let (fetched, hasher) = writer.await.map_err(|e| format!("writing {}: {e}", target.display()))??;
    Ok((fetched, from + fetched, hasher.finalize().to_hex().to_string()))
}

/// The size of the pieces received chunks are gathered into before they
/// are written and hashed.
const GATHERED: usize = 512 << 10;

/// Written bytes after which the disk is asked to start writing them.
const WRITEBACK_WINDOW: u64 = 8 << 20;

/// Asks the kernel to start writing a range of `file` to disk without
/// waiting for it: the disk writes while the network receives, and the
/// sync at the end finds little left to do.
fn start_writeback(file: &std::fs::File, offset: u64, length: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a descriptor we hold open; the call only starts writeback.
    // A failure is harmless: the final sync writes what this did not.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset as i64, length as i64, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Keeps a copy (all its files together) under its bandwidth limit.
struct Pace {
    limit: Option<u64>,
    started: std::time::Instant,
    bytes: std::sync::atomic::AtomicU64,
}

impl Pace {
    fn new(limit: Option<u64>) -> Self {
        Pace { limit, started: std::time::Instant::now(), bytes: Default::default() }
    }

    async fn after(&self, bytes: u64) {
        let Some(limit) = self.limit.filter(|l| *l > 0) else { return };
        let total = self.bytes.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed) + bytes;
        let due = std::time::Duration::from_secs_f64(total as f64 / limit as f64);
        if let Some(ahead) = due.checked_sub(self.started.elapsed()) {
            tokio::time::sleep(ahead).await;
        }
    }
}

/// Removes what the staging copy holds beyond the manifest (left by an
/// earlier attempt of a source that changed since).
fn remove_extra_files(staging: &Path, manifest: &VolumeManifest) -> std::io::Result<()> {
    let wanted: std::collections::BTreeSet<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    for (path, _) in volumes::files(staging)? {
        if !wanted.contains(path.as_str()) {
            std::fs::remove_file(staging.join(&path))?;
        }
    }
    Ok(())
}

/// Syncs every directory of the staging copy (its files are synced as
/// they are completed), so that the names are on disk before the rename.
/// Only this copy's: a whole-filesystem sync would wait for whatever else
/// is writing to the disk.
fn sync_directories(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            sync_directories(&entry.path())?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

/// Renames the verified copy into place, replacing what was there.
fn install(staging: &Path, destination: &Path) -> std::io::Result<()> {
    let parent = destination.parent().ok_or_else(|| std::io::Error::other("the destination has no parent"))?;
    std::fs::create_dir_all(parent)?;
    let replaced = destination.with_extension(format!("replaced-{}", std::process::id()));
    if destination.exists() {
        std::fs::rename(destination, &replaced)?;
    }
    std::fs::rename(staging, destination)?;
    std::fs::File::open(parent)?.sync_all()?;
    if replaced.exists() {
        std::fs::remove_dir_all(&replaced)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_removed_staging_lock_is_not_held_twice() {
        let dir = tempfile::tempdir().unwrap();
        let staging = dir.path().join("m1").join("data.v2");
        let first = lock_staging(&staging).await.unwrap();
        assert!(dir.path().join("m1/data.v2.lock").exists(), "the lock sits beside the staging area, dots kept");
        // Two more wait; the first finishes its copy and removes the file.
        let second = tokio::spawn({
            let staging = staging.clone();
            async move { lock_staging(&staging).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        first.release_and_remove();
        let second = tokio::time::timeout(Duration::from_secs(5), second).await.unwrap().unwrap();
        let third = tokio::spawn({
            let staging = staging.clone();
            async move { lock_staging(&staging).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!third.is_finished(), "the third waits while the second holds the lock");
        second.release_and_remove();
        let third = tokio::time::timeout(Duration::from_secs(5), third).await.unwrap().unwrap();
        assert!(third.path.exists());
        third.release_and_remove();
        assert!(!dir.path().join("m1/data.v2.lock").exists(), "an installed copy leaves no lock file");
    }

    #[tokio::test]
    async fn a_lock_that_guards_nothing_is_removed_unless_held() {
        let dir = tempfile::tempdir().unwrap();
        let (orphan, resumable, held) =
            (dir.path().join("m1/data"), dir.path().join("m2/data"), dir.path().join("m3/data"));
        // A worker died after installing m1's copy; m2's copy is partial.
        drop(lock_staging(&orphan).await.unwrap());
        drop(lock_staging(&resumable).await.unwrap());
        std::fs::create_dir_all(&resumable).unwrap();
        let holder = lock_staging(&held).await.unwrap();
        assert_eq!(remove_stale_locks(dir.path()), 1);
        assert!(!dir.path().join("m1/data.lock").exists(), "the orphaned lock goes");
        assert!(dir.path().join("m2/data.lock").exists(), "a partial copy keeps its lock");
        assert!(dir.path().join("m3/data.lock").exists(), "a held lock stays");
        holder.release_and_remove();
        assert_eq!(remove_stale_locks(&dir.path().join("missing")), 0);
    }
}
