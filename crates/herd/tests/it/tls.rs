//! TLS with a pinned cluster CA: the server serves only TLS unless told
//! otherwise, agents and the CLI trust only the cluster's CA (by its hash or
//! its certificate), and a wrong hash or a server with another CA (someone
//! in between) is refused. Against real server and agent processes.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{ADMIN_TOKEN, JOIN_TOKEN, Proc, TestServer, eventually, herd_trusting_nothing};
use herd_client::{Client, ClientError};
use herd_core::kinds::NodeSpec;
use herd_tls::{CaHash, Trust};

fn agent(server_url: &str, data_dir: &Path, name: &str, ca_hash: Option<&str>) -> Proc {
    let mut command = herd_trusting_nothing();
    command.args(["agent", "--server", server_url, "--name", name]).arg("--data-dir").arg(data_dir);
    if let Some(hash) = ca_hash {
        command.args(["--ca-hash", hash]);
    }
    command.env("HERD_JOIN_TOKEN", JOIN_TOKEN);
    Proc::spawn(command)
}

fn pem_hash(path: &Path) -> CaHash {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CaHash::of(&CertificateDer::from_pem_file(path).unwrap())
}

#[tokio::test]
async fn the_server_serves_tls_with_the_cluster_ca_and_plain_http_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    assert!(server.url.starts_with("https://127.0.0.1:"), "{}", server.url);
    let ca_file = server.data_dir.join("ca.pem");
    assert_eq!(
        pem_hash(&ca_file).to_string(),
        server.ca_hash.clone().unwrap(),
        "ca.pem is the CA whose hash is printed"
    );

    // Trusting the CA's certificate works as well as pinning its hash.
    let pem = std::fs::read_to_string(&ca_file).unwrap();
    let by_certificate =
        Client::new(vec![server.url.clone()], Some(ADMIN_TOKEN.into())).with_trust(&Trust::Ca(pem)).unwrap();
    by_certificate.list::<NodeSpec>("").await.expect("the CA's certificate is trusted");
    server.admin().list::<NodeSpec>("").await.expect("the CA's hash is trusted");
    // A client that trusts no cluster CA is refused, and says why.
    let untrusting = Client::new(vec![server.url.clone()], Some(ADMIN_TOKEN.into()));
    let refused = untrusting.list::<NodeSpec>("").await.unwrap_err();
    assert!(matches!(refused, ClientError::Untrusted { .. }), "{refused}");
    // Plain HTTP to the TLS port gets nothing.
    let plain = format!("http://{}", server.listen_addr());
    assert!(Client::new(vec![plain], Some(ADMIN_TOKEN.into())).list::<NodeSpec>("").await.is_err());

    // The CLI: --ca-file and --ca-hash work; nothing to trust fails, exit code 1.
    let cli = |trust: &[&str]| {
        herd_trusting_nothing()
            .args(["--server", &server.url, "--token", ADMIN_TOKEN])
            .args(trust)
            .args(["get", "nodes"])
            .output()
            .unwrap()
    };
    assert!(cli(&["--ca-file", ca_file.to_str().unwrap()]).status.success());
    assert!(cli(&["--ca-hash", server.ca_hash.as_deref().unwrap()]).status.success());
    let untrusted = cli(&[]);
    assert_eq!(untrusted.status.code(), Some(1));
    let said = String::from_utf8_lossy(&untrusted.stderr);
    assert!(said.contains("no cluster CA to trust") && said.contains("--ca-hash"), "{said}");
    assert!(!said.contains("ERROR"), "no stray log line: {said}");
    // Another cluster's CA in the config file: refused, naming both CAs.
    let other = TestServer::start(&dir.path().join("other"));
    let config = dir.path().join("config.yaml");
    let other_pem = std::fs::read_to_string(other.data_dir.join("ca.pem")).unwrap();
    let file = serde_json::json!({"servers": [server.url.clone()], "token": ADMIN_TOKEN, "ca": other_pem});
    std::fs::write(&config, serde_json::to_string(&file).unwrap()).unwrap();
    let refused = cli(&["--config", config.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&refused.stderr);
    let (theirs, trusted) = (server.ca_hash.as_deref().unwrap(), other.ca_hash.as_deref().unwrap());
    assert!(said.contains(&format!("showed a CA with hash {theirs}, not the trusted CA {trusted}")), "{said}");

    // --insecure-http: plain HTTP, no CA.
    let plain_dir = tempfile::tempdir().unwrap();
    let insecure = TestServer::start_replica(plain_dir.path(), "plain", None, &["--insecure-http"]);
    assert!(insecure.url.starts_with("http://") && insecure.ca_hash.is_none(), "{}", insecure.url);
    insecure.admin().list::<NodeSpec>("").await.expect("plain HTTP when asked for");
    assert!(!plain_dir.path().join("ca.pem").exists());
}

#[tokio::test]
async fn an_agent_refuses_a_wrong_ca_hash_and_a_server_in_between_and_keeps_the_right_one() {
    let dir = tempfile::tempdir().unwrap();
    let real = TestServer::start(&dir.path().join("real"));
    let impostor = TestServer::start(&dir.path().join("impostor"));
    let (real_hash, impostor_hash) = (real.ca_hash.clone().unwrap(), impostor.ca_hash.clone().unwrap());
    assert_ne!(real_hash, impostor_hash, "another server, another CA");

    // A wrong hash: the agent refuses the real server and stops.
    let mut wrong = agent(&real.url, &dir.path().join("wrong"), "node-w", Some(&impostor_hash));
    assert!(!wrong.wait_exit(Duration::from_secs(20)).success(), "a wrong --ca-hash never joins");
    assert!(real.admin().get::<NodeSpec>("node-w").await.unwrap_err().is_not_found());

    // Someone in between (a TLS server on loopback with another CA): the
    // agent that pins the real CA tells it nothing and stops.
    let mut fooled = agent(&impostor.url, &dir.path().join("fooled"), "node-m", Some(&real_hash));
    assert!(!fooled.wait_exit(Duration::from_secs(20)).success());
    assert!(impostor.admin().list::<NodeSpec>("").await.unwrap().is_empty(), "the impostor learnt of no node");
    // And the CLI with the real CA's certificate refuses the impostor.
    let cli = herd_trusting_nothing()
        .args(["--server", &impostor.url, "--token", ADMIN_TOKEN, "--ca-file"])
        .arg(real.data_dir.join("ca.pem"))
        .args(["get", "nodes"])
        .output()
        .unwrap();
    assert!(!cli.status.success());
    assert!(String::from_utf8_lossy(&cli.stderr).contains("not the cluster API server's"), "{cli:?}");

    // With no hash and none kept, the agent says what it needs.
    let mut blind = agent(&real.url, &dir.path().join("blind"), "node-b", None);
    assert!(!blind.wait_exit(Duration::from_secs(20)).success());

    // The right hash joins, and is kept: the restarted agent needs it no more.
    let good_dir = dir.path().join("good");
    let mut good = agent(&real.url, &good_dir, "node-g", Some(&real_hash));
    let admin = real.admin();
    let boot = eventually(Duration::from_secs(20), "node-g Ready", async || {
        admin.get::<NodeSpec>("node-g").await.ok().filter(|n| n.status.ready).and_then(|n| n.status.agent_boot_id)
    })
    .await;
    good.signal("TERM");
    good.wait_exit(Duration::from_secs(10));
    let _again = agent(&real.url, &good_dir, "node-g", None);
    let started = Instant::now();
    eventually(Duration::from_secs(20), "node-g back with a new boot id", async || {
        admin
            .get::<NodeSpec>("node-g")
            .await
            .ok()
            .filter(|n| n.status.ready && n.status.agent_boot_id.as_ref() != Some(&boot))
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(20));
}

/// The node certificate an agent keeps: its chain, key and expiry.
fn kept_certificate(agent_dir: &Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(agent_dir.join("node-cert.json")).ok()?).ok()
}

/// Whether the cluster CA signed `chain_pem` for `name`.
fn signed_for(ca_hash: &str, chain_pem: &str, name: &str) -> bool {
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    let chain: Vec<CertificateDer> = CertificateDer::pem_slice_iter(chain_pem.as_bytes()).map(Result::unwrap).collect();
    let ca = chain.iter().find(|c| CaHash::of(c).to_string() == ca_hash).expect("the chain carries the CA");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider).build().unwrap();
    let name = ServerName::try_from(name.to_string()).unwrap();
    verifier.verify_server_cert(&chain[0], &[], &name, &[], UnixTime::now()).is_ok()
}

#[tokio::test]
async fn an_agent_gets_a_certificate_for_its_identity_keeps_its_key_and_renews_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_replica(&dir.path().join("server"), "r1", None, &["--agent-cert-lifetime", "6s"]);
    let hash = server.ca_hash.clone().unwrap();
    let agent_dir = dir.path().join("agent");
    let _agent = common::start_agent(&server.url, &agent_dir, "node-1");
    let admin = server.admin();
    eventually(Duration::from_secs(20), "node-1 Ready", async || {
        admin.get::<NodeSpec>("node-1").await.ok().filter(|n| n.status.ready)
    })
    .await;
    let first = eventually(Duration::from_secs(10), "a node certificate", async || kept_certificate(&agent_dir)).await;
    let chain = first["chainPem"].as_str().unwrap();
    assert!(signed_for(&hash, chain, "node-1.node.herd"), "the CA signed it for the node's identity");
    assert!(!signed_for(&hash, chain, "node-2.node.herd"), "and for no other node");
    assert!(!signed_for(&hash, chain, "127.0.0.1"), "nor for the address it reports");
    assert!(!signed_for(&hash, chain, herd_tls::trust::API_DNS_NAME), "nor as the API server");
    // The key never left the host: the server's store holds no trace of it.
    let key = first["keyPem"].as_str().unwrap();
    let key_body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
    let stored = std::fs::read(server.data_dir.join("herd.db")).unwrap();
    let needle = &key_body.as_bytes()[..40];
    assert!(!stored.windows(needle.len()).any(|w| w == needle), "the node's key is not in the server's store");

    // Two thirds into its 6 s life, the agent asks again: a new key, a later expiry.
    let renewed = eventually(Duration::from_secs(15), "a renewed certificate", async || {
        kept_certificate(&agent_dir).filter(|c| c["expires"] != first["expires"])
    })
    .await;
    assert_ne!(renewed["keyPem"], first["keyPem"], "a renewal makes a new key");
    assert!(renewed["expires"].as_str().unwrap() > first["expires"].as_str().unwrap());
    assert!(signed_for(&hash, renewed["chainPem"].as_str().unwrap(), "node-1.node.herd"));
}

/// A TLS server on loopback showing `identity` (someone in between, holding
/// a node's certificate and key): every byte a client sends it after the
/// handshake, as it reads them.
struct Impostor {
    url: String,
    read: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Impostor {
    async fn start(identity: &herd_tls::ServingIdentity) -> Impostor {
        use tokio::io::AsyncReadExt;
        let config = herd_tls::server_config(identity).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", tcp.local_addr().unwrap());
        let read = std::sync::Arc::<std::sync::Mutex<Vec<u8>>>::default();
        let into = read.clone();
        let accepting = tokio::spawn(async move {
            while let Ok((stream, _)) = tcp.accept().await {
                let (acceptor, into) = (acceptor.clone(), into.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(stream).await else { return };
                    let mut buffer = [0; 4096];
                    while let Ok(n @ 1..) = tls.read(&mut buffer).await {
                        into.lock().unwrap().extend_from_slice(&buffer[..n]);
                    }
                });
            }
        });
        Impostor { url, read, accepting }
    }

    fn heard(&self) -> String {
        String::from_utf8_lossy(&self.read.lock().unwrap()).into_owned()
    }
}

impl Drop for Impostor {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_proxy_holding_a_nodes_certificate_is_not_the_server_to_the_cli_or_a_joining_agent() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("server"));
    let hash = server.ca_hash.clone().unwrap();
    let node_dir = dir.path().join("node-2");
    let _node = common::start_agent(&server.url, &node_dir, "node-2");
    let admin = server.admin();
    eventually(Duration::from_secs(20), "node-2 Ready", async || {
        admin.get::<NodeSpec>("node-2").await.ok().filter(|n| n.status.ready)
    })
    .await;
    let kept = eventually(Duration::from_secs(10), "node-2's certificate", async || kept_certificate(&node_dir)).await;
    let stolen = herd_tls::ServingIdentity {
        chain_pem: kept["chainPem"].as_str().unwrap().into(),
        key_pem: kept["keyPem"].as_str().unwrap().into(),
    };
    let proxy = Impostor::start(&stolen).await;

    // The CLI, trusting the cluster CA by its hash or its certificate.
    let ca_file = server.data_dir.join("ca.pem");
    for trust in [["--ca-hash", hash.as_str()], ["--ca-file", ca_file.to_str().unwrap()]] {
        let cli = herd_trusting_nothing()
            .args(["--server", &proxy.url, "--token", ADMIN_TOKEN])
            .args(trust)
            .args(["get", "nodes"])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&cli.stderr);
        assert_eq!(cli.status.code(), Some(1), "the CLI refuses the proxy ({trust:?}): {said}");
        assert!(said.contains("not the cluster API server's"), "and says why: {said}");
    }

    // A new agent, pinning the CA by its hash, with a join token.
    let mut joining = agent(&proxy.url, &dir.path().join("node-3"), "node-3", Some(&hash));
    assert!(!joining.wait_exit(Duration::from_secs(20)).success(), "the agent refuses the proxy and stops");

    let heard = proxy.heard();
    assert!(heard.is_empty(), "the proxy learnt nothing (no token, no request): {heard:?}");
    assert!(!heard.contains(ADMIN_TOKEN) && !heard.contains(JOIN_TOKEN));
    // The real server still serves both clients.
    server.admin().list::<NodeSpec>("").await.expect("the server's own certificate is the server's");
}
