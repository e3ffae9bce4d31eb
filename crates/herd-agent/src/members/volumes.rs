//! A member's volumes on this node: where they are, which it had (a
//! persistent volume is marked when made, so one that is gone is known
//! lost and never made again empty), what the data dir holds.

use std::path::{Path, PathBuf};

use herd_core::kinds::command::VolumeSpec;

use super::{MemberRecord, Members};
use crate::fsutil::write_atomic;

impl Members {
    pub fn volume_dir(&self, member: &str, volume: &str) -> PathBuf {
        self.data_dir.join("volumes").join(member).join(volume)
    }

    /// Where a copy of a volume is staged until it is verified (kept
    /// across attempts, so that a copy resumes).
    pub fn staging_dir(&self, member: &str, volume: &str) -> PathBuf {
        self.incoming_dir().join(member).join(volume)
    }

    /// Where every copy is staged, one directory per member.
    pub fn incoming_dir(&self) -> PathBuf {
        self.data_dir.join("volumes").join(".incoming")
    }

    /// Every volume and partial copy in the data dir, with whether this
    /// agent knows (and runs) its member.
    pub fn stored_volumes(&self) -> std::io::Result<Vec<herd_core::api::StoredVolume>> {
        use herd_core::api::{StoredKind, StoredVolume};
        let root = self.data_dir.join("volumes");
        let mut found = Vec::new();
        for (kind, dir) in [(StoredKind::Volume, root.clone()), (StoredKind::Staging, root.join(".incoming"))] {
            for (member, volume, path) in two_levels(&dir)? {
                if kind == StoredKind::Volume && member == ".incoming" {
                    continue;
                }
                let record = self.record(&member);
                found.push(StoredVolume {
                    bytes: crate::volumes::staged_bytes(&path).unwrap_or(0),
                    member_known: record.is_some(),
                    member_running: record.is_some_and(|r| r.wanted),
                    member,
                    volume,
                    kind,
                    owner: None,
                });
            }
        }
        Ok(found)
    }

    /// A persistent volume is kept; an ephemeral one starts empty. A
    /// persistent volume this node had (its mark beside it) and that is
    /// gone was lost: it is not made again empty (`Lost`), for the member
    /// would start on nothing as if it were its data.
    pub(super) fn prepare_volume(&self, member: &str, volume: &VolumeSpec) -> Result<PathBuf, PrepareError> {
        let path = self.volume_dir(member, &volume.name);
        let mark = self.volume_mark(member, &volume.name);
        if !volume.persistent {
            if path.exists() {
                std::fs::remove_dir_all(&path)?;
            }
        } else if !path.is_dir() && mark.exists() {
            return Err(PrepareError::Lost);
        }
        std::fs::create_dir_all(&path)?;
        if volume.persistent && !mark.exists() {
            write_atomic(&mark, b"", 0o644)?;
        }
        Ok(path)
    }

    /// Beside a persistent volume: that this node has had it (a volume gone
    /// while its mark stays was lost, not never made).
    fn volume_mark(&self, member: &str, volume: &str) -> PathBuf {
        self.data_dir.join("volumes").join(member).join(format!(".{volume}.kept"))
    }

    /// The persistent volumes of `record` this node had and lost.
    pub fn lost_volumes(&self, record: &MemberRecord) -> Vec<String> {
        record
            .run
            .volumes
            .iter()
            .filter(|v| v.persistent)
            .filter(|v| {
                !self.volume_dir(&record.name, &v.name).is_dir() && self.volume_mark(&record.name, &v.name).exists()
            })
            .map(|v| v.name.clone())
            .collect()
    }

    /// Forgets that this node had `member`'s persistent volume `volume` (it
    /// was deleted on purpose): a start makes it afresh.
    pub fn forget_volume_mark(&self, member: &str, volume: &str) -> std::io::Result<()> {
        match std::fs::remove_file(self.volume_mark(member, volume)) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }
}

/// Why a volume could not be made ready for a start.
#[derive(Debug)]
pub(super) enum PrepareError {
    /// A persistent volume this node had is gone.
    Lost,
    Io(std::io::Error),
}

impl From<std::io::Error> for PrepareError {
    fn from(error: std::io::Error) -> Self {
        PrepareError::Io(error)
    }
}

/// The directories two levels under `dir` (`<member>/<volume>`), sorted;
/// none when `dir` does not exist.
fn two_levels(dir: &Path) -> std::io::Result<Vec<(String, String, PathBuf)>> {
    let subdirs = |dir: &Path| -> std::io::Result<Vec<(String, PathBuf)>> {
        let mut found = Vec::new();
        match std::fs::read_dir(dir) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(found),
            Err(error) => return Err(error),
            Ok(items) => {
                for item in items {
                    let item = item?;
                    if item.file_type()?.is_dir() {
                        found.push((item.file_name().to_string_lossy().into_owned(), item.path()));
                    }
                }
            }
        }
        found.sort();
        Ok(found)
    };
    let mut found = Vec::new();
    for (member, path) in subdirs(dir)? {
        for (volume, path) in subdirs(&path)? {
            found.push((member.clone(), volume, path));
        }
    }
    Ok(found)
}

/// `HERD_VOLUME_<NAME>`, the name upper-cased with `-` and `.` as `_`.
pub(super) fn volume_env(name: &str) -> String {
    let upper: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    format!("HERD_VOLUME_{upper}")
}
