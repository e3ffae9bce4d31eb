//! A lock file held for the life of a process, naming its holder: the
//! agent's data dir (`agent.lock`) and `herd dev`'s (`dev.lock`). A second
//! process is refused with the PID of the first, and anyone may ask who
//! holds a lock without taking it.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// Held while this value lives.
#[derive(Debug)]
pub struct PidLock {
    _file: File,
}

#[derive(Debug, thiserror::Error)]
pub enum PidLockError {
    #[error("{} is locked by {}", path.display(), holder_text(*holder))]
    Busy { path: PathBuf, holder: Option<u32> },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

fn holder_text(holder: Option<u32>) -> String {
    holder.map_or_else(|| "another process".to_string(), |pid| format!("pid {pid}"))
}

fn open(path: &Path) -> Result<File, PidLockError> {
    File::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|source| PidLockError::Io { path: path.to_path_buf(), source })
}

fn recorded_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

impl PidLock {
    /// Takes the lock at `path` and writes this process's PID into it.
    pub fn acquire(path: &Path) -> Result<PidLock, PidLockError> {
        let mut file = open(path)?;
        if file.try_lock().is_err() {
            return Err(PidLockError::Busy { path: path.to_path_buf(), holder: recorded_pid(&mut file) });
        }
        let io = |source| PidLockError::Io { path: path.to_path_buf(), source };
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(PidLock { _file: file })
    }

    /// Who holds the lock at `path`: None when nobody does (or there is no
    /// such file), Some(the recorded PID, if readable) when someone does.
    pub fn holder(path: &Path) -> Option<Option<u32>> {
        let mut file = File::options().read(true).write(true).open(path).ok()?;
        match file.try_lock() {
            Ok(()) => None,
            Err(_) => Some(recorded_pid(&mut file)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_taker_is_told_the_holders_pid_and_the_lock_frees_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        assert_eq!(PidLock::holder(&path), None, "no file, no holder");
        let held = PidLock::acquire(&path).unwrap();
        assert_eq!(PidLock::holder(&path), Some(Some(std::process::id())));
        let PidLockError::Busy { holder, .. } = PidLock::acquire(&path).unwrap_err() else { panic!() };
        assert_eq!(holder, Some(std::process::id()));
        drop(held);
        assert_eq!(PidLock::holder(&path), None);
        PidLock::acquire(&path).expect("free again");
    }
}
