//! Watch streams: JSON lines of `{"type": ..., "object": ...}`, keyed by
//! store revision, with a BOOKMARK every few seconds carrying how far the
//! watch got; `timeoutSeconds` ends it cleanly after that long. With a label selector, objects entering the selection are
//! ADDED and objects leaving it DELETED (`herd_core::selection`). A watch from a compacted revision gets 410 Gone; compaction
//! overtaking a running watch ends it with an ERROR line carrying 410. `batchMillis` sends the changes that come within
//! that long of one another as one chunk: a browser following a thousand nodes' heartbeats pays per chunk, not per byte.

use std::collections::{HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use herd_core::API_VERSION;
use herd_core::api::{WatchEvent, WatchEventType};
use herd_core::labels::{JsonPrefilter, LabelSelector};
use herd_core::selection::{Change, ChangeKind, SelectionTracker};
use herd_store::{EventKind, ListOptions, PartitionWatch, Revision, StoreError, WatchBatch, Watcher};
use serde_json::json;

use super::AppState;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::objects::{collection_prefix, stored_json, stored_labels};
use crate::registry::KindInfo;

const BOOKMARK_INTERVAL: Duration = Duration::from_secs(5);

/// Counts an open watch for as long as it lives.
struct Active(Arc<Metrics>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.watches_active.dec();
    }
}

/// Where a watch's events come from.
pub enum Source {
    /// A store watch of the kind's whole collection.
    Collection,
    /// One node's Commands, routed to it (`AppState::node_commands`): a
    /// thousand agents' watches cost one look at each Command event, and
    /// carry only the events that ask something of the agent.
    NodeCommands(String),
}

enum Feed {
    Collection(Watcher),
    Partition(PartitionWatch),
}

impl Feed {
    async fn next(&mut self) -> Result<WatchBatch, StoreError> {
        match self {
            Feed::Collection(watcher) => watcher.next().await,
            Feed::Partition(watch) => watch.next().await,
        }
    }

    fn revision(&mut self) -> Revision {
        match self {
            Feed::Collection(watcher) => watcher.revision(),
            Feed::Partition(watch) => watch.revision(),
        }
    }
}

/// What a watch asks for besides its selection.
pub struct WatchOptions {
    /// After this revision (None: from now).
    pub from: Option<u64>,
    /// The stream ends by itself after this long (`timeoutSeconds`).
    pub timeout: Option<Duration>,
    /// Changes within this long of the first of a chunk go in that chunk
    /// (`batchMillis`; None: each as it comes).
    pub batch: Option<Duration>,
}

/// The most bytes one batched chunk gathers before it goes.
const MAX_BATCH_BYTES: usize = 1 << 20;

struct WatchState {
    feed: Feed,
    /// `WatchOptions::batch`.
    batch: Option<Duration>,
    kind: KindInfo,
    selection: SelectionTracker,
    /// The selector's scan, made once.
    prefilter: JsonPrefilter,
    pending: VecDeque<Bytes>,
    bookmarks: tokio::time::Interval,
    state: AppState,
    done: bool,
    /// When the stream ends by itself (`timeoutSeconds`), if ever.
    ends: Option<tokio::time::Instant>,
    _active: Active,
}

fn line<T: serde::Serialize>(event: &WatchEvent<T>) -> Bytes {
    let mut bytes = Vec::new();
    push_line(&mut bytes, event);
    Bytes::from(bytes)
}

/// Appends `event`'s line to `lines`.
fn push_line<T: serde::Serialize>(lines: &mut Vec<u8>, event: &WatchEvent<T>) {
    if serde_json::to_writer(&mut *lines, event).is_ok() {
        lines.push(b'\n');
    }
}

impl WatchState {
    fn bookmark(&mut self) -> Bytes {
        let object = json!({
            "apiVersion": API_VERSION,
            "kind": self.kind.kind,
            "metadata": { "resourceVersion": self.feed.revision().to_string() }
        });
        line(&WatchEvent { type_: WatchEventType::Bookmark, object })
    }

    /// Waits for the next lines to send; false when the stream should end.
    async fn fill(&mut self) -> bool {
        let ends = self.ends;
        let timed_out = async move {
            match ends {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.state.shutdown.cancelled() => false,
            _ = timed_out => false,
            _ = self.bookmarks.tick() => {
                let bookmark = self.bookmark();
                self.pending.push_back(bookmark);
                true
            }
            batch = self.feed.next() => {
                // A batch's lines go out as one chunk: one write, not one each.
                let mut lines = Vec::new();
                let mut next = batch;
                let until = self.batch.map(|window| tokio::time::Instant::now() + window);
                loop {
                    match next {
                        Ok(batch) => self.push_batch(&mut lines, batch),
                        Err(error) => {
                            let status = ApiError::from_store(self.kind.kind, "", error).status();
                            push_line(&mut lines, &WatchEvent { type_: WatchEventType::Error, object: status });
                            self.done = true;
                            break;
                        }
                    }
                    let Some(until) = until.filter(|_| lines.len() < MAX_BATCH_BYTES) else { break };
                    // The feed's next is cancel-safe: what did not come in time comes next chunk.
                    match tokio::time::timeout_at(until, self.feed.next()).await {
                        Ok(more) => next = more,
                        Err(_) => break,
                    }
                }
                if !lines.is_empty() {
                    self.pending.push_back(Bytes::from(lines));
                }
                true
            }
        }
    }

    /// Appends the lines of `batch`'s events that this watch delivers.
    fn push_batch(&mut self, lines: &mut Vec<u8>, batch: WatchBatch) {
        for event in batch.events {
            let kind = match event.kind {
                EventKind::Delete => ChangeKind::Deleted,
                EventKind::Put if event.is_create() => ChangeKind::Created,
                EventKind::Put => ChangeKind::Modified,
            };
            // Most events of a selective watch are not its own:
            // turned away by a scan, their labels are not parsed.
            let labels =
                if self.prefilter.may_match(&event.value) { stored_labels(&event.value) } else { Default::default() };
            let change = Change { key: &event.key, labels: &labels, revision: event.revision, kind };
            let Some(type_) = self.selection.classify(change) else { continue };
            match stored_json(&event.value, &event.key, event.revision) {
                Ok(object) => push_line(lines, &WatchEvent { type_, object }),
                Err(error) => tracing::error!(%error, "skipping an unreadable stored object in a watch"),
            }
        }
    }
}

/// The keys matching `selector` now, for telling objects that leave or
/// enter the selection (nothing to read without a selector).
async fn seed_selection(
    state: &AppState,
    kind: KindInfo,
    selector: LabelSelector,
) -> Result<SelectionTracker, ApiError> {
    if selector.is_empty() {
        return Ok(SelectionTracker::new(selector, HashSet::new(), 0));
    }
    let page = state
        .objects
        .store()
        .list(&collection_prefix(kind.plural), &ListOptions::default(), |kv| {
            selector.matches(&stored_labels(&kv.value))
        })
        .await
        .map_err(|e| ApiError::from_store(kind.kind, "", e))?;
    let matching = page.items.into_iter().map(|kv| kv.key).collect();
    Ok(SelectionTracker::new(selector, matching, page.revision))
}

pub async fn stream(
    state: AppState,
    kind: KindInfo,
    selector: LabelSelector,
    WatchOptions { from, timeout, batch }: WatchOptions,
    source: Source,
) -> Result<Response, ApiError> {
    let from = from.unwrap_or_else(|| state.objects.store().head());
    let feed = match source {
        Source::Collection => {
            state.objects.store().watch(&collection_prefix(kind.plural), from).await.map(Feed::Collection)
        }
        Source::NodeCommands(node) => state.node_commands.watch(&node, from).await.map(Feed::Partition),
    }
    .map_err(|e| ApiError::from_store(kind.kind, "", e))?;
    let prefilter = selector.json_prefilter();
    let selection = seed_selection(&state, kind, selector).await?;
    state.metrics.watches_active.inc();
    let mut bookmarks = tokio::time::interval(BOOKMARK_INTERVAL);
    bookmarks.reset();
    let initial = WatchState {
        feed,
        batch,
        kind,
        selection,
        prefilter,
        pending: VecDeque::new(),
        bookmarks,
        _active: Active(state.metrics.clone()),
        state,
        done: false,
        ends: timeout.map(|t| tokio::time::Instant::now() + t),
    };
    let body = futures_util::stream::unfold(initial, |mut watch| async move {
        loop {
            if let Some(next) = watch.pending.pop_front() {
                return Some((Ok::<_, Infallible>(next), watch));
            }
            if watch.done || !watch.fill().await {
                return None;
            }
        }
    });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(body)).into_response())
}
