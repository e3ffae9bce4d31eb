//! Crash-safe file writes: a reader sees the old content or the new, never
//! a mix, and a write that returned survives power loss.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

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
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let temp = dir.join(format!(".{name}{TEMP_MARK}{}", std::process::id()));
    {
        let mut file = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&temp)?;
        file.write_all(contents)?;
        file.sync_all()?;
    }
    fs::rename(&temp, path)?;
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
