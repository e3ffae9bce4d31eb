//! Crash-safe file writes: a reader sees the old content or the new, never
//! a mix, and a write that returned survives power loss.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What marks the temporary file of a write in progress.
const TEMP_MARK: &str = ".tmp-";

/// Removes the temporary files of writes that a crash cut short (before
/// their rename): the file they were to replace still holds the state
/// before, which is the truth. Returns how many were removed.
pub fn remove_torn_writes(dir: &Path) -> std::io::Result<usize> {
    let mut removed = 0;
    for item in fs::read_dir(dir)? {
        let path = item?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with('.') && name.contains(TEMP_MARK) {
            fs::remove_file(&path)?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Writes `contents` to `path` atomically: temp file, fsync, rename, fsync
/// of the directory. `mode` sets the permission bits (0o600 for secrets).
/// A write that fails (a full disk, say) leaves no temp file behind.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let temp = dir.join(format!(".{name}{TEMP_MARK}{}", std::process::id()));
    let written = (|| {
        let mut file = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&temp)?;
        file.write_all(contents)?;
        file.sync_all()
    })();
    if let Err(error) = written {
        let _ = fs::remove_file(&temp);
        return Err(error);
    }
    fs::rename(&temp, path)?;
    File::open(dir)?.sync_all()
}

/// Whether an IO error says the file system is full.
pub fn is_disk_full(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// Why an IO step on `node`'s data dir (at `data_dir`) failed, naming a full
/// disk as such, with what is free: the words operators see in answers.
pub fn io_failure(node: &str, data_dir: &Path, what: &str, error: &std::io::Error) -> String {
    if is_disk_full(error) {
        let free = disk_space(data_dir).map(|(free, _)| herd_core::units::human_bytes(free)).unwrap_or_default();
        format!("no space left on {node}'s data dir ({what}; {free} free)")
    } else {
        format!("{what}: {error}")
    }
}

/// The bytes an unprivileged writer may still use on the file system of
/// `path`, and its size.
pub fn disk_space(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let name = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("a path with a NUL byte"))?;
    // SAFETY: a NUL-terminated path and a zeroed struct statvfs fills in.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(name.as_ptr(), &mut stats) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let unit = stats.f_frsize as u64;
    Ok((stats.f_bavail as u64 * unit, stats.f_blocks as u64 * unit))
}

/// Space held back for what must be written on a full disk (journal
/// entries, a copy worker's result): a file of real (allocated) blocks of
/// which a slice is given back each time such a write finds the disk full,
/// so that the agent can still record, and report, that its work failed
/// for lack of space. It grows back once there is room.
#[derive(Clone, Debug)]
pub struct SpaceReserve {
    path: PathBuf,
}

/// How much the reserve holds: hundreds of journal writes.
pub const RESERVE_BYTES: u64 = 1 << 20;
/// What one full-disk write is given back.
const RESERVE_SLICE: u64 = 64 << 10;

impl SpaceReserve {
    /// The reserve of the data dir `data_dir`.
    pub fn of(data_dir: &Path) -> SpaceReserve {
        SpaceReserve { path: data_dir.join("space.reserve") }
    }

    /// Takes the whole reserve unless it is held already or there is not
    /// twice its size free (a full disk is not made fuller).
    pub fn take(&self) {
        if fs::metadata(&self.path).is_ok_and(|m| m.len() == RESERVE_BYTES) {
            return;
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        if disk_space(dir).map_or(true, |(free, _)| free < 2 * RESERVE_BYTES) {
            return;
        }
        let taken = (|| {
            let mut file = File::create(&self.path)?;
            // Written, not just sized: a sparse file would reserve nothing.
            file.write_all(&vec![0; RESERVE_BYTES as usize])?;
            file.sync_all()
        })();
        if let Err(error) = taken {
            let _ = fs::remove_file(&self.path);
            tracing::warn!(%error, path = %self.path.display(), "could not reserve space for the journal");
        }
    }

    /// Gives a slice of the reserve back; false when nothing is left.
    pub fn release_slice(&self) -> bool {
        let Ok(held) = fs::metadata(&self.path).map(|m| m.len()) else { return false };
        if held == 0 {
            return false;
        }
        let keep = held.saturating_sub(RESERVE_SLICE);
        let released = fs::OpenOptions::new().write(true).open(&self.path).and_then(|f| f.set_len(keep)).is_ok();
        if released {
            tracing::warn!(left = keep, "the disk is full: gave back reserved space for a write that must land");
        }
        released
    }

    /// [`write_atomic`], given reserved space slice by slice while the
    /// disk is full.
    pub fn write_atomic(&self, path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
        loop {
            match write_atomic(path, contents, mode) {
                Err(error) if is_disk_full(&error) && self.release_slice() => continue,
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_reserve_is_real_space_taken_once_and_given_up() {
        let dir = tempfile::tempdir().unwrap();
        let reserve = SpaceReserve::of(dir.path());
        reserve.take();
        let meta = fs::metadata(dir.path().join("space.reserve")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(meta.len(), RESERVE_BYTES);
        assert!(meta.blocks() * 512 >= RESERVE_BYTES, "allocated, not sparse");
        for _ in 0..RESERVE_BYTES / RESERVE_SLICE {
            assert!(reserve.release_slice());
        }
        assert!(!reserve.release_slice(), "nothing more to give");
        reserve.take();
        assert_eq!(fs::metadata(dir.path().join("space.reserve")).unwrap().len(), RESERVE_BYTES, "grown back");
        let (free, total) = disk_space(dir.path()).unwrap();
        assert!(free > 0 && total >= free);
    }

    #[test]
    fn replaces_whole_file_with_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_atomic(&path, b"first, longer content", 0o600).unwrap();
        write_atomic(&path, b"second", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temp file left behind");
    }

    #[test]
    fn torn_writes_are_removed_and_whole_files_kept() {
        let dir = tempfile::tempdir().unwrap();
        write_atomic(&dir.path().join("f"), b"before", 0o600).unwrap();
        // A write that crashed before its rename leaves only its temp file.
        fs::write(dir.path().join(format!(".f{TEMP_MARK}12345")), b"after").unwrap();
        assert_eq!(remove_torn_writes(dir.path()).unwrap(), 1);
        assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"before");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
