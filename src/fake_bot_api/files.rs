//! Files: what users send (injected with their bytes), what the bot uploads, how
//! both appear in message objects, and the limits Telegram puts on them.
//!
//! The fake never transcodes. Telegram recompresses photos and makes real
//! thumbnails; here the largest photo size is the uploaded bytes and the smaller
//! sizes are prefixes of them (stand-ins with plausible sizes), and dimensions are
//! nominal unless the injector gives them.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::state::{Inner, Media};
use super::{FileRecord, MediaInject, MediaKind};

/// `getFile` refuses bigger files (the public Bot API's download limit).
pub(super) const DOWNLOAD_MAX: u64 = 20 * 1024 * 1024;
/// Uploads: photos up to 10 MB, every other kind up to 50 MB.
pub(super) const PHOTO_UPLOAD_MAX: u64 = 10 * 1024 * 1024;
pub(super) const UPLOAD_MAX: u64 = 50 * 1024 * 1024;

/// Longest side of the smaller photo sizes Telegram generates.
const PHOTO_SIDES: [u32; 3] = [90, 320, 800];

/// A file part of a multipart request.
#[derive(Debug, Clone)]
pub(super) struct Upload {
    pub file_name: Option<String>,
    pub content_type: Option<String>,
    pub bytes: Bytes,
}

/// A file about to exist, from an upload or an injection.
#[derive(Debug, Clone, Default)]
pub(super) struct NewFile {
    pub kind: MediaKind,
    pub bytes: Bytes,
    /// What Telegram reports; `bytes.len()` unless declared otherwise.
    pub size: u64,
    pub file_name: Option<String>,
    pub mime_type: Option<String>,
    pub duration: Option<u32>,
    pub width: Option<u32>,
    pub height: Option<u32>,
}

impl NewFile {
    pub fn injected(inject: &MediaInject) -> Self {
        let size = inject.declared_size.unwrap_or(inject.bytes.len() as u64);
        Self {
            kind: inject.kind,
            bytes: inject.bytes.clone(),
            size,
            file_name: inject.file_name.clone(),
            mime_type: inject.mime_type.clone(),
            duration: inject.duration,
            width: inject.width,
            height: inject.height,
        }
    }

    pub fn uploaded(kind: MediaKind, upload: Upload, duration: Option<u32>) -> Self {
        // Telegram names the type after the file name; the client's header is a
        // fallback.
        let mime_type = upload
            .file_name
            .as_deref()
            .and_then(mime_from_name)
            .map(str::to_owned)
            .or(upload.content_type);
        Self {
            kind,
            size: upload.bytes.len() as u64,
            bytes: upload.bytes,
            file_name: upload.file_name,
            mime_type,
            duration,
            width: None,
            height: None,
        }
    }
}

impl MediaKind {
    /// The message field (and the `send…` parameter) that carries this kind.
    pub(super) fn field(self) -> &'static str {
        match self {
            Self::Photo => "photo",
            Self::Document => "document",
            Self::Voice => "voice",
            Self::Audio => "audio",
            Self::Video => "video",
            Self::VideoNote => "video_note",
            Self::Animation => "animation",
            Self::Sticker => "sticker",
        }
    }

    /// The folder of `file_path`, as Telegram names them.
    fn folder(self) -> &'static str {
        match self {
            Self::Photo => "photos",
            Self::Document => "documents",
            Self::Voice => "voice",
            Self::Audio => "music",
            Self::Video => "videos",
            Self::VideoNote => "video_notes",
            Self::Animation => "animations",
            Self::Sticker => "stickers",
        }
    }

    fn default_extension(self) -> &'static str {
        match self {
            Self::Photo => "jpg",
            Self::Document => "bin",
            Self::Voice => "oga",
            Self::Audio => "mp3",
            Self::Video | Self::VideoNote | Self::Animation => "mp4",
            Self::Sticker => "webp",
        }
    }

    fn default_mime(self) -> Option<&'static str> {
        match self {
            Self::Voice => Some("audio/ogg"),
            Self::Audio => Some("audio/mpeg"),
            Self::Video | Self::Animation => Some("video/mp4"),
            Self::Photo | Self::Document | Self::VideoNote | Self::Sticker => None,
        }
    }

    fn nominal_size(self) -> (u32, u32) {
        match self {
            Self::Photo => (1280, 960),
            Self::Video | Self::Animation => (640, 360),
            Self::VideoNote => (240, 240),
            Self::Sticker => (512, 512),
            Self::Document | Self::Voice | Self::Audio => (0, 0),
        }
    }

    pub(super) fn upload_limit(self) -> u64 {
        if self == Self::Photo {
            PHOTO_UPLOAD_MAX
        } else {
            UPLOAD_MAX
        }
    }
}

impl Inner {
    /// Registers `file` (a photo: with its smaller sizes) as carried by message
    /// `message_id` of `chat_id`, and returns the message's media fields.
    pub fn add_media(
        &mut self,
        file: NewFile,
        from_bot: bool,
        chat_id: i64,
        message_id: i64,
    ) -> Media {
        let kind = file.kind;
        let (width, height) = match (file.width, file.height) {
            (Some(w), Some(h)) => (w, h),
            _ => kind.nominal_size(),
        };
        // (bytes, reported size, width, height), smallest first.
        let mut versions = Vec::new();
        if kind == MediaKind::Photo {
            let longest = width.max(height).max(1);
            for side in PHOTO_SIDES.into_iter().filter(|side| *side < longest) {
                let scale = |n: u64| (n * u64::from(side) / u64::from(longest)).max(1);
                let prefix = usize::try_from(scale(file.bytes.len() as u64))
                    .unwrap_or(usize::MAX)
                    .min(file.bytes.len());
                versions.push((
                    file.bytes.slice(..prefix),
                    scale(file.size),
                    scale(u64::from(width)),
                    scale(u64::from(height)),
                ));
            }
        }
        versions.push((
            file.bytes.clone(),
            file.size,
            u64::from(width),
            u64::from(height),
        ));
        let mime_type = file
            .mime_type
            .clone()
            .or_else(|| {
                file.file_name
                    .as_deref()
                    .and_then(mime_from_name)
                    .map(str::to_owned)
            })
            .or_else(|| kind.default_mime().map(str::to_owned));
        let mut objects = Vec::new();
        let mut file_ids = Vec::new();
        for (bytes, size, w, h) in versions {
            let (file_id, file_unique_id) = self.new_file_ids(kind);
            let mut object = json!({
                "file_id": file_id,
                "file_unique_id": file_unique_id,
                "file_size": size,
            });
            describe(&mut object, &file, mime_type.as_deref(), w, h);
            objects.push(object);
            file_ids.push(file_id.clone());
            self.files.push(FileRecord {
                file_id,
                file_unique_id,
                kind,
                file_size: size,
                file_name: file.file_name.clone(),
                mime_type: mime_type.clone(),
                file_path: None,
                from_bot,
                chat_id,
                message_id,
                bytes,
            });
        }
        Media {
            kind,
            file_ids,
            fields: media_fields(kind, objects),
        }
    }

    /// The file `getFile` describes, given a download path the first time.
    pub fn file_with_path(&mut self, file_id: &str) -> Option<&FileRecord> {
        let number = self.next_file_number;
        let file = self.files.iter_mut().find(|f| f.file_id == file_id)?;
        if file.file_path.is_none() {
            let extension = file
                .file_name
                .as_deref()
                .and_then(|name| name.rsplit_once('.'))
                .map_or(file.kind.default_extension(), |(_, ext)| ext);
            file.file_path = Some(format!("{}/file_{number}.{extension}", file.kind.folder()));
            self.next_file_number += 1;
        }
        Some(file)
    }
}

/// The kind-specific fields of one file object.
fn describe(object: &mut Value, file: &NewFile, mime_type: Option<&str>, width: u64, height: u64) {
    let kind = file.kind;
    let duration = file.duration.unwrap_or(0);
    match kind {
        MediaKind::Photo | MediaKind::Sticker => {
            object["width"] = json!(width);
            object["height"] = json!(height);
        }
        MediaKind::Video | MediaKind::Animation => {
            object["width"] = json!(width);
            object["height"] = json!(height);
            object["duration"] = json!(duration);
        }
        MediaKind::VideoNote => {
            object["length"] = json!(width);
            object["duration"] = json!(duration);
        }
        MediaKind::Voice | MediaKind::Audio => object["duration"] = json!(duration),
        MediaKind::Document => {}
    }
    if kind == MediaKind::Sticker {
        object["type"] = json!("regular");
        object["is_animated"] = json!(false);
        object["is_video"] = json!(false);
    }
    let named = matches!(
        kind,
        MediaKind::Document | MediaKind::Audio | MediaKind::Video | MediaKind::Animation
    );
    if named && let Some(name) = &file.file_name {
        object["file_name"] = json!(name);
    }
    if kind != MediaKind::Photo
        && kind != MediaKind::Sticker
        && let Some(mime) = mime_type
    {
        object["mime_type"] = json!(mime);
    }
}

/// The message fields for a kind: a photo is the array of its sizes; an
/// animation also appears as a `document`, as Telegram sends it for old clients.
fn media_fields(kind: MediaKind, mut objects: Vec<Value>) -> Map<String, Value> {
    let mut fields = Map::new();
    if kind == MediaKind::Photo {
        fields.insert("photo".to_owned(), Value::Array(objects));
        return fields;
    }
    let object = objects.pop().unwrap_or(Value::Null);
    if kind == MediaKind::Animation {
        let mut document = json!({
            "file_id": object["file_id"],
            "file_unique_id": object["file_unique_id"],
            "file_size": object["file_size"],
        });
        for key in ["file_name", "mime_type"] {
            if let Some(value) = object.get(key) {
                document[key] = value.clone();
            }
        }
        fields.insert("document".to_owned(), document);
    }
    fields.insert(kind.field().to_owned(), object);
    fields
}

fn mime_from_name(name: &str) -> Option<&'static str> {
    let (_, extension) = name.rsplit_once('.')?;
    Some(match extension.to_ascii_lowercase().as_str() {
        "pdf" => "application/pdf",
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "json" => "application/json",
        "csv" => "text/csv",
        "html" | "htm" => "text/html",
        "zip" => "application/zip",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "ogg" | "oga" | "opus" => "audio/ogg",
        "mp3" => "audio/mpeg",
        "m4a" => "audio/mp4",
        "mp4" => "video/mp4",
        _ => return None,
    })
}

/// Whether Telegram could decode `bytes` as a picture (it refuses a photo it
/// cannot with `IMAGE_PROCESS_FAILED`; send such files as documents).
pub(super) fn looks_like_image(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0xFF, 0xD8, 0xFF])
        || bytes.starts_with(b"\x89PNG\r\n\x1a\n")
        || bytes.starts_with(b"GIF8")
        || bytes.starts_with(b"BM")
        || (bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP")
}
