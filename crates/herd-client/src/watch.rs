//! Reading a watch stream: one JSON object per line.

use bytes::{Buf, BytesMut};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use herd_core::api::WatchEvent;
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::ClientError;

pub struct WatchStream {
    body: BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: BytesMut,
}

impl WatchStream {
    pub(crate) fn new(response: reqwest::Response) -> Self {
        WatchStream { body: response.bytes_stream().boxed(), buffer: BytesMut::new() }
    }

    /// The next event; None when the server ended the stream.
    pub async fn next(&mut self) -> Option<Result<WatchEvent<Value>, ClientError>> {
        self.next_as().await
    }

    /// The next event with its object as JSON text, checked but not
    /// decoded: a watcher that wants only some objects, or wants them
    /// typed, decodes those once.
    pub async fn next_raw(&mut self) -> Option<Result<WatchEvent<Box<RawValue>>, ClientError>> {
        self.next_as().await
    }

    async fn next_as<T: DeserializeOwned>(&mut self) -> Option<Result<WatchEvent<T>, ClientError>> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line = self.buffer.split_to(end + 1);
                let line = &line[..end];
                if line.is_empty() {
                    continue;
                }
                return Some(
                    serde_json::from_slice(line)
                        .map_err(|e| ClientError::Protocol { url: "watch".into(), reason: e.to_string() }),
                );
            }
            match self.body.next().await? {
                Ok(chunk) => self.buffer.extend_from_slice(chunk.chunk()),
                Err(e) => return Some(Err(ClientError::Protocol { url: "watch".into(), reason: e.to_string() })),
            }
        }
    }
}
