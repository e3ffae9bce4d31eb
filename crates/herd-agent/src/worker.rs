//! Detached workers: long copies run in a process of their own, which
//! outlives the agent, and leave their result in a file the agent (or its
//! next run) reads.

use std::path::Path;

use herd_core::kinds::Answer;

/// The result a worker left, if it finished.
pub fn read_result(path: &Path) -> Option<Answer> {
    let text = std::fs::read(path).ok()?;
    serde_json::from_slice(&text).ok()
}
