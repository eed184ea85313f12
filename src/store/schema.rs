//! The versioned schema. `PRAGMA user_version` records how many steps of
//! [`MIGRATIONS`] a file has applied; each step runs in its own transaction
//! together with the version bump, so a crash mid-migration leaves the file at
//! the previous version rather than half-migrated.
//!
//! Steps are append-only: once released, a step is never edited, because
//! files in the field have already applied it.

/// Marks a file as ours (`PRAGMA application_id`, "ARLY"), so that pointing
/// the relay at some other program's SQLite file fails instead of migrating
/// it.
pub(super) const APPLICATION_ID: i32 = 0x4152_4C59;

/// Step `n` (counting from 1) brings a file from version `n - 1` to `n`.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    //
    // STRICT tables make SQLite reject a value of the wrong type instead of
    // storing it, and the CHECKs keep every enum column decodable: a value the
    // code cannot read back can only come from outside the relay.
    r"
    CREATE TABLE meta (
        id          INTEGER PRIMARY KEY CHECK (id = 1),
        epoch       INTEGER NOT NULL CHECK (epoch >= 0),
        -- The next getUpdates offset; NULL until the first batch. Never
        -- negative: a negative offset makes Telegram drop the backlog.
        next_offset INTEGER CHECK (next_offset IS NULL OR next_offset >= 0)
    ) STRICT;
    INSERT INTO meta (id, epoch, next_offset) VALUES (1, 0, NULL);

    CREATE TABLE bindings (
        profile_key  TEXT PRIMARY KEY NOT NULL,
        instance_id  TEXT NOT NULL,
        session_name TEXT NOT NULL,
        cwd          TEXT NOT NULL,
        chat_id      INTEGER,
        thread_id    INTEGER CHECK (thread_id IS NULL OR chat_id IS NOT NULL),
        slot         TEXT NOT NULL UNIQUE
                     CHECK (length(slot) = 1 AND slot BETWEEN 'A' AND 'Z'),
        topic_name   TEXT NOT NULL,
        status       TEXT NOT NULL CHECK (status IN
                     ('active', 'stale', 'offline', 'probe-required', 'create-unknown')),
        announced    INTEGER NOT NULL CHECK (announced IN (0, 1)),
        created_ms   INTEGER NOT NULL CHECK (created_ms >= 0),
        updated_ms   INTEGER NOT NULL CHECK (updated_ms >= 0)
    ) STRICT;
    CREATE UNIQUE INDEX bindings_by_thread ON bindings (chat_id, thread_id)
        WHERE thread_id IS NOT NULL;

    -- update_id is the rowid: unique, and the natural delivery order.
    CREATE TABLE journal (
        update_id   INTEGER PRIMARY KEY CHECK (update_id >= 0),
        owner       TEXT,
        chat_id     INTEGER NOT NULL,
        thread_id   INTEGER,
        user_id     INTEGER NOT NULL,
        message_id  INTEGER NOT NULL,
        text        TEXT NOT NULL,
        state       TEXT NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'delivered', 'dropped')),
        attempts    INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
        drop_reason TEXT,
        received_ms INTEGER NOT NULL CHECK (received_ms >= 0)
    ) STRICT;
    CREATE INDEX journal_pending ON journal (owner, update_id)
        WHERE state = 'pending';

    -- AUTOINCREMENT: ids are never reused, so a stale id held by a caller can
    -- never finish somebody else's intent.
    CREATE TABLE cleanups (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        chat_id     INTEGER NOT NULL,
        thread_id   INTEGER NOT NULL,
        profile_key TEXT NOT NULL,
        reason      TEXT NOT NULL,
        created_ms  INTEGER NOT NULL CHECK (created_ms >= 0),
        attempts    INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
        UNIQUE (chat_id, thread_id)
    ) STRICT;

    CREATE TABLE allowed_users (
        user_id   INTEGER PRIMARY KEY,
        paired_ms INTEGER NOT NULL CHECK (paired_ms >= 0)
    ) STRICT;
    ",
    // 2: what only the leader interprets about a message (the message it
    // replies to, later its attachments) goes in `detail`; `sent` remembers
    // which session posted which message, so a session can edit only its
    // own; lookups by message for both.
    r"
    ALTER TABLE journal ADD COLUMN detail TEXT;
    CREATE INDEX journal_by_message ON journal (chat_id, message_id);
    CREATE INDEX journal_settled ON journal (update_id) WHERE state <> 'pending';

    CREATE TABLE sent (
        chat_id     INTEGER NOT NULL,
        message_id  INTEGER NOT NULL,
        profile_key TEXT NOT NULL,
        sent_ms     INTEGER NOT NULL CHECK (sent_ms >= 0),
        -- The token of the question the message asks, if it asks one: an
        -- asker that lost its leader asks again with the same token, and
        -- finds its message instead of posting a second one.
        ask_token   TEXT UNIQUE,
        PRIMARY KEY (chat_id, message_id)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX sent_by_age ON sent (sent_ms);
    ",
    // 3: a topic the relay closed because its session's host switched to
    // another session (pi's /new, /resume); it is reopened when the session
    // is resumed.
    r"
    ALTER TABLE bindings ADD COLUMN closed INTEGER NOT NULL DEFAULT 0
        CHECK (closed IN (0, 1));
    ",
    // 4: the outbox of record. What a session hands over for its topic (an
    // answer, an edit, a short file) is written here, durably, before the
    // session hears it was taken, and the leader sends it from here: a
    // process that dies right after handing over loses nothing. `sending`
    // is written (durably) before the call goes out, so a leader that dies
    // mid-call leaves an entry of unknown fate, which is never replayed
    // blindly. `profile_key` places an entry in its session's topic as it
    // is when it goes; `chat_id`/`thread_id` place the leader's own notices.
    r"
    CREATE TABLE outbox (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        profile_key TEXT,
        chat_id     INTEGER,
        thread_id   INTEGER,
        kind        TEXT NOT NULL CHECK (kind IN ('text', 'edit', 'document')),
        -- text and edit: the message's text; document: the file's content.
        body        TEXT NOT NULL,
        html        INTEGER NOT NULL CHECK (html IN (0, 1)),
        -- text: the message replied to; edit: the message edited.
        message_ref INTEGER,
        -- text: it may share a message with its neighbours (an answer).
        merge       INTEGER NOT NULL DEFAULT 0 CHECK (merge IN (0, 1)),
        -- document: its name and the caption under it.
        file_name   TEXT,
        caption     TEXT,
        state       TEXT NOT NULL DEFAULT 'pending' CHECK (state IN
                    ('pending', 'sending', 'sent', 'unknown', 'failed')),
        why         TEXT,
        offered     INTEGER NOT NULL DEFAULT 0 CHECK (offered IN (0, 1)),
        message_id  INTEGER,
        created_ms  INTEGER NOT NULL CHECK (created_ms >= 0),
        settled_ms  INTEGER,
        CHECK (profile_key IS NOT NULL OR chat_id IS NOT NULL)
    ) STRICT;
    CREATE INDEX outbox_due ON outbox (id) WHERE state IN ('pending', 'sending');
    CREATE INDEX outbox_kept ON outbox (profile_key, id) WHERE state IN ('unknown', 'failed');
    CREATE INDEX outbox_settled ON outbox (id) WHERE state NOT IN ('pending', 'sending');
    ",
    // 5: sessions `agent-relay serve` started (docs/DESIGN.md, *Launching*)
    // and prompts on a schedule. A launch is known by its id before its
    // session says which profile it is; the engine's own session id
    // (`resume_id`) is what starts it again. The engine is a name, not a
    // CHECKed list, so another engine needs no migration.
    r"
    CREATE TABLE launches (
        id           TEXT PRIMARY KEY NOT NULL CHECK (length(id) BETWEEN 1 AND 32),
        engine       TEXT NOT NULL CHECK (length(engine) BETWEEN 1 AND 16),
        folder       TEXT NOT NULL,
        profile_key  TEXT UNIQUE,
        resume_id    TEXT,
        model        TEXT,
        state        TEXT NOT NULL CHECK (state IN
                     ('new', 'starting', 'running', 'ended', 'crashed', 'idle')),
        note         TEXT,
        first_prompt TEXT,
        by_user      INTEGER NOT NULL,
        created_ms   INTEGER NOT NULL CHECK (created_ms >= 0),
        updated_ms   INTEGER NOT NULL CHECK (updated_ms >= 0)
    ) STRICT;

    CREATE TABLE schedules (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        profile_key TEXT,
        launch_id   TEXT,
        every_s     INTEGER CHECK (every_s IS NULL OR every_s > 0),
        cron        TEXT,
        once        INTEGER NOT NULL CHECK (once IN (0, 1)),
        prompt      TEXT NOT NULL,
        next_ms     INTEGER NOT NULL CHECK (next_ms >= 0),
        chat_id     INTEGER NOT NULL,
        thread_id   INTEGER,
        by_user     INTEGER NOT NULL,
        created_ms  INTEGER NOT NULL CHECK (created_ms >= 0),
        CHECK (profile_key IS NOT NULL OR launch_id IS NOT NULL),
        CHECK ((every_s IS NOT NULL) + (cron IS NOT NULL) + once = 1)
    ) STRICT;
    CREATE INDEX schedules_due ON schedules (next_ms);
    ",
    // 6: a hand-over's origin. A session whose `post` was written but whose
    // acknowledgement was lost (the leader stepped down in between) hands
    // the same items over again to the next leader; the origin (the
    // instance, its hand-over number and the item's place in it) makes the
    // second one find the first instead of sending it twice.
    "
    ALTER TABLE outbox ADD COLUMN origin TEXT;
    CREATE UNIQUE INDEX outbox_origin ON outbox (origin) WHERE origin IS NOT NULL;
    ",
    // 7: the names of the allowed users the leader has seen, so that
    // `/sessions` says who started each launched session. One row per
    // allowed user, kept current.
    "
    CREATE TABLE people (
        user_id  INTEGER PRIMARY KEY NOT NULL,
        name     TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 256),
        seen_ms  INTEGER NOT NULL CHECK (seen_ms >= 0)
    ) STRICT;
    ",
];

/// The schema version this binary writes. (The list is a handful of entries;
/// the cast cannot truncate.)
pub(super) const CURRENT_VERSION: i64 = MIGRATIONS.len() as i64;
