//! The server side of app clusters that is not a controller: admission of
//! a changed AppCluster (`herd_core::admission`), with its members read
//! from the store. No HTTP here.

use herd_core::admission::admit_cluster_change;
use herd_core::kinds::{AppClusterSpec, MemberSpec};
use herd_core::{Object, Resource};

use crate::error::ApiError;
use crate::objects::Objects;

/// Refuses (409, naming what blocks it) a spec change the cluster cannot
/// take now; a new cluster, or a metadata change, always passes. An
/// invalid change is refused as such (422) first.
pub async fn admit_replace(objects: &Objects, new: &Object<AppClusterSpec>) -> Result<(), ApiError> {
    let Some(old) = objects.get::<AppClusterSpec>(&new.metadata.name).await? else { return Ok(()) };
    herd_core::lifecycle::prepare_update(&old, new.clone())
        .map_err(|errors| ApiError::invalid(AppClusterSpec::KIND, &new.metadata.name, errors))?;
    let (members, _) = objects.list::<MemberSpec>().await?;
    let members: Vec<_> = members.into_iter().filter(|m| m.spec.cluster == old.metadata.name).collect();
    admit_cluster_change(&old, new, &members).map_err(|why| {
        ApiError::Conflict(format!("AppCluster {:?} cannot take this change now: {why}", old.metadata.name))
    })
}
