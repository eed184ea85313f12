//! Logging: `tracing` to a daily file under the log directory, and to stderr
//! on request, never to stdout (stdout carries only the host protocol).
//!
//! Every formatted line passes through [`crate::redact::redact`] on its way to
//! any sink, so a bot token in a message or in any field never reaches a file
//! or a terminal, whichever code logged it.

use std::io::{self, Write};
use std::path::Path;

use tracing::Subscriber;
use tracing_appender::non_blocking::WorkerGuard;

/// Log lines that may wait for the writer thread.
const LOG_QUEUE_LINES: usize = 4096;
use tracing_appender::rolling::{InitError, RollingFileAppender, Rotation};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::{self, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::{SubscriberInitExt, TryInitError};

use crate::paths::{UntrustedPath, ensure_private_dir};
use crate::redact::redact;

/// The environment variable holding the filter, e.g. `debug` or
/// `agent_relay::bus=trace,info`.
pub const FILTER_ENV: &str = "AGENT_RELAY_LOG";

/// Log files are named `agent-relay.<date>.log`.
const FILE_PREFIX: &str = "agent-relay";
const FILE_SUFFIX: &str = "log";

/// A week of daily files; older ones are deleted as new days begin.
const KEPT_FILES: usize = 7;

#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("the log directory cannot be used: {0}")]
    Dir(#[from] UntrustedPath),
    #[error("cannot open the log file: {0}")]
    OpenFile(#[from] InitError),
    #[error("logging is already initialised: {0}")]
    AlreadyInitialised(#[from] TryInitError),
}

/// Whether [`milestone`]s are logged: `AGENT_RELAY_LOG` names
/// `agent_relay::milestone=debug` (as `scripts/bench` does for its
/// breakdowns). Guards work done only for them.
pub fn milestones_on() -> bool {
    tracing::enabled!(target: "agent_relay::milestone", tracing::Level::DEBUG)
}

/// A step of a failover, of an update's way to its host, of a file's way
/// out or of a launch, with the wall clock in microseconds, for
/// `scripts/bench`'s breakdowns: `id` is the update id, or a launched
/// agent's pid (0 where there is none). A debug event nobody sees unless
/// asked for; the clock is read only then.
pub fn milestone(step: &'static str, id: i64) {
    tracing::debug!(target: "agent_relay::milestone", step, id, at_us = wall_micros());
}

fn wall_micros() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// Keeps the background file writer alive; dropping it flushes what is
/// queued. Hold it until the process ends.
#[must_use = "dropping the guard stops file logging"]
pub struct LogGuard {
    _file: WorkerGuard,
}

/// Installs the global subscriber: the filter from [`FILTER_ENV`] (default
/// `info`; invalid directives are skipped), a daily-rotating file under
/// `log_dir`, and stderr when `to_stderr`.
pub fn init(log_dir: &Path, to_stderr: bool) -> Result<LogGuard, LoggingError> {
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::INFO.into())
        .with_env_var(FILTER_ENV)
        .from_env_lossy();
    let (subscriber, guard) = subscriber(log_dir, to_stderr, filter)?;
    subscriber.try_init()?;
    log_panics();
    Ok(guard)
}

/// Every panic goes to the log too: the default hook prints it on stderr
/// only, which a host may swallow, and whoever looks at why a relay
/// stepped down reads the log.
fn log_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        tracing::error!("panic: {info}");
        previous(info);
    }));
}

fn subscriber(
    log_dir: &Path,
    to_stderr: bool,
    filter: EnvFilter,
) -> Result<(impl Subscriber + Send + Sync + 'static, LogGuard), LoggingError> {
    // The log holds prompts and replies: only the user may read it, and
    // nobody else may plant a link where a log file will be opened. The files
    // themselves follow the umask (the appender takes no mode); the binary
    // sets it to 077 before anything else.
    let log_dir = ensure_private_dir(log_dir)?;
    let file = RollingFileAppender::builder()
        .rotation(Rotation::DAILY)
        .filename_prefix(FILE_PREFIX)
        .filename_suffix(FILE_SUFFIX)
        .max_log_files(KEPT_FILES)
        .build(&log_dir)?;
    // The default queue is 128k lines, allocated up front (megabytes of a
    // sidecar that idles at a few). A sidecar logs little; when the queue is
    // full, lines are dropped rather than blocking the relay.
    let (file, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .lossy(true)
        .finish(file);
    // No colours: escape codes in files are noise, and on stderr the host
    // usually captures rather than shows them.
    let file_layer = fmt::layer().with_ansi(false).with_writer(Redacting(file));
    let stderr_layer = to_stderr.then(|| {
        fmt::layer()
            .with_ansi(false)
            .with_writer(Redacting(io::stderr))
    });
    let subscriber = tracing_subscriber::registry()
        .with(filter)
        .with(file_layer)
        .with(stderr_layer);
    Ok((subscriber, LogGuard { _file: guard }))
}

/// A [`MakeWriter`] whose writers redact every line before passing it on.
#[derive(Debug, Clone)]
struct Redacting<M>(M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Redacting<M> {
    type Writer = RedactingWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        RedactingWriter::new(self.0.make_writer())
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        RedactingWriter::new(self.0.make_writer_for(meta))
    }
}

/// Holds bytes until a line is complete, so a token split across two
/// `write` calls is still seen whole by the redaction.
struct RedactingWriter<W: Write> {
    inner: W,
    partial: Vec<u8>,
}

impl<W: Write> RedactingWriter<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            partial: Vec::new(),
        }
    }

    fn emit(&mut self, end: usize) -> io::Result<()> {
        let text = String::from_utf8_lossy(&self.partial[..end]);
        let redacted = redact(&text);
        let written = self.inner.write_all(redacted.as_bytes());
        self.partial.drain(..end);
        written
    }
}

impl<W: Write> Write for RedactingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.partial.extend_from_slice(buf);
        if let Some(last) = self.partial.iter().rposition(|b| *b == b'\n') {
            self.emit(last + 1)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.partial.is_empty() {
            self.emit(self.partial.len())?;
        }
        self.inner.flush()
    }
}

impl<W: Write> Drop for RedactingWriter<W> {
    fn drop(&mut self) {
        // An event always ends with a newline, so this only catches a writer
        // used by hand; a log line that cannot be written has nowhere to go.
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_";
    const SECRET: &str = "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_";

    #[test]
    fn tokens_never_reach_the_log_file() {
        let dir = tempfile::tempdir().unwrap();
        let log_dir = dir.path().join("logs");
        let (subscriber, guard) = subscriber(&log_dir, false, EnvFilter::new("info")).unwrap();
        tracing::subscriber::with_default(subscriber, || {
            let url = format!("https://api.telegram.org/bot{TOKEN}/getUpdates");
            tracing::warn!(%url, token = ?TOKEN, "request to {url} failed");
            tracing::info!("plain line");
            tracing::debug!("filtered out");
        });
        drop(guard);

        let mut text = String::new();
        for entry in std::fs::read_dir(&log_dir).unwrap() {
            text.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
        }
        assert!(!text.contains(SECRET), "{text}");
        assert_eq!(text.matches("123456789:<redacted>").count(), 3, "{text}");
        assert!(text.contains("plain line"), "{text}");
        assert!(!text.contains("filtered out"), "{text}");
    }

    #[cfg(unix)]
    #[test]
    fn the_log_directory_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let log_dir = dir.path().join("a/logs");
        let (_subscriber, _guard) = subscriber(&log_dir, false, EnvFilter::new("info")).unwrap();
        let mode = std::fs::metadata(&log_dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn a_token_split_across_writes_is_still_redacted() {
        let mut out = Vec::new();
        {
            let mut writer = RedactingWriter::new(&mut out);
            let line = format!("first line\nsee {TOKEN} here\n");
            let (a, b) = line.split_at(line.find(':').unwrap() + 5);
            writer.write_all(a.as_bytes()).unwrap();
            writer.write_all(b.as_bytes()).unwrap();
            writer.write_all(b"tail without newline").unwrap();
        }
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "first line\nsee 123456789:<redacted> here\ntail without newline"
        );
    }
}
