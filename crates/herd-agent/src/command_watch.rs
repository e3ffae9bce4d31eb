//! Watching this node's Commands: list, then watch from the list's
//! revision, and list again whenever the watch ends. Every Command seen
//! goes to the executor, which acts only on new issued attempts.

use std::sync::Arc;
use std::time::Duration;

use herd_client::Client;
use herd_core::api::WatchEventType;
use herd_core::kinds::Command;
use tokio_util::sync::CancellationToken;

use crate::credentials::CredentialStore;
use crate::executor::Executor;

const RETRY: Duration = Duration::from_secs(1);
/// How often to look again for the node's credentials before it joined:
/// Commands may be waiting for it the moment it has.
const JOIN_POLL: Duration = Duration::from_millis(20);

/// Why a list-and-watch ended.
enum Ended {
    NotJoined,
    Failed(String),
}

pub async fn run(
    client: Client,
    store: CredentialStore,
    node: String,
    executor: Arc<Executor>,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let outcome = tokio::select! {
            _ = stop.cancelled() => return,
            outcome = watch_once(&client, &store, &node, &executor) => outcome,
        };
        let pause = match outcome {
            Ended::NotJoined => JOIN_POLL,
            Ended::Failed(reason) => {
                tracing::debug!(%reason, "watching this node's commands; retrying");
                RETRY
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// One list-and-watch, until the watch ends.
async fn watch_once(client: &Client, store: &CredentialStore, node: &str, executor: &Arc<Executor>) -> Ended {
    let credentials = match store.load(node) {
        Ok(Some(credentials)) => credentials,
        Ok(None) => return Ended::NotJoined,
        Err(error) => return Ended::Failed(error.to_string()),
    };
    match list_and_watch(client, credentials.node_token, node, executor).await {
        Ok(()) => Ended::Failed("the watch stream ended".into()),
        Err(reason) => Ended::Failed(reason),
    }
}

async fn list_and_watch(
    client: &Client,
    node_token: String,
    node: &str,
    executor: &Arc<Executor>,
) -> Result<(), String> {
    let client = client.with_token(Some(node_token));
    let list = client.node_commands(node).await.map_err(|e| e.to_string())?;
    for command in list.items {
        executor.accept(command);
    }
    let mut watch =
        client.watch_node_commands(node, &list.metadata.resource_version).await.map_err(|e| e.to_string())?;
    while let Some(event) = watch.next_raw().await {
        let event = event.map_err(|e| e.to_string())?;
        match event.type_ {
            WatchEventType::Added | WatchEventType::Modified => {
                match serde_json::from_str::<Command>(event.object.get()) {
                    Ok(command) => executor.accept(command),
                    Err(error) => tracing::warn!(%error, "a command on the watch does not parse"),
                }
            }
            WatchEventType::Error => return Err(format!("the watch ended: {}", event.object.get())),
            WatchEventType::Deleted | WatchEventType::Bookmark => {}
        }
    }
    Ok(())
}
