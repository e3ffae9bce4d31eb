//! Signing and verifying grants (Ed25519, with ring as everywhere else).
//! The signing key is derived from the secret every server replica is
//! given (the admin token), so that replicas sign alike and nothing more
//! is kept; agents get the public key with every join and heartbeat
//! answer, over the TLS connection they pinned. A signed grant is
//! `<payload>.<signature>`, each base64url: small enough for a header.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use herd_core::grant::Grant;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};

use crate::TlsError;

const CONTEXT: &str = "herd 2026-12 grant signing key v1";

/// The HTTP header a grant travels in.
pub const GRANT_HEADER: &str = "herd-grant";

/// Signs grants: held by the server only.
pub struct GrantSigner(Ed25519KeyPair);

impl GrantSigner {
    pub fn derive(secret: &str) -> Result<GrantSigner, TlsError> {
        let seed = blake3::derive_key(CONTEXT, secret.as_bytes());
        Ed25519KeyPair::from_seed_unchecked(&seed)
            .map(GrantSigner)
            .map_err(|e| TlsError::Grant(format!("deriving the signing key: {e}")))
    }

    /// The public key agents verify with, base64url.
    pub fn public_key(&self) -> String {
        B64.encode(self.0.public_key().as_ref())
    }

    pub fn sign(&self, grant: &Grant) -> String {
        // A Grant is plain data: it always serializes.
        let payload = serde_json::to_vec(grant).unwrap_or_default();
        let signature = self.0.sign(&payload);
        format!("{}.{}", B64.encode(&payload), B64.encode(signature.as_ref()))
    }
}

/// Verifies grants with the server's public key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantVerifier(Vec<u8>);

impl GrantVerifier {
    pub fn from_public_key(key: &str) -> Result<GrantVerifier, TlsError> {
        let bytes = B64.decode(key.trim()).map_err(|e| TlsError::Grant(format!("the grant key: {e}")))?;
        if bytes.len() != 32 {
            return Err(TlsError::Grant(format!("the grant key has {} bytes, not 32", bytes.len())));
        }
        Ok(GrantVerifier(bytes))
    }

    /// The grant, if the signature is the server's.
    pub fn verify(&self, signed: &str) -> Result<Grant, TlsError> {
        let bad = |why: &str| TlsError::Grant(why.to_string());
        let (payload, signature) = signed.trim().split_once('.').ok_or_else(|| bad("not <payload>.<signature>"))?;
        let payload = B64.decode(payload).map_err(|_| bad("the payload is not base64url"))?;
        let signature = B64.decode(signature).map_err(|_| bad("the signature is not base64url"))?;
        UnparsedPublicKey::new(&ED25519, &self.0)
            .verify(&payload, &signature)
            .map_err(|_| bad("the signature is not the server's"))?;
        serde_json::from_slice(&payload).map_err(|e| TlsError::Grant(format!("the payload: {e}")))
    }
}

/// What a signed grant says, unverified: for its holder to pick the grant
/// a request needs.
pub fn read_unverified(signed: &str) -> Option<Grant> {
    let payload = B64.decode(signed.split_once('.')?.0).ok()?;
    serde_json::from_slice(&payload).ok()
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use herd_core::Timestamp;
    use herd_core::grant::{Access, Holder};

    use super::*;

    fn grant() -> Grant {
        Grant {
            holder: Holder::Node("n2".into()),
            node: "n1".into(),
            access: Access::StopMember { member: "m1".into() },
            expires: Timestamp::from_system_time(
                SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000),
            ),
            purpose: "test".into(),
            attempt: None,
        }
    }

    #[test]
    fn a_grant_verifies_with_the_servers_key_only_and_unchanged() {
        let signer = GrantSigner::derive("admin token").unwrap();
        let again = GrantSigner::derive("admin token").unwrap();
        assert_eq!(signer.public_key(), again.public_key(), "replicas given one secret sign alike");
        let verifier = GrantVerifier::from_public_key(&signer.public_key()).unwrap();
        let signed = signer.sign(&grant());
        assert_eq!(verifier.verify(&signed).unwrap(), grant());
        assert_eq!(read_unverified(&signed), Some(grant()));

        let other = GrantSigner::derive("another token").unwrap();
        let error = verifier.verify(&other.sign(&grant())).unwrap_err().to_string();
        assert!(error.contains("not the server's"), "{error}");
        // The payload changed to another member, the signature kept.
        let mut forged = grant();
        forged.access = Access::StopMember { member: "m2".into() };
        let forged_payload = other.sign(&forged);
        let forged = format!("{}.{}", forged_payload.split_once('.').unwrap().0, signed.split_once('.').unwrap().1);
        assert!(verifier.verify(&forged).is_err());
        for bad in ["", "x", "a.b", "!!.!!"] {
            assert!(verifier.verify(bad).is_err(), "{bad:?}");
        }
        assert!(GrantVerifier::from_public_key("AAAA").is_err());
    }
}
