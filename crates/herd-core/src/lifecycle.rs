//! What the server does to an object on create, update and status update:
//! which fields the client owns, which the server owns, when the generation
//! moves. Pure functions; the server supplies the uid and the time.

use crate::resource::{Object, Resource};
use crate::time::Timestamp;
use crate::validation::{FieldPath, ValidationErrors};

/// An object ready to be written, and the store revision the write must
/// find (None for a create, which must find nothing).
#[derive(Debug)]
pub struct Prepared<S: Resource> {
    pub object: Object<S>,
    pub expected_revision: Option<u64>,
}

/// Prepares a new object: validates it and fills the server-owned metadata.
/// A status sent by the client is dropped (it is written through the status
/// subresource) unless `keep_status` (the server creating its own objects).
/// Sets the labels the server owns from the spec; one a client set to
/// another value is refused, naming it.
fn own_labels<S: Resource>(object: &mut Object<S>) -> Result<(), ValidationErrors> {
    let mut errors = ValidationErrors::new();
    for (key, value) in object.spec.owned_labels() {
        match object.metadata.labels.get(key) {
            Some(given) if *given != value => errors.add(
                &FieldPath::root("metadata").child("labels").key(key),
                format!("is set by the server from the spec (to {value:?}); leave it out"),
            ),
            _ => {
                object.metadata.labels.insert(key.to_string(), value);
            }
        }
    }
    errors.into_result()
}

pub fn prepare_create<S: Resource>(
    mut object: Object<S>,
    uid: String,
    now: Timestamp,
    keep_status: bool,
) -> Result<Prepared<S>, ValidationErrors> {
    object.validate()?;
    own_labels(&mut object)?;
    if object.metadata.resource_version.is_some() {
        return Err(ValidationErrors::single("metadata.resourceVersion", "must not be set when creating an object"));
    }
    let meta = &mut object.metadata;
    meta.uid = Some(uid);
    meta.creation_timestamp = Some(now);
    meta.deletion_timestamp = None;
    meta.generation = 1;
    if !keep_status {
        object.status = Default::default();
    }
    Ok(Prepared { object, expected_revision: None })
}

fn required_revision<S: Resource>(object: &Object<S>) -> Result<u64, ValidationErrors> {
    object.metadata.revision()?.ok_or_else(|| {
        ValidationErrors::single(
            "metadata.resourceVersion",
            "is required when updating: read the object first and send back its resourceVersion",
        )
    })
}

fn check_same_identity<S: Resource>(old: &Object<S>, new: &Object<S>) -> Result<(), ValidationErrors> {
    if new.metadata.name != old.metadata.name {
        return Err(ValidationErrors::single("metadata.name", format!("cannot change from {:?}", old.metadata.name)));
    }
    if new.metadata.uid.is_some() && new.metadata.uid != old.metadata.uid {
        return Err(ValidationErrors::single("metadata.uid", "is set by the server and cannot change"));
    }
    Ok(())
}

/// Prepares an update of metadata and spec. The status and server-owned
/// metadata are kept from `old`; the generation moves when the spec changes.
pub fn prepare_update<S: Resource>(old: &Object<S>, mut new: Object<S>) -> Result<Prepared<S>, ValidationErrors> {
    new.validate()?;
    check_same_identity(old, &new)?;
    let expected = required_revision(&new)?;
    let mut errors = ValidationErrors::new();
    new.spec.validate_spec_update(&old.spec, &FieldPath::root("spec"), &mut errors);
    errors.into_result()?;
    own_labels(&mut new)?;

    let spec_changed = new.spec != old.spec;
    let meta = &mut new.metadata;
    meta.uid = old.metadata.uid.clone();
    meta.creation_timestamp = old.metadata.creation_timestamp;
    meta.deletion_timestamp = old.metadata.deletion_timestamp;
    meta.generation = old.metadata.generation + i64::from(spec_changed);
    new.status = old.status.clone();
    Ok(Prepared { object: new, expected_revision: Some(expected) })
}

/// Prepares a status update: only `status` changes, everything else is `old`.
pub fn prepare_status_update<S: Resource>(old: &Object<S>, new: Object<S>) -> Result<Prepared<S>, ValidationErrors> {
    check_same_identity(old, &new)?;
    let expected = required_revision(&new)?;
    let mut object = old.clone();
    object.status = new.status;
    Ok(Prepared { object, expected_revision: Some(expected) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::{Node, NodeRole, NodeSpec, NodeStatus};

    fn now() -> Timestamp {
        Timestamp::parse("2026-11-29T10:00:00Z").unwrap()
    }

    fn stored() -> Node {
        let mut node = Node::new("n1", NodeSpec::default());
        node.status = NodeStatus { ready: true, ..Default::default() };
        let mut node = prepare_create(node, "uid-1".into(), now(), true).unwrap().object;
        node.metadata.resource_version = Some("7".into());
        node
    }

    #[test]
    fn create_fills_server_fields_and_drops_client_status() {
        let mut node = Node::new("n1", NodeSpec::default());
        node.status.ready = true;
        let prepared = prepare_create(node, "uid-1".into(), now(), false).unwrap();
        assert_eq!(prepared.object.metadata.uid.as_deref(), Some("uid-1"));
        assert_eq!(prepared.object.metadata.generation, 1);
        assert!(!prepared.object.status.ready);
        assert_eq!(prepared.expected_revision, None);
    }

    #[test]
    fn update_bumps_generation_only_on_spec_change_and_keeps_status() {
        let old = stored();
        let mut new = old.clone();
        new.status.ready = false;
        new.metadata.labels.insert("zone".into(), "a".into());
        let same_spec = prepare_update(&old, new.clone()).unwrap();
        assert_eq!(same_spec.object.metadata.generation, 1);
        assert!(same_spec.object.status.ready, "status comes from the stored object");
        assert_eq!(same_spec.expected_revision, Some(7));

        new.spec.role = NodeRole::Drained;
        assert_eq!(prepare_update(&old, new).unwrap().object.metadata.generation, 2);
    }

    #[test]
    fn update_requires_resource_version() {
        let old = stored();
        let mut new = old.clone();
        new.metadata.resource_version = None;
        assert_eq!(prepare_update(&old, new).unwrap_err().errors[0].field, "metadata.resourceVersion");
    }

    #[test]
    fn status_update_changes_only_status() {
        let old = stored();
        let mut new = old.clone();
        new.spec.role = NodeRole::Offline;
        new.status.ready = false;
        let prepared = prepare_status_update(&old, new).unwrap();
        assert_eq!(prepared.object.spec.role, NodeRole::Regular);
        assert!(!prepared.object.status.ready);
    }
}
