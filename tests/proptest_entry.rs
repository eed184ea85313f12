//! The entry points that read bytes from other processes, under proptest:
//! the line codec (stdio and the bus) and the bus envelope decoder. The same
//! entry points are fuzzed under `fuzz/`; these run in every `cargo test`.

use agent_relay::framing::{Frame, LineCodec};
use agent_relay::protocol::bus::*;
use agent_relay::wire::{self, Received};
use bytes::BytesMut;
use proptest::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio_util::codec::Decoder;

// ------------------------------------------------------------------ the codec

/// Feeds `input` to `codec` in pieces of the given sizes (cycled), then EOF.
fn decode_in_chunks(codec: &mut LineCodec, input: &[u8], chunks: &[usize]) -> Vec<Frame> {
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut sizes = chunks.iter().cycle();
    let mut rest = input;
    while !rest.is_empty() {
        let size = (*sizes.next().unwrap_or(&1)).clamp(1, rest.len());
        let (piece, tail) = rest.split_at(size);
        rest = tail;
        buf.extend_from_slice(piece);
        while let Some(frame) = codec.decode(&mut buf).expect("decoding never fails") {
            frames.push(frame);
        }
    }
    while let Some(frame) = codec.decode_eof(&mut buf).expect("decoding never fails") {
        frames.push(frame);
    }
    frames
}

/// What the framing contract says `input` is: split at `\n`, a trailing
/// `\r` dropped, an unterminated last line still a line, a line over `max`
/// oversized, a line that is not UTF-8 a frame of its own.
fn expected_frames(input: &[u8], max: usize) -> Vec<Frame> {
    let mut segments: Vec<&[u8]> = input.split(|b| *b == b'\n').collect();
    // The piece after the last `\n` is a line only if something is in it.
    if segments.last().is_some_and(|last| last.is_empty()) {
        segments.pop();
    }
    segments
        .into_iter()
        .map(|segment| {
            let content = segment.strip_suffix(b"\r").unwrap_or(segment);
            if content.len() > max {
                // `len` is only "how many bytes were seen": checked apart.
                Frame::Oversized { len: 0 }
            } else {
                match std::str::from_utf8(content) {
                    Ok(line) => Frame::Line(line.to_owned()),
                    Err(_) => Frame::NotUtf8,
                }
            }
        })
        .collect()
}

/// Lines made of bytes the codec treats specially more often than chance would.
fn line_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            4 => b'a'..=b'z',
            1 => Just(b'\r'),
            1 => Just(0xff_u8),
            1 => Just(0xc3_u8),
            1 => Just(0xa9_u8),
        ],
        0..48,
    )
}

fn stream_bytes() -> impl Strategy<Value = Vec<u8>> {
    (prop::collection::vec(line_bytes(), 0..8), any::<bool>()).prop_map(|(lines, terminated)| {
        let mut out = lines.join(&b'\n');
        if terminated && !out.is_empty() {
            out.push(b'\n');
        }
        out
    })
}

proptest! {
    #[test]
    fn arbitrary_bytes_in_arbitrary_chunks_never_break_the_codec(
        input in prop::collection::vec(any::<u8>(), 0..2048),
        chunks in prop::collection::vec(1usize..300, 1..8),
        max in 1usize..200,
    ) {
        let frames = decode_in_chunks(&mut LineCodec::new(max), &input, &chunks);
        let newlines = input.iter().filter(|b| **b == b'\n').count();
        prop_assert!(frames.len() <= newlines + 1);
    }

    #[test]
    fn lines_are_the_input_split_whatever_the_chunking(
        input in stream_bytes(),
        chunks in prop::collection::vec(1usize..64, 1..8),
        max in 1usize..40,
    ) {
        let got = decode_in_chunks(&mut LineCodec::new(max), &input, &chunks);
        let want = expected_frames(&input, max);
        prop_assert_eq!(got.len(), want.len(), "{:?} vs {:?}", got, want);
        for (got, want) in got.iter().zip(&want) {
            match (got, want) {
                (Frame::Oversized { len }, Frame::Oversized { .. }) => prop_assert!(*len > max),
                _ => prop_assert_eq!(got, want),
            }
        }
    }

    #[test]
    fn chunking_never_changes_what_comes_out(
        input in prop::collection::vec(any::<u8>(), 0..1024),
        chunks in prop::collection::vec(1usize..100, 1..8),
        max in 1usize..100,
    ) {
        let whole = decode_in_chunks(&mut LineCodec::new(max), &input, &[input.len().max(1)]);
        let pieces = decode_in_chunks(&mut LineCodec::new(max), &input, &chunks);
        let lines = |frames: &[Frame]| -> Vec<Option<String>> {
            frames.iter().map(|f| match f {
                Frame::Line(l) => Some(l.clone()),
                Frame::NotUtf8 => Some("\u{fffd}not utf-8".into()),
                Frame::Oversized { .. } => None,
            }).collect()
        };
        prop_assert_eq!(lines(&whole), lines(&pieces));
    }
}

// ------------------------------------------------------------------ envelopes

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{0,10}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn slot() -> impl Strategy<Value = Slot> {
    (0..Slot::ALL).prop_map(|i| Slot::from_index(i).expect("in range"))
}

fn route() -> impl Strategy<Value = Route> {
    (
        "[a-f0-9]{1,16}",
        slot(),
        prop::option::of((any::<i64>(), any::<i64>())),
        ".{0,20}",
    )
        .prop_map(|(profile_key, slot, target, topic_name)| Route {
            profile_key,
            slot,
            target: target.map(|(chat_id, thread_id)| Target { chat_id, thread_id }),
            topic_name,
        })
}

fn to_leader() -> impl Strategy<Value = ToLeader> {
    let register = (
        any::<u64>(),
        ".{0,36}",
        any::<u64>(),
        ".{0,16}",
        ".{0,16}",
        ".{0,32}",
        any::<u32>(),
        prop::option::of(route()),
        any::<bool>(),
    )
        .prop_map(
            |(id, instance_id, generation, profile_key, session_name, cwd, pid, carried, retry)| {
                ToLeader::Register(Register {
                    id,
                    instance_secret: instance_id.chars().rev().collect(),
                    instance_id,
                    registration_generation: generation,
                    profile_key,
                    session_name,
                    cwd,
                    pid,
                    carried,
                    protocol_version: BUS_PROTOCOL_VERSION,
                    retry_provisioning: retry,
                    left: None,
                    launch: None,
                })
            },
        );
    prop_oneof![
        register,
        (any::<u64>(), any::<u64>())
            .prop_map(|(id, generation)| ToLeader::Heartbeat(Heartbeat { id, generation })),
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            prop::collection::vec(route(), 0..3)
        )
            .prop_map(|(id, generation, observed_epoch, routes)| {
                ToLeader::Reconcile(Reconcile {
                    id,
                    generation,
                    observed_epoch,
                    routes,
                })
            }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(id, generation)| ToLeader::Disconnect(Disconnect { id, generation })),
        (any::<u64>(), any::<u64>(), topic_op(), any::<bool>()).prop_map(
            |(id, generation, op, background)| ToLeader::Topic(TopicRequest {
                id,
                generation,
                op,
                background
            })
        ),
        (any::<u64>(), any::<u64>()).prop_map(|(generation, delivery_id)| {
            ToLeader::DeliveryAck(DeliveryAck {
                generation,
                delivery_id,
            })
        }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(id, generation)| ToLeader::Restart(Restart { id, generation })),
        any::<u64>().prop_map(|id| ToLeader::Status(StatusQuery { id, cluster: false })),
        (any::<u64>(), any::<u64>())
            .prop_map(|(id, generation)| ToLeader::Pair(Pair { id, generation })),
        (any::<u64>(), any::<u64>(), any::<i64>()).prop_map(|(id, generation, update_id)| {
            ToLeader::Fetch(Fetch {
                id,
                generation,
                update_id,
            })
        }),
    ]
}

fn attachment_kind() -> impl Strategy<Value = AttachmentKind> {
    prop::sample::select(vec![
        AttachmentKind::Photo,
        AttachmentKind::Document,
        AttachmentKind::Voice,
        AttachmentKind::Audio,
        AttachmentKind::Video,
        AttachmentKind::VideoNote,
        AttachmentKind::Animation,
    ])
}

fn inbound_attachment() -> impl Strategy<Value = InboundAttachment> {
    (
        attachment_kind(),
        prop::option::of(".{0,20}"),
        prop::option::of("[a-z]{1,8}/[a-z0-9.+-]{1,12}"),
        prop::option::of(any::<u64>()),
        prop::option::of(any::<u32>()),
    )
        .prop_map(
            |(kind, name, mime_type, size, duration_s)| InboundAttachment {
                kind,
                name,
                mime_type,
                size,
                duration_s,
            },
        )
}

fn keyboard() -> impl Strategy<Value = Keyboard> {
    prop::collection::vec(
        prop::collection::vec(
            (".{0,12}", ".{0,70}").prop_map(|(text, data)| Button { text, data }),
            0..3,
        ),
        0..3,
    )
    .prop_map(|rows| Keyboard { rows })
}

fn topic_op() -> impl Strategy<Value = TopicOp> {
    let format = prop::sample::select(vec![TextFormat::Html, TextFormat::Plain]);
    prop_oneof![
        (
            ".{0,60}",
            format.clone(),
            prop::option::of(keyboard()),
            prop::option::of(any::<i64>())
        )
            .prop_map(
                |(text, format, buttons, reply_to)| TopicOp::SendText(SendText {
                    text,
                    format,
                    buttons,
                    reply_to
                })
            ),
        (
            any::<i64>(),
            ".{0,60}",
            format,
            prop::option::of(keyboard())
        )
            .prop_map(
                |(message_id, text, format, buttons)| TopicOp::EditText(EditText {
                    message_id,
                    text,
                    format,
                    buttons
                })
            ),
        (any::<i64>(), prop::option::of(keyboard())).prop_map(|(message_id, buttons)| {
            TopicOp::EditButtons(EditButtons {
                message_id,
                buttons,
            })
        }),
        Just(TopicOp::Typing),
        (
            "[0-9a-f]{0,32}",
            ".{0,40}",
            prop::collection::vec(".{0,12}", 0..4),
            any::<bool>(),
            any::<u64>(),
            prop_oneof![
                Just(Concerns::Anyone),
                prop::option::of(any::<i64>())
                    .prop_map(|requester| Concerns::Approval { requester }),
                Just(Concerns::Owners),
            ]
        )
            .prop_map(
                |(token, text, options, free_text, expires_in_ms, concerns)| TopicOp::Ask(Ask {
                    token,
                    text,
                    options,
                    free_text,
                    expires_in_ms,
                    concerns
                })
            ),
        (".{0,32}", any::<i64>(), ".{0,20}").prop_map(|(token, message_id, outcome)| {
            TopicOp::CloseAsk(CloseAsk {
                token,
                message_id,
                outcome,
            })
        }),
        (
            prop_oneof![
                ".{0,40}".prop_map(FileSource::Path),
                (".{0,16}", ".{0,60}").prop_map(|(name, text)| FileSource::Text { name, text }),
            ],
            prop::option::of(".{0,30}"),
            prop::option::of(prop::sample::select(vec![SendAs::Photo, SendAs::Document])),
        )
            .prop_map(|(source, caption, send_as)| {
                TopicOp::SendFile(SendFile {
                    source,
                    caption,
                    send_as,
                })
            }),
    ]
}

fn bus_error_code() -> impl Strategy<Value = BusErrorCode> {
    prop::sample::select(vec![
        BusErrorCode::BadFrame,
        BusErrorCode::ProtocolVersion,
        BusErrorCode::StaleGeneration,
        BusErrorCode::NotRegistered,
        BusErrorCode::NoFreeSlot,
        BusErrorCode::Forbidden,
        BusErrorCode::NoTopic,
        BusErrorCode::TopicGone,
        BusErrorCode::CommitUnknown,
        BusErrorCode::Telegram,
        BusErrorCode::Unavailable,
        BusErrorCode::FileRefused,
        BusErrorCode::FileTooBig,
        BusErrorCode::Paced,
        BusErrorCode::Internal,
    ])
}

fn from_leader() -> impl Strategy<Value = FromLeader> {
    let error =
        (bus_error_code(), ".{0,30}").prop_map(|(code, message)| BusError { code, message });
    let outcome = prop_oneof![json_value().prop_map(Ok), error.prop_map(Err)];
    let ack = (prop::option::of(any::<u64>()), any::<u64>(), outcome)
        .prop_map(|(id, epoch, outcome)| FromLeader::Ack(Ack { id, epoch, outcome }));
    let deliver = (
        any::<u64>(),
        any::<i64>(),
        any::<i64>(),
        prop::option::of(any::<i64>()),
        any::<i64>(),
        any::<i64>(),
        ".{0,40}",
        prop::option::of(any::<i64>()),
        prop::collection::vec(inbound_attachment(), 0..3),
        prop::option::of("[0-9]{1,12}"),
        any::<bool>(),
    )
        .prop_map(
            |(
                delivery_id,
                update_id,
                chat_id,
                thread_id,
                user_id,
                message_id,
                text,
                reply_to,
                attachments,
                media_group_id,
                scheduled,
            )| {
                FromLeader::Deliver(Deliver {
                    delivery_id,
                    update_id,
                    message: InboundMessage {
                        chat_id,
                        thread_id,
                        user_id,
                        message_id,
                        text,
                        reply_to,
                        attachments,
                        media_group_id,
                        scheduled,
                    },
                })
            },
        );
    let health = prop_oneof![
        Just(Health::Ok),
        Just(Health::Starting),
        Just(Health::Conflict),
        ".{0,20}".prop_map(|reason| Health::Offline { reason }),
        Just(Health::Unauthorized),
        any::<u32>().prop_map(|pending| Health::Deaf { pending }),
    ]
    .prop_map(FromLeader::Health);
    let restarting = (
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        prop::collection::vec(".{0,12}", 0..4),
    )
        .prop_map(|(epoch, expected_instances, expected_routes, expected)| {
            FromLeader::Restarting(Restarting {
                epoch,
                expected_instances,
                expected_routes,
                expected,
                machines: Vec::new(),
            })
        });
    let paired = any::<i64>().prop_map(|user_id| FromLeader::Paired(Paired { user_id }));
    let paced = (any::<u64>(), any::<u64>())
        .prop_map(|(id, wait_ms)| FromLeader::Paced(Paced { id, wait_ms }));
    let cluster = (".{0,12}", any::<bool>(), prop::option::of(".{0,12}")).prop_map(
        |(node, up, polled_by)| {
            FromLeader::Cluster(ClusterLink {
                node,
                state: if up {
                    ClusterLinkState::Up
                } else {
                    ClusterLinkState::Down
                },
                reason: (!up).then(|| "unreachable".to_string()),
                polled_by,
            })
        },
    );
    prop_oneof![ack, deliver, health, restarting, paired, paced, cluster]
}

/// One way to damage an envelope's JSON.
#[derive(Debug, Clone)]
enum Mutation {
    DropField(usize),
    ReplaceField(usize, Value),
    AddField(String, Value),
    RenameKind(String),
    Truncate(usize),
    InsertByte(usize, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::DropField),
        (any::<usize>(), json_value()).prop_map(|(i, v)| Mutation::ReplaceField(i, v)),
        ("[a-zA-Z]{1,12}", json_value()).prop_map(|(k, v)| Mutation::AddField(k, v)),
        "[a-zA-Z]{0,12}".prop_map(Mutation::RenameKind),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::InsertByte(i, b)),
    ]
}

/// The envelope's line after `mutation`. Byte damage may leave invalid UTF-8;
/// such a line never reaches `decode` (the codec makes it `NotUtf8`), so it is
/// read lossily here.
fn mutate(envelope: &Value, mutation: &Mutation) -> String {
    let mut object = envelope.as_object().cloned().unwrap_or_default();
    let keys: Vec<String> = object.keys().cloned().collect();
    let pick = |i: usize| keys.get(i % keys.len().max(1)).cloned();
    match mutation {
        Mutation::DropField(i) => {
            if let Some(key) = pick(*i) {
                object.remove(&key);
            }
        }
        Mutation::ReplaceField(i, value) => {
            if let Some(key) = pick(*i) {
                object.insert(key, value.clone());
            }
        }
        Mutation::AddField(key, value) => {
            object.insert(key.clone(), value.clone());
        }
        Mutation::RenameKind(kind) => {
            object.insert("kind".into(), json!(kind));
        }
        Mutation::Truncate(at) => {
            let text = Value::Object(object).to_string();
            let at = at % (text.len() + 1);
            return String::from_utf8_lossy(&text.as_bytes()[..at]).into_owned();
        }
        Mutation::InsertByte(at, byte) => {
            let mut bytes = Value::Object(object).to_string().into_bytes();
            let at = at % (bytes.len() + 1);
            bytes.insert(at, *byte);
            return String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    Value::Object(object).to_string()
}

/// Decodes `line` as `T` and checks what `decode` promises either way.
fn check_decode<T>(line: &str) -> Result<(), TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    match wire::parse_line::<T>(line) {
        Received::Envelope(envelope) => {
            // Whatever is accepted re-encodes to something accepted as the same.
            let text = serde_json::to_string(&envelope).expect("envelopes encode");
            match wire::parse_line::<T>(&text) {
                Received::Envelope(again) => prop_assert_eq!(again, envelope),
                other => prop_assert!(false, "{text} does not decode again: {other:?}"),
            }
        }
        Received::Malformed { id, error } => {
            // A bad request keeps its id so the answer can name it.
            let sent = serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|v| v.get("id").and_then(Value::as_u64));
            prop_assert_eq!(id, sent);
            prop_assert!(error.starts_with("malformed envelope"), "{}", error);
        }
        Received::Oversized => prop_assert!(false, "decode never reports a size"),
    }
    Ok(())
}

proptest! {
    #[test]
    fn valid_envelopes_to_the_leader_round_trip(envelope in to_leader()) {
        let line = serde_json::to_string(&envelope).expect("encodes");
        prop_assert!(!line.contains('\n'), "an envelope is one line");
        match wire::parse_line::<ToLeader>(&line) {
            Received::Envelope(decoded) => prop_assert_eq!(decoded, envelope),
            other => prop_assert!(false, "{line} was refused: {other:?}"),
        }
    }

    #[test]
    fn valid_envelopes_from_the_leader_round_trip(envelope in from_leader()) {
        let line = serde_json::to_string(&envelope).expect("encodes");
        prop_assert!(!line.contains('\n'), "an envelope is one line");
        match wire::parse_line::<FromLeader>(&line) {
            Received::Envelope(decoded) => prop_assert_eq!(decoded, envelope),
            other => prop_assert!(false, "{line} was refused: {other:?}"),
        }
    }

    #[test]
    fn arbitrary_strings_never_break_the_decoder(line in ".{0,200}") {
        check_decode::<ToLeader>(&line)?;
        check_decode::<FromLeader>(&line)?;
    }

    #[test]
    fn arbitrary_json_never_breaks_the_decoder(
        value in json_value(),
        kind in prop::sample::select(vec![
            "register", "heartbeat", "reconcile", "disconnect", "topic",
            "deliveryAck", "restart", "status", "pair",
            "ack", "deliver", "restarting", "health", "paired",
        ]),
        id in any::<u64>(),
    ) {
        let mut object = value.as_object().cloned().unwrap_or_default();
        object.insert("kind".into(), json!(kind));
        object.insert("id".into(), json!(id));
        let line = Value::Object(object).to_string();
        check_decode::<ToLeader>(&line)?;
        check_decode::<FromLeader>(&line)?;
    }

    #[test]
    fn mutated_envelopes_never_break_the_decoder(
        to in to_leader(),
        from in from_leader(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        for envelope in [
            serde_json::to_value(&to).expect("encodes"),
            serde_json::to_value(&from).expect("encodes"),
        ] {
            let mut line = envelope.to_string();
            for mutation in &mutations {
                let value = serde_json::from_str::<Value>(&line).unwrap_or(Value::Null);
                line = mutate(&value, mutation);
            }
            check_decode::<ToLeader>(&line)?;
            check_decode::<FromLeader>(&line)?;
        }
    }
}

// ------------------------------------------------------------------ the phone's commands

/// Numbers as a person might type them: tiny, huge, negative, with units.
fn typed_number() -> impl Strategy<Value = String> {
    let digits = prop_oneof![
        "[0-9]{1,3}",
        "[0-9]{15,25}",
        Just("18446744073709551615".to_string()),
        Just("2305843009213693952".to_string()),
    ];
    let unit = prop_oneof![
        Just(""),
        Just("s"),
        Just("m"),
        Just("h"),
        Just("d"),
        Just("w"),
        Just("y"),
        Just("ms"),
    ];
    (
        prop_oneof![Just(""), Just("+"), Just("-"), Just("in ")],
        digits,
        unit,
    )
        .prop_map(|(sign, n, unit)| format!("{sign}{n}{unit}"))
}

proptest! {
    /// What `fuzz/fuzz_targets/phone_commands.rs` checks, in every `cargo
    /// test`: no text panics the readers of `/every` and `/at`, and what they
    /// accept is within the range the leader's schedules hold (an interval of
    /// 5 s to 366 days; a time not past, at most 366 days and a day ahead).
    #[test]
    fn a_typed_schedule_is_in_range_or_refused(
        number in typed_number(),
        rest in "[ -~]{0,20}",
        anything in any::<String>(),
    ) {
        use agent_relay::phone::{LONGEST, SHORTEST, When, read_at, read_every};
        use chrono::TimeZone;
        let now = chrono::Local.timestamp_opt(1_800_000_000, 0).single().expect("a time");
        for text in [format!("{number} {rest}"), anything.clone()] {
            if let Ok((When::Every(every), _)) = read_every(&text) {
                prop_assert!((SHORTEST..=LONGEST).contains(&every), "{text:?}: {every:?}");
            }
            if let Ok((at, _)) = read_at(&text, now) {
                let ahead = at - now.timestamp_millis();
                prop_assert!(ahead >= 0, "{text:?}");
                prop_assert!(ahead <= LONGEST.as_millis() as i64 + 26 * 3_600_000, "{text:?}");
            }
        }
    }
}
