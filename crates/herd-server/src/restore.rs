//! Starting a master from a master candidate's configuration copy (`herd
//! cluster master-failover` in SQLite mode, where the old master's store
//! went with its host): a new, empty store is seeded with every object of
//! the copy and its secrets (the node tokens' hashes and the sealed CA, so
//! that agents and their certificates stay valid), and with a released
//! leader lease whose next holder leads at the failover's term. What is
//! observed (nodes' readiness, members running, journals) comes back from
//! the agents' heartbeats, as after any restart.

use herd_core::configuration::Configuration;
use herd_core::kinds::{Lease, LeaseSpec};
use herd_store::{ListOptions, Op, Store, Txn, TxnOutcome};
use serde_json::Value;

use crate::controllers::configuration::DOCUMENT_KEY;
use crate::objects::{Objects, object_key};

/// A configuration to start from, and the term to lead at.
#[derive(Clone, Debug)]
pub struct Restore {
    pub configuration: Configuration,
    pub term: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("the store already holds objects ({0} among them): a failover starts from a new, empty store")]
    NotEmpty(String),
    #[error("the configuration copy holds {0}, which is not a kind the configuration keeps")]
    UnknownKind(String),
    #[error("the configuration copy holds an object without a name")]
    Unnamed,
    #[error("the term must be at least 1")]
    NoTerm,
    #[error("{0}")]
    Store(#[from] herd_store::StoreError),
    #[error("{0}")]
    Objects(#[from] crate::objects::ObjectsError),
}

fn plural_of(kind: &str) -> Option<&'static str> {
    herd_core::kinds::by_kind(kind).filter(|d| d.replicated).map(|d| d.plural)
}

/// Seeds the empty `store` from `restore`, in one transaction.
pub async fn seed(store: &Store, restore: &Restore) -> Result<(), RestoreError> {
    if restore.term == 0 {
        return Err(RestoreError::NoTerm);
    }
    let present = store.list("/registry/", &ListOptions { limit: 1, start_after: None }, |_| true).await?;
    if let Some(kv) = present.items.first() {
        return Err(RestoreError::NotEmpty(kv.key.clone()));
    }
    let mut ops = Vec::new();
    for object in &restore.configuration.objects {
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
        let plural = plural_of(kind).ok_or_else(|| RestoreError::UnknownKind(kind.to_string()))?;
        let name = object.pointer("/metadata/name").and_then(Value::as_str).ok_or(RestoreError::Unnamed)?;
        let value = serde_json::to_vec(object).map_err(|e| RestoreError::UnknownKind(e.to_string()))?;
        ops.push(Op::Put { key: object_key(plural, name), value });
    }
    for (key, value) in &restore.configuration.secrets {
        ops.push(Op::Put { key: key.clone(), value: value.clone().into_bytes() });
    }
    let document = serde_json::to_vec(&restore.configuration).map_err(|e| RestoreError::UnknownKind(e.to_string()))?;
    ops.push(Op::Put { key: DOCUMENT_KEY.into(), value: document });
    if let TxnOutcome::CompareFailed { key, .. } = store.txn(Txn { ops, ..Txn::new() }).await? {
        return Err(RestoreError::NotEmpty(key));
    }
    tracing::info!(
        serial = restore.configuration.serial,
        objects = restore.configuration.objects.len(),
        "seeded the store from a configuration copy"
    );
    Ok(())
}

/// Leaves the leader lease `lock_name` released at `term - 1` transitions,
/// so that the first replica to take it leads at `term`.
pub async fn seed_lease(objects: &Objects, restore: &Restore, lock_name: &str) -> Result<(), RestoreError> {
    let lease = Lease::new(
        lock_name,
        LeaseSpec { lease_duration_seconds: 1, lease_transitions: restore.term - 1, ..LeaseSpec::default() },
    );
    objects.create(lease, false, false).await?;
    tracing::info!(term = restore.term, "the next leader leads at the failover's term");
    Ok(())
}
