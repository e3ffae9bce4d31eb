//! Ending an attempt's work early: the operator's abandon (its worker or
//! script killed through its disconnect hook, its partial copies removed
//! unless kept) and the reason a cancelled attempt's answer gives.

use std::path::PathBuf;

use herd_core::kinds::Action;
use herd_core::kinds::command::AbandonRequest;

use super::{Cancel, Executor};
use crate::journal::Entry;

impl Executor {
    /// The operator abandoned an attempt this agent runs: end its work now
    /// (its disconnect hook kills a worker or a script); the attempt then
    /// ends INTERRUPTED, saying so. Harmless when it already ended.
    pub(super) fn end_abandoned(&self, name: &str, abandon: &AbandonRequest) {
        let key = (name.to_string(), abandon.attempt);
        if !self.lock().get(&key).is_some_and(|e| e.state.is_running()) {
            return;
        }
        let cancel = Cancel { why: "abandoned by the operator".into(), abandoned: Some(abandon.clone()) };
        let first = self.cancelled.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), cancel).is_none();
        let hook = self.hooks.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
        if let (true, Some(hook)) = (first, hook) {
            tracing::warn!(command = %name, attempt = abandon.attempt, "abandoned by the operator: ending its work");
            hook();
        }
    }

    /// Why the attempt's work was ended early, if it was (forgetting it):
    /// for an abandoned one, with what became of its partial copies.
    pub(super) fn take_cancel(&self, entry: &Entry) -> Option<String> {
        let key = (entry.name.clone(), entry.attempt);
        let cancel = self.cancelled.lock().unwrap_or_else(|p| p.into_inner()).remove(&key)?;
        let staging = match &cancel.abandoned {
            Some(abandon) => self.clear_abandoned_staging(entry, abandon.keep_staging),
            None => String::new(),
        };
        Some(format!("{}{staging}", cancel.why))
    }

    /// Removes the partial copies an abandoned attempt staged, unless the
    /// operator kept them; says what became of them.
    fn clear_abandoned_staging(&self, entry: &Entry, keep: bool) -> String {
        let volumes: Vec<String> = match &entry.spec.action {
            Action::CopyVolume { volume, .. } => vec![volume.clone()],
            Action::MigrateMember { run, .. } => run.persistent_volumes().map(str::to_string).collect(),
            _ => return String::new(),
        };
        let member = entry.spec.action.member();
        let staged: Vec<PathBuf> =
            volumes.iter().map(|v| self.members.staging_dir(member, v)).filter(|dir| dir.exists()).collect();
        if staged.is_empty() {
            return String::new();
        }
        if keep {
            return "; its partial copy is kept for a later copy to resume".into();
        }
        let mut freed = 0;
        for dir in &staged {
            match crate::worker::remove_staging(dir) {
                Ok(bytes) => freed += bytes,
                Err(error) => return format!("; removing its partial copy {} failed: {error}", dir.display()),
            }
        }
        format!("; its partial copy ({}) was removed", herd_core::units::human_bytes(freed))
    }
}
