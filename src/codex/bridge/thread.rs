//! Which thread the session is: the one the bridge opens alone, or the
//! one the TUI has open, adopted (the first initializes the session, a
//! later one switches it); and the subscription to its events, tried
//! whenever it may work.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::{CodexBridge, Mode, Opened, Opening, QUICK, SESSION_QUICK};
use crate::codex::app_server::AppServerError;
use crate::codex::wire::{self, method as codex};
use crate::protocol::host::{PROTOCOL_VERSION, method};

/// How often a thread not yet subscribed to is tried again, besides after
/// each of its status changes.
const SUBSCRIBE_RETRY: Duration = Duration::from_secs(2);

impl CodexBridge {
    /// The thread at the start: opened by the bridge when alone; beside the
    /// TUI, one it already has loaded (the TUI may have been quicker).
    pub(super) async fn open_thread(&self) -> Result<(), AppServerError> {
        match &self.mode {
            Mode::Alone(Opening::Start { cwd, model }) => {
                let opened: wire::WithThread = self
                    .codex
                    .request(
                        codex::THREAD_START,
                        &wire::ThreadStartParams {
                            cwd: cwd.clone(),
                            model: model.clone(),
                        },
                        QUICK,
                    )
                    .await?;
                // The connection that starts a thread gets its events.
                self.state().subscribed = true;
                self.name_after_folder(&opened.thread.id, cwd).await;
                self.adopt(opened.thread, "startup").await;
            }
            Mode::Alone(Opening::Resume { thread_id }) => {
                let opened: wire::WithThread = self
                    .codex
                    .request(
                        codex::THREAD_RESUME,
                        &wire::ThreadResumeParams {
                            thread_id: thread_id.clone(),
                            exclude_turns: true,
                        },
                        QUICK,
                    )
                    .await?;
                self.state().subscribed = true;
                self.adopt(opened.thread, "resume").await;
            }
            Mode::BesideTui => {
                let loaded: wire::LoadedThreads = self
                    .codex
                    .request(codex::THREAD_LOADED_LIST, &json!({}), QUICK)
                    .await?;
                for thread_id in loaded.data {
                    self.consider(&thread_id).await;
                }
            }
        }
        Ok(())
    }

    /// Names a thread the relay opened after its folder, as its topic is
    /// named. Codex writes nothing of a thread before its first turn, so
    /// one ended before that could not be resumed (`no rollout found`): a
    /// session started without a prompt, then ended, idle or caught by a
    /// restart of `serve`. Naming it writes it down.
    async fn name_after_folder(&self, thread_id: &str, cwd: &str) {
        let Some(name) = std::path::Path::new(cwd)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
        else {
            return;
        };
        let named: Result<Value, _> = self
            .codex
            .request(
                codex::THREAD_NAME_SET,
                &json!({"threadId": thread_id, "name": name}),
                QUICK,
            )
            .await;
        if let Err(e) = named {
            tracing::warn!(
                thread_id,
                "cannot name the thread (it cannot be resumed before its first turn): {e}"
            );
        }
    }

    /// A thread the TUI opened without a `thread/started` (a resumed one
    /// announces itself by its status only): adopted if it is new and a
    /// conversation.
    pub(super) async fn consider(&self, thread_id: &str) {
        if !self.beside_tui() || self.state().known.contains(thread_id) {
            return;
        }
        let read: Result<wire::WithThread, _> = self
            .codex
            .request(
                codex::THREAD_READ,
                &json!({"threadId": thread_id, "includeTurns": false}),
                QUICK,
            )
            .await;
        match read {
            Ok(read) => self.adopt(read.thread, "resume").await,
            Err(e) => tracing::debug!(thread_id, "cannot read the thread: {e}"),
        }
    }

    /// Makes `thread` the session's: the first one initializes the
    /// session, a later one switches it (as pi's `/new` does).
    pub(super) async fn adopt(&self, thread: wire::Thread, reason: &str) {
        {
            let mut state = self.state();
            if !state.known.insert(thread.id.clone()) && state.thread.is_some() {
                return;
            }
            if !thread.is_conversation() || state.thread.as_deref() == Some(&thread.id) {
                return;
            }
        }
        let info = json!({
            "id": thread.id,
            "file": crate::codex::session_file(&thread.id),
            "name": thread.name,
        });
        let first = self.state().thread.is_none();
        let said = if first {
            let cwd = thread
                .cwd
                .clone()
                .or_else(|| {
                    std::env::current_dir()
                        .ok()
                        .map(|d| d.display().to_string())
                })
                .unwrap_or_default();
            let params = json!({
                "protocolVersion": PROTOCOL_VERSION,
                "host": {"name": "codex", "version": ""},
                "pid": std::process::id(),
                "cwd": cwd,
                "session": info,
                "hasUI": false,
                // `turn/steer` puts a prompt into the turn that runs.
                "canSteer": true,
            });
            match self
                .session
                .request(method::INITIALIZE, params, SESSION_QUICK)
                .await
            {
                Ok(_) => self.session.notify(method::INITIALIZED, json!({})),
                Err(e) => Err(e),
            }
        } else {
            tracing::info!(thread = %thread.id, "Codex switched threads");
            self.session.notify(
                method::SESSION_STARTED,
                json!({"reason": reason, "session": info}),
            )
        };
        if let Err(e) = said {
            tracing::warn!("the session did not take Codex's thread: {e}");
            self.set_opened(Err(format!("the relay's session did not take it: {e}")));
            return;
        }
        self.set_opened(Ok(Opened {
            thread_id: thread.id.clone(),
            model: thread.model.clone(),
        }));
        {
            let mut state = self.state();
            let resumed_already = state.subscribed && matches!(self.mode, Mode::Alone(_));
            state.thread = Some(thread.id);
            state.subscribed = resumed_already;
            state.turn = None;
            state.answer = None;
        }
        self.try_subscribe.notify_one();
    }

    /// Subscribes to the session's thread whenever it is not yet.
    pub(super) fn spawn_subscriber(self: Arc<Self>) {
        crate::tasks::spawn(async move {
            loop {
                tokio::select! {
                    () = self.stop.cancelled() => return,
                    () = self.try_subscribe.notified() => {}
                    () = tokio::time::sleep(SUBSCRIBE_RETRY) => {}
                }
                let Some(thread_id) = ({
                    let state = self.state();
                    state.thread.clone().filter(|_| !state.subscribed)
                }) else {
                    continue;
                };
                let resumed: Result<Value, _> = self
                    .codex
                    .request(
                        codex::THREAD_RESUME,
                        &wire::ThreadResumeParams {
                            thread_id: thread_id.clone(),
                            exclude_turns: true,
                        },
                        QUICK,
                    )
                    .await;
                match resumed {
                    Ok(_) => {
                        let mut state = self.state();
                        if state.thread.as_deref() == Some(&thread_id) {
                            state.subscribed = true;
                        }
                        tracing::debug!(thread_id, "subscribed to the thread");
                    }
                    // Before its first turn Codex has nothing to resume.
                    Err(e) => tracing::debug!(thread_id, "not subscribed yet: {e}"),
                }
            }
        });
    }
}
