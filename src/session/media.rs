//! Messages with files (docs/DESIGN.md, *Files*): the parts of an album
//! make one prompt; their files are fetched into the session's inbox
//! through the leader before the prompt goes to the host, so a prompt and
//! its files arrive in the order of the topic; a voice note is transcribed
//! when `transcribe_command` is set; the prompt's text names where each file
//! is saved, and the files also travel typed (`attachments`), for hosts
//! that show pictures to their model.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Session;
use super::outbound::ToTopic;
use super::transcribe::transcribe;
use crate::backoff::Backoff;
use crate::files::{describe_duration, describe_size};
use crate::member::{Member, MemberError};
use crate::protocol::bus::{BusErrorCode, Deliver, Fetched, FetchedFile};
use crate::protocol::host::{Attachment, AttachmentKind};

/// How long an album waits for its next part. Telegram sends the parts as
/// separate updates moments apart; a backlog delivers them back to back.
pub(super) const ALBUM_WAIT: Duration = Duration::from_secs(1);

/// How often a fetch is tried again after the connection to the leader
/// broke under it (a failover), and how long each wait for a new one lasts.
const FETCH_TRIES: u32 = 5;
const RECONNECT_WAIT: Duration = Duration::from_secs(30);

/// What a message with files becomes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Prepared {
    /// The prompt for the host.
    Prompt {
        text: String,
        attachments: Vec<Attachment>,
    },
    /// Nothing is left for the agent, and the topic was told why: the parts
    /// are settled.
    Nothing,
    /// The files cannot be had now; the parts stay in the journal and come
    /// again after the next reconnect.
    Later,
}

/// Fetches the files of `parts` (one message, or an album), transcribes a
/// voice note, and makes the prompt.
pub(super) async fn prepare(session: &Session, member: &Member, parts: &[Deliver]) -> Prepared {
    let mut captions = Vec::new();
    let mut files: Vec<FetchedFile> = Vec::new();
    for part in parts {
        let caption = part.message.text.trim();
        if !caption.is_empty() {
            captions.push(caption.to_string());
        }
        if part.message.attachments.is_empty() {
            continue;
        }
        match fetch(member, part.update_id).await {
            Ok(fetched) => files.extend(fetched.files),
            Err(e) if e.code() == Some(BusErrorCode::FileTooBig) => {
                session.send_out(ToTopic::Plain(format!(
                    "📎 A file of this message was not passed to the agent: {e}."
                )));
            }
            Err(e) if is_passing(&e) => {
                tracing::warn!(
                    update_id = part.update_id,
                    "cannot fetch a message's files: {e}"
                );
                session.send_out(ToTopic::Plain(format!(
                    "⚠️ Could not download a file of this message from Telegram ({e}). The message waits and is tried again when the relay reconnects."
                )));
                return Prepared::Later;
            }
            Err(e) => {
                tracing::warn!(
                    update_id = part.update_id,
                    "cannot fetch a message's files: {e}"
                );
                session.send_out(ToTopic::Plain(format!(
                    "⚠️ Could not download a file of this message from Telegram ({e}); the agent gets the message without it."
                )));
            }
        }
    }
    let attachments: Vec<Attachment> = files.into_iter().map(attachment).collect();
    let transcript = hear(session, &attachments).await;
    let text = prompt_text(&captions, &attachments, transcript.as_deref());
    if text.is_empty() {
        return Prepared::Nothing;
    }
    Prepared::Prompt { text, attachments }
}

/// Failures that may pass: Telegram or the leader unreachable for now.
fn is_passing(e: &MemberError) -> bool {
    match e.code() {
        Some(code) => code == BusErrorCode::Unavailable,
        None => true,
    }
}

/// [`Member::fetch`], tried again when the connection to the leader broke
/// under it: the new leader downloads what the old one did not finish.
async fn fetch(member: &Member, update_id: i64) -> Result<Fetched, MemberError> {
    let mut tries = 1;
    let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(2));
    loop {
        match member.fetch(update_id).await {
            Err(MemberError::NotConnected) if tries < FETCH_TRIES => {
                tries += 1;
                // The member notices the loss a moment after the call did.
                tokio::time::sleep(backoff.step()).await;
                let mut states = member.watch();
                let back = states.wait_for(|s| s.role.is_connected() && s.synced);
                let _ = tokio::time::timeout(RECONNECT_WAIT, back).await;
            }
            other => return other,
        }
    }
}

fn attachment(file: FetchedFile) -> Attachment {
    Attachment {
        kind: file.kind,
        path: file.path,
        mime_type: file.mime_type,
        size: file.size,
        name: file.name,
        duration_s: file.duration_s,
    }
}

/// The transcript of the voice notes among `attachments`, echoed into the
/// topic so the person sees what was heard; without `transcribe_command`,
/// the topic is told once how to get one.
async fn hear(session: &Session, attachments: &[Attachment]) -> Option<String> {
    let voices: Vec<&Attachment> = attachments
        .iter()
        .filter(|a| a.kind == AttachmentKind::Voice)
        .collect();
    if voices.is_empty() {
        return None;
    }
    let config = session.config.as_ref().ok();
    let Some(transcriber) = config.and_then(|c| c.files.transcriber.clone()) else {
        if !session.told_about_voice.swap(true, Ordering::Relaxed) {
            let file =
                config.map_or_else(|| "config.toml".into(), |c| c.file.display().to_string());
            session.send_out(ToTopic::Plain(format!(
                "🎙 The agent gets voice notes as audio files. To have them transcribed, set transcribe_command in {file}, e.g. for whisper.cpp:\ntranscribe_command = [\"whisper-cli\", \"-m\", \"/path/to/ggml-base.bin\", \"-nt\", \"-f\", \"{{file}}\"]"
            )));
        }
        return None;
    };
    let mut heard = Vec::new();
    for voice in voices {
        match transcribe(&transcriber, std::path::Path::new(&voice.path)).await {
            Ok(text) if !text.is_empty() => heard.push(text),
            Ok(_) => session.send_out(ToTopic::Plain(
                "🎙 Nothing was heard in the voice note; the agent got the audio file.".into(),
            )),
            Err(e) => {
                tracing::warn!("cannot transcribe a voice note: {e}");
                session.send_out(ToTopic::Plain(format!(
                    "⚠️ {e}. The agent got the voice note as an audio file."
                )));
            }
        }
    }
    if heard.is_empty() {
        return None;
    }
    let transcript = heard.join("\n\n");
    session.send_out(ToTopic::Plain(format!(
        "🎙 “{}”",
        crate::policy::clip(&transcript, 3500)
    )));
    Some(transcript)
}

/// The prompt: the transcript, the captions, then one line per file naming
/// where it is saved, so any host's agent can open it.
pub(super) fn prompt_text(
    captions: &[String],
    attachments: &[Attachment],
    transcript: Option<&str>,
) -> String {
    let mut paragraphs: Vec<String> = Vec::new();
    paragraphs.extend(transcript.map(str::to_string));
    paragraphs.extend(captions.iter().cloned());
    let lines: Vec<String> = attachments
        .iter()
        .map(|a| describe(a, transcript.is_some()))
        .collect();
    if !lines.is_empty() {
        paragraphs.push(lines.join("\n"));
    }
    paragraphs.join("\n\n")
}

/// `[photo from Telegram: /…/4711-1-photo.jpg (image/jpeg, 182 KB)]`
fn describe(a: &Attachment, transcribed: bool) -> String {
    let duration = a.duration_s.map(describe_duration);
    let what = match (a.kind, &a.name) {
        (AttachmentKind::Photo, _) => "photo".to_string(),
        (AttachmentKind::Voice, _) => {
            let said = if transcribed {
                ", transcribed above"
            } else {
                ""
            };
            match &duration {
                Some(d) => format!("voice note ({d}{said})"),
                None => format!("voice note{said}"),
            }
        }
        (AttachmentKind::VideoNote, _) => "video note".to_string(),
        (AttachmentKind::Document, Some(name)) => format!("file “{name}”"),
        (AttachmentKind::Document, None) => "file".to_string(),
        (AttachmentKind::Audio, name) => named("audio", name),
        (AttachmentKind::Video, name) => named("video", name),
        (AttachmentKind::Animation, name) => named("animation", name),
    };
    let mut details: Vec<String> = Vec::new();
    details.extend(a.mime_type.clone());
    details.push(describe_size(a.size));
    if !matches!(a.kind, AttachmentKind::Voice) {
        details.extend(duration);
    }
    format!(
        "[{what} from Telegram: {} ({})]",
        a.path,
        details.join(", ")
    )
}

fn named(kind: &str, name: &Option<String>) -> String {
    match name {
        Some(name) => format!("{kind} “{name}”"),
        None => kind.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(kind: AttachmentKind, path: &str, name: Option<&str>) -> Attachment {
        Attachment {
            kind,
            path: path.into(),
            mime_type: Some("image/jpeg".into()),
            size: 182 * 1024,
            name: name.map(String::from),
            duration_s: None,
        }
    }

    #[test]
    fn the_prompt_is_the_caption_then_where_each_file_is() {
        let photos = [
            file(AttachmentKind::Photo, "/in/7-1-photo.jpg", None),
            file(AttachmentKind::Photo, "/in/8-1-photo.jpg", None),
        ];
        assert_eq!(
            prompt_text(&["what is wrong here?".into()], &photos, None),
            "what is wrong here?\n\n\
             [photo from Telegram: /in/7-1-photo.jpg (image/jpeg, 182 KB)]\n\
             [photo from Telegram: /in/8-1-photo.jpg (image/jpeg, 182 KB)]"
        );
        let mut log = file(
            AttachmentKind::Document,
            "/in/9-1-build.log",
            Some("build.log"),
        );
        log.mime_type = Some("text/plain".into());
        assert_eq!(
            prompt_text(&[], &[log], None),
            "[file “build.log” from Telegram: /in/9-1-build.log (text/plain, 182 KB)]"
        );
    }

    #[test]
    fn a_transcript_comes_first_and_the_voice_note_says_so() {
        let mut voice = file(AttachmentKind::Voice, "/in/5-1-voice.oga", None);
        voice.mime_type = Some("audio/ogg".into());
        voice.size = 23 * 1024;
        voice.duration_s = Some(7);
        assert_eq!(
            prompt_text(&[], std::slice::from_ref(&voice), Some("run the tests")),
            "run the tests\n\n[voice note (0:07, transcribed above) from Telegram: /in/5-1-voice.oga (audio/ogg, 23 KB)]"
        );
        assert_eq!(
            prompt_text(&[], &[voice], None),
            "[voice note (0:07) from Telegram: /in/5-1-voice.oga (audio/ogg, 23 KB)]"
        );
        assert_eq!(prompt_text(&[], &[], None), "");
    }
}
