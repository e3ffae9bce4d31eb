//! configmeta: the JSON document a member is given (written into its data
//! before setup, on every spec change and whenever what it says changed)
//! describing the whole cluster — name, App, generation, each role's
//! members with node, address, ports, state and readiness — and the
//! member itself. Pure: built from the objects.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::app_cluster::AppCluster;
use crate::kinds::member::{Member, MemberState};
use crate::kinds::node::Node;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMeta {
    pub cluster: String,
    pub app: String,
    /// The cluster generation this document was made from.
    pub generation: i64,
    pub roles: Vec<RoleMeta>,
    /// The member this copy is for.
    pub me: MemberMeta,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleMeta {
    pub name: String,
    pub members: Vec<MemberMeta>,
    /// Its leader, for a leader role whose lease is held and renewed
    /// (none while it waits for one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<LeaderMeta>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaderMeta {
    pub member: String,
    /// Only rises: a follower ignores a leader of an older term.
    pub term: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberMeta {
    pub name: String,
    pub role: String,
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The host its node is reached at (its agent's address, without the port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ports: BTreeMap<String, u16>,
    pub state: MemberState,
    /// Configured, running on a Ready node and passing its readiness
    /// check, as the budgets count it.
    #[serde(default)]
    pub ready: bool,
}

fn meta_of(member: &Member, hosts: &BTreeMap<&str, &str>) -> MemberMeta {
    let host = member.spec.node.as_deref().and_then(|name| hosts.get(name)).map(|host| host.to_string());
    MemberMeta {
        name: member.metadata.name.clone(),
        role: member.spec.role.clone(),
        index: member.spec.index,
        node: member.spec.node.clone(),
        host,
        ports: member.spec.ports.clone(),
        state: member.status.state,
        ready: member.status.ready,
    }
}

/// Every member of `cluster` not leaving, role by role in the spec's
/// order, by index.
fn roles_of(cluster: &AppCluster, members: &[Member], nodes: &[impl Borrow<Node>]) -> Vec<RoleMeta> {
    let hosts: BTreeMap<&str, &str> = nodes
        .iter()
        .map(Borrow::borrow)
        .filter_map(|n| Some((n.metadata.name.as_str(), crate::placement::node_host(n)?)))
        .collect();
    let staying = |m: &&Member| !matches!(m.status.state, MemberState::DeletePending | MemberState::Deleting);
    cluster
        .spec
        .roles
        .iter()
        .map(|role| {
            let mut of_role: Vec<&Member> =
                members.iter().filter(staying).filter(|m| m.spec.role == role.name).collect();
            of_role.sort_by_key(|m| m.spec.index);
            let leader = cluster.status.leaders.iter().find(|l| l.role == role.name && l.waiting.is_none());
            RoleMeta {
                name: role.name.clone(),
                members: of_role.into_iter().map(|m| meta_of(m, &hosts)).collect(),
                leader: leader.and_then(|l| Some(LeaderMeta { member: l.member.clone()?, term: l.term })),
            }
        })
        .collect()
}

/// The digest (see [`ConfigMeta::digest`]) of the cluster as `members`
/// are now, the same for every member.
pub fn digest_of(cluster: &AppCluster, members: &[Member], nodes: &[impl Borrow<Node>]) -> String {
    digest(&roles_of(cluster, members, nodes))
}

/// The document for member `me`: every member of `cluster` not leaving,
/// role by role in the spec's order, by index. None when `me` is not one
/// of them.
pub fn configmeta(
    cluster: &AppCluster,
    members: &[Member],
    nodes: &[impl Borrow<Node>],
    me: &str,
) -> Option<ConfigMeta> {
    let roles = roles_of(cluster, members, nodes);
    let me = roles.iter().flat_map(|r| &r.members).find(|m| m.name == me)?.clone();
    Some(ConfigMeta {
        cluster: cluster.metadata.name.clone(),
        app: cluster.spec.app_ref.clone(),
        generation: cluster.metadata.generation,
        roles,
        me,
    })
}

/// A name as part of a shell variable name: letters and digits kept
/// (upper-cased), everything else `_`.
fn shell_part(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
}

fn quoted(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

/// FNV-1a, 64 bits, over each role's leader and term and each staying
/// member's name, node, host, ports, and whether it is configured and
/// ready: stable across processes and versions.
fn digest(roles: &[RoleMeta]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |text: &str| {
        for byte in text.bytes().chain([0xff]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for role in roles {
        feed(&role.name);
        if let Some(leader) = &role.leader {
            feed(&leader.member);
            feed(&leader.term.to_string());
        }
        for member in &role.members {
            feed(&member.name);
            feed(member.node.as_deref().unwrap_or(""));
            feed(member.host.as_deref().unwrap_or(""));
            for (port, number) in &member.ports {
                feed(port);
                feed(&number.to_string());
            }
            // Whether it is configured and ready, not every step on the
            // way (create pending, creating): a cluster forming would send
            // every member a fresh copy at each of the others' steps.
            feed(match (member.state == MemberState::Configured, member.ready) {
                (true, true) => "ready",
                (true, false) => "configured, not ready",
                (false, _) => "not configured",
            });
        }
    }
    format!("{hash:016x}")
}

impl ConfigMeta {
    /// A digest of what the document says of the members: each staying
    /// member's name, role, node, host, ports, and whether it is
    /// configured and ready (not each step before: create pending and
    /// creating are both "not configured yet"). A configured member whose
    /// configmeta was written with another digest is given a fresh one (a
    /// member replaced on another host, one that became configured, one
    /// whose node went NotReady): no member is left reading another as not
    /// configured, or ready, when it is not. (A change while one is on its
    /// way waits for it: one Command at a time per member, so changes
    /// coalesce.)
    pub fn digest(&self) -> String {
        digest(&self.roles)
    }

    /// The same document as shell variables, for setup scripts in `sh`
    /// (`. "$HERD_CONFIGMETA_SH"`): `CM_CLUSTER`, `CM_GENERATION`, `CM_ME`
    /// (the member's name) and `CM_ME_ID` (its variable part), `CM_ROLES`,
    /// per role `CM_ROLE_<ROLE>` (its members, space-separated) and, for a
    /// role that has a leader now, `CM_ROLE_<ROLE>_LEADER` and
    /// `CM_ROLE_<ROLE>_LEADER_TERM`, and per
    /// member `CM_<ID>_NAME|ROLE|NODE|HOST|STATE|READY|PORT_<PORT>`
    /// (`READY` is `true` or `false`), where `<ID>`
    /// is the member's name upper-cased with `-` as `_`.
    pub fn to_shell(&self) -> String {
        let mut lines = vec![
            format!("CM_CLUSTER={}", quoted(&self.cluster)),
            format!("CM_APP={}", quoted(&self.app)),
            format!("CM_GENERATION={}", self.generation),
            format!("CM_ME={}", quoted(&self.me.name)),
            format!("CM_ME_ID={}", shell_part(&self.me.name)),
        ];
        let roles: Vec<&str> = self.roles.iter().map(|r| r.name.as_str()).collect();
        lines.push(format!("CM_ROLES={}", quoted(&roles.join(" "))));
        for role in &self.roles {
            let names: Vec<&str> = role.members.iter().map(|m| m.name.as_str()).collect();
            lines.push(format!("CM_ROLE_{}={}", shell_part(&role.name), quoted(&names.join(" "))));
            if let Some(leader) = &role.leader {
                lines.push(format!("CM_ROLE_{}_LEADER={}", shell_part(&role.name), quoted(&leader.member)));
                lines.push(format!("CM_ROLE_{}_LEADER_TERM={}", shell_part(&role.name), leader.term));
            }
            for member in &role.members {
                let id = shell_part(&member.name);
                lines.push(format!("CM_{id}_NAME={}", quoted(&member.name)));
                lines.push(format!("CM_{id}_ROLE={}", quoted(&member.role)));
                lines.push(format!("CM_{id}_NODE={}", quoted(member.node.as_deref().unwrap_or(""))));
                lines.push(format!("CM_{id}_HOST={}", quoted(member.host.as_deref().unwrap_or(""))));
                let state = serde_json::to_value(member.state).ok().and_then(|v| v.as_str().map(str::to_string));
                lines.push(format!("CM_{id}_STATE={}", quoted(&state.unwrap_or_default())));
                lines.push(format!("CM_{id}_READY={}", member.ready));
                for (port, number) in &member.ports {
                    lines.push(format!("CM_{id}_PORT_{}={number}", shell_part(port)));
                }
            }
        }
        lines.push(String::new());
        lines.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::app_cluster::{AppClusterSpec, ClusterRole};
    use crate::kinds::node::NodeSpec;

    fn member(role: &str, index: u32, node: &str, state: MemberState) -> Member {
        let mut member = crate::kinds::member::slot_member(role, index, Some(node));
        member.spec.ports = BTreeMap::from([("client".to_string(), 20000 + index as u16)]);
        member.status.state = state;
        member
    }

    #[test]
    fn the_document_lists_staying_members_by_role_and_index_with_hosts_and_ports() {
        let mut cluster = AppCluster::new(
            "db",
            AppClusterSpec {
                app_ref: "etcd".into(),
                roles: vec![
                    ClusterRole { name: "member".into(), members: 2, ..Default::default() },
                    ClusterRole { name: "proxy".into(), members: 1, ..Default::default() },
                ],
                ..Default::default()
            },
        );
        cluster.metadata.generation = 7;
        let mut n1 = Node::new("n1", NodeSpec::default());
        n1.status.address = Some("127.0.0.5:41000".into());
        let members = [
            member("proxy", 0, "n1", MemberState::Creating),
            member("member", 1, "n2", MemberState::Configured),
            member("member", 0, "n1", MemberState::Configured),
            member("member", 2, "n1", MemberState::DeletePending),
        ];
        let meta = configmeta(&cluster, &members, &[n1], "db-member-1").unwrap();
        assert_eq!((meta.cluster.as_str(), meta.app.as_str(), meta.generation), ("db", "etcd", 7));
        let names: Vec<Vec<&str>> =
            meta.roles.iter().map(|r| r.members.iter().map(|m| m.name.as_str()).collect()).collect();
        assert_eq!(names, [vec!["db-member-0", "db-member-1"], vec!["db-proxy-0"]], "the leaving one is not listed");
        assert_eq!(meta.roles[0].members[0].host.as_deref(), Some("127.0.0.5"));
        assert_eq!(meta.me.name, "db-member-1");
        assert_eq!(meta.me.host, None, "its node has not reported an address");
        assert_eq!(meta.me.ports["client"], 20001);
        assert!(configmeta(&cluster, &members, &[] as &[Node], "db-member-2").is_none(), "a leaving member gets none");
    }

    #[test]
    fn the_shell_form_names_every_member_by_its_id() {
        let cluster = AppCluster::new(
            "db",
            AppClusterSpec {
                app_ref: "etcd".into(),
                roles: vec![ClusterRole { name: "member".into(), members: 2, ..Default::default() }],
                ..Default::default()
            },
        );
        let mut n1 = Node::new("n1", NodeSpec::default());
        n1.status.address = Some("127.0.0.5:41000".into());
        let members =
            [member("member", 0, "n1", MemberState::Configured), member("member", 1, "n1", MemberState::Creating)];
        let shell = configmeta(&cluster, &members, &[n1], "db-member-1").unwrap().to_shell();
        for line in [
            "CM_ME='db-member-1'",
            "CM_ME_ID=DB_MEMBER_1",
            "CM_ROLE_MEMBER='db-member-0 db-member-1'",
            "CM_DB_MEMBER_0_HOST='127.0.0.5'",
            "CM_DB_MEMBER_0_STATE='configured'",
            "CM_DB_MEMBER_1_STATE='creating'",
            "CM_DB_MEMBER_1_READY=false",
            "CM_DB_MEMBER_1_PORT_CLIENT=20001",
        ] {
            assert!(shell.lines().any(|l| l == line), "{line} in\n{shell}");
        }
    }

    #[test]
    fn the_digest_changes_with_where_members_are_their_states_and_readiness() {
        let cluster = AppCluster::new(
            "db",
            AppClusterSpec {
                app_ref: "etcd".into(),
                roles: vec![ClusterRole { name: "member".into(), members: 2, ..Default::default() }],
                ..Default::default()
            },
        );
        let members =
            [member("member", 0, "n1", MemberState::Configured), member("member", 1, "n1", MemberState::Creating)];
        let digest =
            |members: &[Member]| configmeta(&cluster, members, &[] as &[Node], "db-member-0").unwrap().digest();
        assert_eq!(digest(&members), digest_of(&cluster, &members, &[] as &[Node]));
        let mut seen = vec![digest(&members)];
        let mut later = members.clone();
        later[1].status.state = MemberState::CreatePending;
        assert_eq!(digest(&later), seen[0], "a step before configured is not a change to send");
        later[1].status.state = MemberState::Configured;
        seen.push(digest(&later));
        later[1].status.ready = true;
        seen.push(digest(&later));
        later[1].spec.node = Some("n2".into());
        seen.push(digest(&later));
        let distinct: std::collections::BTreeSet<&String> = seen.iter().collect();
        assert_eq!(distinct.len(), 4, "a state, a readiness and a node change each change it: {seen:?}");
        assert_eq!(digest(&later), seen[3], "the same document, the same digest");
    }

    #[test]
    fn a_leader_role_names_its_leader_and_term_while_the_lease_is_held_and_its_digest_follows_them() {
        use crate::kinds::app_cluster::RoleLeader;
        let mut cluster = AppCluster::new(
            "db",
            AppClusterSpec {
                app_ref: "pg".into(),
                roles: vec![ClusterRole { name: "pg".into(), members: 2, ..Default::default() }],
                ..Default::default()
            },
        );
        let members = [member("pg", 0, "n1", MemberState::Configured), member("pg", 1, "n2", MemberState::Configured)];
        let nodes: &[Node] = &[];
        let none = configmeta(&cluster, &members, nodes, "db-pg-1").unwrap();
        assert_eq!(none.roles[0].leader, None);
        let held = |term, waiting: Option<&str>| RoleLeader {
            role: "pg".into(),
            member: Some("db-pg-0".into()),
            instance: Some("run".into()),
            term,
            waiting: waiting.map(str::to_string),
            ..RoleLeader::default()
        };
        cluster.status.leaders = vec![held(3, None)];
        let led = configmeta(&cluster, &members, nodes, "db-pg-1").unwrap();
        assert_eq!(led.roles[0].leader, Some(LeaderMeta { member: "db-pg-0".into(), term: 3 }));
        let shell = led.to_shell();
        assert!(shell.contains("CM_ROLE_PG_LEADER='db-pg-0'\nCM_ROLE_PG_LEADER_TERM=3\n"), "{shell}");
        assert_ne!(led.digest(), none.digest(), "a new leader reaches every member");
        cluster.status.leaders = vec![held(4, None)];
        assert_ne!(configmeta(&cluster, &members, nodes, "db-pg-1").unwrap().digest(), led.digest(), "and a new term");
        cluster.status.leaders = vec![held(4, Some("its lease runs 3s more"))];
        assert_eq!(
            configmeta(&cluster, &members, nodes, "db-pg-1").unwrap().roles[0].leader,
            None,
            "none while it waits"
        );
    }
}
