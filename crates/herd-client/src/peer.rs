//! Talking to an agent's own endpoint with the cluster's peer token: a
//! volume's manifest, and its files from any offset.

use std::time::Duration;

use herd_core::api::{
    StoredVolume, VOLUMES_PATH, VolumeManifest, member_path, volume_file_path, volume_path, volume_staged_path,
};

use crate::ClientError;

#[derive(Clone)]
pub struct PeerClient {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl PeerClient {
    /// `address` is `host:port` (as in a Node's status) or a base URL.
    pub fn new(address: &str, token: &str) -> PeerClient {
        let base = if address.contains("://") { address.to_string() } else { format!("http://{address}") };
        herd_tls::install_provider();
        let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(5)).build().unwrap_or_default();
        PeerClient { base: base.trim_end_matches('/').to_string(), token: token.to_string(), http }
    }

    fn unreachable(&self, error: reqwest::Error) -> ClientError {
        ClientError::AgentUnreachable { agent: self.base.clone(), reason: crate::error_chain(&error) }
    }

    async fn checked(&self, response: reqwest::Response) -> Result<reqwest::Response, ClientError> {
        if response.status().is_success() {
            return Ok(response);
        }
        let url = response.url().to_string();
        let code = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        Err(ClientError::Protocol { url, reason: format!("status {code}: {body}") })
    }

    /// The volume's manifest; None when the agent does not have it.
    pub async fn manifest(&self, member: &str, volume: &str) -> Result<Option<VolumeManifest>, ClientError> {
        let url = format!("{}{}", self.base, volume_path(member, volume));
        let response = self.http.get(&url).bearer_auth(&self.token).timeout(Duration::from_secs(120)).send().await;
        let response = response.map_err(|e| self.unreachable(e))?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = self.checked(response).await?;
        let body = response.bytes().await.map_err(|e| self.unreachable(e))?;
        serde_json::from_slice(&body).map(Some).map_err(|e| ClientError::Protocol { url, reason: e.to_string() })
    }

    /// Every volume and partial copy that agent holds.
    pub async fn stored_volumes(&self) -> Result<Vec<StoredVolume>, ClientError> {
        let url = format!("{}{VOLUMES_PATH}", self.base);
        let response = self.http.get(&url).bearer_auth(&self.token).send().await.map_err(|e| self.unreachable(e))?;
        let body = self.checked(response).await?.bytes().await.map_err(|e| self.unreachable(e))?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Protocol { url, reason: e.to_string() })
    }

    /// How many bytes a copy in progress has staged for the volume (None:
    /// no copy staged).
    pub async fn staged(&self, member: &str, volume: &str) -> Result<Option<u64>, ClientError> {
        let url = format!("{}{}", self.base, volume_staged_path(member, volume));
        let response = self.http.get(&url).bearer_auth(&self.token).send().await.map_err(|e| self.unreachable(e))?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let body = self.checked(response).await?.bytes().await.map_err(|e| self.unreachable(e))?;
        let value: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| ClientError::Protocol { url: url.clone(), reason: e.to_string() })?;
        Ok(value["bytes"].as_u64())
    }

    /// The end of a member's log (`stdout` or `stderr`), at most `bytes`.
    pub async fn member_log(&self, member: &str, stream: &str, bytes: u64) -> Result<String, ClientError> {
        let url = format!("{}{}/logs", self.base, member_path(member));
        let query = [("stream", stream.to_string()), ("bytes", bytes.to_string())];
        let response =
            self.http.get(&url).bearer_auth(&self.token).query(&query).send().await.map_err(|e| self.unreachable(e))?;
        self.checked(response).await?.text().await.map_err(|e| self.unreachable(e))
    }

    /// Stops a member on that agent (nothing when it is not there).
    pub async fn stop_member(&self, member: &str) -> Result<(), ClientError> {
        let url = format!("{}{}/stop", self.base, member_path(member));
        self.done_unless_missing(self.http.post(&url)).await
    }

    /// Starts a member that agent knows again, with its recorded run;
    /// returns its new instance id.
    pub async fn start_member(&self, member: &str) -> Result<String, ClientError> {
        let url = format!("{}{}/start", self.base, member_path(member));
        let response = self.http.post(&url).bearer_auth(&self.token).send().await.map_err(|e| self.unreachable(e))?;
        let body = self.checked(response).await?.bytes().await.map_err(|e| self.unreachable(e))?;
        let value: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| ClientError::Protocol { url, reason: e.to_string() })?;
        Ok(value["instanceId"].as_str().unwrap_or_default().to_string())
    }

    /// Has that agent forget a member: stopped, its volumes and record
    /// removed (nothing when it is not there).
    pub async fn forget_member(&self, member: &str) -> Result<(), ClientError> {
        let url = format!("{}{}", self.base, member_path(member));
        self.done_unless_missing(self.http.delete(&url)).await
    }

    /// Sends a request whose work is done when the member is not there
    /// (404), so that repeating it is harmless.
    async fn done_unless_missing(&self, request: reqwest::RequestBuilder) -> Result<(), ClientError> {
        let response = request.bearer_auth(&self.token).send().await.map_err(|e| self.unreachable(e))?;
        if response.status() != reqwest::StatusCode::NOT_FOUND {
            self.checked(response).await?;
        }
        Ok(())
    }

    /// One file of the volume from byte `from` on, as a streaming response.
    pub async fn file(
        &self,
        member: &str,
        volume: &str,
        path: &str,
        from: u64,
    ) -> Result<reqwest::Response, ClientError> {
        let url = format!("{}{}", self.base, volume_file_path(member, volume));
        let request = self.http.get(&url).bearer_auth(&self.token).query(&[("path", path)]);
        let request = if from > 0 { request.header(reqwest::header::RANGE, format!("bytes={from}-")) } else { request };
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        self.checked(response).await
    }
}
