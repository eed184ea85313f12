// Drafts with the real Claude Code (print mode, offline) in the private-chat mode:
// `agent-relay mcp` and its hooks, no group, the session's topic in the allowed
// user's private chat with the bot.
//
// * the turn shows as one draft that follows its tool calls (Claude Code's hooks
//   tell of each call; they carry none of the text being written, so the draft
//   shows the steps, not the answer as it grows) and lands as one `sendMessage`,
//   the answer headed by how the turn went, which takes the draft's place;
// * the draft offers no stop button: Claude Code at its own keyboard refuses
//   `agent/abort` (`/stop` in the topic says to press Esc there), and a button
//   that cannot stop the turn is not shown.

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { eventually, FakeBotApi, REPO, USER_ID } from "../pi/harness.mjs";
import { relayConfig, World } from "./harness.mjs";

const SIDECAR = process.env.AGENT_RELAY_BIN || join(REPO, "target", "debug", "agent-relay");

/** A world whose Claude Code runs the relay against its own fake Telegram, topics in the private chat. */
async function privateWorld(t) {
	assert.ok(existsSync(SIDECAR), `${SIDECAR} is missing: run \`cargo build --bins\` first`);
	const world = await World.create(t);
	const telegram = await FakeBotApi.start();
	t.after(() => telegram.stop());
	const ids = { userId: USER_ID, token: telegram.token, url: telegram.url };
	const relay = await relayConfig(world, ids, SIDECAR, { log: "debug", privateChat: true });
	const run = (prompt, args = []) => world.run(prompt, { args: [...relay.args, ...args], env: relay.env });
	return { world, telegram, run };
}

/** The session's topic in the private chat, once it exists. */
function privateTopic(telegram) {
	return eventually(async () => (await telegram.privateTopics()).find((x) => !x.deleted), 20_000, "the session's topic in the private chat");
}

/** The `sendMessage` calls into `threadId` of the private chat, their texts. */
async function sendsInto(telegram, threadId) {
	return (await telegram.calls())
		.filter((c) => c.method === "sendMessage" && c.params.chat_id === USER_ID && c.params.message_thread_id === threadId)
		.map((c) => c.params.text);
}

test("a Claude Code turn shows as a draft following its tools and lands as one message", async (t) => {
	const { world, telegram, run } = await privateWorld(t);
	world.fake.queue(
		// Long enough for the draft to get out past the messages before it (the
		// session's "connected", the mirrored prompt) in the chat's one a second.
		{ text: "First the tree.", toolUse: { name: "Bash", input: { command: "sleep 3; echo one" } } },
		{ toolUse: { name: "Bash", input: { command: "sleep 2; echo two" } } },
		{ text: "Both ran: **42**." },
	);
	const out = await run("count to two", ["--allowedTools", "Bash"]);
	assert.equal(out.code, 0, out.stderr);
	const topic = await privateTopic(telegram);
	const answer = await eventually(
		async () => (await telegram.privateMessages(topic.thread_id)).find((m) => m.plain_text.includes("Both ran: 42.")),
		30_000,
		"the answer in the private topic",
	);

	const drafts = await telegram.draftsIn(topic.thread_id);
	assert.equal(drafts.length, 1, `one draft for the turn: ${JSON.stringify(drafts)}`);
	const [draft] = drafts;
	const shown = [...new Set(draft.texts)];
	assert.ok(shown.some((x) => x.includes("▸ Bash: $ sleep 3; echo one")), JSON.stringify(shown));
	assert.ok(shown.some((x) => x.includes("▸ Bash: $ sleep 2; echo two")), `the draft follows the turn: ${JSON.stringify(shown)}`);
	assert.equal(draft.can_stop, false, "no stop button where pressing it could not stop the turn");
	assert.equal(draft.replaced_by, answer.message_id, "the answer takes the draft's place");

	// Beside the session's "🟢 connected" (and a prompt typed at the keyboard,
	// mirrored as 🧑‍💻, when the topic was there in time), the turn is one message.
	const sends = (await sendsInto(telegram, topic.thread_id)).filter((text) => !/^(🟢|🧑‍💻)/u.test(text));
	assert.equal(sends.length, 1, `one sendMessage for the turn: ${JSON.stringify(sends)}`);
	assert.match(answer.plain_text, /^✓ · 2 tools · \d+:\d\d\n\nBoth ran: 42\.$/, "how the turn went heads the answer");
	assert.deepEqual(world.fake.unknown ?? [], [], "Claude Code asked for nothing the fake does not serve");
});

test("a keyboard Claude Code turn is not stopped from the topic, and nothing offers to", async (t) => {
	const { world, telegram, run } = await privateWorld(t);
	world.fake.queue({ toolUse: { name: "Bash", input: { command: "sleep 4; echo slept" } } }, { text: "Slept." });
	const running = run("take a nap", ["--allowedTools", "Bash"]);
	const topic = await privateTopic(telegram);
	const draft = await eventually(
		async () => (await telegram.draftsIn(topic.thread_id)).find((d) => d.texts.some((x) => x.includes("sleep 4"))),
		30_000,
		"the draft of the running turn",
	);
	assert.equal(draft.can_stop, false, JSON.stringify(draft));
	await telegram.injectPrivate(topic.thread_id, "/stop");
	const refused = await eventually(
		async () => (await telegram.privateMessages(topic.thread_id)).find((m) => m.plain_text.startsWith("⚠️ Could not stop")),
		30_000,
		"the answer to /stop",
	);
	assert.match(refused.plain_text, /press Esc in its terminal/);
	const out = await running;
	assert.equal(out.code, 0, out.stderr);
	assert.match(out.result.result, /Slept\./, "the turn ran to its end");
});
