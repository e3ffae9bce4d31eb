//! Wire types of the HTTP API shared by the server, the client and the agent:
//! the error body, lists, watch events, join and heartbeat.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::time::HumanDuration;
use crate::validation::FieldError;

pub fn collection_path(plural: &str) -> String {
    format!("/api/v1/{plural}")
}

pub fn object_path(plural: &str, name: &str) -> String {
    format!("/api/v1/{plural}/{name}")
}

/// Where a node lists and watches its Commands.
pub fn node_commands_path(node: &str) -> String {
    format!("/api/v1/nodes/{node}/commands")
}

/// Why a request failed, in a form scripts can branch on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum StatusReason {
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    AlreadyExists,
    Conflict,
    Gone,
    PayloadTooLarge,
    Invalid,
    TooManyRequests,
    InternalError,
    ServiceUnavailable,
}

impl StatusReason {
    pub fn http_code(self) -> u16 {
        match self {
            StatusReason::BadRequest => 400,
            StatusReason::Unauthorized => 401,
            StatusReason::Forbidden => 403,
            StatusReason::NotFound => 404,
            StatusReason::MethodNotAllowed => 405,
            StatusReason::AlreadyExists | StatusReason::Conflict => 409,
            StatusReason::Gone => 410,
            StatusReason::PayloadTooLarge => 413,
            StatusReason::Invalid => 422,
            StatusReason::TooManyRequests => 429,
            StatusReason::InternalError => 500,
            StatusReason::ServiceUnavailable => 503,
        }
    }
}

/// The body of every error response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub kind: String,
    pub code: u16,
    pub reason: StatusReason,
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<FieldError>,
}

impl Status {
    pub fn new(reason: StatusReason, message: impl Into<String>) -> Self {
        Status { kind: "Status".into(), code: reason.http_code(), reason, message: message.into(), causes: Vec::new() }
    }
}

/// Metadata of a list: the store revision it was read at (watch from there)
/// and, when paged, the token for the next page.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    pub resource_version: String,
    #[serde(default, rename = "continue", skip_serializing_if = "Option::is_none")]
    pub continue_token: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectList<T> {
    pub api_version: String,
    pub kind: String,
    pub metadata: ListMeta,
    pub items: Vec<T>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum WatchEventType {
    Added,
    Modified,
    Deleted,
    /// No change; `object.metadata.resourceVersion` says how far the watch got.
    Bookmark,
    /// The watch ended; `object` is a [`Status`] (410 Gone: relist).
    Error,
}

/// One line of a watch stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WatchEvent<T> {
    #[serde(rename = "type")]
    pub type_: WatchEventType,
    pub object: T,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinRequest {
    pub node_name: String,
    /// The node token this agent held before, when it joins again because
    /// the server stopped taking it: how a deleted node's agent is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_node_token: Option<String>,
    #[serde(flatten, deserialize_with = "crate::objects_only::object")]
    pub report: AgentReport,
}

/// What an agent tells about itself on join and in every heartbeat.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentReport {
    pub agent_boot_id: String,
    #[serde(default)]
    pub host_boot_id: Option<String>,
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default)]
    pub agent_version: Option<String>,
    /// The members this node runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberReport>,
    /// The journal: every command attempt the server has not acknowledged
    /// in its final state yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<CommandReport>,
    /// The space of the file system the agent's data dir is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskReport>,
    /// A signing request (PEM) for a new certificate of the node's
    /// identity, when it has none or its certificate is due for renewal.
    /// The key stays on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csr: Option<String>,
    /// The serial of the configuration copy it keeps (a master candidate's
    /// agent); None when it keeps none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_serial: Option<u64>,
    /// Requests the agent's endpoint refused since the last heartbeat
    /// (each becomes an Event on the node).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peer_refusals: Vec<PeerRefusal>,
    /// What the host has and what the agent keeps back from members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<NodeResources>,
    /// How the agent keeps members to their limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<IsolationReport>,
}

/// The host's cgroup layout members run in, or why they run unlimited.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IsolationReport {
    pub layout: CgroupLayout,
    /// Where members' cgroups are, or why there are none.
    pub detail: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CgroupLayout {
    /// The v1 hierarchies (memory, cpu, cpuacct, pids).
    V1,
    /// The unified v2 hierarchy.
    V2,
    /// None usable: members run without limits.
    None,
}

/// A member's process killed by the kernel for want of memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OomKill {
    /// The instance whose run it ended (or, `survived`, whose process it
    /// was).
    pub instance_id: String,
    /// The kill took another of the member's processes (a child), and its
    /// own lived on: its run did not end.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub survived: bool,
    pub at: crate::time::Timestamp,
    /// Its memory cap then (None: none; the host ran out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<crate::quantity::Bytes>,
    /// The most memory its run used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak: Option<crate::quantity::Bytes>,
}

impl std::fmt::Display for OomKill {
    /// `killed for want of memory (limit 64Mi, peak 64Mi)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let limit =
            self.limit.map_or("no limit: the host ran out".to_string(), |l| format!("limit {}", l.approximate()));
        let peak = self.peak.map(|p| format!(", peak {}", p.approximate())).unwrap_or_default();
        write!(f, "killed for want of memory ({limit}{peak})")
    }
}

/// A host's CPU, memory and data-dir disk, and the part of each the agent
/// keeps back for itself and the system (its `--reserve-*` flags).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeResources {
    pub capacity: crate::resources::Amounts,
    pub reserved: crate::resources::Amounts,
}

/// A request to an agent's endpoint that it refused: who asked (as its
/// certificate names it; None: a caller without a cluster certificate),
/// what, and why. Typed, so that the server words the Event itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PeerRefusal {
    #[serde(default)]
    pub caller: Option<crate::grant::Holder>,
    pub asked: crate::grant::Access,
    pub reason: crate::grant::Refusal,
    pub at: crate::time::Timestamp,
}

/// The most refusals one report carries (an agent keeps the newest).
pub const MAX_PEER_REFUSALS: usize = 64;

/// A certificate the cluster CA signed for a node: the chain (the node's
/// certificate, then the CA), PEM, and when it expires.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCertificate {
    pub chain_pem: String,
    pub expires: crate::time::Timestamp,
}

/// Free and total bytes of the agent's data dir file system.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiskReport {
    pub free_bytes: u64,
    pub total_bytes: u64,
}

/// One command attempt as the agent's journal has it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandReport {
    pub name: String,
    pub uid: String,
    pub attempt: u32,
    pub state: crate::kinds::AgentState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<crate::kinds::Answer>,
    pub updated: crate::time::Timestamp,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub progress: std::collections::BTreeMap<String, String>,
}

/// A command attempt whose final state the server has recorded: the agent
/// may forget it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandAck {
    pub name: String,
    pub attempt: u32,
}

/// One member as its agent reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemberReport {
    pub name: String,
    /// Whether it should run (started and not stopped).
    pub wanted: bool,
    /// Whether its process runs now.
    pub running: bool,
    /// Fresh at every start of its process: a new one means it restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<crate::time::Timestamp>,
    /// Starts after the first.
    #[serde(default)]
    pub restarts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<String>,
    /// The AppCluster it was started for, when it is an app-cluster member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The setup status file of an app-cluster member, as it reads
    /// (`<instance>=` while its setup runs, `<instance>=<exit code>` after).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_status: Option<String>,
    /// The tail of the last setup run's standard error, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_stderr: Option<String>,
    /// The last readiness check of the current instance, when the member has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<ReadinessReport>,
    /// Its last runs each ended within seconds of starting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash_loop: Option<CrashLoop>,
    /// What its role's position command last printed, for a member of a
    /// leader role that has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<PositionReport>,
    /// The term in which it was demoted (its agent fenced it, or started
    /// it again after it went down leading): it leads in no term up to
    /// that one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demoted_in: Option<u64>,
    /// Its persistent volumes this node had and that are gone: it is not
    /// started on empty ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_volumes: Vec<String>,
    /// The last time the kernel killed one of its processes for want of
    /// memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kill: Option<OomKill>,
    /// What it uses now, as its cgroup counts it (None: no cgroup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<MemberUsage>,
}

/// What a member uses: CPU since the report before (None until there
/// were two), and its memory working set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemberUsage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<crate::quantity::Millicores>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<crate::quantity::Bytes>,
}

/// What a member's position command printed: its first line is how far
/// the member has come (a number, or an LSN such as `16/B374D848`); a
/// leader's may add a line `sync <member> ...` naming the members that
/// have every write it acknowledged (`sync` alone: none has).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PositionReport {
    /// The instance it was run against.
    pub instance_id: String,
    pub position: String,
    /// The members the `sync` line names; None without one (a command
    /// that failed, or a leader shutting down, says nothing of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_sync: Option<Vec<String>>,
}

impl PositionReport {
    /// What a position command printed, for `instance`.
    pub fn parse(instance_id: &str, output: &str) -> PositionReport {
        let mut lines = output.lines().map(str::trim).filter(|l| !l.is_empty());
        let position = lines.next().unwrap_or_default().chars().take(64).collect();
        let in_sync = lines
            .find_map(|l| if l == "sync" { Some("") } else { l.strip_prefix("sync ") })
            .map(|names| names.split_whitespace().take(64).map(str::to_string).collect());
        PositionReport { instance_id: instance_id.to_string(), position, in_sync }
    }
}

/// A member whose last runs each ended within seconds of starting: its
/// agent starts it again after a pause that doubles with each such run
/// (at most 30 s), as long as it is wanted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CrashLoop {
    /// The runs in a row that ended so.
    pub runs: u32,
    /// How the last one ended (`exit status: 3`, `signal: 9 (SIGKILL)`).
    pub last_exit: String,
    /// When it is started again, while it waits (None: it runs now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_start: Option<crate::time::Timestamp>,
}

impl CrashLoop {
    /// The runs in a row that make a crash loop: one short run is a crash,
    /// the second in a row a loop (Kubernetes' CrashLoopBackOff).
    pub const RUNS: u32 = 2;
}

/// How a member's readiness check last went.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReadinessReport {
    /// The instance it was run against.
    pub instance_id: String,
    pub passing: bool,
    /// Why it failed (exit status and output tail, or the connect error).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// Since when the check has come out this way for this instance: not
    /// the time of the last check, which would make every heartbeat a
    /// change of the node to write and act on (agents before 0.1 sent
    /// that as `at`).
    #[serde(alias = "at")]
    pub since: crate::time::Timestamp,
}

impl ReadinessReport {
    /// The report of a check that came out as `self` again: the same
    /// `since` when nothing but the time changed.
    pub fn continuing(mut self, before: Option<&ReadinessReport>) -> ReadinessReport {
        if let Some(before) =
            before.filter(|b| (&b.instance_id, b.passing, &b.detail) == (&self.instance_id, self.passing, &self.detail))
        {
            self.since = before.since;
        }
        self
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinResponse {
    pub node_name: String,
    /// The node's own credential; the join token is not needed again.
    pub node_token: String,
    pub heartbeat_period: HumanDuration,
    /// The public key grants are signed with (Ed25519, base64url): the
    /// agent's endpoint serves only requests that show a grant it verifies.
    pub grant_key: String,
    /// The node's certificate, when the join carried a signing request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<NodeCertificate>,
}

/// `C` and `D` are how the configuration document and its deltas are
/// held: decoded by the agent, as their stored JSON by the server, which
/// passes them on without decoding them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", bound(deserialize = "C: Deserialize<'de>, D: Deserialize<'de>"))]
pub struct HeartbeatResponse<C = crate::configuration::Configuration, D = crate::configuration::Delta> {
    /// The period the agent should use from now on (ClusterConfig).
    pub heartbeat_period: HumanDuration,
    /// The public key grants are signed with (as in [`JoinResponse`]).
    pub grant_key: String,
    /// Command attempts whose final state is recorded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acknowledged: Vec<CommandAck>,
    /// A renewed certificate, when the heartbeat carried a signing request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<NodeCertificate>,
    /// The small facts every node keeps (Ganeti's ssconf).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssconf: Option<crate::configuration::Ssconf>,
    /// The configuration, for a master candidate whose copy is older and
    /// that the deltas below cannot bring up to date.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<C>,
    /// What changed since the serial the candidate holds, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub configuration_deltas: Vec<D>,
    /// The node is no master candidate: it deletes its copy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drop_configuration: bool,
    /// The Command attempts that ended whose grants this node's agent
    /// serves and that have not expired: it refuses them from now on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ended_attempts: Vec<crate::grant::EndedAttempt>,
    /// A master failover superseded the answering server: the facts name
    /// the master to follow instead, and nothing else in the answer counts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub superseded: bool,
    /// The role leader leases this heartbeat renewed, of members it
    /// reported running and ready: each holds until `renewDeadline` after
    /// the heartbeat was sent, unless a later answer renews it again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<LeaseRenewal>,
}

/// A member's role leader lease, renewed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseRenewal {
    pub member: String,
    /// The run that leads.
    pub instance: String,
    pub term: u64,
    pub renew_deadline: HumanDuration,
    /// The lease's duration: no new term is granted before it has passed
    /// unrenewed on the herd leader's clock.
    pub lease_duration: HumanDuration,
    /// The members the herd leader has on record as in sync with this
    /// leader: only these may be promoted after it. A synchronous app
    /// lets a replica stop holding up its commits only once it is not
    /// here any more (a leader cut off from the herd leader hears nothing,
    /// so it never acknowledges a commit alone that its successor lacks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_sync: Vec<String>,
}

pub const CLUSTER_STATUS_PATH: &str = "/api/v1/cluster/status";

/// A member's log answer carries, in this header, the byte offset in the
/// log where its text starts: `herd logs -f` asks from there on next.
pub const LOG_OFFSET_HEADER: &str = "herd-log-offset";

/// Which of a member's logs: its process's standard output or error, or
/// its setup's output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogStream {
    #[default]
    Stdout,
    Stderr,
    Setup,
}

impl LogStream {
    pub fn as_str(self) -> &'static str {
        match self {
            LogStream::Stdout => "stdout",
            LogStream::Stderr => "stderr",
            LogStream::Setup => "setup",
        }
    }

    /// The stream a query names (stdout when it names none).
    pub fn of_query(stream: Option<&str>) -> Result<Self, String> {
        match stream.unwrap_or("stdout") {
            "stdout" => Ok(LogStream::Stdout),
            "stderr" => Ok(LogStream::Stderr),
            "setup" => Ok(LogStream::Setup),
            other => Err(format!("stream must be stdout, stderr or setup, is {other:?}")),
        }
    }
}

impl std::fmt::Display for LogStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A piece of a member's log and where in the log it starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogChunk {
    pub offset: u64,
    pub bytes: Vec<u8>,
}

impl LogChunk {
    /// Where the next piece starts.
    pub fn end(&self) -> u64 {
        self.offset + self.bytes.len() as u64
    }
}

/// Which part of a log to send, of the bytes `first..end` kept of it
/// (rotation took those before `first`): from `offset` (from `first` when
/// rotation took the bytes before it, or when the log is shorter than
/// that: it was started again), or else the last `most` bytes; at most
/// `most` bytes either way. Returns (start, end).
pub fn log_window(first: u64, end: u64, offset: Option<u64>, most: u64) -> (u64, u64) {
    let start = match offset {
        Some(offset) if offset > end => first,
        Some(offset) => offset.max(first),
        None => end.saturating_sub(most).max(first),
    };
    (start, end.min(start.saturating_add(most)))
}

/// `herd cluster verify`'s findings (`herd_core::verify::Report`).
pub const CLUSTER_VERIFY_PATH: &str = "/api/v1/cluster/verify";

/// Where every kind's descriptor is served (the dashboard's tables).
pub const KINDS_PATH: &str = "/api/v1/kinds";

/// The control plane as the answering replica sees it (`herd cluster status`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// The replica that answered.
    pub served_by: String,
    /// The name of the leader Lease.
    pub lock_name: String,
    /// Who holds the lease; None when nobody does (released, or never taken).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<LeaderInfo>,
    /// How many times the lease changed hands.
    pub lease_transitions: u64,
    pub replicas: Vec<ReplicaInfo>,
    /// Why the answering server does not lead: a master failover
    /// superseded it (SQLite only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaderInfo {
    pub identity: String,
    /// The leadership term: the lease's transition count when it was won.
    pub term: u64,
    /// When it took the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<crate::time::Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed: Option<crate::time::Timestamp>,
    pub lease_duration_seconds: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaInfo {
    pub name: String,
    pub url: String,
    pub state: crate::kinds::ReplicaState,
    pub started_at: crate::time::Timestamp,
    pub last_seen: crate::time::Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<crate::time::Timestamp>,
    pub version: String,
    /// Since the answering replica saw this record change, on its own
    /// monotonic clock (immune to the other replica's clock skew).
    pub silent_for: crate::time::HumanDuration,
    /// How long it has been up: its own record's span (both ends from its
    /// clock, so skew cancels) plus `silentFor`.
    pub up_for: crate::time::HumanDuration,
}

/// What a volume holds, as its agent sees it: every regular file with its
/// size and blake3 hash, and a checksum over all of them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeManifest {
    /// Relative paths, `/`-separated, sorted.
    pub files: Vec<ManifestFile>,
    /// Bytes in all files.
    pub size: u64,
    /// blake3 over the sorted (path, size, hash) lines: two volumes with
    /// the same checksum hold the same files.
    pub checksum: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManifestFile {
    pub path: String,
    pub size: u64,
    pub blake3: String,
}

impl VolumeManifest {
    /// The manifest of `files` (in any order).
    pub fn of(mut files: Vec<ManifestFile>) -> Self {
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let mut hasher = blake3::Hasher::new();
        for file in &files {
            hasher.update(format!("{}\0{}\0{}\n", file.path, file.size, file.blake3).as_bytes());
        }
        VolumeManifest {
            size: files.iter().map(|f| f.size).sum(),
            checksum: hasher.finalize().to_hex().to_string(),
            files,
        }
    }
}

/// An agent's member (peer token required): `POST .../stop` stops it,
/// `DELETE` forgets it (stopped, volumes and record removed).
pub fn member_path(member: &str) -> String {
    format!("/members/{member}")
}

/// Where an agent lists every volume and partial copy its data dir holds
/// (peer token required).
/// An agent's answer about the master it follows (`failover::MasterView`),
/// and where a failover announces the new one (`failover::Announcement`).
pub const MASTER_PATH: &str = "/master";
/// A master candidate's configuration copy.
pub const CONFIGURATION_PATH: &str = "/configuration";
pub const VOLUMES_PATH: &str = "/volumes";

/// What a node's data dir holds, with what owns each (`herd node volumes`).
pub fn node_volumes_path(node: &str) -> String {
    format!("{}/volumes", object_path("nodes", node))
}

/// A volume or a partial copy on a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StoredVolume {
    pub member: String,
    pub volume: String,
    pub kind: StoredKind,
    pub bytes: u64,
    /// The agent has a record of the member (it runs, or ran, it here).
    pub member_known: bool,
    pub member_running: bool,
    /// What owns it, as the server found it; None: nothing does, and a
    /// DeleteVolume Command removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum StoredKind {
    /// An installed volume.
    Volume,
    /// A copy being (or once being) pulled in, not yet verified.
    Staging,
}

/// Where an agent serves a volume's manifest (peer token required).
pub fn volume_path(member: &str, volume: &str) -> String {
    format!("/volumes/{member}/{volume}")
}

/// Where an agent says how many bytes a copy in progress has staged for a
/// volume (`{"bytes": N}`; 404 when no copy is staged).
pub fn volume_staged_path(member: &str, volume: &str) -> String {
    format!("/volumes/{member}/{volume}/staged")
}

/// Where an agent serves one file of a volume (`?path=`, with `Range`).
pub fn volume_file_path(member: &str, volume: &str) -> String {
    format!("/volumes/{member}/{volume}/file")
}

pub const JOIN_TOKENS_PATH: &str = "/api/v1/jointokens";

/// The answer to `POST /api/v1/members/{name}/eviction`: the eviction was
/// approved (or, on a dry run, would be) by every budget that selects the
/// member.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Eviction {
    pub member: String,
    /// The budgets that select it, each of which allowed it.
    pub budgets: Vec<String>,
    #[serde(default)]
    pub dry_run: bool,
    /// What happens next, in words.
    pub message: String,
}

/// `POST /api/v1/jointokens`: a join token (or a viewer token) to create.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinTokenRequest {
    /// What the token lets its holder do [default: join].
    #[serde(default, skip_serializing_if = "is_join")]
    pub kind: crate::join::TokenKind,
    /// How long the token may be used; without it, until it is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

/// A join token created through the API, as listed (never the secret).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinTokenInfo {
    pub id: String,
    #[serde(default)]
    pub kind: crate::join::TokenKind,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub created: crate::time::Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<crate::time::Timestamp>,
    /// The token itself: only in the answer to its creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinTokenList {
    pub items: Vec<JoinTokenInfo>,
}

fn is_join(kind: &crate::join::TokenKind) -> bool {
    *kind == crate::join::TokenKind::Join
}

impl From<&crate::join::JoinTokenRecord> for JoinTokenInfo {
    fn from(record: &crate::join::JoinTokenRecord) -> Self {
        JoinTokenInfo {
            id: record.id.clone(),
            kind: record.kind,
            description: record.description.clone(),
            created: record.created,
            expires: record.expires,
            token: None,
        }
    }
}

/// `POST /api/v1/nodes/{name}/role`: one change to a node's role or its
/// master capability, under the rules of `herd_core::roles`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeRoleRequest {
    /// The new role (one of role and masterCapable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<crate::kinds::NodeRole>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_capable: Option<bool>,
    /// When the change would leave the candidate pool short, promote
    /// another eligible node in the same change instead of refusing.
    #[serde(default)]
    pub auto_promote: bool,
}

/// What `POST /api/v1/nodes/{name}/readmit` did: the deleted node's record
/// forgotten, and whether its agent can join again by itself (the join
/// token it joined with may be gone).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Readmission {
    pub node: String,
    /// Whether its agent can join again with what it holds.
    pub agent_can_join: bool,
    /// In words, with what to do when it cannot.
    pub message: String,
}

/// What a role change did: every node it changed, with why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeRoleResponse {
    pub changed: Vec<NodeRoleChanged>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeRoleChanged {
    pub name: String,
    pub role: crate::kinds::NodeRole,
    pub master_capable: bool,
    pub why: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Timestamp;

    #[test]
    fn a_log_window_starts_where_asked_within_what_is_kept() {
        assert_eq!(log_window(0, 100, None, 30), (70, 100), "the last bytes");
        assert_eq!(log_window(80, 100, None, 30), (80, 100), "no further back than what is kept");
        assert_eq!(log_window(0, 100, Some(40), 30), (40, 70));
        assert_eq!(log_window(50, 100, Some(40), 30), (50, 80), "rotation took 40..50");
        assert_eq!(log_window(0, 100, Some(100), 30), (100, 100), "nothing new");
        assert_eq!(log_window(0, 10, Some(40), 30), (0, 10), "a log started again");
    }

    #[test]
    fn a_readiness_check_that_comes_out_the_same_keeps_its_since() {
        let at =
            |s: u64| Timestamp::from_system_time(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(s));
        let check = |passing: bool, s: u64| ReadinessReport {
            instance_id: "i1".into(),
            passing,
            detail: String::new(),
            since: at(s),
        };
        let first = check(true, 10).continuing(None);
        assert_eq!(first.since, at(10));
        let again = check(true, 12).continuing(Some(&first));
        assert_eq!(again, first, "only the time moved: the node's report is unchanged");
        let failing = check(false, 14).continuing(Some(&again));
        assert_eq!(failing.since, at(14), "a new outcome starts a new since");
        let restarted = ReadinessReport { instance_id: "i2".into(), ..check(false, 16) }.continuing(Some(&failing));
        assert_eq!(restarted.since, at(16), "a new instance too");
        let old_agent: ReadinessReport =
            serde_json::from_str(r#"{"instanceId": "i1", "passing": true, "at": "1970-01-01T00:00:10Z"}"#).unwrap();
        assert_eq!(old_agent.since, at(10), "an agent that still sends `at`");
    }

    #[test]
    fn a_position_report_is_its_first_line_and_the_members_a_sync_line_names() {
        let said = PositionReport::parse("run-1", "\n 16/B374D848 \nsomething else\nsync c-db-1 c-db-2\n");
        assert_eq!(said.position, "16/B374D848");
        assert_eq!(said.in_sync, Some(vec!["c-db-1".to_string(), "c-db-2".to_string()]));
        assert_eq!(said.instance_id, "run-1");
        let none_in_sync = PositionReport::parse("run-1", "0/3000060\nsync \n");
        assert_eq!(none_in_sync.in_sync, Some(Vec::new()), "`sync` alone: no member is in sync");
        let nothing = PositionReport::parse("run-1", "");
        assert_eq!((nothing.position.as_str(), nothing.in_sync), ("", None), "no sync line: nothing said of them");
    }
}
