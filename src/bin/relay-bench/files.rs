//! Files through the relay, each beside the same transfer the bench makes
//! directly against the fake:
//!
//! * inbound — a photo in a follower's topic until the follower's host reads
//!   the prompt naming the saved file (the leader's poll, the follower's
//!   `fetch`, `getFile`, the download, fsync and rename in the inbox);
//!   reference: the bench's own `getFile` and download of the same file;
//! * outbound — `file/send` at a follower's host until its answer (the
//!   leader checks the path and streams the multipart upload; the fake has
//!   stored the file then); reference: the bench's own multipart
//!   `sendDocument` of the same bytes.

use std::time::{Duration, Instant};

use agent_relay::fake_bot_api::{
    DEFAULT_FORUM_CHAT_ID, DEFAULT_USER_ID, MediaInject, MediaKind, UserMessage,
};
use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use crate::report::Measure;
use crate::world::World;

/// How long one transfer may take before it counts as lost.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(60);

/// `len` bytes that start like a PNG (the fake checks photos on upload).
fn picture(len: usize, seed: u32) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut x = seed | 1;
    while bytes.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

fn post_photo(
    world: &World,
    thread: Option<i64>,
    caption: &str,
    bytes: Vec<u8>,
) -> anyhow::Result<String> {
    let injected = world.api().inject_user_message(UserMessage {
        chat_id: DEFAULT_FORUM_CHAT_ID,
        thread_id: thread,
        user_id: DEFAULT_USER_ID,
        text: caption.into(),
        media: Some(MediaInject {
            kind: MediaKind::Photo,
            bytes: bytes.into(),
            ..MediaInject::default()
        }),
        ..UserMessage::default()
    })?;
    injected
        .file_ids
        .last()
        .cloned()
        .context("the photo has no file id")
}

/// The relay's inbound latency and the direct download, for `trials`
/// photos of `size` bytes.
pub async fn inbound(
    world: &mut World,
    trials: usize,
    size: usize,
) -> anyhow::Result<(Measure, Measure)> {
    let status = world.status().await?;
    let follower = *world
        .follower_indices(&status)
        .first()
        .context("no follower on the bus")?;
    let thread = world.thread_of(&status, follower)?;
    world.hosts[follower].drain_prompts();
    let client = reqwest::Client::new();
    let mut relayed = Vec::with_capacity(trials);
    let mut direct = Vec::with_capacity(trials);
    // One unmeasured round first: connections are set up lazily.
    for i in 0..=trials {
        let marker = format!("bench photo #{i}.");
        let sent = Instant::now();
        post_photo(world, Some(thread), &marker, picture(size, i as u32 + 1))?;
        let prompt = world.hosts[follower]
            .prompt(&marker, TRANSFER_TIMEOUT)
            .await
            .with_context(|| format!("the photo {marker} never reached the host"))?;
        if !prompt.text.contains("[photo from Telegram: ") {
            bail!("the prompt names no saved photo: {}", prompt.text);
        }
        // The same transfer, done by hand: a photo nobody's topic holds.
        let file_id = post_photo(world, None, "", picture(size, i as u32 + 7))?;
        let start = Instant::now();
        let file: Value = client
            .post(format!("{}/getFile", world.fake.bot_url()))
            .json(&json!({"file_id": file_id}))
            .send()
            .await?
            .json()
            .await?;
        let path = file["result"]["file_path"]
            .as_str()
            .context("getFile gave no path")?;
        let url = format!(
            "{}/file/bot{}/{path}",
            world.fake.url(),
            world.api().token()
        );
        let bytes = client.get(url).send().await?.bytes().await?;
        let took = start.elapsed();
        if bytes.len() != size {
            bail!("the direct download got {} of {size} bytes", bytes.len());
        }
        if i > 0 {
            relayed.push(prompt.at.saturating_duration_since(sent));
            direct.push(took);
        }
    }
    Ok((
        Measure::latency(&relayed, "no photo"),
        Measure::latency(&direct, "no download"),
    ))
}

/// The relay's `file/send` and the direct upload, for `trials` documents
/// of `size` bytes.
pub async fn outbound(
    world: &mut World,
    trials: usize,
    size: usize,
) -> anyhow::Result<(Measure, Measure)> {
    let status = world.status().await?;
    let follower = *world
        .follower_indices(&status)
        .first()
        .context("no follower on the bus")?;
    let thread = world.thread_of(&status, follower)?;
    let cwd = std::path::PathBuf::from(&world.hosts[follower].cwd);
    let client = reqwest::Client::new();
    let mut relayed = Vec::with_capacity(trials);
    let mut direct = Vec::with_capacity(trials);
    for i in 0..=trials {
        let name = format!("bench-{i}.bin");
        let bytes = picture(size, i as u32 + 100);
        std::fs::write(cwd.join(&name), &bytes)?;
        let start = Instant::now();
        let sent = tokio::time::timeout(
            TRANSFER_TIMEOUT,
            world.hosts[follower].call("file/send", json!({"path": name, "as": "document"})),
        )
        .await
        .context("file/send timed out")??;
        let took = start.elapsed();
        if sent["size"] != json!(size) {
            bail!("file/send answered {sent}");
        }
        std::fs::remove_file(cwd.join(&name))?;
        let form = reqwest::multipart::Form::new()
            .text("chat_id", DEFAULT_FORUM_CHAT_ID.to_string())
            .text("message_thread_id", thread.to_string())
            .part(
                "document",
                reqwest::multipart::Part::bytes(bytes).file_name(name),
            );
        let start = Instant::now();
        let answer: Value = client
            .post(format!("{}/sendDocument", world.fake.bot_url()))
            .multipart(form)
            .send()
            .await?
            .json()
            .await?;
        let took_direct = start.elapsed();
        if answer["ok"] != json!(true) {
            bail!("the direct sendDocument failed: {answer}");
        }
        if i > 0 {
            relayed.push(took);
            direct.push(took_direct);
        }
    }
    Ok((
        Measure::latency(&relayed, "no upload"),
        Measure::latency(&direct, "no upload"),
    ))
}
