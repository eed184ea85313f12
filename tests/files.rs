//! Files, photos and voice notes both ways (issue 15), with real sidecars
//! and the fake Bot API: bytes in equal bytes out (SHA-256) in both
//! directions, an album is one prompt, a sender's file name never becomes a
//! path, a file over 20 MB gets a clear answer and nothing else, a
//! stranger's file is never downloaded, a leader killed mid-download
//! delivers the file once after failover, voice notes are transcribed (or
//! the topic says how), and a long answer that is mostly code goes as a file.

use crate::common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use agent_relay::fake_bot_api::{
    Fault, Injected, MediaInject, MediaKind, SentMessage, UserMessage,
};
use common::{
    CHAT, FakeServer, Options, Sidecar, USER, WAIT, accepting, connected, inject, prompts, session,
    topic, wait_prompt, wait_topic_text,
};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

/// The fake's bot id (the digits of its token).
const BOT: &str = "123456789";

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `len` bytes that start like a PNG, the rest varied (so a prefix or a
/// truncation never hashes the same).
fn png(len: usize) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut x: u32 = 0x1234_5678;
    while bytes.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        bytes.push(x as u8);
    }
    bytes
}

fn media(kind: MediaKind, bytes: Vec<u8>) -> MediaInject {
    MediaInject {
        kind,
        bytes: bytes.into(),
        ..MediaInject::default()
    }
}

/// A user posts `media` with `caption` into `thread`.
fn post(fake: &FakeServer, thread: i64, user: i64, caption: &str, media: MediaInject) -> Injected {
    post_in_album(fake, thread, user, caption, media, None)
}

fn post_in_album(
    fake: &FakeServer,
    thread: i64,
    user: i64,
    caption: &str,
    media: MediaInject,
    group: Option<&str>,
) -> Injected {
    fake.api()
        .inject_user_message(UserMessage {
            chat_id: CHAT,
            thread_id: Some(thread),
            user_id: user,
            text: caption.into(),
            media: Some(media),
            media_group_id: group.map(String::from),
            ..UserMessage::default()
        })
        .expect("a client would send this")
}

/// The prompt the host got for update `update_id`.
async fn prompt_for(s: &Sidecar, update_id: i64) -> Value {
    s.wait_for(&format!("the prompt of update {update_id}"), |m| {
        m["method"] == "agent/sendUserMessage" && m["params"]["origin"]["updateId"] == update_id
    })
    .await["params"]
        .clone()
}

/// The prompts the host got for update `update_id` (must be exactly one).
fn prompts_for(s: &Sidecar, update_id: i64) -> usize {
    prompts(s)
        .iter()
        .filter(|p| p["params"]["origin"]["updateId"] == update_id)
        .count()
}

fn inbox_root(home: &Path) -> PathBuf {
    home.join("state").join("inbox").join(BOT)
}

/// Asks the sidecar to send a file; the whole JSON-RPC response.
async fn send_file(s: &mut Sidecar, params: Value) -> Value {
    s.call_raw("file/send", params).await
}

/// The bytes of the file a bot message carries (a photo: its largest size).
fn uploaded(fake: &FakeServer, message: &SentMessage) -> Vec<u8> {
    let media = message.media.as_ref().expect("the message carries a file");
    fake.api()
        .file(&media.file_id)
        .expect("the fake holds the file")
        .bytes
        .to_vec()
}

/// Waits for the bot's message in `thread` whose caption contains `needle`.
async fn sent_file(fake: &FakeServer, thread: i64, needle: &str) -> SentMessage {
    let needle = needle.to_string();
    fake.api()
        .wait_until(
            |api| {
                api.messages(CHAT, Some(thread))
                    .into_iter()
                    .find(|m| m.media.is_some() && m.plain_text.contains(&needle))
            },
            WAIT,
        )
        .await
        .unwrap_or_else(|_| panic!("no file with {needle:?} in thread {thread}"))
}

#[tokio::test]
async fn a_photo_arrives_byte_for_byte_and_files_go_back_byte_for_byte() {
    let home = common::home();
    let cwd = tempfile::tempdir().unwrap();
    let fake = common::fake().await;
    let mut s = session(home.path(), &fake, cwd.path().to_str().unwrap(), "api").await;
    let thread = topic(&fake, "api").thread_id;

    // Inbound: a screenshot with a caption.
    let shot = png(300 * 1024 + 17);
    let posted = post(
        &fake,
        thread,
        USER,
        "what is wrong here?",
        media(MediaKind::Photo, shot.clone()),
    );
    let prompt = prompt_for(&s, posted.update_id).await;
    let attachment = &prompt["attachments"][0];
    assert_eq!(prompt["attachments"].as_array().unwrap().len(), 1);
    assert_eq!(attachment["kind"], "photo");
    assert_eq!(attachment["mimeType"], "image/jpeg");
    assert_eq!(attachment["size"], shot.len());
    let path = PathBuf::from(attachment["path"].as_str().unwrap());
    let saved = std::fs::read(&path).unwrap();
    println!(
        "inbound photo: sent sha256 {} ({} bytes), saved sha256 {} at {}",
        sha256(&shot),
        shot.len(),
        sha256(&saved),
        path.display()
    );
    assert_eq!(sha256(&saved), sha256(&shot), "bytes in = bytes out");
    let text = prompt["text"].as_str().unwrap();
    assert!(
        text.starts_with("what is wrong here?\n\n[photo from Telegram: "),
        "{text}"
    );
    assert!(text.contains(&path.display().to_string()), "{text}");
    // The inbox is private, inside the state dir.
    let folder = path.parent().unwrap();
    assert_eq!(folder.parent().unwrap(), inbox_root(home.path()));
    assert_eq!(
        std::fs::metadata(folder).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(
        std::fs::read_dir(folder).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".part")),
        "no part file is left"
    );

    // Outbound: a document and a picture from the working directory.
    let report = [b"%PDF-1.7\n".to_vec(), png(200 * 1024)].concat();
    std::fs::write(cwd.path().join("report.pdf"), &report).unwrap();
    let plot = png(90 * 1024 + 3);
    std::fs::create_dir(cwd.path().join("out")).unwrap();
    std::fs::write(cwd.path().join("out/plot.png"), &plot).unwrap();

    let answer = send_file(
        &mut s,
        json!({"path": "report.pdf", "caption": "the report"}),
    )
    .await;
    assert_eq!(answer["result"]["sentAs"], "document", "{answer}");
    assert_eq!(answer["result"]["size"], report.len());
    let message = sent_file(&fake, thread, "the report").await;
    assert_eq!(message.message_id, answer["result"]["messageId"]);
    let got = uploaded(&fake, &message);
    println!(
        "outbound document: file sha256 {}, uploaded sha256 {} ({} bytes)",
        sha256(&report),
        sha256(&got),
        got.len()
    );
    assert_eq!(sha256(&got), sha256(&report));

    let absolute = cwd.path().join("out/plot.png");
    let answer = send_file(
        &mut s,
        json!({"path": absolute.to_str().unwrap(), "caption": "the plot"}),
    )
    .await;
    assert_eq!(answer["result"]["sentAs"], "photo", "{answer}");
    let message = sent_file(&fake, thread, "the plot").await;
    let got = uploaded(&fake, &message);
    println!(
        "outbound photo: file sha256 {}, uploaded sha256 {}",
        sha256(&plot),
        sha256(&got)
    );
    assert_eq!(sha256(&got), sha256(&plot));
    let calls = fake.api().calls();
    let upload = calls.iter().rfind(|c| c.method == "sendPhoto").unwrap();
    assert_eq!(upload.params["photo"]["upload"]["file_name"], "plot.png");
    assert_eq!(upload.params["caption"], "the plot");
    // Multipart fields are text.
    assert_eq!(upload.params["message_thread_id"], thread.to_string());
    // A picture asked for as a document goes byte for byte as one.
    let answer = send_file(&mut s, json!({"path": "out/plot.png", "as": "document"})).await;
    assert_eq!(answer["result"]["sentAs"], "document", "{answer}");
}

#[tokio::test]
async fn files_outside_the_working_directory_too_big_or_missing_are_refused_clearly() {
    let home = common::home();
    let root = tempfile::tempdir().unwrap();
    let cwd = root.path().join("project");
    let secret = root.path().join("secret");
    std::fs::create_dir(&cwd).unwrap();
    std::fs::create_dir(&secret).unwrap();
    std::fs::write(secret.join("id_rsa"), b"PRIVATE KEY").unwrap();
    std::os::unix::fs::symlink(secret.join("id_rsa"), cwd.join("notes.txt")).unwrap();
    let big = std::fs::File::create(cwd.join("huge.bin")).unwrap();
    big.set_len(51 * 1024 * 1024).unwrap();
    std::fs::write(cwd.join("empty.txt"), b"").unwrap();
    let fake = common::fake().await;
    let mut s = session(home.path(), &fake, cwd.to_str().unwrap(), "api").await;
    let before = fake.api().calls().len();

    for (path, says) in [
        (secret.join("id_rsa").display().to_string(), "is outside"),
        ("notes.txt".to_string(), "is outside"),
        ("../secret/id_rsa".to_string(), "is outside"),
        ("missing.png".to_string(), "does not exist"),
        ("huge.bin".to_string(), "51 MB; bots can send at most 50 MB"),
        ("empty.txt".to_string(), "is empty"),
        (".".to_string(), "not a regular file"),
    ] {
        let answer = send_file(&mut s, json!({"path": path})).await;
        let error = &answer["error"];
        assert_eq!(error["code"], -32001, "{path}: {answer}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(says), "{path}: {message}");
        println!("file/send {path:?} → {message}");
    }
    let outside = send_file(&mut s, json!({"path": secret.join("id_rsa")})).await;
    assert!(
        outside["error"]["message"]
            .as_str()
            .unwrap()
            .contains("[files] send_from"),
        "the refusal names the setting: {outside}"
    );
    let uploads = fake.api().calls()[before..]
        .iter()
        .filter(|c| c.method.starts_with("send") && c.method != "sendChatAction")
        .count();
    assert_eq!(uploads, 0, "nothing refused reached Telegram");
}

/// A hard link to the relay's config inside the project is the config
/// under another name: `file/send` refuses it (and the store and the log
/// likewise), so the token never leaves as a file. The relay runs as a
/// second uid, an ordinary user who owns every file involved.
#[tokio::test]
async fn a_hard_link_to_the_relays_config_is_never_sent() {
    if common::skip_unless_root("running the relay as an ordinary user") {
        return;
    }
    let user = common::unused_uid(62_000);
    let home = common::home();
    let root = tempfile::tempdir().unwrap();
    let cwd = root.path().join("project");
    std::fs::create_dir(&cwd).unwrap();
    write_config(home.path(), &format!("bot_token = \"{}\"\n", common::TOKEN));
    std::fs::create_dir_all(home.path().join("state/logs")).unwrap();
    common::chown_all(home.path(), user);
    common::chown_all(root.path(), user);
    let fake = common::fake().await;
    let mut s = common::start(
        Options::new(home.path()).configured(&fake).run_as(user),
        cwd.to_str().unwrap(),
        "api",
    )
    .await;
    let config = home.path().join("config/config.toml");
    let store = home.path().join(format!("state/{BOT}.sqlite3"));
    let log = std::fs::read_dir(home.path().join("state/logs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.is_file())
        .expect("a log file");
    let before = fake.api().calls().len();
    for (file, name) in [
        (&config, "notes.txt"),
        (&store, "data.db"),
        (&log, "today.log"),
    ] {
        std::fs::hard_link(file, cwd.join(name)).unwrap();
        let answer = send_file(&mut s, json!({"path": name})).await;
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("under another name (a hard link)"),
            "{name}: {answer}"
        );
        println!("file/send {name:?} (a hard link) → {message}");
    }
    let calls = serde_json::to_string(&fake.api().calls()[before..]).unwrap();
    assert!(
        !calls.contains(common::SECRET),
        "the token reached Telegram"
    );
    assert!(!calls.contains("sendDocument"), "{calls}");
}

/// A download that ends early without an HTTP error (2,048 of the 4,096
/// bytes `getFile` announced) is not a received file: it is tried again,
/// then the topic is told, the agent gets the caption without it, and no
/// file is left in the inbox.
#[tokio::test]
async fn a_short_download_is_no_received_file() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    let mut file = media(MediaKind::Document, vec![7u8; 2048]);
    file.declared_size = Some(4096);
    file.file_name = Some("build.log".into());
    let posted = post(&fake, thread, USER, "look at this log", file);
    let prompt = prompt_for(&s, posted.update_id).await;
    assert_eq!(prompt["text"], "look at this log", "{prompt}");
    assert!(
        prompt["attachments"]
            .as_array()
            .is_none_or(|files| files.is_empty()),
        "{prompt}"
    );
    let told = wait_topic_text(&fake, thread, "Could not download").await;
    let told = told
        .iter()
        .find(|t| t.contains("Could not download"))
        .unwrap();
    assert!(
        told.contains("2048 bytes where Telegram announced 4096"),
        "{told}"
    );
    let tries = fake
        .api()
        .downloads()
        .iter()
        .filter(|d| d.file_id.as_deref() == Some(posted.file_ids[0].as_str()))
        .count();
    assert_eq!(tries, 3, "tried again before giving up");
    let saved: Vec<PathBuf> = std::fs::read_dir(inbox_root(home.path()))
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|folder| {
            std::fs::read_dir(folder.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|entry| entry.path())
        .collect();
    assert!(saved.is_empty(), "a short file was kept: {saved:?}");
}

#[tokio::test]
async fn a_folder_in_send_from_may_be_sent_from() {
    let home = common::home();
    let root = tempfile::tempdir().unwrap();
    let cwd = root.path().join("project");
    let shared = root.path().join("shared");
    std::fs::create_dir(&cwd).unwrap();
    std::fs::create_dir(&shared).unwrap();
    std::fs::write(shared.join("build.log"), b"ok\n").unwrap();
    std::os::unix::fs::symlink(shared.join("build.log"), cwd.join("latest.log")).unwrap();
    write_config(
        home.path(),
        &format!(
            "[files]\nsend_from = [{:?}]\n",
            shared.display().to_string()
        ),
    );
    let fake = common::fake().await;
    let mut s = session(home.path(), &fake, cwd.to_str().unwrap(), "api").await;
    // Through a link in the project, resolved to the allowed folder.
    let answer = send_file(&mut s, json!({"path": "latest.log"})).await;
    assert_eq!(answer["result"]["sentAs"], "document", "{answer}");
    let calls = fake.api().calls();
    let upload = calls.iter().rfind(|c| c.method == "sendDocument").unwrap();
    assert_eq!(
        upload.params["document"]["upload"]["file_name"],
        "build.log"
    );
}

#[tokio::test]
async fn an_album_is_one_prompt() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    let shots: Vec<Vec<u8>> = (0..3).map(|i| png(20_000 + i * 1000)).collect();
    let posted: Vec<Injected> = shots
        .iter()
        .enumerate()
        .map(|(i, shot)| {
            let caption = if i == 0 {
                "three screens of the bug"
            } else {
                ""
            };
            post_in_album(
                &fake,
                thread,
                USER,
                caption,
                media(MediaKind::Photo, shot.clone()),
                Some("13570"),
            )
        })
        .collect();
    let prompt = prompt_for(&s, posted[0].update_id).await;
    let attachments = prompt["attachments"].as_array().unwrap();
    assert_eq!(attachments.len(), 3, "{prompt}");
    for (attachment, shot) in attachments.iter().zip(&shots) {
        let saved = std::fs::read(attachment["path"].as_str().unwrap()).unwrap();
        assert_eq!(sha256(&saved), sha256(shot));
    }
    let text = prompt["text"].as_str().unwrap();
    assert!(text.starts_with("three screens of the bug\n\n"), "{text}");
    assert_eq!(text.matches("[photo from Telegram: ").count(), 3, "{text}");
    // Nothing else came: a text after the album is the second prompt.
    inject(&fake, Some(thread), USER, "and one more thing");
    wait_prompt(&s, "and one more thing").await;
    assert_eq!(prompts(&s).len(), 2, "{:#?}", prompts(&s));
}

#[tokio::test]
async fn a_senders_file_name_never_becomes_a_path() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    let bytes = b"alias ls='rm -rf ~'\n".to_vec();
    let mut file = media(MediaKind::Document, bytes.clone());
    file.file_name = Some("../../.bashrc".into());
    let posted = post(&fake, thread, USER, "", file);
    let prompt = prompt_for(&s, posted.update_id).await;
    let attachment = &prompt["attachments"][0];
    let path = PathBuf::from(attachment["path"].as_str().unwrap());
    let folder = path.parent().unwrap();
    assert_eq!(
        folder.parent().unwrap(),
        inbox_root(home.path()),
        "{path:?}"
    );
    assert_eq!(
        path.file_name().unwrap().to_string_lossy(),
        format!("{}-1-bashrc", posted.update_id)
    );
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    // The name is kept as the sender gave it, as information only.
    assert_eq!(attachment["name"], "../../.bashrc");
    for nowhere in [
        home.path().join(".bashrc"),
        home.path().join("state/.bashrc"),
        home.path().join("state/inbox/.bashrc"),
        inbox_root(home.path()).join(".bashrc"),
    ] {
        assert!(!nowhere.exists(), "{nowhere:?}");
    }
    println!(
        "a file named \"../../.bashrc\" was saved as {}",
        path.display()
    );
}

#[tokio::test]
async fn a_file_over_20_mb_gets_a_clear_answer_and_nothing_else() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    let mut file = media(MediaKind::Document, b"zip".to_vec());
    file.file_name = Some("logs.zip".into());
    file.declared_size = Some(30 * 1000 * 1000);
    let posted = post(&fake, thread, USER, "here are the logs", file);
    let texts = wait_topic_text(&fake, thread, "logs.zip").await;
    let answer = texts.iter().find(|t| t.contains("logs.zip")).unwrap();
    println!("the topic was told: {answer}");
    assert!(
        answer.contains("is 28.6 MB: bots can download at most 20 MB from Telegram"),
        "{answer}"
    );
    // One byte over: the sizes are told to the byte, not "20 MB … 20 MB".
    let mut file = media(MediaKind::Document, b"zip".to_vec());
    file.file_name = Some("just-over.zip".into());
    file.declared_size = Some(20 * 1024 * 1024 + 1);
    let just_over = post(&fake, thread, USER, "", file);
    let texts = wait_topic_text(&fake, thread, "just-over.zip").await;
    let answer = texts.iter().find(|t| t.contains("just-over.zip")).unwrap();
    assert!(
        answer.contains(
            "is 20,971,521 bytes: bots can download at most 20 MB (20,971,520 bytes) from Telegram"
        ),
        "{answer}"
    );
    inject(&fake, Some(thread), USER, "next");
    wait_prompt(&s, "next").await;
    assert_eq!(prompts_for(&s, posted.update_id), 0);
    assert_eq!(prompts_for(&s, just_over.update_id), 0);
    assert!(fake.api().calls().iter().all(|c| c.method != "getFile"));
    assert!(fake.api().downloads().is_empty());
}

#[tokio::test]
async fn a_strangers_file_is_never_downloaded() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    post(
        &fake,
        thread,
        666,
        "look",
        media(MediaKind::Photo, png(5000)),
    );
    let mut document = media(MediaKind::Document, b"payload".to_vec());
    document.file_name = Some("run-me.sh".into());
    post(&fake, thread, 666, "", document);
    inject(&fake, Some(thread), USER, "the real one");
    wait_prompt(&s, "the real one").await;
    assert_eq!(prompts(&s).len(), 1);
    assert!(fake.api().calls().iter().all(|c| c.method != "getFile"));
    assert!(fake.api().downloads().is_empty());
    assert!(
        !inbox_root(home.path()).exists()
            || std::fs::read_dir(inbox_root(home.path()))
                .unwrap()
                .next()
                .is_none()
    );
}

#[tokio::test]
async fn the_leader_killed_mid_download_delivers_the_file_once_after_failover() {
    let home = common::home();
    let fake = common::fake().await;
    let mut leader = session(home.path(), &fake, "/tmp/l", "lead").await;
    assert!(leader.latest_status().unwrap().contains("● leader"));
    let follower = session(home.path(), &fake, "/tmp/f", "files").await;
    let thread = topic(&fake, "files").thread_id;
    // The download stalls after half the file, and the leader dies then.
    fake.api().inject_fault("download", Fault::Hang, 1);
    let shot = png(400 * 1024);
    let posted = post(
        &fake,
        thread,
        USER,
        "the crash",
        media(MediaKind::Photo, shot.clone()),
    );
    fake.api()
        .wait_until(|api| (!api.downloads().is_empty()).then_some(()), WAIT)
        .await
        .expect("the leader starts downloading");
    leader.kill9().await;
    follower.wait_status(|s| s.contains("● leader")).await;

    let prompt = prompt_for(&follower, posted.update_id).await;
    let path = prompt["attachments"][0]["path"]
        .as_str()
        .unwrap()
        .to_string();
    let saved = std::fs::read(&path).unwrap();
    println!(
        "after failover: sent sha256 {}, saved sha256 {}; downloads {:?}",
        sha256(&shot),
        sha256(&saved),
        fake.api()
            .downloads()
            .iter()
            .map(|d| d.status)
            .collect::<Vec<_>>()
    );
    assert_eq!(sha256(&saved), sha256(&shot));
    // Delivery goes on, and the file's prompt came once.
    inject(&fake, Some(thread), USER, "after failover");
    wait_prompt(&follower, "after failover").await;
    assert_eq!(prompts_for(&follower, posted.update_id), 1);
    assert_eq!(
        fake.api().downloads().len(),
        2,
        "the stalled one, then one whole"
    );
    let folder = Path::new(&path).parent().unwrap();
    let names: Vec<String> = std::fs::read_dir(folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "no part file is left: {names:?}");
}

fn write_config(home: &Path, toml: &str) {
    let dir = home.join("config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(dir.join("config.toml"), toml).unwrap();
    std::fs::set_permissions(
        dir.join("config.toml"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
}

/// A speech-to-text program for the tests: a shell script that checks it
/// got the audio file, then behaves as `body` says.
fn transcriber(home: &Path, body: &str) -> PathBuf {
    let script = home.join("transcribe.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\n[ -s \"$1\" ] || {{ echo \"no audio at $1\" >&2; exit 9; }}\n{body}\n"),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).unwrap();
    script
}

fn voice(seconds: u32) -> MediaInject {
    let mut note = media(MediaKind::Voice, b"OggS\0\x02voice-note-bytes".to_vec());
    note.duration = Some(seconds);
    note
}

#[tokio::test]
async fn a_voice_note_is_transcribed_echoed_and_becomes_the_prompt() {
    let home = common::home();
    let script = transcriber(home.path(), "echo '  please run the tests  '");
    write_config(
        home.path(),
        &format!(
            "transcribe_command = [{:?}, \"{{file}}\"]\n",
            script.display().to_string()
        ),
    );
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    let posted = post(&fake, thread, USER, "", voice(3));
    let prompt = prompt_for(&s, posted.update_id).await;
    let text = prompt["text"].as_str().unwrap();
    assert!(
        text.starts_with(
            "please run the tests\n\n[voice note (0:03, transcribed above) from Telegram: "
        ),
        "{text}"
    );
    assert_eq!(prompt["attachments"][0]["kind"], "voice");
    assert_eq!(prompt["attachments"][0]["durationS"], 3);
    let texts = wait_topic_text(&fake, thread, "🎙").await;
    assert!(
        texts.contains(&"🎙 “please run the tests”".to_string()),
        "{texts:?}"
    );
}

/// The transcriber is the user's program with the user's environment, but
/// not the relay's secrets: the bot token and the relay's variables stay
/// out of it.
#[tokio::test]
async fn the_transcriber_never_sees_the_token() {
    let home = common::home();
    let script = transcriber(home.path(), "env");
    write_config(
        home.path(),
        &format!(
            "transcribe_command = [{:?}, \"{{file}}\"]\n",
            script.display().to_string()
        ),
    );
    let fake = common::fake().await;
    let s = common::start(
        Options::new(home.path())
            .configured(&fake)
            .env("LANG", "C.UTF-8"),
        "/tmp/a",
        "api",
    )
    .await;
    let thread = topic(&fake, "api").thread_id;
    let posted = post(&fake, thread, USER, "", voice(3));
    let prompt = prompt_for(&s, posted.update_id).await;
    let heard = prompt["text"].as_str().unwrap();
    assert!(
        heard.contains("LANG=C.UTF-8"),
        "the user's environment: {heard}"
    );
    assert!(!heard.contains(common::SECRET), "the token: {heard}");
    assert!(!heard.contains("TELEGRAM_BOT_TOKEN"), "{heard}");
    assert!(!heard.contains("AGENT_RELAY_"), "{heard}");
}

#[tokio::test]
async fn without_a_transcriber_the_agent_gets_the_audio_and_the_topic_is_told_once() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    let first = post(&fake, thread, USER, "", voice(7));
    let second = post(&fake, thread, USER, "", voice(2));
    for update in [first.update_id, second.update_id] {
        let prompt = prompt_for(&s, update).await;
        let text = prompt["text"].as_str().unwrap();
        assert!(text.starts_with("[voice note ("), "{text}");
        let saved = std::fs::read(prompt["attachments"][0]["path"].as_str().unwrap()).unwrap();
        assert_eq!(saved, b"OggS\0\x02voice-note-bytes");
    }
    let texts = wait_topic_text(&fake, thread, "transcribe_command").await;
    let hints: Vec<&String> = texts
        .iter()
        .filter(|t| t.contains("transcribe_command"))
        .collect();
    assert_eq!(hints.len(), 1, "told once: {texts:?}");
    println!("the topic was told: {}", hints[0]);
    assert!(hints[0].contains("config.toml"), "{}", hints[0]);
}

#[tokio::test]
async fn a_failing_or_slow_transcriber_is_reported_and_nothing_is_lost() {
    let home = common::home();
    // The first run fails, the second hangs past the timeout.
    let marker = home.path().join("ran-once");
    let script = transcriber(
        home.path(),
        &format!(
            "if [ -e '{0}' ]; then sleep 30; else touch '{0}'; echo 'model ggml-base.bin not found' >&2; exit 3; fi",
            marker.display()
        ),
    );
    write_config(
        home.path(),
        &format!(
            "transcribe_command = [{:?}]\ntranscribe_timeout_s = 1\n",
            script.display().to_string()
        ),
    );
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;

    let failing = post(&fake, thread, USER, "", voice(4));
    let prompt = prompt_for(&s, failing.update_id).await;
    assert!(
        prompt["text"]
            .as_str()
            .unwrap()
            .starts_with("[voice note (0:04) from Telegram: ")
    );
    let texts = wait_topic_text(&fake, thread, "transcribe_command failed").await;
    let said = texts.iter().find(|t| t.contains("failed")).unwrap();
    println!("the topic was told: {said}");
    assert_eq!(
        said,
        "⚠️ transcribe_command failed (exit 3: model ggml-base.bin not found). The agent got the voice note as an audio file."
    );

    let slow = post(&fake, thread, USER, "with a caption", voice(5));
    let prompt = prompt_for(&s, slow.update_id).await;
    assert!(
        prompt["text"]
            .as_str()
            .unwrap()
            .starts_with("with a caption\n\n[voice note (0:05) from Telegram: ")
    );
    let texts = wait_topic_text(&fake, thread, "took longer").await;
    let said = texts.iter().find(|t| t.contains("took longer")).unwrap();
    println!("the topic was told: {said}");
    assert_eq!(
        said,
        "⚠️ transcribe_command took longer than 1 s and was stopped. The agent got the voice note as an audio file."
    );
}

#[tokio::test]
async fn a_long_answer_that_is_mostly_code_goes_as_a_file() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    let code: String = (0..700)
        .map(|i| format!("fn step_{i}() -> u32 {{ {i} * 2 }}\n"))
        .collect();
    let answer = format!("The generated module:\n\n```rust\n{code}```\n\nIt compiles.");
    s.notify(
        "turn/ended",
        json!({"assistantText": answer, "toolCalls": []}),
    );
    let file = sent_file(&fake, thread, "as a file").await;
    let got = uploaded(&fake, &file);
    println!(
        "long answer: code sha256 {}, uploaded answer.rs sha256 {}; caption {:?}",
        sha256(code.as_bytes()),
        sha256(&got),
        file.plain_text
    );
    assert_eq!(sha256(&got), sha256(code.as_bytes()));
    let record = fake
        .api()
        .file(&file.media.as_ref().unwrap().file_id)
        .unwrap();
    assert_eq!(record.file_name.as_deref(), Some("answer.rs"));
    let texts: Vec<String> = fake
        .api()
        .messages(CHAT, Some(thread))
        .into_iter()
        .filter(|m| m.media.is_none())
        .map(|m| m.plain_text)
        .filter(|t| !t.contains("connected"))
        .collect();
    assert_eq!(
        texts,
        ["The generated module:\n\nIt compiles."],
        "one message and one file"
    );
}

#[tokio::test]
async fn files_reach_a_follower_and_go_out_from_it_through_the_leader() {
    let home = common::home();
    let cwd = tempfile::tempdir().unwrap();
    let fake = common::fake().await;
    let _leader = session(home.path(), &fake, "/tmp/l", "lead").await;
    let mut follower = Sidecar::spawn(accepting(Options::new(home.path()).configured(&fake)));
    follower
        .handshake(cwd.path().to_str().unwrap(), "far")
        .await;
    follower.wait_status(connected).await;
    assert!(follower.latest_status().unwrap().contains("● follower"));
    let thread = topic(&fake, "far").thread_id;
    let mut document = media(MediaKind::Document, b"2026-01-01 ERROR boom\n".to_vec());
    document.file_name = Some("app.log".into());
    document.mime_type = Some("text/plain".into());
    let posted = post(&fake, thread, USER, "why?", document);
    let prompt = prompt_for(&follower, posted.update_id).await;
    assert_eq!(prompt["attachments"][0]["name"], "app.log");
    assert!(
        prompt["text"]
            .as_str()
            .unwrap()
            .contains("[file “app.log” from Telegram: "),
        "{prompt}"
    );
    std::fs::write(cwd.path().join("fix.diff"), b"--- a\n+++ b\n").unwrap();
    let answer = send_file(
        &mut follower,
        json!({"path": "fix.diff", "caption": "the fix"}),
    )
    .await;
    assert_eq!(answer["result"]["sentAs"], "document", "{answer}");
    let message = sent_file(&fake, thread, "the fix").await;
    assert_eq!(uploaded(&fake, &message), b"--- a\n+++ b\n");
}
