//! The agent's copies of the cluster configuration: the small facts every
//! node keeps (`<data dir>/ssconf.json`: the serial, the master's URLs) and,
//! on a master candidate, the whole configuration (`<data dir>/config.json`),
//! each written atomically when a heartbeat answer brings a newer one. A
//! node told it is no candidate deletes its copy.

use std::path::{Path, PathBuf};

use herd_core::api::HeartbeatResponse;
use herd_core::configuration::{Configuration, Ssconf};

use crate::fsutil::write_atomic;

pub struct ConfigCopies {
    config: PathBuf,
    ssconf: PathBuf,
    /// The serial of the configuration copy held.
    serial: Option<u64>,
    facts: Option<Ssconf>,
}

impl ConfigCopies {
    pub fn open(data_dir: &Path) -> ConfigCopies {
        let (config, ssconf) = (data_dir.join("config.json"), data_dir.join("ssconf.json"));
        let read = |path: &Path| std::fs::read(path).ok();
        let serial = read(&config).and_then(|b| serde_json::from_slice::<Configuration>(&b).ok()).map(|c| c.serial);
        let facts = read(&ssconf).and_then(|b| serde_json::from_slice(&b).ok());
        ConfigCopies { config, ssconf, serial, facts }
    }

    /// The serial of the configuration copy held, for the heartbeat.
    pub fn serial(&self) -> Option<u64> {
        self.serial
    }

    /// Keeps what a heartbeat answer brought.
    pub fn take(&mut self, answer: &HeartbeatResponse) {
        if let Some(facts) = answer.ssconf.as_ref().filter(|f| self.facts.as_ref() != Some(*f)) {
            match serde_json::to_vec_pretty(facts).map(|json| write_atomic(&self.ssconf, &json, 0o644)) {
                Ok(Ok(())) => self.facts = Some(facts.clone()),
                Ok(Err(error)) => tracing::warn!(%error, "could not keep the cluster facts"),
                Err(error) => tracing::warn!(%error, "could not encode the cluster facts"),
            }
        }
        if let Some(configuration) = &answer.configuration {
            match serde_json::to_vec(configuration).map(|json| write_atomic(&self.config, &json, 0o600)) {
                Ok(Ok(())) => {
                    tracing::info!(serial = configuration.serial, "keeping the configuration as a master candidate");
                    self.serial = Some(configuration.serial);
                }
                Ok(Err(error)) => tracing::warn!(%error, "could not keep the configuration"),
                Err(error) => tracing::warn!(%error, "could not encode the configuration"),
            }
        }
        if answer.drop_configuration && self.serial.is_some() {
            match std::fs::remove_file(&self.config) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(%error, "could not delete the configuration copy")
                }
                _ => {
                    tracing::info!("no longer a master candidate: deleted the configuration copy");
                    self.serial = None;
                }
            }
        }
    }
}
