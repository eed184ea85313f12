//! Nothing a person types takes the relay down, and nothing they write
//! goes unanswered: numbers are range-checked where they are read, a
//! stored item no leader can handle is set aside with a word (never
//! replayed into every next leader), a burst of commands is answered in
//! full, an edited command is not run again, and the control place's texts
//! and lists stay within what Telegram takes.

use crate::common;

use common::{CHAT, USER, inject, session, topic, wait_prompt, wait_topic_text};

/// The store of the bot the tests' token names.
fn store(home: &std::path::Path) -> std::path::PathBuf {
    home.join("state").join("123456789.sqlite3")
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `/every` with an interval whose milliseconds overflow, and `/at` two
/// hundred million years ahead: each is refused in words, nothing is
/// stored, and the relay goes on delivering (before: the first fired at
/// once and divided by zero on the leader's loop, which kept the lock).
#[tokio::test]
async fn a_number_too_large_is_refused_in_words_and_the_relay_goes_on() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = topic(&fake, "api").thread_id;

    inject(
        &fake,
        Some(thread),
        USER,
        "/every 2305843009213693952s boom",
    );
    wait_topic_text(&fake, thread, "longer than a year").await;
    inject(&fake, Some(thread), USER, "/at +200000000y x");
    wait_topic_text(&fake, thread, "more than a year ahead").await;
    inject(&fake, Some(thread), USER, "/at 9999-12-31 23:59 far");
    wait_topic_text(&fake, thread, "more than a year ahead").await;

    inject(&fake, Some(thread), USER, "still there?");
    wait_prompt(&s, "still there?").await;
    let db = rusqlite::Connection::open(store(home.path())).expect("the store");
    let stored: i64 = db
        .query_row("SELECT COUNT(*) FROM schedules", [], |r| r.get(0))
        .expect("count");
    assert_eq!(stored, 0, "nothing refused is stored");
    // The loop kept its clock: a sound schedule still fires.
    inject(&fake, Some(thread), USER, "/at +1s on time");
    wait_prompt(&s, "on time").await;
}

/// A schedule in the store that no firing can be computed for (an older
/// version's, or written by hand: an interval of 2^61 s) is set aside once,
/// its topic told with its prompt, and the relay delivers meanwhile; the
/// next leader finds nothing left to trip on.
#[tokio::test]
async fn a_stored_schedule_no_leader_can_fire_is_set_aside_and_told() {
    let home = common::home();
    let fake = common::fake().await;
    let mut s = session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = topic(&fake, "api").thread_id;
    s.close_stdin();
    s.wait_exit().await;

    let db = rusqlite::Connection::open(store(home.path())).expect("the store");
    db.execute(
        "INSERT INTO schedules (profile_key, every_s, once, prompt, next_ms, chat_id, thread_id, by_user, created_ms) \
         VALUES ('cwd:/tmp/api#api', 2305843009213693952, 0, 'boom', ?1, ?2, ?3, ?4, ?1)",
        rusqlite::params![now_ms() - 1_000, CHAT, thread, USER],
    )
    .expect("a schedule");
    drop(db);

    let mut s = session(home.path(), &fake, "/tmp/api", "api").await;
    let said = wait_topic_text(&fake, thread, "was set aside and will not fire").await;
    assert!(
        said.iter().any(|t| t.contains("(“boom”)")),
        "the prompt is named: {said:?}"
    );
    inject(&fake, Some(thread), USER, "after the boom");
    wait_prompt(&s, "after the boom").await;
    let db = rusqlite::Connection::open(store(home.path())).expect("the store");
    let left: i64 = db
        .query_row("SELECT COUNT(*) FROM schedules", [], |r| r.get(0))
        .expect("count");
    assert_eq!(left, 0, "set aside for good");

    // The next leader has nothing to trip on, and says nothing twice.
    s.close_stdin();
    s.wait_exit().await;
    let s = session(home.path(), &fake, "/tmp/api", "api").await;
    inject(&fake, Some(thread), USER, "and again");
    // Delivered: its leader's loop has ticked, and found no schedule.
    wait_prompt(&s, "and again").await;
    let told = fake
        .api()
        .messages(CHAT, Some(thread))
        .into_iter()
        .filter(|m| m.plain_text.contains("was set aside"))
        .count();
    assert_eq!(told, 1, "told once");
}

/// A hundred commands at once each get their answer: past what runs at
/// once they wait their turn (before: 64 were answered, the rest dropped
/// without a word).
#[tokio::test]
async fn a_burst_of_commands_is_answered_in_full() {
    let home = common::home();
    let fake = common::fake().await;
    // Telegram's pacing (20 messages a minute in a group) is not what is
    // tested here.
    let options = common::Options::new(home.path())
        .configured(&fake)
        .env("AGENT_RELAY_UNLIMITED", "1");
    let _s = common::start(options, "/tmp/api", "api").await;
    for _ in 0..100 {
        inject(&fake, None, USER, "/schedules");
    }
    let answered = fake
        .api()
        .wait_until(
            |api| {
                let lists = api
                    .messages(CHAT, None)
                    .into_iter()
                    .filter(|m| m.plain_text.starts_with("No prompts are scheduled"))
                    .count();
                (lists >= 100).then_some(lists)
            },
            common::WAIT,
        )
        .await;
    let lists = fake
        .api()
        .messages(CHAT, None)
        .into_iter()
        .filter(|m| m.plain_text.starts_with("No prompts are scheduled"))
        .count();
    assert!(answered.is_ok(), "{lists} of 100 commands answered");
    assert_eq!(lists, 100);
}

/// A bot token quoted by an agent's answer, or pasted by a person, never
/// reaches the disk: what is kept (the journal, the outbox of record, the
/// write-ahead log beside them) holds it masked, as Telegram is shown it.
#[tokio::test]
async fn a_token_is_masked_before_it_is_stored() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = topic(&fake, "api").thread_id;
    let quoted = format!("curl https://api.telegram.org/bot{}/getMe", common::TOKEN);
    inject(
        &fake,
        Some(thread),
        USER,
        &format!("why does {quoted} fail?"),
    );
    let masked = quoted.replace(common::SECRET, "<redacted>");
    wait_prompt(&s, &format!("why does {masked} fail?")).await;
    s.notify(
        "turn/ended",
        serde_json::json!({"assistantText": format!("Run `{quoted}` again."), "toolCalls": []}),
    );
    wait_topic_text(&fake, thread, "again").await;
    inject(
        &fake,
        Some(thread),
        USER,
        &format!("/every 1h check {quoted}"),
    );
    wait_topic_text(&fake, thread, "⏰ #1 scheduled").await;
    let state = home.path().join("state");
    for entry in std::fs::read_dir(&state).expect("the state folder") {
        let path = entry.expect("an entry").path();
        if path.is_file() {
            let bytes = std::fs::read(&path).expect("readable");
            let found = bytes
                .windows(common::SECRET.len())
                .any(|w| w == common::SECRET.as_bytes());
            assert!(!found, "the token's secret is in {}", path.display());
        }
    }
}

/// What the control place builds from what a person wrote fits in a
/// message: `/new` with a folder of 5,000 characters is answered (before:
/// its "⏳ Starting" line was refused as too long, and nothing came).
#[tokio::test]
async fn a_command_with_a_huge_argument_is_answered() {
    let home = common::home();
    let fake = common::fake().await;
    let _s = session(home.path(), &fake, "/tmp/api", "api").await;
    inject(
        &fake,
        None,
        USER,
        &format!("/new /tmp/{} pi", "a".repeat(5000)),
    );
    let answered = fake
        .api()
        .wait_until(
            |api| {
                api.messages(CHAT, None)
                    .into_iter()
                    .find(|m| m.plain_text.starts_with("⚠️ Not done"))
            },
            common::WAIT,
        )
        .await
        .expect("answered, in words");
    assert!(
        answered
            .plain_text
            .contains("starting agents from the phone is off"),
        "{}",
        answered.plain_text
    );
}

/// `/schedules` with a hundred schedules is a list of pages with its
/// buttons, each page within what Telegram takes (before: one message too
/// long to send, so no list and no cancel button).
#[tokio::test]
async fn a_long_list_of_schedules_comes_a_page_at_a_time() {
    let home = common::home();
    let fake = common::fake().await;
    let mut s = session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = topic(&fake, "api").thread_id;
    s.close_stdin();
    s.wait_exit().await;
    let db = rusqlite::Connection::open(store(home.path())).expect("the store");
    let later = now_ms() + 3_600_000;
    for i in 0..100 {
        db.execute(
            "INSERT INTO schedules (profile_key, every_s, once, prompt, next_ms, chat_id, thread_id, by_user, created_ms) \
             VALUES ('cwd:/tmp/api#api', 3600, 0, ?1, ?2, ?3, ?4, ?5, ?2)",
            rusqlite::params![format!("report number {i} {}", "x".repeat(70)), later, CHAT, thread, USER],
        )
        .expect("a schedule");
    }
    drop(db);
    let _s = session(home.path(), &fake, "/tmp/api", "api").await;
    inject(&fake, Some(thread), USER, "/schedules");
    let list = fake
        .api()
        .wait_until(
            |api| {
                api.messages(CHAT, Some(thread))
                    .into_iter()
                    .find(|m| m.plain_text.starts_with("Scheduled prompts"))
            },
            common::WAIT,
        )
        .await
        .expect("the list");
    assert!(list.plain_text.contains("page 1/10"), "{}", list.plain_text);
    let markup = list.reply_markup.clone().unwrap_or_default();
    let buttons: Vec<String> = markup["inline_keyboard"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|row| row.as_array())
        .flatten()
        .filter_map(|b| b["callback_data"].as_str().map(str::to_string))
        .collect();
    assert!(buttons.contains(&"c:x:1:0".to_string()), "{buttons:?}");
    assert!(
        buttons.contains(&"c:y:1".to_string()),
        "to the next page: {buttons:?}"
    );
    fake.api()
        .inject_callback_query(agent_relay::fake_bot_api::CallbackInject {
            chat_id: CHAT,
            thread_id: Some(thread),
            user_id: USER,
            message_id: list.message_id,
            data: "c:y:1".into(),
        });
    fake.api()
        .wait_until(
            |api| {
                api.message(CHAT, list.message_id)
                    .filter(|m| m.plain_text.contains("page 2/10") && m.plain_text.contains("#11 "))
            },
            common::WAIT,
        )
        .await
        .expect("the second page, in the same message");
}

/// An edit of a command is not a new command: editing `/every` in a
/// session's topic schedules nothing again and reaches no agent, and the
/// person is told why nothing happened (before: the edit ran the command
/// a second time in the control place, and reached the agent as
/// "(edited) /every …" in a topic).
#[tokio::test]
async fn an_edited_command_is_not_run_again() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = topic(&fake, "api").thread_id;
    let first = fake
        .api()
        .inject_user_message(agent_relay::fake_bot_api::UserMessage {
            chat_id: CHAT,
            thread_id: Some(thread),
            user_id: USER,
            text: "/every 1h check the queue".into(),
            ..Default::default()
        })
        .expect("posted");
    wait_topic_text(&fake, thread, "⏰ #1 scheduled").await;
    fake.api()
        .inject_edit(CHAT, first.message_id, "/every 2h check the queue")
        .expect("edited");
    wait_topic_text(&fake, thread, "An edited command is not run again").await;
    inject(&fake, Some(thread), USER, "next");
    wait_prompt(&s, "next").await;
    assert!(
        !s.messages().iter().any(|m| m["params"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("/every"))),
        "no command reached the agent"
    );
    let db = rusqlite::Connection::open(store(home.path())).expect("the store");
    let stored: i64 = db
        .query_row("SELECT COUNT(*) FROM schedules", [], |r| r.get(0))
        .expect("count");
    assert_eq!(stored, 1, "scheduled once");
}
