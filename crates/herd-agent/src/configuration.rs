//! The agent's copies of the cluster configuration: the small facts every
//! node keeps (`<data dir>/ssconf.json`: the serial, the master's URLs and
//! term) and, on a master candidate, the whole configuration
//! (`<data dir>/config.json`), each written atomically when a heartbeat
//! answer brings a newer one. A node told it is no candidate deletes its
//! copy.
//!
//! The term is what a master failover moves: an agent told of a master at
//! a higher term (by the failover, `POST /master`, or by a heartbeat
//! answer) follows it from then on, and takes nothing from a server of an
//! older term (a superseded master that came back). Shared by the
//! heartbeat loop and the endpoint, which answers a failover's vote.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use herd_core::api::HeartbeatResponse;
use herd_core::configuration::{Configuration, Delta, Ssconf, apply};
use herd_core::failover::{Announcement, MasterView};

use crate::fsutil::write_atomic;

/// A heartbeat that went through within this many periods means the
/// master is reachable (and never less than [`MIN_REACHABLE_WITHIN`]).
const REACHABLE_PERIODS: u32 = 3;
const MIN_REACHABLE_WITHIN: Duration = Duration::from_secs(2);

/// What taking a heartbeat answer did.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    Followed,
    /// The answer came from a master of an older term than this node follows.
    Refused {
        theirs: u64,
        ours: u64,
    },
    /// A superseded master named the one to follow (taken as a failover's
    /// announcement).
    Redirected,
}

#[derive(Clone)]
pub struct ConfigCopies(Arc<Mutex<Inner>>);

struct Inner {
    config: PathBuf,
    ssconf: PathBuf,
    /// The serial of the configuration copy held.
    serial: Option<u64>,
    facts: Option<Ssconf>,
    /// Master URLs the heartbeat loop has not switched to yet.
    new_masters: Option<Vec<String>>,
    last_contact: Option<Instant>,
    /// How recent the last contact must be for the master to count as reachable.
    reachable_within: Duration,
}

impl Inner {
    fn term(&self) -> u64 {
        self.facts.as_ref().map_or(0, |f| f.term)
    }

    fn keep_facts(&mut self, facts: &Ssconf) -> Result<(), String> {
        let json = serde_json::to_vec_pretty(facts).map_err(|e| e.to_string())?;
        write_atomic(&self.ssconf, &json, 0o644).map_err(|e| format!("writing {}: {e}", self.ssconf.display()))?;
        self.facts = Some(facts.clone());
        Ok(())
    }

    /// Follows the master a failover started: kept, and the heartbeat
    /// loop tries its URLs first from now on.
    fn follow(&mut self, facts: Ssconf) -> Result<(), String> {
        self.keep_facts(&facts)?;
        self.new_masters = Some(facts.master_urls);
        // Whatever the old master said no longer counts as contact.
        self.last_contact = None;
        Ok(())
    }
}

impl Inner {
    fn keep_configuration(&mut self, configuration: &Configuration) {
        match serde_json::to_vec(configuration).map(|json| write_atomic(&self.config, &json, 0o600)) {
            Ok(Ok(())) => {
                tracing::info!(serial = configuration.serial, "keeping the configuration as a master candidate");
                self.serial = Some(configuration.serial);
            }
            Ok(Err(error)) => tracing::warn!(%error, "could not keep the configuration"),
            Err(error) => tracing::warn!(%error, "could not encode the configuration"),
        }
    }

    /// Brings the copy up to date with `deltas`; a copy they do not fit is
    /// deleted, so that the next heartbeat brings the whole document.
    fn apply_deltas(&mut self, deltas: &[Delta]) {
        let copy = std::fs::read(&self.config)
            .map_err(|e| format!("reading {}: {e}", self.config.display()))
            .and_then(|bytes| serde_json::from_slice::<Configuration>(&bytes).map_err(|e| e.to_string()));
        let applied = copy.and_then(|copy| deltas.iter().try_fold(copy, |copy, delta| apply(&copy, delta)));
        match applied {
            Ok(configuration) => self.keep_configuration(&configuration),
            Err(error) => {
                tracing::warn!(%error, "the configuration deltas do not fit the copy; asking for the whole document");
                let _ = std::fs::remove_file(&self.config);
                self.serial = None;
            }
        }
    }
}

impl ConfigCopies {
    pub fn open(data_dir: &Path) -> ConfigCopies {
        let (config, ssconf) = (data_dir.join("config.json"), data_dir.join("ssconf.json"));
        let read = |path: &Path| std::fs::read(path).ok();
        let serial = read(&config).and_then(|b| serde_json::from_slice::<Configuration>(&b).ok()).map(|c| c.serial);
        let facts = read(&ssconf).and_then(|b| serde_json::from_slice(&b).ok());
        let reachable_within = MIN_REACHABLE_WITHIN * 5;
        let inner = Inner { config, ssconf, serial, facts, new_masters: None, last_contact: None, reachable_within };
        ConfigCopies(Arc::new(Mutex::new(inner)))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The serial of the configuration copy held, for the heartbeat.
    pub fn serial(&self) -> Option<u64> {
        self.lock().serial
    }

    /// The master URLs this node was last told of (empty: none yet).
    pub fn master_urls(&self) -> Vec<String> {
        self.lock().facts.as_ref().map(|f| f.master_urls.clone()).unwrap_or_default()
    }

    /// Master URLs to switch to, once each time they change.
    pub fn take_new_masters(&self) -> Option<Vec<String>> {
        self.lock().new_masters.take()
    }

    /// Keeps what a heartbeat answer brought, unless it comes from a
    /// master older than the one this node follows.
    pub fn take(&self, answer: &HeartbeatResponse) -> Taken {
        let mut inner = self.lock();
        let ours = inner.term();
        if let Some(facts) = &answer.ssconf {
            if answer.superseded {
                if facts.term > ours && !facts.master_urls.is_empty() {
                    tracing::warn!(term = facts.term, masters = ?facts.master_urls, "the server was superseded: following the new master");
                    if let Err(error) = inner.follow(facts.clone()) {
                        tracing::warn!(%error, "could not keep the new master's facts");
                    }
                }
                return Taken::Redirected;
            }
            if facts.term < ours {
                return Taken::Refused { theirs: facts.term, ours };
            }
            if inner.facts.as_ref() != Some(facts)
                && let Err(error) = inner.keep_facts(facts)
            {
                tracing::warn!(%error, "could not keep the cluster facts");
            }
        }
        inner.last_contact = Some(Instant::now());
        inner.reachable_within = (answer.heartbeat_period.get() * REACHABLE_PERIODS).max(MIN_REACHABLE_WITHIN);
        if let Some(configuration) = &answer.configuration {
            inner.keep_configuration(configuration);
        }
        if !answer.configuration_deltas.is_empty() {
            inner.apply_deltas(&answer.configuration_deltas);
        }
        if answer.drop_configuration && inner.serial.is_some() {
            match std::fs::remove_file(&inner.config) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(%error, "could not delete the configuration copy")
                }
                _ => {
                    tracing::info!("no longer a master candidate: deleted the configuration copy");
                    inner.serial = None;
                }
            }
        }
        Taken::Followed
    }

    /// What this node answers a failover's vote.
    pub fn view(&self, node: &str) -> MasterView {
        let inner = self.lock();
        let since = inner.last_contact.map(|at| at.elapsed());
        MasterView {
            node: node.to_string(),
            term: inner.term(),
            master_urls: inner.facts.as_ref().map(|f| f.master_urls.clone()).unwrap_or_default(),
            serial: inner.serial,
            master_reachable: since.is_some_and(|s| s < inner.reachable_within),
            since_contact_secs: since.map(|s| s.as_secs()),
        }
    }

    /// The configuration copy as kept (None: this node holds none).
    pub fn document(&self) -> Option<Vec<u8>> {
        let inner = self.lock();
        inner.serial?;
        std::fs::read(&inner.config).ok()
    }

    /// Follows the master a failover started, if its term is newer than
    /// the one this node follows.
    pub fn adopt(&self, announcement: &Announcement) -> Result<(), String> {
        let mut inner = self.lock();
        let ours = inner.term();
        if announcement.term <= ours {
            return Err(format!("this node already follows a master of term {ours}"));
        }
        if announcement.master_urls.is_empty() {
            return Err("masterUrls: at least one URL is needed".into());
        }
        let facts = Ssconf {
            serial: inner.facts.as_ref().map_or(0, |f| f.serial),
            master_urls: announcement.master_urls.clone(),
            term: announcement.term,
        };
        inner.follow(facts)?;
        tracing::warn!(term = announcement.term, masters = ?announcement.master_urls, "following a new master (failover)");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(term: u64, url: &str) -> HeartbeatResponse {
        serde_json::from_value(serde_json::json!({
            "heartbeatPeriod": "2s",
            "grantKey": "k",
            "ssconf": {"serial": 3, "masterUrls": [url], "term": term},
        }))
        .unwrap()
    }

    #[test]
    fn a_node_follows_the_newest_term_and_refuses_older_masters() {
        let dir = tempfile::tempdir().unwrap();
        let copies = ConfigCopies::open(dir.path());
        assert_eq!(copies.take(&answer(2, "https://a")), Taken::Followed);
        assert_eq!(copies.take_new_masters(), None, "the facts alone move no server");
        assert!(copies.view("n1").master_reachable);
        let failover = Announcement { term: 3, master_urls: vec!["https://b".into()] };
        copies.adopt(&failover).unwrap();
        assert!(copies.adopt(&failover).unwrap_err().contains("already follows a master of term 3"));
        assert_eq!(copies.take_new_masters(), Some(vec!["https://b".to_string()]));
        assert!(!copies.view("n1").master_reachable, "the old master's contact does not count");
        assert_eq!(copies.take(&answer(2, "https://a")), Taken::Refused { theirs: 2, ours: 3 });
        assert_eq!(copies.master_urls(), vec!["https://b".to_string()]);
        // A superseded server names a newer master: followed as announced.
        let mut redirect = answer(4, "https://c");
        redirect.superseded = true;
        assert_eq!(copies.take(&redirect), Taken::Redirected);
        assert_eq!(copies.take_new_masters(), Some(vec!["https://c".to_string()]));
        assert_eq!(copies.view("n1").term, 4);
        // Kept across a restart.
        let reopened = ConfigCopies::open(dir.path());
        assert_eq!(reopened.view("n1").term, 4);
        assert_eq!(reopened.take(&answer(3, "https://b")), Taken::Refused { theirs: 3, ours: 4 });
    }

    /// A candidate far behind gets the document (which may lag the
    /// facts) and the deltas after it in one answer: its copy ends at the
    /// last delta's serial, as the server has it.
    #[test]
    fn a_document_and_the_deltas_after_it_make_the_newest_copy() {
        let node = |name: &str, role: &str| serde_json::json!({"kind": "Node", "metadata": {"name": name}, "spec": {"role": role}});
        let mut intents = herd_core::configuration::Intents::default();
        intents.observe(&node("n1", "candidate"), false);
        intents.next_serial();
        let document = intents.document();
        let mut deltas = Vec::new();
        for name in ["n2", "n3"] {
            intents.observe(&node(name, "regular"), false);
            deltas.push(intents.next_serial());
        }
        let mut both = answer(1, "https://a");
        both.configuration = Some(document);
        both.configuration_deltas = deltas;
        let dir = tempfile::tempdir().unwrap();
        let copies = ConfigCopies::open(dir.path());
        assert_eq!(copies.take(&both), Taken::Followed);
        assert_eq!(copies.view("n1").serial, Some(3));
        let kept: Configuration =
            serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).unwrap()).unwrap();
        assert_eq!(kept, intents.document());
    }
}
