//! Files both ways: users' media, `getFile` and downloads; the bot's uploads.

use super::*;

fn photo(bytes: Vec<u8>) -> MediaInject {
    MediaInject {
        kind: MediaKind::Photo,
        bytes: bytes.into(),
        ..MediaInject::default()
    }
}

fn user_media(media: MediaInject, caption: &str) -> UserMessage {
    UserMessage {
        chat_id: USER,
        user_id: USER,
        text: caption.to_owned(),
        media: Some(media),
        ..UserMessage::default()
    }
}

impl Harness {
    /// `getFile`, then the download; returns the downloaded bytes.
    async fn fetch_file(&self, file_id: &str) -> Vec<u8> {
        let file = self.ok("getFile", json!({"file_id": file_id})).await;
        let path = file["file_path"].as_str().expect("a file path");
        let (status, bytes) = self
            .get_bytes(&format!("file/bot{}/{path}", self.api.token()))
            .await;
        assert_eq!(status, 200, "{path}");
        bytes
    }
}

#[tokio::test]
async fn a_users_photo_arrives_in_sizes_and_downloads_byte_for_byte() {
    let h = harness().await;
    let thread_id = h.create_topic(USER, "A · api").await;
    let bytes = png(40_000);
    let injected = h
        .api
        .inject_user_message(UserMessage {
            thread_id: Some(thread_id),
            ..user_media(photo(bytes.clone()), "the <b>bug</b>")
        })
        .expect("a photo");
    let updates = h.ok("getUpdates", json!({})).await;
    let message = &updates[0]["message"];
    assert_eq!(message["caption"], json!("the <b>bug</b>"));
    assert!(message.get("text").is_none(), "{message}");
    assert_eq!(message["message_thread_id"], json!(thread_id));
    let sizes = message["photo"].as_array().expect("photo sizes");
    assert!(sizes.len() >= 2, "{sizes:?}");
    let size_of = |s: &Value| s["file_size"].as_u64().expect("file_size");
    assert!(sizes.windows(2).all(|w| size_of(&w[0]) < size_of(&w[1])));
    let largest = sizes.last().expect("a largest size");
    assert_eq!(size_of(largest), bytes.len() as u64);
    assert_eq!(largest["width"], json!(1280));
    let ids: Vec<&str> = sizes
        .iter()
        .map(|s| s["file_id"].as_str().expect("file_id"))
        .collect();
    assert_eq!(injected.file_ids, ids);
    assert!(sizes.iter().all(|s| s["file_unique_id"].is_string()));

    let file_id = ids[ids.len() - 1];
    let file = h.ok("getFile", json!({"file_id": file_id})).await;
    assert_eq!(file["file_id"], json!(file_id));
    assert_eq!(file["file_size"], json!(bytes.len()));
    assert!(
        file["file_path"]
            .as_str()
            .is_some_and(|p| p.starts_with("photos/"))
    );
    assert_eq!(h.fetch_file(file_id).await, bytes);
    let downloads = h.api.downloads();
    assert_eq!(downloads.len(), 1);
    assert_eq!(downloads[0].file_id.as_deref(), Some(file_id));
    assert_eq!(downloads[0].status, 200);
}

#[tokio::test]
async fn documents_voice_animations_and_albums_look_like_telegrams() {
    let h = harness().await;
    let document = MediaInject {
        kind: MediaKind::Document,
        bytes: b"%PDF-1.7 report".to_vec().into(),
        file_name: Some("report.pdf".to_owned()),
        ..MediaInject::default()
    };
    let entities = vec![json!({"type": "bold", "offset": 0, "length": 4})];
    h.api
        .inject_user_message(UserMessage {
            entities: entities.clone(),
            ..user_media(document, "read this")
        })
        .expect("a document");
    let voice = MediaInject {
        kind: MediaKind::Voice,
        bytes: b"OggS voice".to_vec().into(),
        duration: Some(3),
        ..MediaInject::default()
    };
    h.api
        .inject_user_message(user_media(voice, ""))
        .expect("a voice note");
    let animation = MediaInject {
        kind: MediaKind::Animation,
        bytes: b"gif-ish".to_vec().into(),
        file_name: Some("party.mp4".to_owned()),
        ..MediaInject::default()
    };
    h.api
        .inject_user_message(user_media(animation, ""))
        .expect("an animation");
    for part in [png(100), png(200)] {
        h.api
            .inject_user_message(UserMessage {
                media_group_id: Some("13572468".to_owned()),
                ..user_media(photo(part), "")
            })
            .expect("an album photo");
    }

    let updates = h.ok("getUpdates", json!({})).await;
    let messages: Vec<&Value> = updates
        .as_array()
        .expect("updates")
        .iter()
        .map(|u| &u["message"])
        .collect();
    let document = &messages[0]["document"];
    assert_eq!(document["file_name"], json!("report.pdf"));
    assert_eq!(document["mime_type"], json!("application/pdf"));
    assert_eq!(document["file_size"], json!(15));
    assert_eq!(messages[0]["caption_entities"], json!(entities));
    let voice = &messages[1]["voice"];
    assert_eq!(voice["mime_type"], json!("audio/ogg"));
    assert_eq!(voice["duration"], json!(3));
    assert!(messages[1].get("caption").is_none());
    assert_eq!(
        messages[2]["animation"]["file_id"],
        messages[2]["document"]["file_id"]
    );
    assert_eq!(messages[3]["media_group_id"], json!("13572468"));
    assert_eq!(messages[4]["media_group_id"], json!("13572468"));
    assert_ne!(messages[3]["message_id"], messages[4]["message_id"]);
}

#[tokio::test]
async fn get_file_enforces_telegrams_limits_and_downloads_check_the_token() {
    let h = harness().await;
    let big = MediaInject {
        kind: MediaKind::Video,
        declared_size: Some(25 * 1024 * 1024),
        ..MediaInject::default()
    };
    let big = h
        .api
        .inject_user_message(user_media(big, ""))
        .expect("a declared-size video");
    let updates = h.ok("getUpdates", json!({})).await;
    assert_eq!(
        updates[0]["message"]["video"]["file_size"],
        json!(25 * 1024 * 1024)
    );
    assert_eq!(
        h.error("getFile", json!({"file_id": big.file_ids[0]}))
            .await,
        (400, "Bad Request: file is too big".to_owned())
    );
    assert_eq!(
        h.error("getFile", json!({"file_id": "AgACAgIAAxkBnope"}))
            .await,
        (400, "Bad Request: invalid file_id".to_owned())
    );

    let stranger = h
        .api
        .inject_user_message(UserMessage {
            user_id: 6666,
            chat_id: 6666,
            ..user_media(photo(png(500)), "")
        })
        .expect("a stranger's photo");
    let mine = h
        .api
        .inject_user_message(user_media(photo(png(500)), ""))
        .expect("my photo");
    let file = h.ok("getFile", json!({"file_id": mine.file_ids[0]})).await;
    let path = file["file_path"].as_str().expect("a path");
    let (status, body) = h.get_bytes(&format!("file/bot1:wrong/{path}")).await;
    assert_eq!(status, 401);
    assert!(String::from_utf8_lossy(&body).contains("Unauthorized"));
    let token = h.api.token();
    let (status, _) = h
        .get_bytes(&format!("file/bot{token}/photos/file_9999.jpg"))
        .await;
    assert_eq!(status, 404);
    h.fetch_file(&mine.file_ids[0]).await;

    let statuses: Vec<u16> = h.api.downloads().iter().map(|d| d.status).collect();
    assert_eq!(statuses, [401, 404, 200]);
    assert!(
        h.api.downloads().iter().all(|d| d
            .file_id
            .as_ref()
            .is_none_or(|id| !stranger.file_ids.contains(id))),
        "the stranger's photo was never downloaded"
    );
}

#[tokio::test]
async fn a_download_fault_stalls_mid_file_and_touches_only_downloads() {
    let h = harness().await;
    let bytes = png(10_000);
    let mine = h
        .api
        .inject_user_message(user_media(photo(bytes.clone()), ""))
        .expect("my photo");
    let file_id = mine.file_ids.last().expect("a largest size").clone();
    // A `*` fault is for Bot API calls, not for downloads.
    h.api.inject_fault("download", Fault::Hang, 1);
    h.api.inject_fault("*", Fault::ServerError { code: 502 }, 1);
    assert_eq!(h.error("getMe", json!({})).await.0, 502);
    let file = h.ok("getFile", json!({"file_id": file_id})).await;
    let url = format!(
        "{}/file/bot{}/{}",
        h.server.url(),
        h.api.token(),
        file["file_path"].as_str().expect("a path")
    );
    let mut response = h.http.get(&url).send().await.expect("headers arrive");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.content_length(), Some(bytes.len() as u64));
    let first = response
        .chunk()
        .await
        .expect("a first chunk")
        .expect("bytes");
    assert_eq!(&first[..], &bytes[..bytes.len() / 2]);
    let stalled = tokio::time::timeout(Duration::from_millis(300), response.chunk()).await;
    assert!(stalled.is_err(), "the rest never comes");
    // The fault was used once: the next download is whole.
    assert_eq!(h.fetch_file(&file_id).await, bytes);
    assert_eq!(h.api.downloads().len(), 2);
}

#[test]
fn a_client_refuses_empty_texts_and_long_captions() {
    let api = FakeBotApi::new(FakeConfig::default());
    api.add_default_chats();
    let caption = "c".repeat(1025);
    assert!(matches!(
        api.inject_user_message(user_media(photo(png(10)), &caption)),
        Err(FakeError::Refused(_))
    ));
    let empty = UserMessage {
        chat_id: USER,
        user_id: USER,
        ..UserMessage::default()
    };
    assert!(matches!(
        api.inject_user_message(empty),
        Err(FakeError::Refused(_))
    ));
    assert!(api.pending_update_ids().is_empty());
}

#[tokio::test]
async fn an_uploaded_document_is_kept_byte_for_byte() {
    let h = harness().await;
    let thread_id = h.create_topic(FORUM, "A · api").await;
    let bytes: Vec<u8> = (0..70_000u32).map(|i| (i % 253) as u8).collect();
    let markup = json!({"inline_keyboard": [[{"text": "Open", "callback_data": "open"}]]});
    let form = Form::new()
        .field("chat_id", FORUM)
        .field("message_thread_id", thread_id)
        .field("caption", "<b>build</b> log")
        .field("parse_mode", "HTML")
        .field("reply_markup", &markup)
        .file("document", "build.log", "application/octet-stream", &bytes);
    let (status, body) = h.upload("sendDocument", form).await;
    assert_eq!(status, 200, "{body}");
    let message = &body["result"];
    assert_eq!(message["message_thread_id"], json!(thread_id));
    assert_eq!(message["caption"], json!("build log"));
    assert_eq!(
        message["caption_entities"][0],
        json!({"type": "bold", "offset": 0, "length": 5})
    );
    assert_eq!(message["reply_markup"], markup);
    let document = &message["document"];
    assert_eq!(document["file_name"], json!("build.log"));
    assert_eq!(document["mime_type"], json!("text/plain"));
    assert_eq!(document["file_size"], json!(bytes.len()));
    let file_id = document["file_id"].as_str().expect("file_id");

    let uploads = h.api.uploads();
    assert_eq!(uploads.len(), 1);
    assert_eq!(uploads[0].file_id, file_id);
    assert_eq!(uploads[0].bytes, bytes);
    let sent = &h.api.messages(FORUM, Some(thread_id))[0];
    assert_eq!(sent.text, "<b>build</b> log");
    assert_eq!(
        sent.media.as_ref().map(|m| m.kind),
        Some(MediaKind::Document)
    );
    assert_eq!(h.fetch_file(file_id).await, bytes);
    let call = &h.api.calls()[1];
    assert_eq!(
        call.params["document"]["upload"]["size"],
        json!(bytes.len())
    );
}

#[tokio::test]
async fn photos_come_back_in_sizes_and_file_ids_can_be_sent_again() {
    let h = harness().await;
    let bytes = png(30_000);
    // The file may also sit in another part, named by `attach://`.
    let form = Form::new()
        .field("chat_id", USER)
        .field("photo", "attach://shot")
        .file("shot", "screen.png", "image/png", &bytes);
    let (status, body) = h.upload("sendPhoto", form).await;
    assert_eq!(status, 200, "{body}");
    let sizes = body["result"]["photo"].as_array().expect("photo sizes");
    let largest = sizes.last().expect("largest");
    assert_eq!(largest["file_size"], json!(bytes.len()));
    let file_id = largest["file_id"].as_str().expect("file_id").to_owned();
    assert_eq!(
        h.api.file(&file_id).map(|f| f.bytes.to_vec()),
        Some(bytes.clone())
    );

    let again = h
        .ok(
            "sendPhoto",
            json!({"chat_id": FORUM, "photo": file_id, "caption": "again"}),
        )
        .await;
    assert_eq!(again["photo"], body["result"]["photo"]);
    assert_eq!(
        h.api.uploads().len(),
        sizes.len(),
        "resending uploads nothing"
    );

    let refusals = [
        (
            json!({"chat_id": FORUM, "document": file_id}),
            "sendDocument",
            "Bad Request: type of file mismatch",
        ),
        (
            json!({"chat_id": FORUM, "photo": "AgACAgIAAxkBnope"}),
            "sendPhoto",
            "Bad Request: wrong file identifier/HTTP URL specified",
        ),
        (
            json!({"chat_id": FORUM}),
            "sendPhoto",
            "Bad Request: there is no photo in the request",
        ),
    ];
    for (params, method, description) in refusals {
        assert_eq!(h.error(method, params).await, (400, description.to_owned()));
    }
    let not_an_image =
        Form::new()
            .field("chat_id", USER)
            .file("photo", "notes.txt", "text/plain", b"just text");
    let (status, body) = h.upload("sendPhoto", not_an_image).await;
    assert_eq!(
        (status, &body["description"]),
        (400, &json!("Bad Request: IMAGE_PROCESS_FAILED"))
    );
}

#[tokio::test]
async fn uploads_over_the_limit_are_refused_with_413() {
    let h = harness().await;
    let too_large =
        json!({"ok": false, "error_code": 413, "description": "Request Entity Too Large"});
    let photo = png(10 * 1024 * 1024 + 1);
    let form = Form::new()
        .field("chat_id", USER)
        .file("photo", "big.png", "image/png", &photo);
    assert_eq!(h.upload("sendPhoto", form).await, (413, too_large.clone()));
    // The same bytes are fine as a document (≤ 50 MB).
    let form = Form::new()
        .field("chat_id", USER)
        .file("document", "big.png", "image/png", &photo);
    assert_eq!(h.upload("sendDocument", form).await.0, 200);
    let huge = vec![0u8; 50 * 1024 * 1024 + 1];
    let form = Form::new().field("chat_id", USER).file(
        "document",
        "huge.bin",
        "application/octet-stream",
        &huge,
    );
    assert_eq!(h.upload("sendDocument", form).await, (413, too_large));
    assert_eq!(h.api.messages(USER, None).len(), 1);
}

#[tokio::test]
async fn captions_and_topics_are_checked_like_send_message() {
    let h = harness().await;
    let long = Form::new()
        .field("chat_id", FORUM)
        .field("caption", "c".repeat(1025))
        .file("voice", "note.ogg", "audio/ogg", b"OggS");
    assert_eq!(
        h.upload("sendVoice", long).await.1["description"],
        json!("Bad Request: message caption is too long")
    );
    let bad_html = Form::new()
        .field("chat_id", FORUM)
        .field("caption", "<b>open")
        .field("parse_mode", "HTML")
        .file("audio", "song.mp3", "audio/mpeg", b"ID3");
    let (status, body) = h.upload("sendAudio", bad_html).await;
    assert_eq!(status, 400);
    assert!(
        body["description"]
            .as_str()
            .is_some_and(|d| d.starts_with("Bad Request: can't parse entities: ")),
        "{body}"
    );

    let thread_id = h.create_topic(FORUM, "A · api").await;
    h.ok(
        "deleteForumTopic",
        json!({"chat_id": FORUM, "message_thread_id": thread_id}),
    )
    .await;
    for thread in [thread_id, 1] {
        let form = Form::new()
            .field("chat_id", FORUM)
            .field("message_thread_id", thread)
            .file("document", "a.txt", "text/plain", b"a");
        assert_eq!(
            h.upload("sendDocument", form).await.1["description"],
            json!("Bad Request: message thread not found")
        );
    }
    let voice = Form::new()
        .field("chat_id", FORUM)
        .field("duration", 4)
        .file("voice", "note.ogg", "audio/ogg", b"OggS");
    let (status, body) = h.upload("sendVoice", voice).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["voice"]["duration"], json!(4));
    assert_eq!(body["result"]["voice"]["mime_type"], json!("audio/ogg"));
    assert!(h.api.uploads().iter().all(|f| f.kind == MediaKind::Voice));
}
