//! [`Following`]: a watch that follows a kind across servers. It hands out
//! the changes of objects (ADDED, MODIFIED, DELETED) from a revision on,
//! never a BOOKMARK (a bookmark only moves the revision it resumes from).
//! When its stream ends, breaks, or goes silent for [`SILENT`] (no line,
//! not even a bookmark, which the server sends every 5 s: a paused or
//! cut-off server), it watches again from the last revision seen, at the
//! next server, so that no change is missed or repeated. A watch from a
//! compacted revision is an error (410: list again).

use std::time::Duration;

use herd_core::api::{WatchEvent, WatchEventType};
use serde_json::Value;

use crate::{Client, ClientError, WatchStream};

/// How long a stream may say nothing before its server is given up.
pub const SILENT: Duration = Duration::from_secs(11);
/// How many times in a row watching again may fail before it is given up.
const TRIES: u32 = 30;

pub struct Following {
    client: Client,
    path: String,
    selector: String,
    revision: String,
    stream: Option<WatchStream>,
}

impl Following {
    pub(crate) fn new(client: Client, path: String, selector: String, revision: String) -> Following {
        Following { client, path, selector, revision, stream: None }
    }

    /// The revision the next watch would start after.
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// The next change of an object.
    pub async fn next(&mut self) -> Result<WatchEvent<Value>, ClientError> {
        let mut failures = 0;
        loop {
            let stream = match self.stream.as_mut() {
                Some(stream) => stream,
                None => match self.client.watch_path(&self.path, Some(&self.revision), &self.selector).await {
                    Ok(stream) => self.stream.insert(stream),
                    // The server's answer (410, 403...): not a server to pass.
                    Err(error) if error.reason().is_some() => return Err(error),
                    Err(error) => {
                        failures += 1;
                        if failures >= TRIES {
                            return Err(error);
                        }
                        tokio::time::sleep(Duration::from_millis(500).saturating_mul(failures.min(10))).await;
                        continue;
                    }
                },
            };
            match tokio::time::timeout(SILENT, stream.next()).await {
                // Silent: its server is paused or cut off; the next one.
                Err(_) => {
                    self.client.skip_current();
                    self.stream = None;
                }
                // Ended or broken: watch again from where it got.
                Ok(None) | Ok(Some(Err(_))) => self.stream = None,
                Ok(Some(Ok(event))) => {
                    let revision = event.object.pointer("/metadata/resourceVersion").and_then(Value::as_str);
                    match event.type_ {
                        WatchEventType::Error => {
                            let status = serde_json::from_value(event.object.clone())
                                .map_err(|e| ClientError::Protocol { url: "watch".into(), reason: e.to_string() })?;
                            return Err(ClientError::Api(status));
                        }
                        WatchEventType::Bookmark => {
                            if let Some(revision) = revision {
                                self.revision = revision.to_string();
                            }
                        }
                        _ => {
                            if let Some(revision) = revision {
                                self.revision = revision.to_string();
                            }
                            return Ok(event);
                        }
                    }
                }
            }
        }
    }
}
