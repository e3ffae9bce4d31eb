//! The command line, as clap structs.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use herd_core::HumanDuration;
use herd_core::kinds::LeaderElectionOverrides;
use herd_core::quantity::{Bytes, Millicores};

#[derive(Parser, Debug)]
#[command(name = "herd", version, about = "herd: a self-healing cluster manager for stateful application clusters")]
pub struct Cli {
    #[command(flatten)]
    pub conn: Connection,
    /// Log at debug level (or set HERD_LOG, e.g. HERD_LOG=herd_server=debug).
    #[arg(long, short, global = true)]
    pub verbose: bool,
    /// Write logs as JSON lines.
    #[arg(long, global = true)]
    pub log_json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the server is and who we are. Flags win over environment
/// variables, which win over the config file (`herd dev` writes one).
#[derive(Args, Debug, Clone)]
pub struct Connection {
    /// Server URL(s), comma-separated; tried in turn.
    #[arg(long, env = "HERD_SERVER", global = true, value_delimiter = ',')]
    pub server: Vec<String>,
    /// Bearer token.
    #[arg(long, env = "HERD_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Config file [default: $XDG_CONFIG_HOME/herd/config.yaml or ~/.config/herd/config.yaml].
    #[arg(long, env = "HERD_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// Trust the cluster CA with this hash (`sha256:...`, printed by `herd
    /// server`); several, comma-separated, while a CA is replaced. An
    /// agent keeps it in its data dir after its first start.
    #[arg(long, env = "HERD_CA_HASH", global = true, value_delimiter = ',')]
    pub ca_hash: Vec<String>,
    /// Trust the cluster CA in this PEM file (`ca.pem` in the server's data dir).
    #[arg(long, env = "HERD_CA_FILE", global = true)]
    pub ca_file: Option<PathBuf>,
}

/// How a command prints what it got: `table` (the default), `wide`,
/// `json`, `yaml`, `name` (`kind/name` lines: objects only, `herd get`
/// and `herd events`) or `jsonpath=TEMPLATE` (kubectl's templates, e.g.
/// `'{.items[*].metadata.name}'`; see `crate::jsonpath`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum OutputFormat {
    #[default]
    Table,
    Wide,
    Json,
    Yaml,
    Name,
    JsonPath(crate::jsonpath::Template),
}

impl std::str::FromStr for OutputFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<OutputFormat, String> {
        Ok(match text {
            "table" => OutputFormat::Table,
            "wide" => OutputFormat::Wide,
            "json" => OutputFormat::Json,
            "yaml" => OutputFormat::Yaml,
            "name" => OutputFormat::Name,
            _ => match text.strip_prefix("jsonpath=") {
                Some(template) => OutputFormat::JsonPath(template.parse()?),
                None => {
                    return Err(format!(
                        "{text:?} is not an output format: table, wide, json, yaml, name or jsonpath=TEMPLATE"
                    ));
                }
            },
        })
    }
}

/// What `herd top` shows.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopWhat {
    /// Each node: its members' use and requests against its allocatable.
    Nodes,
    /// Each member its node runs: its use and requests.
    Members,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// List objects of a kind, or show one; with no kind, the kinds.
    Get {
        #[arg(help = crate::kinds::KINDS_HELP)]
        kind: Option<String>,
        /// One object's name [default: every object of the kind].
        name: Option<String>,
        /// Only objects whose labels match, e.g. `zone=a,role!=db`.
        #[arg(long, short = 'l')]
        selector: Option<String>,
        /// table, wide, json, yaml, name or jsonpath=TEMPLATE.
        #[arg(long, short, default_value = "table", value_parser = clap::value_parser!(OutputFormat))]
        output: OutputFormat,
        /// After the objects as they are, each change as it comes (until
        /// Ctrl-C).
        #[arg(long, short = 'w')]
        watch: bool,
    },
    /// Show one object in detail, with its recent events.
    Describe {
        /// The kind (singular, plural or short name).
        kind: String,
        /// The object's name.
        name: String,
    },
    /// Create or update the objects in a YAML or JSON file (`-` for stdin).
    Apply {
        /// A YAML or JSON file (several documents separated by ---), a
        /// directory of them, or `-` for stdin.
        #[arg(long, short = 'f')]
        file: PathBuf,
        /// Validate on the server and show what would happen; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete an object.
    Delete {
        /// The kind (singular, plural or short name).
        kind: String,
        /// The object's name.
        name: String,
        /// Validate on the server and show what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Add, change (--overwrite) or remove (`key-`) labels of an object.
    Label(MetadataArgs),
    /// Add, change (--overwrite) or remove (`key-`) annotations of an object.
    Annotate(MetadataArgs),
    /// Show what happened, newest last.
    Events {
        /// Only events about this object, as `kind/name`.
        #[arg(long = "for")]
        for_object: Option<String>,
        /// table, wide, json, yaml, name or jsonpath=TEMPLATE.
        #[arg(long, short, default_value = "table", value_parser = clap::value_parser!(OutputFormat))]
        output: OutputFormat,
        /// After the events so far, each new one as it comes (until Ctrl-C).
        #[arg(long, short = 'w')]
        watch: bool,
    },
    /// What nodes or members use now (CPU, memory), against what they
    /// request and what the nodes have.
    Top {
        /// nodes or members.
        #[arg(value_enum)]
        what: TopWhat,
    },
    /// Print the end of a member's log (kept by its node's agent); -f
    /// follows it.
    Logs {
        /// `member/NAME` (an app-cluster member, found on its node), or
        /// `NODE/MEMBER`.
        target: String,
        /// Standard error instead of standard output.
        #[arg(long)]
        stderr: bool,
        /// The member's setup script: its status, output and errors.
        #[arg(long, conflicts_with = "stderr")]
        setup: bool,
        /// At most this many bytes from the end.
        #[arg(long, default_value_t = 65536)]
        bytes: u64,
        /// After the end so far, what the member writes as it comes (until
        /// Ctrl-C).
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// The supported ways out of a stuck Command (recorded as Events).
    #[command(name = "command")]
    Commands {
        #[command(subcommand)]
        action: CommandAction,
    },
    /// What a node holds.
    Node {
        #[command(subcommand)]
        command: NodeCommand,
    },
    /// Durable server-side work (drains): cancel one. `herd get
    /// operations` lists them, `herd describe operation NAME` shows one.
    Operation {
        #[command(subcommand)]
        command: OperationCommand,
    },
    /// Apps: their history.
    App {
        #[command(subcommand)]
        command: AppCommand,
    },
    /// App clusters.
    #[command(name = "appcluster")]
    AppCluster {
        #[command(subcommand)]
        command: AppClusterCommand,
    },
    /// App-cluster members.
    Member {
        #[command(subcommand)]
        command: MemberCommand,
    },
    /// Join and viewer tokens: create (with a lifetime), list and revoke them.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// The control plane: its leader and replicas.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Run a control-plane server.
    Server(ServerArgs),
    /// Run the agent of this host.
    Agent(AgentArgs),
    /// Run a server and local agents in one command, for trying herd out.
    Dev(DevArgs),
    /// Run N simulated nodes in this process, for scale tests: they join,
    /// heartbeat, keep the configuration serial as master candidates and
    /// carry out Commands on simulated members (no processes, no files).
    SimNodes(SimArgs),
    /// The versions of this client and of the server it reaches.
    Version,
    /// Print a shell completion script.
    Completion {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Internal: a detached copy worker, started by the agent.
    #[command(hide = true)]
    AgentWorker {
        /// The copy job file the agent wrote.
        job: PathBuf,
    },
    /// Internal: writes what comes on standard input to a member's log
    /// file, rotating it by size; started by the agent with the member.
    #[command(hide = true)]
    LogWriter {
        /// The log file (`<member dir>/stdout.log`).
        #[arg(long)]
        path: PathBuf,
        /// The size it is rotated at.
        #[arg(long)]
        max_size: Bytes,
        /// How many rotated files are kept besides it.
        #[arg(long)]
        keep: u32,
    },
}

#[derive(Subcommand, Debug)]
pub enum CommandAction {
    /// Issue a failed, interrupted or abandoned Command again, as a new attempt.
    Retry {
        /// The Command's name.
        name: String,
    },
    /// Give a Command up: its agent ends the work (a copy's worker is
    /// stopped), then it is ABANDONED and no longer holds its member or volume.
    Abandon {
        /// The Command's name.
        name: String,
        /// Keep a copy's partial staging, so that a later copy resumes from it
        /// [default: removed].
        #[arg(long)]
        keep_staging: bool,
    },
    /// Wait until a Command is settled, with a progress bar of what its
    /// agent reports (a copy's bytes). Exit code 0 when it completed, 1
    /// otherwise or at the timeout.
    Wait {
        /// The Command's name.
        name: String,
        /// Give up waiting after this long.
        #[arg(long, value_parser = duration, default_value = "30m")]
        timeout: HumanDuration,
    },
}

#[derive(Subcommand, Debug)]
pub enum MemberCommand {
    /// Evict a member if every disruption budget that selects it allows:
    /// it is placed again on another node. Refused (exit 4) naming each
    /// budget that does not allow it, and why.
    Evict {
        /// The member's name.
        name: String,
        /// Ask the budgets only; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Recreate a member on another node as a new member: its slot is set
    /// up afresh there, with empty volumes (any member, on a node lost or
    /// not; what it would lose is said first, and asked).
    Replace {
        /// The member's name.
        name: String,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
    },
    /// Drop a member's first pending notify unsent (a notify its script
    /// keeps failing, which blocks the cluster's spec changes): it is not
    /// sent again, and a NotifySkipped Event says so. The other way out is
    /// to fix the App's script, after which it is delivered.
    SkipNotify {
        /// The member's name.
        name: String,
        /// Drop every pending notify of the member.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum AppClusterCommand {
    /// Wait until an AppCluster is configured (every member configured and
    /// ready, nothing pending), with a progress bar. Exit code 0 when it
    /// is, 1 at the timeout or when a member is in config error.
    Wait {
        /// The AppCluster's name.
        name: String,
        /// The state to wait for (only `configured` for now).
        #[arg(long = "for", value_parser = ["configured"], default_value = "configured")]
        state: String,
        /// How long to wait.
        #[arg(long, value_parser = duration, default_value = "5m")]
        timeout: HumanDuration,
    },
    /// Restart every member of one role in place, each asked of its
    /// disruption budgets first (a durable Operation, followed as `herd
    /// node drain` is): the canaries first, alone, and the rest only once
    /// they came back configured; a member that does not come back stops
    /// it. Exit code 0 restarted, 1 failed or cancelled.
    Restart {
        /// The AppCluster's name.
        name: String,
        /// The role whose members are restarted.
        #[arg(long)]
        role: String,
        /// How many members go first, alone.
        #[arg(long, default_value_t = 1)]
        canary: u32,
        /// How many members may restart at once after the canaries.
        #[arg(long, default_value_t = 1)]
        max_parallel: u32,
        /// How long it may take [default: no deadline].
        #[arg(long, value_parser = duration)]
        deadline: Option<HumanDuration>,
        /// What happens to the members left at the deadline.
        #[arg(long, value_enum, default_value = "fail")]
        on_deadline: OnDeadlineArg,
        /// Start it and return; do not follow it.
        #[arg(long)]
        detach: bool,
    },
    /// Hand the lease of a leader role to another member (a durable
    /// Operation under the leader's disruption budgets): the leader
    /// stands down first (its demote hook), then the next is promoted
    /// once it has every write the old leader had. Refused, naming why,
    /// when the member asked for is not ready, not in sync, or in config
    /// error. Exit code 0 handed over, 1 refused or failed.
    Switchover {
        /// The AppCluster's name.
        name: String,
        /// The leader role.
        #[arg(long)]
        role: String,
        /// The member to lead next [default: the most advanced that may].
        #[arg(long)]
        to: Option<String>,
        /// How long it may wait for its budgets or for the member asked
        /// for to be able to lead, before the leader is asked to stand down.
        #[arg(long, value_parser = duration, default_value = "30s")]
        deadline: HumanDuration,
        /// Start it and return; do not follow it.
        #[arg(long)]
        detach: bool,
    },
    /// Restart every member as another revision of its App (`herd app
    /// history`), each asked of its disruption budgets first (a durable
    /// Operation): the canaries first, alone, a leader role's leader
    /// last, each member healthy once ready for --min-healthy-time; one
    /// that is not within --healthy-deadline, or comes back in config
    /// error, stops it, and (unless --no-auto-revert, or the revision is
    /// irreversible) every member it touched returns to the revision it
    /// ran before. What is not given is the cluster's `updatePolicy`.
    /// Exit code 0 upgraded, 1 reverted, failed or cancelled.
    Upgrade {
        /// The AppCluster's name.
        name: String,
        #[command(flatten)]
        asked: UpgradeArgs,
        /// How long the whole upgrade may take [default: no deadline].
        #[arg(long, value_parser = duration)]
        deadline: Option<HumanDuration>,
        /// Start it and return; do not follow it.
        #[arg(long)]
        detach: bool,
    },
}

/// What `herd appcluster upgrade` may be given; the rest is the cluster's
/// `updatePolicy`.
#[derive(clap::Args, Debug)]
pub struct UpgradeArgs {
    /// The revision to run [default: the App's latest].
    #[arg(long)]
    pub to_revision: Option<i64>,
    /// How many members go first, alone.
    #[arg(long)]
    pub canary: Option<u32>,
    /// How many members may restart at once after the canaries.
    #[arg(long)]
    pub max_parallel: Option<u32>,
    /// How long a restarted member must stay ready to count as healthy.
    #[arg(long, value_parser = duration)]
    pub min_healthy_time: Option<HumanDuration>,
    /// How long after its restart a member may take to be healthy.
    #[arg(long, value_parser = duration)]
    pub healthy_deadline: Option<HumanDuration>,
    /// Stop without reverting when a member does not come back healthy.
    #[arg(long)]
    pub no_auto_revert: bool,
}

#[derive(Subcommand, Debug)]
pub enum AppCommand {
    /// The App's revisions kept (one per change to its spec), oldest
    /// first, each with the fields it changed.
    History {
        /// The App's name.
        name: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum OperationCommand {
    /// Stop an Operation: nothing more is started (members already on
    /// their way go on). A drained node stays drained.
    Cancel {
        /// The Operation's name (`herd get operations`).
        name: String,
    },
    /// Pause an Operation: nothing more is started until it is resumed
    /// (members already on their way go on, and are followed).
    Pause {
        /// The Operation's name (`herd get operations`).
        name: String,
    },
    /// Resume a paused Operation.
    Resume {
        /// The Operation's name (`herd get operations`).
        name: String,
    },
}

/// What a drain does at its deadline, as `herd node drain` takes it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnDeadlineArg {
    /// End Failed, naming what blocked it.
    Fail,
    /// End Stopped (given up, not an error).
    Stop,
    /// Evict the rest without asking their budgets.
    Force,
}

impl From<OnDeadlineArg> for herd_core::kinds::OnDeadline {
    fn from(arg: OnDeadlineArg) -> Self {
        match arg {
            OnDeadlineArg::Fail => Self::Fail,
            OnDeadlineArg::Stop => Self::Stop,
            OnDeadlineArg::Force => Self::Force,
        }
    }
}

/// A node's role, as `herd node modify --role` takes it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum RoleArg {
    Candidate,
    Regular,
    Drained,
    Offline,
}

impl From<RoleArg> for herd_core::kinds::NodeRole {
    fn from(role: RoleArg) -> Self {
        match role {
            RoleArg::Candidate => Self::Candidate,
            RoleArg::Regular => Self::Regular,
            RoleArg::Drained => Self::Drained,
            RoleArg::Offline => Self::Offline,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// The node's volumes and partial copies, with what owns each (a member,
    /// an unsettled Command, or nothing: left by a failed or abandoned copy).
    Volumes {
        /// The node's name.
        name: String,
        /// table, wide, json, yaml, name or jsonpath=TEMPLATE.
        #[arg(long, short, default_value = "table", value_parser = clap::value_parser!(OutputFormat))]
        output: OutputFormat,
    },
    /// Drain a node: mark it drained (no new members) and evict its
    /// members under their disruption budgets, as a durable server-side
    /// Operation (it goes on across a leader failover). Follows it with a
    /// progress bar and the current blocker; Ctrl-C detaches without
    /// cancelling (`herd operation cancel` does). Exit code 0 drained, 1
    /// failed or cancelled.
    Drain {
        /// The node's name.
        name: String,
        /// How long it may take [default: no deadline; a budget that can
        /// never allow an eviction is reported at once].
        #[arg(long, value_parser = duration)]
        deadline: Option<HumanDuration>,
        /// What happens to the members left at the deadline.
        #[arg(long, value_enum, default_value = "fail")]
        on_deadline: OnDeadlineArg,
        /// How many members may be on their way at once.
        #[arg(long, default_value_t = 1)]
        max_parallel: u32,
        /// Ask the budgets about each member now; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Start it and return; do not follow it.
        #[arg(long)]
        detach: bool,
    },
    /// Let a drained node take members again (a drain still running on it
    /// is cancelled first).
    Undrain {
        /// The node's name.
        name: String,
    },
    /// Let the agent of a deleted node join again (deleting a node keeps its
    /// agent out until then).
    Readmit {
        /// The node's name.
        name: String,
    },
    /// Change a node's role or its master capability, one at a time, under
    /// the candidate pool's rules (the reason is printed when refused).
    #[command(group = clap::ArgGroup::new("change").required(true).args(["role", "master_capable"]))]
    Modify {
        /// The node's name.
        name: String,
        /// The new role: candidate (holds the configuration, may run a
        /// server), regular, drained (no new members) or offline (never
        /// contacted; only a node that hosts no members).
        #[arg(long, value_enum)]
        role: Option<RoleArg>,
        /// Whether the node may ever be a candidate (false demotes one).
        #[arg(long, value_name = "BOOL")]
        master_capable: Option<bool>,
        /// When the change would leave the candidate pool short, promote
        /// another eligible node in the same change instead of refusing.
        #[arg(long)]
        auto_promote: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a join token (or with --viewer a read-only token for the
    /// dashboard); prints it (it is shown only once) and how to use it.
    Create {
        /// A viewer token: reads everything but tokens and changes nothing
        /// (log in to the dashboard at /ui with it).
        #[arg(long)]
        viewer: bool,
        /// How long it may be used, e.g. 1h or 7d [default: until deleted].
        #[arg(long, value_parser = duration)]
        ttl: Option<HumanDuration>,
        /// What it is for, shown by `herd token list`.
        #[arg(long, default_value = "")]
        description: String,
    },
    /// The tokens created with `herd token create`, expired ones
    /// included (the server's own join token is not listed).
    List {
        /// table, wide, json, yaml, name or jsonpath=TEMPLATE.
        #[arg(long, short, default_value = "table", value_parser = clap::value_parser!(OutputFormat))]
        output: OutputFormat,
    },
    /// Revoke a token by its id: it can no longer be used (nodes that
    /// joined with a join token keep their own tokens).
    Delete {
        /// The token's id (`herd token list`).
        id: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Start a master here, on a master candidate, when the master is gone
    /// (SQLite mode: its store went with its host), as gnt-cluster
    /// master-failover: every node's agent is asked which master it
    /// follows; a majority of all nodes must answer and none may still
    /// reach it. The server starts from the freshest configuration copy
    /// among the candidates, at a new term that every agent is told to
    /// follow (they refuse the old master from then on), and serves.
    MasterFailover(Box<FailoverArgs>),
    /// Check the nodes' roles, as gnt-cluster verify: the master's node not
    /// a candidate, too few candidates, candidates down, unreachable nodes,
    /// offline nodes listed apart. Exit code 0 clean, 1 warnings, 2 errors.
    Verify {
        /// table, wide, json, yaml, name or jsonpath=TEMPLATE.
        #[arg(long, short, default_value = "table", value_parser = clap::value_parser!(OutputFormat))]
        output: OutputFormat,
    },
    /// Who leads, since when, how many times the lease changed hands, and
    /// what each replica is doing (Leading, Standby, Unresponsive, Gone, Stopped).
    Status {
        /// table, wide, json, yaml, name or jsonpath=TEMPLATE.
        #[arg(long, short, default_value = "table", value_parser = clap::value_parser!(OutputFormat))]
        output: OutputFormat,
    },
}

fn duration(text: &str) -> Result<HumanDuration, String> {
    HumanDuration::parse(text)
}

/// A directory path made absolute against the working directory once, as
/// it is read: members, setups and scripts run in directories of their
/// own, where a relative data dir would name another place.
fn absolute_dir(text: &str) -> Result<PathBuf, String> {
    if text.is_empty() {
        return Err("must not be empty".into());
    }
    std::path::absolute(text).map_err(|e| format!("cannot make {text:?} absolute: {e}"))
}

/// `herd label` and `herd annotate`.
#[derive(Args, Debug, Clone)]
pub struct MetadataArgs {
    /// The kind (singular, plural or short name).
    pub kind: String,
    /// The object's name.
    pub name: String,
    /// `key=value` to set, `key-` to remove.
    #[arg(required = true)]
    pub changes: Vec<String>,
    /// Change a key that is set already (without it, that is refused).
    #[arg(long)]
    pub overwrite: bool,
}

#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// Where the API (and the dashboard at /ui) listens.
    #[arg(long, default_value = "127.0.0.1:7700")]
    pub listen: SocketAddr,
    /// Where the SQLite store and the token files live.
    #[arg(long, default_value = "herd-data", value_parser = absolute_dir)]
    pub data_dir: PathBuf,
    /// `postgres://...` for several replicas [default: SQLite in the data dir].
    #[arg(long, env = "HERD_STORE", hide_env_values = true)]
    pub store: Option<String>,
    /// [default: read from, or generated into, <data-dir>/admin.token]
    #[arg(long, env = "HERD_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Serve plain HTTP instead of TLS: tokens and data cross the network
    /// in the clear. Only for a network you trust completely.
    #[arg(long)]
    pub insecure_http: bool,
    /// The node this replica runs on: it campaigns for the lease only
    /// while that node is a master candidate, and that node is the
    /// master's while it leads.
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// How long the certificates signed for nodes last; agents renew them
    /// when two thirds of it have passed.
    #[arg(long, value_parser = duration, default_value = "30d")]
    pub agent_cert_lifetime: HumanDuration,
    /// [default: read from, or generated into, <data-dir>/join.token]
    #[arg(long, env = "HERD_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// This replica's name in the leader election [default: <host name>-<pid>].
    #[arg(long, env = "HERD_IDENTITY")]
    pub identity: Option<String>,
    /// The URL other replicas and clients reach this one at [default:
    /// https://<listen address>, or http:// with --insecure-http].
    #[arg(long)]
    pub advertise_url: Option<String>,
    #[command(flatten)]
    pub election: ElectionArgs,
    /// Diagnostics: while leading, write a sequence record at this interval
    /// through the fenced path, to check that no two leaders' writes interleave.
    #[arg(long, value_parser = duration, allow_hyphen_values = true)]
    pub fencing_probe: Option<HumanDuration>,
}

#[derive(Args, Debug, Clone)]
pub struct FailoverArgs {
    /// The data dir of this node's agent: its certificate and its
    /// configuration copy.
    #[arg(long, value_name = "DIR", value_parser = absolute_dir)]
    pub agent_data_dir: PathBuf,
    /// Go ahead without a majority (a two-node cluster): only when you
    /// know the old master is down, or two masters may serve.
    #[arg(long)]
    pub no_voting: bool,
    /// The new master's settings, as `herd server`'s (--node, --admin-token
    /// and a --data-dir for the new store are needed).
    #[command(flatten)]
    pub server: ServerArgs,
}

/// Leader-election settings; each one given wins over the ClusterConfig's
/// `spec.leaderElection`. Checked at start: leaseDuration > renewDeadline >
/// 1.2 x retryPeriod.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Leader election (default: the ClusterConfig's)")]
pub struct ElectionArgs {
    /// How long a lease holds without renewal [ClusterConfig default: 15s].
    #[arg(long, value_parser = duration, allow_hyphen_values = true)]
    pub lease_duration: Option<HumanDuration>,
    /// A leader that cannot renew within this steps down [ClusterConfig default: 10s].
    #[arg(long, value_parser = duration, allow_hyphen_values = true)]
    pub renew_deadline: Option<HumanDuration>,
    /// How often the leader renews and the others look [ClusterConfig default: 2s].
    #[arg(long, value_parser = duration, allow_hyphen_values = true)]
    pub retry_period: Option<HumanDuration>,
    /// The Lease the replicas compete for [ClusterConfig default: herd-leader].
    #[arg(long)]
    pub lock_name: Option<String>,
    /// Campaign only once the caches are synced [ClusterConfig default: true].
    #[arg(long)]
    pub wait_for_ready: Option<bool>,
    /// Record leadership Events [ClusterConfig default: true].
    #[arg(long)]
    pub publish_events: Option<bool>,
    /// Give the lease up on shutdown [ClusterConfig default: true].
    #[arg(long)]
    pub release_on_shutdown: Option<bool>,
}

impl ElectionArgs {
    pub fn overrides(&self) -> LeaderElectionOverrides {
        LeaderElectionOverrides {
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
            lock_name: self.lock_name.clone(),
            wait_for_ready: self.wait_for_ready,
            publish_events: self.publish_events,
            release_on_shutdown: self.release_on_shutdown,
        }
    }
}

/// The agent joins and heartbeats to the servers given by the global
/// `--server` flag (or HERD_SERVER).
#[derive(Args, Debug, Clone)]
pub struct AgentArgs {
    /// Needed only for the first start; the node keeps its own token after.
    #[arg(long, env = "HERD_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// Where the agent keeps its identity, journal, members and volumes.
    #[arg(long, default_value = "herd-agent", value_parser = absolute_dir)]
    pub data_dir: PathBuf,
    /// The node's name [default: the host name].
    #[arg(long)]
    pub name: Option<String>,
    /// Where the agent's own endpoint listens.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// After the server has been unreachable this long, running commands
    /// are cancelled by their disconnect hooks.
    #[arg(long, value_parser = duration, default_value = "30s")]
    pub disconnect_grace: HumanDuration,
    /// Limit each volume copy to this many MiB/s [default: no limit].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub copy_mib_per_sec: Option<u64>,
    /// The host's CPU for members, instead of its cores (`4`, `3500m`).
    #[arg(long)]
    pub capacity_cpu: Option<Millicores>,
    /// The host's memory, instead of what /proc/meminfo says (`8Gi`).
    #[arg(long)]
    pub capacity_memory: Option<Bytes>,
    /// The disk for members' volumes, instead of the data dir's file system size.
    #[arg(long)]
    pub capacity_disk: Option<Bytes>,
    /// CPU kept back for the agent and the system, never requested by members.
    #[arg(long, default_value = "100m")]
    pub reserve_cpu: Millicores,
    /// Memory kept back for the agent and the system.
    #[arg(long, default_value = "256Mi")]
    pub reserve_memory: Bytes,
    /// Disk kept back on the data dir's file system.
    #[arg(long, default_value = "1Gi")]
    pub reserve_disk: Bytes,
}

#[derive(Args, Debug, Clone)]
pub struct SimArgs {
    /// How many nodes.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub count: u32,
    /// Nodes are named PREFIX-1, PREFIX-2, ...
    #[arg(long, default_value = "sim")]
    pub prefix: String,
    /// The join token each simulated node joins with.
    #[arg(long, env = "HERD_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: String,
}

#[derive(Args, Debug, Clone)]
pub struct DevArgs {
    /// Everything lives here; a restart with the same dir keeps the data.
    #[arg(long, default_value = ".herd-dev", value_parser = absolute_dir)]
    pub data_dir: PathBuf,
    /// Where the server's API (and the dashboard at /ui) listens.
    #[arg(long, default_value = "127.0.0.1:7700")]
    pub listen: SocketAddr,
    /// How many local agents (nodes node-1, node-2, ...).
    #[arg(long, default_value_t = 3)]
    pub agents: usize,
    /// Do not write the CLI config file (~/.config/herd/config.yaml).
    #[arg(long)]
    pub no_config: bool,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}

#[cfg(test)]
mod help_tests {
    use clap::CommandFactory;

    /// Every argument and flag of every command says what it is for.
    #[test]
    fn every_argument_has_help() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", command.get_name());
            if command.get_about().is_none() && !command.is_hide_set() {
                missing.push(format!("{path}: the command"));
            }
            for argument in command.get_arguments() {
                let builtin = matches!(argument.get_id().as_str(), "help" | "version");
                if !builtin && argument.get_help().is_none() && !argument.is_hide_set() {
                    missing.push(format!("{path}: {}", argument.get_id()));
                }
            }
            for sub in command.get_subcommands() {
                walk(sub, &path, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "", &mut missing);
        assert!(missing.is_empty(), "without help text:\n{}", missing.join("\n"));
    }
}
