//! Voice notes to text with the user's own speech-to-text program
//! (`transcribe_command`, e.g. whisper.cpp's `whisper-cli`).
//!
//! The program runs without a shell: its arguments are the configured list,
//! with the audio file's path in place of `{file}` (or added at the end), so
//! nothing in a path or a transcript is ever interpreted. It runs in a
//! process group of its own with stdin closed; past the timeout the whole
//! group is killed. What it prints on stdout, trimmed, is the transcript;
//! at most [`MAX_OUTPUT`] bytes of it are read.
//!
//! Its environment is the relay's without the relay's own variables
//! (`TELEGRAM_BOT_TOKEN`, `AGENT_RELAY_*`, which may hold the bot token and
//! a NATS password): the program is the user's, and may need their `PATH`,
//! `HOME`, a GPU's settings or an API key of its own, but none of the
//! relay's secrets.

use std::path::Path;
use std::process::Stdio;

use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::process::Command;

use crate::config::Transcriber;

/// The most of stdout read as the transcript (and of stderr for the error).
const MAX_OUTPUT: u64 = 64 * 1024;

/// Why there is no transcript. The message is for the person on the phone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranscribeError {
    #[error("transcribe_command could not be started ({program}: {message})")]
    Start { program: String, message: String },
    #[error("transcribe_command failed ({status}{detail})")]
    Failed { status: String, detail: String },
    #[error("transcribe_command took longer than {0} s and was stopped")]
    TimedOut(u64),
}

/// The transcript of the audio file at `audio`; empty when nothing was
/// heard.
pub async fn transcribe(
    transcriber: &Transcriber,
    audio: &Path,
) -> Result<String, TranscribeError> {
    let file = audio.to_string_lossy();
    let mut argv: Vec<String> = transcriber
        .argv
        .iter()
        .map(|arg| arg.replace("{file}", &file))
        .collect();
    if !transcriber.argv.iter().any(|arg| arg.contains("{file}")) {
        argv.push(file.into_owned());
    }
    let program = argv[0].clone();
    let mut command = Command::new(&program);
    command
        .env_clear()
        .envs(crate::config::child_env(std::env::vars_os()))
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|e| TranscribeError::Start {
        program: program.clone(),
        message: e.to_string(),
    })?;
    let pid = child.id();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let run = async {
        let (out, err, status) =
            tokio::join!(read_bounded(stdout), read_bounded(stderr), child.wait());
        (out, err, status)
    };
    let (out, err, status) = match tokio::time::timeout(transcriber.timeout, run).await {
        Ok(done) => done,
        Err(_) => {
            if let Some(pid) = pid {
                crate::sys::signal_group(pid, crate::sys::SIGKILL);
            }
            // Reaped when dropped (`kill_on_drop`).
            return Err(TranscribeError::TimedOut(transcriber.timeout.as_secs()));
        }
    };
    let status = status.map_err(|e| TranscribeError::Failed {
        status: "no exit status".into(),
        detail: format!(": {e}"),
    })?;
    if !status.success() {
        let last = String::from_utf8_lossy(&err)
            .lines()
            .rev()
            .find(|line| !line.trim().is_empty())
            .map(|line| format!(": {}", crate::policy::clip(line.trim(), 200)))
            .unwrap_or_default();
        let status = match status.code() {
            Some(code) => format!("exit {code}"),
            None => "killed by a signal".into(),
        };
        return Err(TranscribeError::Failed {
            status,
            detail: last,
        });
    }
    Ok(String::from_utf8_lossy(&out).trim().to_string())
}

async fn read_bounded(stream: Option<impl AsyncRead + Unpin>) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(stream) = stream {
        let mut limited = stream.take(MAX_OUTPUT);
        let _ = limited.read_to_end(&mut out).await;
        // Whatever is left is drained so the program never blocks on a full pipe.
        let mut rest = limited.into_inner();
        let _ = tokio::io::copy(&mut rest, &mut tokio::io::sink()).await;
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn shell(script: &str, timeout: Duration) -> Transcriber {
        Transcriber {
            argv: vec!["sh".into(), "-c".into(), script.into(), "sh".into()],
            timeout,
        }
    }

    #[tokio::test]
    async fn the_path_is_one_argument_and_stdout_is_the_transcript() {
        let dir = tempfile::tempdir().unwrap();
        // A path a shell would split and expand.
        let audio = dir.path().join("a b; $(touch pwned) 'q'.oga");
        std::fs::write(&audio, b"ogg").unwrap();
        let t = shell("printf '  heard: %s  \\n' \"$1\"", Duration::from_secs(10));
        let text = transcribe(&t, &audio).await.unwrap();
        assert_eq!(text, format!("heard: {}", audio.display()));
        assert!(!dir.path().join("pwned").exists());

        let placed = Transcriber {
            argv: vec!["echo".into(), "--in={file}".into(), "-x".into()],
            timeout: Duration::from_secs(10),
        };
        let text = transcribe(&placed, &audio).await.unwrap();
        assert_eq!(text, format!("--in={} -x", audio.display()));
    }

    #[tokio::test]
    async fn failures_say_why() {
        let audio = Path::new("/nonexistent.oga");
        let failed = transcribe(
            &shell(
                "echo partial; echo 'model not found' >&2; exit 3",
                Duration::from_secs(10),
            ),
            audio,
        )
        .await
        .unwrap_err();
        assert_eq!(
            failed.to_string(),
            "transcribe_command failed (exit 3: model not found)"
        );
        let missing = Transcriber {
            argv: vec!["/nonexistent/whisper-cli".into()],
            timeout: Duration::from_secs(10),
        };
        let error = transcribe(&missing, audio).await.unwrap_err();
        assert!(matches!(error, TranscribeError::Start { .. }), "{error:?}");
    }

    #[tokio::test]
    async fn a_slow_command_and_its_children_are_killed_at_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("child.pid");
        // The child of the program outlives it unless the group is killed.
        let script = format!("sleep 30 & echo $! > '{}'; wait", pidfile.display());
        let error = transcribe(&shell(&script, Duration::from_millis(300)), Path::new("/x"))
            .await
            .unwrap_err();
        assert_eq!(error, TranscribeError::TimedOut(0));
        let pid = std::fs::read_to_string(&pidfile).unwrap();
        let stat = format!("/proc/{}/stat", pid.trim());
        // Gone, or a zombie nobody reaped yet: either way it no longer runs.
        let running = || {
            std::fs::read_to_string(&stat).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
            })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while running() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!running(), "a child of the command survived the timeout");
    }
}
