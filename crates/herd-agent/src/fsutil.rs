//! Crash-safe file writes: a reader sees the old content or the new, never
//! a mix, and a write that returned survives power loss.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

/// Writes `contents` to `path` atomically: temp file, fsync, rename, fsync
/// of the directory. `mode` sets the permission bits (0o600 for secrets).
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let temp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
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
}
