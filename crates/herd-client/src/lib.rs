//! A typed client for the herd HTTP API, used by the CLI, the agent and the
//! tests. It knows several server URLs and moves to the next when one
//! cannot be connected to. A request that may safely be sent twice (a
//! read, a watch, a write guarded by its resourceVersion) also moves on
//! when a server takes the connection but does not answer within
//! [`ANSWER_TIMEOUT`] (a paused or hung server); any other write is never
//! sent twice, and its error says so. After a time-out the next request
//! starts at the next server: a hung server is left behind.

mod follow;
mod peer;
mod watch;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use herd_core::api::{
    AgentReport, CLUSTER_STATUS_PATH, ClusterStatus, HeartbeatResponse, JOIN_TOKENS_PATH, JoinRequest, JoinResponse,
    JoinTokenInfo, JoinTokenList, JoinTokenRequest, LogChunk, LogStream, ObjectList, Status, StatusReason,
    StoredVolume, collection_path, node_commands_path, node_volumes_path, object_path,
};
use herd_core::kinds::CommandSpec;
use herd_core::{Object, Resource};
use reqwest::{Method, RequestBuilder};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use follow::Following;
pub use peer::PeerClient;
pub use watch::WatchStream;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection may take to be made.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a server may take to start answering a request that can be
/// sent to the next server instead (not the last one tried, which gets the
/// whole request timeout).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(3);

/// Whether a request may reach the servers twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resend {
    /// Twice changes nothing: a read, a watch, a write that compares the
    /// resourceVersion it was based on (a second copy gets a conflict).
    Safe,
    /// A second copy could act twice: sent once at most.
    Never,
}

impl Resend {
    /// A replace is guarded when it names the resourceVersion it replaces.
    fn for_replace(object: &Value) -> Resend {
        let guarded = object["metadata"]["resourceVersion"].as_str().is_some_and(|rv| !rv.is_empty());
        if guarded { Resend::Safe } else { Resend::Never }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error status.
    #[error("{}", format_status(.0))]
    Api(Status),
    #[error("cannot reach the herd server ({servers}): {reason}")]
    Unreachable { servers: String, reason: String },
    #[error("cannot reach the agent at {agent}: {reason}")]
    AgentUnreachable { agent: String, reason: String },
    #[error("unexpected answer from {url}: {reason}")]
    Protocol { url: String, reason: String },
    /// The server's certificate does not lead to the trusted cluster CA, or
    /// is not the API server's (a node's, shown by someone in between).
    #[error("refusing the herd server at {server}: its certificate is not the cluster API server's ({reason})")]
    Untrusted { server: String, reason: String },
    #[error("TLS settings: {0}")]
    Tls(String),
    /// The node is offline: herd never contacts it (not even to try).
    #[error(
        "node {node} is offline: herd does not contact an offline node (`herd node modify {node} --role regular` brings it back)"
    )]
    Offline { node: String },
}

/// Whether a request failed because the server's certificate was refused.
fn is_untrusted(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(cause) = source {
        // An io::Error's source() skips the error it wraps: look inside.
        let inner = cause
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|e| e as &(dyn std::error::Error + 'static));
        for candidate in [Some(cause), inner].into_iter().flatten() {
            if let Some(tls) = candidate.downcast_ref::<rustls::Error>() {
                return matches!(tls, rustls::Error::InvalidCertificate(_) | rustls::Error::General(_));
            }
        }
        source = inner.unwrap_or(cause).source();
    }
    // Some layers keep only the message: rustls's own words for a refused certificate.
    let text = error_chain(error);
    text.contains("invalid peer certificate") || text.contains("not the trusted CA")
}

/// The message, then each cause it does not say already (a 422's message
/// names its causes; printing them again would say each twice).
fn format_status(status: &Status) -> String {
    let mut text = status.message.clone();
    for cause in &status.causes {
        let said = format!("{}: {}", cause.field, cause.reason);
        if !status.message.contains(&said) {
            text.push_str(&format!("\n  {said}"));
        }
    }
    text
}

impl ClientError {
    /// The API's reason, when the server answered.
    pub fn reason(&self) -> Option<StatusReason> {
        match self {
            ClientError::Api(status) => Some(status.reason),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.reason() == Some(StatusReason::NotFound)
    }
}

/// A handle on the API. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    /// Shared by every client made from this one: [`Client::set_servers`]
    /// moves them all.
    servers: Arc<std::sync::RwLock<Vec<String>>>,
    current: Arc<AtomicUsize>,
    token: Option<String>,
    timeout: Duration,
    http: reqwest::Client,
}

/// Options for writes.
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteOptions {
    pub dry_run: bool,
}

impl WriteOptions {
    fn query(self) -> Vec<(&'static str, String)> {
        if self.dry_run { vec![("dryRun", "All".into())] } else { Vec::new() }
    }
}

impl Client {
    /// A client for these server base URLs (`http://host:port`), tried in
    /// turn, presenting `token`.
    /// `https://` servers are trusted only after [`Client::with_trust`].
    pub fn new(servers: Vec<String>, token: Option<String>) -> Client {
        herd_tls::install_provider();
        let servers = servers.into_iter().map(|s| s.trim_end_matches('/').to_string()).collect();
        let http = reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT).build().unwrap_or_default();
        let servers = Arc::new(std::sync::RwLock::new(servers));
        Client { servers, current: Arc::default(), token, timeout: REQUEST_TIMEOUT, http }
    }

    /// The same client trusting only the cluster CA for `https://` servers.
    pub fn with_trust(&self, trust: &herd_tls::Trust) -> Result<Client, ClientError> {
        let config = herd_tls::client_config(trust).map_err(|e| ClientError::Tls(e.to_string()))?;
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .tls_backend_preconfigured(config)
            .build()
            .map_err(|e| ClientError::Tls(error_chain(&e)))?;
        Ok(Client { http, ..self.clone() })
    }

    /// The server URLs this client tries, in order.
    pub fn servers(&self) -> Vec<String> {
        self.servers.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Tries these servers from now on, the first one first (this client
    /// and every one made from it).
    pub fn set_servers(&self, servers: Vec<String>) {
        let servers = servers.into_iter().map(|s| s.trim_end_matches('/').to_string()).collect();
        *self.servers.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = servers;
        self.current.store(0, Ordering::Relaxed);
    }

    /// Moves on to the next server (the current one answered, but is of no use).
    pub fn skip_current(&self) {
        let count = self.servers().len().max(1);
        let _ = self.current.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |i| Some((i + 1) % count));
    }

    /// The same client with another per-request timeout (watches have none).
    pub fn with_timeout(&self, timeout: Duration) -> Client {
        Client { timeout, ..self.clone() }
    }

    /// The same servers with another token.
    pub fn with_token(&self, token: Option<String>) -> Client {
        Client { token, ..self.clone() }
    }

    /// Sends a request to the current server, moving on to the next ones
    /// while they cannot be connected to, or, for a request that may be
    /// sent twice, do not answer within [`ANSWER_TIMEOUT`].
    async fn send(
        &self,
        method: Method,
        path: &str,
        build: impl Fn(RequestBuilder) -> RequestBuilder,
        timeout: Option<Duration>,
        resend: Resend,
    ) -> Result<reqwest::Response, ClientError> {
        let servers = self.servers();
        let count = servers.len().max(1);
        let start = self.current.load(Ordering::Relaxed);
        let mut last_reason = "no server configured".to_string();
        for attempt in 0..count {
            let index = (start + attempt) % count;
            let Some(base) = servers.get(index) else { break };
            let mut request = self.http.request(method.clone(), format!("{base}{path}"));
            if let Some(timeout) = timeout {
                request = request.timeout(timeout);
            }
            if let Some(token) = &self.token {
                request = request.bearer_auth(token);
            }
            let another_to_try = attempt + 1 < count;
            let sent = build(request).send();
            let answered = if resend == Resend::Safe && another_to_try {
                match tokio::time::timeout(ANSWER_TIMEOUT, sent).await {
                    Ok(answered) => answered,
                    Err(_) => {
                        last_reason = format!("{base}: no answer within {ANSWER_TIMEOUT:?}");
                        continue;
                    }
                }
            } else {
                sent.await
            };
            match answered {
                Ok(response) => {
                    self.current.store(index, Ordering::Relaxed);
                    return Ok(response);
                }
                Err(error) if is_untrusted(&error) => {
                    return Err(ClientError::Untrusted { server: base.clone(), reason: error_chain(&error) });
                }
                Err(error) if error.is_connect() => last_reason = format!("{base}: {}", error_chain(&error)),
                Err(error) => {
                    let mut reason = error_chain(&error);
                    if error.is_timeout() {
                        self.current.store((index + 1) % count, Ordering::Relaxed);
                        if resend == Resend::Never {
                            reason.push_str(
                                "; it was not sent again, since it may have been carried out: look before you retry",
                            );
                        }
                    }
                    return Err(ClientError::Unreachable { servers: base.clone(), reason });
                }
            }
        }
        Err(ClientError::Unreachable { servers: servers.join(", "), reason: last_reason })
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<T, ClientError> {
        let resend = match (&method, body) {
            (&Method::GET, _) => Resend::Safe,
            (&Method::PUT, Some(object)) => Resend::for_replace(object),
            _ => Resend::Never,
        };
        self.call_resending(method, path, query, body, resend).await
    }

    async fn call_resending<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        resend: Resend,
    ) -> Result<T, ClientError> {
        let response = self
            .send(
                method,
                path,
                |request| {
                    let request = request.query(query);
                    match body {
                        Some(body) => request.json(body),
                        None => request,
                    }
                },
                Some(self.timeout),
                resend,
            )
            .await?;
        decode(response).await
    }

    pub async fn get_value(&self, plural: &str, name: &str) -> Result<Value, ClientError> {
        self.call(Method::GET, &object_path(plural, name), &[], None).await
    }

    pub async fn list_page(
        &self,
        plural: &str,
        selector: &str,
        limit: usize,
        continue_token: Option<&str>,
    ) -> Result<ObjectList<Value>, ClientError> {
        let mut query = vec![];
        if !selector.is_empty() {
            query.push(("labelSelector", selector.to_string()));
        }
        if limit > 0 {
            query.push(("limit", limit.to_string()));
        }
        if let Some(token) = continue_token {
            query.push(("continue", token.to_string()));
        }
        self.call(Method::GET, &collection_path(plural), &query, None).await
    }

    /// Every object of a kind matching `selector`, following pages.
    pub async fn list_values(&self, plural: &str, selector: &str) -> Result<ObjectList<Value>, ClientError> {
        let mut list = self.list_page(plural, selector, 500, None).await?;
        while let Some(token) = list.metadata.continue_token.take() {
            let next = self.list_page(plural, selector, 500, Some(&token)).await?;
            list.items.extend(next.items);
            list.metadata.continue_token = next.metadata.continue_token;
        }
        Ok(list)
    }

    pub async fn create_value(
        &self,
        plural: &str,
        object: &Value,
        options: WriteOptions,
    ) -> Result<Value, ClientError> {
        self.call(Method::POST, &collection_path(plural), &options.query(), Some(object)).await
    }

    pub async fn replace_value(
        &self,
        plural: &str,
        name: &str,
        object: &Value,
        options: WriteOptions,
    ) -> Result<Value, ClientError> {
        self.call(Method::PUT, &object_path(plural, name), &options.query(), Some(object)).await
    }

    pub async fn replace_status_value(
        &self,
        plural: &str,
        name: &str,
        object: &Value,
        options: WriteOptions,
    ) -> Result<Value, ClientError> {
        self.call(Method::PUT, &format!("{}/status", object_path(plural, name)), &options.query(), Some(object)).await
    }

    /// Changes an object by a JSON merge patch (its metadata and spec).
    pub async fn patch_value(&self, plural: &str, name: &str, patch: &Value) -> Result<Value, ClientError> {
        self.call(Method::PATCH, &object_path(plural, name), &[], Some(patch)).await
    }

    pub async fn delete_value(&self, plural: &str, name: &str, options: WriteOptions) -> Result<Value, ClientError> {
        self.call(Method::DELETE, &object_path(plural, name), &options.query(), None).await
    }

    pub async fn get<S: Resource>(&self, name: &str) -> Result<Object<S>, ClientError> {
        typed(self.get_value(S::PLURAL, name).await?)
    }

    pub async fn list<S: Resource>(&self, selector: &str) -> Result<Vec<Object<S>>, ClientError> {
        self.list_values(S::PLURAL, selector).await?.items.into_iter().map(typed).collect()
    }

    pub async fn create<S: Resource>(&self, object: &Object<S>) -> Result<Object<S>, ClientError> {
        typed(self.create_value(S::PLURAL, &object.to_json_value(), WriteOptions::default()).await?)
    }

    pub async fn update<S: Resource>(&self, object: &Object<S>) -> Result<Object<S>, ClientError> {
        typed(self.replace_value(S::PLURAL, object.name(), &object.to_json_value(), WriteOptions::default()).await?)
    }

    pub async fn update_status<S: Resource>(&self, object: &Object<S>) -> Result<Object<S>, ClientError> {
        typed(
            self.replace_status_value(S::PLURAL, object.name(), &object.to_json_value(), WriteOptions::default())
                .await?,
        )
    }

    /// Registers a node; the client's token must be the join token.
    pub async fn join(&self, request: &JoinRequest) -> Result<JoinResponse, ClientError> {
        self.call(Method::POST, "/api/v1/join", &[], Some(&to_value(request)?)).await
    }

    pub async fn heartbeat(&self, node: &str, report: &AgentReport) -> Result<HeartbeatResponse, ClientError> {
        self.heartbeat_as(node, report).await
    }

    /// [`Client::heartbeat`], decoding only as much of the configuration
    /// document and deltas as `C` and `D` hold.
    pub async fn heartbeat_as<C: DeserializeOwned, D: DeserializeOwned>(
        &self,
        node: &str,
        report: &AgentReport,
    ) -> Result<HeartbeatResponse<C, D>, ClientError> {
        // A heartbeat says what is: sent twice (a server that took it and
        // did not answer, then the next), it records the same facts twice,
        // and the agent forgets nothing before an answer acknowledges it. So
        // a paused server is passed within the answer timeout, not the
        // request's: the node must not come near NotReady meanwhile.
        let path = format!("{}/heartbeat", object_path("nodes", node));
        self.call_resending(Method::POST, &path, &[], Some(&to_value(report)?), Resend::Safe).await
    }

    /// Watches a kind for changes after revision `from` (None: from now).
    pub async fn watch(&self, plural: &str, from: Option<&str>, selector: &str) -> Result<WatchStream, ClientError> {
        self.watch_path(&collection_path(plural), from, selector).await
    }

    /// Follows a kind's changes after revision `from` across servers
    /// ([`Following`]: no bookmarks, no change missed or repeated when a
    /// server ends, breaks or goes silent).
    pub fn follow(&self, plural: &str, from: &str, selector: &str) -> Following {
        Following::new(self.clone(), collection_path(plural), selector.to_string(), from.to_string())
    }

    pub(crate) async fn watch_path(
        &self,
        path: &str,
        from: Option<&str>,
        selector: &str,
    ) -> Result<WatchStream, ClientError> {
        let mut query = vec![("watch", "true".to_string())];
        if let Some(from) = from {
            query.push(("resourceVersion", from.to_string()));
        }
        if !selector.is_empty() {
            query.push(("labelSelector", selector.to_string()));
        }
        let response = self.send(Method::GET, path, |r| r.query(&query), None, Resend::Safe).await?;
        let response = check(response).await?;
        Ok(WatchStream::new(response))
    }

    /// The end of a member's log on `node` (`stdout` or `stderr`).
    /// A piece of a member's log, fetched by the server from its node's
    /// agent: the last `bytes`, or at most `bytes` from `offset` on.
    pub async fn member_log(
        &self,
        node: &str,
        member: &str,
        stream: LogStream,
        bytes: u64,
        offset: Option<u64>,
    ) -> Result<LogChunk, ClientError> {
        let path = format!("{}/members/{member}/logs", object_path("nodes", node));
        let mut query = vec![("stream", stream.as_str().to_string()), ("bytes", bytes.to_string())];
        query.extend(offset.map(|offset| ("offset", offset.to_string())));
        let response = self.send(Method::GET, &path, |r| r.query(&query), Some(self.timeout), Resend::Safe).await?;
        let response = check(response).await?;
        let offset = log_offset(&response, &path)?;
        let bytes = response.bytes().await.map_err(|e| ClientError::Protocol { url: path, reason: error_chain(&e) })?;
        Ok(LogChunk { offset, bytes: bytes.to_vec() })
    }

    /// What a node's data dir holds, each with its owner (None: nothing).
    pub async fn node_volumes(&self, node: &str) -> Result<Vec<StoredVolume>, ClientError> {
        self.call(Method::GET, &node_volumes_path(node), &[], None).await
    }

    /// `herd command retry`.
    pub async fn retry_command(&self, name: &str) -> Result<Object<CommandSpec>, ClientError> {
        self.call(Method::POST, &format!("{}/retry", object_path("commands", name)), &[], None).await
    }

    /// `herd command abandon`: its work is ended, a copy's partial staging
    /// removed unless `keep_staging`.
    pub async fn abandon_command(&self, name: &str, keep_staging: bool) -> Result<Object<CommandSpec>, ClientError> {
        let query = [("keepStaging", keep_staging.to_string())];
        self.call(Method::POST, &format!("{}/abandon", object_path("commands", name)), &query, None).await
    }

    /// `herd member evict`: asks the member's budgets; a refusal is a 429
    /// naming each budget that does not allow it.
    pub async fn evict_member(&self, name: &str, dry_run: bool) -> Result<herd_core::api::Eviction, ClientError> {
        let query: Vec<(&str, String)> = if dry_run { vec![("dryRun", "All".into())] } else { Vec::new() };
        self.call(Method::POST, &format!("{}/eviction", object_path("members", name)), &query, None).await
    }

    /// Drops member `name`'s first pending notify unsent (every one, with
    /// `all`); the member as written after.
    pub async fn skip_notify(
        &self,
        name: &str,
        all: bool,
    ) -> Result<Object<herd_core::kinds::MemberSpec>, ClientError> {
        let query: Vec<(&str, String)> = if all { vec![("all", "true".into())] } else { Vec::new() };
        self.call(Method::POST, &format!("{}/notifies/skip", object_path("members", name)), &query, None).await
    }

    /// A node's Commands (with that node's token), and the revision to
    /// watch them from.
    pub async fn node_commands(&self, node: &str) -> Result<ObjectList<Object<CommandSpec>>, ClientError> {
        self.call(Method::GET, &node_commands_path(node), &[], None).await
    }

    /// Watches a node's Commands after revision `from`: the events that ask
    /// something of its agent (an attempt to take up, an abandon).
    pub async fn watch_node_commands(&self, node: &str, from: &str) -> Result<WatchStream, ClientError> {
        self.watch_path(&node_commands_path(node), Some(from), "").await
    }

    /// The leader and the replicas, as the answering replica sees them.
    pub async fn cluster_status(&self) -> Result<ClusterStatus, ClientError> {
        self.call(Method::GET, CLUSTER_STATUS_PATH, &[], None).await
    }

    /// `herd cluster verify`: the findings about nodes' roles and the pool.
    pub async fn cluster_verify(&self) -> Result<herd_core::verify::Report, ClientError> {
        self.call(Method::GET, herd_core::api::CLUSTER_VERIFY_PATH, &[], None).await
    }

    /// `herd token create`: a join or viewer token, its secret in the answer only.
    pub async fn create_join_token(&self, request: &JoinTokenRequest) -> Result<JoinTokenInfo, ClientError> {
        self.call(Method::POST, JOIN_TOKENS_PATH, &[], Some(&to_value(request)?)).await
    }

    pub async fn join_tokens(&self) -> Result<JoinTokenList, ClientError> {
        self.call(Method::GET, JOIN_TOKENS_PATH, &[], None).await
    }

    /// `herd token delete`: the token can no longer be used to join.
    pub async fn delete_join_token(&self, id: &str) -> Result<JoinTokenInfo, ClientError> {
        self.call(Method::DELETE, &format!("{JOIN_TOKENS_PATH}/{id}"), &[], None).await
    }

    /// `herd node modify`: one change to a node's role or master capability.
    pub async fn change_node_role(
        &self,
        node: &str,
        request: &herd_core::api::NodeRoleRequest,
    ) -> Result<herd_core::api::NodeRoleResponse, ClientError> {
        let path = format!("{}/role", object_path("nodes", node));
        self.call(Method::POST, &path, &[], Some(&to_value(request)?)).await
    }

    /// `herd node readmit`: a deleted node's agent may join again (and
    /// whether it can with the join token it holds).
    pub async fn readmit_node(&self, node: &str) -> Result<herd_core::api::Readmission, ClientError> {
        let path = format!("{}/readmit", object_path("nodes", node));
        self.call_resending(Method::POST, &path, &[], None, Resend::Safe).await
    }

    /// The raw text of an unauthenticated endpoint (`/metrics`, `/healthz`).
    pub async fn get_text(&self, path: &str) -> Result<String, ClientError> {
        let response = check(self.send(Method::GET, path, |r| r, Some(self.timeout), Resend::Safe).await?).await?;
        response.text().await.map_err(|e| ClientError::Protocol { url: path.into(), reason: error_chain(&e) })
    }
}

fn to_value<T: Serialize>(value: &T) -> Result<Value, ClientError> {
    serde_json::to_value(value).map_err(|e| ClientError::Protocol { url: String::new(), reason: e.to_string() })
}

fn typed<S: Resource>(value: Value) -> Result<Object<S>, ClientError> {
    serde_json::from_value(value)
        .map_err(|e| ClientError::Protocol { url: S::PLURAL.into(), reason: format!("not a {}: {e}", S::KIND) })
}

/// The whole chain of an error: reqwest's Display alone hides the cause.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Where a log answer's text starts in the log ([`LOG_OFFSET_HEADER`]).
fn log_offset(response: &reqwest::Response, url: &str) -> Result<u64, ClientError> {
    let header = response.headers().get(herd_core::api::LOG_OFFSET_HEADER);
    header.and_then(|value| value.to_str().ok()?.parse().ok()).ok_or_else(|| ClientError::Protocol {
        url: url.to_string(),
        reason: format!("the answer has no {} header", herd_core::api::LOG_OFFSET_HEADER),
    })
}

/// Turns an error status into [`ClientError::Api`].
async fn check(response: reqwest::Response) -> Result<reqwest::Response, ClientError> {
    if response.status().is_success() {
        return Ok(response);
    }
    let url = response.url().to_string();
    let code = response.status().as_u16();
    let body = response.bytes().await.unwrap_or_default();
    match serde_json::from_slice::<Status>(&body) {
        Ok(status) => Err(ClientError::Api(status)),
        Err(_) => {
            Err(ClientError::Protocol { url, reason: format!("status {code}: {}", String::from_utf8_lossy(&body)) })
        }
    }
}

async fn decode<T: DeserializeOwned>(response: reqwest::Response) -> Result<T, ClientError> {
    let response = check(response).await?;
    let url = response.url().to_string();
    let body =
        response.bytes().await.map_err(|e| ClientError::Protocol { url: url.clone(), reason: error_chain(&e) })?;
    serde_json::from_slice(&body).map_err(|e| ClientError::Protocol { url, reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_replace_that_names_its_resource_version_may_be_sent_twice() {
        let guarded = serde_json::json!({"metadata": {"name": "n1", "resourceVersion": "42"}});
        assert_eq!(Resend::for_replace(&guarded), Resend::Safe);
        let blind = serde_json::json!({"metadata": {"name": "n1"}});
        assert_eq!(Resend::for_replace(&blind), Resend::Never);
        let empty = serde_json::json!({"metadata": {"name": "n1", "resourceVersion": ""}});
        assert_eq!(Resend::for_replace(&empty), Resend::Never);
    }

    #[test]
    fn a_cause_the_message_says_is_not_printed_again() {
        let cause = |field: &str, reason: &str| herd_core::FieldError { field: field.into(), reason: reason.into() };
        let mut status = Status::new(StatusReason::Invalid, "Node \"n1\" is invalid: metadata.labels[app]: bad value");
        status.causes = vec![cause("metadata.labels[app]", "bad value")];
        assert_eq!(format_status(&status), "Node \"n1\" is invalid: metadata.labels[app]: bad value");
        status.causes.push(cause("spec.role", "unknown"));
        assert_eq!(format_status(&status).lines().collect::<Vec<_>>()[1], "  spec.role: unknown");
    }
}
