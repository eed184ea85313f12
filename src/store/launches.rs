//! Sessions `agent-relay serve` started, and prompts on a schedule
//! (docs/DESIGN.md, *Launching* and *Scheduled prompts*; migration 4).
//!
//! A launch is known by its id from the moment `/new` asks for it; its
//! session says which profile it is when it registers (the leader links the
//! two then), and the engine says which of its own sessions to start again
//! (`resume_id`). Both tables are bounded: ended launches whose binding is
//! gone are pruned after [`KEEP_ENDED_DAYS`], and there are at most
//! [`MAX_SCHEDULES`] schedules.
//!
//! The relay's own prompts (a launch's first prompt, a schedule's firing)
//! go into the journal like a message the person wrote, so they reach the
//! session on the one delivery path, in order, across failovers. Their
//! update ids start at [`OWN_PROMPTS`], far above any Telegram update id
//! (Telegram's are 32-bit), so the two never meet.

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use rusqlite::{OptionalExtension, Row, params};

use super::{NewUpdate, Result, Store, get_u64, now_ms};

/// The first update id of the relay's own prompts in the journal.
pub const OWN_PROMPTS: i64 = 1 << 52;
/// Schedules the store holds at most.
pub const MAX_SCHEDULES: usize = 100;
/// How long an ended launch whose topic is gone is remembered.
const KEEP_ENDED_DAYS: i64 = 30;

/// Where a launched session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchState {
    /// Asked for (a schedule's first firing), never started.
    New,
    /// Its process was started; its session has not registered yet.
    Starting,
    /// Running under `serve`.
    Running,
    /// Ended by the person (`/end`) or by `serve` stopping it for good.
    Ended,
    /// Its process ended by itself.
    Crashed,
    /// Ended after `[launch] idle_end_hours` without a turn.
    Idle,
}

impl LaunchState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Ended => "ended",
            Self::Crashed => "crashed",
            Self::Idle => "idle",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "new" => Self::New,
            "starting" => Self::Starting,
            "running" => Self::Running,
            "ended" => Self::Ended,
            "crashed" => Self::Crashed,
            "idle" => Self::Idle,
            _ => return None,
        })
    }

    /// Whether its process should be running now (`serve` starts it again
    /// when it restarts).
    pub fn is_running(self) -> bool {
        matches!(self, Self::Starting | Self::Running)
    }
}

/// One launched session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub id: String,
    pub engine: String,
    /// The folder it runs in, as `serve` resolved it.
    pub folder: String,
    /// Its session's profile key, once it registered.
    pub profile_key: Option<String>,
    /// The engine's own session (pi: the session file; Claude Code: the
    /// session id), to start it again.
    pub resume_id: Option<String>,
    pub model: Option<String>,
    pub state: LaunchState,
    /// Why it ended, or what went wrong.
    pub note: Option<String>,
    /// Handed to its session once, when it first registers.
    pub first_prompt: Option<String>,
    /// Who asked for it.
    pub by_user: i64,
    pub created_ms: u64,
    pub updated_ms: u64,
}

/// A prompt on a schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub id: i64,
    /// The session it prompts, once known.
    pub profile_key: Option<String>,
    /// The launched session it starts or resumes.
    pub launch_id: Option<String>,
    /// `/every <interval>`.
    pub every_s: Option<u64>,
    /// `/every <cron>`, five fields.
    pub cron: Option<String>,
    /// `/at`: fires once.
    pub once: bool,
    pub prompt: String,
    /// When it fires next (Unix milliseconds).
    pub next_ms: i64,
    /// Where it was made: what it has to say goes there.
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub by_user: i64,
    pub created_ms: u64,
}

/// A schedule to add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSchedule {
    pub profile_key: Option<String>,
    pub launch_id: Option<String>,
    pub every_s: Option<u64>,
    pub cron: Option<String>,
    pub once: bool,
    pub prompt: String,
    pub next_ms: i64,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub by_user: i64,
}

const LAUNCH_COLUMNS: &str = "id, engine, folder, profile_key, resume_id, model, state, note, \
                              first_prompt, by_user, created_ms, updated_ms";

fn launch_from_row(row: &Row<'_>) -> rusqlite::Result<Launch> {
    Ok(Launch {
        id: row.get(0)?,
        engine: row.get(1)?,
        folder: row.get(2)?,
        profile_key: row.get(3)?,
        resume_id: row.get(4)?,
        model: row.get(5)?,
        state: row.get(6)?,
        note: row.get(7)?,
        first_prompt: row.get(8)?,
        by_user: row.get(9)?,
        created_ms: get_u64(row, 10)?,
        updated_ms: get_u64(row, 11)?,
    })
}

const SCHEDULE_COLUMNS: &str = "id, profile_key, launch_id, every_s, cron, once, prompt, next_ms, \
                                chat_id, thread_id, by_user, created_ms";

fn schedule_from_row(row: &Row<'_>) -> rusqlite::Result<Schedule> {
    let every: Option<i64> = row.get(3)?;
    Ok(Schedule {
        id: row.get(0)?,
        profile_key: row.get(1)?,
        launch_id: row.get(2)?,
        every_s: every.map(|s| s.max(1) as u64),
        cron: row.get(4)?,
        once: row.get(5)?,
        prompt: row.get(6)?,
        next_ms: row.get(7)?,
        chat_id: row.get(8)?,
        thread_id: row.get(9)?,
        by_user: row.get(10)?,
        created_ms: get_u64(row, 11)?,
    })
}

impl ToSql for LaunchState {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for LaunchState {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        let text = value.as_str()?;
        Self::parse(text)
            .ok_or_else(|| FromSqlError::Other(format!("unknown launch state {text:?}").into()))
    }
}

impl Store {
    /// Records a launch asked for; its id must be new.
    pub fn insert_launch(&mut self, launch: &Launch) -> Result<()> {
        self.write(|tx| {
            let now = now_ms();
            tx.prepare_cached(&format!(
                "INSERT INTO launches ({LAUNCH_COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11)"
            ))?
            .execute(params![
                launch.id,
                launch.engine,
                launch.folder,
                launch.profile_key,
                launch.resume_id,
                launch.model,
                launch.state,
                launch.note,
                launch.first_prompt,
                launch.by_user,
                now,
            ])?;
            Ok(())
        })
    }

    pub fn launch(&self, id: &str) -> Result<Option<Launch>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {LAUNCH_COLUMNS} FROM launches WHERE id = ?1"
            ))?;
            Ok(stmt.query_row([id], launch_from_row).optional()?)
        })
    }

    /// The launch whose session is `profile_key`, if it was launched.
    pub fn launch_by_profile(&self, profile_key: &str) -> Result<Option<Launch>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {LAUNCH_COLUMNS} FROM launches WHERE profile_key = ?1"
            ))?;
            Ok(stmt.query_row([profile_key], launch_from_row).optional()?)
        })
    }

    /// Every launch, the most recently changed first.
    pub fn launches(&self) -> Result<Vec<Launch>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {LAUNCH_COLUMNS} FROM launches ORDER BY updated_ms DESC, id"
            ))?;
            let rows = stmt.query_map([], launch_from_row)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// Sets a launch's state and note. Returns whether there was one.
    pub fn set_launch_state(
        &mut self,
        id: &str,
        state: LaunchState,
        note: Option<&str>,
    ) -> Result<bool> {
        self.write(|tx| {
            let changed = tx
                .prepare_cached(
                    "UPDATE launches SET state = ?2, note = ?3, updated_ms = ?4 WHERE id = ?1",
                )?
                .execute(params![id, state, note, now_ms()])?;
            Ok(changed > 0)
        })
    }

    /// What the engine said once its process started: its own session (to
    /// start it again) and its model.
    pub fn set_launch_started(
        &mut self,
        id: &str,
        resume_id: Option<&str>,
        model: Option<&str>,
    ) -> Result<bool> {
        self.write(|tx| {
            let changed = tx
                .prepare_cached(
                    "UPDATE launches SET resume_id = coalesce(?2, resume_id), \
                     model = coalesce(?3, model), updated_ms = ?4 WHERE id = ?1",
                )?
                .execute(params![id, resume_id, model, now_ms()])?;
            Ok(changed > 0)
        })
    }

    /// The folder a launch runs in, as `serve` resolved it.
    pub fn set_launch_folder(&mut self, id: &str, folder: &str) -> Result<bool> {
        self.write(|tx| {
            let changed = tx
                .prepare_cached("UPDATE launches SET folder = ?2, updated_ms = ?3 WHERE id = ?1")?
                .execute(params![id, folder, now_ms()])?;
            Ok(changed > 0)
        })
    }

    /// Forgets a launch that never had a session (asked for by a schedule,
    /// or refused), so it can be asked for again under its id.
    pub fn forget_unstarted_launch(&mut self, id: &str) -> Result<bool> {
        self.write(|tx| {
            let gone = tx
                .prepare_cached(
                    "DELETE FROM launches WHERE id = ?1 AND profile_key IS NULL                      AND state IN ('new', 'ended')",
                )?
                .execute([id])?;
            Ok(gone > 0)
        })
    }

    /// Links a launch to the session that registered for it, unless another
    /// session holds it already, and marks it running. Returns the launch
    /// with its first prompt, which is taken (handed out once).
    pub fn link_launch(&mut self, id: &str, profile_key: &str) -> Result<Option<Launch>> {
        self.write(|tx| {
            let launch = tx
                .prepare_cached(&format!("SELECT {LAUNCH_COLUMNS} FROM launches WHERE id = ?1"))?
                .query_row([id], launch_from_row)
                .optional()?;
            let Some(launch) = launch else {
                return Ok(None);
            };
            if launch
                .profile_key
                .as_deref()
                .is_some_and(|key| key != profile_key)
            {
                return Ok(None);
            }
            // A key a launch of the past held is this one's now.
            tx.prepare_cached(
                "UPDATE launches SET profile_key = NULL WHERE profile_key = ?1 AND id <> ?2",
            )?
            .execute(params![profile_key, id])?;
            tx.prepare_cached(
                "UPDATE launches SET profile_key = ?2, state = 'running', note = NULL, \
                 first_prompt = NULL, updated_ms = ?3 WHERE id = ?1",
            )?
            .execute(params![id, profile_key, now_ms()])?;
            tx.prepare_cached(
                "UPDATE schedules SET profile_key = ?2 WHERE launch_id = ?1 AND profile_key IS NULL",
            )?
            .execute(params![id, profile_key])?;
            Ok(Some(Launch {
                profile_key: Some(profile_key.to_string()),
                ..launch
            }))
        })
    }

    /// Forgets ended launches whose session has no binding any more and
    /// that did not change for [`KEEP_ENDED_DAYS`], with their schedules.
    pub fn prune_launches(&mut self) -> Result<usize> {
        let before = now_ms().saturating_sub(KEEP_ENDED_DAYS * 86_400_000);
        self.write(|tx| {
            let gone = tx
                .prepare_cached(
                    "DELETE FROM launches WHERE state IN ('ended', 'crashed', 'idle', 'new') \
                     AND updated_ms < ?1 AND (profile_key IS NULL OR profile_key NOT IN \
                     (SELECT profile_key FROM bindings))",
                )?
                .execute([before])?;
            tx.prepare_cached(
                "DELETE FROM schedules WHERE profile_key IS NULL \
                 AND launch_id NOT IN (SELECT id FROM launches)",
            )?
            .execute([])?;
            Ok(gone)
        })
    }

    /// Adds a schedule; `None` when [`MAX_SCHEDULES`] are held already.
    pub fn add_schedule(&mut self, schedule: &NewSchedule) -> Result<Option<i64>> {
        self.write(|tx| {
            let held: i64 = tx
                .prepare_cached("SELECT count(*) FROM schedules")?
                .query_row([], |row| row.get(0))?;
            if held >= MAX_SCHEDULES as i64 {
                return Ok(None);
            }
            let id = tx
                .prepare_cached(
                    "INSERT INTO schedules (profile_key, launch_id, every_s, cron, once, prompt, \
                     next_ms, chat_id, thread_id, by_user, created_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) RETURNING id",
                )?
                .query_row(
                    params![
                        schedule.profile_key,
                        schedule.launch_id,
                        schedule.every_s.map(|s| s as i64),
                        schedule.cron,
                        schedule.once,
                        schedule.prompt,
                        schedule.next_ms,
                        schedule.chat_id,
                        schedule.thread_id,
                        schedule.by_user,
                        now_ms(),
                    ],
                    |row| row.get(0),
                )?;
            Ok(Some(id))
        })
    }

    /// Every schedule, the next to fire first.
    pub fn schedules(&self) -> Result<Vec<Schedule>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {SCHEDULE_COLUMNS} FROM schedules ORDER BY next_ms, id"
            ))?;
            let rows = stmt.query_map([], schedule_from_row)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// The schedules due at `now_ms` (Unix milliseconds), oldest first.
    pub fn due_schedules(&self, now_ms: i64) -> Result<Vec<Schedule>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE next_ms <= ?1 ORDER BY next_ms, id"
            ))?;
            let rows = stmt.query_map([now_ms], schedule_from_row)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// When `id` fires next. Returns whether there was one.
    pub fn set_schedule_next(&mut self, id: i64, next_ms: i64) -> Result<bool> {
        self.write(|tx| {
            let changed = tx
                .prepare_cached("UPDATE schedules SET next_ms = ?2 WHERE id = ?1")?
                .execute(params![id, next_ms])?;
            Ok(changed > 0)
        })
    }

    /// Removes a schedule. Returns whether there was one.
    pub fn remove_schedule(&mut self, id: i64) -> Result<bool> {
        self.write(|tx| {
            let removed = tx
                .prepare_cached("DELETE FROM schedules WHERE id = ?1")?
                .execute([id])?;
            Ok(removed > 0)
        })
    }

    /// Journals a prompt of the relay's own (see the module docs) as the
    /// next of its update ids; returns the entry as journaled.
    pub fn journal_own_prompt(&mut self, mut update: NewUpdate) -> Result<NewUpdate> {
        self.write(|tx| {
            let last: Option<i64> = tx
                .prepare_cached("SELECT max(update_id) FROM journal WHERE update_id >= ?1")?
                .query_row([OWN_PROMPTS], |row| row.get(0))?;
            update.update_id = last.map_or(OWN_PROMPTS, |id| id + 1);
            tx.prepare_cached(
                "INSERT INTO journal (update_id, owner, chat_id, thread_id, user_id, \
                     message_id, text, received_ms, detail) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?
            .execute(params![
                update.update_id,
                update.owner,
                update.chat_id,
                update.thread_id,
                update.user_id,
                update.message_id,
                update.text,
                now_ms(),
                update.detail,
            ])?;
            Ok(update)
        })
    }

    /// Whether `owner` has a prompt of the relay's own still waiting.
    pub fn own_prompt_pending(&self, owner: &str) -> Result<bool> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT count(*) FROM journal WHERE owner = ?1 AND state = 'pending' \
                 AND update_id >= ?2",
            )?;
            let n: i64 = stmt.query_row(params![owner, OWN_PROMPTS], |row| row.get(0))?;
            Ok(n > 0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.db")).unwrap();
        (dir, store)
    }

    fn launch(id: &str) -> Launch {
        Launch {
            id: id.into(),
            engine: "pi".into(),
            folder: "/home/ada/api".into(),
            profile_key: None,
            resume_id: None,
            model: None,
            state: LaunchState::Starting,
            note: None,
            first_prompt: Some("run the tests".into()),
            by_user: 7,
            created_ms: 0,
            updated_ms: 0,
        }
    }

    #[test]
    fn a_launch_is_linked_to_its_session_once_and_hands_its_first_prompt_once() {
        let (_dir, mut store) = store();
        store.insert_launch(&launch("a1")).unwrap();
        let linked = store.link_launch("a1", "file:/s.jsonl").unwrap().unwrap();
        assert_eq!(linked.first_prompt.as_deref(), Some("run the tests"));
        let again = store.link_launch("a1", "file:/s.jsonl").unwrap().unwrap();
        assert_eq!(again.first_prompt, None, "handed out once");
        assert_eq!(again.state, LaunchState::Running);
        assert!(
            store
                .link_launch("a1", "file:/other.jsonl")
                .unwrap()
                .is_none(),
            "another session cannot take a launch that has one"
        );
        assert_eq!(
            store
                .launch_by_profile("file:/s.jsonl")
                .unwrap()
                .unwrap()
                .id,
            "a1"
        );
        store
            .set_launch_state("a1", LaunchState::Ended, Some("/end"))
            .unwrap();
        store
            .set_launch_started("a1", Some("/s.jsonl"), Some("fake/echo"))
            .unwrap();
        let ended = store.launch("a1").unwrap().unwrap();
        assert_eq!(ended.state, LaunchState::Ended);
        assert_eq!(ended.note.as_deref(), Some("/end"));
        assert_eq!(ended.resume_id.as_deref(), Some("/s.jsonl"));
        assert!(!ended.state.is_running());
    }

    #[test]
    fn own_prompts_take_ids_above_every_telegram_update_in_order() {
        let (_dir, mut store) = store();
        let prompt = |text: &str| NewUpdate {
            update_id: 0,
            owner: Some("k".into()),
            chat_id: -100,
            thread_id: Some(5),
            user_id: 7,
            message_id: 0,
            text: text.into(),
            detail: None,
        };
        let first = store.journal_own_prompt(prompt("one")).unwrap();
        let second = store.journal_own_prompt(prompt("two")).unwrap();
        assert_eq!(first.update_id, OWN_PROMPTS);
        assert_eq!(second.update_id, OWN_PROMPTS + 1);
        assert!(store.own_prompt_pending("k").unwrap());
        let pending: Vec<String> = store
            .pending_for("k")
            .unwrap()
            .into_iter()
            .map(|e| e.update.text)
            .collect();
        assert_eq!(pending, ["one", "two"]);
    }

    #[test]
    fn schedules_are_bounded_and_due_in_order() {
        let (_dir, mut store) = store();
        let schedule = |next_ms| NewSchedule {
            profile_key: Some("k".into()),
            launch_id: None,
            every_s: Some(60),
            cron: None,
            once: false,
            prompt: "check".into(),
            next_ms,
            chat_id: -100,
            thread_id: Some(5),
            by_user: 7,
        };
        let late = store.add_schedule(&schedule(2_000)).unwrap().unwrap();
        let early = store.add_schedule(&schedule(1_000)).unwrap().unwrap();
        let due: Vec<i64> = store
            .due_schedules(1_500)
            .unwrap()
            .iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(due, [early]);
        store.set_schedule_next(early, 3_000).unwrap();
        let due: Vec<i64> = store
            .due_schedules(5_000)
            .unwrap()
            .iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(due, [late, early]);
        assert!(store.remove_schedule(late).unwrap());
        let mut neither = schedule(1);
        neither.profile_key = None;
        assert!(
            store.add_schedule(&neither).is_err(),
            "a schedule prompts something"
        );
        for n in 1..MAX_SCHEDULES {
            assert!(store.add_schedule(&schedule(n as i64)).unwrap().is_some());
        }
        assert_eq!(store.add_schedule(&schedule(9)).unwrap(), None, "bounded");
    }
}
