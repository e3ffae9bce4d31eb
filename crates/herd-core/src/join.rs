//! Who may join, and under which name. Pure.
//!
//! A name that has joined is taken: the agent that holds it comes back
//! with its own node token (kept in its data dir), and a join for that name
//! is refused (409) unless it is the same agent run retrying its join,
//! until an admin deletes the node. So a join token cannot take a live
//! node's identity, its address or its Commands.
//!
//! Deleting a node revokes its token and leaves a [`DeletedNode`] record:
//! the deleted agent, which shows its old token when it joins again, is
//! refused until an admin readmits the name, while a new (or reinstalled)
//! host, which has no old token, may take the name at once.
//!
//! Join tokens: besides the server's own (given or kept in its data dir,
//! never expiring), an admin creates tokens that expire and can be deleted
//! (`herdjoin.<id>.<secret>`, kubeadm's bootstrap tokens); only their
//! hashes are kept. Viewer tokens (`herdview.<id>.<secret>`, for the
//! dashboard and read-only scripts) are made, kept and revoked the same way.

use serde::{Deserialize, Serialize};

use crate::kinds::Node;
use crate::time::Timestamp;

/// How a join token created through the API starts.
pub const JOIN_TOKEN_PREFIX: &str = "herdjoin.";

/// How a viewer token created through the API starts.
pub const VIEWER_TOKEN_PREFIX: &str = "herdview.";

/// What a token created through the API lets its holder do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum TokenKind {
    /// Register one node (`POST /api/v1/join`).
    #[default]
    Join,
    /// Read everything but tokens: the dashboard's and read-only scripts'.
    Viewer,
}

impl TokenKind {
    pub fn prefix(self) -> &'static str {
        match self {
            TokenKind::Join => JOIN_TOKEN_PREFIX,
            TokenKind::Viewer => VIEWER_TOKEN_PREFIX,
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            TokenKind::Join => "join",
            TokenKind::Viewer => "viewer",
        }
    }
}

/// A join token created through the API, as kept (its hash, not itself).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinTokenRecord {
    pub id: String,
    /// Records from before viewer tokens are join tokens.
    #[serde(default)]
    pub kind: TokenKind,
    /// blake3 of the whole token, hex.
    pub hash: String,
    #[serde(default)]
    pub description: String,
    pub created: Timestamp,
    /// None: never expires.
    #[serde(default)]
    pub expires: Option<Timestamp>,
}

impl JoinTokenRecord {
    /// Whether the token may be used at `now`; why not, if not.
    pub fn usable_at(&self, now: Timestamp) -> Result<(), String> {
        match self.expires {
            Some(expires) if expires <= now => {
                Err(format!("{} token {} expired at {expires}", self.kind.word(), self.id))
            }
            _ => Ok(()),
        }
    }
}

/// The kind and id of an API-created token (`herdjoin.<id>.<secret>` or
/// `herdview.<id>.<secret>`).
pub fn token_id(token: &str) -> Option<(TokenKind, &str)> {
    let (kind, rest) = [TokenKind::Join, TokenKind::Viewer]
        .into_iter()
        .find_map(|kind| Some((kind, token.strip_prefix(kind.prefix())?)))?;
    let (id, secret) = rest.split_once('.')?;
    let well_formed = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric());
    (well_formed(id) && well_formed(secret)).then_some((kind, id))
}

/// The id of an API-created join token.
pub fn join_token_id(token: &str) -> Option<&str> {
    token_id(token).and_then(|(kind, id)| (kind == TokenKind::Join).then_some(id))
}

/// What is left of a node an admin deleted: who it was, so that its agent
/// cannot simply join again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeletedNode {
    pub deleted_at: Timestamp,
    /// blake3 of the node token the deleted agent holds, hex.
    pub token_hash: Option<String>,
    /// Whether the node was Ready when it was deleted.
    pub was_ready: bool,
    /// The id of the API-made join token its agent joined with (None: the
    /// server's own, or not known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join_token: Option<String>,
}

/// blake3 of a token, hex: what is kept instead of the token.
pub fn token_hash(token: &str) -> String {
    blake3::hash(token.as_bytes()).to_hex().to_string()
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinVerdict {
    /// A new node.
    Register,
    /// The agent run that joined it, retrying (its answer was lost).
    Retry,
    /// The name is taken; why, and what to do.
    Refuse(String),
}

/// What a join says about the agent asking.
#[derive(Clone, Copy, Debug)]
pub struct Joiner<'a> {
    /// Its run's boot id.
    pub boot_id: &'a str,
    /// The node token it held before, if any.
    pub previous_token: Option<&'a str>,
}

/// The verdict on a join for `name`, given the node as stored (if any) and
/// what is left of a deleted node of that name (if any).
pub fn join_verdict(name: &str, existing: Option<&Node>, deleted: Option<&DeletedNode>, joiner: Joiner) -> JoinVerdict {
    let Some(node) = existing else {
        let deleted_agent = deleted.and_then(|d| Some((d, d.token_hash.as_deref()?))).filter(|(_, hash)| {
            joiner
                .previous_token
                .is_some_and(|token| blake3::Hash::from_hex(hash).ok() == Some(blake3::hash(token.as_bytes())))
        });
        return match deleted_agent {
            Some((deleted, _)) => JoinVerdict::Refuse(format!(
                "node {name} was deleted by an admin at {} and this agent is the one that held it: it may not join \
                 again until an admin readmits it (`herd node readmit {name}`), or its data dir is wiped",
                deleted.deleted_at
            )),
            None => JoinVerdict::Register,
        };
    };
    let boot_id = joiner.boot_id;
    if node.status.agent_boot_id.as_deref() == Some(boot_id) {
        return JoinVerdict::Retry;
    }
    let state = if node.status.ready { "Ready" } else { "NotReady" };
    JoinVerdict::Refuse(format!(
        "node {name} has joined already ({state}): its agent comes back with the node token kept in its data dir, \
         not with a join token; to put another (or a reinstalled) host under this name, delete the node first \
         (`herd delete node {name}`)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::NodeSpec;

    fn joiner(boot_id: &str) -> Joiner<'_> {
        Joiner { boot_id, previous_token: None }
    }

    #[test]
    fn rule_a_new_name_registers_the_same_run_retries_anyone_else_is_refused() {
        assert_eq!(join_verdict("n3", None, None, joiner("b1")), JoinVerdict::Register);
        let mut node = Node::new("n3", NodeSpec::default());
        node.status.agent_boot_id = Some("b1".into());
        node.status.ready = true;
        assert_eq!(join_verdict("n3", Some(&node), None, joiner("b1")), JoinVerdict::Retry);
        let JoinVerdict::Refuse(why) = join_verdict("n3", Some(&node), None, joiner("b2")) else { panic!() };
        assert!(why.starts_with("node n3 has joined already (Ready)") && why.contains("herd delete node n3"), "{why}");
    }

    #[test]
    fn rule_a_deleted_nodes_agent_is_refused_until_readmitted_a_new_host_is_not() {
        let old_token = "herdnode.n3.secret";
        let deleted = DeletedNode {
            deleted_at: Timestamp::default(),
            token_hash: Some(token_hash(old_token)),
            was_ready: true,
            join_token: None,
        };
        let old_agent = Joiner { boot_id: "b1", previous_token: Some(old_token) };
        let JoinVerdict::Refuse(why) = join_verdict("n3", None, Some(&deleted), old_agent) else { panic!() };
        assert!(why.contains("deleted by an admin") && why.contains("herd node readmit n3"), "{why}");
        assert_eq!(join_verdict("n3", None, Some(&deleted), joiner("b9")), JoinVerdict::Register, "a new host");
        let other = Joiner { boot_id: "b9", previous_token: Some("herdnode.n3.other") };
        assert_eq!(join_verdict("n3", None, Some(&deleted), other), JoinVerdict::Register, "not the deleted agent");
        assert_eq!(join_verdict("n3", None, None, old_agent), JoinVerdict::Register, "readmitted");
    }

    #[test]
    fn rule_join_tokens_have_an_id_and_expire() {
        assert_eq!(join_token_id("herdjoin.ab12cd.0123456789abcdef"), Some("ab12cd"));
        for bad in ["herdjoin.ab12cd", "herdjoin..x", "herdjoin.a/b.x", "other.ab.cd", "herdjoin.ab.c.d"] {
            assert_eq!(join_token_id(bad), None, "{bad}");
        }
        assert_eq!(token_id("herdview.ab12cd.0123"), Some((TokenKind::Viewer, "ab12cd")));
        assert_eq!(join_token_id("herdview.ab12cd.0123"), None, "a viewer token does not join");
        let at = |secs| Timestamp::from_system_time(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs));
        let record = JoinTokenRecord {
            id: "ab12cd".into(),
            kind: TokenKind::Join,
            hash: token_hash("x"),
            description: String::new(),
            created: at(0),
            expires: Some(at(100)),
        };
        assert!(record.usable_at(at(99)).is_ok());
        let expired = record.usable_at(at(100)).unwrap_err();
        assert!(expired.contains("join token ab12cd expired at"), "{expired}");
        assert!(JoinTokenRecord { expires: None, ..record }.usable_at(at(1 << 40)).is_ok());
    }
}
