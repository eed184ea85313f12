use std::fs;

use tempfile::TempDir;

use super::*;

fn temp_db() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bot.sqlite3");
    (dir, path)
}

fn slot(letter: char) -> Slot {
    Slot::try_from(letter.to_string()).expect("slot letter")
}

fn binding(profile_key: &str, slot_letter: char, thread_id: Option<i64>) -> Binding {
    Binding {
        profile_key: profile_key.to_owned(),
        instance_id: format!("inst-{profile_key}"),
        session_name: format!("session {profile_key}"),
        cwd: format!("/src/{profile_key}"),
        chat_id: Some(-1001),
        thread_id,
        slot: slot(slot_letter),
        topic_name: format!("{slot_letter} · {profile_key}"),
        status: BindingStatus::Active,
        announced: false,
        closed: false,
        created_ms: 0,
        updated_ms: 0,
    }
}

fn update(update_id: i64, owner: Option<&str>) -> NewUpdate {
    NewUpdate {
        update_id,
        owner: owner.map(str::to_owned),
        chat_id: -1001,
        thread_id: Some(7),
        user_id: 42,
        message_id: 1000 + update_id,
        text: format!("message {update_id}"),
        detail: None,
    }
}

fn ids(entries: &[JournalEntry]) -> Vec<i64> {
    entries.iter().map(|e| e.update.update_id).collect()
}

/// Reads a header value with a plain connection, beside the store.
fn raw_pragma(path: &Path, name: &str) -> i64 {
    let conn = Connection::open(path).expect("raw open");
    conn.pragma_query_value(None, name, |row| row.get(0))
        .expect("pragma")
}

#[test]
fn a_new_file_is_created_private_and_fully_migrated() {
    let (_dir, path) = temp_db();
    let store = Store::open(&path).expect("open");
    assert_eq!(store.epoch().expect("epoch"), 0);
    assert_eq!(store.offset().expect("offset"), None);
    assert!(store.bindings().expect("bindings").is_empty());
    assert!(store.pending_cleanups().expect("cleanups").is_empty());
    assert!(store.allowed_users().expect("users").is_empty());
    drop(store);

    assert_eq!(raw_pragma(&path, "user_version"), CURRENT_VERSION);
    assert_eq!(
        raw_pragma(&path, "application_id"),
        i64::from(APPLICATION_ID)
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&path).expect("metadata").permissions().mode();
        assert_eq!(
            mode & 0o077,
            0,
            "mode {mode:o} lets others read the database"
        );
    }
}

#[test]
fn a_missing_parent_directory_is_an_io_error() {
    let (dir, _) = temp_db();
    let path = dir.path().join("absent").join("bot.sqlite3");
    assert!(matches!(Store::open(&path), Err(StoreError::Io { .. })));
}

#[test]
fn reopening_keeps_everything() {
    let (_dir, path) = temp_db();
    {
        let mut store = Store::open(&path).expect("open");
        store.bump_epoch().expect("bump");
        store
            .upsert_binding(&binding("api", 'A', Some(7)))
            .expect("upsert");
        store
            .journal_batch(&[update(10, Some("api"))], 11)
            .expect("journal");
        store.add_allowed_user(42).expect("user");
        store
            .add_cleanup(&NewCleanup {
                chat_id: -1001,
                thread_id: 9,
                profile_key: "old".into(),
                reason: "disconnect".into(),
            })
            .expect("cleanup");
    }
    let store = Store::open(&path).expect("reopen");
    assert_eq!(store.epoch().expect("epoch"), 1);
    assert_eq!(store.offset().expect("offset"), Some(11));
    let bound = store.binding("api").expect("binding").expect("present");
    assert_eq!(
        bound.target(),
        Some(Target {
            chat_id: -1001,
            thread_id: 7
        })
    );
    assert_eq!(ids(&store.pending_for("api").expect("pending")), [10]);
    assert_eq!(store.allowed_users().expect("users"), [42]);
    assert_eq!(store.pending_cleanups().expect("cleanups").len(), 1);
}

#[test]
fn a_newer_schema_is_refused_and_left_alone() {
    let (_dir, path) = temp_db();
    drop(Store::open(&path).expect("open"));
    let newer = CURRENT_VERSION + 1;
    Connection::open(&path)
        .expect("raw open")
        .pragma_update(None, "user_version", newer)
        .expect("set version");

    for result in [Store::open(&path), Store::open_read_only(&path)] {
        match result {
            Err(StoreError::TooNew {
                found, supported, ..
            }) => assert_eq!((found, supported), (newer, CURRENT_VERSION)),
            other => panic!("expected TooNew, got {other:?}"),
        }
    }
    assert_eq!(raw_pragma(&path, "user_version"), newer);
}

#[test]
fn a_file_that_is_not_sqlite_is_corrupt_and_kept_byte_for_byte() {
    let (dir, path) = temp_db();
    let garbage: Vec<u8> = b"definitely not a database\n".repeat(400);
    fs::write(&path, &garbage).expect("write garbage");

    for result in [Store::open(&path), Store::open_read_only(&path)] {
        let err = result.expect_err("garbage must not open");
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
        let shown = err.to_string();
        assert!(shown.contains(&path.display().to_string()), "{shown}");
        assert!(shown.contains("left untouched"), "{shown}");
    }
    assert_eq!(fs::read(&path).expect("read back"), garbage);
    let names: Vec<_> = fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, [path.file_name().expect("name")]);
}

#[test]
fn a_damaged_database_is_corrupt_and_kept_byte_for_byte() {
    let (_dir, path) = temp_db();
    {
        let mut store = Store::open(&path).expect("open");
        // Enough rows to spread the journal over many pages, so the damage
        // below lands inside the journal's b-tree.
        let updates: Vec<NewUpdate> = (1..=400)
            .map(|id| NewUpdate {
                text: "x".repeat(900),
                ..update(id, Some("api"))
            })
            .collect();
        store.journal_batch(&updates, 401).expect("journal");
    } // closing the last connection checkpoints the WAL into the file

    let page_size = usize::try_from(raw_pragma(&path, "page_size")).expect("page size");
    let mut bytes = fs::read(&path).expect("read db");
    let pages = bytes.len() / page_size;
    assert!(
        pages > 40,
        "only {pages} pages: the damage would miss the journal"
    );
    for page in pages / 2..pages / 2 + 4 {
        bytes[page * page_size..(page + 1) * page_size].fill(0xA5);
    }
    fs::write(&path, &bytes).expect("write damage");

    let err = Store::open(&path).expect_err("damaged file must not open");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains(&path.display().to_string()));
    assert_eq!(fs::read(&path).expect("read back"), bytes);
}

#[test]
fn another_programs_database_is_refused_and_left_alone() {
    let (_dir, path) = temp_db();
    Connection::open(&path)
        .expect("raw open")
        .execute_batch("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('keep me');")
        .expect("foreign schema");
    let before = fs::read(&path).expect("read");

    let err = Store::open(&path).expect_err("foreign file must not open");
    assert!(matches!(err, StoreError::Foreign { .. }), "{err:?}");
    assert_eq!(fs::read(&path).expect("read back"), before);
}

#[test]
fn the_epoch_bump_is_durable() {
    let (_dir, path) = temp_db();
    {
        let mut store = Store::open(&path).expect("open");
        assert_eq!(store.bump_epoch().expect("bump"), 1);
        assert_eq!(store.bump_epoch().expect("bump"), 2);
    }
    let mut store = Store::open(&path).expect("reopen");
    assert_eq!(store.epoch().expect("epoch"), 2);
    assert_eq!(store.bump_epoch().expect("bump"), 3);
}

#[test]
fn journal_batches_skip_duplicates_and_only_grow_the_offset() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");

    let first = [
        update(5, Some("api")),
        update(3, Some("api")),
        update(4, Some("web")),
    ];
    assert_eq!(store.journal_batch(&first, 6).expect("batch"), [5, 3, 4]);
    assert_eq!(store.offset().expect("offset"), Some(6));

    // Telegram resends 5 (say the offset confirmation was lost) alongside 7.
    let second = [update(5, Some("web")), update(7, Some("api"))];
    assert_eq!(store.journal_batch(&second, 8).expect("batch"), [7]);
    let kept = store.journal_entry(5).expect("entry").expect("present");
    assert_eq!(
        kept.update.owner.as_deref(),
        Some("api"),
        "a duplicate must not overwrite"
    );

    // A smaller offset never moves it back; an empty batch still advances it.
    assert!(store.journal_batch(&[], 2).expect("batch").is_empty());
    assert_eq!(store.offset().expect("offset"), Some(8));
    assert!(store.journal_batch(&[], 12).expect("batch").is_empty());
    assert_eq!(store.offset().expect("offset"), Some(12));

    assert_eq!(ids(&store.pending_for("api").expect("pending")), [3, 5, 7]);
    assert_eq!(ids(&store.pending_for("web").expect("pending")), [4]);
    assert!(store.pending_for("nobody").expect("pending").is_empty());
}

#[test]
fn a_journal_entry_round_trips_every_field() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    let unowned = NewUpdate {
        thread_id: None,
        ..update(9, None)
    };
    store
        .journal_batch(std::slice::from_ref(&unowned), 10)
        .expect("batch");
    let entry = store.journal_entry(9).expect("entry").expect("present");
    assert_eq!(entry.update, unowned);
    assert_eq!(
        (entry.state, entry.attempts, entry.drop_reason),
        (JournalState::Pending, 0, None)
    );
    assert!(entry.received_ms > 0);
    assert_eq!(ids(&store.pending_unowned().expect("unowned")), [9]);
    assert_eq!(store.journal_entry(10).expect("entry"), None);
}

#[test]
fn delivery_states_move_forward_only() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    store
        .journal_batch(&[update(1, Some("api")), update(2, Some("api"))], 3)
        .expect("batch");

    store.record_attempts(&[1]).expect("attempt");
    store.record_attempts(&[1]).expect("attempt");
    assert_eq!(
        store
            .mark_delivered(&[("other".into(), 1)])
            .expect("not its owner"),
        0
    );
    assert_eq!(
        store.mark_delivered(&[("api".into(), 1)]).expect("deliver"),
        1
    );
    assert!(
        store
            .mark_delivered(&[("api".into(), 1)])
            .expect("deliver again")
            == 0,
        "second ack changes nothing"
    );
    assert!(!store.mark_dropped(1, "late").expect("drop delivered"));
    store.record_attempts(&[1]).expect("attempt after delivery");
    let delivered = store.journal_entry(1).expect("entry").expect("present");
    assert_eq!(
        (delivered.state, delivered.attempts),
        (JournalState::Delivered, 2)
    );

    assert!(store.mark_dropped(2, "session gone").expect("drop"));
    assert_eq!(
        store
            .mark_delivered(&[("api".into(), 2)])
            .expect("deliver dropped"),
        0
    );
    let dropped = store.journal_entry(2).expect("entry").expect("present");
    assert_eq!(dropped.state, JournalState::Dropped);
    assert_eq!(dropped.drop_reason.as_deref(), Some("session gone"));

    assert!(store.pending_for("api").expect("pending").is_empty());
    assert_eq!(
        store
            .mark_delivered(&[("api".into(), 99)])
            .expect("unknown id"),
        0
    );
}

#[test]
fn a_batch_that_fails_midway_leaves_journal_and_offset_unchanged() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    store
        .journal_batch(&[update(1, Some("api"))], 2)
        .expect("batch");

    // Update 2 is inserted first; the negative id then violates the schema's
    // CHECK, so the statement for it fails after 2 is already in the
    // transaction.
    let batch = [update(2, Some("api")), update(-3, Some("api"))];
    let err = store
        .journal_batch(&batch, 10)
        .expect_err("invalid id must fail");
    assert!(matches!(err, StoreError::Sqlite { .. }), "{err:?}");

    assert_eq!(store.offset().expect("offset"), Some(2));
    assert_eq!(store.journal_entry(2).expect("entry"), None);
    assert_eq!(ids(&store.pending_for("api").expect("pending")), [1]);

    // The same batch without the bad update goes through afterwards.
    assert_eq!(store.journal_batch(&batch[..1], 3).expect("retry"), [2]);
    assert_eq!(store.offset().expect("offset"), Some(3));
}

#[test]
fn a_negative_first_offset_is_refused() {
    // A negative getUpdates offset drops Telegram's backlog; it must never be stored.
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    assert!(store.journal_batch(&[update(1, None)], -1).is_err());
    assert_eq!(store.offset().expect("offset"), None);
    assert_eq!(store.journal_entry(1).expect("entry"), None);
}

#[test]
fn pending_entries_move_to_another_owner() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    store
        .journal_batch(
            &[
                update(1, Some("old")),
                update(2, Some("old")),
                update(3, Some("other")),
            ],
            4,
        )
        .expect("batch");
    store.mark_delivered(&[("old".into(), 1)]).expect("deliver");

    assert_eq!(store.reassign_pending("old", "new").expect("reassign"), 1);
    assert_eq!(ids(&store.pending_for("new").expect("pending")), [2]);
    assert!(store.pending_for("old").expect("pending").is_empty());
    let delivered = store.journal_entry(1).expect("entry").expect("present");
    assert_eq!(
        delivered.update.owner.as_deref(),
        Some("old"),
        "settled history is not rewritten"
    );
}

#[test]
fn pruning_keeps_pending_and_the_newest_settled_entries() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    let updates: Vec<_> = (1..=10).map(|id| update(id, Some("api"))).collect();
    store.journal_batch(&updates, 11).expect("batch");
    let acks: Vec<(String, i64)> = (1..=6).map(|id| ("api".to_string(), id)).collect();
    assert_eq!(store.mark_delivered(&acks).expect("deliver"), 6);
    store.mark_dropped(8, "gone").expect("drop");

    // Settled: 1..=6 and 8. Keep the newest two of them: 6 and 8.
    assert_eq!(store.prune_with(2, 0).expect("prune").journal, 5);
    let left: Vec<i64> = (1..=10)
        .filter(|id| store.journal_entry(*id).expect("entry").is_some())
        .collect();
    assert_eq!(left, [6, 7, 8, 9, 10]);
    assert_eq!(store.prune_with(2, 0).expect("prune again").journal, 0);
    assert_eq!(store.prune_with(1, 0).expect("prune to one").journal, 1);
    assert_eq!(ids(&store.pending_for("api").expect("pending")), [7, 9, 10]);
}

#[test]
fn who_posted_a_message_is_remembered_for_a_while() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    store
        .record_sent(-1001, 50, "api", Some("tok"))
        .expect("sent");
    assert_eq!(
        store.asked("tok").expect("asked"),
        Some((-1001, 50, "api".to_string()))
    );
    store
        .journal_batch(&[update(3, Some("web"))], 4)
        .expect("batch");
    assert_eq!(
        store.message_owner(-1001, 50).expect("owner").as_deref(),
        Some("api")
    );
    assert_eq!(
        store.message_owner(-1001, 1003).expect("owner").as_deref(),
        Some("web"),
        "a message the user wrote belongs to the session it was for"
    );
    assert_eq!(
        store.message_owner(-1002, 50).expect("owner"),
        None,
        "another chat"
    );
    let later = now_ms() + i64::try_from(KEEP_SENT_DAYS * 86_400_000).unwrap() + 1;
    assert_eq!(
        store.prune_with(KEEP_SETTLED, later).expect("prune").sent,
        1
    );
    assert_eq!(store.message_owner(-1001, 50).expect("owner"), None);
}

#[test]
fn cleanups_are_given_up_after_many_failed_leaders() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    let id = store
        .add_cleanup(&NewCleanup {
            chat_id: -1001,
            thread_id: 9,
            profile_key: "api".into(),
            reason: "test".into(),
        })
        .expect("intent");
    for _ in 1..MAX_CLEANUP_ATTEMPTS {
        store.record_cleanup_attempt(id).expect("attempt");
    }
    assert_eq!(store.prune().expect("prune").cleanups, 0);
    store.record_cleanup_attempt(id).expect("attempt");
    assert_eq!(store.prune().expect("prune").cleanups, 1);
    assert!(store.pending_cleanups().expect("intents").is_empty());
}

/// 100,000 updates through the store, each delivered as the leader does it
/// (journaled in batches of 100, acknowledged, pruned every 10 batches as the
/// leader's timer would): the file stays under a fixed bound instead of
/// growing with every message ever received.
#[test]
fn the_file_stays_bounded_over_a_hundred_thousand_updates() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    let text = "a message of a typical length, a line or two of what to do next".repeat(2);
    let mut largest = 0;
    for batch in 0..1_000_i64 {
        let updates: Vec<NewUpdate> = (1..=100)
            .map(|i| NewUpdate {
                text: text.clone(),
                ..update(batch * 100 + i, Some("api"))
            })
            .collect();
        store
            .journal_batch_unflushed(&updates, batch * 100 + 101)
            .expect("batch")
            .1
            .flush()
            .expect("flush");
        let acks: Vec<(String, i64)> = updates
            .iter()
            .map(|u| ("api".to_string(), u.update_id))
            .collect();
        assert_eq!(store.mark_delivered(&acks).expect("deliver"), 100);
        store.record_sent(-1001, batch, "api", None).expect("sent");
        if batch % 10 == 9 {
            store.prune().expect("prune");
        }
        largest = largest.max(file_size(&path));
    }
    eprintln!("largest database + WAL: {largest} bytes");
    // 2 × KEEP_SETTLED entries of ~250 bytes with their indexes, the sent
    // table, and a write-ahead log of at most `WAL_LIMIT` plus one
    // checkpoint's worth.
    const BOUND: u64 = 6 * 1024 * 1024;
    assert!(largest < BOUND, "the database grew to {largest} bytes");
    let settled = (1..=100_000)
        .filter(|id| id % 997 == 0)
        .filter(|id| store.journal_entry(*id).expect("entry").is_some())
        .count();
    assert!(settled <= KEEP_SETTLED / 997 + 1, "old entries were pruned");
}

/// The database and its write-ahead log together.
fn file_size(path: &std::path::Path) -> u64 {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    fs::metadata(path).map_or(0, |m| m.len()) + fs::metadata(&wal).map_or(0, |m| m.len())
}

#[test]
fn a_touched_binding_changes_only_its_time() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    store.upsert_binding(&binding("api", 'A', Some(7))).unwrap();
    let before = store.binding("api").unwrap().expect("present");
    std::thread::sleep(std::time::Duration::from_millis(2));
    assert!(store.touch_binding("api").unwrap());
    let after = store.binding("api").unwrap().expect("present");
    assert!(after.updated_ms > before.updated_ms, "{before:?} {after:?}");
    assert_eq!(
        Binding {
            updated_ms: 0,
            ..after
        },
        Binding {
            updated_ms: 0,
            ..before
        }
    );
    assert!(!store.touch_binding("gone").unwrap(), "no such binding");
}

#[test]
fn bindings_are_stored_updated_listed_and_removed() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    let web = binding("web", 'C', Some(8));
    let api = binding("api", 'A', Some(7));
    let pending = Binding {
        chat_id: None,
        status: BindingStatus::CreateUnknown,
        ..binding("docs", 'B', None)
    };
    for b in [&web, &api, &pending] {
        store.upsert_binding(b).expect("upsert");
    }

    let slots: Vec<char> = store
        .bindings()
        .expect("bindings")
        .iter()
        .map(|b| b.slot.letter())
        .collect();
    assert_eq!(slots, ['A', 'B', 'C']);

    let stored = store.binding("docs").expect("binding").expect("present");
    assert_eq!(stored.target(), None);
    assert_eq!(
        Binding {
            created_ms: 0,
            updated_ms: 0,
            ..stored.clone()
        },
        pending
    );
    assert!(stored.created_ms > 0 && stored.updated_ms >= stored.created_ms);

    let found = store
        .binding_by_thread(-1001, 7)
        .expect("by thread")
        .expect("present");
    assert_eq!(found.profile_key, "api");
    assert_eq!(store.binding_by_thread(-1001, 99).expect("by thread"), None);
    assert_eq!(store.binding_by_thread(-2002, 7).expect("by thread"), None);

    // The topic got provisioned: an upsert replaces the fields, not created_ms.
    let provisioned = Binding {
        chat_id: Some(-1001),
        thread_id: Some(11),
        status: BindingStatus::Active,
        announced: true,
        instance_id: "inst-2".into(),
        ..pending.clone()
    };
    store.upsert_binding(&provisioned).expect("upsert again");
    let updated = store.binding("docs").expect("binding").expect("present");
    assert_eq!(updated.created_ms, stored.created_ms);
    assert_eq!(
        (
            updated.thread_id,
            updated.status,
            updated.announced,
            updated.instance_id.as_str()
        ),
        (Some(11), BindingStatus::Active, true, "inst-2")
    );

    assert!(
        store
            .set_binding_status("docs", BindingStatus::Offline)
            .expect("status")
    );
    assert!(
        !store
            .set_binding_status("docs", BindingStatus::Offline)
            .expect("same status")
    );
    assert!(
        !store
            .set_binding_status("nobody", BindingStatus::Stale)
            .expect("missing")
    );
    let offline = store.binding("docs").expect("binding").expect("present");
    assert_eq!(offline.status, BindingStatus::Offline);

    assert!(store.remove_binding("docs").expect("remove"));
    assert!(!store.remove_binding("docs").expect("remove again"));
    assert_eq!(store.binding("docs").expect("binding"), None);
    assert_eq!(store.bindings().expect("bindings").len(), 2);
}

#[test]
fn every_binding_status_round_trips() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    store
        .upsert_binding(&binding("api", 'A', Some(7)))
        .expect("upsert");
    for status in [
        BindingStatus::Stale,
        BindingStatus::Offline,
        BindingStatus::ProbeRequired,
        BindingStatus::CreateUnknown,
        BindingStatus::Active,
    ] {
        store.set_binding_status("api", status).expect("status");
        let stored = store.binding("api").expect("binding").expect("present");
        assert_eq!(stored.status, status);
        assert_eq!(BindingStatus::parse(status.as_str()), Some(status));
    }
}

#[test]
fn a_topic_and_a_slot_belong_to_one_binding() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    store
        .upsert_binding(&binding("api", 'A', Some(7)))
        .expect("upsert");

    match store.upsert_binding(&binding("web", 'B', Some(7))) {
        Err(StoreError::ThreadTaken {
            chat_id: -1001,
            thread_id: 7,
            holder,
        }) => assert_eq!(holder, "api"),
        other => panic!("expected ThreadTaken, got {other:?}"),
    }
    match store.upsert_binding(&binding("web", 'A', Some(8))) {
        Err(StoreError::SlotTaken {
            slot: taken,
            holder,
        }) => {
            assert_eq!((taken.letter(), holder.as_str()), ('A', "api"));
        }
        other => panic!("expected SlotTaken, got {other:?}"),
    }
    // An offline holder still owns its slot: its topic's name shows it.
    store
        .set_binding_status("api", BindingStatus::Offline)
        .expect("status");
    assert!(matches!(
        store.upsert_binding(&binding("web", 'A', Some(8))),
        Err(StoreError::SlotTaken { .. })
    ));
    assert_eq!(store.binding("web").expect("binding"), None);

    // The same thread id in another chat is another topic; a session may
    // move to a new slot and topic of its own.
    let elsewhere = Binding {
        chat_id: Some(-2002),
        ..binding("web", 'B', Some(7))
    };
    store.upsert_binding(&elsewhere).expect("other chat");
    store
        .upsert_binding(&binding("api", 'D', Some(9)))
        .expect("re-slot");
    store
        .upsert_binding(&binding("web", 'A', Some(8)))
        .expect("freed slot");
}

#[test]
fn cleanup_intents_live_until_finished() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    let intent = NewCleanup {
        chat_id: -1001,
        thread_id: 7,
        profile_key: "api".into(),
        reason: "disconnect".into(),
    };
    let id = store.add_cleanup(&intent).expect("add");
    let again = NewCleanup {
        reason: "retry".into(),
        ..intent.clone()
    };
    assert_eq!(
        store.add_cleanup(&again).expect("add again"),
        id,
        "one intent per topic"
    );
    let other = store
        .add_cleanup(&NewCleanup {
            thread_id: 8,
            ..intent.clone()
        })
        .expect("add other");
    assert_ne!(other, id);

    store.record_cleanup_attempt(id).expect("attempt");
    store.record_cleanup_attempt(id).expect("attempt");
    let pending = store.pending_cleanups().expect("pending");
    assert_eq!(
        pending.iter().map(|c| c.id).collect::<Vec<_>>(),
        [id, other]
    );
    let first = &pending[0];
    assert_eq!(
        (first.chat_id, first.thread_id, first.profile_key.as_str()),
        (-1001, 7, "api")
    );
    assert_eq!((first.reason.as_str(), first.attempts), ("disconnect", 2));
    assert!(first.created_ms > 0);

    store.finish_cleanup(id).expect("finish");
    store.finish_cleanup(id).expect("finish twice");
    assert_eq!(
        store
            .pending_cleanups()
            .expect("pending")
            .iter()
            .map(|c| c.id)
            .collect::<Vec<_>>(),
        [other]
    );
    // A finished topic's id is never handed out again.
    assert!(store.add_cleanup(&intent).expect("re-add") > other);
}

#[test]
fn a_persons_name_is_kept_current_and_clipped() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    store.set_person_name(7, "Ann").expect("set");
    store.set_person_name(7, "Anna").expect("rename");
    store
        .set_person_name(8, "")
        .expect("an empty name is no error");
    store.set_person_name(9, &"x".repeat(300)).expect("clipped");
    let mut people = store.people().expect("read");
    people.sort();
    assert_eq!(people.len(), 2);
    assert_eq!(people[0], (7, "Anna".to_string()));
    assert_eq!(people[1].1.chars().count(), 256);
}

#[test]
fn allowed_users_are_a_set() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    for user in [42, 7, 42] {
        store.add_allowed_user(user).expect("add");
    }
    assert_eq!(store.allowed_users().expect("users"), [7, 42]);
}

#[test]
fn a_read_only_handle_reads_beside_the_leader_and_cannot_write() {
    let (_dir, path) = temp_db();
    let mut leader = Store::open(&path).expect("open");
    leader.bump_epoch().expect("bump");

    let mut reader = Store::open_read_only(&path).expect("read-only");
    assert_eq!(reader.epoch().expect("epoch"), 1);
    assert!(matches!(
        reader.bump_epoch(),
        Err(StoreError::Sqlite { .. })
    ));

    // The reader sees the leader's later commits.
    leader.add_allowed_user(5).expect("add");
    assert_eq!(reader.allowed_users().expect("users"), [5]);
    drop(leader);
    drop(reader);

    // Also when no leader has the file open.
    let reader = Store::open_read_only(&path).expect("read-only");
    assert_eq!(reader.epoch().expect("epoch"), 1);
}

#[test]
fn a_read_only_handle_needs_an_existing_migrated_file() {
    let (_dir, path) = temp_db();
    assert!(matches!(
        Store::open_read_only(&path),
        Err(StoreError::Sqlite { .. })
    ));
    assert!(!path.exists(), "a read-only open must not create the file");

    fs::write(&path, b"").expect("empty file");
    assert!(matches!(
        Store::open_read_only(&path),
        Err(StoreError::Outdated { found: 0, .. })
    ));
}

#[test]
fn a_value_the_schema_would_not_hold_reads_as_corrupt() {
    // Something other than the relay rewrote a row with the CHECKs turned off.
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    store
        .upsert_binding(&binding("api", 'A', Some(7)))
        .expect("upsert");
    let raw = Connection::open(&path).expect("raw open");
    raw.execute_batch(
        "PRAGMA ignore_check_constraints = ON; \
         UPDATE bindings SET status = 'haunted' WHERE profile_key = 'api';",
    )
    .expect("tamper");
    drop(raw);

    let err = store.binding("api").expect_err("unknown status");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("haunted"), "{err}");
}

#[test]
fn a_full_disk_never_splits_the_journal_from_the_offset() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    store
        .journal_batch(&[update(1, Some("api"))], 2)
        .expect("batch");
    // Cap the file at its current size: the next write that needs a new
    // page fails with SQLITE_FULL, as on a full disk.
    let pages: i64 = store
        .conn
        .pragma_query_value(None, "page_count", |row| row.get(0))
        .expect("page count");
    store
        .conn
        .pragma_update(None, "max_page_count", pages)
        .expect("cap");
    let big = "x".repeat(64 * 1024);
    let batch: Vec<NewUpdate> = (2..6)
        .map(|id| NewUpdate {
            text: big.clone(),
            ..update(id, Some("api"))
        })
        .collect();
    let err = store
        .journal_batch(&batch, 6)
        .expect_err("the disk is full");
    assert!(err.to_string().contains("full"), "{err}");
    assert_eq!(store.offset().expect("offset"), Some(2), "offset unchanged");
    assert_eq!(
        ids(&store.pending_for("api").expect("pending")),
        [1],
        "journal unchanged"
    );

    // Room again: the same batch goes through whole.
    store
        .conn
        .pragma_update(None, "max_page_count", 1_000_000)
        .expect("uncap");
    assert_eq!(store.journal_batch(&batch, 6).expect("retry"), [2, 3, 4, 5]);
    assert_eq!(store.offset().expect("offset"), Some(6));
}

#[test]
fn an_unflushed_batch_is_visible_at_once_and_flushes_without_error() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    let (inserted, unflushed) = store
        .journal_batch_unflushed(&[update(1, Some("api"))], 2)
        .expect("batch");
    assert_eq!(inserted, [1]);
    // Committed: visible before the flush, to this handle and to readers.
    assert_eq!(store.offset().expect("offset"), Some(2));
    let reader = Store::open_read_only(&path).expect("reader");
    assert_eq!(ids(&reader.pending_for("api").expect("pending")), [1]);
    unflushed.flush().expect("flush");
    drop(store);
    let store = Store::open(&path).expect("reopen");
    assert_eq!(store.offset().expect("offset"), Some(2));
}

fn answer(text: &str, origin: Option<&str>) -> NewOutboxEntry {
    NewOutboxEntry {
        lane: Lane::Session("file:a".into()),
        kind: EntryKind::Text {
            reply_to: None,
            merge: true,
        },
        body: text.into(),
        html: true,
        origin: origin.map(String::from),
    }
}

#[test]
fn a_hand_over_is_on_disk_and_goes_pending_sending_sent() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    let ids = store
        .post(&[answer("one", None), answer("two", None)])
        .expect("post");
    // Another connection sees it: it was committed before `post` returned.
    let other = Store::open(&path).expect("open again");
    let due = other.posts_due().expect("due");
    assert_eq!(due.iter().map(|p| p.id).collect::<Vec<_>>(), ids);
    assert!(due.iter().all(|p| p.state == EntryState::Pending));
    store.posts_sending(&ids[..1]).expect("sending");
    store.posts_sent(&ids[..1], Some(7)).expect("sent");
    let left = store.posts_due().expect("due");
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].new.body, "two");
}

#[test]
fn the_same_hand_over_again_finds_the_entries_it_made() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    let first = store
        .post(&[answer("a", Some("i1:0:0")), answer("b", Some("i1:0:1"))])
        .expect("post");
    // The acknowledgement was lost; the session hands the same over again.
    let again = store
        .post(&[answer("a", Some("i1:0:0")), answer("b", Some("i1:0:1"))])
        .expect("post again");
    assert_eq!(first, again);
    assert_eq!(store.posts_due().expect("due").len(), 2);
    // Another hand-over, or one without an origin, is new.
    let other = store
        .post(&[answer("a", Some("i1:1:0")), answer("a", None)])
        .expect("post other");
    assert_eq!(other.len(), 2);
    assert!(other.iter().all(|id| !first.contains(id)));
    assert_eq!(store.posts_due().expect("due").len(), 4);
}

#[test]
fn a_send_cut_off_is_of_unknown_fate_kept_and_sent_again_only_on_request() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    let ids = store.post(&[answer("cut off", None)]).expect("post");
    store.posts_sending(&ids).expect("sending");
    // The leader died mid-call: its successor finds the entry sending.
    let orphaned = store.posts_orphaned().expect("orphaned");
    assert_eq!(orphaned.len(), 1);
    assert!(
        store.posts_due().expect("due").is_empty(),
        "never sent again by itself"
    );
    let kept = store.posts_kept("file:a").expect("kept");
    assert_eq!(kept[0].state, EntryState::Unknown);
    assert_eq!(store.posts_unoffered("file:a").expect("unoffered"), 1);
    store.posts_offered(&ids, true).expect("offered");
    assert_eq!(store.posts_unoffered("file:a").expect("unoffered"), 0);
    assert_eq!(store.posts_again("file:a", None).expect("again"), 1);
    assert_eq!(store.posts_due().expect("due").len(), 1);
}

#[test]
fn sent_entries_are_pruned_beyond_the_newest_and_pending_ones_never() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    let pending = store.post(&[answer("waits", None)]).expect("post");
    let many: Vec<NewOutboxEntry> = (0..outbox::KEEP_SENT_POSTS + 10)
        .map(|i| answer(&format!("m{i}"), None))
        .collect();
    let sent = store.post(&many).expect("post many");
    store.posts_sent(&sent, None).expect("sent");
    let pruned = store.prune().expect("prune");
    assert_eq!(pruned.posts, 10);
    assert_eq!(store.posts_due().expect("due")[0].id, pending[0]);
}

#[test]
fn a_settled_questions_edit_keeps_its_button_label_across_a_reopen() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    let lane = Lane::Fixed(crate::ids::Place {
        chat_id: -100,
        thread_id: Some(7),
    });
    let edits = [
        NewOutboxEntry {
            lane: lane.clone(),
            kind: EntryKind::Edit {
                message_id: 41,
                settled: Some("✅ Allow · Ann".into()),
            },
            body: "rm -rf build\n\n<b>✅ Allow</b> — Ann".into(),
            html: true,
            origin: None,
        },
        NewOutboxEntry {
            lane,
            kind: EntryKind::Edit {
                message_id: 42,
                settled: None,
            },
            body: "✓ · 1 tool".into(),
            html: true,
            origin: None,
        },
    ];
    store.post(&edits).expect("handed over");
    drop(store);
    let store = Store::open(&path).expect("reopen");
    let due: Vec<NewOutboxEntry> = store
        .posts_due()
        .expect("due")
        .into_iter()
        .map(|e| e.new)
        .collect();
    assert_eq!(due, edits, "the next leader sends the same edits");
}
