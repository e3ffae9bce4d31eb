//! [`Objects`]: reading and writing herd objects in the store, with the
//! server's lifecycle rules applied. No HTTP here: the API handlers, the
//! controllers and the join/heartbeat logic all go through this.

use std::sync::Arc;
use std::time::SystemTime;

use herd_core::api::{ListMeta, ObjectList};
use herd_core::backoff::Contention;
use herd_core::labels::{LabelSelector, Labels};
use herd_core::lifecycle::{self, Prepared};
use herd_core::{API_VERSION, Object, Resource, Timestamp};
use herd_store::{Compare, KeyValue, ListOptions, Op, Revision, Store, StoreError, Txn, TxnOutcome};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use herd_core::ValidationErrors;

use crate::metrics::Metrics;

/// Why reading or writing objects failed. `error.rs` turns it into an
/// HTTP status; controllers match on it without knowing HTTP.
#[derive(Debug, thiserror::Error)]
pub enum ObjectsError {
    #[error("{kind} {name:?} not found")]
    NotFound { kind: String, name: String },
    #[error("{kind} {name:?} already exists")]
    AlreadyExists { kind: String, name: String },
    /// The object is not at the revision the write was based on.
    #[error(
        "{kind} {name:?} was modified: you sent resourceVersion {expected}, it is now {}; read it again and retry",
        actual.map_or("deleted".to_string(), |r| r.to_string())
    )]
    Conflict { kind: String, name: String, expected: Revision, actual: Option<Revision> },
    /// What the write was checked against (its guard) changed meanwhile.
    #[error("what {kind} {name:?} was checked against changed meanwhile; try again")]
    GuardMoved { kind: String, name: String },
    /// A leader-only write from a replica whose leadership has ended.
    #[error("this replica's leadership (term {term}) has ended; the write to {kind} {name:?} was refused")]
    Fenced { term: u64, kind: String, name: String },
    #[error("{kind} {name:?} is invalid: {errors}")]
    Invalid { kind: String, name: String, errors: ValidationErrors },
    /// Something the write would take is held by another object (the
    /// message names it and says what to do).
    #[error("{0}")]
    Held(String),
    /// Something the caller asked for that this kind or list cannot do.
    #[error("{0}")]
    BadRequest(String),
    /// A stored record that does not parse: reported, never unwrapped.
    #[error("stored object at {key} does not parse: {reason}")]
    Corrupt { key: String, reason: String },
    #[error("{0}")]
    Store(#[from] StoreError),
}

impl ObjectsError {
    pub fn not_found(kind: &str, name: &str) -> Self {
        ObjectsError::NotFound { kind: kind.into(), name: name.into() }
    }

    pub(crate) fn invalid(kind: &str, name: &str, errors: ValidationErrors) -> Self {
        ObjectsError::Invalid { kind: kind.into(), name: name.into(), errors }
    }

    /// A store error met while working on object `name` of `kind`.
    fn from_store(kind: &str, name: &str, error: StoreError) -> Self {
        let (kind, name) = (kind.to_string(), name.to_string());
        match error {
            StoreError::AlreadyExists(_) => ObjectsError::AlreadyExists { kind, name },
            StoreError::NotFound(_) => ObjectsError::NotFound { kind, name },
            StoreError::Conflict { expected, actual, .. } => ObjectsError::Conflict { kind, name, expected, actual },
            other => ObjectsError::Store(other),
        }
    }
}

/// After a read-modify-write lost its race to another writer: waits as
/// `contention` says, and whether to try again (false once its patience
/// is spent: the caller reports the conflict).
pub async fn try_again(contention: &mut Contention) -> bool {
    match contention.lost(std::time::Instant::now()) {
        Some(pause) => {
            tokio::time::sleep(pause).await;
            true
        }
        None => false,
    }
}

pub fn collection_prefix(plural: &str) -> String {
    format!("/registry/{plural}/")
}

/// `new`'s spec or status prepared to be written over `old`.
fn prepare_over<S: Resource>(old: &Object<S>, new: Object<S>, part: Part) -> Result<Prepared<S>, ObjectsError> {
    let name = new.metadata.name.clone();
    match part {
        Part::Spec => lifecycle::prepare_update(old, new),
        Part::Status if !S::HAS_STATUS => return Err(no_status::<S>()),
        Part::Status => lifecycle::prepare_status_update(old, new),
    }
    .map_err(|e| ObjectsError::invalid(S::KIND, &name, e))
}

fn no_status<S: Resource>() -> ObjectsError {
    ObjectsError::BadRequest(format!("{} has no status subresource", S::KIND))
}

pub fn object_key(plural: &str, name: &str) -> String {
    format!("/registry/{plural}/{name}")
}

/// The time object timestamps carry: the store's clock where it has one
/// of its own (`store_clock`), else this host's.
pub fn now() -> Timestamp {
    Timestamp::from_system_time(crate::store_clock::on_store_clock(wall_clock()))
}

#[cfg(not(test))]
fn wall_clock() -> SystemTime {
    SystemTime::now()
}

/// In the crate's tests the wall clock follows tokio's, so that a test on
/// a paused clock (`start_paused`) stamps objects with its own time: the
/// machine's, moved by how far tokio's clock is from the machine's
/// monotonic one (nothing, unless paused).
#[cfg(test)]
fn wall_clock() -> SystemTime {
    let (paused, machine) = (tokio::time::Instant::now().into_std(), std::time::Instant::now());
    match paused.checked_duration_since(machine) {
        Some(ahead) => SystemTime::now() + ahead,
        None => SystemTime::now() - machine.duration_since(paused),
    }
}

/// Which part of an object a modification writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Spec,
    Status,
}

/// A key that stands for what a write was checked against: the write
/// compares it with the revision read before the check, and moves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guard {
    pub key: String,
    /// As read before the check (None: absent).
    pub revision: Option<Revision>,
    /// What the key holds after the write.
    pub value: Vec<u8>,
}

/// One object's change, checked and encoded, waiting to be written with
/// others in one transaction (`Objects::commit_staged`).
pub struct Staged {
    kind: &'static str,
    name: String,
    key: String,
    /// The revision it was read at: the write needs it still there.
    expected: Revision,
    /// What is written (None: nothing, only checked unchanged).
    value: Option<Vec<u8>>,
}

impl Staged {
    /// `new` as a change of `old` (its spec and metadata, or its status),
    /// checked as a write of that part would be.
    pub fn of<S: Resource>(old: &Object<S>, new: Object<S>, part: Part) -> Result<Staged, ObjectsError> {
        let name = new.metadata.name.clone();
        let prepared = match part {
            Part::Spec => lifecycle::prepare_update(old, new),
            Part::Status => lifecycle::prepare_status_update(old, new),
        }
        .map_err(|e| ObjectsError::invalid(S::KIND, &name, e))?;
        Ok(Staged {
            kind: S::KIND,
            key: object_key(S::PLURAL, &name),
            expected: prepared.expected_revision.unwrap_or(0),
            value: Some(encode(&prepared.object)),
            name,
        })
    }

    /// No change of `object`, only a check that it is still at the
    /// revision it was read at: a decision written with the others rested
    /// on it.
    pub fn unchanged<S: Resource>(object: &Object<S>) -> Staged {
        let name = object.metadata.name.clone();
        Staged {
            kind: S::KIND,
            key: object_key(S::PLURAL, &name),
            expected: object.metadata.resource_version.as_deref().and_then(|r| r.parse().ok()).unwrap_or(0),
            value: None,
            name,
        }
    }
}

/// A leader's fence. Leader-only code writes through [`Objects::fenced`]:
/// every write then also requires the fence key to be still at the
/// revision this leader's acquisition gave it, in the same transaction. A
/// newer leader's acquisition moves the key, so a deposed leader's writes
/// fail (`ObjectsError::Fenced`) and never land.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub key: String,
    pub revision: Revision,
    /// The leadership term (lease transitions), for messages.
    pub term: u64,
}

#[derive(Clone)]
pub struct Objects {
    store: Store,
    /// The fence, and the metrics that count the writes it refuses.
    fence: Option<(Fence, Arc<Metrics>)>,
}

/// Parses a stored object; a record that does not parse is reported, never
/// unwrapped.
pub fn decode<S: Resource>(kv: &KeyValue) -> Result<Object<S>, ObjectsError> {
    decode_bytes(&kv.key, &kv.value, kv.mod_revision)
}

/// [`decode`] of a value as a watch event carries it.
pub fn decode_bytes<S: Resource>(key: &str, value: &[u8], revision: Revision) -> Result<Object<S>, ObjectsError> {
    let mut object: Object<S> = serde_json::from_slice(value)
        .map_err(|e| ObjectsError::Corrupt { key: key.to_string(), reason: format!("not a {}: {e}", S::KIND) })?;
    object.metadata.resource_version = Some(revision.to_string());
    Ok(object)
}

/// Parses a stored object of any kind as JSON, with its resourceVersion.
pub fn decode_value(value: &[u8], key: &str, revision: Revision) -> Result<Value, ObjectsError> {
    let mut object: Value =
        serde_json::from_slice(value).map_err(|e| ObjectsError::Corrupt { key: key.into(), reason: e.to_string() })?;
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(revision.to_string()));
    }
    Ok(object)
}

/// A stored object as the API shows it (its resourceVersion set), as JSON
/// text: what [`decode_value`] gives, without building the value when the
/// object is laid out as [`encode`] writes it (the revision goes first in
/// its metadata); anything else takes the long way.
pub fn stored_json(value: &[u8], key: &str, revision: Revision) -> Result<Box<RawValue>, ObjectsError> {
    const METADATA: &[u8] = b"\"metadata\":{";
    let opening = value.windows(METADATA.len()).position(|w| w == METADATA).map(|at| at + METADATA.len());
    // Only where `encode` puts it: after the apiVersion and kind, whose
    // values hold no brace, so the first match is the object's own.
    let laid_out = opening.filter(|&at| {
        value.starts_with(b"{\"apiVersion\":")
            && !value[1..at - 1].contains(&b'{')
            && !value[at..].starts_with(b"\"resourceVersion\"")
            && value.get(at) == Some(&b'"')
    });
    if let Some(at) = laid_out {
        let mut text = Vec::with_capacity(value.len() + 32);
        text.extend_from_slice(&value[..at]);
        text.extend_from_slice(format!("\"resourceVersion\":\"{revision}\",").as_bytes());
        text.extend_from_slice(&value[at..]);
        if let Some(raw) = String::from_utf8(text).ok().and_then(|text| RawValue::from_string(text).ok()) {
            return Ok(raw);
        }
    }
    let object = decode_value(value, key, revision)?;
    serde_json::value::to_raw_value(&object)
        .map_err(|e| ObjectsError::Corrupt { key: key.into(), reason: e.to_string() })
}

/// The resourceVersion is the store's mod revision: it is not stored.
pub(crate) fn encode<S: Resource>(object: &Object<S>) -> Vec<u8> {
    let mut stored = object.clone();
    stored.metadata.resource_version = None;
    serde_json::to_vec(&stored).expect("herd objects always serialise to JSON")
}

/// The labels of a stored object, read without parsing the rest of it.
pub fn stored_labels(value: &[u8]) -> Labels {
    #[derive(Deserialize)]
    struct Envelope {
        #[serde(default)]
        metadata: Meta,
    }
    #[derive(Deserialize, Default)]
    struct Meta {
        #[serde(default)]
        labels: Labels,
    }
    serde_json::from_slice::<Envelope>(value).map(|e| e.metadata.labels).unwrap_or_default()
}

impl Objects {
    pub fn new(store: Store) -> Self {
        Objects { store, fence: None }
    }

    /// The same objects, every write fenced by `fence`; refusals are
    /// logged and counted in `metrics`.
    pub fn fenced(&self, fence: Fence, metrics: Arc<Metrics>) -> Self {
        Objects { store: self.store.clone(), fence: Some((fence, metrics)) }
    }

    /// Applies `ops` and then `last` in one transaction, if `key` is at
    /// `expected` (None: absent) and the fence, if any, has not moved.
    /// Returns the revision of `last`.
    async fn commit(
        &self,
        (kind, name): (&str, &str),
        key: &str,
        expected: Option<Revision>,
        (guard, ops): (Option<&Guard>, Vec<Op>),
        last: Op,
    ) -> Result<Revision, ObjectsError> {
        let mut txn = Txn::new().when(Compare::ModRevision { key: key.into(), revision: expected.unwrap_or(0) });
        if let Some(guard) = guard {
            txn = txn.when(Compare::ModRevision { key: guard.key.clone(), revision: guard.revision.unwrap_or(0) });
        }
        if let Some((fence, _)) = &self.fence {
            txn = txn.when(Compare::ModRevision { key: fence.key.clone(), revision: fence.revision });
        }
        txn.ops =
            guard.map(|g| Op::Put { key: g.key.clone(), value: g.value.clone() }).into_iter().chain(ops).collect();
        txn.ops.push(last);
        let (failed, actual) = match self.store.txn(txn).await.map_err(|e| ObjectsError::from_store(kind, name, e))? {
            TxnOutcome::Committed { revision } => return Ok(revision),
            TxnOutcome::CompareFailed { key: failed, actual, .. } => (failed, actual),
        };
        let (kind, name) = (kind.to_string(), name.to_string());
        if failed == key {
            return Err(match (expected, actual) {
                (None, _) => ObjectsError::AlreadyExists { kind, name },
                (Some(_), None) => ObjectsError::NotFound { kind, name },
                (Some(expected), actual) => ObjectsError::Conflict { kind, name, expected, actual },
            });
        }
        if guard.is_some_and(|g| g.key == failed) {
            return Err(ObjectsError::GuardMoved { kind, name });
        }
        let term = self.fence.as_ref().map_or(0, |(fence, metrics)| {
            metrics.fenced_writes.inc();
            fence.term
        });
        tracing::warn!(term, kind, name, "refused a leader-only write: this replica's leadership has ended");
        Err(ObjectsError::Fenced { term, kind, name })
    }

    /// Writes a bare key, not an object, under the same rules: it must be
    /// at `expected` (None: absent), and the fence must hold.
    pub async fn put_key(
        &self,
        key: &str,
        expected: Option<Revision>,
        value: Vec<u8>,
    ) -> Result<Revision, ObjectsError> {
        let put = Op::Put { key: key.into(), value };
        self.commit(("key", key), key, expected, (None, Vec::new()), put).await
    }

    /// Deletes a bare key if it is still at `expected`.
    pub async fn delete_key(&self, key: &str, expected: Revision) -> Result<Revision, ObjectsError> {
        let delete = Op::Delete { key: key.into() };
        self.commit(("key", key), key, Some(expected), (None, Vec::new()), delete).await
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub async fn get<S: Resource>(&self, name: &str) -> Result<Option<Object<S>>, ObjectsError> {
        let kv = self
            .store
            .get(&object_key(S::PLURAL, name))
            .await
            .map_err(|e| ObjectsError::from_store(S::KIND, name, e))?;
        kv.as_ref().map(decode::<S>).transpose()
    }

    pub async fn require<S: Resource>(&self, name: &str) -> Result<Object<S>, ObjectsError> {
        self.get::<S>(name).await?.ok_or_else(|| ObjectsError::not_found(S::KIND, name))
    }

    /// Every object of a kind, and the revision they were read at.
    pub async fn list<S: Resource>(&self) -> Result<(Vec<Object<S>>, Revision), ObjectsError> {
        self.list_where(|_| true).await
    }

    /// The objects of a kind whose stored bytes `keep` accepts (a cheap
    /// look before the decoding).
    pub async fn list_where<S: Resource>(
        &self,
        keep: impl Fn(&[u8]) -> bool,
    ) -> Result<(Vec<Object<S>>, Revision), ObjectsError> {
        let page = self
            .store
            .list(&collection_prefix(S::PLURAL), &ListOptions::default(), |kv| keep(&kv.value))
            .await
            .map_err(|e| ObjectsError::from_store(S::KIND, "", e))?;
        let objects = page.items.iter().map(decode::<S>).collect::<Result<_, _>>()?;
        Ok((objects, page.revision))
    }

    async fn write<S: Resource>(
        &self,
        prepared: Prepared<S>,
        dry_run: bool,
        (guard, ops): (Option<&Guard>, Vec<Op>),
    ) -> Result<Object<S>, ObjectsError> {
        let mut object = prepared.object;
        let name = object.metadata.name.clone();
        let key = object_key(S::PLURAL, &name);
        let revision = if dry_run {
            self.check_dry_run::<S>(&key, &name, prepared.expected_revision)
                .await?
                .map_err(|e| ObjectsError::from_store(S::KIND, &name, e))?
        } else {
            let put = Op::Put { key: key.clone(), value: encode(&object) };
            self.commit((S::KIND, &name), &key, prepared.expected_revision, (guard, ops), put).await?
        };
        if dry_run && prepared.expected_revision.is_none() {
            // A dry-run create shows what would be stored, but no identity:
            // the object never existed.
            object.metadata.uid = None;
            object.metadata.creation_timestamp = None;
            object.metadata.resource_version = None;
            return Ok(object);
        }
        object.metadata.resource_version = Some(revision.to_string());
        Ok(object)
    }

    /// What the write would meet, without writing: the same 404/409 as a
    /// real write, and the current revision as the would-be result.
    async fn check_dry_run<S: Resource>(
        &self,
        key: &str,
        name: &str,
        expected: Option<Revision>,
    ) -> Result<Result<Revision, StoreError>, ObjectsError> {
        let current = self.store.get(key).await.map_err(|e| ObjectsError::from_store(S::KIND, name, e))?;
        Ok(match (expected, current) {
            (None, Some(_)) => Err(StoreError::AlreadyExists(key.into())),
            (None, None) => Ok(self.store.head()),
            (Some(_), None) => Err(StoreError::NotFound(key.into())),
            (Some(expected), Some(kv)) if kv.mod_revision != expected => {
                Err(StoreError::Conflict { key: key.into(), expected, actual: Some(kv.mod_revision) })
            }
            (Some(_), Some(kv)) => Ok(kv.mod_revision),
        })
    }

    /// Creates an object. `keep_status` is for the server's own objects;
    /// a client's status is dropped (it belongs to the status subresource).
    pub async fn create<S: Resource>(
        &self,
        object: Object<S>,
        keep_status: bool,
        dry_run: bool,
    ) -> Result<Object<S>, ObjectsError> {
        let name = object.metadata.name.clone();
        let uid = uuid::Uuid::now_v7().to_string();
        let prepared = lifecycle::prepare_create(object, uid, now(), keep_status)
            .map_err(|e| ObjectsError::invalid(S::KIND, &name, e))?;
        self.write(prepared, dry_run, (None, Vec::new())).await
    }

    /// Creates an object only if `guard` is still as it was read (and
    /// moves the guard, in the same transaction): what the caller checked
    /// before, keyed by the guard, has not changed meanwhile. A moved
    /// guard is a 409 to retry.
    pub async fn create_guarded<S: Resource>(
        &self,
        object: Object<S>,
        guard: &Guard,
        keep_status: bool,
    ) -> Result<Object<S>, ObjectsError> {
        let name = object.metadata.name.clone();
        let prepared = lifecycle::prepare_create(object, uuid::Uuid::now_v7().to_string(), now(), keep_status)
            .map_err(|e| ObjectsError::invalid(S::KIND, &name, e))?;
        self.write(prepared, false, (Some(guard), Vec::new())).await
    }

    /// Creates `object`, or replaces its metadata and spec (`old`, as read,
    /// is what it replaces), with what `companions` makes of the object as
    /// it will be stored (its new generation) written in the same
    /// transaction, before it.
    pub async fn write_with_companions<S: Resource>(
        &self,
        object: Object<S>,
        old: Option<&Object<S>>,
        dry_run: bool,
        companions: impl FnOnce(&Object<S>) -> Result<Vec<Op>, ObjectsError>,
    ) -> Result<Object<S>, ObjectsError> {
        let name = object.metadata.name.clone();
        let prepared = match old {
            None => lifecycle::prepare_create(object, uuid::Uuid::now_v7().to_string(), now(), false)
                .map_err(|e| ObjectsError::invalid(S::KIND, &name, e))?,
            Some(old) => prepare_over(old, object, Part::Spec)?,
        };
        let ops = companions(&prepared.object)?;
        self.write(prepared, dry_run, (None, ops)).await
    }

    /// Replaces metadata and spec (the status is kept).
    pub async fn update<S: Resource>(&self, object: Object<S>, dry_run: bool) -> Result<Object<S>, ObjectsError> {
        self.write_part(object, Part::Spec, dry_run).await
    }

    /// Creates `object` (no resourceVersion) or updates it, with `ops`
    /// applied first in the same transaction. The object's revision is the
    /// transaction's last; `ops` take the ones just before it, in order.
    pub async fn write_with<S: Resource>(&self, object: Object<S>, ops: Vec<Op>) -> Result<Object<S>, ObjectsError> {
        let name = object.metadata.name.clone();
        let prepared = if object.metadata.resource_version.is_none() {
            lifecycle::prepare_create(object, uuid::Uuid::now_v7().to_string(), now(), false)
        } else {
            let old = self.require::<S>(&name).await?;
            lifecycle::prepare_update(&old, object)
        }
        .map_err(|e| ObjectsError::invalid(S::KIND, &name, e))?;
        self.write(prepared, false, (None, ops)).await
    }

    /// Replaces the metadata and spec of several objects of one kind in one
    /// transaction, each as read (its resourceVersion) and changed: all
    /// are written, or none (a Conflict naming the first that moved).
    pub async fn update_together<S: Resource>(&self, changed: Vec<(Object<S>, Object<S>)>) -> Result<(), ObjectsError> {
        let staged =
            changed.into_iter().map(|(old, new)| Staged::of(&old, new, Part::Spec)).collect::<Result<_, _>>()?;
        self.commit_staged(staged).await
    }

    /// Writes staged changes of objects of any kinds in one transaction,
    /// each only if it is still at the revision it was read at (and with
    /// them every object staged unchanged): all are written, or none (a
    /// Conflict naming the first that moved).
    pub async fn commit_staged(&self, staged: Vec<Staged>) -> Result<(), ObjectsError> {
        let mut txn = Txn::new();
        for change in &staged {
            txn = txn.when(Compare::ModRevision { key: change.key.clone(), revision: change.expected });
            if let Some(value) = &change.value {
                txn = txn.put(change.key.clone(), value.clone());
            }
        }
        if let Some((fence, _)) = &self.fence {
            txn = txn.when(Compare::ModRevision { key: fence.key.clone(), revision: fence.revision });
        }
        match self.store.txn(txn).await.map_err(|e| ObjectsError::from_store("object", "", e))? {
            TxnOutcome::Committed { .. } => Ok(()),
            TxnOutcome::CompareFailed { key: failed, actual, .. } => match staged.into_iter().find(|s| s.key == failed)
            {
                Some(change) => Err(ObjectsError::Conflict {
                    kind: change.kind.into(),
                    name: change.name,
                    expected: change.expected,
                    actual,
                }),
                None => {
                    let term = self.fence.as_ref().map_or(0, |(fence, metrics)| {
                        metrics.fenced_writes.inc();
                        fence.term
                    });
                    Err(ObjectsError::Fenced { term, kind: String::new(), name: String::new() })
                }
            },
        }
    }

    /// Replaces the status (everything else is kept).
    pub async fn update_status<S: Resource>(
        &self,
        object: Object<S>,
        dry_run: bool,
    ) -> Result<Object<S>, ObjectsError> {
        self.write_part(object, Part::Status, dry_run).await
    }

    /// Replaces metadata and spec, or the status.
    pub async fn write_part<S: Resource>(
        &self,
        object: Object<S>,
        part: Part,
        dry_run: bool,
    ) -> Result<Object<S>, ObjectsError> {
        if matches!(part, Part::Status) && !S::HAS_STATUS {
            // Said before looking the object up: no such write exists.
            return Err(no_status::<S>());
        }
        let old = self.require::<S>(&object.metadata.name).await?;
        self.write(prepare_over(&old, object, part)?, dry_run, (None, Vec::new())).await
    }

    /// Read-modify-write with retries on conflict. `change` edits the object
    /// and says whether there is anything to write; returns the object as
    /// stored afterwards.
    /// `change` may fail with the caller's own error type.
    pub async fn modify<S: Resource, E: From<ObjectsError>>(
        &self,
        name: &str,
        part: Part,
        change: impl FnMut(&mut Object<S>) -> Result<bool, E>,
    ) -> Result<Object<S>, E> {
        let read = self.require::<S>(name).await?;
        self.modify_from(read, part, change).await
    }

    /// [`Objects::modify`] starting from `read`, the object as the caller
    /// read it (a later attempt reads it again): a caller that has just
    /// read it saves a read.
    pub async fn modify_from<S: Resource, E: From<ObjectsError>>(
        &self,
        mut read: Object<S>,
        part: Part,
        mut change: impl FnMut(&mut Object<S>) -> Result<bool, E>,
    ) -> Result<Object<S>, E> {
        let name = read.metadata.name.clone();
        let mut contention = Contention::new(std::time::Instant::now());
        loop {
            let mut object = read.clone();
            if !change(&mut object)? {
                return Ok(object);
            }
            match self.write_over(&read, object, part, Vec::new()).await {
                Err(conflict @ ObjectsError::Conflict { .. }) => {
                    if !try_again(&mut contention).await {
                        return Err(E::from(conflict));
                    }
                }
                other => return other.map_err(E::from),
            }
            read = self.require::<S>(&name).await?;
        }
    }

    /// Writes `new`'s spec or status over `old`, the object as read at
    /// `new`'s resourceVersion: what [`Objects::write_part`] does without
    /// reading the object again (a copy that moved meanwhile is a Conflict
    /// either way). `ops` go in the same transaction (keys the new status
    /// makes done with), or not at all.
    pub async fn write_over<S: Resource>(
        &self,
        old: &Object<S>,
        new: Object<S>,
        part: Part,
        ops: Vec<Op>,
    ) -> Result<Object<S>, ObjectsError> {
        self.write(prepare_over(old, new, part)?, false, (None, ops)).await
    }

    /// Deletes `object` if it is still at its resourceVersion, without
    /// reading it first; one that moved meanwhile is deleted as it is now.
    /// Whether it was there to delete.
    pub async fn delete_as_read<S: Resource>(&self, object: &Object<S>) -> Result<bool, ObjectsError> {
        let name = &object.metadata.name;
        let Some(revision) = object.metadata.resource_version.as_deref().and_then(|r| r.parse().ok()) else {
            return self.delete_if_present::<S>(name).await;
        };
        let key = object_key(S::PLURAL, name);
        let delete = Op::Delete { key: key.clone() };
        match self.commit((S::KIND, name), &key, Some(revision), (None, Vec::new()), delete).await {
            Ok(_) => Ok(true),
            Err(ObjectsError::NotFound { .. }) => Ok(false),
            Err(ObjectsError::Conflict { .. }) => self.delete_if_present::<S>(name).await,
            Err(error) => Err(error),
        }
    }

    pub async fn get_value(&self, kind: &str, plural: &str, name: &str) -> Result<Value, ObjectsError> {
        let kv = self
            .store
            .get(&object_key(plural, name))
            .await
            .map_err(|e| ObjectsError::from_store(kind, name, e))?
            .ok_or_else(|| ObjectsError::not_found(kind, name))?;
        decode_value(&kv.value, &kv.key, kv.mod_revision)
    }

    /// One page of objects of a kind matching `selector`, as the stored
    /// JSON with each resourceVersion spliced in (not decoded and encoded
    /// again: pollers list often).
    pub async fn list_values(
        &self,
        kind: &str,
        plural: &str,
        selector: &LabelSelector,
        limit: usize,
        continue_token: Option<String>,
    ) -> Result<ObjectList<Box<RawValue>>, ObjectsError> {
        let prefix = collection_prefix(plural);
        // A continue token is the key the last page ended at; any token is
        // taken (one from another list names a key outside this one's range
        // and resumes at its start or end), so its schema is any string.
        let options = ListOptions { limit, start_after: continue_token };
        let page = self
            .store
            .list(&prefix, &options, |kv| selector.is_empty() || selector.matches(&stored_labels(&kv.value)))
            .await
            .map_err(|e| ObjectsError::from_store(kind, "", e))?;
        let items =
            page.items.iter().map(|kv| stored_json(&kv.value, &kv.key, kv.mod_revision)).collect::<Result<_, _>>()?;
        Ok(ObjectList {
            api_version: API_VERSION.into(),
            kind: format!("{kind}List"),
            metadata: ListMeta { resource_version: page.revision.to_string(), continue_token: page.next_key },
            items,
        })
    }

    /// Deletes an object if it exists (deleting is repeatable); whether it did.
    pub async fn delete_if_present<S: Resource>(&self, name: &str) -> Result<bool, ObjectsError> {
        match self.delete_value(S::KIND, S::PLURAL, name, None, false).await {
            Ok(_) => Ok(true),
            Err(ObjectsError::NotFound { .. }) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Deletes an object, if its resourceVersion is `precondition` when one
    /// is given; returns its last state.
    pub async fn delete_value(
        &self,
        kind: &str,
        plural: &str,
        name: &str,
        precondition: Option<Revision>,
        dry_run: bool,
    ) -> Result<Value, ObjectsError> {
        self.delete_value_with(kind, plural, name, precondition, dry_run, Vec::new()).await
    }

    /// [`Objects::delete_value`], with `ops` committed in the same transaction.
    pub async fn delete_value_with(
        &self,
        kind: &str,
        plural: &str,
        name: &str,
        precondition: Option<Revision>,
        dry_run: bool,
        ops: Vec<Op>,
    ) -> Result<Value, ObjectsError> {
        let key = object_key(plural, name);
        let to_api = |e| ObjectsError::from_store(kind, name, e);
        let mut contention = Contention::new(std::time::Instant::now());
        loop {
            let current =
                self.store.get(&key).await.map_err(to_api)?.ok_or_else(|| ObjectsError::not_found(kind, name))?;
            let expected = precondition.unwrap_or(current.mod_revision);
            if expected != current.mod_revision {
                return Err(to_api(StoreError::Conflict { key, expected, actual: Some(current.mod_revision) }));
            }
            let last = decode_value(&current.value, &current.key, current.mod_revision)?;
            if dry_run {
                return Ok(last);
            }
            let delete = Op::Delete { key: key.clone() };
            match self.commit((kind, name), &key, Some(expected), (None, ops.clone()), delete).await {
                // Without a precondition, a write that landed meanwhile
                // does not stop the delete: read it again.
                Err(ObjectsError::Conflict { .. }) if precondition.is_none() && try_again(&mut contention).await => {}
                Err(error) => return Err(error),
                Ok(_) => return Ok(last),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herd_core::kinds::NodeSpec;

    #[test]
    fn stored_json_shows_what_decode_value_shows() {
        let mut node = Object::new("n1", NodeSpec::default());
        node.metadata.labels.insert("zone".into(), "a{b}".into());
        node.metadata.uid = Some("uid-1".into());
        let encoded = encode(&node);
        let shown = |value: &[u8]| serde_json::from_str::<Value>(stored_json(value, "/k", 42).unwrap().get()).unwrap();
        let decoded = decode_value(&encoded, "/k", 42).unwrap();
        assert_eq!(shown(&encoded), decoded);
        assert_eq!(decoded["metadata"]["resourceVersion"], "42");
        let text = stored_json(&encoded, "/k", 42).unwrap();
        assert!(text.get().contains(r#""metadata":{"resourceVersion":"42","#), "the short way: {}", text.get());
        // Laid out otherwise (metadata first): the long way, same answer.
        let reordered = serde_json::to_vec(&serde_json::json!({"metadata": {"name": "n1"}, "kind": "Node"})).unwrap();
        assert_eq!(shown(&reordered), decode_value(&reordered, "/k", 42).unwrap());
        assert!(stored_json(b"{\"apiVersion\":", "/k", 42).is_err(), "damaged bytes are an error, not a line");
    }

    #[tokio::test]
    async fn a_moved_fence_refuses_every_write_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("s.db").to_str().unwrap()).await.unwrap();
        let objects = Objects::new(store.clone());
        let fence_at = |revision| Fence { key: "/fence/test".into(), revision, term: 1 };
        let TxnOutcome::Committed { revision } = store.txn(Txn::new().put("/fence/test", b"1".to_vec())).await.unwrap()
        else {
            panic!("fence not written")
        };
        let metrics = Arc::new(Metrics::new(&store));
        let leader = objects.fenced(fence_at(revision), metrics.clone());
        let n1 = leader.create(Object::new("n1", NodeSpec::default()), false, false).await.unwrap();

        // Another replica acquires: the fence moves.
        store.txn(Txn::new().put("/fence/test", b"2".to_vec())).await.unwrap();
        fn fenced<T>(result: Result<T, ObjectsError>) -> bool {
            matches!(result, Err(ObjectsError::Fenced { .. }))
        }
        assert!(fenced(leader.create(Object::new("n2", NodeSpec::default()), false, false).await));
        let mut changed = n1.clone();
        changed.spec.unschedulable = true;
        assert!(fenced(leader.update(changed, false).await));
        assert!(fenced(
            leader
                .modify::<NodeSpec, ObjectsError>("n1", Part::Status, |n| Ok({
                    n.status.ready = true;
                    true
                }))
                .await
        ));
        assert!(fenced(leader.delete_value("Node", "nodes", "n1", None, false).await));
        assert!(fenced(leader.put_key("/probe", None, b"x".to_vec()).await));
        assert_eq!(metrics.fenced_writes.get(), 5, "each refusal is counted");

        assert!(objects.get::<NodeSpec>("n2").await.unwrap().is_none(), "the refused create stored nothing");
        let now = objects.require::<NodeSpec>("n1").await.unwrap();
        assert_eq!(now, n1, "the refused update, status write and delete changed nothing");
        // Unfenced writers (the API) are not affected.
        objects.create(Object::new("n3", NodeSpec::default()), false, false).await.unwrap();
    }
}
