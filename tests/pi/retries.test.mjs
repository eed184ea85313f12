// pi's own retries (issue 37): pi 0.73.1 tries a failed model call again itself
// (docs/settings.md, "Retry") and tells extensions nothing of it: `agent_end` with
// `stopReason: "error"` comes before the try again. The fake model fails as real ones
// do — a 503, a stream cut mid-answer ("terminated"), every try failing — and the
// topic must show what came of the turn: the answer once, never an errored try's
// broken text, and a turn that failed for good said once, with its error. Each in a
// group (messages) and in a private chat (a draft the answer takes the place of).

import assert from "node:assert/strict";
import { test } from "node:test";
import { World, eventually } from "./harness.mjs";

const TEST_MS = 120_000;
/** pi's retries on, quick: tries again 200, 400 and 800 ms after a failure. */
const RETRIES = { retry: { enabled: true, maxRetries: 3, baseDelayMs: 200, provider: { maxRetries: 0 } } };

const BROKEN = "Half an answer that";

/** The two places a session's topic can be: a forum group, or the person's private chat. */
const PLACES = [
	{
		name: "a group",
		env: {},
		topic: (world, name) => world.topicOf(name),
		messages: (world, thread) => world.bot.messages(thread),
		write: (world, thread, text) => world.bot.injectMessage(thread, text),
	},
	{
		name: "a private chat",
		env: { AGENT_RELAY_CHAT_ID: undefined },
		topic: async (world, name) => (await world.bot.privateTopics()).find((t) => !t.deleted && t.name.endsWith(` · ${name}`)),
		messages: (world, thread) => world.bot.privateMessages(thread),
		write: (world, thread, text) => world.bot.injectPrivate(thread, text),
	},
];

/** A pi with pi's retries on, bound to its topic in `place`; what its topic shows. */
async function retryingPi(t, place) {
	const world = await World.create(t, { settings: RETRIES });
	const pi = await world.startPi("alpha", { env: place.env });
	await pi.bound();
	const topic = await place.topic(world, "alpha");
	assert.ok(topic, `pi has a topic in ${place.name}`);
	const thread = topic.thread_id;
	const texts = async () => (await place.messages(world, thread)).map((m) => m.plain_text);
	return { world, pi, thread, texts };
}

/**
 * Writes `text` into the topic and waits for pi's runs to end: the last `agent_end`
 * from `from` on whose last message did not fail (or, with `failing`, `runs` ends).
 */
async function turn(world, place, pi, thread, text, { runs = 1 } = {}) {
	const from = pi.mark();
	await place.write(world, thread, text);
	await eventually(
		() => pi.events.slice(from).filter((e) => e.type === "agent_end").length >= runs,
		60_000,
		`${runs} run(s) of pi`,
	);
	return pi.events.slice(from).filter((e) => e.type === "agent_end");
}

/**
 * Everything of the first turn is in the topic once a second turn's answer is: the
 * relay keeps a topic's order.
 */
async function settledBy(world, place, pi, thread, texts) {
	await turn(world, place, pi, thread, "and now?");
	await eventually(async () => (await texts()).some((x) => x.includes("echo: and now?")), 30_000, "the next turn's answer");
	return texts();
}

for (const place of PLACES) {
	test(`in ${place.name}: a 503 and then the answer: the answer lands once, and nothing else`, { timeout: TEST_MS }, async (t) => {
		const { world, pi, thread, texts } = await retryingPi(t, place);
		world.model.queue({ error: { status: 503, message: "overloaded" } }, { text: "the real answer" });
		const before = (await texts()).length;

		const runs = await turn(world, place, pi, thread, "hello", { runs: 2 });
		assert.equal(runs[0].messages.at(-1).stopReason, "error", "pi's first try failed");
		assert.equal(runs[1].messages.at(-1).stopReason, "stop", "pi tried again, and it answered");
		const all = (await settledBy(world, place, pi, thread, texts)).slice(before);
		assert.deepEqual(all, ["the real answer", "echo: and now?"], "the answer, once, and no word of the failed try");
	});

	test(`in ${place.name}: a stream cut mid-answer, then the whole answer: the broken text is never posted`, { timeout: TEST_MS }, async (t) => {
		const { world, pi, thread, texts } = await retryingPi(t, place);
		// Slow enough for a private chat's draft to show the broken text, then the answer.
		world.model.queue({ text: BROKEN, cut: true, cutAfterMs: 2_500 }, { chunks: ["the whole ", "answer"], everyMs: 1_500 });
		const before = (await texts()).length;

		const runs = await turn(world, place, pi, thread, "hello", { runs: 2 });
		const cut = runs[0].messages.at(-1);
		assert.equal(cut.stopReason, "error");
		assert.equal(cut.errorMessage, "terminated", "pi reads a stream cut mid-answer as terminated");
		assert.deepEqual(cut.content, [{ type: "text", text: BROKEN }], "pi kept the broken text of the failed try");
		const all = (await settledBy(world, place, pi, thread, texts)).slice(before);
		assert.deepEqual(all, ["the whole answer", "echo: and now?"], "the answer once; the broken text never");
		if (place.name === "a private chat") {
			const drafts = await world.bot.draftsIn(thread);
			const answer = (await world.bot.privateMessages(thread)).find((m) => m.plain_text === "the whole answer");
			const shown = drafts.find((d) => d.replaced_by === answer.message_id);
			assert.ok(shown, `the answer takes a draft's place: ${JSON.stringify(drafts)}`);
			assert.ok(shown.texts.some((x) => x.includes(BROKEN)), `the draft showed the words as they came: ${JSON.stringify(shown.texts)}`);
			assert.ok(!shown.texts.at(-1).includes(BROKEN), `the draft no longer shows the broken text: ${JSON.stringify(shown.texts)}`);
			assert.equal(drafts.length, 1, "one draft for the turn, its tries included");
		}
	});

	test(`in ${place.name}: every try fails: the topic says so once, with the error`, { timeout: TEST_MS }, async (t) => {
		const { world, pi, thread, texts } = await retryingPi(t, place);
		world.model.queue(
			{ error: { status: 503, message: "down" } },
			{ text: BROKEN, cut: true },
			{ error: { status: 503, message: "down" } },
			{ error: { status: 503, message: "still down" } },
		);
		const before = (await texts()).length;

		const runs = await turn(world, place, pi, thread, "hello", { runs: 4 });
		assert.deepEqual(
			runs.map((r) => r.messages.at(-1).errorMessage),
			["503 down", "terminated", "503 down", "503 still down"],
			"pi tried four times",
		);
		const said = await eventually(
			async () => (await texts()).find((x) => x.includes("The turn failed")),
			30_000,
			"the failure in the topic",
		);
		assert.equal(said, "⚠️ The turn failed: 503 still down. No answer came of it.");
		const all = (await settledBy(world, place, pi, thread, texts)).slice(before);
		assert.deepEqual(all, [said, "echo: and now?"], "said once; no broken text, no other word of the tries");
		assert.equal(world.model.completions.length, 5, "four tries and the next turn");
	});
}

test("a failed model call pi does not try again (retries off) is said at once", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const pi = await world.startPi("alpha");
	await pi.bound();
	const topic = await world.topicOf("alpha");
	world.model.queue({ error: { status: 400, message: "the request is malformed" } });
	await world.bot.injectMessage(topic.thread_id, "hello");
	await world.bot.said(topic.thread_id, (plain) => plain === "⚠️ The turn failed: 400 the request is malformed. No answer came of it.", {
		what: "the failure in the topic",
	});
});

test("/stop while pi waits to try again: pi does not, and the topic says Stopped, not failed", { timeout: TEST_MS }, async (t) => {
	// pi would try again 10 s after the failure: /stop comes first.
	const slow = { retry: { enabled: true, maxRetries: 3, baseDelayMs: 10_000, provider: { maxRetries: 0 } } };
	const world = await World.create(t, { settings: slow });
	const place = PLACES[0];
	const pi = await world.startPi("alpha");
	await pi.bound();
	const { thread_id: thread } = await world.topicOf("alpha");
	const texts = async () => (await world.bot.messages(thread)).map((m) => m.plain_text);
	world.model.queue({ error: { status: 503, message: "overloaded" } });
	const before = (await texts()).length;

	await turn(world, place, pi, thread, "hello");
	await world.bot.injectMessage(thread, "/stop");
	await world.bot.said(thread, (plain) => plain === "⏹ Stopped.", { what: "⏹ Stopped. in the topic" });
	const all = (await settledBy(world, place, pi, thread, texts)).slice(before);
	assert.deepEqual(all, ["⏹ Stopped.", "echo: and now?"], "stopped, and no word of a failure");
	assert.equal(world.model.completions.length, 2, "pi did not try the stopped turn again");
});
