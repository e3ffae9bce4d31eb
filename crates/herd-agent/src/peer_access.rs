//! Who may do what on this agent's endpoint, and who this agent is to
//! other agents. Owns the key grants are verified with (from the server's
//! answers, kept in `<data dir>/grant-key` so that a restarted agent
//! serves before its first heartbeat), the endpoint's TLS configuration
//! (made from the node certificate once there is one, changed when it is
//! renewed), the Command attempts that ended whose grants it refuses from
//! then on (from the heartbeat answers, kept in `<data dir>/ended-grants.json`
//! until those grants expire, so that a restarted agent does not take
//! them again), and the requests refused since the last heartbeat (each
//! becomes an Event on this node).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use axum::http::{HeaderMap, StatusCode};
use herd_core::api::{MAX_PEER_REFUSALS, PeerRefusal};
use herd_core::grant::{Access, EndedAttempt, Holder, Refusal, Revocations, check};
use herd_tls::ServingIdentity;
use herd_tls::grant::{GRANT_HEADER, GrantVerifier};
use tokio::sync::watch;

#[derive(Clone)]
pub struct PeerAccess(Arc<Inner>);

struct Inner {
    node: String,
    key_file: PathBuf,
    verifier: RwLock<Option<GrantVerifier>>,
    ended_file: PathBuf,
    ended: RwLock<Revocations>,
    identity: RwLock<Option<ServingIdentity>>,
    tls: watch::Sender<Option<Arc<rustls::ServerConfig>>>,
    refusals: Mutex<Vec<PeerRefusal>>,
}

impl PeerAccess {
    /// The access of node `node`, with the grant key and certificate kept
    /// in `data_dir` (either may not be there yet).
    pub fn open(data_dir: &Path, node: &str, identity: Option<ServingIdentity>) -> PeerAccess {
        let key_file = data_dir.join("grant-key");
        let verifier =
            std::fs::read_to_string(&key_file).ok().and_then(|key| GrantVerifier::from_public_key(&key).ok());
        let ended_file = data_dir.join("ended-grants.json");
        let ended = std::fs::read(&ended_file).ok().and_then(|kept| serde_json::from_slice(&kept).ok());
        let (tls, _) = watch::channel(None);
        let access = PeerAccess(Arc::new(Inner {
            node: node.to_string(),
            key_file,
            verifier: RwLock::new(verifier),
            ended_file,
            ended: RwLock::new(ended.unwrap_or_default()),
            identity: RwLock::new(None),
            tls,
            refusals: Mutex::new(Vec::new()),
        }));
        access.use_identity(identity);
        access
    }

    /// Keeps the grant key the server sent, in memory and in the data dir.
    pub fn remember_grant_key(&self, key: &str) {
        let verifier = match GrantVerifier::from_public_key(key) {
            Ok(verifier) => verifier,
            Err(error) => return tracing::warn!(%error, "the server sent a grant key that is not one"),
        };
        let Ok(mut current) = self.0.verifier.write() else { return };
        if current.as_ref() == Some(&verifier) {
            return;
        }
        if let Err(error) = crate::fsutil::write_atomic(&self.0.key_file, key.as_bytes(), 0o644) {
            tracing::warn!(%error, "could not keep the grant key in the data dir");
        }
        *current = Some(verifier);
    }

    /// Refuses the grants of `ended` from now on (until they expire), and
    /// keeps that in the data dir.
    pub fn end_attempts(&self, ended: &[EndedAttempt]) {
        let Ok(mut kept) = self.0.ended.write() else { return };
        if !kept.merge(ended, crate::now()) {
            return;
        }
        let written = serde_json::to_vec(&*kept)
            .map_err(|e| e.to_string())
            .and_then(|json| crate::fsutil::write_atomic(&self.0.ended_file, &json, 0o644).map_err(|e| e.to_string()));
        if let Err(error) = written {
            tracing::warn!(%error, "could not keep the ended grants in the data dir");
        }
    }

    /// Serves and calls with `identity` (the node's certificate) from now on.
    pub fn use_identity(&self, identity: Option<ServingIdentity>) {
        let Some(identity) = identity else { return };
        match herd_tls::peer::server_config(&identity) {
            Ok(config) => {
                self.0.tls.send_replace(Some(Arc::new(config)));
            }
            Err(error) => return tracing::error!(%error, "the node certificate cannot serve the endpoint"),
        }
        if let Ok(mut current) = self.0.identity.write() {
            *current = Some(identity);
        }
    }

    /// The node's certificate, to show other agents.
    pub fn identity(&self) -> Option<ServingIdentity> {
        self.0.identity.read().ok().and_then(|identity| identity.clone())
    }

    /// The endpoint's TLS configuration as it changes.
    pub fn tls_config(&self) -> watch::Receiver<Option<Arc<rustls::ServerConfig>>> {
        self.0.tls.subscribe()
    }

    /// Whether `caller` may do `asked`: the grant in the request's header,
    /// signed by the server, for this caller, node and action, not expired.
    /// A refusal is answered 403 and kept for the next heartbeat.
    pub fn allow(
        &self,
        headers: &HeaderMap,
        caller: Option<&Holder>,
        asked: Access,
    ) -> Result<(), (StatusCode, String)> {
        let verifier = self.0.verifier.read().ok().and_then(|v| v.clone());
        let Some(verifier) = verifier else {
            return Err((StatusCode::SERVICE_UNAVAILABLE, "this agent has no grant key from the server yet".into()));
        };
        let shown = headers.get(GRANT_HEADER).and_then(|v| v.to_str().ok());
        let checked = shown
            .ok_or(Refusal::Missing)
            .and_then(|signed| verifier.verify(signed).map_err(|e| Refusal::Invalid(e.to_string())))
            .and_then(|grant| {
                let ended =
                    self.0.ended.read().map_err(|_| Refusal::Invalid("the ended grants are unreadable".into()))?;
                check(&grant, caller, &self.0.node, &asked, (crate::now(), &ended))
            });
        checked.map_err(|reason| {
            let named = caller.map_or("a caller without a cluster certificate".to_string(), Holder::to_string);
            tracing::warn!(caller = %named, asked = %asked, %reason, "refused a peer request");
            let answer = format!("{named} may not {asked} on node {}: {reason}", self.0.node);
            if let Ok(mut kept) = self.0.refusals.lock() {
                if kept.len() >= MAX_PEER_REFUSALS {
                    kept.remove(0);
                }
                kept.push(PeerRefusal { caller: caller.cloned(), asked, reason, at: crate::now() });
            }
            (StatusCode::FORBIDDEN, answer)
        })
    }

    /// The refusals since the last call, for a heartbeat.
    pub fn take_refusals(&self) -> Vec<PeerRefusal> {
        self.0.refusals.lock().map(|mut kept| std::mem::take(&mut *kept)).unwrap_or_default()
    }
}
