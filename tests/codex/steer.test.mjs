// Steering a running turn (issue 38) in the real Codex, launched by the relay: while
// a turn runs (the fake model holds its first request open), a message written in the
// topic waits in the relay for the next turn — no `turn/start` joins it to the running
// one — and `/steer <text>` is `turn/steer` into that turn: the model's next request
// within the same turn has the text, before the turn ends, and the text is given once.
// (Codex 0.171 lets the model request under way finish, then asks again, the steered
// text added, within the same turn.)

import assert from "node:assert/strict";
import { test } from "node:test";
import { eventually, World } from "./harness.mjs";

const WAIT = 60_000;

/** Every text the model was given in a turn request. */
const history = (request) => JSON.stringify(request.body.input);

/** The texts of the person's messages in a turn request's input. */
const userTexts = (request) =>
	request.body.input
		.filter((i) => i?.type === "message" && i.role === "user")
		.flatMap((i) => (Array.isArray(i.content) ? i.content : []).filter((p) => p.type === "input_text").map((p) => p.text));

/** Whether the bot marked message `messageId` with 👀 (its host took it). */
async function taken(telegram, messageId) {
	const calls = await telegram.calls();
	return calls.some(
		(c) =>
			c.method === "setMessageReaction" &&
			c.params.message_id === messageId &&
			JSON.stringify(c.params.reaction).includes("👀"),
	);
}

test("/steer puts its text into Codex's running turn; a plain message waits for the next turn", async (t) => {
	const world = await World.create(t);
	const { telegram, fake } = world;
	await world.serve();
	await telegram.injectMessage(null, "/new project codex hello");
	const topic = await eventually(async () => (await telegram.topics()).find((x) => x.name.endsWith(" · project")), WAIT, "the topic");
	await telegram.said(topic.thread_id, (text) => text === "echo: hello", { ms: WAIT, what: "the first answer" });

	let release;
	const held = new Promise((done) => {
		release = done;
	});
	fake.queue({ hold: held, text: "the held answer" });
	const turnsBefore = fake.turns.length;
	await telegram.injectMessage(topic.thread_id, "think for a while");
	await fake.next((r) => r.lastUserText === "think for a while", WAIT);

	const waiting = await telegram.injectMessage(topic.thread_id, "a thought for later");
	const steer = await telegram.injectMessage(topic.thread_id, "/steer mention the weather too");
	await eventually(() => taken(telegram, steer.message_id), WAIT, "Codex to take the steered text (👀)");
	assert.ok(!(await taken(telegram, waiting.message_id)), "the plain message waits in the relay");

	// Within the running turn, before it ends.
	// Codex lets the model request under way finish, then asks again with the steered
	// text (the held answer, superseded, is not kept in the thread).
	release();
	const steered = await fake.next((r) => history(r).includes("mention the weather too"), WAIT);
	assert.ok(history(steered).includes("think for a while"), "the turn's own prompt is there: the same turn");
	assert.ok(!history(steered).includes("a thought for later"), "the waiting message is not in this turn");
	await telegram.said(topic.thread_id, (text) => text === "echo: mention the weather too", { ms: WAIT, what: "the steered turn's answer" });
	const said = (await telegram.messages(topic.thread_id)).map((m) => m.plain_text);
	assert.ok(!said.some((text) => text.includes("the held answer")), `one turn, one answer: ${JSON.stringify(said)}`);

	// The run ended: what waited is the next turn, given once.
	const later = await fake.next((r) => r.lastUserText === "a thought for later", WAIT);
	assert.deepEqual(
		userTexts(later).filter((text) => text.includes("weather")),
		["mention the weather too"],
		"the steered text is in the history once",
	);
	await telegram.said(topic.thread_id, (text) => text === "echo: a thought for later", { ms: WAIT, what: "the next turn's answer" });
	await eventually(() => taken(telegram, waiting.message_id), WAIT, "the waiting message marked once the next turn took it (👀)");
	assert.equal(
		fake.turns.slice(turnsBefore).filter((r) => r.lastUserText === "a thought for later").length,
		1,
		"given once",
	);
});
