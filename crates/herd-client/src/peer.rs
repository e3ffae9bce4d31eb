//! Talking to another node's agent endpoint over TLS, showing this side's
//! certificate and, with each request, the grant for that one action: a
//! volume's manifest and its files from any offset, a member's log, and
//! the steps of a migration.

use std::time::Duration;

use herd_core::api::{
    CONFIGURATION_PATH, LogChunk, LogStream, MASTER_PATH, StoredVolume, VOLUMES_PATH, VolumeManifest, member_path,
    volume_file_path, volume_path, volume_staged_path,
};
use herd_core::configuration::Configuration;
use herd_core::failover::{Announcement, MasterView};
use herd_core::grant::Access;
use herd_tls::ServingIdentity;
use herd_tls::grant::{GRANT_HEADER, read_unverified};

use crate::ClientError;

#[derive(Clone)]
pub struct PeerClient {
    base: String,
    /// The grants this caller holds for that node, by the action each names.
    grants: Vec<(Access, String)>,
    http: reqwest::Client,
}

impl PeerClient {
    /// A client for the agent of `node` at `address` (`host:port`, as in
    /// a Node's status), which must show `node`'s certificate; `identity`
    /// is this side's (its chain ends with the cluster CA). `grants` are
    /// signed grants; each request shows the one for its action.
    pub fn new(
        address: &str,
        node: &str,
        identity: &ServingIdentity,
        grants: &[String],
    ) -> Result<PeerClient, ClientError> {
        herd_tls::install_provider();
        let config = herd_tls::peer::client_config(identity, node).map_err(|e| ClientError::Tls(e.to_string()))?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .tls_backend_preconfigured(config)
            .build()
            .map_err(|e| ClientError::Tls(crate::error_chain(&e)))?;
        let grants =
            grants.iter().filter_map(|signed| Some((read_unverified(signed)?.access, signed.clone()))).collect();
        let base = format!("https://{}", address.trim_end_matches('/'));
        Ok(PeerClient { base, grants, http })
    }

    /// The request, with the grant for `access` when this caller has one
    /// (without, the agent refuses it and says so).
    fn granted(&self, request: reqwest::RequestBuilder, access: Access) -> reqwest::RequestBuilder {
        match self.grants.iter().find(|(granted, _)| *granted == access) {
            Some((_, signed)) => request.header(GRANT_HEADER, signed),
            None => request,
        }
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
        if code == 404 {
            // The agent's own word that it does not have what was asked.
            let message = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_string))
                .unwrap_or(body);
            return Err(ClientError::Api(herd_core::api::Status::new(herd_core::api::StatusReason::NotFound, message)));
        }
        Err(ClientError::Protocol { url, reason: format!("status {code}: {body}") })
    }

    /// The volume's manifest; None when the agent does not have it.
    pub async fn manifest(&self, member: &str, volume: &str) -> Result<Option<VolumeManifest>, ClientError> {
        let url = format!("{}{}", self.base, volume_path(member, volume));
        let request = self.granted(self.http.get(&url), Access::read_volume(member, volume));
        let response = request.timeout(Duration::from_secs(120)).send().await;
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
        let request = self.granted(self.http.get(&url), Access::ListVolumes);
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        let body = self.checked(response).await?.bytes().await.map_err(|e| self.unreachable(e))?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Protocol { url, reason: e.to_string() })
    }

    /// How many bytes a copy in progress has staged for the volume (None:
    /// no copy staged).
    pub async fn staged(&self, member: &str, volume: &str) -> Result<Option<u64>, ClientError> {
        let url = format!("{}{}", self.base, volume_staged_path(member, volume));
        let request = self.granted(self.http.get(&url), Access::read_volume(member, volume));
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let body = self.checked(response).await?.bytes().await.map_err(|e| self.unreachable(e))?;
        let value: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| ClientError::Protocol { url: url.clone(), reason: e.to_string() })?;
        Ok(value["bytes"].as_u64())
    }

    /// The end of a member's log (`stdout` or `stderr`), at most `bytes`.
    /// A piece of a member's log: the last `bytes`, or at most `bytes`
    /// from `offset` on.
    pub async fn member_log(
        &self,
        member: &str,
        stream: LogStream,
        bytes: u64,
        offset: Option<u64>,
    ) -> Result<LogChunk, ClientError> {
        let url = format!("{}{}/logs", self.base, member_path(member));
        let mut query = vec![("stream", stream.as_str().to_string()), ("bytes", bytes.to_string())];
        query.extend(offset.map(|offset| ("offset", offset.to_string())));
        let request = self.granted(self.http.get(&url), Access::ReadLogs { member: member.into() });
        let response = request.query(&query).send().await.map_err(|e| self.unreachable(e))?;
        let response = self.checked(response).await?;
        let offset = crate::log_offset(&response, &url)?;
        let bytes = response.bytes().await.map_err(|e| self.unreachable(e))?.to_vec();
        Ok(LogChunk { offset, bytes })
    }

    /// Which master that agent follows and whether it reaches it (any
    /// certificate of the cluster may ask; no grant).
    pub async fn master_view(&self) -> Result<MasterView, ClientError> {
        let url = format!("{}{MASTER_PATH}", self.base);
        let response = self.http.get(&url).timeout(Duration::from_secs(3)).send().await;
        let body = self.checked(response.map_err(|e| self.unreachable(e))?).await?;
        let body = body.bytes().await.map_err(|e| self.unreachable(e))?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Protocol { url, reason: e.to_string() })
    }

    /// That master candidate's configuration copy.
    pub async fn configuration(&self) -> Result<Configuration, ClientError> {
        let url = format!("{}{CONFIGURATION_PATH}", self.base);
        let request = self.granted(self.http.get(&url), Access::ReadConfiguration);
        let response = request.timeout(Duration::from_secs(60)).send().await.map_err(|e| self.unreachable(e))?;
        let body = self.checked(response).await?.bytes().await.map_err(|e| self.unreachable(e))?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Protocol { url, reason: e.to_string() })
    }

    /// Tells that agent to follow the master of `announcement`.
    pub async fn announce(&self, announcement: &Announcement) -> Result<(), ClientError> {
        let url = format!("{}{MASTER_PATH}", self.base);
        let access = Access::AdoptMaster { term: announcement.term };
        let request = self.granted(self.http.post(&url), access).json(announcement).timeout(Duration::from_secs(5));
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        self.checked(response).await.map(|_| ())
    }

    /// Stops a member on that agent (nothing when it is not there).
    pub async fn stop_member(&self, member: &str) -> Result<(), ClientError> {
        let url = format!("{}{}/stop", self.base, member_path(member));
        self.done_unless_missing(self.granted(self.http.post(&url), Access::StopMember { member: member.into() })).await
    }

    /// Starts a member that agent knows again, with its recorded run;
    /// returns its new instance id.
    pub async fn start_member(&self, member: &str) -> Result<String, ClientError> {
        let url = format!("{}{}/start", self.base, member_path(member));
        let request = self.granted(self.http.post(&url), Access::StartMember { member: member.into() });
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        let body = self.checked(response).await?.bytes().await.map_err(|e| self.unreachable(e))?;
        let value: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| ClientError::Protocol { url, reason: e.to_string() })?;
        Ok(value["instanceId"].as_str().unwrap_or_default().to_string())
    }

    /// Has that agent forget a member: stopped, its volumes and record
    /// removed (nothing when it is not there).
    pub async fn forget_member(&self, member: &str) -> Result<(), ClientError> {
        let url = format!("{}{}", self.base, member_path(member));
        self.done_unless_missing(self.granted(self.http.delete(&url), Access::ForgetMember { member: member.into() }))
            .await
    }

    /// Sends a request whose work is done when the member is not there
    /// (404), so that repeating it is harmless.
    async fn done_unless_missing(&self, request: reqwest::RequestBuilder) -> Result<(), ClientError> {
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
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
        let request = self.granted(self.http.get(&url), Access::read_volume(member, volume)).query(&[("path", path)]);
        let request = if from > 0 { request.header(reqwest::header::RANGE, format!("bytes={from}-")) } else { request };
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        self.checked(response).await
    }
}
