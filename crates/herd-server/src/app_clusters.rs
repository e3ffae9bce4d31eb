//! The server side of app clusters that is not a controller: admission of
//! a changed AppCluster (`herd_core::admission`), with its members read
//! from the store, and of the revision of its App it is pinned to (which
//! must be kept). No HTTP here.

use herd_core::admission::admit_cluster_change;
use herd_core::kinds::{AppClusterSpec, MemberSpec};
use herd_core::{Object, Resource};

use crate::error::ApiError;
use crate::objects::Objects;

/// Refuses (409, naming what blocks it) a spec change the cluster cannot
/// take now; a new cluster, or a metadata change, always passes. An
/// invalid change is refused as such (422) first.
pub async fn admit_replace(objects: &Objects, new: &Object<AppClusterSpec>) -> Result<(), ApiError> {
    let Some(old) = objects.get::<AppClusterSpec>(&new.metadata.name).await? else {
        return admit_create(objects, new).await;
    };
    herd_core::lifecycle::prepare_update(&old, new.clone())
        .map_err(|errors| ApiError::invalid(AppClusterSpec::KIND, &new.metadata.name, errors))?;
    if new.spec.app_revision != old.spec.app_revision {
        admit_create(objects, new).await?;
    }
    let (members, _) = objects.list::<MemberSpec>().await?;
    let members: Vec<_> = members.into_iter().filter(|m| m.spec.cluster == old.metadata.name).collect();
    admit_cluster_change(&old, new, &members).map_err(|why| {
        ApiError::Conflict(format!("AppCluster {:?} cannot take this change now: {why}", old.metadata.name))
    })
}

/// Refuses (422, naming `spec.appRevision`) a cluster pinned to a revision
/// its App does not keep.
pub async fn admit_create(objects: &Objects, new: &Object<AppClusterSpec>) -> Result<(), ApiError> {
    // One below 1 is refused by validation, naming the same field.
    let Some(revision) = new.spec.app_revision.filter(|r| *r >= 1) else { return Ok(()) };
    match crate::app_revisions::spec_at(objects, &new.spec.app_ref, revision).await? {
        Ok(_) => Ok(()),
        Err(why) => Err(ApiError::invalid(
            AppClusterSpec::KIND,
            &new.metadata.name,
            herd_core::ValidationErrors::single("spec.appRevision", why),
        )),
    }
}
