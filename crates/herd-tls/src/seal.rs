//! Sealing a secret for the store: ChaCha20-Poly1305 under a key derived
//! from a secret every server replica is given (the admin token), so that
//! a copy of the store (a backup, a database reader) does not carry the
//! CA's key in the clear.

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

use crate::TlsError;

const CONTEXT: &str = "herd 2026-12 cluster CA key sealing v1";
const AAD: &[u8] = b"herd cluster CA key";

/// A sealed secret: its nonce and the ciphertext with its tag, hex.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sealed {
    pub nonce: String,
    pub ciphertext: String,
}

fn key(secret: &str) -> Result<LessSafeKey, TlsError> {
    let derived = blake3::derive_key(CONTEXT, secret.as_bytes());
    let unbound = UnboundKey::new(&CHACHA20_POLY1305, &derived).map_err(|_| TlsError::Seal("bad key".into()))?;
    Ok(LessSafeKey::new(unbound))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

pub fn seal(secret: &str, plaintext: &[u8]) -> Result<Sealed, TlsError> {
    let mut nonce = [0u8; 12];
    SystemRandom::new().fill(&mut nonce).map_err(|_| TlsError::Seal("no randomness".into()))?;
    let mut sealed = plaintext.to_vec();
    key(secret)?
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(AAD), &mut sealed)
        .map_err(|_| TlsError::Seal("sealing failed".into()))?;
    Ok(Sealed { nonce: hex(&nonce), ciphertext: hex(&sealed) })
}

/// The plaintext; an error if `secret` is not the one it was sealed with.
pub fn open(secret: &str, sealed: &Sealed) -> Result<Vec<u8>, TlsError> {
    let damaged = || TlsError::Seal("the sealed value is damaged".into());
    let nonce: [u8; 12] = unhex(&sealed.nonce).and_then(|n| n.try_into().ok()).ok_or_else(damaged)?;
    let mut buffer = unhex(&sealed.ciphertext).ok_or_else(damaged)?;
    let plain = key(secret)?
        .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(AAD), &mut buffer)
        .map_err(|_| TlsError::Seal("it was sealed with another admin token".into()))?;
    Ok(plain.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_secret_opens_it() {
        let sealed = seal("admin-1", b"the key").unwrap();
        assert!(!sealed.ciphertext.contains(&hex(b"the key")));
        assert_eq!(open("admin-1", &sealed).unwrap(), b"the key");
        assert!(open("admin-2", &sealed).unwrap_err().to_string().contains("another admin token"));
        let tampered = Sealed { ciphertext: format!("00{}", &sealed.ciphertext[2..]), ..sealed.clone() };
        assert!(open("admin-1", &tampered).is_err());
    }
}
