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
//! a model (`m`), a schedule to cancel (`x`). What a button offers that
//! does not fit in 64 bytes (a folder, a model) is kept here under a short
//! token for an hour.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::command::{Command, NewArgs, parse};
use super::failure::Failure;
use super::launches::{NO_SERVE, new_launch_id};
use super::outbox::Pace;
use super::{Leader, now_ms};
use crate::ids::Place;
use crate::protocol::bus::*;
use crate::protocol::launch::{
    LaunchSpec, ModelChoice, OrderOp, OrderOutcome, RemoteDone, RemoteOp,
};
use crate::render::escape;
use crate::telegram::types::{EditMessageText, LinkPreviewOptions, ParseMode, SendMessage};
use crate::telegram::{BotCall, CallbackQuery, ChatKind, Message};

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

/// The control place's own state: what its buttons offer.
#[derive(Default)]
pub(super) struct Control {
    offers: Mutex<HashMap<String, (Instant, Offer)>>,
}

impl Control {
    fn keep(&self, offer: Offer) -> String {
        let mut offers = self.offers.lock().unwrap_or_else(PoisonError::into_inner);
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
        let offers = self.offers.lock().unwrap_or_else(PoisonError::into_inner);
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
        let offers = self.offers.lock().unwrap_or_else(PoisonError::into_inner);
        match offers.get(token) {
            Some((_, Offer::Models { launch_id, models })) => {
                Some((launch_id.clone(), models.get(index)?.clone()))
            }
            _ => None,
        }
    }
}

/// A link to a topic, where Telegram has one (a supergroup's topic: its
/// `-100` id without the prefix).
pub(super) fn topic_link(target: Target) -> Option<String> {
    let id = target.chat_id.to_string();
    let bare = id.strip_prefix("-100")?;
    Some(format!("https://t.me/c/{bare}/{}", target.thread_id))
}

/// A topic's name as HTML, linked where Telegram allows.
fn topic_html(name: &str, target: Option<Target>) -> String {
    match target.and_then(topic_link) {
        Some(link) => format!("<a href=\"{}\">{}</a>", escape(&link), escape(name)),
        None => format!("<b>{}</b>", escape(name)),
    }
}

impl Leader {
    /// Whether `chat` is one of the relay's own chats, where its lists
    /// (which name local paths) may go.
    pub(super) fn is_ours(&self, message: &Message) -> bool {
        message.chat.kind == ChatKind::Private || Some(message.chat.id) == self.chat_id
    }

    /// The engines `/new` knows by name: every `[launch.commands]` name
    /// (each engine has one, its default command), and those this
    /// machine's `serve` said it starts (`Engine`'s names, which the leader
    /// may not import: `launch` is a bus member). A new engine needs no
    /// edit here.
    fn engines(&self) -> Vec<String> {
        let mut names: Vec<String> = self.serve_status().map(|s| s.engines).unwrap_or_default();
        for name in self.launch_policy.commands.keys() {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        names
    }

    /// A message from an allowed user in the relay's own chat that no
    /// session takes: a command, or the list. Never awaits.
    pub(super) fn control_message(self: &Arc<Self>, message: &Message, prefix: String) {
        let text = message.text.as_deref().unwrap_or_default().to_string();
        let place = Place {
            chat_id: message.chat.id,
            thread_id: message.topic(),
        };
        let user = message.from.as_ref().map_or(0, |u| u.id);
        let owner = place.thread_id.and_then(|thread| {
            self.store()
                .binding_by_thread(place.chat_id, thread)
                .ok()
                .flatten()
                .filter(|b| b.target().is_some())
                .map(|b| b.profile_key)
        });
        let command = parse(&text, &self.engines());
        self.router.replies.spawn(self, move |leader| async move {
            match (command, owner) {
                (Some(command), owner) => {
                    leader.command(place, user, command, owner.as_deref()).await
                }
                (None, _) => {
                    let said = leader.sessions_message(place, None, 0, &prefix).await;
                    if let Err(e) = said {
                        tracing::warn!("cannot answer with the session list: {e}");
                    }
                }
            }
        });
    }

    /// Runs one command from `user`; `owner` is the session whose topic it
    /// was written in, if any.
    async fn command(
        self: &Arc<Self>,
        place: Place,
        user: i64,
        command: Command,
        owner: Option<&str>,
    ) {
        let said = match command {
            Command::New(args) => self.new_command(place, user, args).await,
            Command::Sessions => self.sessions_message(place, None, 0, "").await.map(drop),
            Command::Resume(which) => self.resume_command(place, user, which, owner).await,
            Command::End => self.end_command(place, user, owner).await,
            Command::Model => self.model_command(place, owner).await,
            Command::Every(rest) => {
                self.schedule_command(place, user, owner, &rest, false)
                    .await
            }
            Command::At(rest) => self.schedule_command(place, user, owner, &rest, true).await,
            Command::Schedules => self.schedules_message(place, owner).await,
        };
        if let Err(e) = said {
            tracing::warn!("cannot answer a command: {e}");
        }
    }

    /// Posts `html` with `buttons` in `place` at once; answers the message
    /// id. Not through the outbox of record (`courier.rs`): the control
    /// place edits its messages later by that id, and an answer to a
    /// command lost with its leader is asked for again.
    pub(super) async fn post_now(
        &self,
        place: Place,
        html: String,
        buttons: Option<Keyboard>,
    ) -> Result<i64, Failure> {
        let call = BotCall::SendMessage(SendMessage {
            chat_id: place.chat_id,
            message_thread_id: place.thread_id,
            text: html,
            parse_mode: Some(ParseMode::Html),
            reply_markup: buttons.as_ref().map(super::topic::markup),
            reply_parameters: None,
            link_preview_options: Some(LinkPreviewOptions::default()),
        });
        let done = self.outbox.call(call, Pace::high()).await?;
        Ok(done.reply.message_id().unwrap_or_default())
    }

    /// Replaces a message's text and buttons.
    pub(super) async fn edit(
        &self,
        place: Place,
        message_id: i64,
        html: String,
        buttons: Option<Keyboard>,
    ) -> Result<(), Failure> {
        let call = BotCall::EditMessageText(EditMessageText {
            chat_id: place.chat_id,
            message_id,
            text: html,
            parse_mode: Some(ParseMode::Html),
            reply_markup: buttons.as_ref().map(super::topic::markup),
            link_preview_options: Some(LinkPreviewOptions::default()),
        });
        self.outbox
            .call(call, Pace::of(crate::telegram::Priority::Normal))
            .await
            .map(drop)
    }

    /// Posts `html` in `place`, or edits `message_id` to it.
    async fn say_or_edit(
        &self,
        place: Place,
        message_id: Option<i64>,
        html: String,
        buttons: Option<Keyboard>,
    ) -> Result<i64, Failure> {
        match message_id {
            Some(id) => self.edit(place, id, html, buttons).await.map(|()| id),
            None => self.post_now(place, html, buttons).await,
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
            .unwrap_or_else(|| self.launch_policy.default_engine.clone());
        let wait = format!(
            "⏳ Starting {} in <code>{}</code>{}…",
            escape(&engine),
            escape(&folder),
            args.machine
                .as_deref()
                .map(|m| format!(" on {}", escape(m)))
                .unwrap_or_default()
        );
        let message_id = self.post_now(place, wait, None).await?;
        let op = RemoteOp::New {
            folder,
            engine: Some(engine),
            prompt: args.prompt,
            by_user: user,
        };
        let done = self.run_op(args.machine.as_deref(), op).await;
        self.edit(place, message_id, done.text, None).await
    }

    /// Runs `op` on `machine` (this one when none is named, or the only
    /// machine whose `serve` runs): here, or through the cluster.
    pub(super) async fn run_op(
        self: &Arc<Self>,
        machine: Option<&str>,
        op: RemoteOp,
    ) -> RemoteDone {
        let here = self.cluster.as_ref().map(|node| node.name().to_string());
        let machine = match machine {
            Some(m) => Some(m.to_string()),
            None if self.serve_status().is_some() || self.cluster.is_none() => None,
            None => match self.machine_with_serve().await {
                Ok(m) => m,
                Err(why) => return refused(&why),
            },
        };
        match machine {
            Some(m) if Some(&m) != here.as_ref() => self.ask_machine(&m, op).await,
            _ => self.run_here(op).await,
        }
    }

    /// The only other machine whose `serve` runs, when this one has none.
    async fn machine_with_serve(&self) -> Result<Option<String>, String> {
        let status = self.cluster_status().await.map_err(|e| e.message)?;
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

    /// Runs `op` with this machine's `serve`; what it says is one line of
    /// HTML for the control place.
    pub(super) async fn run_here(self: &Arc<Self>, op: RemoteOp) -> RemoteDone {
        match op {
            RemoteOp::New {
                folder,
                engine,
                prompt,
                by_user,
            } => {
                let engine = engine.unwrap_or_else(|| self.launch_policy.default_engine.clone());
                if self.launch_policy.roots.is_empty() {
                    return refused(&self.no_roots());
                }
                tracing::info!(target: "audit", user = by_user, %folder, %engine, "start a session from the phone");
                let spec = LaunchSpec {
                    launch_id: new_launch_id(),
                    engine: engine.clone(),
                    folder,
                    resume_id: None,
                    model: None,
                    by_user,
                };
                match self.start_new(spec, prompt).await {
                    Ok(route) => RemoteDone {
                        ok: true,
                        text: format!(
                            "▶ {} started: {}",
                            escape(&engine),
                            topic_html(&route.topic_name, route.target)
                        ),
                    },
                    Err(why) => refused(&why),
                }
            }
            RemoteOp::Resume { launch_id, by_user } => match self.resume(&launch_id, by_user).await
            {
                Ok((route, started)) => RemoteDone {
                    ok: true,
                    text: format!(
                        "{}: {}",
                        if started {
                            "▶ Resumed"
                        } else {
                            "● Running already"
                        },
                        topic_html(&route.topic_name, route.target)
                    ),
                },
                Err(why) => refused(&why),
            },
            RemoteOp::End { launch_id, by_user } => match self.end(&launch_id, by_user).await {
                Ok(()) => RemoteDone {
                    ok: true,
                    text: "⏹ Ended.".into(),
                },
                Err(why) => refused(&why),
            },
        }
    }

    /// What `/new` says when no folder may have agents.
    fn no_roots(&self) -> String {
        format!(
            "starting agents from the phone is off on this machine: add the folders agents may work in to {} as <code>[launch] roots = [\"~/code\"]</code>, then restart agent-relay serve",
            escape(&self.config_file_name())
        )
    }

    fn config_file_name(&self) -> String {
        "config.toml".into()
    }

    /// `/new` without a folder (alone, or with an engine and a first
    /// prompt): the folders sessions ran in lately, under the roots, as
    /// buttons that start what `args` names there.
    async fn offer_folders(&self, place: Place, args: NewArgs) -> Result<(), Failure> {
        if self.launch_policy.roots.is_empty() {
            self.post_now(place, format!("⚠️ {}", self.no_roots()), None)
                .await?;
            return Ok(());
        }
        let folders = self.recent_folders();
        if folders.is_empty() {
            let roots: Vec<String> = self
                .launch_policy
                .roots
                .iter()
                .map(|r| r.display().to_string())
                .collect();
            // After an engine's name only a path is a folder (`command.rs`).
            let syntax = match &args.engine {
                Some(engine) => format!("/new {} ~/&lt;folder&gt;", escape(engine)),
                None => format!(
                    "/new &lt;folder&gt; [{}]",
                    escape(&self.engines().join("|"))
                ),
            };
            let text = format!(
                "Start a session: <code>{syntax} [first prompt]</code>, in a folder under {}.",
                escape(&roots.join(", "))
            );
            self.post_now(place, text, None).await?;
            return Ok(());
        }
        let engine = args
            .engine
            .clone()
            .unwrap_or_else(|| self.launch_policy.default_engine.clone());
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
        let token = self.control.keep(Offer::Folders {
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
        self.post_now(place, text, Some(Keyboard { rows })).await?;
        Ok(())
    }

    /// The folders sessions ran in, newest first, under a root.
    fn recent_folders(&self) -> Vec<String> {
        let mut folders: Vec<(u64, String)> = Vec::new();
        if let Ok(bindings) = self.store().bindings() {
            folders.extend(bindings.into_iter().map(|b| (b.updated_ms, b.cwd)));
        }
        if let Ok(launches) = self.store().launches() {
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
                .launch_policy
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
    pub(super) async fn sessions_message(
        self: &Arc<Self>,
        place: Place,
        edit: Option<i64>,
        page: usize,
        prefix: &str,
    ) -> Result<i64, Failure> {
        let status = self.cluster_status().await;
        let (text, buttons) = match status {
            Ok(status) => sessions_page(&status, page, prefix),
            Err(e) => (
                format!(
                    "{prefix}The relay cannot list its sessions: {}",
                    escape(&e.message)
                ),
                None,
            ),
        };
        self.say_or_edit(place, edit, text, buttons).await
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
                let Some(launch) = self.store().launch_by_profile(owner).ok().flatten() else {
                    let text = "This session was started at a keyboard: resume it there. /resume starts again sessions the relay launched (/new).";
                    return self.post_now(place, text.into(), None).await.map(drop);
                };
                // In its own topic, on this machine (the topic's updates
                // come to the machine of its session): a resume says so in
                // the topic itself, so only what else happened is answered.
                let text = match self.resume(&launch.id, user).await {
                    Ok((_, true)) => return Ok(()),
                    Ok((_, false)) => {
                        "● This session is running already: write here to talk to it.".to_string()
                    }
                    Err(why) => refused(&why).text,
                };
                return self.post_now(place, text, None).await.map(drop);
            }
            (None, None) => return self.sessions_message(place, None, 0, "").await.map(drop),
            (Some(which), _) => self.find_launch(&which).await,
        };
        let Some((machine, id)) = launch else {
            let text = "⚠️ No session the relay launched goes by that name here; /sessions lists them (a session started at a keyboard resumes there).";
            self.post_now(place, text.into(), None).await?;
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
        self.post_now(place, done.text, None).await.map(drop)
    }

    /// The launch a slot letter or a session's name names, on any machine.
    async fn find_launch(&self, which: &str) -> Option<(Option<String>, String)> {
        let status = self.cluster_status().await.ok()?;
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
        let launch = owner.and_then(|owner| self.store().launch_by_profile(owner).ok().flatten());
        let text = match (owner, launch) {
            (None, _) => "/end works in the topic of a session the relay launched; /sessions has an end button for each.".to_string(),
            (Some(_), None) => "This session was started at a keyboard: end it there. /end ends sessions the relay launched (/new).".to_string(),
            (Some(_), Some(launch)) if !launch.state.is_running() => "This session is not running; write here to start it again.".to_string(),
            (Some(_), Some(launch)) => match self.end(&launch.id, user).await {
                // The report of its end says so in the topic.
                Ok(()) => return Ok(()),
                Err(why) => format!("⚠️ Could not end it: {}", escape(&why)),
            },
        };
        self.post_now(place, text, None).await.map(drop)
    }

    // ------------------------------------------------------------ /model

    /// `/model` in a launched session's topic: the models its agent offers,
    /// as buttons.
    ///
    /// Long because it is one conversation: the order to the machine that runs
    /// the agent, each way its answer can end, and the buttons that follow.
    async fn model_command(
        self: &Arc<Self>,
        place: Place,
        owner: Option<&str>,
    ) -> Result<(), Failure> {
        let launch = owner.and_then(|owner| self.store().launch_by_profile(owner).ok().flatten());
        let Some(launch) = launch.filter(|l| l.state.is_running()) else {
            let text = "/model switches the model of a running session the relay launched (/new), in its topic.";
            return self.post_now(place, text.into(), None).await.map(drop);
        };
        let outcome = self
            .order(
                OrderOp::Models {
                    launch_id: launch.id.clone(),
                },
                Duration::from_secs(30),
            )
            .await;
        let (models, current) = match outcome {
            Ok(OrderOutcome::Models { models, current }) => (models, current),
            Ok(OrderOutcome::Refused { reason }) => {
                return self
                    .post_now(place, format!("⚠️ {}", escape(&reason)), None)
                    .await
                    .map(drop);
            }
            Ok(other) => {
                return self
                    .post_now(place, format!("⚠️ serve answered {other:?}"), None)
                    .await
                    .map(drop);
            }
            Err(e) => {
                return self
                    .post_now(place, format!("⚠️ {}", escape(&e.message)), None)
                    .await
                    .map(drop);
            }
        };
        if models.is_empty() {
            return self
                .post_now(
                    place,
                    "The agent offers no models to switch to.".into(),
                    None,
                )
                .await
                .map(drop);
        }
        let shown: Vec<ModelChoice> = models.iter().take(MAX_MODELS).cloned().collect();
        let token = self.control.keep(Offer::Models {
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
        self.post_now(place, text, Some(Keyboard { rows }))
            .await
            .map(drop)
    }

    // ------------------------------------------------------------ buttons

    /// A tap on one of the control place's buttons (`c:…`). Never awaits.
    pub(super) fn control_tap(self: &Arc<Self>, query: &CallbackQuery) {
        let replies = &self.router.replies;
        let (Some(data), Some(message)) = (query.data.clone(), query.message.clone()) else {
            replies.answer_tap(self, query.id.clone(), "This button is no longer valid.");
            return;
        };
        if query.from.is_bot || !self.access.is_allowed(query.from.id) || !self.is_ours(&message) {
            if replies.admit(query.from.id, super::replies::Refusal::Tap) {
                replies.answer_tap(
                    self,
                    query.id.clone(),
                    "You are not allowed to use these buttons.",
                );
            }
            return;
        }
        let place = Place {
            chat_id: message.chat.id,
            thread_id: message.topic(),
        };
        let (tap, user) = (query.id.clone(), query.from.id);
        self.router.replies.spawn(self, move |leader| async move {
            let toast = leader.tapped(place, message.message_id, user, &data).await;
            if let Err(e) = leader.outbox.answer_tap(&tap, Some(&toast)).await {
                tracing::debug!("cannot answer a tap: {e}");
            }
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
                    .and_then(|i| self.control.folder(arg, i))
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
                    .and_then(|i| self.control.model(arg, i))
                else {
                    return "This list is old: send /model again.".into();
                };
                self.switch_model(place, message_id, &launch_id, model)
                    .await
            }
            "x" => self.cancel_schedule(place, message_id, arg).await,
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
                if let Err(e) = self.store().set_launch_started(launch_id, None, Some(&set)) {
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
        if let Err(e) = self.edit(place, message_id, text, None).await {
            tracing::warn!("cannot show the model switched: {e}");
        }
        toast
    }

    /// The machine whose session is launch `id` (none: this one).
    async fn machine_of_launch(&self, id: &str) -> Option<String> {
        if self.store().launch(id).ok().flatten().is_some() {
            return None;
        }
        let status = self.cluster_status().await.ok()?;
        machines_of(&status).into_iter().find_map(|m| {
            m.sessions
                .iter()
                .any(|s| s.launch.as_ref().is_some_and(|l| l.launch_id == id))
                .then(|| m.node.clone())
        })
    }
}

/// A toast (at most 200 characters, plain) of an HTML line.
fn toast_of(html: &str) -> String {
    crate::policy::clip(&crate::render::to_plain(html), 190)
}

/// What an order that did nothing says.
fn refused(why: &str) -> RemoteDone {
    RemoteDone {
        ok: false,
        text: format!("⚠️ Not done: {}", escape(why)),
    }
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
        text.push_str(&format!(
            "\n• {} — {state}{on} — <code>{}</code>",
            topic_html(&s.topic_name, s.target),
            escape(&s.cwd)
        ));
        if let Some(launch) = &s.launch {
            let running = matches!(launch.state.as_str(), "running" | "starting");
            buttons.push(Button {
                text: format!("{} {}", if running { "⏹" } else { "▶" }, s.slot),
                data: format!(
                    "c:{}:{}:{page}",
                    if running { "e" } else { "r" },
                    launch.launch_id
                ),
            });
        }
    }
    for node in silent {
        text.push_str(&format!("\n• machine {} is not answering", escape(node)));
    }
    let mut rows: Vec<Vec<Button>> = buttons.chunks(4).map(<[Button]>::to_vec).collect();
    if pages > 1 {
        let mut paging = Vec::new();
        if page > 0 {
            paging.push(Button {
                text: "◀".into(),
                data: format!("c:s:{}", page - 1),
            });
        }
        if page + 1 < pages {
            paging.push(Button {
                text: "▶".into(),
                data: format!("c:s:{}", page + 1),
            });
        }
        rows.push(paging);
    }
    (text, (!rows.is_empty()).then_some(Keyboard { rows }))
}

/// How a session is doing, in words.
fn session_state(s: &SessionStatus) -> String {
    let how = match (&s.launch, s.live) {
        (Some(l), true) => format!("● live · {} (launched)", l.engine),
        (Some(l), false) => match l.state.as_str() {
            "starting" | "running" => format!("◌ starting · {}", l.engine),
            "idle" => format!("💤 idle, ended · {}", l.engine),
            "crashed" => format!("⚠️ stopped by itself · {}", l.engine),
            _ => format!("⏹ ended · {}", l.engine),
        },
        (None, true) => "● live".into(),
        (None, false) => "○ offline".into(),
    };
    let _ = now_ms;
    how
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_links_exist_in_supergroups_only() {
        let group = Target {
            chat_id: -1_001_234_567_890,
            thread_id: 42,
        };
        assert_eq!(
            topic_link(group).as_deref(),
            Some("https://t.me/c/1234567890/42")
        );
        let private = Target {
            chat_id: 1001,
            thread_id: 42,
        };
        assert_eq!(topic_link(private), None);
    }

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
        };
        let (first, buttons) = sessions_page(&status, 0, "");
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
        let (second, buttons) = sessions_page(&status, 1, "");
        assert!(second.contains("/home/ada/s9"), "{second}");
        let rows = buttons.unwrap().rows;
        assert_eq!(rows[0][0].text, "⏹ J", "a running launch can be ended");
        assert!(rows.iter().flatten().all(|b| b.data.len() <= 64));
    }
}
