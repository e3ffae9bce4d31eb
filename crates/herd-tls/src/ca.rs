//! The cluster CA: a self-signed certificate and its key, made once per
//! cluster, and the serving certificates it signs. The CA's hash
//! (`sha256:<hex>` of its certificate, as kubeadm's discovery hash) is what
//! a joining agent and a CLI pin.

use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::TlsError;
use crate::trust::{API_DNS_NAME, CaHash};

/// How long the CA is valid.
const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Certificates start this long before they are made, for clocks a little behind.
const BACKDATE: Duration = Duration::from_secs(3600);

/// The CA: its certificate, and the key that signs with it.
pub struct ClusterCa {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate chain (leaf, then the CA) and the leaf's private key, PEM.
#[derive(Clone, Debug)]
pub struct ServingIdentity {
    pub chain_pem: String,
    pub key_pem: String,
}

fn validity(params: &mut CertificateParams, now: SystemTime, lifetime: Duration) {
    params.not_before = (now - BACKDATE).into();
    params.not_after = (now + lifetime).into();
}

impl ClusterCa {
    /// A new CA, valid for ten years from `now`.
    pub fn generate(now: SystemTime) -> Result<ClusterCa, TlsError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, "herd cluster CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        validity(&mut params, now, CA_LIFETIME);
        let cert = params.self_signed(&key)?;
        ClusterCa::from_pem(&cert.pem(), &key.serialize_pem())
    }

    /// The CA as kept: its certificate and its key, PEM.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<ClusterCa, TlsError> {
        let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| TlsError::Pem(format!("the CA certificate: {e}")))?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, KeyPair::from_pem(key_pem)?)?;
        Ok(ClusterCa { cert_pem: cert_pem.to_string(), cert_der, key_pem: key_pem.to_string(), issuer })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    pub fn hash(&self) -> CaHash {
        CaHash::of(&self.cert_der)
    }

    /// The API server's serving certificate: for `names` (the addresses and
    /// host names it is reached by) and [`API_DNS_NAME`], the mark API
    /// clients look for.
    pub fn issue_api_server(
        &self,
        common_name: &str,
        names: &[String],
        now: SystemTime,
        lifetime: Duration,
    ) -> Result<ServingIdentity, TlsError> {
        let mut names = names.to_vec();
        names.push(API_DNS_NAME.to_string());
        self.issue(common_name, &names, now, lifetime)
    }

    /// A serving certificate for `names` (DNS names or IP addresses), valid
    /// for `lifetime`; it may also be shown as a client certificate.
    pub fn issue(
        &self,
        common_name: &str,
        names: &[String],
        now: SystemTime,
        lifetime: Duration,
    ) -> Result<ServingIdentity, TlsError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, now, lifetime);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(ServingIdentity { chain_pem: format!("{}{}", cert.pem(), self.cert_pem), key_pem: key.serialize_pem() })
    }
}

/// The DNS names a certificate carries (its subject alternative names);
/// none for one that does not parse.
pub(crate) fn dns_names(cert: &CertificateDer<'_>) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert) else { return Vec::new() };
    let Ok(Some(names)) = parsed.subject_alternative_name() else { return Vec::new() };
    names
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(name) => Some(name.to_string()),
            _ => None,
        })
        .collect()
}

/// The DNS name a node's certificate carries: its identity to peers.
pub fn node_dns_name(node: &str) -> String {
    format!("{node}.node.herd")
}

/// A fresh key for node `node`, and a signing request for it (PEM each).
/// The key stays with the caller; only the request is sent.
pub fn node_key_and_request(node: &str) -> Result<(String, String), TlsError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec![node_dns_name(node)])?;
    params.distinguished_name.push(DnType::CommonName, node);
    let request = params.serialize_request(&key)?;
    Ok((key.serialize_pem(), request.pem()?))
}

impl ClusterCa {
    /// Signs a node's request: whatever it asks for, the certificate names
    /// only `node` (`<node>.node.herd`), for `lifetime`: no address (a
    /// caller checks the node's name, whatever it dialled, and an address
    /// would be the node's own word) and never [`API_DNS_NAME`], so it
    /// serves the node's endpoint to peers and passes for nothing else.
    /// Returns the chain (leaf, then the CA), PEM.
    pub fn sign_node(
        &self,
        request_pem: &str,
        node: &str,
        now: SystemTime,
        lifetime: Duration,
    ) -> Result<String, TlsError> {
        let mut request = rcgen::CertificateSigningRequestParams::from_pem(request_pem)?;
        let mut params = CertificateParams::new(vec![node_dns_name(node)])?;
        params.distinguished_name.push(DnType::CommonName, node);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, now, lifetime);
        request.params = params;
        let cert = request.signed_by(&self.issuer)?;
        Ok(format!("{}{}", cert.pem(), self.cert_pem))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_survives_its_pem_and_keeps_its_hash() {
        let now = SystemTime::now();
        let ca = ClusterCa::generate(now).unwrap();
        let again = ClusterCa::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
        assert_eq!(ca.hash(), again.hash());
        assert!(ca.hash().to_string().starts_with("sha256:") && ca.hash().to_string().len() == 7 + 64);
        let other = ClusterCa::generate(now).unwrap();
        assert_ne!(ca.hash(), other.hash());
        let served =
            again.issue("server", &["127.0.0.1".into(), "localhost".into()], now, Duration::from_secs(60)).unwrap();
        assert_eq!(served.chain_pem.matches("BEGIN CERTIFICATE").count(), 2, "leaf and CA");
    }

    #[test]
    fn a_node_request_is_signed_for_that_node_only_and_a_forged_one_is_refused() {
        let now = SystemTime::now();
        let ca = ClusterCa::generate(now).unwrap();
        let (key, request) = node_key_and_request("node-1").unwrap();
        assert!(key.contains("PRIVATE KEY") && !request.contains("PRIVATE KEY"));
        let chain = ca.sign_node(&request, "node-1", now, Duration::from_secs(60)).unwrap();
        assert_eq!(chain.matches("BEGIN CERTIFICATE").count(), 2);
        let mut damaged = request.clone();
        let middle = damaged.len() / 2;
        damaged.replace_range(middle..middle + 4, "AAAA");
        assert!(ca.sign_node(&damaged, "node-1", now, Duration::from_secs(60)).is_err());
    }
}
