//! An App's revisions: every accepted change to an App's spec (a new
//! generation) writes `AppRevision` `<app>-<generation>` in the App's own
//! transaction, so that no accepted spec goes unrecorded; the oldest go
//! once more than [`KEPT`] are kept, and all go with their App (in its
//! delete's transaction). Clients read them and never write them.

use herd_core::Resource;
use herd_core::kinds::app_revision::{AppRevision, AppRevisionSpec, revision_name};
use herd_core::kinds::{App, AppSpec};
use herd_core::lifecycle;
use herd_store::Op;

use crate::error::ApiError;
use crate::objects::{Objects, ObjectsError, encode, now, object_key};

/// How many revisions of an App are kept.
pub const KEPT: usize = 10;

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
    let (revisions, _) = objects.list::<AppRevisionSpec>().await?;
    let mut kept: Vec<i64> = revisions.iter().filter(|r| r.spec.app == name).map(|r| r.spec.revision).collect();
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
            let pruned = if old.is_none() { kept.len() } else { kept.len().saturating_sub(KEPT - 1) };
            let mut ops: Vec<Op> = kept[..pruned].iter().map(|r| Op::Delete { key: key(*r) }).collect();
            ops.push(Op::Put { key: key(generation), value: encode(&revision) });
            Ok(ops)
        })
        .await?;
    Ok(written)
}
