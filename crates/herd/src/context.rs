//! Which server to talk to and with what token: flags, then environment
//! variables (both handled by clap), then the config file.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use herd_client::Client;
use herd_tls::{CaHash, Trust};
use serde::{Deserialize, Serialize};

use crate::cli::Connection;

/// The CLI config file (YAML).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigFile {
    pub servers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The cluster CA's certificate (PEM): the only CA trusted for `https://` servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
}

pub fn default_config_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".config")))?;
    Some(base.join("herd").join("config.yaml"))
}

pub fn read_config(path: &Path) -> anyhow::Result<Option<ConfigFile>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let config =
        serde_saphyr::from_str(&text).with_context(|| format!("{} is not a valid herd config", path.display()))?;
    Ok(Some(config))
}

pub fn write_config(path: &Path, config: &ConfigFile) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let text = serde_saphyr::to_string(config).context("serialising the config")?;
    herd_agent::fsutil::write_atomic(path, text.as_bytes(), 0o600)
        .with_context(|| format!("writing {}", path.display()))
}

/// A client for the server the user means.
pub fn client(conn: &Connection) -> anyhow::Result<Client> {
    client_trusting(conn).map(|(client, _)| client)
}

/// A client for the server the user means, and whom it trusts.
pub fn client_trusting(conn: &Connection) -> anyhow::Result<(Client, Option<Trust>)> {
    let path = conn.config.clone().or_else(default_config_path);
    let file = match &path {
        Some(path) => read_config(path)?,
        None => None,
    }
    .unwrap_or_default();
    let servers = if conn.server.is_empty() { file.servers } else { conn.server.clone() };
    if servers.is_empty() {
        bail!("no server given: use --server URL, set HERD_SERVER, or run `herd dev`, which writes a config file");
    }
    let trusted = trust(conn, file.ca)?;
    if trusted.is_none()
        && let Some(server) = servers.iter().find(|server| server.starts_with("https://"))
    {
        bail!(
            "no cluster CA to trust for {server}: give --ca-hash (`herd server` prints it), --ca-file (its ca.pem), \
             or a config file with `ca` (`herd dev` writes one)"
        );
    }
    let client = Client::new(servers, conn.token.clone().or(file.token));
    match trusted {
        Some(trust) => Ok((client.with_trust(&trust)?, Some(trust))),
        None => Ok((client, None)),
    }
}

/// Whom to trust: `--ca-hash`, then `--ca-file`, then the config file's CA.
pub fn trust(conn: &Connection, config_ca: Option<String>) -> anyhow::Result<Option<Trust>> {
    if !conn.ca_hash.is_empty() {
        return Ok(Some(Trust::Pinned(ca_hashes(&conn.ca_hash)?)));
    }
    if let Some(path) = &conn.ca_file {
        let pem = std::fs::read_to_string(path).with_context(|| format!("reading the CA file {}", path.display()))?;
        return Ok(Some(Trust::Ca(pem)));
    }
    Ok(config_ca.map(Trust::Ca))
}

pub fn ca_hashes(texts: &[String]) -> anyhow::Result<Vec<CaHash>> {
    texts.iter().map(|text| text.trim().parse::<CaHash>().map_err(|e| anyhow::anyhow!("--ca-hash: {e}"))).collect()
}
