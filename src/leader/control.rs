//! The control place (docs/DESIGN.md, *Launching*): the private chat
//! outside every topic, or a forum's General topic. There an allowed user
//! starts work (`/new`), sees every session (`/sessions`, one message
//! edited in place), resumes one (`/resume`) and schedules prompts
//! (`/every`, `/at`, `/schedules`); anything else is answered with the
//! session list. In a session's topic the leader answers `/end`, `/model`,
//! `/resume` and the schedule commands itself: they are about the session,
//! not prompts for its agent.
//!
//! The leader decides and records; `serve` starts and stops the processes
//! (`launches.rs`). Across machines the machine that polls answers the
//! control place and hands an order for another machine's `serve` to that
//! machine through the cluster.
//!
//! Its buttons carry `c:<verb>:<argument>` (`asks` own `a:`): a page of
//! the list (`s`), resume (`r`), end (`e`), a folder `/new` offered (`n`),
//! a model (`m`), a schedule to cancel (`x`), a page of the schedules (`y`). What a button offers that
//! does not fit in 64 bytes (a folder, a model) is kept here under a short
//! token for an hour.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::cluster::questions;
use super::context::Context;
use super::errands::Refusal;
use super::failure::Failure;
use super::launches::{Launches, NO_SERVE, refused, topic_html};
use super::schedules::Schedules;
use super::speaker::{Say, paging};
use super::status::Status;
use crate::config::Role;
use crate::ids::Place;
use crate::phone::{NewArgs, PhoneCommand, new_args};
use crate::policy::clip;
use crate::protocol::bus::*;
use crate::protocol::launch::{ModelChoice, OrderOp, OrderOutcome, RemoteDone, RemoteOp};
use crate::render::escape;
use crate::store::Launch;
use crate::telegram::{CallbackQuery, Message};

/// Sessions per page of `/sessions`.
const PAGE: usize = 8;
/// How long what a button offers is kept.
const OFFER_LIFE: Duration = Duration::from_secs(3600);
/// Offers kept at most (the oldest go first).
const MAX_OFFERS: usize = 64;
/// Folders `/new` offers at most.
const MAX_FOLDERS: usize = 8;
/// Models `/model` offers at most.
const MAX_MODELS: usize = 24;

/// What a button offers beyond its data.
enum Offer {
    /// Folders for `/new`: the machine (none: this one) and the folder,
    /// with what `/new` named besides (the engine, the first prompt).
    Folders {
        folders: Vec<(Option<String>, String)>,
        then: NewArgs,
    },
    /// Models of a launch.
    Models {
        launch_id: String,
        models: Vec<ModelChoice>,
    },
}

/// What the control place's buttons offer, kept under short tokens.
#[derive(Default)]
struct Offers(Mutex<HashMap<String, (Instant, Offer)>>);

impl Offers {
    fn keep(&self, offer: Offer) -> String {
        let mut offers = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        offers.retain(|_, (made, _)| made.elapsed() < OFFER_LIFE);
        if offers.len() >= MAX_OFFERS
            && let Some(oldest) = offers
                .iter()
                .min_by_key(|(_, (made, _))| *made)
                .map(|(k, _)| k.clone())
        {
            offers.remove(&oldest);
        }
        let token = format!("{:08x}", fastrand::u32(..));
        offers.insert(token.clone(), (Instant::now(), offer));
        token
    }

    /// The `/new` a folder button stands for.
    fn folder(&self, token: &str, index: usize) -> Option<NewArgs> {
        let offers = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match offers.get(token) {
            Some((_, Offer::Folders { folders, then })) => {
                let (machine, folder) = folders.get(index)?.clone();
                Some(NewArgs {
                    machine,
                    folder: Some(folder),
                    ..then.clone()
                })
            }
            _ => None,
        }
    }

    /// The model a `/model` button offered, with its launch.
    fn model(&self, token: &str, index: usize) -> Option<(String, ModelChoice)> {
        let offers = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match offers.get(token) {
            Some((_, Offer::Models { launch_id, models })) => {
                Some((launch_id.clone(), models.get(index)?.clone()))
            }
            _ => None,
        }
    }
}

/// The control place and the commands about a session the leader answers
/// itself (see the module docs).
pub(super) struct ControlPlace {
    cx: Arc<Context>,
    launches: Arc<Launches>,
    schedules: Arc<Schedules>,
    offers: Offers,
}

impl ControlPlace {
    pub fn new(cx: Arc<Context>, launches: Arc<Launches>, schedules: Arc<Schedules>) -> Self {
        Self {
            cx,
            launches,
            schedules,
            offers: Offers::default(),
        }
    }

    /// The bus's status, on every machine.
    async fn status(&self) -> Result<BusStatus, BusError> {
        Status {
            cx: &self.cx,
            launches: &self.launches,
        }
        .everywhere()
        .await
    }

    /// A message from an allowed user in the relay's own chat that no
    /// session takes: a command, or the list. Never awaits.
    pub fn message(self: &Arc<Self>, message: &Message, prefix: String) {
        let place = place_of(message);
        let control = self.clone();
        self.cx.errands.run(async move {
            let said = control.sessions_message(place, None, 0, &prefix).await;
            if let Err(e) = said {
                tracing::warn!("cannot answer with the session list: {e}");
            }
        });
    }

    /// A command from the phone the leader answers (the triage read it),
    /// in the control place or in a session's topic; `prefix` goes before
    /// the session list, which is the answer to any other. Never awaits.
    pub fn command(self: &Arc<Self>, message: &Message, command: PhoneCommand, prefix: String) {
        let place = place_of(message);
        let user = message.from.as_ref().map_or(0, |u| u.id);
        let owner = place.thread_id.and_then(|thread| {
            self.cx
                .store()
                .binding_by_thread(place.chat_id, thread)
                .ok()
                .flatten()
                .filter(|b| b.target().is_some())
                .map(|b| b.profile_key)
        });
        let control = self.clone();
        self.cx.errands.run(async move {
            let owner = owner.as_deref();
            let said = control.run(place, user, command, owner, &prefix).await;
            if let Err(e) = said {
                tracing::warn!("cannot answer a command: {e}");
            }
        });
    }

    /// Runs one command from `user`; `owner` is the session whose topic it
    /// was written in, if any.
    async fn run(
        self: &Arc<Self>,
        place: Place,
        user: i64,
        command: PhoneCommand,
        owner: Option<&str>,
        prefix: &str,
    ) -> Result<(), Failure> {
        if let Some(why) = self.cx.access.refuses_command(user, &command) {
            return self.cx.speaker.now(place, Say::plain(why)).await.map(drop);
        }
        match command {
            PhoneCommand::New(rest) => {
                let args = new_args(&rest, &self.launches.engines());
                self.new_command(place, user, args).await
            }
            PhoneCommand::Resume(which) => self.resume_command(place, user, which, owner).await,
            PhoneCommand::End => self.end_command(place, user, owner).await,
            PhoneCommand::Model => self.model_command(place, owner).await,
            PhoneCommand::Every(rest) => self.schedules.every(place, user, owner, &rest).await,
            PhoneCommand::At(rest) => self.schedules.at(place, user, owner, &rest).await,
            PhoneCommand::Schedules => self.schedules.list(place).await,
            // `/sessions`, and what is no command here: `/start` in a group,
            // a session's own command outside its topic.
            PhoneCommand::Sessions
            | PhoneCommand::Start(_)
            | PhoneCommand::Status
            | PhoneCommand::Stop
            | PhoneCommand::Resend
            | PhoneCommand::Steer(_) => self
                .sessions_message(place, None, 0, prefix)
                .await
                .map(drop),
        }
    }

    // ------------------------------------------------------------ /new

    /// `/new`: a new session where the person says, or the folders offered
    /// as buttons. One message, edited when the session is there.
    async fn new_command(
        self: &Arc<Self>,
        place: Place,
        user: i64,
        args: NewArgs,
    ) -> Result<(), Failure> {
        let Some(folder) = args.folder.clone() else {
            return self.offer_folders(place, args).await;
        };
        let engine = args
            .engine
            .clone()
            .unwrap_or_else(|| self.launches.policy().default_engine.clone());
        let wait = format!(
            "⏳ Starting {} in <code>{}</code>{}…",
            escape(&clip(&engine, 40)),
            escape(&clip(&folder, 300)),
            args.machine
                .as_deref()
                .map(|m| format!(" on {}", escape(m)))
                .unwrap_or_default()
        );
        let message_id = self.cx.speaker.now(place, Say::html(wait)).await?;
        let op = RemoteOp::New {
            folder,
            engine: Some(engine),
            prompt: args.prompt,
            by_user: user,
        };
        let done = self.run_op(args.machine.as_deref(), op).await;
        self.cx
            .speaker
            .edit(place, message_id, Say::html(done.text))
            .await
    }

    /// Runs `op` on `machine` (this one when none is named, or the only
    /// machine whose `serve` runs): here, or through the cluster.
    pub(super) async fn run_op(
        self: &Arc<Self>,
        machine: Option<&str>,
        op: RemoteOp,
    ) -> RemoteDone {
        let here = self.cx.cluster.as_ref().map(|node| node.name().to_string());
        let machine = match machine {
            Some(m) => Some(m.to_string()),
            None if self.launches.serve_status().is_some() || self.cx.cluster.is_none() => None,
            None => match self.machine_with_serve().await {
                Ok(m) => m,
                Err(why) => return refused(&why),
            },
        };
        match machine {
            Some(m) if Some(&m) != here.as_ref() => {
                questions::ask_machine(self.cx.cluster.as_deref(), &m, op).await
            }
            _ => self.launches.run_here(op).await,
        }
    }

    /// The only other machine whose `serve` runs, when this one has none.
    async fn machine_with_serve(&self) -> Result<Option<String>, String> {
        let status = self.status().await.map_err(|e| e.message)?;
        let machines: Vec<String> = status
            .cluster
            .iter()
            .flat_map(|c| &c.machines)
            .filter(|m| m.serve.is_some())
            .map(|m| m.node.clone())
            .collect();
        match machines.as_slice() {
            [] => Err(format!("{NO_SERVE}, nor on any other machine")),
            [one] => Ok(Some(one.clone())),
            many => Err(format!(
                "serve runs on {}; name the machine: /new {}:~/folder",
                many.join(", "),
                many[0]
            )),
        }
    }

    /// `/new` without a folder (alone, or with an engine and a first
    /// prompt): the folders sessions ran in lately, under the roots, as
    /// buttons that start what `args` names there.
    async fn offer_folders(&self, place: Place, args: NewArgs) -> Result<(), Failure> {
        let policy = self.launches.policy();
        if policy.roots.is_empty() {
            let text = format!("⚠️ {}", self.launches.no_roots());
            self.cx.speaker.now(place, Say::html(text)).await?;
            return Ok(());
        }
        let folders = self.recent_folders();
        if folders.is_empty() {
            let roots: Vec<String> = policy
                .roots
                .iter()
                .map(|r| r.display().to_string())
                .collect();
            // After an engine's name only a path is a folder (`command.rs`).
            let syntax = match &args.engine {
                Some(engine) => format!("/new {} ~/&lt;folder&gt;", escape(engine)),
                None => format!(
                    "/new &lt;folder&gt; [{}]",
                    escape(&self.launches.engines().join("|"))
                ),
            };
            let text = format!(
                "Start a session: <code>{syntax} [first prompt]</code>, in a folder under {}.",
                escape(&roots.join(", "))
            );
            self.cx.speaker.now(place, Say::html(text)).await?;
            return Ok(());
        }
        let engine = args
            .engine
            .clone()
            .unwrap_or_else(|| self.launches.policy().default_engine.clone());
        let mut text = format!(
            "Start {} in which folder? (or <code>/new &lt;folder&gt; [engine] [first prompt]</code>)",
            escape(&engine)
        );
        if let Some(prompt) = &args.prompt {
            text.push_str(&format!(
                "\nIts first prompt: “{}”",
                escape(&crate::policy::clip(prompt.trim(), 300))
            ));
        }
        let offered: Vec<(Option<String>, String)> =
            folders.iter().map(|f| (None, f.clone())).collect();
        let token = self.offers.keep(Offer::Folders {
            folders: offered,
            then: NewArgs {
                engine: Some(engine),
                ..args
            },
        });
        let rows = folders
            .iter()
            .enumerate()
            .map(|(i, folder)| {
                vec![Button {
                    text: format!("📂 {}", short_folder(folder)),
                    data: format!("c:n:{token}:{i}"),
                }]
            })
            .collect();
        self.cx
            .speaker
            .now(place, Say::html(text).with(Some(Keyboard { rows })))
            .await?;
        Ok(())
    }

    /// The folders sessions ran in, newest first, under a root.
    fn recent_folders(&self) -> Vec<String> {
        let mut folders: Vec<(u64, String)> = Vec::new();
        if let Ok(bindings) = self.cx.store().bindings() {
            folders.extend(bindings.into_iter().map(|b| (b.updated_ms, b.cwd)));
        }
        if let Ok(launches) = self.cx.store().launches() {
            // Only launches that ran: one `serve` refused is no place the
            // person worked in.
            folders.extend(
                launches
                    .into_iter()
                    .filter(|l| l.profile_key.is_some())
                    .map(|l| (l.updated_ms, l.folder)),
            );
        }
        folders.sort_by_key(|f| std::cmp::Reverse(f.0));
        let mut out: Vec<String> = Vec::new();
        for (_, folder) in folders {
            let path = std::path::Path::new(&folder);
            let under = self
                .launches
                .policy()
                .roots
                .iter()
                .any(|root| path.starts_with(root));
            if under && !out.contains(&folder) {
                out.push(folder);
            }
            if out.len() >= MAX_FOLDERS {
                break;
            }
        }
        out
    }

    // ------------------------------------------------------------ /sessions

    /// The session list: one message (`edit` replaces it), a page of
    /// [`PAGE`] sessions with their buttons.
    async fn sessions_message(
        self: &Arc<Self>,
        place: Place,
        edit: Option<i64>,
        page: usize,
        prefix: &str,
    ) -> Result<i64, Failure> {
        let status = self.status().await;
        let (text, buttons) = match status {
            Ok(status) => sessions_page(&status, page, prefix, |user| self.cx.access.name_of(user)),
            Err(e) => (
                format!(
                    "{prefix}The relay cannot list its sessions: {}",
                    escape(&e.message)
                ),
                None,
            ),
        };
        let say = Say::html(text).with(buttons);
        self.cx.speaker.now_or_edit(place, edit, say).await
    }

    // ------------------------------------------------------------ /resume, /end

    async fn resume_command(
        self: &Arc<Self>,
        place: Place,
        user: i64,
        which: Option<String>,
        owner: Option<&str>,
    ) -> Result<(), Failure> {
        let launch = match (which, owner) {
            (None, Some(owner)) => {
                let Some(launch) = self.cx.store().launch_by_profile(owner).ok().flatten() else {
                    let text = "This session was started at a keyboard: resume it there. /resume starts again sessions the relay launched (/new).";
                    return self.cx.speaker.now(place, Say::html(text)).await.map(drop);
                };
                // In its own topic, on this machine (the topic's updates
                // come to the machine of its session): a resume says so in
                // the topic itself, so only what else happened is answered.
                let text = match self.launches.resume(&launch.id, user).await {
                    Ok((_, true)) => return Ok(()),
                    Ok((_, false)) => {
                        "● This session is running already: write here to talk to it.".to_string()
                    }
                    Err(why) => refused(&why).text,
                };
                return self.cx.speaker.now(place, Say::html(text)).await.map(drop);
            }
            (None, None) => return self.sessions_message(place, None, 0, "").await.map(drop),
            (Some(which), _) => self.find_launch(&which).await,
        };
        let Some((machine, id)) = launch else {
            let text = "⚠️ No session the relay launched goes by that name here; /sessions lists them (a session started at a keyboard resumes there).";
            self.cx.speaker.now(place, Say::html(text)).await?;
            return Ok(());
        };
        let done = self
            .run_op(
                machine.as_deref(),
                RemoteOp::Resume {
                    launch_id: id,
                    by_user: user,
                },
            )
            .await;
        self.cx
            .speaker
            .now(place, Say::html(done.text))
            .await
            .map(drop)
    }

    /// The launch a slot letter or a session's name names, on any machine.
    async fn find_launch(&self, which: &str) -> Option<(Option<String>, String)> {
        let status = self.status().await.ok()?;
        let which = which.trim();
        machines_of(&status).into_iter().find_map(|m| {
            m.sessions.iter().find_map(|s| {
                let name = crate::topics::session_part(&s.topic_name);
                let named = s.slot.to_string().eq_ignore_ascii_case(which)
                    || name.eq_ignore_ascii_case(which)
                    || s.session_name.eq_ignore_ascii_case(which);
                let launch = s.launch.as_ref().filter(|_| named)?;
                Some((
                    (!m.node.is_empty()).then(|| m.node.clone()),
                    launch.launch_id.clone(),
                ))
            })
        })
    }

    async fn end_command(
        self: &Arc<Self>,
        place: Place,
        user: i64,
        owner: Option<&str>,
    ) -> Result<(), Failure> {
        let launch =
            owner.and_then(|owner| self.cx.store().launch_by_profile(owner).ok().flatten());
        let text = match (owner, launch) {
            (None, _) => "/end works in the topic of a session the relay launched; /sessions has an end button for each.".to_string(),
            (Some(_), None) => "This session was started at a keyboard: end it there. /end ends sessions the relay launched (/new).".to_string(),
            (Some(_), Some(launch)) if !launch.state.is_running() => "This session is not running; write here to start it again.".to_string(),
            (Some(_), Some(launch)) => match self.launches.end(&launch.id, user).await {
                // The report of its end says so in the topic.
                Ok(()) => return Ok(()),
                Err(why) => format!("⚠️ Could not end it: {}", escape(&why)),
            },
        };
        self.cx.speaker.now(place, Say::html(text)).await.map(drop)
    }

    // ------------------------------------------------------------ /model

    /// `/model` in a launched session's topic: the models its agent offers,
    /// as buttons.
    async fn model_command(&self, place: Place, owner: Option<&str>) -> Result<(), Failure> {
        let say = match self.models_of(owner).await {
            Ok((launch, models, current)) => self.model_buttons(&launch, &models, current),
            Err(why) => Say::html(why),
        };
        self.cx.speaker.now(place, say).await.map(drop)
    }

    /// The models the agent of `owner`'s launch offers and the one in use;
    /// or what to say instead.
    async fn models_of(
        &self,
        owner: Option<&str>,
    ) -> Result<(Launch, Vec<ModelChoice>, Option<String>), String> {
        let launch =
            owner.and_then(|owner| self.cx.store().launch_by_profile(owner).ok().flatten());
        let Some(launch) = launch.filter(|l| l.state.is_running()) else {
            return Err("/model switches the model of a running session the relay launched (/new), in its topic.".into());
        };
        let op = OrderOp::Models {
            launch_id: launch.id.clone(),
        };
        match self.launches.order(op, Duration::from_secs(30)).await {
            Ok(OrderOutcome::Models { models, .. }) if models.is_empty() => {
                Err("The agent offers no models to switch to.".into())
            }
            Ok(OrderOutcome::Models { models, current }) => Ok((launch, models, current)),
            Ok(OrderOutcome::Refused { reason }) => Err(format!("⚠️ {}", escape(&reason))),
            Ok(other) => Err(format!("⚠️ serve answered {other:?}")),
            Err(e) => Err(format!("⚠️ {}", escape(&e.message))),
        }
    }

    /// The models as buttons, two a row, the one in use ticked.
    fn model_buttons(
        &self,
        launch: &Launch,
        models: &[ModelChoice],
        current: Option<String>,
    ) -> Say {
        let shown: Vec<ModelChoice> = models.iter().take(MAX_MODELS).cloned().collect();
        let token = self.offers.keep(Offer::Models {
            launch_id: launch.id.clone(),
            models: shown.clone(),
        });
        let rows = shown
            .chunks(2)
            .enumerate()
            .map(|(row, pair)| {
                pair.iter()
                    .enumerate()
                    .map(|(i, m)| Button {
                        text: if current.as_deref() == Some(m.id.as_str()) {
                            format!("✓ {}", m.label)
                        } else {
                            m.label.clone()
                        },
                        data: format!("c:m:{token}:{}", row * 2 + i),
                    })
                    .collect()
            })
            .collect();
        let mut text = format!(
            "🧠 Model of {} (now: <code>{}</code>):",
            escape(&launch.engine),
            escape(current.as_deref().unwrap_or("unknown"))
        );
        if models.len() > shown.len() {
            text.push_str(&format!(
                "\n(the first {} of {})",
                shown.len(),
                models.len()
            ));
        }
        Say::html(text).with(Some(Keyboard { rows }))
    }

    // ------------------------------------------------------------ buttons

    /// A tap on one of the control place's buttons (`c:…`). Never awaits.
    pub fn tap(self: &Arc<Self>, query: &CallbackQuery) {
        let cx = &self.cx;
        let toast = |text: &'static str| {
            let (speaker, id) = (cx.speaker.clone(), query.id.clone());
            cx.errands
                .run(async move { speaker.toast(&id, text).await });
        };
        let (Some(data), Some(message)) = (query.data.clone(), query.message.clone()) else {
            toast("This button is no longer valid.");
            return;
        };
        if query.from.is_bot || !cx.access.is_allowed(query.from.id) || !cx.is_ours(&message) {
            if cx.errands.admit(query.from.id, Refusal::Tap) {
                toast("You are not allowed to use these buttons.");
            }
            return;
        }
        let place = Place {
            chat_id: message.chat.id,
            thread_id: message.topic(),
        };
        let (tap, user) = (query.id.clone(), query.from.id);
        cx.access
            .saw(&cx.shared_store(), user, &query.from.first_name);
        let control = self.clone();
        let refused = cx.access.refuses(user, needed_for(&data));
        self.cx.errands.run(async move {
            let toast = match refused {
                Some(why) => why,
                None => control.tapped(place, message.message_id, user, &data).await,
            };
            control.cx.speaker.toast(&tap, &toast).await;
        });
    }

    /// Does what a control button says; answers the toast.
    ///
    /// Long because it is the one match over the control buttons' verbs
    /// (page, resume, end, start, model), each with its toast.
    async fn tapped(
        self: &Arc<Self>,
        place: Place,
        message_id: i64,
        user: i64,
        data: &str,
    ) -> String {
        let mut parts = data.splitn(4, ':').skip(1);
        let (verb, arg, extra) = (
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
            parts.next(),
        );
        match verb {
            "s" => {
                let page = arg.parse().unwrap_or(0);
                match self
                    .sessions_message(place, Some(message_id), page, "")
                    .await
                {
                    Ok(_) => format!("Page {}", page + 1),
                    Err(e) => format!("Could not turn the page: {e}"),
                }
            }
            "r" | "e" => {
                let launch_id = arg.to_string();
                let machine = self.machine_of_launch(&launch_id).await;
                let op = if verb == "r" {
                    RemoteOp::Resume {
                        launch_id,
                        by_user: user,
                    }
                } else {
                    RemoteOp::End {
                        launch_id,
                        by_user: user,
                    }
                };
                let done = self.run_op(machine.as_deref(), op).await;
                if let Some(page) = extra.and_then(|p| p.parse().ok()) {
                    let _ = self
                        .sessions_message(place, Some(message_id), page, "")
                        .await;
                }
                toast_of(&done.text)
            }
            "n" => {
                let Some(args) = extra
                    .and_then(|i| i.parse().ok())
                    .and_then(|i| self.offers.folder(arg, i))
                else {
                    return "This list is old: send /new again.".into();
                };
                match self.new_command(place, user, args).await {
                    Ok(()) => "Starting…".into(),
                    Err(e) => format!("Could not start: {e}"),
                }
            }
            "m" => {
                let Some((launch_id, model)) = extra
                    .and_then(|i| i.parse().ok())
                    .and_then(|i| self.offers.model(arg, i))
                else {
                    return "This list is old: send /model again.".into();
                };
                self.switch_model(place, message_id, &launch_id, model)
                    .await
            }
            "x" => self.schedules.cancel(place, message_id, arg, extra).await,
            "y" => self.schedules.turn(place, message_id, arg).await,
            _ => "This button is no longer valid.".into(),
        }
    }

    /// Switches a launch's model; the list's message shows the choice.
    async fn switch_model(
        &self,
        place: Place,
        message_id: i64,
        launch_id: &str,
        model: ModelChoice,
    ) -> String {
        let outcome = self
            .launches
            .order(
                OrderOp::SetModel {
                    launch_id: launch_id.to_string(),
                    model: model.id.clone(),
                },
                Duration::from_secs(30),
            )
            .await;
        let text = match outcome {
            Ok(OrderOutcome::ModelSet { model: set }) => {
                if let Err(e) = self
                    .cx
                    .store()
                    .set_launch_started(launch_id, None, Some(&set))
                {
                    tracing::warn!("cannot record the model: {e}");
                }
                format!(
                    "🧠 Model: <code>{}</code> — for the turns that follow.",
                    escape(&set)
                )
            }
            Ok(OrderOutcome::Refused { reason }) => format!("⚠️ {}", escape(&reason)),
            Ok(other) => format!("⚠️ serve answered {other:?}"),
            Err(e) => format!("⚠️ {}", escape(&e.message)),
        };
        let toast = toast_of(&text);
        let said = self
            .cx
            .speaker
            .edit(place, message_id, Say::html(text))
            .await;
        if let Err(e) = said {
            tracing::warn!("cannot show the model switched: {e}");
        }
        toast
    }

    /// The machine whose session is launch `id` (none: this one).
    async fn machine_of_launch(&self, id: &str) -> Option<String> {
        if self.cx.store().launch(id).ok().flatten().is_some() {
            return None;
        }
        let status = self.status().await.ok()?;
        machines_of(&status).into_iter().find_map(|m| {
            m.sessions
                .iter()
                .any(|s| s.launch.as_ref().is_some_and(|l| l.launch_id == id))
                .then(|| m.node.clone())
        })
    }
}

/// Where the leader answers a message: where it was written.
fn place_of(message: &Message) -> Place {
    Place {
        chat_id: message.chat.id,
        thread_id: message.topic(),
    }
}

/// A toast (at most 200 characters, plain) of an HTML line.
fn toast_of(html: &str) -> String {
    crate::policy::clip(&crate::render::to_plain(html), 190)
}

/// A folder as a button shows it: its last two parts.
fn short_folder(folder: &str) -> String {
    let parts: Vec<&str> = folder
        .rsplit('/')
        .filter(|p| !p.is_empty())
        .take(2)
        .collect();
    let short: Vec<&str> = parts.into_iter().rev().collect();
    crate::policy::clip(&short.join("/"), 40)
}

/// Every machine's sessions, this one's alone when the relay is one machine.
fn machines_of(status: &BusStatus) -> Vec<MachineStatus> {
    match &status.cluster {
        Some(cluster) => cluster.machines.clone(),
        None => vec![MachineStatus {
            node: String::new(),
            answered: true,
            epoch: Some(status.epoch),
            sessions: status.sessions.clone(),
            serve: status.serve.clone(),
        }],
    }
}

/// One page of the session list: its HTML and its buttons.
///
/// Long because the page is one message: every session's line, its link
/// and its buttons, and the page's own buttons, built in the order shown.
pub(super) fn sessions_page(
    status: &BusStatus,
    page: usize,
    prefix: &str,
    name_of: impl Fn(i64) -> String,
) -> (String, Option<Keyboard>) {
    let machines = machines_of(status);
    let many = machines.len() > 1;
    let all: Vec<(&MachineStatus, &SessionStatus)> = machines
        .iter()
        .flat_map(|m| m.sessions.iter().map(move |s| (m, s)))
        .collect();
    let silent: Vec<&str> = machines
        .iter()
        .filter(|m| !m.answered)
        .map(|m| m.node.as_str())
        .collect();
    let mut text = escape(prefix);
    if all.is_empty() {
        text.push_str("No agent sessions yet. Start one with <code>/new &lt;folder&gt;</code>, or run /telegram-connect in an agent.");
        for node in silent {
            text.push_str(&format!("\n• machine {} is not answering", escape(node)));
        }
        return (text, None);
    }
    let pages = all.len().div_ceil(PAGE);
    let page = page.min(pages - 1);
    text.push_str(&format!(
        "<b>Sessions</b> · {}{} — write in a session's topic to talk to it",
        all.len(),
        if pages > 1 {
            format!(" · page {}/{pages}", page + 1)
        } else {
            String::new()
        }
    ));
    let mut buttons: Vec<Button> = Vec::new();
    for (machine, s) in all.iter().skip(page * PAGE).take(PAGE) {
        let state = session_state(s);
        let on = if many && !machine.node.is_empty() {
            format!(" · {}", escape(&machine.node))
        } else {
            String::new()
        };
        let by = match s.launch.as_ref().and_then(|l| l.by_user) {
            Some(user) => format!(" · by {}", escape(&name_of(user))),
            None => String::new(),
        };
        text.push_str(&format!(
            "\n• {} — {state}{by}{on} — <code>{}</code>",
            topic_html(&s.topic_name, s.target),
            escape(&s.cwd)
        ));
        buttons.extend(session_button(s, page));
    }
    for node in silent {
        text.push_str(&format!("\n• machine {} is not answering", escape(node)));
    }
    let mut rows: Vec<Vec<Button>> = buttons.chunks(4).map(<[Button]>::to_vec).collect();
    rows.extend(paging("s", page, pages));
    (text, (!rows.is_empty()).then_some(Keyboard { rows }))
}

/// The least role a control button's verb needs (`c:<verb>:…`): turning
/// a list's page is anyone's, choosing a model a driver's, starting,
/// resuming, ending and cancelling an owner's.
fn needed_for(data: &str) -> Role {
    match data.split(':').nth(1).unwrap_or("") {
        "s" | "y" => Role::Viewer,
        "m" => Role::Driver,
        _ => Role::Owner,
    }
}

/// A launched session's button on page `page` of the list: end it while
/// it runs, resume it when not.
fn session_button(s: &SessionStatus, page: usize) -> Option<Button> {
    let launch = s.launch.as_ref()?;
    let running = matches!(launch.state.as_str(), "running" | "starting");
    Some(Button {
        text: format!("{} {}", if running { "⏹" } else { "▶" }, s.slot),
        data: format!(
            "c:{}:{}:{page}",
            if running { "e" } else { "r" },
            launch.launch_id
        ),
    })
}

/// How a session is doing, in words.
fn session_state(s: &SessionStatus) -> String {
    match (&s.launch, s.live) {
        (Some(l), true) => format!("● live · {} (launched)", l.engine),
        (Some(l), false) => match l.state.as_str() {
            "starting" | "running" => format!("◌ starting · {}", l.engine),
            "idle" => format!("💤 idle, ended · {}", l.engine),
            "crashed" => format!("⚠️ stopped by itself · {}", l.engine),
            _ => format!("⏹ ended · {}", l.engine),
        },
        (None, true) => "● live".into(),
        (None, false) => "○ offline".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(slot: usize, launched: Option<&str>) -> SessionStatus {
        SessionStatus {
            slot: Slot::from_index(slot).unwrap(),
            topic_name: format!("{} · s{slot}", Slot::from_index(slot).unwrap()),
            target: Some(Target {
                chat_id: -1_001_000_000_001,
                thread_id: 10 + slot as i64,
            }),
            profile_key: format!("k{slot}"),
            session_name: format!("s{slot}"),
            cwd: format!("/home/ada/s{slot}"),
            pid: 1,
            instance_id: "i".into(),
            heartbeat_age_ms: 0,
            live: launched.is_none(),
            reconciled: true,
            launch: launched.map(|state| SessionLaunch {
                launch_id: format!("{slot:012x}"),
                engine: "pi".into(),
                state: state.into(),
                by_user: Some(501),
            }),
        }
    }

    #[test]
    fn the_session_list_is_one_page_at_a_time_with_its_buttons() {
        let mut sessions: Vec<SessionStatus> = (0..10).map(|i| session(i, None)).collect();
        sessions[1] = session(1, Some("ended"));
        sessions[9] = session(9, Some("running"));
        let status = BusStatus {
            epoch: 1,
            leader_pid: 1,
            leader_instance: "i".into(),
            leader_since_ms: 0,
            sessions,
            poll: None,
            pacing: Vec::new(),
            cluster: None,
            serve: None,
            lacking: Vec::new(),
        };
        let (first, buttons) = sessions_page(&status, 0, "", |user| format!("Ann <{user}"));
        assert!(first.contains("page 1/2"), "{first}");
        assert!(
            first.contains("/home/ada/s0") && !first.contains("/home/ada/s9"),
            "{first}"
        );
        assert!(first.contains("https://t.me/c/1000000001/10"), "{first}");
        let rows = buttons.unwrap().rows;
        assert_eq!(rows[0][0].text, "▶ B");
        assert_eq!(rows[0][0].data, "c:r:000000000001:0");
        assert_eq!(rows.last().unwrap()[0].data, "c:s:1", "to the next page");
        assert!(
            first.contains("⏹ ended · pi · by Ann &lt;501"),
            "who started a launched session, escaped: {first}"
        );
        let (second, buttons) = sessions_page(&status, 1, "", |user| format!("Ann <{user}"));
        assert!(second.contains("/home/ada/s9"), "{second}");
        let rows = buttons.unwrap().rows;
        assert_eq!(rows[0][0].text, "⏹ J", "a running launch can be ended");
        assert!(rows.iter().flatten().all(|b| b.data.len() <= 64));
    }
}
