//! Helpers shared by the integration tests of `loom-http`: a Server-Sent Events client over a
//! reqwest response body, and a small image to upload.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;

/// One SSE frame: its `id:`, `event:` and the JSON of its `data:`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Frame {
    pub(crate) id: Option<String>,
    pub(crate) event: Option<String>,
    pub(crate) data: Value,
}

impl Frame {
    /// The frame's `id:` as the event's seq.
    pub(crate) fn seq(&self) -> u64 {
        self.id.as_deref().unwrap().parse().unwrap()
    }
}

/// An SSE stream read frame by frame.
pub(crate) struct Sse {
    pub(crate) body:
        std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    pub(crate) buffer: Vec<u8>,
}

impl Sse {
    /// Reads the frames of `response`'s body.
    pub(crate) fn new(response: reqwest::Response) -> Sse {
        Sse {
            body: Box::pin(response.bytes_stream()),
            buffer: Vec::new(),
        }
    }

    /// The next frame, or `None` when the server ended the stream.
    pub(crate) async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                // Whole frames only: a chunk may end inside a multi-byte character.
                let bytes: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let block = String::from_utf8(bytes).unwrap();
                let mut frame = Frame {
                    id: None,
                    event: None,
                    data: Value::Null,
                };
                let mut data = String::new();
                for line in block.lines() {
                    if line.starts_with(':') || line.is_empty() {
                        continue;
                    }
                    let (field, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match field {
                        "id" => frame.id = Some(value.to_owned()),
                        "event" => frame.event = Some(value.to_owned()),
                        "data" => data.push_str(value),
                        other => panic!("unexpected SSE field {other}"),
                    }
                }
                if data.is_empty() && frame.event.is_none() {
                    continue; // a keep-alive comment
                }
                frame.data = serde_json::from_str(&data).unwrap();
                return Some(frame);
            }
            let chunk = tokio::time::timeout(Duration::from_secs(20), self.body.next())
                .await
                .expect("the SSE stream stalled")?
                .unwrap();
            self.buffer.extend_from_slice(&chunk);
        }
    }

    /// Every remaining frame, until the server ends the stream.
    pub(crate) async fn rest(&mut self) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some(frame) = self.next().await {
            frames.push(frame);
        }
        frames
    }
}

/// A 1×1 PNG.
pub(crate) const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0xf0,
    0x1f, 0x00, 0x05, 0x00, 0x01, 0xff, 0x89, 0x99, 0x3d, 0x1d, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];
