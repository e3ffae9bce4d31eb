//! The command journal: one JSON file per command attempt in
//! `<data-dir>/journal/`, rewritten atomically at every state change
//! (temp file, fsync, rename, fsync of the directory), so that a crash at
//! any moment leaves the previous state or the next, never a torn file.
//! The moves an entry may make, and what an unfinished entry becomes on
//! start, are decided in `herd_core::journal`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use herd_core::Timestamp;
use herd_core::journal::may_move;
use herd_core::kinds::{AgentState, Answer, CommandSpec};
use serde::{Deserialize, Serialize};

use crate::fsutil::SpaceReserve;

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("journal entry {name}: may not move from {from:?} to {to:?}")]
    Move { name: String, from: AgentState, to: AgentState },
}

/// A detached worker process an entry waits for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerRef {
    pub pid: u32,
    /// The process's start time in clock ticks since boot (field 22 of
    /// `/proc/<pid>/stat`): a recycled pid has another.
    pub start_ticks: u64,
    /// Where the worker writes its result.
    pub result: PathBuf,
}

/// One attempt of one Command, as the agent knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// The Command's name and uid, and which issue of it this is.
    pub name: String,
    pub uid: String,
    pub attempt: u32,
    /// The term it was issued in.
    pub term: u64,
    pub spec: CommandSpec,
    pub state: AgentState,
    pub started: Timestamp,
    pub updated: Timestamp,
    /// Past this, an unfinished entry is TIMED_OUT.
    pub deadline: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<Answer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerRef>,
    /// The agent endpoints of the other nodes the action involves.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub peers: BTreeMap<String, String>,
    /// The grants the leader signed for what the action needs from them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<String>,
    /// How far the work got (for example the bytes copied), shown to the operator.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub progress: BTreeMap<String, String>,
}

impl Entry {
    /// The file name: one per attempt.
    pub fn file_name(&self) -> String {
        format!("{}-{}.json", self.name, self.attempt)
    }
}

#[derive(Clone, Debug)]
pub struct Journal {
    dir: PathBuf,
    /// Given up when the disk is full, so that journal writes still land.
    reserve: SpaceReserve,
}

impl Journal {
    pub fn open(data_dir: &Path) -> Result<Journal, JournalError> {
        let dir = data_dir.join("journal");
        std::fs::create_dir_all(&dir).map_err(|source| JournalError::Io { path: dir.clone(), source })?;
        let reserve = SpaceReserve::of(data_dir);
        reserve.take();
        Ok(Journal { dir, reserve })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `entry` as it is (atomically). On a full disk reserved space
    /// is given back for it: a full disk must not keep the agent from
    /// recording what happened.
    pub fn write(&self, entry: &Entry) -> Result<(), JournalError> {
        let path = self.dir.join(entry.file_name());
        let json = serde_json::to_vec_pretty(entry)
            .map_err(|e| JournalError::Io { path: path.clone(), source: std::io::Error::other(e) })?;
        self.reserve.write_atomic(&path, &json, 0o600).map_err(|source| JournalError::Io { path, source })?;
        self.reserve.take();
        Ok(())
    }

    /// Moves `entry` to `to` (with `answer` for a final state) and writes
    /// it. A move the journal allows is made even when the write fails
    /// (the error then says it is not on disk).
    pub fn advance(
        &self,
        entry: &mut Entry,
        to: AgentState,
        answer: Option<Answer>,
        now: Timestamp,
    ) -> Result<(), JournalError> {
        if !may_move(entry.state, to) {
            return Err(JournalError::Move { name: entry.name.clone(), from: entry.state, to });
        }
        let mut next = entry.clone();
        next.state = to;
        next.updated = now;
        if answer.is_some() {
            next.answer = answer;
        }
        let written = self.write(&next);
        *entry = next;
        written
    }

    /// Every entry, oldest first. Torn writes (a crash between a write and
    /// its rename) are cleared: the entry they were to replace holds the
    /// state before. A file that does not parse is moved aside
    /// (`.corrupt`) and reported, never silently dropped.
    pub fn load(&self) -> Result<Vec<Entry>, JournalError> {
        let io = |source| JournalError::Io { path: self.dir.clone(), source };
        let torn = crate::fsutil::remove_torn_writes(&self.dir).map_err(io)?;
        if torn > 0 {
            tracing::warn!(torn, "cleared journal writes cut short by a crash");
        }
        let mut entries = Vec::new();
        for item in std::fs::read_dir(&self.dir).map_err(io)? {
            let path = item.map_err(io)?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let text = std::fs::read(&path).map_err(|source| JournalError::Io { path: path.clone(), source })?;
            match serde_json::from_slice::<Entry>(&text) {
                Ok(entry) => entries.push(entry),
                Err(error) => {
                    tracing::error!(path = %path.display(), %error, "a journal entry does not parse; moved aside");
                    let aside = path.with_extension("json.corrupt");
                    std::fs::rename(&path, &aside).map_err(|source| JournalError::Io { path, source })?;
                }
            }
        }
        entries.sort_by(|a, b| (a.started, &a.name, a.attempt).cmp(&(b.started, &b.name, b.attempt)));
        Ok(entries)
    }

    /// Removes an entry once the server has acknowledged its final state.
    pub fn remove(&self, entry: &Entry) -> Result<(), JournalError> {
        let path = self.dir.join(entry.file_name());
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(JournalError::Io { path, source }),
        }
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| JournalError::Io { path: self.dir.clone(), source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herd_core::kinds::Action;
    use std::time::{Duration, SystemTime};

    fn entry(name: &str) -> Entry {
        let now = crate::now();
        Entry {
            name: name.into(),
            uid: "u1".into(),
            attempt: 1,
            term: 3,
            spec: CommandSpec {
                node: "n1".into(),
                timeout: None,
                action: Action::StopMember { member: "m".into() },
                origin: None,
            },
            state: AgentState::Started,
            started: now,
            updated: now,
            deadline: Timestamp::from_system_time(SystemTime::now() + Duration::from_secs(30)),
            answer: None,
            worker: None,
            peers: BTreeMap::new(),
            grants: Vec::new(),
            progress: BTreeMap::new(),
        }
    }

    #[test]
    fn entries_survive_a_reopen_and_refuse_bad_moves() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        let mut e = entry("c1");
        journal.write(&e).unwrap();
        let now = e.started;
        journal.advance(&mut e, AgentState::Processing, None, now).unwrap();
        let done = Answer::said(true, "stopped");
        journal.advance(&mut e, AgentState::Completed, Some(done), now).unwrap();
        let error = journal.advance(&mut e, AgentState::Processing, None, now).unwrap_err();
        assert!(matches!(error, JournalError::Move { .. }), "{error}");

        let reopened = Journal::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(reopened, vec![e.clone()], "what was written is what is read back");
        journal.remove(&e).unwrap();
        assert!(journal.load().unwrap().is_empty());
    }

    #[test]
    fn a_corrupt_file_is_moved_aside_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        journal.write(&entry("good")).unwrap();
        std::fs::write(journal.dir().join("bad-1.json"), b"{ torn").unwrap();
        let entries = journal.load().unwrap();
        assert_eq!(entries.len(), 1);
        assert!(journal.dir().join("bad-1.json.corrupt").exists());
    }
}
