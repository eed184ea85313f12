//! The stdio transport: arbitrary bytes as the host's stdin, read in
//! arbitrary chunks by the real `host::serve` with a handler that answers at
//! once. Nothing may panic, stdout must carry JSON-RPC only, and every line
//! gets what docs/DESIGN.md ("The host protocol") promises: a request
//! exactly one answer with its own id, a notification or a response
//! nothing, anything else one error.

#![no_main]

use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use agent_relay::framing::{Frame, LineCodec};
use agent_relay::host::{self, Handler, HostEvent, RpcError};
use agent_relay::protocol::host::{
    ExecuteParams, ExecuteResult, InitializeParams, InitializeResult, PROTOCOL_VERSION, STATUS_KEY,
    ShutdownParams, SidecarInfo,
};
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio_util::codec::Decoder;

struct Answering;

impl Handler for Answering {
    async fn initialize(&self, _: InitializeParams) -> Result<InitializeResult, RpcError> {
        Ok(InitializeResult {
            protocol_version: PROTOCOL_VERSION,
            sidecar: SidecarInfo {
                name: "fuzz".into(),
                version: "0".into(),
            },
            commands: Vec::new(),
            status_key: STATUS_KEY.into(),
        })
    }

    async fn execute(&self, params: ExecuteParams) -> ExecuteResult {
        ExecuteResult::new(true, params.name)
    }

    fn notify(&self, _: HostEvent) {}

    async fn shutdown(&self, _: ShutdownParams) {}
}

/// Hands out at most `chunk` bytes per read, as a pipe may.
struct Chunked {
    data: Vec<u8>,
    at: usize,
    chunk: usize,
}

impl AsyncRead for Chunked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let end = (self.at + self.chunk.min(buf.remaining())).min(self.data.len());
        buf.put_slice(&self.data[self.at..end]);
        self.at = end;
        Poll::Ready(Ok(()))
    }
}

/// What the transport owes one input line.
enum Owed {
    /// An answer carrying this id.
    Answer(Value),
    /// An error answer (id `null` or the offending message's valid id).
    Error,
    Nothing,
}

/// The spec of docs/DESIGN.md, "The host protocol", written out
/// independently of `host::message`.
fn owed(frame: &Frame) -> Owed {
    let Frame::Line(line) = frame else {
        return Owed::Error;
    };
    let Ok(Value::Object(object)) = serde_json::from_str::<Value>(line) else {
        return Owed::Error;
    };
    let id = object.get("id");
    let valid_id = id.is_none_or(|id| id.is_string() || id.is_number() || id.is_null());
    if object.get("jsonrpc") != Some(&Value::from("2.0")) || !valid_id {
        return Owed::Error;
    }
    match (object.get("method"), id) {
        (Some(Value::String(_)), Some(id)) => Owed::Answer(id.clone()),
        (Some(Value::String(_)), None) => Owed::Nothing,
        (Some(_), _) => Owed::Error,
        (None, Some(_)) if object.contains_key("result") || object.contains_key("error") => {
            Owed::Nothing
        }
        (None, _) => Owed::Error,
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((first, body)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(*first % 32) + 1;

    // What the host sent, split as the transport splits it.
    let mut codec = LineCodec::default();
    let mut buf = BytesMut::from(body);
    let mut frames = Vec::new();
    while let Some(frame) = codec.decode_eof(&mut buf).expect("the codec never fails") {
        frames.push(frame);
    }

    let input = Chunked {
        data: body.to_vec(),
        at: 0,
        chunk,
    };
    let (output, mut stdout) = tokio::io::duplex(64 * 1024);
    let written = runtime().block_on(async move {
        let serving = host::serve(input, output, |_link| Arc::new(Answering));
        let mut written = Vec::new();
        let (served, read) = tokio::join!(serving, stdout.read_to_end(&mut written));
        served.expect("reading from memory cannot fail");
        read.expect("reading the duplex cannot fail");
        written
    });

    let text = std::str::from_utf8(&written).expect("stdout is UTF-8");
    let mut answers: Vec<Value> = text
        .lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line).expect("stdout carries JSON only");
            assert_eq!(value["jsonrpc"], "2.0", "{line}");
            assert!(
                value.get("result").is_some() != value.get("error").is_some(),
                "{line}"
            );
            value
        })
        .collect();

    let mut errors = 0;
    for frame in &frames {
        match owed(frame) {
            Owed::Answer(id) => {
                let at = answers
                    .iter()
                    .position(|a| a.get("id") == Some(&id))
                    .unwrap_or_else(|| panic!("request {id} got no answer: {text}"));
                answers.swap_remove(at);
            }
            Owed::Error => errors += 1,
            Owed::Nothing => {}
        }
    }
    assert_eq!(answers.len(), errors, "answers left over: {answers:?}");
});
