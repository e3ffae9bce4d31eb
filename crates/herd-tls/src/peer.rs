//! TLS between agents, and from the server to agents: each side shows a
//! certificate the cluster CA signed (a node's for `<node>.node.herd`, the
//! server's for `server.herd`), and each checks the other's. A caller
//! checks that the agent it reached is the node it meant, whatever address
//! it dialled; an agent learns from the caller's certificate who asks (the
//! holder a grant must name).

use std::sync::Arc;

use herd_core::grant::Holder;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore};

use crate::trust::{CaVerifier, provider};
use crate::{ServingIdentity, TlsError};

/// The DNS name of the server's own certificate, shown to agents.
pub const SERVER_DNS_NAME: &str = "server.herd";
const NODE_SUFFIX: &str = ".node.herd";

/// The chain and key of an identity, and the CA (the chain's last
/// certificate) as the only root.
fn parts(
    identity: &ServingIdentity,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>, Arc<RootCertStore>), TlsError> {
    let chain = CertificateDer::pem_slice_iter(identity.chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem(format!("the certificate chain: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes())
        .map_err(|e| TlsError::Pem(format!("the certificate's key: {e}")))?;
    let ca = chain.last().filter(|_| chain.len() > 1).ok_or(TlsError::Pem("the chain carries no CA".into()))?;
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone())?;
    Ok((chain, key, Arc::new(roots)))
}

/// A client configuration that shows `identity` and accepts only the agent
/// of `node` (its certificate signed by the identity's CA for
/// `<node>.node.herd`).
pub fn client_config(identity: &ServingIdentity, node: &str) -> Result<ClientConfig, TlsError> {
    let (chain, key, roots) = parts(identity)?;
    let ca = chain.last().map(|ca| crate::CaHash::of(ca)).into_iter().collect();
    let verifier = CaVerifier::for_node((roots, ca), node)?;
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_auth_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// An agent endpoint's configuration: serves `identity`, and asks callers
/// for a certificate of the same CA (one without any may still ask for
/// `/healthz`; everything else needs a grant naming the caller).
pub fn server_config(identity: &ServingIdentity) -> Result<rustls::ServerConfig, TlsError> {
    let (chain, key, roots) = parts(identity)?;
    let callers = WebPkiClientVerifier::builder_with_provider(roots, provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::Pem(format!("the CA: {e}")))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(callers)
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Who a verified certificate names: a node (`<node>.node.herd`) or the
/// server; None for anything else.
pub fn holder_of(cert: &CertificateDer<'_>) -> Option<Holder> {
    crate::ca::dns_names(cert).into_iter().find_map(|name| {
        if name == SERVER_DNS_NAME {
            return Some(Holder::Server);
        }
        name.strip_suffix(NODE_SUFFIX).filter(|node| !node.is_empty()).map(|n| Holder::Node(n.into()))
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::ClusterCa;

    fn node_identity(ca: &ClusterCa, node: &str) -> ServingIdentity {
        let (key_pem, request) = crate::node_key_and_request(node).unwrap();
        let chain_pem = ca.sign_node(&request, node, SystemTime::now(), Duration::from_secs(60)).unwrap();
        ServingIdentity { chain_pem, key_pem }
    }

    fn leaf(identity: &ServingIdentity) -> CertificateDer<'static> {
        CertificateDer::pem_slice_iter(identity.chain_pem.as_bytes()).next().unwrap().unwrap()
    }

    #[test]
    fn a_certificate_names_its_holder() {
        let ca = ClusterCa::generate(SystemTime::now()).unwrap();
        assert_eq!(holder_of(&leaf(&node_identity(&ca, "node-2"))), Some(Holder::Node("node-2".into())));
        let server =
            ca.issue("herd server", &[SERVER_DNS_NAME.into()], SystemTime::now(), Duration::from_secs(60)).unwrap();
        assert_eq!(holder_of(&leaf(&server)), Some(Holder::Server));
        let other = ca.issue("x", &["example.org".into()], SystemTime::now(), Duration::from_secs(60)).unwrap();
        assert_eq!(holder_of(&leaf(&other)), None);
    }

    #[tokio::test]
    async fn a_caller_reaches_only_the_node_it_meant_and_shows_who_it_is() {
        crate::install_provider();
        let ca = ClusterCa::generate(SystemTime::now()).unwrap();
        let (n1, n2) = (node_identity(&ca, "n1"), node_identity(&ca, "n2"));
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(&n1).unwrap()));
        let served = tokio::spawn(async move {
            let mut callers = Vec::new();
            for _ in 0..2 {
                let (stream, _) = tcp.accept().await.unwrap();
                if let Ok(tls) = acceptor.accept(stream).await {
                    callers.push(tls.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(holder_of));
                }
            }
            callers
        });
        let connect = |meant: &str| {
            let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config(&n2, meant).unwrap()));
            async move {
                let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                connector
                    .connect(rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(), stream)
                    .await
                    .map(|_| ())
            }
        };
        assert!(connect("n1").await.is_ok(), "n1's agent is n1");
        let error = connect("n3").await.unwrap_err().to_string();
        assert!(error.contains("not node n3's"), "{error}");
        let callers = served.await.unwrap();
        assert_eq!(callers.first(), Some(&Some(Holder::Node("n2".into()))), "the caller is known: {callers:?}");
    }
}
