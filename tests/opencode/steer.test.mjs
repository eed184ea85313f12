// Steering a running turn (issue 38) in the real OpenCode, launched by the relay: while
// a turn runs (a bash call that waits for a file the test writes), a message written in
// the topic waits in the relay for the next turn, and `/steer <text>` is a prompt sent
// while the session is busy, which OpenCode 1.18.33 gives to the model with the next
// step's request — within the running turn, before it ends — once.

import assert from "node:assert/strict";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { eventually, World } from "./harness.mjs";

const WAIT = 60_000;

/** The user texts of a model request's messages. */
const userTexts = (request) =>
	request.body.messages
		.filter((m) => m.role === "user")
		.map((m) => (typeof m.content === "string" ? m.content : m.content.map((p) => p.text ?? "").join("")));

/** Whether the bot marked message `messageId` with 👀 (its host took it). */
async function taken(telegram, messageId) {
	return (await telegram.calls()).some(
		(c) => c.method === "setMessageReaction" && c.params.message_id === messageId && JSON.stringify(c.params.reaction).includes("👀"),
	);
}

test("/steer puts its text into OpenCode's running turn; a plain message waits for the next turn", async (t) => {
	const world = await World.create(t);
	const { telegram, fake } = world;
	await world.serve();
	await telegram.injectMessage(null, "/new project opencode hello");
	const topic = await eventually(async () => (await telegram.topics()).find((x) => x.name.endsWith(" · project")), WAIT, "the topic");
	await telegram.said(topic.thread_id, (text) => text === "echo: hello", { ms: WAIT, what: "the first answer" });

	const gate = join(world.root, "go");
	fake.queue({ toolCall: { name: "bash", arguments: { command: `while [ ! -e ${gate} ]; do sleep 0.1; done; echo released`, description: "wait" } } });
	await telegram.injectMessage(topic.thread_id, "think for a while");
	const ask = await eventually(
		async () =>
			(await telegram.messages(topic.thread_id)).find(
				(m) => m.plain_text.includes("wants to run") && (m.reply_markup?.inline_keyboard ?? []).flat().length > 0,
			),
		WAIT,
		"the approval on the phone",
	);
	const allow = ask.reply_markup.inline_keyboard.flat().find((b) => /Allow/.test(b.text));
	await telegram.tap(topic.thread_id, ask.message_id, allow.callback_data);

	const waiting = await telegram.injectMessage(topic.thread_id, "a thought for later");
	const steer = await telegram.injectMessage(topic.thread_id, "/steer mention the weather too");
	await eventually(() => taken(telegram, steer.message_id), WAIT, "OpenCode to take the steered text (👀)");
	assert.ok(!(await taken(telegram, waiting.message_id)), "the plain message waits in the relay");
	await writeFile(gate, "");

	// Within the running turn: the request with the bash call's result has the text.
	const within = await eventually(
		() => fake.turns.find((r) => userTexts(r).includes("mention the weather too")),
		WAIT,
		"the model's request with the steered text",
	);
	assert.ok(
		within.body.messages.some((m) => m.role === "tool" && String(m.content).includes("released")),
		"after the bash call's result, in the same turn",
	);
	assert.ok(!userTexts(within).includes("a thought for later"), "the waiting message is not in this turn");
	await telegram.said(topic.thread_id, (text) => text === "echo: mention the weather too", { ms: WAIT, what: "the steered turn's answer" });

	// The run ended: what waited is the next turn, given once.
	const later = await eventually(
		() => fake.turns.find((r) => userTexts(r).at(-1) === "a thought for later"),
		WAIT,
		"the next turn's request",
	);
	assert.deepEqual(
		userTexts(later).filter((text) => text.includes("weather")),
		["mention the weather too"],
		"the steered text is in the history once",
	);
	await telegram.said(topic.thread_id, (text) => text === "echo: a thought for later", { ms: WAIT, what: "the next turn's answer" });
	await eventually(() => taken(telegram, waiting.message_id), WAIT, "the waiting message marked once the next turn took it (👀)");
});
