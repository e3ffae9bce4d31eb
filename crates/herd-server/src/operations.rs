//! Admission of Operations: what a new one names must exist (a
//! switchover's role must have a leader, and the member it names must be
//! of that role; an upgrade's revision must be kept, and not undo an
//! irreversible one), and one node is drained (one role restarted or
//! switched over, one cluster upgraded) by one Operation at a time (the
//! controller carries them out: `controllers::operations`).

use herd_core::ValidationErrors;
use herd_core::kinds::{
    AppCluster, AppClusterSpec, AppSpec, MemberSpec, NodeSpec, Operation, OperationAction, OperationSpec,
};

use crate::error::ApiError;
use crate::objects::{Objects, ObjectsError};

pub async fn admit(objects: &Objects, operation: &Operation) -> Result<(), ApiError> {
    let name = &operation.metadata.name;
    let invalid = |field: &str, why: String| {
        ApiError::invalid(<OperationSpec as herd_core::Resource>::KIND, name, ValidationErrors::single(field, why))
    };
    let what = match &operation.spec.action {
        OperationAction::Drain { node } => {
            if objects.get::<NodeSpec>(node).await?.is_none() {
                return Err(invalid("spec.action.node", format!("there is no node named {node:?}")));
            }
            format!("node {node} is being drained")
        }
        OperationAction::Restart { cluster, role, .. } => {
            let Some(found) = objects.get::<AppClusterSpec>(cluster).await? else {
                return Err(invalid("spec.action.cluster", format!("there is no AppCluster named {cluster:?}")));
            };
            if found.spec.role(role).is_none() {
                let roles: Vec<&str> = found.spec.roles.iter().map(|r| r.name.as_str()).collect();
                let why = format!("AppCluster {cluster} has no role {role:?} (its roles: {})", roles.join(", "));
                return Err(invalid("spec.action.role", why));
            }
            format!("role {role} of {cluster} is being restarted")
        }
        OperationAction::Switchover { cluster, role, to } => {
            let Some(found) = objects.get::<AppClusterSpec>(cluster).await? else {
                return Err(invalid("spec.action.cluster", format!("there is no AppCluster named {cluster:?}")));
            };
            let app = objects.get::<AppSpec>(&found.spec.app_ref).await?;
            let leads = app.as_ref().and_then(|a| a.spec.role(role)).map(|r| r.leader.is_some());
            let leader_roles: Vec<&str> = app
                .as_ref()
                .map(|a| a.spec.roles.iter().filter(|r| r.leader.is_some()).map(|r| r.name.as_str()).collect())
                .unwrap_or_default();
            let roles = match leader_roles.is_empty() {
                true => "it has none".to_string(),
                false => format!("its leader roles: {}", leader_roles.join(", ")),
            };
            match leads {
                None => {
                    let why = format!("AppCluster {cluster} has no role {role:?} ({roles})");
                    return Err(invalid("spec.action.role", why));
                }
                Some(false) => {
                    let why = format!(
                        "role {role} of {cluster} has no leader to switch over: its App says no `leader:` ({roles})"
                    );
                    return Err(invalid("spec.action.role", why));
                }
                Some(true) => {}
            }
            if let Some(to) = to {
                match objects.get::<MemberSpec>(to).await? {
                    Some(member) if member.spec.cluster == *cluster && member.spec.role == *role => {}
                    Some(member) if member.spec.cluster == *cluster => {
                        let why = format!("member {to} is of role {}, not {role}", member.spec.role);
                        return Err(invalid("spec.action.to", why));
                    }
                    _ => {
                        let why = format!("AppCluster {cluster} has no member named {to:?}");
                        return Err(invalid("spec.action.to", why));
                    }
                }
            }
            format!("role {role} of {cluster} is being switched over")
        }
        OperationAction::Upgrade { cluster, to_revision, .. } => {
            let Some(found) = objects.get::<AppClusterSpec>(cluster).await? else {
                return Err(invalid("spec.action.cluster", format!("there is no AppCluster named {cluster:?}")));
            };
            let app = &found.spec.app_ref;
            if let Err(why) = crate::app_revisions::spec_at(objects, app, *to_revision).await? {
                return Err(invalid("spec.action.toRevision", why));
            }
            if let Some(why) = irreversible_since(objects, &found, *to_revision).await? {
                return Err(invalid("spec.action.toRevision", why));
            }
            format!("{cluster} is being upgraded")
        }
    };
    // One switchover of a role at a time, whichever member each asks for;
    // one upgrade of a cluster, whichever revision.
    let same = |other: &OperationAction| match (other, &operation.spec.action) {
        (
            OperationAction::Switchover { cluster: c, role: r, .. },
            OperationAction::Switchover { cluster, role, .. },
        ) => c == cluster && r == role,
        (OperationAction::Upgrade { cluster: c, .. }, OperationAction::Upgrade { cluster, .. }) => c == cluster,
        (other, action) => other == action,
    };
    let (operations, _) = objects.list::<OperationSpec>().await?;
    if let Some(other) = operations.iter().find(|other| same(&other.spec.action) && !other.status.phase.is_finished()) {
        return Err(ApiError::Conflict(format!(
            "{what} by operation {} already: follow it with `herd describe operation {0}`, \
             or cancel it with `herd operation cancel {0}`",
            other.metadata.name
        )));
    }
    Ok(())
}

/// Why `cluster` may not be taken back to revision `to`: a member runs (or
/// is to run) a later revision whose App says its upgrade is irreversible.
async fn irreversible_since(objects: &Objects, cluster: &AppCluster, to: i64) -> Result<Option<String>, ObjectsError> {
    let (members, _) = objects.list::<MemberSpec>().await?;
    let ours = members.iter().filter(|m| m.spec.cluster == cluster.metadata.name);
    let Some(latest) = ours.flat_map(|m| [m.spec.app_revision, m.status.app_revision]).flatten().max() else {
        return Ok(None);
    };
    let app = &cluster.spec.app_ref;
    // Every revision between counts (one passed through on the way), as
    // far as they are kept.
    for step in to + 1..=latest {
        if let Ok(spec) = crate::app_revisions::spec_at(objects, app, step).await?
            && let Some(why) = spec.upgrade.irreversible
        {
            return Ok(Some(format!(
                "members of {} run revision {latest}, and the upgrade to revision {step} of App {app} is \
                 irreversible ({why}): it cannot be taken back to revision {to}; upgrade it to a later one",
                cluster.metadata.name
            )));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use herd_core::Object;
    use herd_core::kinds::{App, AppCluster, Member};
    use herd_store::Store;

    use super::*;

    /// An App with a leader role `db` and a role `web` without, a
    /// cluster `c` of it, and a member of each role.
    async fn two_roles() -> (tempfile::TempDir, Objects) {
        let dir = tempfile::tempdir().unwrap();
        let objects = Objects::new(Store::open(dir.path().join("s.db").to_str().unwrap()).await.unwrap());
        let run = serde_json::json!({"command": ["sleep", "60"]});
        let hook = serde_json::json!({"script": "true"});
        let app = App::from_json_value(serde_json::json!({
            "metadata": {"name": "a"},
            "spec": {"roles": [
                {"name": "db", "run": run, "leader": {"promote": hook, "demote": hook}},
                {"name": "web", "run": run}
            ]}
        }))
        .unwrap();
        objects.create(app, false, false).await.unwrap();
        let cluster = AppCluster::from_json_value(serde_json::json!({
            "metadata": {"name": "c"},
            "spec": {"appRef": "a", "roles": [{"name": "db", "members": 1}, {"name": "web", "members": 1}]}
        }))
        .unwrap();
        objects.create(cluster, false, false).await.unwrap();
        for role in ["db", "web"] {
            let member = Member::from_json_value(serde_json::json!({
                "metadata": {"name": format!("c-{role}-0")},
                "spec": {"cluster": "c", "role": role, "index": 0}
            }))
            .unwrap();
            objects.create(member, false, false).await.unwrap();
        }
        (dir, objects)
    }

    async fn switchover(objects: &Objects, role: &str, to: Option<&str>) -> Result<(), ApiError> {
        let action = OperationAction::Switchover { cluster: "c".into(), role: role.into(), to: to.map(String::from) };
        let spec = OperationSpec {
            action,
            deadline: None,
            on_deadline: Default::default(),
            max_parallel: 1,
            cancel: false,
            paused: false,
        };
        admit(objects, &Object::new("s", spec)).await
    }

    #[tokio::test]
    async fn a_switchover_is_refused_naming_the_field_for_a_role_without_a_leader_or_a_member_of_another_role() {
        let (_dir, objects) = two_roles().await;
        switchover(&objects, "db", Some("c-db-0")).await.unwrap();
        switchover(&objects, "db", None).await.unwrap();
        let said = |result: Result<(), ApiError>| result.unwrap_err().to_string();
        let other_role = said(switchover(&objects, "db", Some("c-web-0")).await);
        assert!(
            other_role.contains("spec.action.to") && other_role.contains("c-web-0 is of role web, not db"),
            "{other_role}"
        );
        let no_leader = said(switchover(&objects, "web", None).await);
        assert!(no_leader.contains("spec.action.role") && no_leader.contains("its leader roles: db"), "{no_leader}");
        let missing = said(switchover(&objects, "db", Some("c-db-9")).await);
        assert!(missing.contains("spec.action.to") && missing.contains("no member named \"c-db-9\""), "{missing}");
    }
}
