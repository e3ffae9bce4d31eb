//! The soak's etcd clients: each writes unique values to and reads a few
//! keys through the members' HTTP gateway (`/v3/kv/put`, `/v3/kv/range`,
//! linearizable by default), recording every operation with the moments
//! it was invoked and completed. A write whose answer did not come is of
//! unknown outcome; a read without an answer tells nothing and is left
//! out. The history goes through `herd_bench::linearizable`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::linearizable::{Operation, RegisterInput};
use crate::schedule::SplitMix64;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long an operation may take before its outcome is unknown.
const TIMEOUT: Duration = Duration::from_secs(2);
const KEYS: u64 = 4;

pub type History = Vec<Operation<RegisterInput, Option<String>>>;

/// What the clients recorded, and where they send their operations.
#[derive(Clone)]
pub struct Recorder {
    history: Arc<Mutex<History>>,
    /// The members' client addresses (`host:port`), as herd last said.
    endpoints: Arc<Mutex<Vec<String>>>,
    /// The soak's clock: operations' times are from it.
    clock: Instant,
}

impl Recorder {
    pub fn new(endpoints: Vec<String>, clock: Instant) -> Self {
        Recorder { history: Arc::default(), endpoints: Arc::new(Mutex::new(endpoints)), clock }
    }

    fn now(&self) -> u64 {
        self.clock.elapsed().as_nanos() as u64
    }

    /// Sends the operations to these members from now on.
    pub fn set_endpoints(&self, endpoints: Vec<String>) {
        *self.endpoints.lock().unwrap_or_else(|p| p.into_inner()) = endpoints;
    }

    pub fn history(&self) -> History {
        self.history.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Runs client `id` until `stop`: an operation every `pause`.
    pub async fn run(self, id: u64, seed: u64, pause: Duration, stop: tokio_util::sync::CancellationToken) {
        let mut random = SplitMix64::new(seed ^ id.wrapping_mul(0x9E37_79B9));
        let mut n = 0u64;
        while !stop.is_cancelled() {
            let endpoints = self.endpoints.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if endpoints.is_empty() {
                tokio::time::sleep(pause).await;
                continue;
            }
            let endpoint = endpoints[random.below(endpoints.len() as u64) as usize].clone();
            let key = format!("soak-{}", random.below(KEYS));
            let write = random.below(2) == 0;
            n += 1;
            let call = self.now();
            let operation = if write {
                let value = format!("c{id}-{n}");
                let answered = tokio::time::timeout(TIMEOUT, put(&endpoint, &key, &value)).await;
                let ret = matches!(answered, Ok(Ok(()))).then(|| self.now());
                // A write that never reached a server did not happen.
                if matches!(answered, Ok(Err(Failure::Refused))) {
                    None
                } else {
                    Some(Operation { key, input: RegisterInput::Write(value), output: None, call, ret })
                }
            } else {
                match tokio::time::timeout(TIMEOUT, get(&endpoint, &key)).await {
                    Ok(Ok(value)) => {
                        Some(Operation { key, input: RegisterInput::Read, output: value, call, ret: Some(self.now()) })
                    }
                    _ => None,
                }
            };
            if let Some(operation) = operation {
                self.history.lock().unwrap_or_else(|p| p.into_inner()).push(operation);
            }
            tokio::time::sleep(pause).await;
        }
    }
}

/// Why an operation has no answer.
#[derive(Debug)]
enum Failure {
    /// The request never reached the server (its connection was refused).
    Refused,
    /// No answer: it may or may not have been done.
    Unknown,
}

async fn put(endpoint: &str, key: &str, value: &str) -> Result<(), Failure> {
    let body = serde_json::json!({"key": STANDARD.encode(key), "value": STANDARD.encode(value)});
    let (status, _) = post(endpoint, "/v3/kv/put", &body).await?;
    // Anything but a 200 may still be applied (etcd's "request timed
    // out" is a 503 too): its outcome is not known.
    match status {
        200 => Ok(()),
        _ => Err(Failure::Unknown),
    }
}

async fn get(endpoint: &str, key: &str) -> Result<Option<String>, Failure> {
    let body = serde_json::json!({"key": STANDARD.encode(key)});
    let (status, answer) = post(endpoint, "/v3/kv/range", &body).await?;
    if status != 200 {
        return Err(Failure::Unknown);
    }
    let value = answer["kvs"][0]["value"].as_str();
    match value {
        None => Ok(None),
        Some(encoded) => {
            let bytes = STANDARD.decode(encoded).map_err(|_| Failure::Unknown)?;
            Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
        }
    }
}

/// One HTTP/1.1 POST of JSON on a connection of its own; the status and
/// the JSON answer.
async fn post(endpoint: &str, path: &str, body: &serde_json::Value) -> Result<(u16, serde_json::Value), Failure> {
    let mut stream = TcpStream::connect(endpoint).await.map_err(|_| Failure::Refused)?;
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.map_err(|_| Failure::Unknown)?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.map_err(|_| Failure::Unknown)?;
    let text = String::from_utf8_lossy(&answer);
    let (head, rest) = text.split_once("\r\n\r\n").ok_or(Failure::Unknown)?;
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or(Failure::Unknown)?;
    // The gateway may answer in chunks: the JSON is from the first `{`
    // to the last `}`.
    let json = match (rest.find('{'), rest.rfind('}')) {
        (Some(start), Some(end)) if end >= start => serde_json::from_str(&rest[start..=end]).unwrap_or_default(),
        _ => serde_json::Value::Null,
    };
    Ok((status, json))
}
