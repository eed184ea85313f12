//! What Claude Code's transcript says of how its last turn ended, for the
//! one case no hook tells in time: a print-mode turn that an API error
//! ended. StopFailure is fire-and-forget (Claude Code waits for no answer)
//! and a print-mode run exits at once after it, stopping the MCP server
//! first; the transcript (`transcript_path` of every hook) holds the error
//! as an assistant entry of its own, `isApiErrorMessage: true`, whose text
//! is Claude Code's line for it (`API Error: 503 overloaded. …`).

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde_json::Value;

/// How much of the transcript's end is read: its last entries, an API
/// error's among them (a long answer before it does not push it out: the
/// error is the last assistant entry).
const TAIL_BYTES: u64 = 256 * 1024;

/// The API error that ended the transcript's last turn, as Claude Code
/// wrote it, or None when that turn ended otherwise (an answer, a tool
/// result still to be answered, a stop) or the file cannot be read.
pub(super) fn api_error(path: &Path) -> Option<String> {
    let mut file = open_transcript(path)?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))
        .ok()?;
    let mut tail = Vec::new();
    file.take(TAIL_BYTES).read_to_end(&mut tail).ok()?;
    let tail = String::from_utf8_lossy(&tail);
    // The last user or assistant entry: other kinds (`last-prompt`,
    // `cost-state`, …) come after a turn and say nothing of how it went.
    let last = tail
        .lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|entry| matches!(entry["type"].as_str(), Some("user" | "assistant")))?;
    if last["type"] != "assistant" || last["isApiErrorMessage"] != true {
        return None;
    }
    let said: Vec<&str> = last["message"]["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|block| block["text"].as_str())
        .collect();
    let said = said.join("\n");
    let said = said.trim();
    Some(match said {
        "" => last["error"].as_str().unwrap_or("an API error").to_string(),
        _ => said.to_string(),
    })
}

/// The path is the hook's word: only a regular file of this user's is
/// read, never through a link, and a FIFO put there cannot hang the open.
/// (Its mode is Claude Code's affair: a group-writable transcript, under a
/// umask of 002, is read all the same.)
fn open_transcript(path: &Path) -> Option<std::fs::File> {
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(crate::sys::O_NOFOLLOW | crate::sys::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    (meta.is_file() && meta.uid() == crate::sys::euid()).then_some(file)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use serde_json::json;

    use super::*;

    fn transcript(lines: &[Value]) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        for line in lines {
            writeln!(file, "{line}").unwrap();
        }
        file
    }

    /// An entry as the pinned Claude Code (2.1.332) writes an API error.
    fn api_error_entry(text: &str) -> Value {
        json!({"type": "assistant", "isApiErrorMessage": true, "error": "server_error",
            "apiErrorStatus": 503, "message": {"role": "assistant", "model": "<synthetic>",
            "content": [{"type": "text", "text": text}]}})
    }

    #[test]
    fn a_turn_an_api_error_ended_reads_as_that_error_and_no_other_turn_does() {
        let failed = transcript(&[
            json!({"type": "user", "message": {"role": "user", "content": "hello"}}),
            api_error_entry("API Error: 503 still down."),
            json!({"type": "last-prompt", "lastPrompt": "hello"}),
            json!({"type": "cost-state"}),
        ]);
        assert_eq!(
            api_error(failed.path()).as_deref(),
            Some("API Error: 503 still down.")
        );
        let answered = transcript(&[
            api_error_entry("API Error: 503 still down."),
            json!({"type": "user", "message": {"role": "user", "content": "again"}}),
            json!({"type": "assistant", "message": {"content": [{"type": "text", "text": "fine"}]}}),
        ]);
        assert_eq!(api_error(answered.path()), None, "a later turn answered");
        let waiting = transcript(&[json!({"type": "user", "message": {"content": "hi"}})]);
        assert_eq!(api_error(waiting.path()), None);
        assert_eq!(api_error(Path::new("/nonexistent/transcript.jsonl")), None);
        // Not through a link, whatever it points at.
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("transcript.jsonl");
        std::os::unix::fs::symlink(failed.path(), &link).unwrap();
        assert_eq!(api_error(&link), None, "a link is not read");
        let fifo = dir.path().join("fifo.jsonl");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid, NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        assert_eq!(api_error(&fifo), None, "a FIFO neither hangs nor is read");
    }

    #[test]
    fn only_the_tail_is_read_and_a_line_cut_by_it_is_skipped() {
        let long = "x".repeat(TAIL_BYTES as usize);
        let file = transcript(&[
            json!({"type": "assistant", "message": {"content": [{"type": "text", "text": long}]}}),
            api_error_entry(""),
        ]);
        assert_eq!(api_error(file.path()).as_deref(), Some("server_error"));
    }
}
