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
//!   `sendDocument` of the same bytes; and where the relay's time goes,
//!   step by step ([`OUT_STEPS`]), on a bus whose sidecars log their
//!   milestones.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_relay::fake_bot_api::{
    DEFAULT_FORUM_CHAT_ID, DEFAULT_USER_ID, MediaInject, MediaKind, UserMessage,
};
use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use crate::milestones::{first_after, now_us, span};
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
    let (follower, thread) = sender(world).await?;
    let client = reqwest::Client::new();
    let mut relayed = Vec::with_capacity(trials);
    let mut direct = Vec::with_capacity(trials);
    for i in 0..=trials {
        let name = format!("bench-{i}.bin");
        let bytes = picture(size, i as u32 + 100);
        let sent = send_through_relay(world, follower, &name, &bytes).await?;
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
            relayed.push(sent.took);
            direct.push(took_direct);
        }
    }
    Ok((
        Measure::latency(&relayed, "no upload"),
        Measure::latency(&direct, "no upload"),
    ))
}

/// The steps of a `file/send` (the milestones of the follower's session,
/// the leader and its Telegram client), each from the one before it: (step,
/// from, what the span is). "asked" and "answered" are the bench's own.
pub const OUT_STEPS: [(&str, &str, &str); 7] = [
    (
        "file-asked",
        "asked",
        "host's file/send → the session has it",
    ),
    (
        "file-handed",
        "file-asked",
        "session: registered → handed to its member",
    ),
    (
        "file-leader",
        "file-handed",
        "member → over the bus → the leader has it",
    ),
    (
        "file-checked",
        "file-leader",
        "leader: path rules, open, ownership, size, kind",
    ),
    (
        "upload-start",
        "file-checked",
        "outbox (pacing) → the multipart upload starts",
    ),
    (
        "upload-answered",
        "upload-start",
        "upload: the file streamed → Telegram answered",
    ),
    (
        "answered",
        "upload-answered",
        "leader's answer → over the bus → the host reads it",
    ),
];

/// Where a `file/send`'s time goes, on a bus of two sessions of its own
/// whose sidecars log their milestones (the figure runs without them):
/// one sample per trial of each of [`OUT_STEPS`].
pub async fn outbound_breakdown(
    relay: &Path,
    trials: usize,
    size: usize,
) -> anyhow::Result<Vec<(&'static str, Vec<Duration>)>> {
    let mut world = World::start_traced(relay, 2).await?;
    let (follower, _) = sender(&world).await?;
    let mut sent = Vec::with_capacity(trials);
    for i in 0..=trials {
        let name = format!("bench-traced-{i}.bin");
        let bytes = picture(size, i as u32 + 300);
        let one = send_through_relay(&mut world, follower, &name, &bytes).await?;
        if i > 0 {
            sent.push(one);
        }
    }
    // The last lines are written by each sidecar's logging thread.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let all = world.milestones();
    let mut steps: Vec<(&'static str, Vec<Duration>)> = OUT_STEPS
        .iter()
        .map(|(_, _, what)| (*what, Vec::new()))
        .collect();
    for one in &sent {
        let until = one.asked_us + one.took.as_micros() + 1;
        let at = |step: &str| match step {
            "asked" => Some(one.asked_us),
            "answered" => Some(until - 1),
            _ => first_after(&all, step, one.asked_us, until).map(|m| m.at_us),
        };
        for (k, (step, from, _)) in OUT_STEPS.iter().enumerate() {
            if let (Some(from), Some(to)) = (at(from), at(step)) {
                steps[k].1.push(span(from, to));
            }
        }
    }
    Ok(steps)
}

/// One `file/send` through the relay: when it was asked (wall clock) and
/// how long until the host read its answer.
struct Sent {
    asked_us: u128,
    took: Duration,
}

/// The follower that sends, and its topic.
async fn sender(world: &World) -> anyhow::Result<(usize, i64)> {
    let status = world.status().await?;
    let follower = *world
        .follower_indices(&status)
        .first()
        .context("no follower on the bus")?;
    Ok((follower, world.thread_of(&status, follower)?))
}

/// Writes `bytes` as `name` into the follower's working directory and has
/// its host send it with `file/send`; the file is gone again afterwards.
async fn send_through_relay(
    world: &mut World,
    follower: usize,
    name: &str,
    bytes: &[u8],
) -> anyhow::Result<Sent> {
    let path = PathBuf::from(&world.hosts[follower].cwd).join(name);
    std::fs::write(&path, bytes)?;
    let asked_us = now_us();
    let start = Instant::now();
    let sent = tokio::time::timeout(
        TRANSFER_TIMEOUT,
        world.hosts[follower].call("file/send", json!({"path": name, "as": "document"})),
    )
    .await
    .context("file/send timed out")??;
    let took = start.elapsed();
    if sent["size"] != json!(bytes.len()) {
        bail!("file/send answered {sent}");
    }
    std::fs::remove_file(&path)?;
    Ok(Sent { asked_us, took })
}
