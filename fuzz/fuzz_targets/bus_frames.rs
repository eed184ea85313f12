//! The bus frame decoder: arbitrary bytes through `LineCodec` in arbitrary
//! chunks, then every line through `wire::parse_line` as both directions'
//! envelopes. Nothing may panic, and whatever decodes must survive a round
//! trip through its own encoding (what the leader reads is what a follower
//! could have written).

#![no_main]

use agent_relay::framing::{Frame, LineCodec};
use agent_relay::protocol::bus::{FromLeader, ToLeader};
use agent_relay::wire::{self, Received};
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::codec::Decoder;

fuzz_target!(|data: &[u8]| {
    // The first two bytes pick the frame limit and the read size, so small
    // limits make the oversized path reachable with small inputs.
    let (max, chunk, body) = match data {
        [m, c, rest @ ..] => (usize::from(*m) * 4 + 1, usize::from(*c % 64) + 1, rest),
        _ => return,
    };
    let mut codec = LineCodec::new(max);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for piece in body.chunks(chunk) {
        buf.extend_from_slice(piece);
        while let Some(frame) = codec.decode(&mut buf).expect("the codec never fails") {
            frames.push(frame);
        }
        assert!(buf.len() <= max + 1, "buffered more than one frame");
    }
    while let Some(frame) = codec.decode_eof(&mut buf).expect("the codec never fails") {
        frames.push(frame);
    }
    for frame in frames {
        match frame {
            Frame::Line(line) => {
                assert!(line.len() <= max, "a line over the limit came out");
                assert!(!line.contains('\n'));
                round_trip::<ToLeader>(&line);
                round_trip::<FromLeader>(&line);
            }
            Frame::Oversized { len } => assert!(len > max),
            Frame::NotUtf8 => {}
        }
    }
});

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(line: &str) {
    if let Received::Envelope(envelope) = wire::parse_line::<T>(line) {
        let text = serde_json::to_string(&envelope).expect("an envelope encodes");
        match wire::parse_line::<T>(&text) {
            Received::Envelope(again) => assert_eq!(again, envelope, "{text}"),
            other => panic!("{text} does not decode again: {other:?}"),
        }
    }
}
