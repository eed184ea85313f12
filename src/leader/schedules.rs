//! Scheduled prompts (docs/DESIGN.md, *Scheduled prompts*): `/every
//! <interval or cron> <prompt>` and `/at <time> <prompt>` in a session's
//! topic, or with a folder in the control place (the first firing starts a
//! session there, the later ones resume it). They are kept in the store,
//! so a leader that takes over keeps them; the leader looks for due ones
//! every [`TICK`].
//!
//! A firing is a prompt of the relay's own in the journal, delivered like
//! a message the person wrote; a launched session that is not running is
//! started again for it. A firing more than [`LATE`] late (the machine was
//! off, no relay ran) is not run: the topic is told what was missed, once
//! per schedule, and the schedule goes on from now — never a burst. A
//! firing whose previous prompt the session has not taken yet is skipped,
//! and said.
//!
//! Times are the machine's wall clock in its own time zone.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Local, TimeZone};

use super::context::Context;
use super::failure::Failure;
use super::launches::{Launches, new_launch_id};
use super::now_ms;
use super::router::Router;
use super::speaker::{Say, paging};
use super::triage::{Entry, MessageDetail};
use crate::ids::Place;
use crate::phone::{LONGEST, SHORTEST, When, new_args, read_at, read_every};
use crate::protocol::bus::{Button, Keyboard};
use crate::protocol::launch::LaunchSpec;
use crate::render::escape;
use crate::store::{Launch, LaunchState, NewSchedule, NewUpdate, Schedule};

/// How often the leader looks for due schedules.
pub(super) const TICK: Duration = Duration::from_secs(1);
/// A firing later than this was missed, not run.
const LATE: Duration = Duration::from_secs(120);

/// When `schedule` fires next after `now_ms`; `None` for a one-off.
/// `Err`: a stored schedule no firing can be computed for (written by
/// another version, or by hand): it is set aside, never fired again.
fn next_after(schedule: &Schedule, now_ms: i64) -> Result<Option<i64>, String> {
    if let Some(every) = schedule.every_s {
        let every = Duration::from_secs(every);
        if !(SHORTEST..=LONGEST).contains(&every) {
            return Err(format!(
                "its interval of {} s is outside 5 s to 366 days",
                every.as_secs()
            ));
        }
        let every = every.as_millis() as i64;
        // On its own beat: the first of its times after now.
        let behind = now_ms.saturating_sub(schedule.next_ms).max(0);
        return (behind / every + 1)
            .checked_mul(every)
            .and_then(|ahead| schedule.next_ms.checked_add(ahead))
            .map(Some)
            .ok_or_else(|| "its next firing is out of range".into());
    }
    let Some(pattern) = schedule.cron.as_deref() else {
        return Ok(None);
    };
    let cron = croner::Cron::from_str(pattern).map_err(|e| format!("“{pattern}”: {e}"))?;
    let now = Local
        .timestamp_millis_opt(now_ms)
        .single()
        .ok_or("the clock is out of range")?;
    cron.find_next_occurrence(&now, false)
        .map(|at| Some(at.timestamp_millis()))
        .map_err(|e| format!("“{pattern}” fires no more: {e}"))
}

/// When `when` fires first.
fn first_at(when: &When, now: DateTime<Local>) -> Result<i64, String> {
    match when {
        When::Every(every) => chrono::Duration::from_std(*every)
            .ok()
            .and_then(|every| now.checked_add_signed(every))
            .map(|at| at.timestamp_millis())
            .ok_or_else(|| "that interval is out of range".into()),
        When::At(at) => Ok(*at),
        When::Cron(pattern) => {
            let cron = croner::Cron::from_str(pattern).map_err(|e| e.to_string())?;
            cron.find_next_occurrence(&now, false)
                .map(|t| t.timestamp_millis())
                .map_err(|e| e.to_string())
        }
    }
}

/// A time as the chat reads it: the time of day, with the date when it is
/// not today.
fn shown(ms: i64) -> String {
    match Local.timestamp_millis_opt(ms).single() {
        Some(at) if at.date_naive() == Local::now().date_naive() => at.format("%H:%M").to_string(),
        Some(at) => at.format("%Y-%m-%d %H:%M").to_string(),
        None => "?".into(),
    }
}

/// How a schedule repeats, in words.
fn rhythm(schedule: &Schedule) -> String {
    match (&schedule.every_s, &schedule.cron) {
        (Some(every), _) => format!(
            "every {}",
            humantime::format_duration(Duration::from_secs(*every))
        ),
        (None, Some(cron)) => format!("cron {cron}"),
        (None, None) => format!("at {}", shown(schedule.next_ms)),
    }
}

/// Scheduled prompts: made, listed, cancelled and fired (see the module
/// docs).
pub(super) struct Schedules {
    cx: Arc<Context>,
    /// A firing is routed like a message the person wrote…
    router: Arc<Router>,
    /// …and starts the session it is for when that is not running.
    launches: Arc<Launches>,
}

impl Schedules {
    pub fn new(cx: Arc<Context>, router: Arc<Router>, launches: Arc<Launches>) -> Self {
        Self {
            cx,
            router,
            launches,
        }
    }

    /// `/every <interval or cron> …`: in a session's topic for that
    /// session, in the control place with a folder to start one in.
    pub async fn every(
        &self,
        place: Place,
        user: i64,
        owner: Option<&str>,
        rest: &str,
    ) -> Result<(), Failure> {
        let added =
            read_every(rest).and_then(|(when, rest)| self.add(place, user, owner, when, rest));
        self.confirm(place, added).await
    }

    /// `/at <time> …`, as [`Schedules::every`].
    pub async fn at(
        &self,
        place: Place,
        user: i64,
        owner: Option<&str>,
        rest: &str,
    ) -> Result<(), Failure> {
        let added = read_at(rest, Local::now())
            .and_then(|(at, rest)| self.add(place, user, owner, When::At(at), rest));
        self.confirm(place, added).await
    }

    /// Says how a schedule command went.
    async fn confirm(&self, place: Place, added: Result<String, String>) -> Result<(), Failure> {
        let text = match added {
            Ok(text) => text,
            Err(why) => format!("⚠️ {}", escape(&why)),
        };
        self.cx.speaker.now(place, Say::html(text)).await.map(drop)
    }

    /// `/every` and `/at`: the command read, to a stored schedule, and its
    /// confirmation. Each refusal names what to change, in the order a
    /// person reads the command, and nothing is recorded before all of them
    /// passed.
    fn add(
        &self,
        place: Place,
        user: i64,
        owner: Option<&str>,
        when: When,
        rest: &str,
    ) -> Result<String, String> {
        let once = matches!(when, When::At(_));
        // Before anything is recorded: a schedule that cannot fire makes
        // no launch.
        let next_ms = first_at(&when, Local::now())?;
        let (profile_key, launch_id, prompt, what) = match owner {
            Some(owner) => {
                let launch = self
                    .cx
                    .store()
                    .launch_by_profile(owner)
                    .map_err(|e| e.to_string())?;
                (
                    Some(owner.to_string()),
                    launch.map(|l| l.id),
                    rest.trim().to_string(),
                    "this session".to_string(),
                )
            }
            None => self.scheduled_launch(user, rest)?,
        };
        if prompt.is_empty() {
            return Err("a scheduled prompt needs its text".into());
        }
        let (every_s, cron) = match &when {
            When::Every(every) => (Some(every.as_secs()), None),
            When::Cron(pattern) => (None, Some(pattern.clone())),
            When::At(_) => (None, None),
        };
        let added = self
            .cx
            .store()
            .add_schedule(&NewSchedule {
                profile_key,
                launch_id,
                every_s,
                cron,
                once,
                prompt: crate::redact::redact(&prompt).into_owned(),
                next_ms,
                chat_id: place.chat_id,
                thread_id: place.thread_id,
                by_user: user,
            })
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "{} schedules are the most the relay keeps; cancel one with /schedules",
                    crate::store::MAX_SCHEDULES
                )
            })?;
        tracing::info!(target: "audit", user, schedule = added, "a prompt was scheduled");
        Ok(format!(
            "⏰ #{added} scheduled for {}: “{}” — first at {}. /schedules lists and cancels.",
            escape(&what),
            escape(&crate::policy::clip(&prompt, 200)),
            shown(next_ms)
        ))
    }

    /// What a schedule made outside any session starts: a new launch in the
    /// folder it names (recorded only once the schedule is sound), with the
    /// prompt and how the schedule's confirmation names it.
    fn scheduled_launch(
        &self,
        user: i64,
        rest: &str,
    ) -> Result<(Option<String>, Option<String>, String, String), String> {
        let policy = self.launches.policy();
        let engines: Vec<String> = policy.commands.keys().cloned().collect();
        let args = new_args(rest, &engines);
        let folder = args
            .folder
            .ok_or("say where: /every 1d ~/api [engine] <prompt>")?;
        if args.machine.is_some() {
            return Err(
                "a schedule on another machine is made in its session's topic there".into(),
            );
        }
        if policy.roots.is_empty() {
            return Err("starting agents from the phone is off on this machine: set [launch] roots in config.toml".into());
        }
        let prompt = args.prompt.unwrap_or_default();
        if prompt.trim().is_empty() {
            return Err("a scheduled prompt needs its text".into());
        }
        let engine = args.engine.unwrap_or_else(|| policy.default_engine.clone());
        let launch = Launch {
            id: new_launch_id(),
            engine: engine.clone(),
            folder: folder.clone(),
            profile_key: None,
            resume_id: None,
            model: None,
            state: LaunchState::New,
            note: None,
            first_prompt: None,
            by_user: user,
            created_ms: 0,
            updated_ms: 0,
        };
        self.cx
            .store()
            .insert_launch(&launch)
            .map_err(|e| e.to_string())?;
        Ok((
            None,
            Some(launch.id),
            prompt,
            format!("a new {engine} session in {folder}"),
        ))
    }

    /// `/schedules`: the schedules of this topic's session, or all of this
    /// machine's in the control place, a page at a time, each with a
    /// cancel button.
    pub async fn list(&self, place: Place) -> Result<(), Failure> {
        let say = match self.shown_in(place) {
            Ok((schedules, in_topic)) => page_of(&schedules, in_topic, 0),
            Err(e) => Say::html(format!("⚠️ {}", escape(&e))),
        };
        self.cx.speaker.now(place, say).await.map(drop)
    }

    /// A page button of `/schedules` (`c:y:<page>`); answers the toast.
    pub async fn turn(&self, place: Place, message_id: i64, page: &str) -> String {
        let page = page.parse().unwrap_or(0);
        match self.show_again(place, message_id, page).await {
            Ok(()) => format!("Page {}", page + 1),
            Err(e) => format!("Could not turn the page: {e}"),
        }
    }

    /// A cancel button of `/schedules` (`c:x:<id>:<page>`).
    pub async fn cancel(
        &self,
        place: Place,
        message_id: i64,
        id: &str,
        page: Option<&str>,
    ) -> String {
        let Ok(id) = id.parse::<i64>() else {
            return "This button is no longer valid.".into();
        };
        let removed = self.cx.store().remove_schedule(id);
        match removed {
            Ok(true) => {
                tracing::info!(target: "audit", schedule = id, "a schedule was cancelled");
                let page = page.and_then(|p| p.parse().ok()).unwrap_or(0);
                if let Err(e) = self.show_again(place, message_id, page).await {
                    tracing::warn!("cannot show the schedules left: {e}");
                }
                format!("#{id} cancelled")
            }
            Ok(false) => format!("#{id} is gone already"),
            Err(e) => e.to_string(),
        }
    }

    /// The list's message shows page `page` of what is scheduled now.
    async fn show_again(&self, place: Place, message_id: i64, page: usize) -> Result<(), String> {
        let (schedules, in_topic) = self.shown_in(place)?;
        let say = page_of(&schedules, in_topic, page);
        self.cx
            .speaker
            .edit(place, message_id, say)
            .await
            .map_err(|e| e.to_string())
    }

    /// The schedules `/schedules` shows in `place`: its session's in a
    /// session's topic, every one of this machine's elsewhere; and whether
    /// it is a topic's.
    fn shown_in(&self, place: Place) -> Result<(Vec<Schedule>, bool), String> {
        let store = self.cx.store();
        let owner = match place.thread_id {
            Some(thread) => store
                .binding_by_thread(place.chat_id, thread)
                .map_err(|e| e.to_string())?
                .map(|b| b.profile_key),
            None => None,
        };
        let all = store.schedules().map_err(|e| e.to_string())?;
        let shown = all
            .into_iter()
            .filter(|s| owner.is_none() || s.profile_key == owner)
            .collect();
        Ok((shown, owner.is_some()))
    }

    /// Fires the schedules that are due (see the module docs). Never
    /// awaits: the firings go off the loop.
    pub fn fire_due(self: &Arc<Self>) {
        let now = now_ms() as i64;
        let due = match self.cx.store().due_schedules(now) {
            Ok(due) => due,
            Err(e) => {
                tracing::warn!("cannot read the schedules: {e}");
                return;
            }
        };
        for schedule in due {
            // A schedule this leader cannot move on (even one that would
            // make it panic) is set aside: kept, it would fire at every tick
            // of every leader after this one.
            let next = std::panic::catch_unwind(|| next_after(&schedule, now))
                .unwrap_or_else(|_| Err("working out its next firing failed".into()));
            let next = match next {
                Ok(next) => next,
                Err(why) => {
                    self.set_aside(&schedule, &why);
                    continue;
                }
            };
            // Moved on first, so the next tick does not fire it again.
            let moved = match next {
                Some(next) => self.cx.store().set_schedule_next(schedule.id, next),
                None => self.cx.store().remove_schedule(schedule.id),
            };
            if let Err(e) = moved {
                tracing::warn!("cannot move a schedule on: {e}");
                continue;
            }
            let late = now - schedule.next_ms;
            if late > LATE.as_millis() as i64 {
                self.say_missed(&schedule, now, next);
                continue;
            }
            let schedules = self.clone();
            self.cx.errands.run(async move {
                schedules.fire(&schedule).await;
            });
        }
    }

    /// Removes a stored schedule no firing can be computed for, and tells
    /// its place why, with its prompt: nothing the person wrote goes without
    /// a word.
    fn set_aside(&self, schedule: &Schedule, why: &str) {
        tracing::error!(
            schedule = schedule.id,
            "a stored schedule is set aside: {why}"
        );
        if let Err(e) = self.cx.store().remove_schedule(schedule.id) {
            tracing::error!("cannot set a schedule aside: {e}");
            return;
        }
        let text = format!(
            "⚠️ Scheduled prompt #{} (“{}”) was set aside and will not fire: {why}. Schedule it again with /every or /at.",
            schedule.id,
            crate::policy::clip(&schedule.prompt, 200)
        );
        self.cx.speaker.later(self.place_of(schedule), text);
    }

    /// One firing: the prompt into the session's journal, the session
    /// started when it is a launch that does not run.
    ///
    /// Long because one firing journals the prompt and, for a launch that
    /// does not run, asks its machine to start it: both or neither is told.
    async fn fire(&self, schedule: &Schedule) {
        tracing::info!(schedule = schedule.id, "a scheduled prompt fires");
        let Some(owner) = schedule.profile_key.clone() else {
            return self.fire_first(schedule).await;
        };
        let place = Place {
            chat_id: schedule.chat_id,
            thread_id: schedule.thread_id,
        };
        if self.cx.store().own_prompt_pending(&owner).unwrap_or(false) {
            let text = format!(
                "⏰ Skipped #{} (“{}”): the session has not taken the previous scheduled prompt yet.",
                schedule.id,
                escape(&crate::policy::clip(&schedule.prompt, 100))
            );
            let _ = self.cx.speaker.now(place, Say::html(text)).await;
            return;
        }
        let Some(target) = self
            .cx
            .store()
            .binding(&owner)
            .ok()
            .flatten()
            .and_then(|b| b.target())
        else {
            let text = format!(
                "⏰ #{} could not fire: its session has no topic any more.",
                schedule.id
            );
            let _ = self.cx.speaker.now(place, Say::html(text)).await;
            return;
        };
        let notice = format!(
            "⏰ {} ({}, #{})",
            escape(&schedule.prompt),
            escape(&rhythm(schedule)),
            schedule.id
        );
        let topic = Place {
            chat_id: target.chat_id,
            thread_id: Some(target.thread_id),
        };
        if let Err(e) = self.cx.speaker.now(topic, Say::html(notice)).await {
            tracing::warn!("cannot say a schedule fired: {e}");
        }
        let journaled = self.cx.store().journal_own_prompt(NewUpdate {
            update_id: 0,
            owner: Some(owner),
            chat_id: target.chat_id,
            thread_id: Some(target.thread_id),
            user_id: schedule.by_user,
            message_id: 0,
            text: schedule.prompt.clone(),
            detail: serde_json::to_string(&MessageDetail {
                scheduled: true,
                ..MessageDetail::default()
            })
            .ok(),
        });
        match journaled {
            Ok(update) => self.router.route(vec![Entry::stored(update)]),
            Err(e) => tracing::error!("cannot journal a scheduled prompt: {e}"),
        }
    }

    /// The first firing of a schedule made in the control place: a new
    /// session in its folder, with the prompt as its first.
    async fn fire_first(&self, schedule: &Schedule) {
        let place = Place {
            chat_id: schedule.chat_id,
            thread_id: schedule.thread_id,
        };
        let launch = schedule
            .launch_id
            .as_deref()
            .and_then(|id| self.cx.store().launch(id).ok().flatten());
        let Some(launch) = launch else {
            let text = format!(
                "⏰ #{} lost its session; cancel it with /schedules.",
                schedule.id
            );
            let _ = self.cx.speaker.now(place, Say::html(text)).await;
            return;
        };
        if let Err(e) = self.cx.store().forget_unstarted_launch(&launch.id) {
            tracing::warn!("cannot renew a scheduled launch: {e}");
        }
        let spec = LaunchSpec {
            launch_id: launch.id.clone(),
            engine: launch.engine.clone(),
            folder: launch.folder.clone(),
            resume_id: None,
            model: None,
            by_user: launch.by_user,
        };
        let text = match self
            .launches
            .start_new(spec, Some(schedule.prompt.clone()))
            .await
        {
            Ok(route) => format!(
                "⏰ #{} started {} for “{}”.",
                schedule.id,
                escape(&route.topic_name),
                escape(&crate::policy::clip(&schedule.prompt, 100))
            ),
            Err(why) => format!(
                "⏰ #{} could not start its session: {}",
                schedule.id,
                escape(&why)
            ),
        };
        let _ = self.cx.speaker.now(place, Say::html(text)).await;
    }

    /// Where a schedule's notices go: its session's topic, else where it
    /// was made.
    fn place_of(&self, schedule: &Schedule) -> Place {
        let topic = self
            .cx
            .store()
            .binding(schedule.profile_key.as_deref().unwrap_or_default())
            .ok()
            .flatten()
            .and_then(|b| b.target());
        topic.map_or(
            Place {
                chat_id: schedule.chat_id,
                thread_id: schedule.thread_id,
            },
            Place::from,
        )
    }

    /// Says what a schedule missed while no relay ran.
    fn say_missed(&self, schedule: &Schedule, now: i64, next: Option<i64>) {
        let missed = match schedule.every_s {
            // A valid interval (next_after checked it): at least 5 s.
            Some(every) => {
                let every = i64::try_from(every.saturating_mul(1000)).unwrap_or(i64::MAX);
                (now.saturating_sub(schedule.next_ms) / every.max(1)).saturating_add(1)
            }
            None => 1,
        };
        let mut text = format!(
            "⏰ #{} (“{}”, {}) missed {missed} firing(s) while no relay ran on this machine; they were not run",
            schedule.id,
            escape(&crate::policy::clip(&schedule.prompt, 100)),
            escape(&rhythm(schedule)),
        );
        match next {
            Some(next) => text.push_str(&format!(". Next: {}.", shown(next))),
            None => text.push('.'),
        }
        let place = self.place_of(schedule);
        let speaker = self.cx.speaker.clone();
        self.cx.errands.run(async move {
            if let Err(e) = speaker.now(place, Say::html(text)).await {
                tracing::warn!("cannot say a schedule missed its time: {e}");
            }
        });
    }
}

/// Schedules a page of `/schedules` shows.
const PAGE: usize = 10;

/// Page `page` of the schedules as a message: each with its cancel button,
/// and the buttons to the other pages.
fn page_of(schedules: &[Schedule], in_topic: bool, page: usize) -> Say {
    if schedules.is_empty() {
        let text = if in_topic {
            "No prompts are scheduled for this session. /every 1h <prompt> or /at 14:30 <prompt> schedules one."
        } else {
            "No prompts are scheduled on this machine. In a session's topic: /every 1h <prompt>, /at 14:30 <prompt>; here: /every 1d ~/folder <prompt>."
        };
        return Say::html(text);
    }
    let pages = schedules.len().div_ceil(PAGE);
    let page = page.min(pages - 1);
    let mut text = String::from("<b>Scheduled prompts</b>");
    if pages > 1 {
        text.push_str(&format!(
            " · {} · page {}/{pages}",
            schedules.len(),
            page + 1
        ));
    }
    let mut buttons = Vec::new();
    for s in schedules.iter().skip(page * PAGE).take(PAGE) {
        text.push_str(&format!(
            "\n#{} {} — “{}” — next {}",
            s.id,
            escape(&rhythm(s)),
            escape(&crate::policy::clip(&s.prompt, 80)),
            shown(s.next_ms)
        ));
        buttons.push(Button {
            text: format!("✖ #{}", s.id),
            data: format!("c:x:{}:{page}", s.id),
        });
    }
    let mut rows: Vec<Vec<Button>> = buttons.chunks(4).map(<[Button]>::to_vec).collect();
    rows.extend(paging("y", page, pages));
    Say::html(text).with(Some(Keyboard { rows }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Local> {
        let naive = chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M").unwrap();
        Local.from_local_datetime(&naive).earliest().unwrap()
    }

    #[test]
    fn a_schedule_keeps_its_beat_and_skips_what_it_missed() {
        let schedule = Schedule {
            id: 1,
            profile_key: Some("k".into()),
            launch_id: None,
            every_s: Some(60),
            cron: None,
            once: false,
            prompt: "p".into(),
            next_ms: 1_000_000,
            chat_id: 1,
            thread_id: None,
            by_user: 1,
            created_ms: 0,
        };
        assert_eq!(
            next_after(&schedule, 1_000_000),
            Ok(Some(1_060_000)),
            "on time"
        );
        assert_eq!(
            next_after(&schedule, 1_000_000 + 10 * 60_000 + 5),
            Ok(Some(1_000_000 + 11 * 60_000)),
            "ten missed: the next on the beat, not ten at once"
        );
        let once = Schedule {
            every_s: None,
            once: true,
            ..schedule.clone()
        };
        assert_eq!(next_after(&once, 1_000_000), Ok(None));
        let cron = Schedule {
            every_s: None,
            cron: Some("0 9 * * *".into()),
            next_ms: at("2026-03-10 09:00").timestamp_millis(),
            ..schedule.clone()
        };
        assert_eq!(
            next_after(&cron, at("2026-03-10 09:00").timestamp_millis()),
            Ok(Some(at("2026-03-11 09:00").timestamp_millis()))
        );
        // What another version, or a hand, may have stored: set aside, never
        // a panic (a zero or huge interval divided by, a sum that overflows).
        for every_s in [0, 1, 2_305_843_009_213_693_952, u64::MAX] {
            let broken = Schedule {
                every_s: Some(every_s),
                ..schedule.clone()
            };
            assert!(next_after(&broken, 1_000_000).is_err(), "{every_s}");
        }
        let far = Schedule {
            next_ms: i64::MAX - 10,
            ..schedule.clone()
        };
        assert_eq!(
            next_after(&far, i64::MAX),
            Err("its next firing is out of range".into())
        );
        let nonsense = Schedule {
            every_s: None,
            cron: Some("not a pattern".into()),
            ..schedule
        };
        assert!(next_after(&nonsense, 1_000_000).is_err());
    }
}
