//! Whom a TLS client trusts: the cluster CA, given as its certificate (the
//! CLI's config file) or pinned by its hash (`--ca-hash sha256:...`, what
//! an agent joins with, as kubeadm's discovery hash). A server whose chain
//! does not lead to that CA is refused, and so is one whose certificate
//! the CA signed for anything but the API server: a node's certificate,
//! taken from its agent's data dir, does not pass for the server's.

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

/// The name only the API server's certificate carries: what a client of
/// the API checks, besides the address it dialled.
pub const API_DNS_NAME: &str = "api.herd";

/// What a client trusts.
#[derive(Clone, Debug)]
pub enum Trust {
    /// The CA certificate itself (PEM).
    Ca(String),
    /// CAs known by their hashes (one, or several while a CA is replaced):
    /// the server's chain must carry one of them.
    Pinned(Vec<CaHash>),
}

impl Trust {
    /// The hashes of the CAs trusted: what `--ca-hash` pins.
    pub fn ca_hashes(&self) -> Result<Vec<CaHash>, TlsError> {
        match self {
            Trust::Pinned(hashes) => Ok(hashes.clone()),
            Trust::Ca(pem) => CertificateDer::pem_slice_iter(pem.as_bytes())
                .map(|cert| cert.map(|cert| CaHash::of(&cert)))
                .collect::<Result<_, _>>()
                .map_err(|e| TlsError::Pem(format!("the CA certificate: {e}"))),
        }
    }
}

/// A rustls client configuration that trusts only the cluster CA, and of
/// the certificates it signed only the API server's.
pub fn client_config(trust: &Trust) -> Result<ClientConfig, TlsError> {
    let which = match trust {
        Trust::Ca(pem) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|e| TlsError::Pem(format!("the CA certificate: {e}")))?;
                roots.add(cert)?;
            }
            if roots.is_empty() {
                return Err(TlsError::Pem("no certificate in the CA file".into()));
            }
            WhichCa::known(Arc::new(roots), trust.ca_hashes()?)?
        }
        Trust::Pinned(hash) => {
            if hash.is_empty() {
                return Err(TlsError::Hash("no CA hash to pin".into()));
            }
            WhichCa::Pinned(hash.clone())
        }
    };
    let verifier = CaVerifier { which, expected: Expected::ApiServer, provider: provider() };
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(config)
}

/// Which CA a verifier trusts.
#[derive(Debug)]
enum WhichCa {
    /// Any in the server's chain with one of these hashes.
    Pinned(Vec<CaHash>),
    /// This one (a CA file's), and its hashes, to name in a refusal.
    Known(Arc<WebPkiServerVerifier>, Vec<CaHash>),
}

impl WhichCa {
    fn known(roots: Arc<RootCertStore>, hashes: Vec<CaHash>) -> Result<WhichCa, TlsError> {
        let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| TlsError::Pem(format!("the CA: {e}")))?;
        Ok(WhichCa::Known(verifier, hashes))
    }
}

/// A refusal of a server whose chain leads to none of the `trusted` CAs,
/// naming the CA it showed and those trusted.
fn not_the_trusted_ca(intermediates: &[CertificateDer<'_>], trusted: &[CaHash], fix: &str) -> rustls::Error {
    let shown = intermediates.last().map_or("no CA".to_string(), |cert| format!("a CA with hash {}", CaHash::of(cert)));
    let trusted: Vec<String> = trusted.iter().map(CaHash::to_string).collect();
    rustls::Error::General(format!(
        "the server showed {shown}, not the trusted CA {}: refusing it ({fix}, or someone in between)",
        trusted.join(" or ")
    ))
}

/// Whose certificate a verifier wants.
#[derive(Debug)]
enum Expected {
    /// The API server's: signed for the name dialled, and naming
    /// [`API_DNS_NAME`], which only the API server's certificate carries.
    ApiServer,
    /// Node `node`'s agent (its certificate's name), whatever address was
    /// dialled: an agent is known by its node's name.
    Node(ServerName<'static>, String),
}

/// Accepts a server whose certificate the trusted CA signed for the
/// certificate expected.
#[derive(Debug)]
pub(crate) struct CaVerifier {
    which: WhichCa,
    expected: Expected,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl CaVerifier {
    /// Trusts only `roots` (the CA, and its hash), and only a certificate
    /// for node `node`.
    pub(crate) fn for_node(
        (roots, hashes): (Arc<RootCertStore>, Vec<CaHash>),
        node: &str,
    ) -> Result<CaVerifier, TlsError> {
        let name = ServerName::try_from(crate::node_dns_name(node))
            .map_err(|e| TlsError::Pem(format!("node name {node:?}: {e}")))?;
        Ok(CaVerifier {
            which: WhichCa::known(roots, hashes)?,
            expected: Expected::Node(name, node.into()),
            provider: provider(),
        })
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
        let name = match &self.expected {
            Expected::ApiServer => server_name,
            Expected::Node(name, _) => name,
        };
        let verified = match &self.which {
            WhichCa::Known(verifier, hashes) => {
                let shows_trusted = intermediates.iter().any(|cert| hashes.contains(&CaHash::of(cert)));
                match verifier.verify_server_cert(end_entity, intermediates, name, ocsp_response, now) {
                    Err(_) if !shows_trusted => {
                        Err(not_the_trusted_ca(intermediates, hashes, "a CA file of another cluster"))
                    }
                    verified => verified,
                }
            }
            WhichCa::Pinned(hashes) => {
                let Some(ca) = intermediates.iter().find(|cert| hashes.contains(&CaHash::of(cert))) else {
                    return Err(not_the_trusted_ca(intermediates, hashes, "a wrong --ca-hash"));
                };
                let mut roots = RootCertStore::empty();
                roots.add(ca.clone().into_owned())?;
                let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
                    .build()
                    .map_err(|e| rustls::Error::General(e.to_string()))?;
                verifier.verify_server_cert(end_entity, &[], name, ocsp_response, now)
            }
        };
        match &self.expected {
            Expected::Node(_, node) => verified
                .map_err(|error| rustls::Error::General(format!("the agent reached is not node {node}'s: {error}"))),
            Expected::ApiServer => {
                let verified = verified?;
                if crate::ca::dns_names(end_entity).iter().any(|name| name == API_DNS_NAME) {
                    Ok(verified)
                } else {
                    Err(rustls::Error::General(format!(
                        "the cluster CA signed it, but not for the API server (it does not name {API_DNS_NAME}): \
                         a node's certificate shown by someone in between?"
                    )))
                }
            }
        }
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

    /// A TLS handshake from an API client trusting `trust` to a server
    /// showing `identity`, dialled as 127.0.0.1.
    async fn handshake(trust: &Trust, identity: &crate::ServingIdentity) -> Result<(), String> {
        crate::install_provider();
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(identity).unwrap()));
        let served = tokio::spawn(async move {
            let (stream, _) = tcp.accept().await.unwrap();
            let _ = acceptor.accept(stream).await;
        });
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config(trust).unwrap()));
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let result = connector.connect(ServerName::try_from("127.0.0.1").unwrap(), stream).await;
        served.abort();
        result.map(|_| ()).map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn an_api_client_takes_only_the_api_servers_certificate_not_a_nodes() {
        use std::time::{Duration, SystemTime};
        let now = SystemTime::now();
        let ca = crate::ClusterCa::generate(now).unwrap();
        let pem = Trust::Ca(ca.cert_pem().to_string());
        let pinned = Trust::Pinned(vec![ca.hash()]);
        let api = ca.issue_api_server("herd server", &["127.0.0.1".into()], now, Duration::from_secs(60)).unwrap();
        // A certificate the same CA signed for the address, but without the
        // API server's mark: what a node's certificate was before.
        let unmarked = ca.issue("node-2", &["127.0.0.1".into()], now, Duration::from_secs(60)).unwrap();
        let (key_pem, request) = crate::node_key_and_request("node-2").unwrap();
        let node = crate::ServingIdentity {
            chain_pem: ca.sign_node(&request, "node-2", now, Duration::from_secs(60)).unwrap(),
            key_pem,
        };
        for trust in [&pem, &pinned] {
            handshake(trust, &api).await.expect("the API server's certificate");
            for impostor in [&unmarked, &node] {
                let error = handshake(trust, impostor).await.unwrap_err();
                assert!(error.contains("certificate"), "{error}");
            }
            let error = handshake(trust, &unmarked).await.unwrap_err();
            assert!(error.contains("not for the API server"), "{error}");
        }
    }
}
