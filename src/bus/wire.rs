//! Typed envelopes over a local-socket connection, on the shared line codec.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{SinkExt, StreamExt};
use interprocess::local_socket::tokio::Stream;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::framing::{Frame, LineCodec};

/// What came off the wire.
#[derive(Debug)]
pub enum Received<T> {
    Envelope(T),
    /// A line that is not a valid envelope; `id` is echoed when it could be read.
    Malformed {
        id: Option<u64>,
        error: String,
    },
    /// A frame over the limit: the peer is broken, close the connection.
    Oversized,
}

pub struct WireReader {
    inner: FramedRead<Half, LineCodec>,
}

pub struct WireWriter {
    inner: FramedWrite<Half, LineCodec>,
}

/// One side of a shared stream: `&Stream` reads and writes on its own, so
/// both halves simply hold the stream. The socket closes when both are gone.
struct Half(Arc<Stream>);

impl AsyncRead for Half {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut &*self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Half {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut &*self.0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut &*self.0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut &*self.0).poll_shutdown(cx)
    }
}

/// Splits a connection into its typed halves.
pub fn split(stream: Stream) -> (WireReader, WireWriter) {
    let stream = Arc::new(stream);
    (
        WireReader {
            inner: FramedRead::new(Half(stream.clone()), LineCodec::default()),
        },
        WireWriter {
            inner: FramedWrite::new(Half(stream), LineCodec::default()),
        },
    )
}

impl WireReader {
    /// The next envelope; `Ok(None)` at EOF.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> io::Result<Option<Received<T>>> {
        let Some(frame) = self.inner.next().await.transpose()? else {
            return Ok(None);
        };
        Ok(Some(match frame {
            Frame::Line(line) => parse_line(&line),
            Frame::NotUtf8 => Received::Malformed {
                id: None,
                error: "frame is not UTF-8".into(),
            },
            Frame::Oversized { .. } => Received::Oversized,
        }))
    }
}

/// Decodes one line into an envelope, keeping the request id of a bad one.
pub fn parse_line<T: DeserializeOwned>(line: &str) -> Received<T> {
    match serde_json::from_str::<T>(line) {
        Ok(envelope) => Received::Envelope(envelope),
        Err(e) => {
            let id = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v.get("id").and_then(serde_json::Value::as_u64));
            Received::Malformed {
                id,
                error: format!("malformed envelope: {e}"),
            }
        }
    }
}

impl WireWriter {
    /// Writes one envelope and flushes it.
    pub async fn send<T: Serialize>(&mut self, envelope: &T) -> io::Result<()> {
        let line = serde_json::to_string(envelope).map_err(io::Error::other)?;
        self.inner.send(line).await
    }

    /// Writes every envelope, flushing once at the end: one system call
    /// for a burst instead of one per frame.
    pub async fn send_all<'a, T: Serialize + 'a>(
        &mut self,
        envelopes: impl IntoIterator<Item = &'a T>,
    ) -> io::Result<()> {
        for envelope in envelopes {
            let line = serde_json::to_string(envelope).map_err(io::Error::other)?;
            self.inner.feed(line).await?;
        }
        SinkExt::<String>::flush(&mut self.inner).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::bus::ToLeader;

    #[test]
    fn malformed_envelopes_keep_their_id() {
        match parse_line::<ToLeader>(r#"{"kind":"heartbeat","id":5}"#) {
            Received::Malformed { id, error } => {
                assert_eq!(id, Some(5));
                assert!(error.contains("generation"), "{error}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_line::<ToLeader>("not json"),
            Received::Malformed { id: None, .. }
        ));
    }
}
