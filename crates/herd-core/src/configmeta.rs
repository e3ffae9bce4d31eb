//! configmeta: the JSON document a member is given (written into its data
//! before setup and on every spec change) describing the whole cluster —
//! name, App, generation, each role's members with node, address, ports
//! and state — and the member itself. Pure: built from the objects.

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
}

fn meta_of(member: &Member, nodes: &[Node]) -> MemberMeta {
    let host = member
        .spec
        .node
        .as_deref()
        .and_then(|name| nodes.iter().find(|n| n.metadata.name == name))
        .and_then(|n| n.status.address.as_deref())
        .map(|address| address.rsplit_once(':').map_or(address, |(host, _)| host).to_string());
    MemberMeta {
        name: member.metadata.name.clone(),
        role: member.spec.role.clone(),
        index: member.spec.index,
        node: member.spec.node.clone(),
        host,
        ports: member.spec.ports.clone(),
        state: member.status.state,
    }
}

/// The document for member `me`: every member of `cluster` not leaving,
/// role by role in the spec's order, by index. None when `me` is not one
/// of them.
pub fn configmeta(cluster: &AppCluster, members: &[Member], nodes: &[Node], me: &str) -> Option<ConfigMeta> {
    let staying = |m: &&Member| !matches!(m.status.state, MemberState::DeletePending | MemberState::Deleting);
    let roles = cluster
        .spec
        .roles
        .iter()
        .map(|role| {
            let mut of_role: Vec<&Member> =
                members.iter().filter(staying).filter(|m| m.spec.role == role.name).collect();
            of_role.sort_by_key(|m| m.spec.index);
            RoleMeta { name: role.name.clone(), members: of_role.into_iter().map(|m| meta_of(m, nodes)).collect() }
        })
        .collect::<Vec<_>>();
    let me = roles.iter().flat_map(|r| &r.members).find(|m| m.name == me)?.clone();
    Some(ConfigMeta {
        cluster: cluster.metadata.name.clone(),
        app: cluster.spec.app_ref.clone(),
        generation: cluster.metadata.generation,
        roles,
        me,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::app_cluster::{AppClusterSpec, ClusterRole};
    use crate::kinds::member::{MemberSpec, member_name};
    use crate::kinds::node::NodeSpec;

    fn member(role: &str, index: u32, node: &str, state: MemberState) -> Member {
        let mut member = Member::new(
            member_name("db", role, index),
            MemberSpec {
                cluster: "db".into(),
                role: role.into(),
                index,
                node: Some(node.into()),
                ports: BTreeMap::from([("client".to_string(), 20000 + index as u16)]),
            },
        );
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
        assert!(configmeta(&cluster, &members, &[], "db-member-2").is_none(), "a leaving member gets none");
    }
}
