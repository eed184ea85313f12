//! The host protocol, end to end: the real binary driven as a coding agent
//! would drive it.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Direction, Options, SECRET, Sidecar, WAIT};
use serde_json::{Value, json};

#[tokio::test]
async fn handshake_lists_commands_and_status_key() {
    let home = common::home();
    let mut sidecar = Sidecar::spawn(Options::new(home.path()));
    let result = sidecar.handshake("/tmp/project", "api").await;
    assert_eq!(result["protocolVersion"], 1);
    assert_eq!(result["statusKey"], "relay");
    assert_eq!(result["sidecar"]["name"], "agent-relay");
    let names: Vec<&str> = result["commands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "telegram-connect",
            "telegram-disconnect",
            "telegram-status",
            "relay"
        ]
    );
    let status = sidecar.wait_status(|_| true).await;
    assert_eq!(status, "TG ○ not configured");
}

#[tokio::test]
async fn unsupported_protocol_version_is_a_clear_error() {
    let home = common::home();
    let mut sidecar = Sidecar::spawn(Options::new(home.path()));
    let response = sidecar
        .call_raw(
            "initialize",
            json!({"protocolVersion": 0, "host": {"name": "old", "version": "0"}, "cwd": "/", "session": {"id": "x"}}),
        )
        .await;
    let message = response["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("unsupported protocolVersion 0"),
        "{response}"
    );
}

async fn expect_error(sidecar: &Sidecar, code: i64, id: Value) {
    sidecar
        .wait_for(&format!("error {code}"), move |m| {
            m["error"]["code"] == code && m["id"] == id
        })
        .await;
}

#[tokio::test]
async fn every_error_class_is_answered_and_the_stream_goes_on() {
    let home = common::home();
    let mut sidecar = Sidecar::spawn(Options::new(home.path()));

    sidecar.send_line("{not json");
    expect_error(&sidecar, -32700, Value::Null).await;

    sidecar.send_line(r#"[{"jsonrpc":"2.0","id":1,"method":"initialize"}]"#);
    expect_error(&sidecar, -32600, Value::Null).await;

    sidecar.send_line(r#"{"jsonrpc":"1.0","id":"old","method":"initialize"}"#);
    expect_error(&sidecar, -32600, json!("old")).await;

    let unknown = sidecar.call_raw("no/such/method", json!({})).await;
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");

    let bad = sidecar
        .call_raw("command/execute", json!({"name": 5}))
        .await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");

    // An oversized line is refused, and the next request is still answered.
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":"big","method":"x","params":"{}"}}"#,
        "a".repeat(1_100_000)
    );
    sidecar.send_line(&huge);
    let refused = sidecar
        .wait_for("oversized error", |m| {
            m.get("error").is_some()
                && m["error"]["message"]
                    .as_str()
                    .is_some_and(|s| s.contains("MiB"))
        })
        .await;
    assert!(refused["id"].is_null(), "{refused}");
    sidecar.send_line("\u{1}\u{2} garbage \u{7f}");
    let answered = sidecar.handshake("/tmp", "after-garbage").await;
    assert_eq!(answered["protocolVersion"], 1);

    // Unknown notifications are ignored silently; CRLF is accepted.
    sidecar.send_line(r#"{"jsonrpc":"2.0","method":"some/future/event","params":{"x":1}}"#);
    sidecar.send_line("{\"jsonrpc\":\"2.0\",\"id\":\"crlf\",\"method\":\"command/execute\",\"params\":{\"name\":\"telegram-status\"}}\r");
    let crlf = sidecar.wait_for("crlf answer", |m| m["id"] == "crlf").await;
    assert_eq!(crlf["result"]["ok"], true, "{crlf}");
    assert!(
        sidecar.garbage().is_empty(),
        "stdout must carry only protocol: {:?}",
        sidecar.garbage()
    );
}

#[tokio::test]
async fn telegram_status_reports_the_configuration_without_the_token() {
    let home = common::home();
    let mut unconfigured = Sidecar::spawn(Options::new(home.path()));
    unconfigured.handshake("/tmp", "a").await;
    let (ok, text) = unconfigured.command("/telegram-status", "").await;
    assert!(ok);
    assert!(text.contains("not configured"), "{text}");
    assert!(text.contains("config.toml"), "{text}");

    let configured_home = common::home();
    let config_dir = configured_home.path().join("config");
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::write(
        config_dir.join("config.toml"),
        format!(
            "bot_token = \"{}\"\nchat_id = -1001000000001\nauto_connect = false\n",
            common::TOKEN
        ),
    )
    .unwrap();
    let mut configured = Sidecar::spawn(Options::new(configured_home.path()));
    configured.handshake("/tmp", "b").await;
    let (ok, text) = configured.command("telegram-status", "--debug").await;
    assert!(ok);
    assert!(text.contains("bot 123456789"), "{text}");
    assert!(text.contains("chat -1001000000001"), "{text}");
    assert!(!text.contains(SECRET), "the token leaked: {text}");
    assert_eq!(configured.wait_status(|_| true).await, "TG ○ not connected");
}

#[tokio::test]
async fn a_bad_config_is_shown_and_the_sidecar_keeps_serving() {
    let home = common::home();
    let config_dir = home.path().join("config");
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::write(
        config_dir.join("config.toml"),
        "chat_id = \"not a number\"\n",
    )
    .unwrap();
    let mut sidecar = Sidecar::spawn(Options::new(home.path()));
    sidecar.handshake("/tmp", "c").await;
    assert_eq!(sidecar.wait_status(|_| true).await, "TG ⚠ config error");
    let (ok, text) = sidecar.command("telegram-status", "").await;
    assert!(ok);
    assert!(
        text.contains("config.toml") && text.contains("line 1"),
        "{text}"
    );
    let (ok, text) = sidecar.command("telegram-connect", "").await;
    assert!(!ok);
    assert!(text.contains("configuration has an error"), "{text}");
}

#[tokio::test]
async fn unknown_commands_get_usage() {
    let home = common::home();
    let mut sidecar = Sidecar::spawn(Options::new(home.path()));
    sidecar.handshake("/tmp", "d").await;
    let (ok, text) = sidecar.command("relay", "reboot").await;
    assert!(!ok);
    assert!(
        text.contains("unknown subcommand") && text.contains("/relay status | restart"),
        "{text}"
    );
}

#[tokio::test]
async fn a_long_command_does_not_block_other_requests() {
    // /telegram-disconnect waits for the host's confirmation, which this host
    // answers only after it got an answer to a later request.
    let home = common::home();
    let fake = common::fake().await;
    let mut sidecar = Sidecar::spawn(Options::new(home.path()).configured(&fake));
    sidecar.handshake("/tmp/long", "long").await;
    sidecar.wait_status(|s| s.contains("leader")).await;
    let disconnect = sidecar.call_later("command/execute", json!({"name": "telegram-disconnect"}));
    let confirm = sidecar
        .wait_for("ui/confirm", |m| m["method"] == "ui/confirm")
        .await;
    assert!(
        confirm["params"]["message"]
            .as_str()
            .unwrap()
            .contains("Delete topic A"),
        "{confirm}"
    );
    let (ok, _) = sidecar.command("telegram-status", "").await;
    assert!(ok, "a request behind a pending command must be answered");
    sidecar.send_line(
        &json!({"jsonrpc": "2.0", "id": confirm["id"], "result": {"confirmed": false}}).to_string(),
    );
    let answer = tokio::time::timeout(WAIT, disconnect)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer["result"]["ok"], false);
    assert!(
        answer["result"]["message"]
            .as_str()
            .unwrap()
            .contains("nothing changed"),
        "{answer}"
    );
}

#[tokio::test]
async fn stdin_eof_exits_cleanly_even_without_shutdown() {
    let home = common::home();
    let fake = common::fake().await;
    let mut sidecar = Sidecar::spawn(Options::new(home.path()).configured(&fake));
    sidecar.handshake("/tmp", "eof").await;
    sidecar.wait_status(|s| s.contains("leader")).await;
    sidecar.close_stdin();
    assert_eq!(sidecar.wait_exit().await, Some(0));
}

#[tokio::test]
async fn shutdown_is_answered_with_null() {
    let home = common::home();
    let mut sidecar = Sidecar::spawn(Options::new(home.path()));
    sidecar.handshake("/tmp", "bye").await;
    let result = sidecar.call("shutdown", json!({"reason": "quit"})).await;
    assert!(result.is_null());
    sidecar.close_stdin();
    assert_eq!(sidecar.wait_exit().await, Some(0));
}

/// Which schema file describes a message's params or result.
fn schema_for(method: &str, part: &str) -> Option<String> {
    let name = match method {
        "initialize" => "initialize",
        "initialized" => "initialized",
        "command/execute" => "command-execute",
        "ui/setStatus" => "ui-set-status",
        "ui/notify" => "ui-notify",
        "ui/confirm" => "ui-confirm",
        "agent/sendUserMessage" => "agent-send-user-message",
        "agent/abort" => "agent-abort",
        "file/send" => "file-send",
        "shutdown" if part == "params" => "shutdown",
        _ => return None,
    };
    Some(format!("host/{name}.{part}.schema.json"))
}

#[tokio::test]
async fn real_traffic_matches_the_checked_in_schemas() {
    let home = common::home();
    let answer: common::AutoAnswer =
        Arc::new(|method, _| (method == "ui/confirm").then(|| json!({"confirmed": false})));
    let fake = common::fake().await;
    let mut sidecar = Sidecar::spawn(Options::new(home.path()).configured(&fake).answer(answer));
    let cwd = tempfile::tempdir().unwrap();
    std::fs::write(cwd.path().join("notes.txt"), b"notes").unwrap();
    sidecar
        .handshake(cwd.path().to_str().unwrap(), "schema")
        .await;
    sidecar.wait_status(|s| s.contains("leader")).await;
    sidecar.command("telegram-status", "--debug").await;
    sidecar.command("relay", "status").await;
    // A prompt with an attachment, and a file sent back.
    let thread = common::topic(&fake, "schema").thread_id;
    fake.api()
        .inject_user_message(agent_relay::fake_bot_api::UserMessage {
            chat_id: common::CHAT,
            thread_id: Some(thread),
            user_id: common::USER,
            text: "a caption".into(),
            media: Some(agent_relay::fake_bot_api::MediaInject {
                kind: agent_relay::fake_bot_api::MediaKind::Voice,
                bytes: b"OggS".to_vec().into(),
                duration: Some(2),
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap();
    sidecar
        .wait_for("a prompt with an attachment", |m| {
            m["method"] == "agent/sendUserMessage" && m["params"]["attachments"].is_array()
        })
        .await;
    sidecar
        .call(
            "file/send",
            json!({"path": "notes.txt", "caption": "notes"}),
        )
        .await;
    sidecar.command("telegram-disconnect", "").await;
    sidecar.call("shutdown", json!({})).await;

    let traffic = sidecar.traffic();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schema");
    let mut methods_by_id = std::collections::HashMap::new();
    let mut checked = 0;
    for (direction, message) in &traffic {
        let (method, part, body): (String, &str, Value) = if let Some(method) =
            message["method"].as_str()
        {
            if let Some(id) = message.get("id") {
                methods_by_id.insert(
                    (direction_of_answer(*direction), id.to_string()),
                    method.to_string(),
                );
            }
            (
                method.to_string(),
                "params",
                message.get("params").cloned().unwrap_or(json!({})),
            )
        } else {
            let Some(method) = methods_by_id.get(&(*direction, message["id"].to_string())) else {
                continue;
            };
            if message.get("error").is_some() {
                continue;
            }
            (method.clone(), "result", message["result"].clone())
        };
        let Some(file) = schema_for(&method, part) else {
            continue;
        };
        let schema: Value =
            serde_json::from_str(&std::fs::read_to_string(root.join(&file)).unwrap()).unwrap();
        let validator = jsonschema::draft202012::new(&schema).unwrap();
        if let Err(e) = validator.validate(&body) {
            panic!("{direction:?} {method} {part} does not match {file}: {e}\n{body}");
        }
        checked += 1;
    }
    assert!(checked >= 10, "too little traffic was checked ({checked})");
}

/// Responses travel the other way from their requests.
fn direction_of_answer(request: Direction) -> Direction {
    match request {
        Direction::ToSidecar => Direction::FromSidecar,
        Direction::FromSidecar => Direction::ToSidecar,
    }
}

#[tokio::test]
async fn nothing_but_protocol_on_stdout_under_a_burst_of_requests() {
    let home = common::home();
    let mut sidecar = Sidecar::spawn(Options::new(home.path()));
    sidecar.handshake("/tmp", "burst").await;
    let waiters: Vec<_> = (0..50)
        .map(|_| sidecar.call_later("command/execute", json!({"name": "telegram-status"})))
        .collect();
    for waiter in waiters {
        let answer = tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer["result"]["ok"], true);
    }
    assert!(sidecar.garbage().is_empty());
}
