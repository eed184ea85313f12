// End-to-end drafts in the private-chat mode (no chat id: the topics are in the
// allowed user's private chat with the bot): the real pi streams its answer from
// the fake model, the sidecar shows it as a draft that grows, the answer lands as
// one message, and the draft's stop button stops the turn.

import assert from "node:assert/strict";
import { test } from "node:test";
import { World, eventually } from "./harness.mjs";

const TEST_MS = 120_000;

/** A pi named `name` bound to its topic in the private chat, and that topic. */
async function privatePi(world, name) {
	const pi = await world.startPi(name, { env: { AGENT_RELAY_CHAT_ID: undefined } });
	await pi.bound();
	const topics = await world.bot.privateTopics();
	const topic = topics.find((t) => !t.deleted && t.name.endsWith(` · ${name}`));
	assert.ok(topic, `pi ${name} has a topic in the private chat: ${JSON.stringify(topics)}`);
	return { pi, topic };
}

test("a turn streams into a growing draft and lands as one message", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const { pi, topic } = await privatePi(world, "alpha");
	const chunks = ["The answer ", "is being ", "written ", "slowly: 42."];
	world.model.queue({ chunks, everyMs: 1_500 });
	const sendsBefore = (await world.bot.calls()).filter((c) => c.method === "sendMessage").length;

	const from = pi.mark();
	await world.bot.injectPrivate(topic.thread_id, "what is the answer?");
	await pi.waitFor((e) => e.type === "agent_end", { ms: 30_000, from, what: "the end of the turn" });
	const answer = await eventually(
		async () => (await world.bot.privateMessages(topic.thread_id)).find((m) => m.plain_text.includes("slowly: 42.")),
		30_000,
		"the answer in the topic",
	);

	const drafts = await world.bot.draftsIn(topic.thread_id);
	assert.equal(drafts.length, 1, `one draft for the turn: ${JSON.stringify(drafts)}`);
	const written = [...new Set(drafts[0].texts.filter((text) => text.includes("The answer")))];
	assert.ok(written.length >= 2, `the draft grows as the model writes: ${JSON.stringify(drafts[0].texts)}`);
	assert.ok(written.at(-1).length > written[0].length, JSON.stringify(written));
	assert.ok(drafts[0].can_stop, "the draft offers its stop button");
	assert.equal(drafts[0].replaced_by, answer.message_id, "the answer takes the draft's place");

	const sends = (await world.bot.calls()).filter((c) => c.method === "sendMessage").slice(sendsBefore);
	assert.equal(sends.length, 1, `one sendMessage for the turn: ${JSON.stringify(sends.map((c) => c.params.text))}`);
	assert.equal(answer.plain_text, "The answer is being written slowly: 42.");
});

test("the draft's stop button stops pi's turn", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const { pi, topic } = await privatePi(world, "alpha");
	world.model.queue({ text: "Let me think about this at length", hang: true });

	const from = pi.mark();
	await world.bot.injectPrivate(topic.thread_id, "think hard");
	const draft = await eventually(
		async () => (await world.bot.draftsIn(topic.thread_id)).find((d) => d.can_stop && d.texts.some((x) => x.includes("at length"))),
		30_000,
		"a draft with the model's text and a stop button",
	);
	await world.bot.pressStop(topic.thread_id, draft.draft_id);

	const end = await pi.waitFor((e) => e.type === "agent_end", { ms: 30_000, from, what: "the turn to stop" });
	assert.equal(end.messages.findLast((m) => m.role === "assistant").stopReason, "aborted");
	await eventually(
		async () => (await world.bot.privateMessages(topic.thread_id)).find((m) => m.plain_text === "⏹ Stopped."),
		30_000,
		"⏹ Stopped. in the topic",
	);
	await eventually(async () => world.model.requests.some((r) => r.aborted), 10_000, "the model's stream to be cut");
});
