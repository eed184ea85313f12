//! Drafts and their stop button (Bot API 9.3–10.3), disabled buttons (10.3).

use super::*;

#[tokio::test]
async fn a_draft_grows_in_a_private_topic_and_a_message_takes_its_place() {
    let h = harness().await;
    let thread_id = h.create_topic(USER, "A · api").await;
    let draft = |text: &str| {
        json!({"chat_id": USER, "message_thread_id": thread_id, "draft_id": 7,
               "text": text, "parse_mode": "HTML", "can_stop": true})
    };
    assert_eq!(h.ok("sendMessageDraft", draft("")).await, json!(true));
    h.ok("sendMessageDraft", draft("<b>Working</b>")).await;
    h.ok("sendMessageDraft", draft("<b>Working</b> · 1 tool"))
        .await;
    let drafts = h.api.drafts();
    assert_eq!(drafts.len(), 1, "one id, one draft: {drafts:?}");
    assert_eq!(drafts[0].texts, ["", "Working", "Working · 1 tool"]);
    assert!(drafts[0].can_stop);
    assert!(drafts[0].shown_at(drafts[0].updated_ms));
    assert!(
        !drafts[0].shown_at(drafts[0].updated_ms + DRAFT_LIFETIME_MS),
        "a draft is a preview of about 30 s"
    );
    assert!(
        h.api
            .messages(USER, Some(thread_id))
            .iter()
            .all(|m| m.text != "Working"),
        "a draft is no message"
    );

    let sent = h
        .ok(
            "sendMessage",
            json!({"chat_id": USER, "message_thread_id": thread_id, "text": "done"}),
        )
        .await;
    let drafts = h.api.drafts();
    assert_eq!(drafts[0].replaced_by, sent["message_id"].as_i64());
    assert!(!drafts[0].shown_at(drafts[0].updated_ms));
    // The same id after the message is a new draft.
    h.ok("sendMessageDraft", draft("next turn")).await;
    assert_eq!(h.api.drafts().len(), 2);
}

#[tokio::test]
async fn drafts_are_for_private_chats_only_and_need_an_id() {
    let h = harness().await;
    let thread_id = h.create_topic(FORUM, "A · api").await;
    let in_group = json!({"chat_id": FORUM, "message_thread_id": thread_id,
                          "draft_id": 1, "text": "x"});
    assert_eq!(
        h.error("sendMessageDraft", in_group).await,
        (
            400,
            "Bad Request: draft can be sent only to private chats".to_owned()
        )
    );
    let no_id = json!({"chat_id": USER, "draft_id": 0, "text": "x"});
    assert_eq!(
        h.error("sendMessageDraft", no_id).await,
        (400, "Bad Request: draft_id must be non-zero".to_owned())
    );
    let too_long = json!({"chat_id": USER, "draft_id": 1, "text": "x".repeat(4097)});
    assert_eq!(h.error("sendMessageDraft", too_long).await.0, 400);
    let nowhere = json!({"chat_id": USER, "message_thread_id": 999, "draft_id": 1, "text": "x"});
    assert_eq!(
        h.error("sendMessageDraft", nowhere).await,
        (400, "Bad Request: message thread not found".to_owned())
    );
    assert!(h.api.drafts().is_empty());
}

#[tokio::test]
async fn the_stop_button_yields_an_update_only_when_asked_for() {
    let h = harness().await;
    let thread_id = h.create_topic(USER, "A · api").await;
    let draft = |id: i64, can_stop: bool| {
        json!({"chat_id": USER, "message_thread_id": thread_id, "draft_id": id,
               "text": "working", "can_stop": can_stop})
    };
    h.ok("sendMessageDraft", draft(3, false)).await;
    assert!(
        h.api.press_stop(USER, Some(thread_id), 3).is_err(),
        "no button was offered"
    );
    h.ok("sendMessageDraft", draft(3, true)).await;

    // Not named in allowed_updates: Telegram does not deliver it.
    h.ok("getUpdates", json!({"allowed_updates": ["message"]}))
        .await;
    h.api.press_stop(USER, Some(thread_id), 3).expect("pressed");
    assert_eq!(h.ok("getUpdates", json!({})).await, json!([]));
    assert!(h.api.drafts()[0].stopped);
    assert!(
        h.api.press_stop(USER, Some(thread_id), 3).is_err(),
        "a stopped draft shows no button"
    );

    h.ok(
        "getUpdates",
        json!({"allowed_updates": ["message", "stopped_message_generation"]}),
    )
    .await;
    h.ok("sendMessageDraft", draft(4, true)).await;
    let (status, pressed) = h
        .control(
            "press_stop",
            Some(json!({"chat_id": USER, "thread_id": thread_id, "draft_id": 4})),
        )
        .await;
    assert_eq!(status, 200, "{pressed}");
    let updates = h.ok("getUpdates", json!({})).await;
    assert_eq!(
        update_ids(&updates),
        [pressed["update_id"].as_i64().unwrap()]
    );
    let stopped = &updates[0]["stopped_message_generation"];
    assert_eq!(stopped["chat"]["id"], json!(USER));
    assert_eq!(stopped["chat"]["type"], json!("private"));
    assert_eq!(stopped["message_thread_id"], json!(thread_id));
    assert_eq!(stopped["draft_id"], json!(4));
    let (_, drafts) = h.control("drafts", None).await;
    assert_eq!(drafts[1]["stopped"], json!(true));
}

#[tokio::test]
async fn a_disabled_button_is_kept_with_the_message() {
    let h = harness().await;
    let sent = h
        .ok(
            "sendMessage",
            json!({"chat_id": USER, "text": "Allow?", "reply_markup": {"inline_keyboard": [[
                {"text": "Allow", "callback_data": "a:1:0"}]]}}),
        )
        .await;
    let message_id = sent["message_id"].as_i64().unwrap();
    let settled = h
        .ok(
            "editMessageText",
            json!({"chat_id": USER, "message_id": message_id, "text": "Allow?\n\nAllowed",
                   "reply_markup": {"inline_keyboard": [[
                       {"text": "Allow · Ann", "disabled": {}}]]}}),
        )
        .await;
    assert_eq!(
        settled["reply_markup"]["inline_keyboard"][0][0],
        json!({"text": "Allow · Ann", "disabled": {}})
    );
}
