//! An App's revisions: every accepted change to an App's spec (a new
//! generation) writes `AppRevision` `<app>-<generation>` in the App's own
//! transaction, so that no accepted spec goes unrecorded; the oldest go
//! once more than ClusterConfig's `appClusters.revisionsKept` are kept,
//! except those a cluster or a member
//! still runs or is to run, and all go with their App (in its delete's
//! transaction). Clients read them and never write them.

use std::collections::BTreeSet;

use herd_core::Resource;
use herd_core::kinds::app_revision::{AppRevision, AppRevisionSpec, revision_name};
use herd_core::kinds::cluster_config::CLUSTER_CONFIG_NAME;
use herd_core::kinds::{App, AppClusterSpec, AppSpec, ClusterConfigSpec, MemberSpec};
use herd_core::lifecycle;
use herd_store::Op;

use crate::error::ApiError;
use crate::objects::{Objects, ObjectsError, encode, now, object_key};

/// App `app` as of `revision`: the App itself at its generation, else the
/// revision kept; or why there is none (the revisions kept named).
pub async fn spec_at(objects: &Objects, app: &str, revision: i64) -> Result<Result<AppSpec, String>, ObjectsError> {
    let Some(current) = objects.get::<AppSpec>(app).await? else {
        return Ok(Err(format!("there is no App named {app:?}")));
    };
    if current.metadata.generation == revision {
        return Ok(Ok(current.spec));
    }
    if let Some(kept) = objects.get::<AppRevisionSpec>(&revision_name(app, revision)).await? {
        return Ok(Ok(kept.spec.app_spec));
    }
    let (revisions, _) = objects.list::<AppRevisionSpec>().await?;
    let mut kept: Vec<i64> = revisions.iter().filter(|r| r.spec.app == app).map(|r| r.spec.revision).collect();
    kept.sort_unstable();
    let kept: Vec<String> = kept.iter().map(i64::to_string).collect();
    Ok(Err(format!(
        "App {app} has no revision {revision} (it keeps {}; `herd app history {app}` lists them)",
        kept.join(", ")
    )))
}

/// Deletes App `name` and its revisions in one transaction.
pub async fn delete(
    objects: &Objects,
    name: &str,
    precondition: Option<herd_store::Revision>,
    dry_run: bool,
) -> Result<serde_json::Value, ApiError> {
    let (revisions, _) = objects.list::<AppRevisionSpec>().await?;
    let ops = revisions
        .iter()
        .filter(|r| r.spec.app == name)
        .map(|r| Op::Delete { key: object_key(AppRevisionSpec::PLURAL, &r.metadata.name) })
        .collect();
    Ok(objects.delete_value_with(AppSpec::KIND, AppSpec::PLURAL, name, precondition, dry_run, ops).await?)
}

/// Writes `app` (a create when `old` is None, else over `old` as read),
/// with its revision when its spec changed (a new generation), pruning
/// the oldest.
pub async fn write(objects: &Objects, app: App, old: Option<&App>, dry_run: bool) -> Result<App, ApiError> {
    let name = app.metadata.name.clone();
    let config = objects.get::<ClusterConfigSpec>(CLUSTER_CONFIG_NAME).await?.map(|c| c.spec).unwrap_or_default();
    let kept_at_most = usize::try_from(config.app_clusters.revisions_kept).unwrap_or(usize::MAX).max(1);
    let (revisions, _) = objects.list::<AppRevisionSpec>().await?;
    let in_use = match old {
        Some(_) => in_use(objects, &name).await?,
        None => BTreeSet::new(),
    };
    let mut kept: Vec<i64> = revisions
        .iter()
        .filter(|r| r.spec.app == name && !in_use.contains(&r.spec.revision))
        .map(|r| r.spec.revision)
        .collect();
    kept.sort_unstable();
    let written = objects
        .write_with_companions(app, old, dry_run, |stored| {
            let generation = stored.metadata.generation;
            if old.is_some_and(|old| old.metadata.generation == generation) {
                return Ok(Vec::new());
            }
            let spec = AppRevisionSpec { app: name.clone(), revision: generation, app_spec: stored.spec.clone() };
            let revision = AppRevision::new(revision_name(&name, generation), spec);
            let revision = lifecycle::prepare_create(revision, uuid::Uuid::now_v7().to_string(), now(), false)
                .map_err(|errors| ObjectsError::invalid(AppRevisionSpec::KIND, &name, errors))?
                .object;
            let key = |revision: i64| object_key(AppRevisionSpec::PLURAL, &revision_name(&name, revision));
            kept.retain(|r| *r != generation);
            // A new App's history starts with it: an earlier App's of the
            // same name goes.
            let pruned = if old.is_none() { kept.len() } else { kept.len().saturating_sub(kept_at_most - 1) };
            let mut ops: Vec<Op> = kept[..pruned].iter().map(|r| Op::Delete { key: key(*r) }).collect();
            ops.push(Op::Put { key: key(generation), value: encode(&revision) });
            Ok(ops)
        })
        .await?;
    Ok(written)
}

/// The revisions of App `app` that its clusters are pinned to, or that
/// their members run or are to run: never pruned.
async fn in_use(objects: &Objects, app: &str) -> Result<BTreeSet<i64>, ObjectsError> {
    let (clusters, _) = objects.list::<AppClusterSpec>().await?;
    let clusters: Vec<_> = clusters.into_iter().filter(|c| c.spec.app_ref == app).collect();
    let mut in_use: BTreeSet<i64> = clusters.iter().filter_map(|c| c.spec.app_revision).collect();
    if !clusters.is_empty() {
        let (members, _) = objects.list::<MemberSpec>().await?;
        let ours = members.iter().filter(|m| clusters.iter().any(|c| c.metadata.name == m.spec.cluster));
        in_use.extend(ours.flat_map(|m| [m.spec.app_revision, m.status.app_revision]).flatten());
    }
    Ok(in_use)
}
