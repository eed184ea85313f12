//! Rate limits over every send kind and edits, the counters, and transport.

use super::*;

#[tokio::test]
async fn sends_of_every_kind_and_edits_share_a_groups_budget() {
    let h = harness_with(FakeConfig {
        rate_limits: true,
        ..FakeConfig::default()
    })
    .await;
    let first = h
        .ok("sendMessage", json!({"chat_id": FORUM, "text": "0"}))
        .await;
    for i in 1..19 {
        h.ok("sendMessage", json!({"chat_id": FORUM, "text": i}))
            .await;
    }
    let form = Form::new()
        .field("chat_id", FORUM)
        .file("document", "a.txt", "text/plain", b"a");
    assert_eq!(h.upload("sendDocument", form).await.0, 200);
    // Twenty messages: the edit is the twenty-first thing this minute.
    let edit = json!({"chat_id": FORUM, "message_id": first["message_id"], "text": "edited"});
    let response = h
        .http
        .post(format!("{}/editMessageText", h.server.bot_url()))
        .json(&edit)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status().as_u16(), 429);
    let header = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .expect("a Retry-After header");
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["parameters"]["retry_after"], json!(header));
    assert!((1..=60).contains(&header), "{body}");
    let markup = json!({"chat_id": FORUM, "message_id": first["message_id"], "reply_markup": {"inline_keyboard": [[{"text": "x", "callback_data": "x"}]]}});
    assert_eq!(h.error("editMessageReplyMarkup", markup).await.0, 429);
    assert_eq!(
        h.api
            .message(FORUM, first["message_id"].as_i64().unwrap_or(0))
            .map(|m| m.edited),
        Some(false),
        "a refused edit changes nothing"
    );
    // The private chat has its own budget.
    h.ok("sendMessage", json!({"chat_id": USER, "text": "hi"}))
        .await;

    let stats = h.api.stats();
    let counters: Vec<ChatCounters> = stats.chats;
    assert_eq!(
        counters,
        [
            ChatCounters {
                chat_id: FORUM,
                sent: 20,
                edited: 0,
                rate_limited: 2
            },
            ChatCounters {
                chat_id: USER,
                sent: 1,
                edited: 0,
                rate_limited: 0
            },
        ]
    );
}

#[tokio::test]
async fn edits_are_counted_without_rate_limits_and_injected_429s_carry_retry_after() {
    let h = harness().await;
    let sent = h
        .ok("sendMessage", json!({"chat_id": USER, "text": "v1"}))
        .await;
    for text in ["v2", "v3"] {
        h.ok(
            "editMessageText",
            json!({"chat_id": USER, "message_id": sent["message_id"], "text": text}),
        )
        .await;
    }
    let (_, stats) = h.control("stats", None).await;
    assert_eq!(
        stats["chats"],
        json!([{"chat_id": USER, "sent": 1, "edited": 2, "rate_limited": 0}])
    );

    h.api
        .inject_fault("sendMessage", Fault::TooManyRequests { retry_after: 5 }, 1);
    let response = h
        .http
        .post(format!("{}/sendMessage", h.server.bot_url()))
        .json(&json!({"chat_id": USER, "text": "x"}))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status().as_u16(), 429);
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("5")
    );
}

#[tokio::test]
async fn accepted_connections_get_tcp_nodelay() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("an address");
    let (client, accepted) = tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
    let _client = client.expect("connect");
    let (mut stream, _) = accepted.expect("accept");
    assert!(
        !stream.nodelay().expect("readable option"),
        "off by default"
    );
    configure_accepted(&mut stream);
    assert!(stream.nodelay().expect("readable option"));
}
