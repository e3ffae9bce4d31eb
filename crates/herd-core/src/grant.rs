//! Grants: what one caller may do on one node's agent endpoint, until
//! when. The leader signs one grant per action a Command needs from
//! another agent (read volume V of member M, stop, start or forget member
//! M) and for its own reads (a log, the volumes); the serving agent checks
//! the signature (herd-tls), then [`check`]: that the caller its TLS
//! certificate names is the grant's holder, that the grant is for this
//! node, that it covers the request, that it has not expired and that the
//! Command attempt it was given for has not ended ([`Revocations`]: the
//! server names, in each heartbeat answer, the attempts that ended whose
//! grants the node serves, [`ended_attempts`]). A stolen grant is of no use
//! without its holder's key, names one action, and ends with its attempt.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::{Action, Command};
use crate::time::Timestamp;

/// A Command's grants outlast its attempt's deadline by this much, for
/// clocks a little apart.
pub const CLOCK_SLACK: Duration = Duration::from_secs(60);

/// Who holds a grant: a node's agent (or its copy worker), or the server.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Holder {
    Node(String),
    Server,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Node(node) => write!(f, "node {node}"),
            Holder::Server => f.write_str("the server"),
        }
    }
}

/// One action on an agent's endpoint.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", tag = "action")]
pub enum Access {
    /// A volume's manifest, its files and how much of a copy is staged.
    #[serde(rename_all = "camelCase")]
    ReadVolume { member: String, volume: String },
    /// Every volume and partial copy on the node.
    ListVolumes,
    /// A member's logs (stdout, stderr, setup).
    #[serde(rename_all = "camelCase")]
    ReadLogs { member: String },
    #[serde(rename_all = "camelCase")]
    StopMember { member: String },
    #[serde(rename_all = "camelCase")]
    StartMember { member: String },
    /// Stop the member and remove its record and volumes.
    #[serde(rename_all = "camelCase")]
    ForgetMember { member: String },
    /// A master candidate's configuration copy (a master failover's).
    ReadConfiguration,
    /// Follow the master a failover started at `term`.
    AdoptMaster { term: u64 },
}

impl Access {
    pub fn read_volume(member: &str, volume: &str) -> Access {
        Access::ReadVolume { member: member.into(), volume: volume.into() }
    }
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Access::ReadVolume { member, volume } => write!(f, "read volume {member}/{volume}"),
            Access::ListVolumes => f.write_str("list the volumes"),
            Access::ReadLogs { member } => write!(f, "read the logs of member {member}"),
            Access::StopMember { member } => write!(f, "stop member {member}"),
            Access::StartMember { member } => write!(f, "start member {member}"),
            Access::ForgetMember { member } => write!(f, "forget member {member}"),
            Access::ReadConfiguration => f.write_str("read the configuration copy"),
            Access::AdoptMaster { term } => write!(f, "announce the master of term {term}"),
        }
    }
}

/// What the signature covers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Grant {
    pub holder: Holder,
    /// The node whose agent serves it.
    pub node: String,
    pub access: Access,
    pub expires: Timestamp,
    /// Why it was given (a Command's name and attempt, or the server's
    /// request), for the refusal's Event.
    pub purpose: String,
    /// The Command attempt it was given for: it ends when that attempt
    /// does, expired or not. None for the server's own requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<GrantedAttempt>,
}

/// One attempt of one Command: what a Command's grants are given for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GrantedAttempt {
    pub command: String,
    pub attempt: u32,
}

impl std::fmt::Display for GrantedAttempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "command {} attempt {}", self.command, self.attempt)
    }
}

/// A Command attempt that has ended, and until when its grants would have
/// lasted (after which the expiry refuses them anyway).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndedAttempt {
    #[serde(flatten, deserialize_with = "crate::objects_only::object")]
    pub attempt: GrantedAttempt,
    pub grants_expire: Timestamp,
}

/// What `action` needs from another node's agent: that node, and one
/// access per thing it does there (none for an action on its own node).
pub fn accesses_for(action: &Action) -> Option<(&str, Vec<Access>)> {
    match action {
        Action::CopyVolume { member, volume, from_node } => {
            Some((from_node, vec![Access::read_volume(member, volume)]))
        }
        Action::MigrateMember { member, from_node, run } => {
            let mut accesses: Vec<Access> =
                run.persistent_volumes().map(|volume| Access::read_volume(member, volume)).collect();
            accesses.extend([
                Access::StopMember { member: member.clone() },
                Access::StartMember { member: member.clone() },
                Access::ForgetMember { member: member.clone() },
            ]);
            Some((from_node, accesses))
        }
        _ => None,
    }
}

/// Until when the grants of an attempt issued at `issued` last: while it
/// may run (`timeout`), and the clock slack.
pub fn command_grant_expiry(issued: Timestamp, timeout: Duration) -> Timestamp {
    Timestamp::from_system_time(issued.system_time() + timeout + CLOCK_SLACK)
}

/// The attempts of `command` that have ended while grants served by
/// `serving` may still be unexpired: every attempt before the current one,
/// and the current one once it is settled or taken back for a retry. The
/// expiry of the earlier ones is bounded by the latest issue or change:
/// each was issued before it.
pub fn ended_attempts(command: &Command, serving: &str, now: Timestamp) -> Vec<EndedAttempt> {
    let Some((source, _)) = accesses_for(&command.spec.action) else { return Vec::new() };
    if source != serving {
        return Vec::new();
    }
    let status = &command.status;
    let latest = [status.issued.as_ref().map(|issue| issue.at), status.updated].into_iter().flatten().max();
    let Some(latest) = latest else { return Vec::new() };
    let grants_expire = command_grant_expiry(latest, command.spec.timeout());
    if grants_expire.system_time() <= now.system_time() {
        return Vec::new();
    }
    let running = status.issued.as_ref().filter(|_| !status.state_by_management.is_settled()).map(|i| i.attempt);
    (1..=status.attempts)
        .filter(|attempt| Some(*attempt) != running)
        .map(|attempt| EndedAttempt {
            attempt: GrantedAttempt { command: command.metadata.name.clone(), attempt },
            grants_expire,
        })
        .collect()
}

/// The ended attempts a serving agent knows of, each kept until its grants
/// would have expired: merged from every heartbeat answer, so that a
/// Command deleted after its attempt was named keeps its grants ended.
///
/// Kept on disk as a list of ended attempts (a JSON object's keys must be
/// strings, and an attempt is two fields).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Revocations(BTreeMap<GrantedAttempt, Timestamp>);

impl Serialize for Revocations {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let ended: Vec<EndedAttempt> = self
            .0
            .iter()
            .map(|(attempt, until)| EndedAttempt { attempt: attempt.clone(), grants_expire: *until })
            .collect();
        ended.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Revocations {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let ended = Vec::<EndedAttempt>::deserialize(deserializer)?;
        Ok(Revocations(ended.into_iter().map(|e| (e.attempt, e.grants_expire)).collect()))
    }
}

impl Revocations {
    /// Adds `ended` and forgets what has expired by `now`; whether that
    /// changed anything.
    pub fn merge(&mut self, ended: &[EndedAttempt], now: Timestamp) -> bool {
        let before = self.0.clone();
        for ended in ended {
            let until = self.0.entry(ended.attempt.clone()).or_insert(ended.grants_expire);
            *until = (*until).max(ended.grants_expire);
        }
        self.0.retain(|_, until| until.system_time() > now.system_time());
        self.0 != before
    }

    pub fn contains(&self, attempt: &GrantedAttempt) -> bool {
        self.0.contains_key(attempt)
    }
}

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Refusal {
    #[error("no grant was shown")]
    Missing,
    #[error("the grant is not valid: {0}")]
    Invalid(String),
    #[error("the caller showed no certificate of the cluster")]
    Anonymous,
    #[error("the grant is for {holder}, but the caller is {caller}")]
    NotHolder { holder: Holder, caller: Holder },
    #[error("the grant is for node {grant_node}'s agent, not this one ({here})")]
    OtherNode { grant_node: String, here: String },
    #[error("the grant allows to {granted}, not to {asked}")]
    OutOfScope { granted: Access, asked: Access },
    #[error("the grant expired at {expires}")]
    Expired { expires: Timestamp },
    #[error("the grant ended with {attempt}, which is over")]
    Ended { attempt: GrantedAttempt },
}

/// Whether `caller` (as its certificate names it; None: no certificate)
/// may do `asked` on node `here` with `grant` at `now`, the attempts in
/// `ended` being over.
pub fn check(
    grant: &Grant,
    caller: Option<&Holder>,
    here: &str,
    asked: &Access,
    (now, ended): (Timestamp, &Revocations),
) -> Result<(), Refusal> {
    let Some(caller) = caller else { return Err(Refusal::Anonymous) };
    if *caller != grant.holder {
        return Err(Refusal::NotHolder { holder: grant.holder.clone(), caller: caller.clone() });
    }
    if grant.node != here {
        return Err(Refusal::OtherNode { grant_node: grant.node.clone(), here: here.to_string() });
    }
    if grant.access != *asked {
        return Err(Refusal::OutOfScope { granted: grant.access.clone(), asked: asked.clone() });
    }
    if now.system_time() >= grant.expires.system_time() {
        return Err(Refusal::Expired { expires: grant.expires });
    }
    if let Some(attempt) = grant.attempt.as_ref().filter(|attempt| ended.contains(attempt)) {
        return Err(Refusal::Ended { attempt: attempt.clone() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    fn at(seconds: u64) -> Timestamp {
        Timestamp::from_system_time(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds))
    }

    fn read(member: &str) -> Access {
        Access::ReadVolume { member: member.into(), volume: "data".into() }
    }

    fn grant() -> Grant {
        Grant {
            holder: Holder::Node("n2".into()),
            node: "n1".into(),
            access: read("m1"),
            expires: at(60),
            purpose: "copy-1 attempt 1".into(),
            attempt: Some(GrantedAttempt { command: "copy-1".into(), attempt: 1 }),
        }
    }

    #[test]
    fn revocations_are_kept_on_disk_and_read_back() {
        let mut kept = Revocations::default();
        let ended = |command: &str, attempt: u32| EndedAttempt {
            attempt: GrantedAttempt { command: command.into(), attempt },
            grants_expire: at(90),
        };
        assert!(kept.merge(&[ended("c1", 1), ended("c1", 2), ended("c2", 1)], at(0)));
        let json = serde_json::to_vec(&kept).expect("an attempt is no map key: kept as a list");
        let read: Revocations = serde_json::from_slice(&json).unwrap();
        assert_eq!(read, kept);
        assert!(read.contains(&GrantedAttempt { command: "c1".into(), attempt: 2 }));
    }

    #[test]
    fn the_holder_may_do_what_the_grant_names_on_its_node_until_it_expires() {
        let n2 = Holder::Node("n2".into());
        assert_eq!(check(&grant(), Some(&n2), "n1", &read("m1"), (at(59), &Revocations::default())), Ok(()));
        assert_eq!(
            check(&grant(), Some(&n2), "n1", &read("m1"), (at(60), &Revocations::default())),
            Err(Refusal::Expired { expires: at(60) })
        );
    }

    #[test]
    fn another_caller_another_node_or_another_action_is_refused() {
        let n2 = Holder::Node("n2".into());
        let n3 = Holder::Node("n3".into());
        assert!(matches!(
            check(&grant(), Some(&n3), "n1", &read("m1"), (at(0), &Revocations::default())),
            Err(Refusal::NotHolder { .. })
        ));
        assert!(matches!(
            check(&grant(), Some(&Holder::Server), "n1", &read("m1"), (at(0), &Revocations::default())),
            Err(Refusal::NotHolder { .. })
        ));
        assert_eq!(check(&grant(), None, "n1", &read("m1"), (at(0), &Revocations::default())), Err(Refusal::Anonymous));
        assert!(matches!(
            check(&grant(), Some(&n2), "n3", &read("m1"), (at(0), &Revocations::default())),
            Err(Refusal::OtherNode { .. })
        ));
        for asked in [
            read("m2"),
            Access::ReadVolume { member: "m1".into(), volume: "logs".into() },
            Access::StopMember { member: "m1".into() },
            Access::ListVolumes,
        ] {
            let refused = check(&grant(), Some(&n2), "n1", &asked, (at(0), &Revocations::default()));
            assert!(matches!(refused, Err(Refusal::OutOfScope { .. })), "{asked}: {refused:?}");
        }
    }

    #[test]
    fn a_refusal_says_who_what_and_where() {
        let n3 = Holder::Node("n3".into());
        let refused =
            check(&grant(), Some(&n3), "n1", &read("m1"), (at(0), &Revocations::default())).unwrap_err().to_string();
        assert_eq!(refused, "the grant is for node n2, but the caller is node n3");
        let asked = Access::StopMember { member: "m1".into() };
        let refused = check(&grant(), Some(&Holder::Node("n2".into())), "n1", &asked, (at(0), &Revocations::default()))
            .unwrap_err();
        assert_eq!(refused.to_string(), "the grant allows to read volume m1/data, not to stop member m1");
    }

    #[test]
    fn a_grant_ends_with_its_attempt_not_only_at_its_expiry() {
        let n2 = Holder::Node("n2".into());
        let mut ended = Revocations::default();
        let over =
            EndedAttempt { attempt: GrantedAttempt { command: "copy-1".into(), attempt: 1 }, grants_expire: at(60) };
        assert!(ended.merge(std::slice::from_ref(&over), at(10)));
        assert!(!ended.merge(std::slice::from_ref(&over), at(11)), "named again: nothing new");
        let refused = check(&grant(), Some(&n2), "n1", &read("m1"), (at(10), &ended)).unwrap_err();
        assert_eq!(refused.to_string(), "the grant ended with command copy-1 attempt 1, which is over");
        let mut own = grant();
        own.attempt = None;
        assert_eq!(check(&own, Some(&n2), "n1", &read("m1"), (at(10), &ended)), Ok(()), "the server's own");
        assert!(ended.merge(&[], at(60)), "forgotten once its grants expired");
        assert!(!ended.contains(&over.attempt));
    }

    #[test]
    fn the_attempts_that_ended_are_the_earlier_ones_and_the_settled_or_retried_current_one() {
        use crate::Object;
        use crate::kinds::{CommandSpec, ManagementState};
        let action = Action::CopyVolume { member: "m".into(), volume: "data".into(), from_node: "n1".into() };
        let spec = CommandSpec {
            node: "n2".into(),
            timeout: Some(crate::time::HumanDuration::from_secs(100)),
            action,
            origin: None,
        };
        let mut command: Command = Object::new("copy-1", spec);
        let names = |command: &Command, node: &str, now| -> Vec<u32> {
            ended_attempts(command, node, now).iter().map(|e| e.attempt.attempt).collect()
        };
        assert!(names(&command, "n1", at(0)).is_empty(), "never issued");
        command.status.issue(1, BTreeMap::new(), Vec::new(), at(0));
        assert!(names(&command, "n1", at(1)).is_empty(), "attempt 1 runs");
        command.status.retry("the agent lost it", at(5));
        assert_eq!(names(&command, "n1", at(5)), [1], "taken back for a retry");
        command.status.issue(1, BTreeMap::new(), Vec::new(), at(6));
        assert_eq!(names(&command, "n1", at(7)), [1], "attempt 2 runs");
        assert!(names(&command, "n2", at(7)).is_empty(), "n2 serves none of its grants");
        command.status.state_by_management = ManagementState::Completed;
        let ended = ended_attempts(&command, "n1", at(8));
        assert_eq!(ended.iter().map(|e| e.attempt.attempt).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(ended[0].grants_expire, at(6 + 100 + 60));
        assert!(names(&command, "n1", at(166)).is_empty(), "its grants expired anyway");
    }
}
