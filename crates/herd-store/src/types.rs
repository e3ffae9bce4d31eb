//! The store's data: key/value records, events, transactions.

use crate::error::StoreError;

/// A position in the store's one total order of writes. 0 is "nothing
/// written yet"; the first write gets 1.
pub type Revision = u64;

/// A stored key with its value and the revisions that created and last
/// modified it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: Revision,
    pub mod_revision: Revision,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change. For a delete, `value` is the value the key had before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub revision: Revision,
    pub kind: EventKind,
    pub key: String,
    /// Shared, not copied, by the watchers an event is fanned out to.
    pub value: bytes::Bytes,
    pub create_revision: Revision,
}

impl Event {
    /// True when this put created the key (rather than modifying it).
    pub fn is_create(&self) -> bool {
        self.kind == EventKind::Put && self.create_revision == self.revision
    }
}

/// A condition a transaction checks before it applies its operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compare {
    /// The key's mod revision equals this; 0 means the key must be absent.
    ModRevision { key: String, revision: Revision },
    /// The key exists, whatever its revision.
    Exists { key: String },
}

impl Compare {
    pub fn key(&self) -> &str {
        match self {
            Compare::ModRevision { key, .. } | Compare::Exists { key } => key,
        }
    }

    /// Whether the compare holds when the key's current mod revision is `actual`.
    pub fn holds(&self, actual: Option<Revision>) -> bool {
        match self {
            Compare::ModRevision { revision: 0, .. } => actual.is_none(),
            Compare::ModRevision { revision, .. } => actual == Some(*revision),
            Compare::Exists { .. } => actual.is_some(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Put {
        key: String,
        value: Vec<u8>,
    },
    /// Deleting an absent key does nothing and uses no revision.
    Delete {
        key: String,
    },
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::Put { key, .. } | Op::Delete { key } => key,
        }
    }
}

/// All compares hold, then all operations apply, atomically; or nothing does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub ops: Vec<Op>,
}

impl Txn {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn when(mut self, compare: Compare) -> Self {
        self.compares.push(compare);
        self
    }
    pub fn put(mut self, key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.ops.push(Op::Put { key: key.into(), value: value.into() });
        self
    }
    pub fn delete(mut self, key: impl Into<String>) -> Self {
        self.ops.push(Op::Delete { key: key.into() });
        self
    }

    pub(crate) fn check_keys(&self) -> Result<(), StoreError> {
        self.compares.iter().map(Compare::key).chain(self.ops.iter().map(Op::key)).try_for_each(check_key)
    }
}

/// What became of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOutcome {
    /// Applied. `revision` is the revision of its last operation (the store
    /// head when it had nothing to apply).
    Committed { revision: Revision },
    /// The compare at `index` did not hold; nothing was applied.
    CompareFailed { index: usize, key: String, actual: Option<Revision> },
}

/// Keys are 1 to 1024 printable ASCII characters without spaces. Keeping
/// them ASCII makes byte order, SQLite's order and PostgreSQL's `C`
/// collation agree, so prefix ranges mean the same on every backend.
pub fn check_key(key: &str) -> Result<(), StoreError> {
    let ok = !key.is_empty() && key.len() <= 1024 && key.bytes().all(|b| (0x21..0x7f).contains(&b));
    if ok { Ok(()) } else { Err(StoreError::InvalidKey(key.chars().take(80).collect())) }
}

/// The smallest string greater than every key with this prefix.
pub(crate) fn prefix_end(prefix: &str) -> String {
    format!("{prefix}\u{7f}")
}
