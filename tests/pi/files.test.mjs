// Files both ways with the real pi (issue 15): a photo written into the topic
// reaches the fake model as an image, byte for byte; the agent sends a file back
// with the telegram_send_file tool (called by the fake model on cue), and the
// fake Bot API receives it byte for byte. A document reaches the model as a path
// it can open; a path outside the working directory is refused and the model is
// told why.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { World } from "./harness.mjs";

const TEST_MS = 120_000;

const sha256 = (bytes) => createHash("sha256").update(bytes).digest("hex");

/** `length` bytes that start like a PNG, the rest varied. */
function png(length, seed = 7) {
	const bytes = Buffer.alloc(length);
	Buffer.from("89504e470d0a1a0a", "hex").copy(bytes);
	let x = seed;
	for (let i = 8; i < length; i++) {
		x = (x * 1103515245 + 12345) >>> 0;
		bytes[i] = x >>> 24;
	}
	return bytes;
}

async function boundPi(world, name) {
	const pi = await world.startPi(name);
	await pi.bound();
	const topic = await world.topicOf(name);
	assert.ok(topic, `pi ${name} has a topic`);
	return { pi, topic, cwd: join(world.root, name) };
}

test("a photo from the phone reaches the model as an image, and the agent sends a file back", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const { pi, topic, cwd } = await boundPi(world, "alpha");
	const plot = png(48 * 1024 + 5, 11);
	await writeFile(join(cwd, "plot.png"), plot);

	const shot = png(120 * 1024 + 3, 3);
	const from = pi.mark();
	await world.bot.injectMedia(
		topic.thread_id,
		'what is wrong here? [[tool:telegram_send_file {"path":"plot.png","caption":"the plot you asked for"}]]',
		{ kind: "photo", data_base64: shot.toString("base64") },
	);

	// The model saw the photo as an image part of the prompt.
	const ended = await pi.waitFor((e) => e.type === "tool_execution_end" && e.toolName === "telegram_send_file", {
		ms: 60_000,
		from,
		what: "telegram_send_file to run",
	});
	const [first] = world.model.completions;
	assert.equal(first.images.length, 1, "one image in the prompt");
	const prefix = "data:image/jpeg;base64,";
	assert.ok(first.images[0].url.startsWith(prefix), first.images[0].url.slice(0, 40));
	const seen = Buffer.from(first.images[0].url.slice(prefix.length), "base64");
	console.log(`photo in: sent sha256 ${sha256(shot)}, the model saw sha256 ${sha256(seen)} (${seen.length} bytes)`);
	assert.equal(sha256(seen), sha256(shot));
	assert.match(first.lastUserText, /^what is wrong here\? .*\n\n\[photo from Telegram: \/.*-1-photo\.jpg \(image\/jpeg, 120 KB\)\]$/s);

	// The agent's tool call sent plot.png into the topic as a photo.
	assert.equal(ended.isError, false, JSON.stringify(ended.result));
	assert.match(ended.result.content[0].text, /^Sent plot\.png to the user's Telegram topic as a photo \(49157 bytes\)\.$/);
	const sent = await world.bot.said(topic.thread_id, (plain) => plain === "the plot you asked for", {
		what: "the plot in the topic",
	});
	assert.equal(sent.media.kind, "photo");
	const uploaded = await world.bot.fileContent(sent.media.file_id);
	console.log(`file out: plot.png sha256 ${sha256(plot)}, Telegram got sha256 ${sha256(uploaded)} (${uploaded.length} bytes)`);
	assert.equal(sha256(uploaded), sha256(plot));
	const calls = await world.bot.calls();
	const upload = calls.find((c) => c.method === "sendPhoto");
	assert.equal(upload.params.photo.upload.file_name, "plot.png");
	assert.equal(upload.params.message_thread_id, String(topic.thread_id));
	console.log(`the fake recorded: sendPhoto ${JSON.stringify(upload.params)}`);

	// The turn's answer names what the tool did.
	await world.bot.said(topic.thread_id, (plain) => plain.includes("tool telegram_send_file returned: Sent plot.png"), {
		what: "the model's answer after the tool",
	});
	for (const m of await world.bot.messages(topic.thread_id)) {
		console.log(`topic message ${m.message_id}: ${JSON.stringify(m.plain_text)}${m.media ? ` [${m.media.kind}]` : ""}`);
	}
});

test("a document reaches the model as a path it can open; a file outside the project is refused", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	// The approval policy would ask the phone first about a path outside the project
	// (tests/pi/approvals.test.mjs); here the relay's own refusal is the subject.
	await world.relayConfig('[approvals]\nmode = "off"\n');
	const { pi, topic } = await boundPi(world, "beta");
	const log = Buffer.from("2026-01-01 12:00:00 ERROR worker: connection reset\n".repeat(40));
	const from = pi.mark();
	await world.bot.injectMedia(
		topic.thread_id,
		'why did it fail? [[tool:telegram_send_file {"path":"/etc/hostname"}]]',
		{ kind: "document", data_base64: log.toString("base64"), file_name: "worker.log", mime_type: "text/plain" },
	);
	const ended = await pi.waitFor((e) => e.type === "tool_execution_end" && e.toolName === "telegram_send_file", {
		ms: 60_000,
		from,
		what: "the refused tool call",
	});
	const [first] = world.model.completions;
	assert.equal(first.images.length, 0, "a document is no image");
	const line = /\[file “worker\.log” from Telegram: (\/\S+) \(text\/plain, 2 KB\)\]/.exec(first.lastUserText);
	assert.ok(line, first.lastUserText);
	assert.equal(sha256(await readFile(line[1])), sha256(log), "the path holds the document");

	assert.equal(ended.isError, true);
	assert.match(ended.result.content[0].text, /the file was not sent: \/etc\/hostname is outside .*beta; set `\[files\] send_from`/);
	console.log(`refused: ${ended.result.content[0].text}`);
	await world.bot.said(topic.thread_id, (plain) => plain.includes("tool telegram_send_file returned:") && plain.includes("is outside"), {
		what: "the model's answer naming the refusal",
	});
	const calls = await world.bot.calls();
	assert.ok(!calls.some((c) => c.method === "sendDocument" || c.method === "sendPhoto"), "nothing was uploaded");
});
