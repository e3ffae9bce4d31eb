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
use herd_core::kinds::Answer;
use serde::{Deserialize, Serialize};

use crate::fsutil::write_atomic;
use crate::volumes;

/// What a copy worker is asked to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyJob {
    /// The source agent's endpoint (`host:port`).
    pub source: String,
    pub peer_token: String,
    pub member: String,
    pub volume: String,
    pub staging: PathBuf,
    pub destination: PathBuf,
    /// Where the worker leaves its [`Answer`].
    pub result: PathBuf,
    /// At most this many bytes per second (None: as fast as it goes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<u64>,
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
        Err(why) => Answer { success: false, message: why, details: BTreeMap::new() },
    };
    let json = serde_json::to_vec_pretty(&answer).expect("an answer always serialises");
    if let Err(error) = write_atomic(&job.result, &json, 0o644) {
        eprintln!("copy worker: writing the result: {error}");
        return 2;
    }
    if answer.success { 0 } else { 1 }
}

async fn copy(job: &CopyJob) -> Result<Answer, String> {
    let (member, volume) = (&job.member, &job.volume);
    // One copy of a volume at a time: a worker of an earlier attempt that
    // still runs finishes first.
    let lock = lock_staging(&job.staging).await?;
    let source = PeerClient::new(&job.source, &job.peer_token);
    let manifest = source
        .manifest(member, volume)
        .await
        .map_err(|e| format!("reading the source manifest: {e}"))?
        .ok_or_else(|| format!("volume {member}/{volume} does not exist on the source"))?;
    if job.destination.is_dir()
        && volumes::manifest(&job.destination).is_ok_and(|here| here.checksum == manifest.checksum)
    {
        let _ = std::fs::remove_dir_all(&job.staging);
        lock.release_and_remove();
        return Ok(done(job, &manifest, 0));
    }
    std::fs::create_dir_all(&job.staging).map_err(|e| format!("creating {}: {e}", job.staging.display()))?;
    let pace = Pace::new(job.bandwidth);
    // A few files at once: the receiving, writing and hashing of one
    // overlap with another's.
    let fetches = futures_util::stream::iter(&manifest.files)
        .map(|file| copy_file(&source, job, file, &pace))
        .buffer_unordered(FILES_AT_ONCE);
    let fetched: Vec<u64> = fetches.collect::<Vec<_>>().await.into_iter().collect::<Result<_, String>>()?;
    let fetched: u64 = fetched.into_iter().sum();
    // Every listed file is verified; anything else goes, so the copy holds
    // exactly the manifest.
    remove_extra_files(&job.staging, &manifest).map_err(|e| format!("tidying the staging copy: {e}"))?;
    let again = source.manifest(member, volume).await.map_err(|e| format!("reading the source manifest again: {e}"))?;
    if again.as_ref().map(|m| &m.checksum) != Some(&manifest.checksum) {
        return Err(format!("volume {member}/{volume} changed on the source during the copy"));
    }
    sync_directories(&job.staging).map_err(|e| format!("syncing the copy: {e}"))?;
    install(&job.staging, &job.destination).map_err(|e| format!("moving the copy into place: {e}"))?;
    lock.release_and_remove();
    Ok(done(job, &manifest, fetched))
}

/// The answer of a copy that holds the source's files.
fn done(job: &CopyJob, manifest: &VolumeManifest, fetched: u64) -> Answer {
    let details = BTreeMap::from([
        ("size".to_string(), manifest.size.to_string()),
        ("checksum".to_string(), manifest.checksum.clone()),
        ("files".to_string(), manifest.files.len().to_string()),
        ("bytesFetched".to_string(), fetched.to_string()),
    ]);
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
    let mut name = staging.file_name().ok_or("the staging directory has no name")?.to_os_string();
    name.push(".lock");
    let path = parent.join(name);
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

/// Files fetched at the same time.
const FILES_AT_ONCE: usize = 4;

/// Brings one file of the manifest into the staging area and verifies it;
/// returns the bytes fetched.
async fn copy_file(source: &PeerClient, job: &CopyJob, file: &ManifestFile, pace: &Pace) -> Result<u64, String> {
    let target =
        volumes::inside(&job.staging, &file.path).ok_or(format!("the source listed a bad path {:?}", file.path))?;
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    }
    // Twice at most: a resumed file that does not verify is fetched whole.
    let mut fetched = 0;
    for _ in 0..2 {
        let (bytes, size, hash) = fetch(source, job, &file.path, file.size, &target, pace).await?;
        fetched += bytes;
        if size == file.size && hash == file.blake3 {
            return Ok(fetched);
        }
        std::fs::remove_file(&target).map_err(|e| format!("removing {}: {e}", target.display()))?;
    }
    Err(format!("{} does not match the source's checksum after two tries", file.path))
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
) -> Result<(u64, u64, String), String> {
    let have = std::fs::metadata(target).map(|m| m.len()).unwrap_or(0);
    let from = if have <= size { have } else { 0 };
    let mut hasher = blake3::Hasher::new();
    if from > 0 {
        volumes::hash_into(target, &mut hasher).map_err(|e| format!("hashing {}: {e}", target.display()))?;
    }
    if from == size {
        // Fetched whole by an earlier attempt, perhaps not yet on disk.
        std::fs::File::open(target)
            .and_then(|file| file.sync_data())
            .map_err(|e| format!("syncing {}: {e}", target.display()))?;
        return Ok((0, size, hasher.finalize().to_hex().to_string()));
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(from > 0)
        .write(true)
        .truncate(from == 0)
        .open(target)
        .map_err(|e| format!("opening {}: {e}", target.display()))?;
    let response =
        source.file(&job.member, &job.volume, path, from).await.map_err(|e| format!("fetching {path}: {e}"))?;
    // Writing and hashing run on a thread of their own, so that receiving
    // the next chunks overlaps with them.
    let (chunks, mut received) = tokio::sync::mpsc::channel::<bytes::Bytes>(64);
    let shown = target.display().to_string();
    let writer = tokio::task::spawn_blocking(move || {
        // Chunks as large as the buffer (most are: a few hundred KiB) are
        // written straight from the network's buffer; small ones are
        // gathered first.
        let mut file = std::io::BufWriter::with_capacity(64 << 10, file);
        let mut written = 0u64;
        let mut flushing = 0u64;
        while let Some(chunk) = received.blocking_recv() {
            file.write_all(&chunk).map_err(|e| format!("writing {shown}: {e}"))?;
            hasher.update(&chunk);
            written += chunk.len() as u64;
            if written - flushing >= WRITEBACK_WINDOW {
                file.flush().map_err(|e| format!("writing {shown}: {e}"))?;
                start_writeback(file.get_ref(), from + flushing, written - flushing);
                flushing = written;
            }
        }
        file.flush().map_err(|e| format!("writing {shown}: {e}"))?;
        // On disk before the copy is installed; most of it is already
        // written by now.
        file.get_ref().sync_data().map_err(|e| format!("syncing {shown}: {e}"))?;
        Ok::<_, String>((written, hasher))
    });
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| format!("fetching {path}: {e}"))?;
        let length = chunk.len() as u64;
        if chunks.send(chunk).await.is_err() {
            break;
        }
        pace.after(length).await;
    }
    drop(chunks);
    let (fetched, hasher) = writer.await.map_err(|e| format!("writing {}: {e}", target.display()))??;
    Ok((fetched, from + fetched, hasher.finalize().to_hex().to_string()))
}

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
}
