//! Topics in the private chat with a user (Bot API 9.3/9.4).

use super::*;

#[tokio::test]
async fn a_private_chat_has_topics_but_no_general_topic() {
    let h = harness().await;
    let me = h.ok("getMe", json!({})).await;
    assert_eq!(me["has_topics_enabled"], json!(true));
    assert_eq!(me["allows_users_to_create_topics"], json!(true));

    let thread_id = h.create_topic(USER, "A · api").await;
    let sent = h
        .ok(
            "sendMessage",
            json!({"chat_id": USER, "message_thread_id": thread_id, "text": "hi"}),
        )
        .await;
    assert_eq!(sent["message_thread_id"], json!(thread_id));
    assert_eq!(sent["is_topic_message"], json!(true));
    assert_eq!(sent["chat"]["type"], json!("private"));
    h.say(USER, Some(thread_id), "hello back");
    let updates = h.ok("getUpdates", json!({})).await;
    assert_eq!(updates[0]["message"]["message_thread_id"], json!(thread_id));
    assert_eq!(updates[0]["message"]["is_topic_message"], json!(true));

    // Thread 1 is nothing special here: just a thread that does not exist.
    let gone = "Bad Request: message thread not found".to_owned();
    let general = json!({"chat_id": USER, "message_thread_id": 1, "text": "x"});
    assert_eq!(h.error("sendMessage", general).await, (400, gone.clone()));
    let close_general = json!({"chat_id": USER, "message_thread_id": 1});
    assert_eq!(
        h.error("closeForumTopic", close_general).await,
        (400, gone.clone())
    );

    // The bot needs no administrator rights in a private chat.
    let topic = json!({"chat_id": USER, "message_thread_id": thread_id});
    h.ok("closeForumTopic", topic.clone()).await;
    h.ok("reopenForumTopic", topic.clone()).await;
    h.ok("deleteForumTopic", topic).await;
    let late = json!({"chat_id": USER, "message_thread_id": thread_id, "text": "late"});
    assert_eq!(h.error("sendMessage", late).await, (400, gone));
}

#[tokio::test]
async fn topics_can_be_switched_off_and_on_while_the_bot_runs() {
    let h = harness().await;
    let thread_id = h.create_topic(USER, "A · api").await;
    h.api.set_has_topics_enabled(false);
    assert_eq!(
        h.ok("getMe", json!({})).await["has_topics_enabled"],
        json!(false)
    );
    assert_eq!(
        h.error("createForumTopic", json!({"chat_id": USER, "name": "B"}))
            .await,
        (400, "Bad Request: the chat is not a forum".to_owned())
    );
    let in_topic = json!({"chat_id": USER, "message_thread_id": thread_id, "text": "x"});
    assert_eq!(
        h.error("sendMessage", in_topic.clone()).await.1,
        "Bad Request: message thread not found"
    );
    // Without topics the private chat still works as a plain chat.
    h.ok("sendMessage", json!({"chat_id": USER, "text": "plain"}))
        .await;

    let (status, _) = h
        .control("bot_settings", Some(json!({"has_topics_enabled": true})))
        .await;
    assert_eq!(status, 200);
    h.ok("sendMessage", in_topic).await;
    h.create_topic(USER, "B · web").await;
}

#[tokio::test]
async fn users_open_topics_where_the_bot_lets_them() {
    let h = harness().await;
    let (thread_id, update_id) = h
        .api
        .inject_topic(USER, USER, "my idea")
        .expect("users may create topics");
    let updates = h.ok("getUpdates", json!({})).await;
    assert_eq!(update_ids(&updates), [update_id]);
    let message = &updates[0]["message"];
    assert_eq!(message["message_id"], json!(thread_id));
    assert_eq!(message["message_thread_id"], json!(thread_id));
    assert_eq!(message["from"]["id"], json!(USER));
    assert_eq!(message["forum_topic_created"]["name"], json!("my idea"));
    h.ok(
        "sendMessage",
        json!({"chat_id": USER, "message_thread_id": thread_id, "text": "on it"}),
    )
    .await;

    h.api.set_allows_users_to_create_topics(false);
    assert_eq!(
        h.ok("getMe", json!({})).await["allows_users_to_create_topics"],
        json!(false)
    );
    assert!(matches!(
        h.api.inject_topic(USER, USER, "another"),
        Err(FakeError::Refused(_))
    ));
    // The setting is about private chats; forum members still open topics.
    assert!(h.api.inject_topic(FORUM, USER, "forum idea").is_ok());
}
