//! Whom a TLS client trusts: the cluster CA, given as its certificate (the
//! CLI's config file) or pinned by its hash (`--ca-hash sha256:...`, what
//! an agent joins with, as kubeadm's discovery hash). A server whose chain
//! does not lead to that CA is refused.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::TlsError;

/// Makes ring the process's rustls provider (once; later calls do nothing).
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The SHA-256 of a CA certificate (DER): `sha256:<64 hex digits>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CaHash([u8; 32]);

impl CaHash {
    pub fn of(cert_der: &[u8]) -> CaHash {
        let digest = ring::digest::digest(&ring::digest::SHA256, cert_der);
        let mut bytes = [0; 32];
        bytes.copy_from_slice(digest.as_ref());
        CaHash(bytes)
    }
}

impl fmt::Display for CaHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sha256:")?;
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for CaHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for CaHash {
    type Err = TlsError;

    fn from_str(text: &str) -> Result<CaHash, TlsError> {
        let bad = || TlsError::Hash(format!("{text:?} is not a CA hash: expected sha256: and 64 hex digits"));
        let hex = text.strip_prefix("sha256:").ok_or_else(bad)?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut bytes = [0; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(CaHash(bytes))
    }
}

/// What a client trusts.
#[derive(Clone, Debug)]
pub enum Trust {
    /// The CA certificate itself (PEM).
    Ca(String),
    /// CAs known by their hashes (one, or several while a CA is replaced):
    /// the server's chain must carry one of them.
    Pinned(Vec<CaHash>),
}

/// A rustls client configuration that trusts only the cluster CA.
pub fn client_config(trust: &Trust) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let config = match trust {
        Trust::Ca(pem) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|e| TlsError::Pem(format!("the CA certificate: {e}")))?;
                roots.add(cert)?;
            }
            if roots.is_empty() {
                return Err(TlsError::Pem("no certificate in the CA file".into()));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        Trust::Pinned(hash) => {
            if hash.is_empty() {
                return Err(TlsError::Hash("no CA hash to pin".into()));
            }
            let verifier = CaVerifier::pinned(hash.clone());
            builder.dangerous().with_custom_certificate_verifier(Arc::new(verifier)).with_no_client_auth()
        }
    };
    Ok(config)
}

/// Which CA a verifier trusts.
#[derive(Debug)]
enum WhichCa {
    /// Any in the server's chain with one of these hashes.
    Pinned(Vec<CaHash>),
    /// This one.
    Known(Arc<WebPkiServerVerifier>),
}

/// Accepts a server whose certificate the trusted CA signed for the name
/// asked, or for `expected` whatever was dialled (an agent is known by its
/// node's name, not its address).
#[derive(Debug)]
pub(crate) struct CaVerifier {
    which: WhichCa,
    /// The certificate's name, and the node it stands for (for the error).
    expected: Option<(ServerName<'static>, String)>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl CaVerifier {
    /// Trusts only `roots`, and only a certificate for node `node`.
    pub(crate) fn for_node(roots: Arc<RootCertStore>, node: &str) -> Result<CaVerifier, TlsError> {
        let name = ServerName::try_from(crate::node_dns_name(node))
            .map_err(|e| TlsError::Pem(format!("node name {node:?}: {e}")))?;
        let known = WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| TlsError::Pem(format!("the CA: {e}")))?;
        Ok(CaVerifier { which: WhichCa::Known(known), expected: Some((name, node.into())), provider: provider() })
    }

    fn pinned(hashes: Vec<CaHash>) -> CaVerifier {
        CaVerifier { which: WhichCa::Pinned(hashes), expected: None, provider: provider() }
    }
}

impl ServerCertVerifier for CaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let name = self.expected.as_ref().map_or(server_name, |(name, _)| name);
        let verified = match &self.which {
            WhichCa::Known(verifier) => {
                verifier.verify_server_cert(end_entity, intermediates, name, ocsp_response, now)
            }
            WhichCa::Pinned(hashes) => {
                let Some(ca) = intermediates.iter().find(|cert| hashes.contains(&CaHash::of(cert))) else {
                    let shown = intermediates
                        .last()
                        .map_or("no CA".to_string(), |cert| format!("a CA with hash {}", CaHash::of(cert)));
                    let pinned: Vec<String> = hashes.iter().map(CaHash::to_string).collect();
                    return Err(rustls::Error::General(format!(
                        "the server showed {shown}, not the pinned CA {}: refusing it (a wrong --ca-hash, or someone in between)",
                        pinned.join(" or ")
                    )));
                };
                let mut roots = RootCertStore::empty();
                roots.add(ca.clone().into_owned())?;
                let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
                    .build()
                    .map_err(|e| rustls::Error::General(e.to_string()))?;
                verifier.verify_server_cert(end_entity, &[], name, ocsp_response, now)
            }
        };
        verified.map_err(|error| match &self.expected {
            Some((_, node)) => rustls::Error::General(format!("the agent reached is not node {node}'s: {error}")),
            None => error,
        })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// A rustls server configuration serving `identity`: HTTP/2 to browsers
/// (the dashboard follows several watch streams at once, more than the
/// six HTTP/1.1 connections a browser opens to one server), HTTP/1.1 to
/// herd's own clients, which offer nothing else.
pub fn server_config(identity: &crate::ServingIdentity) -> Result<rustls::ServerConfig, TlsError> {
    let chain = CertificateDer::pem_slice_iter(identity.chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem(format!("the serving certificate: {e}")))?;
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes())
        .map_err(|e| TlsError::Pem(format!("the serving key: {e}")))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_reads_back_and_bad_ones_say_why() {
        let hash = CaHash::of(b"certificate");
        assert_eq!(hash.to_string().parse::<CaHash>().unwrap(), hash);
        for bad in ["", "sha256:", "md5:00", &format!("sha256:{}", "g".repeat(64))] {
            let error = bad.parse::<CaHash>().unwrap_err().to_string();
            assert!(error.contains("expected sha256: and 64 hex digits"), "{bad}: {error}");
        }
    }
}
