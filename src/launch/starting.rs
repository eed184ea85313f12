//! An agent from its spawn to its end, the same for every engine: the
//! process spawned (`child.rs`), what ends it noted as the engine sets it
//! up, a start-up that fails ended and reported with the process's
//! stderr, and once it runs, `serve`'s controls served until it ends. An
//! engine (`engines/`) names only what differs: its command line, how it
//! gets going on the pipes, and how it answers the model questions (its
//! [`Driver`]).
//!
//! The end is one order whichever way it comes (a failed start-up, `End`,
//! `serve` dropping the agent, the agent leaving by itself): the agent's
//! input closed (what each engine noted with [`Starting::on_close`]), the
//! process ended ([`child::end`]), what it left in its process group ended
//! ([`child::end_group`]), then what ran beside it ended
//! ([`Starting::after`]: a hosted session, the relay's tool for Codex).

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::{mpsc, oneshot, watch};

use super::child::{self, Spawned, StderrTail};
use super::engine::{Agent, Control, EngineError, Exit, Models, Start};

/// How a running agent answers `serve`'s questions about models; its end
/// is [`Starting`]'s. Each answers now or from a task of its own, so the
/// controls that follow are not held up.
pub(super) trait Driver: Send + 'static {
    /// The models it offers, and the one in use.
    fn models(&mut self, reply: oneshot::Sender<Result<Models, String>>);
    /// Switches the model for the turns that follow; answers the model set.
    fn set_model(&mut self, model: String, reply: oneshot::Sender<Result<String, String>>);
}

/// What start-up learnt, for `serve`.
pub(super) struct Started {
    /// The agent's own session, to start it again.
    pub resume_id: Option<String>,
    /// The model in use.
    pub model: Option<String>,
    /// When a turn last started or ended.
    pub activity: watch::Receiver<Instant>,
}

/// An agent's process being set up by its engine.
pub(super) struct Starting {
    engine: &'static str,
    child: Child,
    pid: u32,
    stderr: StderrTail,
    close: Vec<Box<dyn FnOnce() + Send>>,
    after: Vec<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Starting {
    /// Spawns `argv` (see [`child::spawn`]) for `engine` (its name in a
    /// failure); the agent's stdin and stdout are the engine's.
    pub fn spawn(
        engine: &'static str,
        argv: &[String],
        start: &Start,
    ) -> Result<(Self, ChildStdin, ChildStdout), EngineError> {
        let Spawned {
            child,
            pid,
            stdin,
            stdout,
            stderr,
        } = child::spawn(argv, &start.folder, &start.env)?;
        crate::logging::milestone("agent-spawned", i64::from(pid));
        let starting = Self {
            engine,
            child,
            pid,
            stderr,
            close: Vec::new(),
            after: Vec::new(),
        };
        Ok((starting, stdin, stdout))
    }

    /// The agent's process id (its process group's too).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// How the agent's input closes: the polite end, asked first.
    pub fn on_close(&mut self, close: impl FnOnce() + Send + 'static) {
        self.close.push(Box::new(close));
    }

    /// What ends once the process did, in the order noted.
    pub fn after(&mut self, ended: impl Future<Output = ()> + Send + 'static) {
        self.after.push(Box::pin(ended));
    }

    /// Ends an agent whose start-up failed: the error says why, with the
    /// last of its stderr.
    pub async fn failed(mut self, why: impl std::fmt::Display) -> EngineError {
        let exit = self.end().await;
        self.ended().await;
        EngineError::Startup {
            engine: self.engine,
            message: format!(
                "{why}; its stderr: {}",
                crate::policy::clip(&exit.stderr, 800)
            ),
        }
    }

    /// Hands the running agent to `serve`: its controls are served (the
    /// model questions by `driver`) until the process ends.
    pub fn serve(mut self, mut driver: impl Driver, started: Started) -> Agent {
        let (control, mut controls) = mpsc::channel(16);
        let (exit_tx, exited) = oneshot::channel();
        let pid = self.pid;
        crate::tasks::spawn(async move {
            let exit = loop {
                let control = tokio::select! {
                    exit = child::exit_of(&mut self.child, &self.stderr) => break exit,
                    control = controls.recv() => control,
                };
                match control {
                    Some(Control::Models(reply)) => driver.models(reply),
                    Some(Control::SetModel(model, reply)) => driver.set_model(model, reply),
                    Some(Control::End(done)) => {
                        let exit = self.end().await;
                        let _ = done.send(());
                        break exit;
                    }
                    None => break self.end().await,
                }
            };
            self.ended().await;
            let _ = exit_tx.send(exit);
        });
        Agent {
            pid,
            resume_id: started.resume_id,
            model: started.model,
            control,
            exited,
            activity: started.activity,
        }
    }

    /// The agent's input closed, then its process ended.
    async fn end(&mut self) -> Exit {
        for close in self.close.drain(..) {
            close();
        }
        child::end(&mut self.child, self.pid, &self.stderr).await
    }

    /// What the agent left in its process group ends, then what ran beside
    /// the process.
    async fn ended(&mut self) {
        child::end_group(self.pid).await;
        for ended in self.after.drain(..) {
            ended.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    /// `sh -c <script>` in a temporary folder, with no environment.
    fn spawned(script: &str) -> (Starting, ChildStdin, ChildStdout, tempfile::TempDir) {
        let folder = tempfile::tempdir().unwrap();
        let start = Start {
            launch_id: "l1".into(),
            folder: folder.path().to_path_buf(),
            command: Vec::new(),
            resume: None,
            model: None,
            env: Vec::new(),
        };
        let argv = ["/bin/sh", "-c", script].map(String::from);
        let (starting, stdin, stdout) = Starting::spawn("test", &argv, &start).unwrap();
        (starting, stdin, stdout, folder)
    }

    /// Notes each step of the end, in order.
    fn noted(starting: &mut Starting, stdin: ChildStdin) -> Arc<Mutex<Vec<&'static str>>> {
        let steps = Arc::new(Mutex::new(Vec::new()));
        let input = child::writer(stdin);
        let closed = steps.clone();
        starting.on_close(move || {
            closed.lock().unwrap().push("input closed");
            input.close();
        });
        let after = steps.clone();
        starting.after(async move { after.lock().unwrap().push("after") });
        steps
    }

    struct Fixed;

    impl Driver for Fixed {
        fn models(&mut self, reply: oneshot::Sender<Result<Models, String>>) {
            let _ = reply.send(Ok((Vec::new(), Some("m1".into()))));
        }

        fn set_model(&mut self, model: String, reply: oneshot::Sender<Result<String, String>>) {
            let _ = reply.send(Ok(model));
        }
    }

    #[tokio::test]
    async fn a_failed_start_up_ends_the_process_and_says_why_with_its_stderr() {
        let (mut starting, stdin, _stdout, _folder) = spawned("echo broken >&2; cat");
        let steps = noted(&mut starting, stdin);
        let failed = tokio::time::timeout(Duration::from_secs(20), starting.failed("no answer"))
            .await
            .expect("the process ends once its input closed");
        let EngineError::Startup { engine, message } = failed else {
            panic!("{failed:?}");
        };
        assert_eq!(engine, "test");
        assert_eq!(message, "no answer; its stderr: broken");
        assert_eq!(*steps.lock().unwrap(), ["input closed", "after"]);
    }

    #[tokio::test]
    async fn a_running_agent_answers_its_controls_and_ends_in_one_order() {
        let (mut starting, stdin, _stdout, _folder) = spawned("cat");
        let steps = noted(&mut starting, stdin);
        let started = Started {
            resume_id: Some("r1".into()),
            model: Some("m1".into()),
            activity: watch::channel(Instant::now()).1,
        };
        let mut agent = starting.serve(Fixed, started);
        assert_eq!(agent.resume_id.as_deref(), Some("r1"));
        let (reply, models) = oneshot::channel();
        agent.control.send(Control::Models(reply)).await.unwrap();
        let (_, current) = models.await.unwrap().unwrap();
        assert_eq!(current.as_deref(), Some("m1"));
        let (done, ended) = oneshot::channel();
        agent.control.send(Control::End(done)).await.unwrap();
        let wait = Duration::from_secs(20);
        tokio::time::timeout(wait, ended).await.unwrap().unwrap();
        let exit = tokio::time::timeout(wait, &mut agent.exited)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(exit.code, Some(0), "cat leaves when its input closes");
        assert_eq!(*steps.lock().unwrap(), ["input closed", "after"]);
    }
}
