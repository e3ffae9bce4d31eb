//! The app-cluster planner: from a snapshot of one cluster (its spec, its
//! App, its members as read, their Commands, the nodes, the time), the
//! plan of one pass in KubeDirector's order. First what happened (settled
//! Commands read into the members' statuses; each member checked against
//! its node's report, a changed instance being a restart), then members
//! of lost nodes recovered, moved with their data, restarted in place,
//! then role sync (members created or sent away), then member sync (each
//! member one step further: placed, started, configured, removed), and
//! at the end notifies queued and sent and the cluster's status.
//!
//! A plan is, for each member, a program: writes in order (each over the
//! revision the one before it left, the first over the member as read),
//! then the Commands decided from the status those writes stored, then
//! the Events that tell of it; a member may be created or deleted. The
//! server carries a program out and stops it at its first write that
//! finds the member changed (a stale copy decides nothing). Nothing here
//! reads a clock, a store or a random number: the time, the fresh ids of
//! Commands and where members may be placed ([`Placer`]) are given.

mod check;
mod leaders;
mod moves;
mod recovery;
mod restarts;
mod sync;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use crate::api::MemberReport;
use crate::kinds::app::NamedPort;
use crate::kinds::app_cluster::{AppCluster, cluster_status};
use crate::kinds::cluster_config::AppClusterSettings;
use crate::kinds::operation::Handover;
use crate::kinds::{
    Action, AppClusterStatus, AppRole, AppSpec, Command, EventReason, EventType, Member, MemberState, MemberStatus,
    Node,
};
use crate::placement::{NodeLoad, Placement};
use crate::resources::Amounts;
use crate::time::Timestamp;

pub use self::sync::{command_for, concerns, member_run};

/// The nodes as a pass sees them.
pub trait NodeIndex {
    fn node(&self, name: &str) -> Option<&Node>;
    /// Every node, for placement.
    fn all(&self) -> &[Arc<Node>];
    /// Whether some node runs and wants member `name` (a slot whose former
    /// Member was deleted is filled only once that is removed there).
    fn runs(&self, name: &str) -> bool;
}

/// What member `member`'s node reports of it.
fn report<'n>(nodes: &'n dyn NodeIndex, member: &Member) -> Option<&'n MemberReport> {
    let node = nodes.node(member.spec.node.as_deref()?)?;
    node.status.members.iter().find(|r| r.name == member.metadata.name)
}

/// Why a member was not bound now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// No node can take it (an Event says so).
    Unplaceable(String),
    /// The node it would go to has no free ports.
    NoPorts(String),
}

/// Picks a node for a member, given what each node has bound
/// (`crate::placement::place` with the member's role and peers).
pub type PlaceOne<'a> = dyn Fn(&dyn Fn(&str) -> NodeLoad) -> Placement + 'a;

/// Where members go: shared by the passes of every cluster running side
/// by side, so that a port is never given twice on one host, nor a
/// node's allocatable twice.
pub trait Placer {
    /// Places member `member`, which requests `requests`, with `place`
    /// (given what each node has bound) and allocates its ports there,
    /// booking all three.
    fn book(
        &mut self,
        member: &str,
        requests: &Amounts,
        place: &PlaceOne<'_>,
        wanted: &[NamedPort],
        range: RangeInclusive<u16>,
    ) -> Result<(String, BTreeMap<String, u16>), Refused>;

    /// Books a member bound to `node` requesting `from` as requesting `to`
    /// instead (a restart as another revision); refused, naming the
    /// shortfall, when the node has no room for that.
    fn rebook(&mut self, node: &Node, from: &Amounts, to: &Amounts) -> Result<(), String>;
}

/// One cluster, as one pass reads it.
pub struct Snapshot<'a> {
    pub cluster: &'a AppCluster,
    /// The App as of the revision the cluster runs (`app_revision`): what
    /// new members start as, and what its roles are.
    pub app: Option<&'a AppSpec>,
    /// That revision (the cluster's `appRevision`, or the App's latest).
    pub app_revision: Option<i64>,
    /// The App as of each other revision a member is to run.
    pub revisions: &'a BTreeMap<i64, &'a AppSpec>,
    pub settings: &'a AppClusterSettings,
    /// The cluster's members as read (the ones it owns).
    pub members: Vec<Member>,
    /// The Commands of the cluster's members.
    pub commands: &'a [Arc<Command>],
    pub nodes: &'a dyn NodeIndex,
    /// How long each NotReady node the members are on has been so, as
    /// this leader saw it.
    pub not_ready: &'a BTreeMap<String, Duration>,
    /// For each leader role, how long since this leader last renewed its
    /// lease, or first saw it (absent: just now).
    pub leases: &'a BTreeMap<String, Duration>,
    /// For each node of the members, how long since this leader last
    /// heard its heartbeat (absent: not yet): only a member on a node heard
    /// from within its role's renew deadline may be granted a lease.
    pub heard: &'a BTreeMap<String, Duration>,
    /// The handovers running switchovers ask of the cluster's leader
    /// roles, by role.
    pub handovers: &'a [(String, Handover)],
    pub now: Timestamp,
}

impl<'a> Snapshot<'a> {
    /// The revision `member` is to run: its own, or (one made before
    /// members had one) the cluster's.
    pub fn revision_of(&self, member: &Member) -> Option<i64> {
        member.spec.app_revision.or(self.app_revision)
    }

    /// The App as of the revision `member` is to run (None: not kept).
    pub fn app_of(&self, member: &Member) -> Option<&'a AppSpec> {
        match self.revision_of(member) {
            Some(revision) if Some(revision) != self.app_revision => self.revisions.get(&revision).copied(),
            _ => self.app,
        }
    }

    /// `member`'s role as of the revision it is to run.
    pub fn app_role(&self, member: &Member) -> Option<&'a AppRole> {
        self.app_of(member)?.role(&member.spec.role)
    }
}

/// A write of a member, over the revision the write before it left.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Created as it is.
    Create(Member),
    /// Its metadata and spec written as they are.
    Spec(Member),
    /// Its status written as it is.
    Status(Member),
}

/// A Command a program creates.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    pub command: Command,
    /// Created issued (its node is Ready), or left for the command
    /// controller to issue.
    pub issued: bool,
}

/// An Event a program records about its member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub type_: EventType,
    pub reason: EventReason,
    pub message: String,
}

/// What one pass does to one member.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Program {
    pub member: String,
    pub writes: Vec<Write>,
    /// The settled Commands whose outcomes its status records: deleted
    /// with its first status write, or after its writes when it has none.
    pub outcomes: Vec<Arc<Command>>,
    /// Created once its writes landed.
    pub commands: Vec<Planned>,
    /// Recorded once its writes landed.
    pub notes: Vec<Note>,
    /// It goes once its writes landed (its node no longer has it).
    pub delete: bool,
}

impl Program {
    /// Whether it does anything at all.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
            && self.outcomes.is_empty()
            && self.commands.is_empty()
            && self.notes.is_empty()
            && !self.delete
    }
}

/// One pass's plan for a cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub programs: Vec<Program>,
    /// The cluster's status, when it changed.
    pub status: Option<AppClusterStatus>,
    /// Something is under way: look again soon.
    pub in_flight: bool,
    /// When time alone changes a decision (a role leader's lease runs
    /// out): look again then, however quiet the cluster is.
    pub look_again_in: Option<std::time::Duration>,
}

/// One pass's working state: for each member it works on, the member as
/// it will be, its program, and its status as stored (None: created in
/// this pass and not written yet), each in the same place of its list.
struct Work<'s, 'p> {
    snap: &'s Snapshot<'s>,
    placer: &'p mut dyn Placer,
    ids: &'p mut dyn FnMut() -> String,
    members: Vec<Member>,
    programs: Vec<Program>,
    stored: Vec<Option<MemberStatus>>,
    /// Programs of members that go in this pass.
    gone: Vec<Program>,
    /// Members with an unsettled Command (or one planned now).
    busy: BTreeSet<String>,
    /// Members with an unsettled notify.
    notifying: BTreeSet<String>,
    /// Members whose removal succeeded.
    removed: BTreeSet<String>,
    /// When the soonest lease this pass waited for runs out.
    look_again_in: Option<std::time::Duration>,
}

impl Work<'_, '_> {
    fn note(&mut self, i: usize, type_: EventType, reason: EventReason, message: String) {
        self.programs[i].notes.push(Note { type_, reason, message });
    }

    /// Writes member `i` as it is now (its spec or status, or all of it
    /// when created), before what follows.
    fn write(&mut self, i: usize, write: fn(Member) -> Write) {
        let written = write(self.members[i].clone());
        if matches!(written, Write::Status(_) | Write::Create(_)) {
            self.stored[i] = Some(self.members[i].status.clone());
        }
        self.programs[i].writes.push(written);
    }

    /// Gives member `i` a Command.
    fn command(&mut self, i: usize, mut command: Command, issued: bool) {
        // A run made from the App: the revision it is of goes with it.
        if let (Some(origin), Action::StartMember { .. } | Action::MigrateMember { .. }) =
            (command.spec.origin.as_mut(), &command.spec.action)
        {
            origin.app_revision = self.snap.revision_of(&self.members[i]);
        }
        self.busy.insert(self.members[i].metadata.name.clone());
        self.programs[i].commands.push(Planned { command, issued });
    }

    /// A member the pass starts working on (created by it).
    fn add(&mut self, member: Member) -> usize {
        self.programs.push(Program { member: member.metadata.name.clone(), ..Program::default() });
        self.members.push(member);
        self.stored.push(None);
        self.members.len() - 1
    }

    /// Member `i` goes: its program ends the pass as it is.
    fn forget(&mut self, i: usize) {
        self.members.remove(i);
        self.stored.remove(i);
        let mut program = self.programs.remove(i);
        program.delete = true;
        self.gone.push(program);
    }

    /// Where member `name` is in the pass's lists.
    fn index(&self, name: &str) -> Option<usize> {
        self.members.iter().position(|m| m.metadata.name == name)
    }

    fn fresh_id(&mut self) -> String {
        (self.ids)()
    }
}

/// The plan of one pass over `snap`; `placer` books where members go,
/// `ids` gives each new Command a fresh id.
pub fn plan(snap: &Snapshot<'_>, placer: &mut dyn Placer, ids: &mut dyn FnMut() -> String) -> Plan {
    let mut work = Work {
        snap,
        placer,
        ids,
        members: snap.members.clone(),
        programs: snap
            .members
            .iter()
            .map(|m| Program { member: m.metadata.name.clone(), ..Program::default() })
            .collect(),
        stored: snap.members.iter().map(|m| Some(m.status.clone())).collect(),
        gone: Vec::new(),
        busy: BTreeSet::new(),
        notifying: BTreeSet::new(),
        removed: BTreeSet::new(),
        look_again_in: None,
    };
    check::read_commands(&mut work);
    if let Some(app) = snap.app {
        restarts::record_revisions(&mut work);
        check::check_members(&mut work);
        recovery::recover_members(&mut work, app);
        moves::migrate_members(&mut work);
        restarts::restart_members(&mut work);
        sync::sync_roles(&mut work);
        sync::sync_members(&mut work, app);
        sync::send_notifies(&mut work, app);
    }
    let leaders = match snap.app {
        Some(app) => leaders::lead_roles(&mut work, app),
        None => snap.cluster.status.leaders.clone(),
    };
    // A leader role that waits (for an expiry, or for a member that may
    // lead) is looked at again soon, and at its lease's end: time alone
    // can change its decision.
    let look_again_in = work.look_again_in;
    let in_flight = !work.busy.is_empty()
        || leaders.iter().any(|l| l.waiting.is_some())
        || work.members.iter().any(|m| {
            !matches!(m.status.state, MemberState::Configured | MemberState::ConfigError)
                || !m.status.state_detail.pending_notify_cmds.is_empty()
        });
    let members = &work.members;
    let cluster = snap.cluster;
    let status = match snap.app {
        Some(_) => AppClusterStatus {
            leaders,
            app_revision: snap.app_revision,
            ..cluster_status(&cluster.spec, cluster.metadata.generation, members)
        },
        None => AppClusterStatus {
            reason: Some(match cluster.spec.app_revision {
                Some(revision) => format!(
                    "App {0:?} has no revision {revision} (the cluster's appRevision): `herd app history {0}` lists \
                     the revisions kept",
                    cluster.spec.app_ref
                ),
                None => format!("App {:?} does not exist: apply it", cluster.spec.app_ref),
            }),
            observed_generation: Some(cluster.metadata.generation),
            ..cluster.status.clone()
        },
    };
    let mut programs = work.gone;
    for ((member, mut program), stored) in work.members.into_iter().zip(work.programs).zip(work.stored) {
        // The status as it ends up, written when it is not as stored.
        if stored.as_ref() != Some(&member.status) {
            program.writes.push(Write::Status(member));
        }
        programs.push(program);
    }
    programs.retain(|p| !p.is_empty());
    Plan { programs, status: (status != cluster.status).then_some(status), in_flight, look_again_in }
}
