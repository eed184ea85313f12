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
