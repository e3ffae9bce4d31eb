//! The node's own credential, kept in `<data dir>/node-token.json` (mode
//! 0600, written atomically), so that a restarted agent does not need the
//! join token again.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsutil::write_atomic;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Credentials {
    pub node_name: String,
    pub node_token: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is damaged ({reason}); delete it and restart the agent with --join-token to join again")]
    Damaged { path: PathBuf, reason: String },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{path} belongs to node {found:?}, but this agent runs as {expected:?}")]
    OtherNode { path: PathBuf, found: String, expected: String },
}

#[derive(Clone)]
pub struct CredentialStore {
    path: PathBuf,
}

impl CredentialStore {
    pub fn new(data_dir: &Path) -> Self {
        CredentialStore { path: data_dir.join("node-token.json") }
    }

    /// The stored credentials of `node`, if any.
    pub fn load(&self, node: &str) -> Result<Option<Credentials>, CredentialsError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(CredentialsError::Read { path: self.path.clone(), source }),
        };
        let credentials: Credentials = serde_json::from_slice(&bytes)
            .map_err(|e| CredentialsError::Damaged { path: self.path.clone(), reason: e.to_string() })?;
        if credentials.node_name != node {
            return Err(CredentialsError::OtherNode {
                path: self.path.clone(),
                found: credentials.node_name,
                expected: node.into(),
            });
        }
        Ok(Some(credentials))
    }

    pub fn save(&self, credentials: &Credentials) -> Result<(), CredentialsError> {
        let bytes = serde_json::to_vec_pretty(credentials).unwrap_or_default();
        write_atomic(&self.path, &bytes, 0o600)
            .map_err(|source| CredentialsError::Write { path: self.path.clone(), source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_wrong_node() {
        let dir = tempfile::tempdir().unwrap();
        let store = CredentialStore::new(dir.path());
        assert_eq!(store.load("n1").unwrap(), None);
        let creds = Credentials { node_name: "n1".into(), node_token: "t".into() };
        store.save(&creds).unwrap();
        assert_eq!(store.load("n1").unwrap(), Some(creds));
        assert!(matches!(store.load("n2"), Err(CredentialsError::OtherNode { .. })));
        std::fs::write(dir.path().join("node-token.json"), b"{").unwrap();
        assert!(matches!(store.load("n1"), Err(CredentialsError::Damaged { .. })));
    }
}
