//! Files both ways, as flows of the leader (docs/DESIGN.md, *Files*):
//!
//! * **fetch** — a session took a delivery that carries files and asks for
//!   them: the leader checks the journal entry is the session's own,
//!   downloads each file into the session's inbox (or finds it there from
//!   an earlier attempt) and answers with the paths. The entry stays
//!   pending until the session's host took the prompt.
//! * **send** — a session asks to post a file. The bytes never cross the
//!   bus: the session names a path, and the leader (the one place that
//!   decides) resolves it, checks it lies in the session's registered
//!   working directory or a configured folder, opens it without following
//!   links, checks the open file is a regular file of the user's, and
//!   streams it to Telegram. Short texts the session made itself (a long
//!   answer as a file) travel inline, bounded well inside a frame.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::context::Context;
use super::failure::store_error;
use super::inbox::FileInbox;
use super::outbox::Upload;
use super::registry::ConnId;
use super::triage::Entry;
use crate::config::FilesPolicy;
use crate::files::{PHOTO_UPLOAD_MAX, UPLOAD_MAX, describe_against, is_picture, safe_name};
use crate::paths::open_sendable;
use crate::protocol::bus::*;
use crate::telegram::UploadSource;

/// Files both ways (see the module docs).
pub(super) struct Files {
    cx: Arc<Context>,
    /// Where the files users send are saved, one folder per session.
    pub inbox: FileInbox,
    /// `[files]`: the folders files may be sent from besides a session's own.
    policy: FilesPolicy,
}

impl Files {
    pub fn new(cx: Arc<Context>, inbox: FileInbox, policy: FilesPolicy) -> Self {
        Self { cx, inbox, policy }
    }

    /// Downloads the files of one of the session's own journal entries into
    /// its inbox; answers with where they are.
    pub async fn fetch(&self, conn: ConnId, req: &Fetch) -> Result<Fetched, BusError> {
        let session = self.cx.registry.session(conn, req.generation)?;
        let profile = session.route.profile_key;
        let entry = self
            .cx
            .store()
            .journal_entry(req.update_id)
            .map_err(store_error)?
            .filter(|e| e.update.owner.as_deref() == Some(profile.as_str()))
            .ok_or_else(|| {
                BusError::new(
                    BusErrorCode::Forbidden,
                    format!(
                        "update {} is not a message of this session's",
                        req.update_id
                    ),
                )
            })?;
        let detail = Entry::stored(entry.update).detail;
        if detail.files.is_empty() {
            return Ok(Fetched::default());
        }
        let dir = self.inbox.folder(&profile).await?;
        let names: Vec<String> = detail
            .files
            .iter()
            .enumerate()
            .map(|(index, file)| FileInbox::file_name(req.update_id, index, file))
            .collect();
        let keep: Vec<PathBuf> = names.iter().map(|name| dir.join(name)).collect();
        let mut files = Vec::with_capacity(names.len());
        for ((file, name), path) in detail.files.iter().zip(&names).zip(&keep) {
            let size = match FileInbox::saved(path, file.size) {
                Some(size) => size,
                None => {
                    self.inbox
                        .make_room(dir.clone(), file.size.unwrap_or(0), keep.clone())
                        .await;
                    self.cx.outbox.download(&file.file_id, &dir, name).await?
                }
            };
            files.push(FetchedFile {
                kind: file.kind,
                path: path.display().to_string(),
                mime_type: file.mime_type.clone(),
                size,
                name: file.name.clone(),
                duration_s: file.duration_s,
            });
        }
        tracing::info!(
            update_id = req.update_id,
            files = files.len(),
            "fetched a message's files into the inbox"
        );
        Ok(Fetched { files })
    }

    /// Posts a file into the session's topic.
    pub async fn send_file(
        &self,
        profile: &str,
        cwd: &str,
        target: Target,
        send: &SendFile,
    ) -> Result<TopicDone, BusError> {
        crate::logging::milestone("file-leader", 0);
        let upload = match &send.source {
            FileSource::Path(path) => self.open_upload(Path::new(path), cwd, send).await?,
            FileSource::Text { name, text } => {
                if text.len() > MAX_INLINE_FILE {
                    let (size, limit) = describe_against(text.len() as u64, MAX_INLINE_FILE as u64);
                    return Err(BusError::new(
                        BusErrorCode::FileTooBig,
                        format!("an inline file is at most {limit}; this one is {size}"),
                    ));
                }
                Upload {
                    source: UploadSource::Bytes(text.clone().into_bytes()),
                    file_name: safe_name(name).unwrap_or_else(|| "answer.txt".into()),
                    caption: send.caption.clone(),
                    send_as: SendAs::Document,
                    chosen: false,
                }
            }
        };
        crate::logging::milestone("file-checked", 0);
        let done = self.cx.outbox.send_file(target, &upload).await;
        self.cx.record(
            profile,
            target,
            done.as_ref().map(|(performed, _)| performed),
        );
        let (performed, sent_as) = done?;
        Ok(TopicDone {
            message_id: performed.reply.message_id(),
            sent_as: Some(sent_as),
            size: Some(upload.source.size()),
            ..TopicDone::default()
        })
    }

    /// Checks and opens a file the session wants to send (see the module
    /// docs), and decides how it goes. Every refusal says which rule the
    /// file broke, one after the other, which is what makes it long.
    async fn open_upload(
        &self,
        path: &Path,
        cwd: &str,
        send: &SendFile,
    ) -> Result<Upload, BusError> {
        let refused = |message: String| BusError::new(BusErrorCode::FileRefused, message);
        if !path.is_absolute() {
            return Err(refused(format!(
                "{} is not an absolute path",
                path.display()
            )));
        }
        let mut roots = vec![PathBuf::from(cwd)];
        roots.extend(self.policy.send_from.iter().cloned());
        let forbidden = self.inbox.relay_files();
        let wanted = path.to_path_buf();
        let opened = tokio::task::spawn_blocking(move || {
            let sendable = open_sendable(&wanted, &roots, &forbidden)?;
            let mut head = [0u8; 16];
            let read =
                std::os::unix::fs::FileExt::read_at(&sendable.file, &mut head, 0).unwrap_or(0);
            Ok::<_, crate::paths::SendRefused>((sendable, head[..read].to_vec()))
        })
        .await
        .map_err(|e| BusError::new(BusErrorCode::Internal, e.to_string()))?;
        let (sendable, head) = opened.map_err(|e| refused(e.to_string()))?;
        let shown = sendable.path.display().to_string();
        if sendable.len == 0 {
            return Err(refused(format!(
                "{shown} is empty; Telegram takes no empty files"
            )));
        }
        if sendable.len > UPLOAD_MAX {
            let (size, limit) = describe_against(sendable.len, UPLOAD_MAX);
            return Err(BusError::new(
                BusErrorCode::FileTooBig,
                format!("{shown} is {size}; bots can send at most {limit} to Telegram"),
            ));
        }
        let (send_as, chosen) = how_to_send(send.send_as, &head, sendable.len, &shown)?;
        let file_name = sendable
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .and_then(|n| safe_name(&n))
            .unwrap_or_else(|| "file".into());
        tracing::info!(path = %shown, size = sendable.len, ?send_as, "sending a file to the topic");
        Ok(Upload {
            source: UploadSource::File {
                len: sendable.len,
                file: sendable.file,
            },
            file_name,
            caption: send.caption.clone(),
            send_as,
            chosen,
        })
    }
}

/// How a file of `len` bytes starting with `head` goes: as asked, or the
/// relay's choice (`true`) — a picture small enough as a photo, the rest
/// as a document.
fn how_to_send(
    asked: Option<SendAs>,
    head: &[u8],
    len: u64,
    shown: &str,
) -> Result<(SendAs, bool), BusError> {
    // A GIF goes as a document: Telegram shows it animated then, while a
    // photo would be its first frame.
    let picture = is_picture(head) && !head.starts_with(b"GIF8");
    match asked {
        Some(SendAs::Photo) if len > PHOTO_UPLOAD_MAX => {
            let (size, limit) = describe_against(len, PHOTO_UPLOAD_MAX);
            Err(BusError::new(
                BusErrorCode::FileTooBig,
                format!("{shown} is {size}; a photo is at most {limit}: send it as a document"),
            ))
        }
        Some(SendAs::Photo) if !is_picture(head) => Err(BusError::new(
            BusErrorCode::FileRefused,
            format!(
                "{shown} is not a picture Telegram shows as a photo (JPEG, PNG, GIF, WebP or BMP): send it as a document"
            ),
        )),
        Some(send_as) => Ok((send_as, false)),
        None if picture && len <= PHOTO_UPLOAD_MAX => Ok((SendAs::Photo, true)),
        None => Ok((SendAs::Document, true)),
    }
}
