//! The node's own certificate, signed by the cluster CA for its identity
//! (`<node>.node.herd`) and its endpoint's address. The agent makes the key
//! and sends only a signing request, at join and again when two thirds of
//! the certificate's life have passed (the answer comes with a heartbeat).
//! Kept in `<data dir>/node-cert.json` (mode 0600, written atomically: key
//! and certificate together, never one without the other).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use herd_core::Timestamp;
use herd_core::api::NodeCertificate;
use serde::{Deserialize, Serialize};

use crate::fsutil::write_atomic;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Kept {
    key_pem: String,
    chain_pem: String,
    issued: Timestamp,
    expires: Timestamp,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeCertError {
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("making the node's key: {0}")]
    Key(#[from] herd_tls::TlsError),
}

pub struct NodeCertStore {
    path: PathBuf,
    node: String,
    kept: Option<Kept>,
    /// The key and request sent and not answered yet.
    pending: Option<(String, String)>,
    /// The server answered a request without a certificate (it serves
    /// plain HTTP): asking again in this run is pointless.
    declined: bool,
}

impl NodeCertStore {
    pub fn open(data_dir: &Path, node: &str) -> Result<NodeCertStore, NodeCertError> {
        let path = data_dir.join("node-cert.json");
        let kept = match std::fs::read(&path) {
            Ok(bytes) => Some(serde_json::from_slice(&bytes).map_err(|e| NodeCertError::File {
                path: path.clone(),
                reason: format!("damaged ({e}); delete it and the agent asks for a new certificate"),
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(NodeCertError::File { path, reason: e.to_string() }),
        };
        Ok(NodeCertStore { path, node: node.to_string(), kept, pending: None, declined: false })
    }

    /// The certificate kept and its key, if there is one.
    pub fn identity(&self) -> Option<herd_tls::ServingIdentity> {
        let kept = self.kept.as_ref()?;
        Some(herd_tls::ServingIdentity { chain_pem: kept.chain_pem.clone(), key_pem: kept.key_pem.clone() })
    }

    /// When the certificate kept expires, if there is one.
    pub fn expires(&self) -> Option<Timestamp> {
        self.kept.as_ref().map(|kept| kept.expires)
    }

    /// The signing request to send now: when the node has no certificate,
    /// or two thirds of its certificate's life have passed.
    pub fn request_if_due(&mut self, now: SystemTime) -> Result<Option<String>, NodeCertError> {
        if self.declined {
            return Ok(None);
        }
        let due = match &self.kept {
            None => true,
            Some(kept) => {
                let life = kept.expires.system_time().duration_since(kept.issued.system_time()).unwrap_or_default();
                let left = kept.expires.system_time().duration_since(now).unwrap_or_default();
                left < life / 3
            }
        };
        if !due {
            return Ok(None);
        }
        if self.pending.is_none() {
            self.pending = Some(herd_tls::node_key_and_request(&self.node)?);
        }
        Ok(self.pending.as_ref().map(|(_, request)| request.clone()))
    }

    /// Takes the server's answer to a request sent with `request_if_due`.
    pub fn answer(&mut self, certificate: Option<&NodeCertificate>, now: SystemTime) -> Result<(), NodeCertError> {
        let Some((key_pem, _)) = self.pending.take() else { return Ok(()) };
        let Some(certificate) = certificate else {
            self.declined = true;
            return Ok(());
        };
        let kept = Kept {
            key_pem,
            chain_pem: certificate.chain_pem.clone(),
            issued: Timestamp::from_system_time(now),
            expires: certificate.expires,
        };
        let bytes = serde_json::to_vec_pretty(&kept).unwrap_or_default();
        write_atomic(&self.path, &bytes, 0o600)
            .map_err(|e| NodeCertError::File { path: self.path.clone(), reason: e.to_string() })?;
        tracing::info!(node = %self.node, expires = %kept.expires, "the node has a new certificate");
        self.kept = Some(kept);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_request_is_due_with_no_certificate_and_after_two_thirds_of_its_life() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = NodeCertStore::open(dir.path(), "n1").unwrap();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let request = store.request_if_due(t0).unwrap().expect("no certificate yet");
        assert_eq!(store.request_if_due(t0).unwrap(), Some(request), "the same request until answered");
        let answer = NodeCertificate {
            chain_pem: "chain".into(),
            expires: Timestamp::from_system_time(t0 + Duration::from_secs(90)),
        };
        store.answer(Some(&answer), t0).unwrap();
        assert_eq!(store.request_if_due(t0 + Duration::from_secs(59)).unwrap(), None);
        assert!(store.request_if_due(t0 + Duration::from_secs(61)).unwrap().is_some(), "a third left");
        let reopened = NodeCertStore::open(dir.path(), "n1").unwrap();
        assert_eq!(reopened.expires(), Some(answer.expires), "kept across restarts");
        let text = std::fs::read_to_string(dir.path().join("node-cert.json")).unwrap();
        assert!(text.contains("PRIVATE KEY"), "the key is kept with its certificate");
    }

    #[test]
    fn a_server_that_signs_nothing_is_not_asked_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = NodeCertStore::open(dir.path(), "n1").unwrap();
        assert!(store.request_if_due(SystemTime::now()).unwrap().is_some());
        store.answer(None, SystemTime::now()).unwrap();
        assert_eq!(store.request_if_due(SystemTime::now()).unwrap(), None);
    }
}
