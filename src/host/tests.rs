//! The transport end to end: a fake host on in-memory pipes talks to
//! [`serve`] running a small test [`Handler`].

use std::sync::Mutex;

use proptest::prelude::*;
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio::sync::{Semaphore, mpsc};

use super::*;

/// Every wait in these tests is bounded by this; reaching it is a failure.
const WAIT: Duration = Duration::from_secs(10);

struct TestHandler {
    link: HostLink,
    events: mpsc::UnboundedSender<HostEvent>,
    /// `command/execute slow` waits for a permit here.
    gate: Semaphore,
    shutdowns: Mutex<Vec<ShutdownParams>>,
}

impl Handler for TestHandler {
    async fn initialize(&self, params: InitializeParams) -> Result<InitializeResult, RpcError> {
        if params.host.name == "refused" {
            return Err(RpcError {
                code: -32001,
                message: "refused".into(),
            });
        }
        Ok(InitializeResult {
            protocol_version: PROTOCOL_VERSION,
            sidecar: SidecarInfo {
                name: "agent-relay".into(),
                version: params.host.version,
            },
            commands: vec![],
            status_key: STATUS_KEY.into(),
        })
    }

    async fn execute(&self, params: ExecuteParams) -> ExecuteResult {
        match params.name.as_str() {
            "slow" => {
                let permit = self.gate.acquire().await;
                ExecuteResult::new(permit.is_ok(), "slow done")
            }
            "confirm" => {
                let confirm = ConfirmParams {
                    title: "t".into(),
                    message: "m".into(),
                    timeout_ms: None,
                };
                match self.link.confirm(&confirm, WAIT).await {
                    Ok(answer) => ExecuteResult::new(answer.confirmed, "confirmed"),
                    Err(e) => ExecuteResult::new(false, e.to_string()),
                }
            }
            "panic" => panic!("test handler asked to panic"),
            other => ExecuteResult::new(true, format!("ran {other} {}", params.args)),
        }
    }

    fn notify(&self, event: HostEvent) {
        let _ = self.events.send(event);
    }

    async fn shutdown(&self, params: ShutdownParams) {
        self.shutdowns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(params);
    }
}

/// The host's end of the pipes, plus what the test needs to look inside.
struct Host {
    to_sidecar: Option<DuplexStream>,
    from_sidecar: FramedRead<DuplexStream, LineCodec>,
    served: JoinHandle<std::io::Result<()>>,
    handler: Arc<TestHandler>,
    events: mpsc::UnboundedReceiver<HostEvent>,
}

impl Host {
    async fn start() -> Self {
        Self::start_with_permits(0).await
    }

    async fn start_with_permits(permits: usize) -> Self {
        let (to_sidecar, sidecar_in) = tokio::io::duplex(64 * 1024);
        let (sidecar_out, from_sidecar) = tokio::io::duplex(64 * 1024);
        let (events_tx, events) = mpsc::unbounded_channel();
        let (handler_tx, handler_rx) = tokio::sync::oneshot::channel();
        let served = crate::tasks::spawn(serve(sidecar_in, sidecar_out, move |link| {
            let handler = Arc::new(TestHandler {
                link,
                events: events_tx,
                gate: Semaphore::new(permits),
                shutdowns: Mutex::new(Vec::new()),
            });
            let _ = handler_tx.send(Arc::clone(&handler));
            handler
        }));
        let handler = tokio::time::timeout(WAIT, handler_rx)
            .await
            .expect("serve makes its handler")
            .expect("serve makes its handler");
        Self {
            to_sidecar: Some(to_sidecar),
            from_sidecar: FramedRead::new(from_sidecar, LineCodec::default()),
            served,
            handler,
            events,
        }
    }

    fn link(&self) -> HostLink {
        self.handler.link.clone()
    }

    async fn send_raw(&mut self, bytes: &[u8]) {
        let input = self.to_sidecar.as_mut().expect("input still open");
        tokio::time::timeout(WAIT, input.write_all(bytes))
            .await
            .expect("sidecar reads its input")
            .unwrap();
    }

    async fn send(&mut self, line: &str) {
        self.send_raw(format!("{line}\n").as_bytes()).await;
    }

    async fn send_json(&mut self, value: Value) {
        self.send(&value.to_string()).await;
    }

    /// The next line the sidecar wrote, as JSON.
    async fn recv(&mut self) -> Value {
        let frame = tokio::time::timeout(WAIT, self.from_sidecar.next())
            .await
            .expect("sidecar answers in time")
            .expect("sidecar output still open")
            .unwrap();
        match frame {
            Frame::Line(line) => serde_json::from_str(&line).unwrap(),
            other => panic!("unexpected frame {other:?}"),
        }
    }

    async fn next_event(&mut self) -> HostEvent {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("event in time")
            .expect("handler alive")
    }

    /// Closes the sidecar's input and waits for `serve` to return.
    async fn close_input(&mut self) -> std::io::Result<()> {
        self.to_sidecar.take();
        tokio::time::timeout(WAIT, &mut self.served)
            .await
            .expect("serve returns promptly after EOF")
            .expect("serve does not panic")
    }

    /// Everything the sidecar wrote until its output closed.
    async fn rest_of_output(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(frame) = tokio::time::timeout(WAIT, self.from_sidecar.next())
            .await
            .expect("output closes in time")
        {
            match frame.unwrap() {
                Frame::Line(line) => out.push(serde_json::from_str(&line).unwrap()),
                other => panic!("unexpected frame {other:?}"),
            }
        }
        out
    }
}

fn initialize(id: Value) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "initialize",
        "params": {
            "protocolVersion": 1,
            "host": {"name": "pi", "version": "0.9"},
            "pid": 42,
            "cwd": "/tmp",
            "session": {"id": "s1"},
            "hasUI": true,
            "someFutureField": [1, 2]
        }
    })
}

fn error_code(response: &Value) -> i64 {
    response["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error response: {response}"))
}

#[tokio::test]
async fn initialize_is_answered_with_the_handlers_result() {
    let mut host = Host::start().await;
    host.send_json(initialize(json!(1))).await;
    let response = host.recv().await;
    assert_eq!(
        response,
        json!({
            "jsonrpc": "2.0", "id": 1,
            "result": {
                "protocolVersion": 1,
                "sidecar": {"name": "agent-relay", "version": "0.9"},
                "commands": [],
                "statusKey": "relay"
            }
        })
    );
    host.close_input().await.unwrap();
}

#[tokio::test]
async fn handler_errors_become_the_responses_error() {
    let mut host = Host::start().await;
    let mut request = initialize(json!("init"));
    request["params"]["host"]["name"] = json!("refused");
    host.send_json(request).await;
    let response = host.recv().await;
    assert_eq!(response["id"], json!("init"));
    assert_eq!(
        response["error"],
        json!({"code": -32001, "message": "refused"})
    );
    host.close_input().await.unwrap();
}

#[tokio::test]
async fn each_error_class_has_its_code_and_id() {
    let mut host = Host::start().await;
    let cases = [
        ("{oops", -32700, Value::Null),
        ("[]", -32600, Value::Null),
        (
            r#"[{"jsonrpc":"2.0","id":1,"method":"initialize"}]"#,
            -32600,
            Value::Null,
        ),
        (
            r#"{"jsonrpc":"2.0","id":{},"method":"x"}"#,
            -32600,
            Value::Null,
        ),
        (r#"{"jsonrpc":"1.0","id":3,"method":"x"}"#, -32600, json!(3)),
        (
            r#"{"jsonrpc":"2.0","id":4,"method":false}"#,
            -32600,
            json!(4),
        ),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"nope"}"#,
            -32601,
            json!(5),
        ),
        (
            r#"{"jsonrpc":"2.0","id":6,"method":"initialize","params":{"cwd":1}}"#,
            -32602,
            json!(6),
        ),
        (
            r#"{"jsonrpc":"2.0","id":-7.5,"method":"command/execute"}"#,
            -32602,
            json!(-7.5),
        ),
    ];
    for (line, code, id) in cases {
        host.send(line).await;
        let response = host.recv().await;
        assert_eq!(error_code(&response), code, "{line} → {response}");
        assert_eq!(response["id"], id, "{line} → {response}");
        assert_eq!(response["jsonrpc"], "2.0");
    }
    host.send_raw(b"\xff\xfe\n").await;
    let response = host.recv().await;
    assert_eq!(
        (error_code(&response), &response["id"]),
        (-32700, &Value::Null)
    );
    host.close_input().await.unwrap();
}

#[tokio::test]
async fn oversized_line_is_rejected_and_the_next_request_answered() {
    let mut host = Host::start().await;
    let mut huge = vec![b'x'; crate::framing::MAX_FRAME_BYTES + 10];
    huge.push(b'\n');
    host.send_raw(&huge).await;
    let response = host.recv().await;
    assert_eq!(
        (error_code(&response), &response["id"]),
        (-32600, &Value::Null)
    );
    assert!(
        response["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1 MiB"),
        "{response}"
    );
    host.send_json(initialize(json!(2))).await;
    assert_eq!(host.recv().await["id"], 2);
    host.close_input().await.unwrap();
}

#[tokio::test]
async fn garbage_then_a_valid_request_with_crlf() {
    let mut host = Host::start().await;
    host.send("\u{0}garbage\t").await;
    assert_eq!(error_code(&host.recv().await), -32700);
    let request = format!("{}\r\n", initialize(json!("crlf")));
    host.send_raw(request.as_bytes()).await;
    let response = host.recv().await;
    assert_eq!(response["id"], "crlf");
    assert_eq!(response["result"]["statusKey"], "relay");
    host.close_input().await.unwrap();
}

#[tokio::test]
async fn notifications_reach_the_handler_typed_and_unknown_ones_are_ignored() {
    let mut host = Host::start().await;
    host.send(r#"{"jsonrpc":"2.0","method":"some/future","params":{"x":1}}"#)
        .await;
    // Unreadable params of a known notification: dropped, no answer.
    host.send(r#"{"jsonrpc":"2.0","method":"input/received","params":{"text":5}}"#)
        .await;
    host.send(r#"{"jsonrpc":"2.0","method":"initialized"}"#)
        .await;
    host.send(
        r#"{"jsonrpc":"2.0","method":"turn/ended","params":{"assistantText":"hi","toolCalls":[{"name":"bash","extra":1}],"new":true}}"#,
    )
    .await;
    host.send(
        r#"{"jsonrpc":"2.0","method":"input/received","params":{"text":"go","source":"interactive"}}"#,
    )
    .await;
    host.send(r#"{"jsonrpc":"2.0","method":"agent/ended","params":null}"#)
        .await;
    assert_eq!(host.next_event().await, HostEvent::Initialized);
    assert_eq!(
        host.next_event().await,
        HostEvent::TurnEnded(TurnEndedParams {
            aborted: false,
            assistant_text: "hi".into(),
            tool_calls: vec![ToolCall {
                name: "bash".into()
            }],
            error: None,
        })
    );
    assert_eq!(
        host.next_event().await,
        HostEvent::InputReceived(InputReceivedParams {
            text: "go".into(),
            source: "interactive".into(),
        })
    );
    assert_eq!(
        host.next_event().await,
        HostEvent::AgentEnded(AgentEndedParams::default())
    );
    // Notifications are never answered: the first line out is this answer.
    host.send_json(initialize(json!(9))).await;
    assert_eq!(host.recv().await["id"], 9);
    host.close_input().await.unwrap();
    assert!(host.events.try_recv().is_err(), "no further events");
}

#[tokio::test]
async fn a_slow_command_does_not_block_later_requests() {
    let mut host = Host::start().await;
    host.send(r#"{"jsonrpc":"2.0","id":1,"method":"command/execute","params":{"name":"slow"}}"#)
        .await;
    host.send_json(initialize(json!(2))).await;
    assert_eq!(host.recv().await["id"], 2);
    host.handler.gate.add_permits(1);
    let slow = host.recv().await;
    assert_eq!(slow["id"], 1);
    assert_eq!(slow["result"], json!({"ok": true, "message": "slow done"}));
    host.close_input().await.unwrap();
}

#[tokio::test]
async fn a_command_can_ask_the_host_while_it_runs() {
    let mut host = Host::start().await;
    host.send(
        r#"{"jsonrpc":"2.0","id":"c","method":"command/execute","params":{"name":"confirm"}}"#,
    )
    .await;
    let confirm = host.recv().await;
    assert_eq!(confirm["method"], "ui/confirm");
    assert_eq!(confirm["params"]["title"], "t");
    host.send_json(json!({"jsonrpc":"2.0","id":confirm["id"],"result":{"confirmed":true}}))
        .await;
    let done = host.recv().await;
    assert_eq!(done["id"], "c");
    assert_eq!(done["result"]["ok"], true);
    host.close_input().await.unwrap();
}

#[tokio::test]
async fn a_panicking_handler_still_answers_and_the_transport_lives_on() {
    let mut host = Host::start().await;
    host.send(r#"{"jsonrpc":"2.0","id":1,"method":"command/execute","params":{"name":"panic"}}"#)
        .await;
    let response = host.recv().await;
    assert_eq!(
        (error_code(&response), &response["id"]),
        (-32603, &json!(1))
    );
    host.send_json(initialize(json!(2))).await;
    assert_eq!(host.recv().await["id"], 2);
    host.close_input().await.unwrap();
}

#[tokio::test]
async fn shutdown_calls_the_handler_and_answers_null() {
    let mut host = Host::start().await;
    host.send(r#"{"jsonrpc":"2.0","id":1,"method":"shutdown"}"#)
        .await;
    assert_eq!(
        host.recv().await,
        json!({"jsonrpc":"2.0","id":1,"result":null})
    );
    host.send(r#"{"jsonrpc":"2.0","id":2,"method":"shutdown","params":{"reason":"quit"}}"#)
        .await;
    assert_eq!(host.recv().await["result"], Value::Null);
    host.close_input().await.unwrap();
    let shutdowns = host.handler.shutdowns.lock().unwrap().clone();
    assert_eq!(
        shutdowns,
        vec![
            ShutdownParams::default(),
            ShutdownParams {
                reason: Some("quit".into())
            }
        ]
    );
}

#[tokio::test]
async fn eof_without_shutdown_returns_ok_and_flushes_answers_in_flight() {
    let mut host = Host::start().await;
    host.send_json(initialize(json!(1))).await;
    host.close_input().await.unwrap();
    let out = host.rest_of_output().await;
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0]["id"], 1);
}

#[tokio::test]
async fn eof_abandons_requests_that_do_not_finish() {
    let mut host = Host::start().await;
    host.send(r#"{"jsonrpc":"2.0","id":1,"method":"command/execute","params":{"name":"slow"}}"#)
        .await;
    host.close_input().await.unwrap();
    assert_eq!(host.rest_of_output().await, Vec::<Value>::new());
}

fn status() -> SetStatusParams {
    SetStatusParams {
        key: STATUS_KEY.into(),
        text: Some("TG A·api ● leader".into()),
        tone: Tone::Success,
    }
}

#[tokio::test]
async fn notifications_to_the_host_have_no_id() {
    let mut host = Host::start().await;
    host.link().set_status(&status());
    assert_eq!(
        host.recv().await,
        json!({
            "jsonrpc": "2.0", "method": "ui/setStatus",
            "params": {"key": "relay", "text": "TG A·api ● leader", "tone": "success"}
        })
    );
    host.close_input().await.unwrap();
    // After the end nothing is sent, nothing blocks, nothing fails.
    host.link().set_status(&status());
}

#[tokio::test]
async fn outbound_request_answered() {
    let mut host = Host::start().await;
    let link = host.link();
    let asked = crate::tasks::spawn(async move {
        let params = SendUserMessageParams {
            text: "hello".into(),
            deliver_as: Some(DeliverAs::FollowUp),
            origin: MessageOrigin {
                chat_id: -100,
                thread_id: Some(7),
                user_id: 1,
                update_id: 99,
                message_id: None,
            },
            attachments: Vec::new(),
        };
        link.send_user_message(&params, WAIT)
            .await
            .expect("queued")
            .await
    });
    let request = host.recv().await;
    assert_eq!(request["method"], "agent/sendUserMessage");
    assert_eq!(request["params"]["deliverAs"], "followUp");
    assert_eq!(request["params"]["origin"]["threadId"], 7);
    host.send_json(json!({"jsonrpc":"2.0","id":request["id"],"result":{"accepted":true}}))
        .await;
    let answer = tokio::time::timeout(WAIT, asked).await.unwrap().unwrap();
    assert_eq!(
        answer,
        Ok(SendUserMessageResult {
            accepted: true,
            queued: false
        })
    );
    assert_eq!(host.link().pending_len(), 0);
    host.close_input().await.unwrap();
}

#[tokio::test]
async fn outbound_errors_and_malformed_answers() {
    let mut host = Host::start().await;
    let link = host.link();
    let asked = crate::tasks::spawn(async move {
        let first = link.abort(WAIT).await;
        let second = link.abort(WAIT).await;
        let third = link
            .request::<_, ConfirmResult>(method::UI_CONFIRM, &json!({}), WAIT)
            .await;
        (first, second, third)
    });
    let request = host.recv().await;
    assert_eq!(request["method"], "agent/abort");
    host.send_json(
        json!({"jsonrpc":"2.0","id":request["id"],"error":{"code":-32000,"message":"busy"}}),
    )
    .await;
    let request = host.recv().await;
    host.send_json(json!({"jsonrpc":"2.0","id":request["id"],"result":null}))
        .await;
    let request = host.recv().await;
    host.send_json(json!({"jsonrpc":"2.0","id":request["id"],"result":{"confirmed":"yes"}}))
        .await;
    let (first, second, third) = tokio::time::timeout(WAIT, asked).await.unwrap().unwrap();
    assert_eq!(
        first,
        Err(OutboundError::Rpc {
            method: "agent/abort".into(),
            code: -32000,
            message: "busy".into()
        })
    );
    assert_eq!(second, Ok(()));
    assert!(
        matches!(&third, Err(OutboundError::Decode { method, .. }) if method == "ui/confirm"),
        "{third:?}"
    );
    host.close_input().await.unwrap();
}

#[tokio::test]
async fn outbound_request_never_answered_times_out() {
    let mut host = Host::start().await;
    let link = host.link();
    let short = Duration::from_millis(20);
    let answer = link
        .request::<_, Value>(method::UI_CONFIRM, &json!({}), short)
        .await;
    assert_eq!(
        answer,
        Err(OutboundError::Timeout {
            method: "ui/confirm".into(),
            timeout: short
        })
    );
    assert_eq!(link.pending_len(), 0);
    assert_eq!(host.recv().await["method"], "ui/confirm");
    host.close_input().await.unwrap();
}

#[tokio::test]
async fn a_late_answer_is_ignored() {
    let mut host = Host::start().await;
    let link = host.link();
    let answer = link
        .request::<_, Value>(method::UI_CONFIRM, &json!({}), Duration::from_millis(20))
        .await;
    assert!(matches!(answer, Err(OutboundError::Timeout { .. })));
    let request = host.recv().await;
    host.send_json(json!({"jsonrpc":"2.0","id":request["id"],"result":{"confirmed":true}}))
        .await;
    // An answer to nothing, of a kind we never sent.
    host.send(r#"{"jsonrpc":"2.0","id":"zzz","result":1}"#)
        .await;
    // The late answers produce no output; the next line out is this answer.
    host.send_json(initialize(json!(5))).await;
    assert_eq!(host.recv().await["id"], 5);
    assert_eq!(link.pending_len(), 0);
    host.close_input().await.unwrap();
}

#[tokio::test]
async fn dropping_the_request_future_cancels_it() {
    let mut host = Host::start().await;
    let link = host.link();
    let asked = crate::tasks::spawn(async move {
        link.request::<_, Value>(method::UI_CONFIRM, &json!({}), WAIT)
            .await
    });
    // Written means registered.
    assert_eq!(host.recv().await["method"], "ui/confirm");
    assert_eq!(host.link().pending_len(), 1);
    asked.abort();
    assert!(asked.await.unwrap_err().is_cancelled());
    assert_eq!(host.link().pending_len(), 0);
    host.close_input().await.unwrap();
}

#[tokio::test]
async fn pending_requests_fail_closed_at_eof_and_later_ones_at_once() {
    let mut host = Host::start().await;
    let link = host.link();
    let asked = crate::tasks::spawn(async move {
        link.request::<_, Value>(method::UI_CONFIRM, &json!({}), WAIT)
            .await
    });
    assert_eq!(host.recv().await["method"], "ui/confirm");
    host.close_input().await.unwrap();
    let answer = tokio::time::timeout(WAIT, asked).await.unwrap().unwrap();
    assert_eq!(answer, Err(OutboundError::Closed));
    let later = host
        .link()
        .request::<_, Value>(method::AGENT_ABORT, &json!({}), WAIT)
        .await;
    assert_eq!(later, Err(OutboundError::Closed));
}

#[tokio::test]
async fn unencodable_params_are_our_error() {
    let host = Host::start().await;
    let mut params = std::collections::HashMap::new();
    params.insert((1, 2), 3);
    let answer = host
        .link()
        .request::<_, Value>(method::UI_CONFIRM, &params, WAIT)
        .await;
    assert!(
        matches!(answer, Err(OutboundError::Encode { .. })),
        "{answer:?}"
    );
    assert_eq!(host.link().pending_len(), 0);
}

// ------------------------------------------------------------------ proptest

/// A request without its id; the test gives each a unique one.
fn request_line() -> impl Strategy<Value = String> {
    let method = prop_oneof![
        Just("initialize".to_owned()),
        Just("command/execute".to_owned()),
        Just("shutdown".to_owned()),
        "[a-z/]{0,12}",
    ];
    let params = prop_oneof![
        Just(None),
        Just(Some(json!({"name": "x", "args": "y"}))),
        Just(Some(initialize(Value::Null)["params"].clone())),
        json_ish().prop_map(Some),
    ];
    (method, params).prop_map(|(method, params)| {
        let mut request = json!({"jsonrpc": "2.0", "method": method});
        if let Some(params) = params {
            request["params"] = params;
        }
        request.to_string()
    })
}

/// Small JSON values whose strings and numbers cannot spell a request id of
/// the test (those are `q<index>` and 1000 + index).
fn json_ish() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-5i64..100).prop_map(Value::from),
        "[a-p]{0,3}".prop_map(Value::from),
        Just(json!("2.0")),
        Just(json!("initialize")),
        Just(json!("turn/ended")),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::hash_map(
                prop_oneof![
                    Just("jsonrpc".to_owned()),
                    Just("id".to_owned()),
                    Just("method".to_owned()),
                    Just("params".to_owned()),
                    Just("result".to_owned()),
                    Just("error".to_owned()),
                    "[a-p]{1,3}",
                ],
                inner,
                0..5
            )
            .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

#[derive(Debug, Clone)]
enum Line {
    /// Must be answered exactly once, with the id given at assembly.
    Request(String),
    Other(String),
}

fn any_line() -> impl Strategy<Value = Line> {
    prop_oneof![
        request_line().prop_map(Line::Request),
        "[^\n]{0,40}".prop_map(Line::Other),
        json_ish().prop_map(|v| Line::Other(v.to_string())),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn every_request_gets_exactly_one_answer(
        lines in prop::collection::vec(any_line(), 0..24),
        numeric in prop::collection::vec(any::<bool>(), 24),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut host = Host::start_with_permits(1000).await;
            let mut expected = Vec::new();
            let mut input = String::new();
            for (index, line) in lines.iter().enumerate() {
                let text = match line {
                    Line::Request(text) => {
                        let id = if numeric[index] {
                            json!(1000 + index)
                        } else {
                            json!(format!("q{index}"))
                        };
                        let mut request: Value = serde_json::from_str(text).unwrap();
                        request["id"] = id.clone();
                        expected.push(id);
                        request.to_string()
                    }
                    Line::Other(text) => text.clone(),
                };
                input.push_str(&text);
                input.push('\n');
            }
            // Writing and reading concurrently: the output pipe is bounded.
            let mut to_sidecar = host.to_sidecar.take().unwrap();
            let writing = crate::tasks::spawn(async move {
                to_sidecar.write_all(input.as_bytes()).await.unwrap();
            });
            let out = host.rest_of_output().await;
            writing.await.unwrap();
            tokio::time::timeout(WAIT, &mut host.served).await.unwrap().unwrap().unwrap();
            for response in &out {
                prop_assert_eq!(&response["jsonrpc"], "2.0");
            }
            for id in &expected {
                let answers = out.iter().filter(|r| &r["id"] == id).count();
                prop_assert_eq!(answers, 1, "id {} in {:?}", id, out);
            }
            Ok(())
        })?;
    }
}

/// Waits until `ready` holds on three looks in a row 100 ms apart, failing
/// the test after [`WAIT`]. `look` also runs on every look, for invariants.
async fn settle(mut look: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut streak = 0;
    while streak < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "did not settle in time"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        streak = if look() { streak + 1 } else { 0 };
    }
}

#[tokio::test]
async fn a_host_that_stops_reading_stalls_the_sidecar_at_a_bound_and_loses_nothing() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut host = Host::start().await;
    let link = host.link();
    // Far more answers than fit the queue and both pipes (~90 bytes each).
    const TOTAL: usize = 40_000;
    let written = Arc::new(AtomicUsize::new(0));
    let mut input = host.to_sidecar.take().expect("input open");
    let writer = {
        let written = Arc::clone(&written);
        crate::tasks::spawn(async move {
            for id in 1..=TOTAL {
                let line = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"x/nope\"}}\n");
                input.write_all(line.as_bytes()).await.unwrap();
                written.store(id, Ordering::Relaxed);
            }
            input
        })
    };

    // The host reads nothing: the sidecar fills its queue and stops reading.
    let mut last = 0;
    settle(|| {
        let (queued, _) = link.outbox.queued("");
        assert!(queued <= outbound::QUEUE_BYTES, "{queued} bytes queued");
        let now = written.load(Ordering::Relaxed);
        let stalled = now == last && queued + 200 >= outbound::QUEUE_BYTES;
        last = now;
        stalled
    })
    .await;
    assert!(last < TOTAL, "the sidecar kept reading: {last}");

    // While full: status updates replace each other, other notifications
    // are dropped, nothing grows.
    for n in 0..1000 {
        link.set_status(&SetStatusParams {
            text: Some(format!("status {n}")),
            ..status()
        });
    }
    link.notify_user(&NotifyParams {
        message: "dropped".into(),
        level: NotifyLevel::Info,
    });
    let (queued, statuses) = link.outbox.queued("ui/setStatus");
    assert_eq!(statuses, 1);
    assert!(queued <= outbound::QUEUE_BYTES + 200, "{queued}");
    assert_eq!(link.outbox.dropped(), 1);

    // The host reads again: every request gets its one answer, the latest
    // status arrives, and the sidecar reads the rest of the input.
    let mut answered = std::collections::HashSet::new();
    let mut last_status = None;
    while answered.len() < TOTAL {
        let message = host.recv().await;
        match message.get("id").and_then(Value::as_u64) {
            Some(id) => assert!(answered.insert(id), "{id} answered twice"),
            None => last_status = Some(message["params"]["text"].clone()),
        }
    }
    assert_eq!(last_status, Some(json!("status 999")));
    let input = tokio::time::timeout(WAIT, writer)
        .await
        .expect("the rest of the input is read")
        .unwrap();
    drop(input);
    tokio::time::timeout(WAIT, &mut host.served)
        .await
        .expect("serve returns after EOF")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn status_updates_queued_together_arrive_as_the_latest_one() {
    let mut host = Host::start().await;
    let link = host.link();
    for n in 0..100 {
        link.set_status(&SetStatusParams {
            text: Some(format!("status {n}")),
            ..status()
        });
    }
    assert_eq!(host.recv().await["params"]["text"], "status 99");
    host.close_input().await.unwrap();
    assert_eq!(host.rest_of_output().await, Vec::<Value>::new());
}

#[tokio::test]
async fn requests_beyond_the_in_flight_limit_are_answered_busy_at_once() {
    // Every `slow` command waits for a permit that never comes.
    let mut host = Host::start().await;
    for id in 0..=MAX_IN_FLIGHT {
        host.send_json(json!({
            "jsonrpc": "2.0", "id": id, "method": "command/execute",
            "params": {"name": "slow", "args": ""}
        }))
        .await;
    }
    let busy = host.recv().await;
    assert_eq!(busy["id"], json!(MAX_IN_FLIGHT));
    assert_eq!(error_code(&busy), i64::from(message::SERVER_BUSY));
    // The reader still reads: the host's answers get through.
    host.send_json(initialize(json!("init"))).await;
    assert_eq!(host.recv().await["id"], "init");
    host.handler.gate.add_permits(MAX_IN_FLIGHT);
    let mut done = 0;
    while done < MAX_IN_FLIGHT {
        assert_eq!(host.recv().await["result"]["ok"], true);
        done += 1;
    }
}

/// Answers `echo` with its params as it got them.
struct Echo;

impl Service for Echo {
    async fn call(
        self: Arc<Self>,
        method: String,
        params: Option<Box<RawValue>>,
    ) -> Result<Box<RawValue>, RpcError> {
        match (method.as_str(), params) {
            ("echo", Some(params)) => Ok(params),
            _ => Err(RpcError {
                code: -32601,
                message: "no".into(),
            }),
        }
    }

    fn notify(&self, _: &str, _: Option<Box<RawValue>>) {}
}

#[tokio::test]
async fn ids_and_params_travel_as_the_host_wrote_them_and_answers_are_written_once() {
    let (mut to_sidecar, sidecar_in) = tokio::io::duplex(64 * 1024);
    let (sidecar_out, from_sidecar) = tokio::io::duplex(64 * 1024);
    let served = crate::tasks::spawn(serve_service(sidecar_in, sidecar_out, |_| Arc::new(Echo)));
    let mut lines = FramedRead::new(from_sidecar, LineCodec::default());
    // Parsed into a tree and printed again on the way, the id would come
    // back as `100.0` and the params as `{"a":1000.0,"b":[1.5]}`.
    let request =
        r#"{"jsonrpc":"2.0","id":1E2,"method":"echo","params":{ "a" : 1e3, "b": [ 1.50 ] }}"#;
    tokio::time::timeout(
        WAIT,
        to_sidecar.write_all(format!("{request}\n").as_bytes()),
    )
    .await
    .expect("the sidecar reads")
    .unwrap();
    let answer = tokio::time::timeout(WAIT, lines.next())
        .await
        .expect("answered in time")
        .expect("output open")
        .unwrap();
    assert_eq!(
        answer,
        Frame::Line(r#"{"jsonrpc":"2.0","id":1E2,"result":{ "a" : 1e3, "b": [ 1.50 ] }}"#.into())
    );
    drop(to_sidecar);
    tokio::time::timeout(WAIT, served)
        .await
        .expect("serve returns after EOF")
        .unwrap()
        .unwrap();
}
