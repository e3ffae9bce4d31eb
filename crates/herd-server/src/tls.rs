//! The cluster CA as the store keeps it, and this replica's serving
//! certificate. The CA is made by the first replica that starts and kept
//! under `/secrets/ca`: its certificate in the clear, its key sealed with a
//! key derived from the admin token (`herd_tls::seal`), which every replica
//! is given. So replicas on one PostgreSQL share the CA without copying
//! files, and a copy of the store alone does not let anyone sign.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use herd_store::{Store, StoreError};
use herd_tls::seal::{Sealed, open, seal};
use herd_tls::{ClusterCa, ServingIdentity, TlsError};
use serde::{Deserialize, Serialize};

const CA_KEY: &str = "/secrets/ca";
/// A replica makes its serving certificate at start; it lasts a year.
const SERVING_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredCa {
    cert_pem: String,
    sealed_key: Sealed,
}

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("the store: {0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Tls(#[from] TlsError),
    #[error("{CA_KEY} in the store is damaged: {0}")]
    Damaged(String),
}

async fn read(store: &Store, admin_token: &str) -> Result<Option<ClusterCa>, CaError> {
    let Some(kv) = store.get(CA_KEY).await? else { return Ok(None) };
    let stored: StoredCa = serde_json::from_slice(&kv.value).map_err(|e| CaError::Damaged(e.to_string()))?;
    let key = open(admin_token, &stored.sealed_key)?;
    let key = String::from_utf8(key).map_err(|e| CaError::Damaged(e.to_string()))?;
    Ok(Some(ClusterCa::from_pem(&stored.cert_pem, &key)?))
}

/// The cluster's CA, made and stored if this is the first replica.
pub async fn cluster_ca(store: &Store, admin_token: &str) -> Result<ClusterCa, CaError> {
    if let Some(ca) = read(store, admin_token).await? {
        return Ok(ca);
    }
    let ca = ClusterCa::generate(SystemTime::now())?;
    let stored =
        StoredCa { cert_pem: ca.cert_pem().to_string(), sealed_key: seal(admin_token, ca.key_pem().as_bytes())? };
    let value = serde_json::to_vec(&stored).map_err(|e| CaError::Damaged(e.to_string()))?;
    match store.create(CA_KEY, value).await {
        Ok(_) => {
            tracing::info!(hash = %ca.hash(), "made the cluster CA");
            Ok(ca)
        }
        // Another replica made it first: use theirs.
        Err(StoreError::AlreadyExists(_)) => {
            read(store, admin_token).await?.ok_or_else(|| CaError::Damaged("it vanished".into()))
        }
        Err(other) => Err(other.into()),
    }
}

/// The names this replica is reached by: loopback, its listen address (every
/// address of the host when it listens on all), its advertised host and the
/// machine's host name.
pub fn serving_names(listen: SocketAddr, advertise_url: Option<&str>) -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    if listen.ip().is_unspecified() {
        names.extend(host_addresses().iter().map(ToString::to_string));
    } else {
        names.push(listen.ip().to_string());
    }
    if let Some(host) = advertise_url.and_then(url_host) {
        names.push(host);
    }
    if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        names.push(host.trim().to_string());
    }
    names.retain(|name| !name.is_empty());
    names.sort();
    names.dedup();
    names
}

/// The IP addresses of this host's interfaces.
fn host_addresses() -> Vec<std::net::IpAddr> {
    let mut addresses = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list it allocates, freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return addresses;
    }
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: `entry` is a node of the list getifaddrs returned, not yet freed.
        let (address, next) = unsafe { ((*entry).ifa_addr, (*entry).ifa_next) };
        if !address.is_null() {
            // SAFETY: ifa_addr points at a sockaddr whose family says its real type.
            match i32::from(unsafe { (*address).sa_family }) {
                libc::AF_INET => {
                    // SAFETY: an AF_INET address is a sockaddr_in.
                    let v4 = unsafe { *(address as *const libc::sockaddr_in) };
                    addresses.push(std::net::IpAddr::from(u32::from_be(v4.sin_addr.s_addr).to_be_bytes()));
                }
                libc::AF_INET6 => {
                    // SAFETY: an AF_INET6 address is a sockaddr_in6.
                    let v6 = unsafe { *(address as *const libc::sockaddr_in6) };
                    addresses.push(std::net::IpAddr::from(v6.sin6_addr.s6_addr));
                }
                _ => {}
            }
        }
        entry = next;
    }
    // SAFETY: `list` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    addresses
}

/// The host of `https://host:port/...`, without brackets.
fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next()?;
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']')?.0,
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    };
    Some(host.to_string())
}

/// This replica's serving certificate, for `names`.
pub fn serving_identity(ca: &ClusterCa, identity: &str, names: &[String]) -> Result<ServingIdentity, TlsError> {
    ca.issue_api_server(&format!("herd server {identity}"), names, SystemTime::now(), SERVING_LIFETIME)
}

/// Signs nodes' certificates with the cluster CA: at join, and on renewal
/// through heartbeats; each answer also carries the key grants are
/// verified with.
pub struct NodeCertificates {
    pub ca: ClusterCa,
    /// How long a node's certificate lasts (`--agent-cert-lifetime`).
    pub lifetime: Duration,
    pub grant_key: String,
}

impl NodeCertificates {
    /// A certificate for `node` if `report` carries a signing request; 422
    /// naming `csr` if the request is not one.
    pub fn answer(
        &self,
        node: &str,
        report: &herd_core::api::AgentReport,
    ) -> Result<Option<herd_core::api::NodeCertificate>, crate::error::ApiError> {
        let Some(request) = &report.csr else { return Ok(None) };
        let now = SystemTime::now();
        let chain_pem = self.ca.sign_node(request, node, now, self.lifetime).map_err(|e| {
            let errors =
                herd_core::ValidationErrors::single("csr", format!("not a signing request this CA can sign: {e}"));
            crate::error::ApiError::invalid(<herd_core::kinds::NodeSpec as herd_core::Resource>::KIND, node, errors)
        })?;
        let expires = herd_core::Timestamp::from_system_time(now + self.lifetime);
        tracing::info!(node, %expires, "signed a node certificate");
        Ok(Some(herd_core::api::NodeCertificate { chain_pem, expires }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replicas_share_one_ca_and_only_the_admin_token_opens_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("s.db").to_str().unwrap()).await.unwrap();
        let first = cluster_ca(&store, "admin").await.unwrap();
        let second = cluster_ca(&store, "admin").await.unwrap();
        assert_eq!(first.hash(), second.hash(), "the second replica uses the stored CA");
        let stored = store.get(CA_KEY).await.unwrap().unwrap();
        let text = String::from_utf8_lossy(&stored.value);
        assert!(!text.contains("PRIVATE KEY"), "the key is not in the store in the clear: {text}");
        let wrong = cluster_ca(&store, "another admin").await.err().expect("another admin token cannot open it");
        assert!(wrong.to_string().contains("another admin token"), "{wrong}");
    }

    #[test]
    fn names_cover_loopback_the_listen_address_and_the_advertised_host() {
        let names = serving_names("10.1.2.3:7700".parse().unwrap(), Some("https://herd.example:7700"));
        for want in ["localhost", "127.0.0.1", "10.1.2.3", "herd.example"] {
            assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
        }
        assert_eq!(url_host("https://[fd00::1]:7700/x").as_deref(), Some("fd00::1"));
        let everywhere = serving_names("0.0.0.0:7700".parse().unwrap(), None);
        assert!(host_addresses().iter().all(|a| everywhere.contains(&a.to_string())), "{everywhere:?}");
    }
}
