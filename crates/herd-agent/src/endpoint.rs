//! The agent's own endpoint, over TLS with the node's certificate: who it
//! is (`/healthz`, open), and, for a caller whose certificate names the
//! holder of a grant for that one action ([`crate::peer_access`]), its
//! volumes (a manifest, and files streamed from any offset, `Range:
//! bytes=N-`, so that a copy resumes), its members' logs, and the steps of
//! a migration (stop, start, forget a member). For a master failover: the
//! master it follows (any certificate of the cluster may ask), its
//! configuration copy, and the announcement of a new master (each with a
//! grant).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::extract::connect_info::Connected;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::IncomingStream;
use herd_core::ValidationErrors;
use herd_core::api::{LOG_OFFSET_HEADER, LogStream, log_window};
use herd_core::failover::{Announcement, MasterView};
use herd_core::grant::{Access, Holder};
use herd_core::validation::{FieldPath, check_name};
use herd_tls::listener::TlsListener;
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::configuration::ConfigCopies;
use crate::members::Members;
use crate::peer_access::PeerAccess;
use crate::volumes;
use crate::{AgentError, Identity};

/// Who called, as the certificate it showed names it (None: it showed
/// none of the cluster's).
#[derive(Clone)]
struct Caller(Option<Holder>);

impl Connected<IncomingStream<'_, TlsListener>> for Caller {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Caller {
        let certificates = stream.io().get_ref().1.peer_certificates();
        Caller(certificates.and_then(|chain| chain.first()).and_then(herd_tls::peer::holder_of))
    }
}

#[derive(Clone)]
struct EndpointState {
    identity: Identity,
    members: Members,
    copies: ConfigCopies,
    access: PeerAccess,
    /// Hashes of volume files already read (a copy reads the source's
    /// manifest twice).
    hashes: Arc<volumes::HashCache>,
}

/// An error answer: status and a message.
struct Refusal(StatusCode, String);

impl Refusal {
    fn internal(error: impl std::fmt::Display) -> Self {
        Refusal(StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "message": self.1 }))).into_response()
    }
}

impl EndpointState {
    /// Whether the caller holds a grant for `asked` (see [`PeerAccess::allow`]).
    fn allow(&self, headers: &HeaderMap, caller: &Caller, asked: Access) -> Result<(), Refusal> {
        self.access.allow(headers, caller.0.as_ref(), asked).map_err(|(status, why)| Refusal(status, why))
    }

    /// Names that cannot leave the data dir: `(field, name)` pairs.
    fn check_names(names: &[(&str, &str)]) -> Result<(), Refusal> {
        let mut errors = ValidationErrors::new();
        for (field, name) in names {
            check_name(&FieldPath::root(field), name, &mut errors);
        }
        errors.into_result().map_err(|errors| Refusal(StatusCode::BAD_REQUEST, errors.to_string()))
    }

    /// A request about one member: its grant, and a member name.
    fn member_request(&self, headers: &HeaderMap, caller: &Caller, asked: Access, member: &str) -> Result<(), Refusal> {
        self.allow(headers, caller, asked)?;
        Self::check_names(&[("member", member)])
    }

    /// The directory of an existing volume; the names are checked first.
    fn volume_dir(&self, member: &str, volume: &str) -> Result<std::path::PathBuf, Refusal> {
        Self::check_names(&[("member", member), ("volume", volume)])?;
        let dir = self.members.volume_dir(member, volume);
        if !dir.is_dir() {
            return Err(Refusal(
                StatusCode::NOT_FOUND,
                format!("volume {member}/{volume} does not exist on {}", self.identity.node_name),
            ));
        }
        Ok(dir)
    }
}

async fn manifest(
    State(state): State<EndpointState>,
    ConnectInfo(caller): ConnectInfo<Caller>,
    headers: HeaderMap,
    Path((member, volume)): Path<(String, String)>,
) -> Result<Response, Refusal> {
    state.allow(&headers, &caller, Access::read_volume(&member, &volume))?;
    let dir = state.volume_dir(&member, &volume)?;
    let hashes = state.hashes.clone();
    let manifest = tokio::task::spawn_blocking(move || volumes::manifest_cached(&dir, &hashes))
        .await
        .map_err(Refusal::internal)?
        .map_err(|e| Refusal(StatusCode::INTERNAL_SERVER_ERROR, format!("reading the volume: {e}")))?;
    Ok(Json(manifest).into_response())
}

/// Every volume and partial copy this node holds.
async fn stored_volumes(
    State(state): State<EndpointState>,
    ConnectInfo(caller): ConnectInfo<Caller>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    state.allow(&headers, &caller, Access::ListVolumes)?;
    let members = state.members.clone();
    let found = tokio::task::spawn_blocking(move || members.stored_volumes())
        .await
        .map_err(Refusal::internal)?
        .map_err(|e| Refusal(StatusCode::INTERNAL_SERVER_ERROR, format!("reading the volumes: {e}")))?;
    Ok(Json(found).into_response())
}

/// How many bytes a copy in progress has staged for the volume.
async fn staged(
    State(state): State<EndpointState>,
    ConnectInfo(caller): ConnectInfo<Caller>,
    headers: HeaderMap,
    Path((member, volume)): Path<(String, String)>,
) -> Result<Response, Refusal> {
    state.allow(&headers, &caller, Access::read_volume(&member, &volume))?;
    EndpointState::check_names(&[("member", &member), ("volume", &volume)])?;
    let dir = state.members.staging_dir(&member, &volume);
    if !dir.is_dir() {
        return Err(Refusal(StatusCode::NOT_FOUND, format!("no copy of {member}/{volume} is staged")));
    }
    let bytes = tokio::task::spawn_blocking(move || volumes::staged_bytes(&dir))
        .await
        .map_err(Refusal::internal)?
        .map_err(|e| Refusal(StatusCode::INTERNAL_SERVER_ERROR, format!("reading the staged copy: {e}")))?;
    Ok(Json(json!({ "bytes": bytes })).into_response())
}

/// Stops a member (a migration's first step, asked by its target).
async fn stop_member(
    State(state): State<EndpointState>,
    ConnectInfo(caller): ConnectInfo<Caller>,
    headers: HeaderMap,
    Path(member): Path<String>,
) -> Result<Response, Refusal> {
    state.member_request(&headers, &caller, Access::StopMember { member: member.clone() }, &member)?;
    if state.members.record(&member).is_none() {
        return Err(Refusal(StatusCode::NOT_FOUND, format!("member {member} is not on {}", state.identity.node_name)));
    }
    state.members.stop(&member).await.map_err(Refusal::internal)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Starts a known member again with its recorded run (a failed
/// migration's way back: the member runs where it was).
async fn start_member(
    State(state): State<EndpointState>,
    ConnectInfo(caller): ConnectInfo<Caller>,
    headers: HeaderMap,
    Path(member): Path<String>,
) -> Result<Response, Refusal> {
    state.member_request(&headers, &caller, Access::StartMember { member: member.clone() }, &member)?;
    let Some(record) = state.members.record(&member) else {
        return Err(Refusal(StatusCode::NOT_FOUND, format!("member {member} is not on {}", state.identity.node_name)));
    };
    let instance = state.members.start(&member, record.run).await.map_err(Refusal::internal)?;
    Ok(Json(json!({ "instanceId": instance })).into_response())
}

#[derive(Deserialize)]
struct LogQuery {
    /// `stdout` (default), `stderr` or `setup`.
    stream: Option<String>,
    /// At most this many bytes (default 64 KiB): the last ones, or those
    /// from `offset`.
    bytes: Option<u64>,
    /// From this byte of the log on (`herd logs -f`).
    offset: Option<u64>,
}

/// The end of a member's log file.
async fn member_log(
    State(state): State<EndpointState>,
    ConnectInfo(caller): ConnectInfo<Caller>,
    headers: HeaderMap,
    Path(member): Path<String>,
    Query(query): Query<LogQuery>,
) -> Result<Response, Refusal> {
    state.member_request(&headers, &caller, Access::ReadLogs { member: member.clone() }, &member)?;
    let stream = LogStream::of_query(query.stream.as_deref()).map_err(|why| Refusal(StatusCode::BAD_REQUEST, why))?;
    let most = query.bytes.unwrap_or(64 * 1024);
    let answer = |start: u64, bytes: Vec<u8>| {
        let headers = [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8".to_string()),
            (header::HeaderName::from_static(LOG_OFFSET_HEADER), start.to_string()),
        ];
        (headers, bytes).into_response()
    };
    if stream == LogStream::Setup {
        let output =
            state.members.record(&member).and_then(|record| crate::setup::output(&state.members, &record, most));
        return match output {
            Some(text) => {
                let text = text.into_bytes();
                let (start, end) = log_window(0, text.len() as u64, query.offset, most);
                Ok(answer(start, text[start as usize..end as usize].to_vec()))
            }
            None => Err(Refusal(
                StatusCode::NOT_FOUND,
                format!(
                    "member {member} on {} is not an app-cluster member: it has no setup",
                    state.identity.node_name
                ),
            )),
        };
    }
    let path = state.members.member_dir(&member).join(format!("{stream}.log"));
    let read = tokio::task::spawn_blocking(move || crate::member_logs::read_window(&path, query.offset, most));
    match read.await.map_err(Refusal::internal)?.map_err(Refusal::internal)? {
        Some((start, text)) => Ok(answer(start, text)),
        None => Err(Refusal(
            StatusCode::NOT_FOUND,
            format!("member {member} has no {stream} log on {}", state.identity.node_name),
        )),
    }
}

/// Forgets a member that moved away (a migration's last step).
async fn forget_member(
    State(state): State<EndpointState>,
    ConnectInfo(caller): ConnectInfo<Caller>,
    headers: HeaderMap,
    Path(member): Path<String>,
) -> Result<Response, Refusal> {
    state.member_request(&headers, &caller, Access::ForgetMember { member: member.clone() }, &member)?;
    state.members.forget(&member).await.map_err(Refusal::internal)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
struct FileQuery {
    path: String,
}

async fn file(
    State(state): State<EndpointState>,
    ConnectInfo(caller): ConnectInfo<Caller>,
    headers: HeaderMap,
    Path((member, volume)): Path<(String, String)>,
    Query(query): Query<FileQuery>,
) -> Result<Response, Refusal> {
    state.allow(&headers, &caller, Access::read_volume(&member, &volume))?;
    let dir = state.volume_dir(&member, &volume)?;
    let path = volumes::inside(&dir, &query.path)
        .ok_or_else(|| Refusal(StatusCode::BAD_REQUEST, format!("path {:?} would leave the volume", query.path)))?;
    let metadata = tokio::fs::symlink_metadata(&path).await.ok().filter(|m| m.is_file());
    let Some(metadata) = metadata else {
        return Err(Refusal(StatusCode::NOT_FOUND, format!("no file {:?} in volume {member}/{volume}", query.path)));
    };
    let from = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.strip_suffix('-'))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        .min(metadata.len());
    let file = std::fs::File::open(&path).map_err(Refusal::internal)?;
    let mut chunks = read_chunks(file, from);
    let stream = futures_util::stream::poll_fn(move |cx| chunks.poll_recv(cx));
    let status = if from > 0 { StatusCode::PARTIAL_CONTENT } else { StatusCode::OK };
    Ok((status, [(header::CONTENT_LENGTH, (metadata.len() - from).to_string())], Body::from_stream(stream))
        .into_response())
}

/// Bytes read from a served file at once.
const SERVED_CHUNK: usize = 2 << 20;

/// Reads `file` from `from` on, on a blocking thread, straight into the
/// chunks the response sends (no copy in between); a few chunks ahead.
fn read_chunks(mut file: std::fs::File, from: u64) -> tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>> {
    use std::io::{Read, Seek};
    let (chunks, received) = tokio::sync::mpsc::channel(4);
    tokio::task::spawn_blocking(move || {
        if let Err(error) = file.seek(std::io::SeekFrom::Start(from)) {
            let _ = chunks.blocking_send(Err(error));
            return;
        }
        loop {
            // `read_to_end` fills the spare capacity without zeroing it first.
            let mut chunk = Vec::with_capacity(SERVED_CHUNK);
            match (&mut file).take(SERVED_CHUNK as u64).read_to_end(&mut chunk) {
                Ok(0) => return,
                Ok(_) => {}
                Err(error) => {
                    let _ = chunks.blocking_send(Err(error));
                    return;
                }
            }
            if chunks.blocking_send(Ok(bytes::Bytes::from(chunk))).is_err() {
                return;
            }
        }
    });
    received
}

async fn master_view(
    State(state): State<EndpointState>,
    ConnectInfo(caller): ConnectInfo<Caller>,
) -> Result<Json<MasterView>, Refusal> {
    if caller.0.is_none() {
        return Err(Refusal(StatusCode::FORBIDDEN, "show a certificate of the cluster".into()));
    }
    Ok(Json(state.copies.view(&state.identity.node_name)))
}

async fn configuration_copy(
    State(state): State<EndpointState>,
    ConnectInfo(caller): ConnectInfo<Caller>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    state.allow(&headers, &caller, Access::ReadConfiguration)?;
    let document = state.copies.document().ok_or_else(|| {
        Refusal(StatusCode::NOT_FOUND, format!("node {} holds no configuration copy", state.identity.node_name))
    })?;
    Ok(([(header::CONTENT_TYPE, "application/json")], document).into_response())
}

async fn announce_master(
    State(state): State<EndpointState>,
    ConnectInfo(caller): ConnectInfo<Caller>,
    headers: HeaderMap,
    Json(announcement): Json<Announcement>,
) -> Result<Json<MasterView>, Refusal> {
    state.allow(&headers, &caller, Access::AdoptMaster { term: announcement.term })?;
    state.copies.adopt(&announcement).map_err(|why| Refusal(StatusCode::CONFLICT, why))?;
    Ok(Json(state.copies.view(&state.identity.node_name)))
}

/// Starts serving; returns the address actually bound.
pub async fn serve(
    listen: SocketAddr,
    identity: Identity,
    (members, copies): (Members, ConfigCopies),
    access: PeerAccess,
    stop: CancellationToken,
) -> Result<SocketAddr, AgentError> {
    let listener =
        tokio::net::TcpListener::bind(listen).await.map_err(|source| AgentError::Listen { addr: listen, source })?;
    let addr = listener.local_addr().map_err(|source| AgentError::Listen { addr: listen, source })?;
    let listener = TlsListener::changing(listener, access.tls_config())
        .map_err(|source| AgentError::Listen { addr: listen, source })?;
    let state = EndpointState { identity, members, copies, access, hashes: Arc::default() };
    let router = Router::new()
        .route(
            "/healthz",
            get(|State(state): State<EndpointState>| async move {
                Json(json!({ "nodeName": state.identity.node_name, "agentBootId": state.identity.agent_boot_id }))
            }),
        )
        .route(herd_core::api::MASTER_PATH, get(master_view).post(announce_master))
        .route(herd_core::api::CONFIGURATION_PATH, get(configuration_copy))
        .route("/members/{member}", axum::routing::delete(forget_member))
        .route("/members/{member}/stop", axum::routing::post(stop_member))
        .route("/members/{member}/start", axum::routing::post(start_member))
        .route("/members/{member}/logs", get(member_log))
        .route(herd_core::api::VOLUMES_PATH, get(stored_volumes))
        .route("/volumes/{member}/{volume}", get(manifest))
        .route("/volumes/{member}/{volume}/file", get(file))
        .route("/volumes/{member}/{volume}/staged", get(staged))
        .with_state(state);
    tokio::spawn(async move {
        let service = router.into_make_service_with_connect_info::<Caller>();
        if let Err(error) = axum::serve(listener, service).with_graceful_shutdown(stop.cancelled_owned()).await {
            tracing::error!(%error, "agent endpoint failed");
        }
    });
    Ok(addr)
}
