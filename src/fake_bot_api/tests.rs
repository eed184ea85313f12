//! The fake is tested the way the relay uses it: over HTTP on 127.0.0.1. This
//! file has the harness and the basics; each newer feature has its module.

mod buttons;
mod control;
mod drafts;
mod files;
mod pacing;
mod polling;
mod private_topics;

use std::time::Duration;

use serde_json::{Value, json};

use super::*;

const WAIT: Duration = Duration::from_secs(10);
const FORUM: i64 = DEFAULT_FORUM_CHAT_ID;
const USER: i64 = DEFAULT_USER_ID;

struct Harness {
    server: FakeServer,
    api: FakeBotApi,
    http: reqwest::Client,
}

async fn harness_with(config: FakeConfig) -> Harness {
    // reqwest is built without a default TLS provider; the fake only speaks plain
    // HTTP, but the client builder still wants one installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = FakeBotApi::start(config).await.expect("bind 127.0.0.1:0");
    let api = server.api();
    api.add_default_chats();
    let http = reqwest::Client::builder()
        .timeout(WAIT)
        .build()
        .expect("http client");
    Harness { server, api, http }
}

async fn harness() -> Harness {
    harness_with(FakeConfig::default()).await
}

impl Harness {
    /// Calls a Bot API method with a JSON body; returns (HTTP status, body).
    async fn call(&self, method: &str, params: Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}/{method}", self.server.bot_url()))
            .json(&params)
            .send()
            .await
            .expect("request reaches the fake");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON answer"))
    }

    async fn ok(&self, method: &str, params: Value) -> Value {
        let (status, body) = self.call(method, params).await;
        assert_eq!(status, 200, "{method} failed: {body}");
        body["result"].clone()
    }

    async fn error(&self, method: &str, params: Value) -> (u16, String) {
        let (status, body) = self.call(method, params).await;
        assert_eq!(
            body["ok"],
            json!(false),
            "{method} unexpectedly succeeded: {body}"
        );
        assert_eq!(body["error_code"], json!(status));
        (
            status,
            body["description"].as_str().unwrap_or_default().to_owned(),
        )
    }

    /// A control route: POST with a body, GET without.
    async fn control(&self, route: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}/control/{route}", self.server.url());
        let request = match body {
            Some(body) => self.http.post(url).json(&body),
            None => self.http.get(url),
        };
        let response = request.send().await.expect("control request");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON answer"))
    }

    /// Calls a Bot API method with a multipart body; returns (HTTP status, body).
    async fn upload(&self, method: &str, form: Form) -> (u16, Value) {
        let (content_type, body) = form.finish();
        let response = self
            .http
            .post(format!("{}/{method}", self.server.bot_url()))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .expect("request reaches the fake");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON answer"))
    }

    /// GETs `{url}/{path}`; returns (HTTP status, body bytes).
    async fn get_bytes(&self, path: &str) -> (u16, Vec<u8>) {
        let response = self
            .http
            .get(format!("{}/{path}", self.server.url()))
            .send()
            .await
            .expect("request reaches the fake");
        let status = response.status().as_u16();
        let body = response.bytes().await.expect("a body");
        (status, body.to_vec())
    }

    fn say(&self, chat_id: i64, thread_id: Option<i64>, text: &str) -> i64 {
        self.api.inject_message(Inject {
            chat_id,
            thread_id,
            user_id: USER,
            text: text.to_owned(),
        })
    }

    async fn create_topic(&self, chat_id: i64, name: &str) -> i64 {
        let topic = self
            .ok(
                "createForumTopic",
                json!({"chat_id": chat_id, "name": name}),
            )
            .await;
        topic["message_thread_id"].as_i64().expect("a thread id")
    }
}

/// A `multipart/form-data` body built by hand (the crate's reqwest has no
/// multipart support, and a hand-made body pins down what the fake parses).
struct Form {
    body: Vec<u8>,
}

const BOUNDARY: &str = "fake-bot-api-test-boundary-7MA4YWxkTrZu0gW";

impl Form {
    fn new() -> Self {
        Self { body: Vec::new() }
    }

    fn field(mut self, name: &str, value: impl std::fmt::Display) -> Self {
        self.body.extend_from_slice(
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
            .as_bytes(),
        );
        self
    }

    fn file(mut self, name: &str, file_name: &str, content_type: &str, bytes: &[u8]) -> Self {
        self.body.extend_from_slice(
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{file_name}\"\r\nContent-Type: {content_type}\r\n\r\n"
            )
            .as_bytes(),
        );
        self.body.extend_from_slice(bytes);
        self.body.extend_from_slice(b"\r\n");
        self
    }

    fn finish(mut self) -> (String, Vec<u8>) {
        self.body
            .extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
        (
            format!("multipart/form-data; boundary={BOUNDARY}"),
            self.body,
        )
    }
}

/// `len` bytes that Telegram would take for a PNG: the signature, then a
/// pattern that makes any truncation or reordering visible.
fn png(len: usize) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    bytes.extend((0..len.saturating_sub(8)).map(|i| u8::try_from(i * 31 % 251).unwrap_or(0)));
    bytes
}

fn update_ids(updates: &Value) -> Vec<i64> {
    updates
        .as_array()
        .expect("an update list")
        .iter()
        .map(|u| u["update_id"].as_i64().expect("update_id"))
        .collect()
}

#[test]
fn default_token_has_telegrams_shape() {
    let token = FakeConfig::default().token;
    assert!(has_token_shape(&token));
    assert_eq!(
        token.split_once(':').map(|(_, secret)| secret.len()),
        Some(35)
    );
}

#[tokio::test]
async fn a_token_without_telegrams_shape_is_refused() {
    for token in [
        "",
        "abc:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_",
        "1:short",
        "1:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw!",
    ] {
        let config = FakeConfig {
            token: token.to_owned(),
            ..FakeConfig::default()
        };
        let refused = FakeBotApi::start(config).await.err().map(|e| e.kind());
        assert_eq!(refused, Some(std::io::ErrorKind::InvalidInput), "{token:?}");
    }
}

#[tokio::test]
async fn get_me_describes_the_configured_bot() {
    let h = harness_with(FakeConfig {
        has_topics_enabled: false,
        ..FakeConfig::default()
    })
    .await;
    let me = h.ok("getMe", json!({})).await;
    assert_eq!(me["id"], json!(123_456_789));
    assert_eq!(me["is_bot"], json!(true));
    assert_eq!(me["username"], json!("relay_test_bot"));
    assert_eq!(me["has_topics_enabled"], json!(false));
}

#[tokio::test]
async fn wrong_token_is_unauthorized_and_unknown_method_not_found() {
    let h = harness().await;
    let url = format!("{}/bot1:wrong/getMe", h.server.url());
    let response = h.http.get(url).send().await.expect("request");
    assert_eq!(response.status().as_u16(), 401);
    let body: Value = response.json().await.expect("json");
    assert_eq!(
        body,
        json!({"ok": false, "error_code": 401, "description": "Unauthorized"})
    );
    assert_eq!(
        h.error("frobnicate", json!({})).await,
        (404, "Not Found".to_owned())
    );
}

#[tokio::test]
async fn query_and_form_parameters_are_accepted() {
    let h = harness().await;
    let url = format!(
        "{}/sendmessage?chat_id={FORUM}&text=from%20query",
        h.server.bot_url()
    );
    let response = h.http.get(url).send().await.expect("request");
    assert_eq!(response.status().as_u16(), 200);
    let url = format!("{}/sendMessage", h.server.bot_url());
    let response = h
        .http
        .post(url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("chat_id={FORUM}&text=from+form"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status().as_u16(), 200);
    let texts: Vec<String> = h
        .api
        .messages(FORUM, None)
        .into_iter()
        .map(|m| m.text)
        .collect();
    assert_eq!(texts, ["from query", "from form"]);
    // Case-insensitive method names are recorded in Telegram's spelling.
    assert_eq!(h.api.calls()[0].method, "sendMessage");
}

#[tokio::test]
async fn offset_confirms_lower_updates_and_negative_offset_keeps_the_last() {
    let h = harness().await;
    let first = h.say(USER, None, "one");
    h.say(USER, None, "two");
    h.say(USER, None, "three");
    let all = h.ok("getUpdates", json!({})).await;
    assert_eq!(update_ids(&all), [first, first + 1, first + 2]);
    assert_eq!(all[0]["message"]["text"], json!("one"));
    assert_eq!(all[0]["message"]["chat"]["type"], json!("private"));

    // Fetching without an offset confirms nothing.
    assert_eq!(update_ids(&h.ok("getUpdates", json!({})).await).len(), 3);
    let rest = h
        .ok("getUpdates", json!({"offset": first + 1, "limit": 1}))
        .await;
    assert_eq!(update_ids(&rest), [first + 1]);
    assert_eq!(h.api.pending_update_ids(), [first + 1, first + 2]);

    h.say(USER, None, "four");
    h.say(USER, None, "five");
    let last = h.ok("getUpdates", json!({"offset": -2})).await;
    assert_eq!(update_ids(&last), [first + 3, first + 4]);
    // The earlier, unconfirmed updates are gone for good.
    assert_eq!(h.api.pending_update_ids(), [first + 3, first + 4]);
    assert_eq!(
        h.ok("getUpdates", json!({"offset": first + 5})).await,
        json!([])
    );
    assert!(h.api.pending_update_ids().is_empty());
}

#[tokio::test]
async fn long_poll_answers_as_soon_as_an_update_arrives() {
    let h = harness().await;
    let thread_id = h.create_topic(FORUM, "A · api").await;
    let poll = h.call("getUpdates", json!({"timeout": 60}));
    let inject = async {
        h.api
            .wait_for_poller(WAIT)
            .await
            .expect("the poll reaches the fake");
        h.say(FORUM, Some(thread_id), "hello topic")
    };
    // The poll's timeout (60 s) exceeds the client's (10 s): only the update can end it.
    let ((status, body), update_id) = tokio::join!(poll, inject);
    assert_eq!(status, 200);
    assert_eq!(update_ids(&body["result"]), [update_id]);
    let message = &body["result"][0]["message"];
    assert_eq!(message["message_thread_id"], json!(thread_id));
    assert_eq!(message["is_topic_message"], json!(true));
    assert_eq!(message["chat"]["is_forum"], json!(true));
    assert_eq!(message["from"]["id"], json!(USER));
}

#[tokio::test]
async fn a_newer_poll_terminates_the_older_with_409() {
    let h = harness().await;
    let older = h.call("getUpdates", json!({"timeout": 60}));
    let newer = async {
        h.api
            .wait_for_poller(WAIT)
            .await
            .expect("the poll reaches the fake");
        let newer = h.call("getUpdates", json!({"timeout": 60}));
        let inject = async {
            // The older poll must have answered before the newer proceeds alone.
            h.api
                .wait_for_call(|c| c.method == "getUpdates" && c.status == Some(409), WAIT)
                .await
                .expect("the older poll is terminated");
            h.api
                .wait_for_poller(WAIT)
                .await
                .expect("the poll reaches the fake");
            h.say(USER, None, "for the newer")
        };
        tokio::join!(newer, inject)
    };
    let ((older_status, older_body), ((newer_status, newer_body), update_id)) =
        tokio::join!(older, newer);
    assert_eq!(older_status, 409);
    assert_eq!(
        older_body["description"],
        json!(
            "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
        )
    );
    assert_eq!(newer_status, 200);
    assert_eq!(update_ids(&newer_body["result"]), [update_id]);
    let calls = h.api.calls();
    assert_eq!(calls[0].status, Some(409));
    assert!(calls[0].finished_ms <= calls[1].finished_ms);
}

#[tokio::test]
async fn allowed_updates_is_remembered_and_filters_new_updates() {
    let h = harness().await;
    h.ok("getUpdates", json!({"allowed_updates": ["callback_query"]}))
        .await;
    h.say(USER, None, "filtered out");
    let sent = h
        .ok("sendMessage", json!({"chat_id": USER, "text": "pick"}))
        .await;
    let (update_id, query_id) = h.api.inject_callback_query(CallbackInject {
        chat_id: USER,
        thread_id: None,
        user_id: USER,
        message_id: sent["message_id"].as_i64().expect("message id"),
        data: "yes".to_owned(),
    });
    // A poll without allowed_updates keeps the previous setting.
    let updates = h.ok("getUpdates", json!({})).await;
    assert_eq!(update_ids(&updates), [update_id]);
    assert_eq!(
        updates[0]["callback_query"]["message"]["text"],
        json!("pick")
    );
    h.ok(
        "answerCallbackQuery",
        json!({"callback_query_id": query_id}),
    )
    .await;
    let (_, description) = h
        .error(
            "answerCallbackQuery",
            json!({"callback_query_id": query_id}),
        )
        .await;
    assert!(description.contains("query ID is invalid"), "{description}");
}

#[tokio::test]
async fn unknown_update_kinds_are_delivered_and_delete_webhook_can_drop_them() {
    let h = harness().await;
    let id = h
        .api
        .inject_raw_update(json!({"business_message": {"text": "new kind"}}));
    let updates = h.ok("getUpdates", json!({})).await;
    assert_eq!(
        updates,
        json!([{"update_id": id, "business_message": {"text": "new kind"}}])
    );
    h.ok("deleteWebhook", json!({"drop_pending_updates": false}))
        .await;
    assert_eq!(h.api.pending_update_ids(), [id]);
    h.ok("deleteWebhook", json!({"drop_pending_updates": true}))
        .await;
    assert!(h.api.pending_update_ids().is_empty());
}

#[tokio::test]
async fn a_webhook_refuses_get_updates_until_it_is_deleted() {
    let h = harness().await;
    let id = h
        .api
        .inject_raw_update(json!({"message": {"text": "kept"}}));
    let (status, description) = h
        .error("setWebhook", json!({"url": "http://plain.example/hook"}))
        .await;
    assert_eq!(status, 400, "{description}");
    h.ok("setWebhook", json!({"url": "https://example.invalid/hook"}))
        .await;
    let info = h.ok("getWebhookInfo", json!({})).await;
    assert_eq!(info["url"], "https://example.invalid/hook");
    let (status, description) = h.error("getUpdates", json!({})).await;
    assert_eq!(status, 409);
    assert!(
        description.contains("can't use getUpdates method while webhook is active"),
        "{description}"
    );
    h.ok("deleteWebhook", json!({"drop_pending_updates": false}))
        .await;
    let updates = h.ok("getUpdates", json!({})).await;
    assert_eq!(updates[0]["update_id"], id, "the update waited: {updates}");
    // An empty url removes it too.
    h.ok("setWebhook", json!({"url": "https://example.invalid/hook"}))
        .await;
    h.ok("setWebhook", json!({"url": ""})).await;
    assert_eq!(h.ok("getWebhookInfo", json!({})).await["url"], "");
}

#[tokio::test]
async fn topics_are_created_used_and_deleted() {
    let h = harness().await;
    let created = h
        .ok(
            "createForumTopic",
            json!({"chat_id": FORUM, "name": "A · api", "icon_color": 0xFFD67E}),
        )
        .await;
    let thread_id = created["message_thread_id"].as_i64().expect("thread id");
    assert_ne!(thread_id, 1, "thread 1 is the General topic");
    assert_eq!(created["icon_color"], json!(0xFFD67E));
    let other = h.create_topic(FORUM, "B · web").await;
    assert_ne!(other, thread_id);

    let sent = h
        .ok(
            "sendMessage",
            json!({"chat_id": FORUM, "message_thread_id": thread_id, "text": "hi"}),
        )
        .await;
    assert_eq!(sent["message_thread_id"], json!(thread_id));
    assert_eq!(sent["is_topic_message"], json!(true));
    assert_eq!(h.api.messages(FORUM, Some(thread_id)).len(), 1);
    assert!(h.api.messages(FORUM, None).is_empty());

    h.ok(
        "deleteForumTopic",
        json!({"chat_id": FORUM, "message_thread_id": thread_id}),
    )
    .await;
    let gone = "Bad Request: message thread not found".to_owned();
    let in_deleted = json!({"chat_id": FORUM, "message_thread_id": thread_id, "text": "late"});
    assert_eq!(
        h.error("sendMessage", in_deleted).await,
        (400, gone.clone())
    );
    let action = json!({"chat_id": FORUM, "message_thread_id": thread_id, "action": "typing"});
    assert_eq!(h.error("sendChatAction", action).await, (400, gone.clone()));
    let edit = json!({"chat_id": FORUM, "message_id": sent["message_id"], "text": "edited"});
    assert_eq!(h.error("editMessageText", edit).await, (400, gone.clone()));
    let again = json!({"chat_id": FORUM, "message_thread_id": thread_id});
    assert_eq!(
        h.error("deleteForumTopic", again).await,
        (400, gone.clone())
    );
    for never in [1, 999] {
        let params = json!({"chat_id": FORUM, "message_thread_id": never, "text": "x"});
        assert_eq!(h.error("sendMessage", params).await, (400, gone.clone()));
    }

    h.api
        .delete_topic_externally(FORUM, other)
        .expect("the topic exists");
    let params = json!({"chat_id": FORUM, "message_thread_id": other, "action": "typing"});
    assert_eq!(h.error("sendChatAction", params).await, (400, gone));
    let topics = h.api.topics(FORUM);
    assert_eq!(topics.len(), 2);
    assert!(topics.iter().all(|t| t.deleted));
    assert_eq!(
        h.api.delete_topic_externally(FORUM, other),
        Err(FakeError::UnknownTopic {
            chat_id: FORUM,
            thread_id: other
        })
    );
}

#[tokio::test]
async fn topic_edits_close_and_reopen() {
    let h = harness().await;
    let thread_id = h.create_topic(FORUM, "A · api").await;
    let topic = json!({"chat_id": FORUM, "message_thread_id": thread_id});
    let mut rename = topic.clone();
    rename["name"] = json!("A · api (idle)");
    h.ok("editForumTopic", rename.clone()).await;
    assert_eq!(
        h.error("editForumTopic", rename).await.1,
        "Bad Request: TOPIC_NOT_MODIFIED"
    );
    h.ok("closeForumTopic", topic.clone()).await;
    assert_eq!(
        h.error("closeForumTopic", topic.clone()).await.1,
        "Bad Request: TOPIC_NOT_MODIFIED"
    );
    assert!(h.api.topics(FORUM)[0].closed);
    h.ok("reopenForumTopic", topic).await;
    let info = &h.api.topics(FORUM)[0];
    assert_eq!((info.name.as_str(), info.closed), ("A · api (idle)", false));
}

#[tokio::test]
async fn topic_creation_needs_a_forum_and_rights() {
    let h = harness().await;
    h.api.add_supergroup(-100_200, "Plain", BotRights::FULL);
    h.api
        .add_forum_supergroup(-100_300, "No rights", BotRights::default());
    h.api.add_forum_supergroup(
        -100_400,
        "Topics only",
        BotRights {
            can_manage_topics: true,
            can_delete_messages: false,
        },
    );
    let create = |chat_id: i64| json!({"chat_id": chat_id, "name": "A · api"});
    assert_eq!(
        h.error("createForumTopic", create(-100_200)).await.1,
        "Bad Request: the chat is not a forum"
    );
    assert_eq!(
        h.error("createForumTopic", create(-100_300)).await.1,
        "Bad Request: not enough rights to create a topic"
    );
    assert_eq!(
        h.error("createForumTopic", create(-42)).await.1,
        "Bad Request: chat not found"
    );
    let thread_id = h.create_topic(-100_400, "A · api").await;
    let delete = json!({"chat_id": -100_400, "message_thread_id": thread_id});
    assert_eq!(
        h.error("deleteForumTopic", delete).await.1,
        "Bad Request: not enough rights to delete a topic"
    );
    let name = "x".repeat(129);
    let too_long = json!({"chat_id": FORUM, "name": name});
    assert_eq!(h.error("createForumTopic", too_long).await.0, 400);
    assert_eq!(
        h.error("createForumTopic", json!({"chat_id": FORUM}))
            .await
            .1,
        "Bad Request: name is empty"
    );

    let member = h
        .ok(
            "getChatMember",
            json!({"chat_id": -100_400, "user_id": h.api.bot_id()}),
        )
        .await;
    assert_eq!(member["status"], json!("administrator"));
    assert_eq!(member["can_manage_topics"], json!(true));
    assert_eq!(member["can_delete_messages"], json!(false));
    let member = h
        .ok(
            "getChatMember",
            json!({"chat_id": -100_300, "user_id": h.api.bot_id()}),
        )
        .await;
    assert_eq!(member["status"], json!("member"));
    assert_eq!(
        h.ok("getChat", json!({"chat_id": -100_200})).await["type"],
        json!("supergroup")
    );
    assert_eq!(
        h.ok("getChat", json!({"chat_id": FORUM})).await["is_forum"],
        json!(true)
    );
}

#[tokio::test]
async fn private_chat_topics_follow_has_topics_enabled() {
    let h = harness().await;
    let thread_id = h.create_topic(USER, "A · api").await;
    let sent = h
        .ok(
            "sendMessage",
            json!({"chat_id": USER, "message_thread_id": thread_id, "text": "hi"}),
        )
        .await;
    assert_eq!(sent["message_thread_id"], json!(thread_id));

    let h = harness_with(FakeConfig {
        has_topics_enabled: false,
        ..FakeConfig::default()
    })
    .await;
    let create = json!({"chat_id": USER, "name": "A · api"});
    assert_eq!(
        h.error("createForumTopic", create).await.1,
        "Bad Request: the chat is not a forum"
    );
}

#[tokio::test]
async fn html_is_validated_and_length_counted_after_parsing() {
    let h = harness().await;
    let send = |text: String| json!({"chat_id": FORUM, "text": text, "parse_mode": "HTML"});
    let sent = h
        .ok(
            "sendMessage",
            send("<b>bold</b> &amp; <code>x</code>".to_owned()),
        )
        .await;
    assert_eq!(sent["text"], json!("bold & x"));
    assert_eq!(
        sent["entities"][0],
        json!({"type": "bold", "offset": 0, "length": 4})
    );
    assert_eq!(
        h.api.messages(FORUM, None)[0].text,
        "<b>bold</b> &amp; <code>x</code>"
    );

    for bad in [
        "<b>unclosed",
        "<b><i>x</b></i>",
        "<marquee>x</marquee>",
        "fish & chips",
    ] {
        let (status, description) = h.error("sendMessage", send(bad.to_owned())).await;
        assert_eq!(status, 400);
        assert!(
            description.starts_with("Bad Request: can't parse entities: "),
            "{bad}: {description}"
        );
    }
    // Plain text takes the same characters literally.
    h.ok(
        "sendMessage",
        json!({"chat_id": FORUM, "text": "fish & chips <3"}),
    )
    .await;

    // Markup does not count; entities count as one character; UTF-16 units do.
    h.ok("sendMessage", send(format!("<b>{}</b>", "a".repeat(4096))))
        .await;
    h.ok("sendMessage", send("&lt;".repeat(4096))).await;
    h.ok("sendMessage", send("😀".repeat(2048))).await;
    let too_long = "Bad Request: message is too long".to_owned();
    assert_eq!(
        h.error("sendMessage", send("😀".repeat(2049))).await,
        (400, too_long.clone())
    );
    assert_eq!(
        h.error("sendMessage", send(format!("<i>{}</i>", "a".repeat(4097))))
            .await,
        (400, too_long)
    );
    let empty = "Bad Request: message text is empty".to_owned();
    assert_eq!(
        h.error("sendMessage", send("<b></b>".to_owned())).await,
        (400, empty.clone())
    );
    assert_eq!(
        h.error("sendMessage", json!({"chat_id": FORUM})).await,
        (400, empty)
    );
}

#[tokio::test]
async fn edit_message_text_rejects_an_unchanged_text() {
    let h = harness().await;
    let sent = h
        .ok(
            "sendMessage",
            json!({"chat_id": FORUM, "text": "<b>v1</b>", "parse_mode": "HTML"}),
        )
        .await;
    let id = sent["message_id"].clone();
    let same = json!({"chat_id": FORUM, "message_id": id, "text": "<strong>v1</strong>", "parse_mode": "HTML"});
    let (status, description) = h.error("editMessageText", same).await;
    assert_eq!(status, 400);
    assert!(
        description.starts_with("Bad Request: message is not modified"),
        "{description}"
    );
    let edited = h
        .ok(
            "editMessageText",
            json!({"chat_id": FORUM, "message_id": id, "text": "v2"}),
        )
        .await;
    assert_eq!(edited["text"], json!("v2"));
    let stored = &h.api.messages(FORUM, None)[0];
    assert_eq!((stored.text.as_str(), stored.edited), ("v2", true));
    let missing = json!({"chat_id": FORUM, "message_id": 9999, "text": "v3"});
    assert_eq!(
        h.error("editMessageText", missing).await.1,
        "Bad Request: message to edit not found"
    );
}

#[tokio::test]
async fn faults_are_consumed_per_call_and_recorded() {
    let h = harness().await;
    h.api
        .inject_fault("sendMessage", Fault::TooManyRequests { retry_after: 3 }, 2);
    let params = json!({"chat_id": FORUM, "text": "hi"});
    for _ in 0..2 {
        let (status, body) = h.call("sendMessage", params.clone()).await;
        assert_eq!(status, 429);
        assert_eq!(body["parameters"]["retry_after"], json!(3));
        assert_eq!(
            body["description"],
            json!("Too Many Requests: retry after 3")
        );
    }
    h.ok("sendMessage", params.clone()).await;
    // Only the third attempt was performed.
    assert_eq!(h.api.messages(FORUM, None).len(), 1);

    h.api
        .inject_fault("getMe", Fault::ServerError { code: 502 }, 1);
    h.api.inject_fault("getMe", Fault::Conflict, 1);
    h.api.inject_fault(
        "getMe",
        Fault::BadRequest {
            description: "Bad Request: TOPIC_DELETED".to_owned(),
        },
        1,
    );
    assert_eq!(
        h.error("getMe", json!({})).await,
        (502, "Bad Gateway".to_owned())
    );
    assert_eq!(h.error("getMe", json!({})).await.0, 409);
    assert_eq!(
        h.error("getMe", json!({})).await,
        (400, "Bad Request: TOPIC_DELETED".to_owned())
    );
    h.ok("getMe", json!({})).await;

    let calls = h.api.calls();
    let statuses: Vec<Option<u16>> = calls.iter().map(|c| c.status).collect();
    assert_eq!(
        statuses,
        [
            Some(429),
            Some(429),
            Some(200),
            Some(502),
            Some(409),
            Some(400),
            Some(200)
        ]
    );
    assert!(calls[0].fault.is_some() && calls[2].fault.is_none());
    assert!(
        calls
            .windows(2)
            .all(|w| w[0].seq < w[1].seq && w[0].started_ms <= w[1].started_ms)
    );
    assert!(calls.iter().all(|c| c.finished_ms >= Some(c.started_ms)));
}

#[tokio::test]
async fn broken_bodies_and_delays() {
    let h = harness().await;
    let url = format!("{}/sendMessage", h.server.bot_url());
    let params = json!({"chat_id": FORUM, "text": "maybe sent"});

    h.api.inject_fault("sendMessage", Fault::GarbageBody, 1);
    let response = h
        .http
        .post(&url)
        .json(&params)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status().as_u16(), 200);
    let body = response.text().await.expect("body");
    assert!(serde_json::from_str::<Value>(&body).is_err(), "{body}");
    assert!(
        h.api.messages(FORUM, None).is_empty(),
        "a garbage answer performs nothing"
    );

    h.api.inject_fault("sendMessage", Fault::TruncatedJson, 1);
    let body = h
        .http
        .post(&url)
        .json(&params)
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("body");
    assert!(body.starts_with("{\"ok\":true"), "{body}");
    assert!(serde_json::from_str::<Value>(&body).is_err(), "{body}");
    assert_eq!(
        h.api.messages(FORUM, None).len(),
        1,
        "a truncated answer still performed the call"
    );

    h.api
        .inject_fault("getMe", Fault::Delay(Duration::from_millis(150)), 1);
    h.ok("getMe", json!({})).await;
    let delayed = h.api.calls().pop().expect("the call is recorded");
    let finished = delayed.finished_ms.expect("answered");
    assert!(finished - delayed.started_ms >= 150, "{delayed:?}");
}

#[tokio::test]
async fn a_hanging_call_never_answers_but_shutdown_still_completes() {
    let h = harness().await;
    h.api.inject_fault("*", Fault::Hang, 1);
    let url = format!("{}/getMe", h.server.bot_url());
    let outcome = h
        .http
        .get(url)
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(outcome.expect_err("no answer").is_timeout());
    assert_eq!(h.api.calls()[0].finished_ms, None);
    tokio::time::timeout(WAIT, h.server.shutdown())
        .await
        .expect("shutdown ends the hang")
        .expect("the server stops cleanly");
}

#[tokio::test]
async fn group_sends_beyond_twenty_a_minute_are_refused() {
    let h = harness_with(FakeConfig {
        rate_limits: true,
        ..FakeConfig::default()
    })
    .await;
    let params = json!({"chat_id": FORUM, "text": "tick"});
    for _ in 0..20 {
        h.ok("sendMessage", params.clone()).await;
    }
    let (status, body) = h.call("sendMessage", params).await;
    assert_eq!(status, 429);
    let retry_after = body["parameters"]["retry_after"]
        .as_u64()
        .expect("retry_after");
    assert!((1..=60).contains(&retry_after), "{body}");
    // Other chats have their own budget.
    h.ok("sendMessage", json!({"chat_id": USER, "text": "tick"}))
        .await;
}

#[tokio::test]
async fn set_my_commands_validates_and_stores() {
    let h = harness().await;
    let commands = json!([{"command": "relay", "description": "Relay status"}]);
    h.ok("setMyCommands", json!({"commands": commands})).await;
    assert_eq!(h.ok("getMyCommands", json!({})).await, commands);
    let bad = json!({"commands": [{"command": "Bad-Name", "description": "x"}]});
    assert_eq!(
        h.error("setMyCommands", bad).await.1,
        "Bad Request: BOT_COMMAND_INVALID"
    );
}

#[tokio::test]
async fn start_payload_arrives_as_a_command() {
    let h = harness().await;
    h.say(USER, None, "/start abc_123");
    let updates = h.ok("getUpdates", json!({})).await;
    let message = &updates[0]["message"];
    assert_eq!(message["text"], json!("/start abc_123"));
    assert_eq!(
        message["entities"][0],
        json!({"type": "bot_command", "offset": 0, "length": 6})
    );
}

#[tokio::test]
async fn wait_for_messages_times_out_or_returns_what_arrived() {
    let h = harness().await;
    let short = Duration::from_millis(50);
    assert_eq!(
        h.api.wait_for_messages(FORUM, None, 1, short).await,
        Err(FakeError::Timeout(short))
    );
    let waiting = h.api.wait_for_messages(FORUM, None, 2, WAIT);
    let sending = async {
        h.ok("sendMessage", json!({"chat_id": FORUM, "text": "1"}))
            .await;
        h.ok("sendMessage", json!({"chat_id": FORUM, "text": "2"}))
            .await;
    };
    let (found, ()) = tokio::join!(waiting, sending);
    assert_eq!(found.expect("two messages").len(), 2);
}

#[tokio::test]
async fn control_routes_drive_the_fake_from_outside() {
    let h = harness().await;
    let h = &h;
    let post = |route: &'static str, body: Value| h.control(route, Some(body));
    let get = |route: String| async move { h.control(&route, None).await };

    let chat = json!({"kind": "forum_supergroup", "chat_id": -100_500, "title": "Ops", "can_manage_topics": true});
    assert_eq!(post("chat", chat).await.0, 200);
    let thread_id = h.create_topic(-100_500, "A · ops").await;
    let (_, topics) = get("topics?chat_id=-100500".to_owned()).await;
    assert_eq!(topics[0]["thread_id"], json!(thread_id));

    let inject = json!({"chat_id": -100_500, "thread_id": thread_id, "user_id": USER, "text": "from outside"});
    let (_, injected) = post("inject_message", inject).await;
    let (_, raw) = post("inject_update", json!({"poll": {"id": "1"}})).await;
    let updates = h.ok("getUpdates", json!({})).await;
    assert_eq!(
        update_ids(&updates),
        [
            injected["update_id"].as_i64().unwrap_or(-1),
            raw["update_id"].as_i64().unwrap_or(-1)
        ]
    );

    let fault = json!({"method": "sendMessage", "times": 1, "fault": {"kind": "too_many_requests", "retry_after": 7}});
    assert_eq!(post("fault", fault).await.0, 200);
    let send = json!({"chat_id": -100_500, "message_thread_id": thread_id, "text": "reply"});
    assert_eq!(h.call("sendMessage", send.clone()).await.0, 429);
    h.ok("sendMessage", send).await;
    let (status, messages) = get(format!(
        "wait_messages?chat_id=-100500&thread_id={thread_id}&count=1&timeout_ms=5000"
    ))
    .await;
    assert_eq!(status, 200);
    assert_eq!(messages[0]["text"], json!("reply"));
    let (_, messages) = get(format!("messages?chat_id=-100500&thread_id={thread_id}")).await;
    assert_eq!(messages.as_array().map(Vec::len), Some(1));
    let (status, _) = get("wait_messages?chat_id=-100500&count=1&timeout_ms=10".to_owned()).await;
    assert_eq!(status, 408);

    let (_, calls) = get("calls".to_owned()).await;
    let methods: Vec<&str> = calls
        .as_array()
        .expect("a call list")
        .iter()
        .filter_map(|c| c["method"].as_str())
        .collect();
    assert_eq!(
        methods,
        [
            "createForumTopic",
            "getUpdates",
            "sendMessage",
            "sendMessage"
        ]
    );

    let topic = json!({"chat_id": -100_500, "thread_id": thread_id});
    assert_eq!(post("delete_topic", topic.clone()).await.0, 200);
    assert_eq!(post("delete_topic", topic).await.0, 400);
    assert!(h.api.topics(-100_500)[0].deleted);
}
