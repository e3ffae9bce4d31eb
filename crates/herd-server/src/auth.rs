//! Bearer tokens: who is calling.
//!
//! Three kinds of token for the API, and one between agents. The admin token may do everything. The join token
//! may only register a node (`POST /api/v1/join`), which hands the node its
//! own node token. A node token (`herdnode.<node>.<secret>`) identifies that
//! node; what it may do is decided by `herd_core::authz`. Only blake3 hashes
//! of tokens are kept: node token hashes in the store, so every server
//! replica knows them. The peer token is one cluster-wide secret, kept in
//! the store as it is (agents need it back): agents show it to each other
//! to read volumes, and the server shows it to ask agents what exists.

use axum::http::HeaderMap;
use herd_core::authz::Principal;
use herd_store::Store;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::objects::now;

const NODE_TOKEN_PREFIX: &str = "herdnode.";
const PEER_TOKEN_KEY: &str = "/secrets/peer-token";

fn node_token_key(node: &str) -> String {
    format!("/secrets/nodetokens/{node}")
}

#[derive(Serialize, Deserialize)]
struct StoredToken {
    hash: String,
    issued: herd_core::Timestamp,
}

/// The cluster's peer token, created by the first replica that needs it
/// (read first: creating is a write, and this is asked for often).
pub async fn peer_token(store: &Store) -> Result<String, ApiError> {
    let read = async || {
        let value = store.get(PEER_TOKEN_KEY).await?.map(|kv| kv.value);
        value
            .map(|v| String::from_utf8(v).map_err(|_| ApiError::Internal("the stored peer token is not text".into())))
            .transpose()
    };
    if let Some(token) = read().await? {
        return Ok(token);
    }
    let fresh = generate_secret();
    match store.create(PEER_TOKEN_KEY, fresh.clone()).await {
        Ok(_) => Ok(fresh),
        Err(herd_store::StoreError::AlreadyExists(_)) => {
            read().await?.ok_or_else(|| ApiError::Internal("the peer token vanished".into()))
        }
        Err(other) => Err(other.into()),
    }
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
    peer: tokio::sync::OnceCell<String>,
}

fn hash(token: &str) -> blake3::Hash {
    blake3::hash(token.as_bytes())
}

impl Authenticator {
    pub fn new(store: Store, admin_token: &str, join_token: &str) -> Self {
        Authenticator { store, admin: hash(admin_token), join: hash(join_token), peer: Default::default() }
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
            let stored = self.store.get(&node_token_key(node)).await.map_err(ApiError::from)?;
            let matches = stored
                .and_then(|kv| serde_json::from_slice::<StoredToken>(&kv.value).ok())
                .and_then(|t| blake3::Hash::from_hex(t.hash).ok())
                .is_some_and(|h| h == hash(token));
            if matches {
                return Ok(Principal::Node(node.to_string()));
            }
        }
        Err(ApiError::Unauthorized("the bearer token is not valid".into()))
    }

    pub fn check_join_token(&self, token: Option<&str>) -> Result<(), ApiError> {
        match token {
            Some(token) if hash(token) == self.join => Ok(()),
            Some(_) => Err(ApiError::Unauthorized("the join token is not valid".into())),
            None => Err(ApiError::Unauthorized("joining needs the join token as bearer token".into())),
        }
    }

    /// The cluster's peer token (see [`peer_token`]), read once.
    pub async fn peer_token(&self) -> Result<String, ApiError> {
        self.peer.get_or_try_init(|| peer_token(&self.store)).await.cloned()
    }

    /// Issues a new token for `node`, replacing any earlier one.
    pub async fn issue_node_token(&self, node: &str) -> Result<String, ApiError> {
        let token = format!("{NODE_TOKEN_PREFIX}{node}.{}", generate_secret());
        let stored = StoredToken { hash: hash(&token).to_hex().to_string(), issued: now() };
        let value = serde_json::to_vec(&stored).map_err(|e| ApiError::Internal(e.to_string()))?;
        self.store.txn(herd_store::Txn::new().put(node_token_key(node), value)).await.map_err(ApiError::from)?;
        Ok(token)
    }
}
