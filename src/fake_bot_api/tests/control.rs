//! The newer control routes, driven the way a test in another process does.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::*;

#[tokio::test]
async fn files_replies_taps_and_stats_over_the_control_routes() {
    let h = harness().await;
    let h = &h;
    let post = |route: &'static str, body: Value| h.control(route, Some(body));
    let get = |route: String| async move { h.control(&route, None).await };

    let question = h
        .ok(
            "sendMessage",
            json!({"chat_id": USER, "text": "Allow?", "reply_markup": {"inline_keyboard": [[{"text": "Allow", "callback_data": "allow"}]]}}),
        )
        .await;
    let question_id = question["message_id"].as_i64().expect("message id");

    let voice = b"OggS fake opus".to_vec();
    let (status, injected) = post(
        "inject_message",
        json!({"chat_id": USER, "user_id": USER, "text": "listen", "reply_to_message_id": question_id,
               "media": {"kind": "voice", "data_base64": STANDARD.encode(&voice), "duration": 2}}),
    )
    .await;
    assert_eq!(status, 200, "{injected}");
    let file_id = injected["file_ids"][0]
        .as_str()
        .expect("a file id")
        .to_owned();
    let (status, refused) = post(
        "inject_message",
        json!({"chat_id": USER, "user_id": USER, "text": "", "reply_to_message_id": 9999}),
    )
    .await;
    assert_eq!(status, 400, "{refused}");

    let (_, tap) = post(
        "inject_callback_query",
        json!({"chat_id": USER, "user_id": USER, "message_id": question_id, "data": "allow"}),
    )
    .await;
    let updates = h.ok("getUpdates", json!({})).await;
    assert_eq!(
        updates[0]["message"]["reply_to_message"]["message_id"],
        json!(question_id)
    );
    assert_eq!(updates[0]["message"]["voice"]["file_id"], json!(file_id));
    let (_, unanswered) = get("callback_queries?unanswered=true".to_owned()).await;
    assert_eq!(unanswered[0]["callback_query_id"], tap["callback_query_id"]);
    h.ok(
        "answerCallbackQuery",
        json!({"callback_query_id": tap["callback_query_id"], "text": "ok"}),
    )
    .await;
    let (_, unanswered) = get("callback_queries?unanswered=true".to_owned()).await;
    assert_eq!(unanswered, json!([]));
    let (_, all) = get("callback_queries".to_owned()).await;
    assert_eq!(all[0]["answer"]["text"], json!("ok"));

    h.ok(
        "editMessageReplyMarkup",
        json!({"chat_id": USER, "message_id": question_id}),
    )
    .await;
    let (status, message) = get(format!("message?chat_id={USER}&message_id={question_id}")).await;
    assert_eq!(status, 200);
    assert_eq!(message["reply_markup"], Value::Null);
    assert_eq!(message["history"].as_array().map(Vec::len), Some(2));
    let (status, _) = get(format!("message?chat_id={USER}&message_id=9999")).await;
    assert_eq!(status, 404);

    let (_, file) = get(format!("file?file_id={file_id}")).await;
    assert_eq!(file["kind"], json!("voice"));
    assert_eq!(file["from_bot"], json!(false));
    let (status, content) = h
        .get_bytes(&format!("control/file_content?file_id={file_id}"))
        .await;
    assert_eq!((status, content), (200, voice));
    let (_, downloads) = get("downloads".to_owned()).await;
    assert_eq!(downloads, json!([]), "reading over control is no download");

    let form =
        Form::new()
            .field("chat_id", USER)
            .file("document", "out.txt", "text/plain", b"result");
    h.upload("sendDocument", form).await;
    let (_, uploads) = get("uploads".to_owned()).await;
    assert_eq!(uploads[0]["file_name"], json!("out.txt"));
    assert!(uploads[0].get("bytes").is_none());

    let (_, topic) = post(
        "inject_topic",
        json!({"chat_id": USER, "user_id": USER, "name": "idea"}),
    )
    .await;
    assert!(topic["thread_id"].is_i64(), "{topic}");
    let (_, stats) = get("stats".to_owned()).await;
    assert_eq!(
        stats["pending_update_count"],
        json!(3),
        "nothing was confirmed"
    );
    assert_eq!(stats["polls"]["polls"], json!(1));
    assert_eq!(stats["chats"][0]["sent"], json!(2));
    assert_eq!(stats["chats"][0]["edited"], json!(1));
}

#[tokio::test]
async fn deafness_and_bot_settings_over_the_control_routes() {
    let h = harness().await;
    let deaf = json!({"method": "getUpdates", "until_cleared": true, "fault": {"kind": "deaf", "immediately": true}});
    assert_eq!(h.control("fault", Some(deaf)).await.0, 200);
    let update_id = h.say(USER, None, "hello?");
    for _ in 0..3 {
        assert_eq!(h.ok("getUpdates", json!({})).await, json!([]));
    }
    assert_eq!(h.control("clear_faults", Some(json!({}))).await.0, 200);
    assert_eq!(
        update_ids(&h.ok("getUpdates", json!({})).await),
        [update_id]
    );

    let settings = json!({"has_topics_enabled": false, "allows_users_to_create_topics": false});
    assert_eq!(h.control("bot_settings", Some(settings)).await.0, 200);
    let me = h.ok("getMe", json!({})).await;
    assert_eq!(
        (
            &me["has_topics_enabled"],
            &me["allows_users_to_create_topics"]
        ),
        (&json!(false), &json!(false))
    );
}
