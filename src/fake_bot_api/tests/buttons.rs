//! Inline keyboards, callback queries and replies.

use super::*;

fn approval_buttons() -> Value {
    json!({"inline_keyboard": [[
        {"text": "Allow", "callback_data": "allow:7"},
        {"text": "Deny", "callback_data": "deny:7"},
    ]]})
}

fn message_id(message: &Value) -> i64 {
    message["message_id"].as_i64().expect("a message id")
}

#[tokio::test]
async fn buttons_are_kept_with_the_message_and_an_edit_without_markup_drops_them() {
    let h = harness().await;
    let thread_id = h.create_topic(FORUM, "A · api").await;
    let sent = h
        .ok(
            "sendMessage",
            json!({"chat_id": FORUM, "message_thread_id": thread_id, "text": "Run rm -rf build?", "reply_markup": approval_buttons()}),
        )
        .await;
    assert_eq!(sent["reply_markup"], approval_buttons());
    let id = message_id(&sent);
    let stored = h.api.message(FORUM, id).expect("stored");
    assert_eq!(stored.reply_markup, Some(approval_buttons()));

    let edited = h
        .ok(
            "editMessageText",
            json!({"chat_id": FORUM, "message_id": id, "text": "Run rm -rf build? Denied"}),
        )
        .await;
    assert!(edited.get("reply_markup").is_none(), "{edited}");
    let stored = h.api.message(FORUM, id).expect("stored");
    assert_eq!(stored.reply_markup, None);
    assert_eq!(stored.plain_text, "Run rm -rf build? Denied");
    let versions: Vec<(&str, &str, bool)> = stored
        .history
        .iter()
        .map(|v| {
            (
                v.method.as_str(),
                v.plain_text.as_str(),
                v.reply_markup.is_some(),
            )
        })
        .collect();
    assert_eq!(
        versions,
        [
            ("sendMessage", "Run rm -rf build?", true),
            ("editMessageText", "Run rm -rf build? Denied", false),
        ]
    );
    assert!(stored.history[0].at_ms <= stored.history[1].at_ms);
}

#[tokio::test]
async fn markup_may_come_as_a_json_string_from_a_form() {
    let h = harness().await;
    let markup = json!({"inline_keyboard": [[
        {"text": "Docs", "url": "https://example.org/docs", "callback_data": "ignored"},
    ]]});
    let response = h
        .http
        .post(format!("{}/sendMessage", h.server.bot_url()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "chat_id={FORUM}&text=read&reply_markup={}",
            urlencode(&markup.to_string())
        ))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status().as_u16(), 200);
    // A button with both actions keeps the url, as Telegram does.
    let kept = json!({"inline_keyboard": [[{"text": "Docs", "url": "https://example.org/docs"}]]});
    assert_eq!(h.api.messages(FORUM, None)[0].reply_markup, Some(kept));
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn bad_markup_is_refused_and_nothing_is_sent() {
    let h = harness().await;
    let long_data = json!({"inline_keyboard": [[{"text": "x", "callback_data": "d".repeat(65)}]]});
    let send = |markup: Value| json!({"chat_id": FORUM, "text": "q", "reply_markup": markup});
    assert_eq!(
        h.error("sendMessage", send(long_data)).await,
        (400, "Bad Request: BUTTON_DATA_INVALID".to_owned())
    );
    assert_eq!(
        h.error("sendMessage", send(json!("{\"inline_keyboard\": [[")))
            .await,
        (
            400,
            "Bad Request: can't parse reply keyboard markup JSON object".to_owned()
        )
    );
    assert!(h.api.messages(FORUM, None).is_empty());
}

#[tokio::test]
async fn edit_message_reply_markup_changes_and_removes_buttons() {
    let h = harness().await;
    let sent = h
        .ok(
            "sendMessage",
            json!({"chat_id": USER, "text": "Allow?", "reply_markup": approval_buttons()}),
        )
        .await;
    let id = message_id(&sent);
    let only_allow = json!({"inline_keyboard": [[{"text": "Allow", "callback_data": "allow:7"}]]});
    let changed = h
        .ok(
            "editMessageReplyMarkup",
            json!({"chat_id": USER, "message_id": id, "reply_markup": only_allow}),
        )
        .await;
    assert_eq!(changed["reply_markup"], only_allow);
    assert_eq!(changed["text"], json!("Allow?"));
    let (status, description) = h
        .error(
            "editMessageReplyMarkup",
            json!({"chat_id": USER, "message_id": id, "reply_markup": only_allow}),
        )
        .await;
    assert_eq!(status, 400);
    assert!(
        description.starts_with("Bad Request: message is not modified: "),
        "{description}"
    );
    let removed = h
        .ok(
            "editMessageReplyMarkup",
            json!({"chat_id": USER, "message_id": id}),
        )
        .await;
    assert!(removed.get("reply_markup").is_none(), "{removed}");
    assert!(
        h.error(
            "editMessageReplyMarkup",
            json!({"chat_id": USER, "message_id": id, "reply_markup": {"inline_keyboard": []}}),
        )
        .await
        .1
        .starts_with("Bad Request: message is not modified")
    );
    let stored = h.api.message(USER, id).expect("stored");
    assert_eq!(stored.reply_markup, None);
    assert_eq!(stored.history.len(), 3);
    assert!(stored.edited);

    let user_message = h.api.inject_user_message(UserMessage {
        chat_id: USER,
        user_id: USER,
        text: "mine".to_owned(),
        ..UserMessage::default()
    });
    let theirs = user_message.expect("injected").message_id;
    assert_eq!(
        h.error(
            "editMessageReplyMarkup",
            json!({"chat_id": USER, "message_id": theirs, "reply_markup": only_allow}),
        )
        .await
        .1,
        "Bad Request: message can't be edited"
    );
    assert_eq!(
        h.error(
            "editMessageReplyMarkup",
            json!({"chat_id": USER, "message_id": 9999}),
        )
        .await
        .1,
        "Bad Request: message to edit not found"
    );
}

#[tokio::test]
async fn a_tap_arrives_as_telegram_sends_it_and_every_answer_is_recorded() {
    let h = harness().await;
    let thread_id = h.create_topic(FORUM, "A · api").await;
    let sent = h
        .ok(
            "sendMessage",
            json!({"chat_id": FORUM, "message_thread_id": thread_id, "text": "Allow?", "reply_markup": approval_buttons()}),
        )
        .await;
    let (update_id, query_id) = h.api.inject_callback_query(CallbackInject {
        chat_id: FORUM,
        thread_id: Some(thread_id),
        user_id: USER,
        message_id: message_id(&sent),
        data: "allow:7".to_owned(),
    });
    let updates = h.ok("getUpdates", json!({})).await;
    assert_eq!(update_ids(&updates), [update_id]);
    let query = &updates[0]["callback_query"];
    assert_eq!(query["id"], json!(query_id));
    assert_eq!(query["from"]["id"], json!(USER));
    assert_eq!(query["from"]["is_bot"], json!(false));
    assert_eq!(query["data"], json!("allow:7"));
    let instance = query["chat_instance"].as_str().expect("chat_instance");
    assert_ne!(instance, FORUM.to_string(), "not the chat id");
    let message = &query["message"];
    assert_eq!(message["message_id"], sent["message_id"]);
    assert_eq!(message["message_thread_id"], json!(thread_id));
    assert_eq!(message["is_topic_message"], json!(true));
    assert_eq!(message["reply_markup"], approval_buttons());
    assert_eq!(message["from"]["is_bot"], json!(true));

    assert_eq!(h.api.unanswered_callback_queries().len(), 1);
    h.ok(
        "answerCallbackQuery",
        json!({"callback_query_id": query_id, "text": "Allowed", "show_alert": true}),
    )
    .await;
    let too_old = (
        400,
        "Bad Request: query is too old and response timeout expired or query ID is invalid"
            .to_owned(),
    );
    let again = json!({"callback_query_id": query_id});
    assert_eq!(h.error("answerCallbackQuery", again).await, too_old);
    let unknown = json!({"callback_query_id": "123"});
    assert_eq!(h.error("answerCallbackQuery", unknown).await, too_old);

    assert!(h.api.unanswered_callback_queries().is_empty());
    let records = h.api.callback_queries();
    let answer = records[0].answer.as_ref().expect("answered");
    assert_eq!(
        (answer.text.as_deref(), answer.show_alert),
        (Some("Allowed"), true)
    );
    assert!(answer.answered_ms >= records[0].injected_ms);
    assert_eq!(
        (
            records[0].chat_id,
            records[0].message_id,
            records[0].user_id
        ),
        (FORUM, message_id(&sent), USER)
    );
}

#[tokio::test]
async fn a_forged_tap_carries_what_the_injector_says() {
    let h = harness().await;
    let (_, query_id) = h.api.inject_callback_query(CallbackInject {
        chat_id: -100_777,
        thread_id: Some(77),
        user_id: 6666,
        message_id: 9999,
        data: "allow:1".to_owned(),
    });
    let updates = h.ok("getUpdates", json!({})).await;
    let message = &updates[0]["callback_query"]["message"];
    assert_eq!(message["message_id"], json!(9999));
    assert_eq!(message["chat"]["id"], json!(-100_777));
    assert_eq!(message["chat"]["type"], json!("supergroup"));
    assert_eq!(message["message_thread_id"], json!(77));
    assert_eq!(updates[0]["callback_query"]["from"]["id"], json!(6666));
    // A tap does not make the chat exist for the bot.
    assert_eq!(
        h.error("getChat", json!({"chat_id": -100_777})).await.1,
        "Bad Request: chat not found"
    );
    // It must still be answered.
    assert_eq!(
        h.api.unanswered_callback_queries()[0].callback_query_id,
        query_id
    );
}

#[tokio::test]
async fn a_users_reply_carries_the_replied_message_one_level_deep() {
    let h = harness().await;
    let thread_id = h.create_topic(FORUM, "A · api").await;
    let question = h
        .ok(
            "sendMessage",
            json!({"chat_id": FORUM, "message_thread_id": thread_id, "text": "Which branch?"}),
        )
        .await;
    let first = h
        .api
        .inject_user_message(UserMessage {
            chat_id: FORUM,
            thread_id: Some(thread_id),
            user_id: USER,
            text: "main".to_owned(),
            reply_to_message_id: Some(message_id(&question)),
            ..UserMessage::default()
        })
        .expect("a reply to an existing message");
    let second = h
        .api
        .inject_user_message(UserMessage {
            chat_id: FORUM,
            thread_id: Some(thread_id),
            user_id: USER,
            text: "I mean it".to_owned(),
            reply_to_message_id: Some(first.message_id),
            ..UserMessage::default()
        })
        .expect("a reply to the reply");
    let updates = h.ok("getUpdates", json!({})).await;
    let reply = &updates[0]["message"]["reply_to_message"];
    assert_eq!(reply["message_id"], question["message_id"]);
    assert_eq!(reply["text"], json!("Which branch?"));
    assert_eq!(reply["from"]["is_bot"], json!(true));
    assert_eq!(reply["message_thread_id"], json!(thread_id));
    let nested = &updates[1]["message"]["reply_to_message"];
    assert_eq!(nested["message_id"], json!(first.message_id));
    assert!(
        nested.get("reply_to_message").is_none(),
        "one level deep: {nested}"
    );
    assert_eq!(update_ids(&updates)[1], second.update_id);

    assert_eq!(
        h.api.inject_user_message(UserMessage {
            chat_id: FORUM,
            user_id: USER,
            text: "to nothing".to_owned(),
            reply_to_message_id: Some(9999),
            ..UserMessage::default()
        }),
        Err(FakeError::UnknownMessage {
            chat_id: FORUM,
            message_id: 9999
        })
    );
}

#[tokio::test]
async fn the_bots_replies_name_an_existing_message_and_land_in_its_topic() {
    let h = harness().await;
    let thread_id = h.create_topic(FORUM, "A · api").await;
    let asked = h.say(FORUM, Some(thread_id), "status?");
    let updates = h.ok("getUpdates", json!({"offset": asked})).await;
    let asked_id = message_id(&updates[0]["message"]);
    let reply = h
        .ok(
            "sendMessage",
            json!({"chat_id": FORUM, "text": "all green", "reply_parameters": {"message_id": asked_id}}),
        )
        .await;
    assert_eq!(reply["message_thread_id"], json!(thread_id));
    assert_eq!(reply["reply_to_message"]["message_id"], json!(asked_id));
    assert_eq!(reply["reply_to_message"]["text"], json!("status?"));
    assert_eq!(
        h.api.messages(FORUM, Some(thread_id))[0].reply_to_message_id,
        Some(asked_id)
    );

    let missing = json!({"chat_id": FORUM, "text": "x", "reply_parameters": {"message_id": 9999}});
    assert_eq!(
        h.error("sendMessage", missing).await.1,
        "Bad Request: message to be replied not found"
    );
    let lenient = json!({"chat_id": FORUM, "text": "x", "reply_parameters": "{\"message_id\": 9999, \"allow_sending_without_reply\": true}"});
    let sent = h.ok("sendMessage", lenient).await;
    assert!(sent.get("reply_to_message").is_none(), "{sent}");
}
