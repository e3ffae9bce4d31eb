//! Bearer tokens: who is calling the API.
//!
//! Four kinds of token. The admin token may do everything. A join token
//! may only register a node (`POST /api/v1/join`), which hands the node its
//! own node token. Join tokens are the server's own (given or kept in its
//! data dir, never expiring) and those an admin creates with a lifetime
//! (`herd token create`, kept as hashes under `/secrets/jointokens/`). A
//! viewer token (`herd token create --viewer`, kept the same way) reads
//! everything but tokens: the dashboard's. A
//! node token (`herdnode.<node>.<secret>`) identifies that node; what it
//! may do is decided by `herd_core::authz`. Only blake3 hashes of tokens
//! are kept: node token hashes in the store, so every server replica knows
//! them. Agents do not use tokens with each other: they show certificates
//! and grants (`crate::peers`).

use std::collections::HashSet;
use std::sync::Mutex;

use axum::http::HeaderMap;
use bytes::Bytes;
use herd_core::authz::Principal;
use herd_core::join::{DeletedNode, JoinTokenRecord, TokenKind, token_hash, token_id};
use herd_core::{HumanDuration, Timestamp};
use herd_store::{ListOptions, Store, Txn};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;
use crate::objects::now;
use crate::reflector::RawCache;

const NODE_TOKEN_PREFIX: &str = "herdnode.";

const NODE_TOKENS_PREFIX: &str = "/secrets/nodetokens/";

const JOIN_TOKENS_PREFIX: &str = "/secrets/jointokens/";
const DELETED_NODES_PREFIX: &str = "/secrets/deletednodes/";

fn node_token_key(node: &str) -> String {
    format!("{NODE_TOKENS_PREFIX}{node}")
}

fn join_token_key(id: &str) -> String {
    format!("{JOIN_TOKENS_PREFIX}{id}")
}

pub fn deleted_node_key(node: &str) -> String {
    format!("{DELETED_NODES_PREFIX}{node}")
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::Internal(format!("{key} is damaged: {e}")))
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(value).map_err(|e| ApiError::Internal(e.to_string()))
}

#[derive(Serialize, Deserialize)]
struct StoredToken {
    hash: String,
    issued: herd_core::Timestamp,
    /// The id of the API-made join token the node joined with (None: the
    /// server's own): whether its agent could join again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    join_token: Option<String>,
}

/// A fresh random secret: two v4 UUIDs, 244 random bits.
pub fn generate_secret() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// The bearer token of a request, if any.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?.strip_prefix("Bearer ").map(str::trim)
}

pub struct Authenticator {
    store: Store,
    admin: blake3::Hash,
    join: blake3::Hash,
    /// The node token hashes, kept current by a store watch on every
    /// replica: a thousand nodes heartbeating every two seconds read no
    /// token, and a token revoked through any replica stops working here
    /// as soon as the watch brings the change.
    node_tokens: RawCache,
    /// Nodes whose token this replica revoked or replaced, until its copy
    /// shows the change: their tokens are read from the store meanwhile.
    changed_here: Mutex<HashSet<String>>,
}

fn hash(token: &str) -> blake3::Hash {
    blake3::hash(token.as_bytes())
}

impl Authenticator {
    /// Follows the node tokens until `stop` fires.
    pub fn new(store: Store, admin_token: &str, join_token: &str, stop: CancellationToken) -> Self {
        Authenticator {
            node_tokens: RawCache::start(store.clone(), NODE_TOKENS_PREFIX, stop),
            store,
            admin: hash(admin_token),
            join: hash(join_token),
            changed_here: Mutex::default(),
        }
    }

    /// Whether `hashed` is node `node`'s token: as the copy has it, or
    /// else as stored (a token issued a moment ago through another
    /// replica works at once), and only as stored while the copy may not
    /// show a change made here yet.
    async fn is_node_token(&self, node: &str, hashed: &blake3::Hash) -> Result<bool, ApiError> {
        let is_it = |stored: Option<&Bytes>| {
            stored
                .and_then(|stored| serde_json::from_slice::<StoredToken>(stored).ok())
                .and_then(|t| blake3::Hash::from_hex(t.hash).ok())
                .is_some_and(|h| h == *hashed)
        };
        let key = node_token_key(node);
        let cached = self.node_tokens.get(&key).await?;
        let changed_here = self.changed_here.lock().map_or(true, |nodes| nodes.contains(node));
        if !changed_here && is_it(cached.as_ref()) {
            return Ok(true);
        }
        let stored = self.store.get(&key).await?.map(|kv| Bytes::from(kv.value));
        if changed_here
            && stored == cached
            && let Ok(mut nodes) = self.changed_here.lock()
        {
            nodes.remove(node);
        }
        Ok(is_it(stored.as_ref()))
    }

    /// Notes that `node`'s token was revoked or replaced here (after the
    /// commit): it is refused at once, before the copy shows it.
    pub fn note_token_changed(&self, node: &str) {
        if let Ok(mut nodes) = self.changed_here.lock() {
            nodes.insert(node.to_string());
        }
    }

    /// Who presents this token; 401 if nobody.
    pub async fn principal(&self, token: Option<&str>) -> Result<Principal, ApiError> {
        let token = token
            .ok_or_else(|| ApiError::Unauthorized("no bearer token: send `Authorization: Bearer <token>`".into()))?;
        // blake3::Hash compares in constant time.
        if hash(token) == self.admin {
            return Ok(Principal::Admin);
        }
        if let Some((node, _)) = token.strip_prefix(NODE_TOKEN_PREFIX).and_then(|rest| rest.rsplit_once('.')) {
            if self.is_node_token(node, &hash(token)).await? {
                return Ok(Principal::Node(node.to_string()));
            }
            if let Some(deleted) = self.deleted_node(node).await? {
                return Err(ApiError::Unauthorized(format!(
                    "the bearer token is not valid: node {node} was deleted by an admin at {} and its token revoked",
                    deleted.deleted_at
                )));
            }
        }
        if let Some((TokenKind::Viewer, _)) = token_id(token) {
            self.api_token(token, TokenKind::Viewer).await?;
            return Ok(Principal::Viewer);
        }
        Err(ApiError::Unauthorized("the bearer token is not valid".into()))
    }

    /// Whether `token` is a join token usable now: the server's own (None),
    /// or one created through the API and not expired (its id).
    pub async fn check_join_token(&self, token: Option<&str>) -> Result<Option<String>, ApiError> {
        let token = token.ok_or_else(|| ApiError::Unauthorized("joining needs a join token as bearer token".into()))?;
        if hash(token) == self.join {
            return Ok(None);
        }
        self.api_token(token, TokenKind::Join).await.map(Some)
    }

    /// Whether an agent holding the API-made join token `id` may join now:
    /// why not, if it may not.
    pub async fn join_token_refusal(&self, id: &str) -> Result<Option<String>, ApiError> {
        let key = join_token_key(id);
        let Some(kv) = self.store.get(&key).await? else {
            return Ok(Some(format!("join token {id}, which its agent joined with, was deleted")));
        };
        Ok(decode::<JoinTokenRecord>(&key, &kv.value)?.usable_at(now()).err())
    }

    /// Whether `token` is a token of `kind` created through the API, known,
    /// and not expired.
    async fn api_token(&self, token: &str, kind: TokenKind) -> Result<String, ApiError> {
        let invalid = || ApiError::Unauthorized(format!("the {} token is not valid", kind.word()));
        let id = match token_id(token) {
            Some((found, id)) if found == kind => id,
            _ => return Err(invalid()),
        };
        let key = join_token_key(id);
        let record: JoinTokenRecord = match self.store.get(&key).await.map_err(ApiError::from)? {
            Some(kv) => decode(&key, &kv.value)?,
            None => return Err(invalid()),
        };
        if record.kind != kind || blake3::Hash::from_hex(&record.hash).ok() != Some(hash(token)) {
            return Err(invalid());
        }
        record.usable_at(now()).map_err(ApiError::Unauthorized)?;
        Ok(record.id)
    }

    /// Creates a join or viewer token that lives `ttl` (None: until
    /// deleted); the token itself is in the answer only.
    pub async fn create_join_token(
        &self,
        kind: TokenKind,
        ttl: Option<HumanDuration>,
        description: String,
    ) -> Result<(JoinTokenRecord, String), ApiError> {
        let id = uuid::Uuid::new_v4().simple().to_string()[..6].to_string();
        let token = format!("{}{id}.{}", kind.prefix(), uuid::Uuid::new_v4().simple());
        let created = now();
        let expires = ttl.map(|ttl| Timestamp::from_system_time(created.system_time() + ttl.get()));
        let record = JoinTokenRecord { id: id.clone(), kind, hash: token_hash(&token), description, created, expires };
        self.store.create(&join_token_key(&id), encode(&record)?).await.map_err(ApiError::from)?;
        Ok((record, token))
    }

    /// The join tokens created through the API, expired ones included.
    pub async fn join_tokens(&self) -> Result<Vec<JoinTokenRecord>, ApiError> {
        let page = self.store.list(JOIN_TOKENS_PREFIX, &ListOptions::default(), |_| true).await?;
        page.items.iter().map(|kv| decode(&kv.key, &kv.value)).collect()
    }

    /// Revokes a join token created through the API; 404 if there is none.
    pub async fn delete_join_token(&self, id: &str) -> Result<JoinTokenRecord, ApiError> {
        let key = join_token_key(id);
        let not_found = || ApiError::NotFound { kind: "JoinToken".into(), name: id.into() };
        let kv = self.store.get(&key).await?.ok_or_else(not_found)?;
        let record = decode(&key, &kv.value)?;
        let txn = Txn::new().when(herd_store::Compare::ModRevision { key: key.clone(), revision: kv.mod_revision });
        match self.store.txn(txn.delete(key)).await? {
            herd_store::TxnOutcome::Committed { .. } => Ok(record),
            herd_store::TxnOutcome::CompareFailed { .. } => Err(not_found()),
        }
    }

    /// What is left of node `name` if an admin deleted it and has not
    /// readmitted it.
    pub async fn deleted_node(&self, name: &str) -> Result<Option<DeletedNode>, ApiError> {
        let key = deleted_node_key(name);
        self.store.get(&key).await?.map(|kv| decode(&key, &kv.value)).transpose()
    }

    /// The writes that go with deleting node `name`: its token revoked and a
    /// record of who it was, so that its agent cannot join again unasked.
    pub async fn node_deletion_ops(&self, name: &str, was_ready: bool) -> Result<Vec<herd_store::Op>, ApiError> {
        let key = node_token_key(name);
        let stored = match self.store.get(&key).await? {
            Some(kv) => Some(decode::<StoredToken>(&key, &kv.value)?),
            None => None,
        };
        let (token_hash, join_token) = stored.map(|s| (Some(s.hash), s.join_token)).unwrap_or_default();
        let deleted = DeletedNode { deleted_at: now(), token_hash, was_ready, join_token };
        Ok(vec![
            herd_store::Op::Delete { key },
            herd_store::Op::Put { key: deleted_node_key(name), value: encode(&deleted)? },
        ])
    }

    /// Lets a deleted node's agent join again: the record forgotten, if
    /// there was one.
    pub async fn readmit(&self, name: &str) -> Result<Option<DeletedNode>, ApiError> {
        let Some(deleted) = self.deleted_node(name).await? else { return Ok(None) };
        self.store.txn(Txn::new().delete(deleted_node_key(name))).await?;
        Ok(Some(deleted))
    }

    /// Issues a new token for `node`, replacing any earlier one; `join_token`
    /// is the API-made join token it joined with, if any.
    pub async fn issue_node_token(&self, node: &str, join_token: Option<String>) -> Result<String, ApiError> {
        let token = format!("{NODE_TOKEN_PREFIX}{node}.{}", generate_secret());
        let stored = StoredToken { hash: token_hash(&token), issued: now(), join_token };
        let txn = Txn::new().put(node_token_key(node), encode(&stored)?).delete(deleted_node_key(node));
        self.store.txn(txn).await.map_err(ApiError::from)?;
        self.note_token_changed(node);
        Ok(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn authenticator() -> (tempfile::TempDir, Authenticator) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("s.db").to_str().unwrap()).await.unwrap();
        (dir, Authenticator::new(store, "admin-secret", "join-secret", CancellationToken::new()))
    }

    #[tokio::test]
    async fn a_cached_node_token_is_refused_at_once_after_its_revocation_here() {
        let (_dir, auth) = authenticator().await;
        let token = auth.issue_node_token("n1", None).await.unwrap();
        for _ in 0..2 {
            assert!(matches!(auth.principal(Some(&token)).await, Ok(Principal::Node(n)) if n == "n1"));
        }
        let ops = auth.node_deletion_ops("n1", true).await.unwrap();
        auth.store.txn(Txn { compares: Vec::new(), ops }).await.unwrap();
        auth.note_token_changed("n1");
        let refused = auth.principal(Some(&token)).await.unwrap_err();
        assert!(refused.to_string().contains("was deleted by an admin"), "{refused}");
    }

    /// Two replicas on one store: a token revoked through one is refused
    /// by the other once its copy has the change (a watch away, not a
    /// recheck period).
    #[tokio::test]
    async fn a_node_token_revoked_through_another_replica_is_refused_here() {
        let (_dir, here) = authenticator().await;
        let there = Authenticator::new(here.store.clone(), "admin-secret", "join-secret", CancellationToken::new());
        let token = there.issue_node_token("n1", None).await.unwrap();
        here.node_tokens.synced().await;
        assert!(here.principal(Some(&token)).await.is_ok());
        let ops = there.node_deletion_ops("n1", true).await.unwrap();
        there.store.txn(Txn { compares: Vec::new(), ops }).await.unwrap();
        there.note_token_changed("n1");
        let refused = there.principal(Some(&token)).await.unwrap_err();
        assert!(refused.to_string().contains("was deleted by an admin"), "at once where it was revoked: {refused}");
        for _ in 0..200 {
            if here.principal(Some(&token)).await.is_err() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        panic!("the other replica still takes the revoked token");
    }

    #[tokio::test]
    async fn a_replaced_node_token_is_refused_and_its_successor_taken() {
        let (_dir, auth) = authenticator().await;
        let old = auth.issue_node_token("n1", None).await.unwrap();
        assert!(auth.principal(Some(&old)).await.is_ok());
        let new = auth.issue_node_token("n1", None).await.unwrap();
        assert!(auth.principal(Some(&old)).await.is_err(), "the replaced token was still taken");
        assert!(matches!(auth.principal(Some(&new)).await, Ok(Principal::Node(n)) if n == "n1"));
        let forged = format!("{NODE_TOKEN_PREFIX}n1.{}", generate_secret());
        assert!(auth.principal(Some(&forged)).await.is_err());
    }
}
