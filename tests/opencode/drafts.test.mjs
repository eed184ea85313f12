// Drafts with the real OpenCode beside its TUI, in the private-chat mode: no group,
// the session's topic in the allowed user's private chat with the bot.
//
// * a turn from the phone shows as one draft that follows its tool calls and the
//   answer as OpenCode writes it, and lands as one message that takes its place;
// * the draft's stop button aborts the turn (the bridge can: OpenCode's abort);
// * a stream cut OpenCode tries again leaves the draft (turn/ended {error}) and is
//   no part of the answer.

import assert from "node:assert/strict";
import { test } from "node:test";
import { eventually, USER_ID, World } from "./harness.mjs";

/** The session's topic in the private chat, once the TUI works in a session. */
async function privateSession(t) {
	const world = await World.create(t, { permission: {}, privateChat: true });
	await world.wrapper();
	await world.type("hello from the terminal");
	const topic = await eventually(async () => (await world.telegram.privateTopics()).find((x) => !x.deleted), 30_000, "the topic in the private chat");
	await eventually(
		async () => (await world.telegram.privateMessages(topic.thread_id)).find((m) => m.plain_text.includes("echo: hello from the terminal")),
		30_000,
		"the terminal's answer",
	);
	return { world, topic };
}

test("a turn from the phone shows as one draft following its tools and its answer, and lands as one message", async (t) => {
	const { world, topic } = await privateSession(t);
	const { telegram } = world;
	world.fake.queue(
		{ text: "First the tree.", toolCall: { name: "bash", arguments: { command: "sleep 3; echo one", description: "one" } } },
		{ toolCall: { name: "bash", arguments: { command: "sleep 2; echo two", description: "two" } } },
		{ text: "Both ran: **42**." },
	);
	const before = (await telegram.calls()).length;
	await telegram.injectPrivate(topic.thread_id, "count to two");
	const answer = await eventually(
		async () => (await telegram.privateMessages(topic.thread_id)).find((m) => m.plain_text.includes("Both ran: 42.")),
		60_000,
		"the answer in the private topic",
	);
	const drafts = (await telegram.draftsIn(topic.thread_id)).filter((d) => d.texts.some((x) => x.includes("sleep 3")));
	assert.equal(drafts.length, 1, `one draft for the turn: ${JSON.stringify(drafts)}`);
	const [draft] = drafts;
	const shown = [...new Set(draft.texts)];
	t.diagnostic(`the draft showed: ${JSON.stringify(shown)}`);
	assert.ok(shown.some((x) => x.includes("sleep 3; echo one")), JSON.stringify(shown));
	assert.ok(shown.some((x) => x.includes("sleep 2; echo two")), `the draft follows the turn: ${JSON.stringify(shown)}`);
	assert.equal(draft.can_stop, true, "a stop button: the bridge can abort the turn");
	assert.equal(draft.replaced_by, answer.message_id, "the answer takes the draft's place");
	const sends = (await telegram.calls())
		.slice(before)
		.filter((c) => c.method === "sendMessage" && c.params.chat_id === USER_ID && c.params.message_thread_id === topic.thread_id)
		.map((c) => c.params.text);
	assert.equal(sends.length, 1, `one sendMessage for the turn: ${JSON.stringify(sends)}`);
});

test("the draft's stop button aborts the turn", async (t) => {
	const { world, topic } = await privateSession(t);
	const { telegram } = world;
	await telegram.injectPrivate(topic.thread_id, "a long one [[hang]]");
	const held = await world.fake.next((r) => r.lastUserText.includes("a long one"));
	const draft = await eventually(async () => (await telegram.draftsIn(topic.thread_id)).find((d) => d.can_stop && !d.replaced_by), 30_000, "the draft of the running turn");
	await telegram.pressStop(topic.thread_id, draft.draft_id);
	await eventually(() => held.aborted, 30_000, "the model's request given up");
	await world.shows(/interrupted/i, 30_000, "the TUI to show the interrupt");
});

test("a stream cut OpenCode tries again: its text leaves the draft and is no part of the answer", async (t) => {
	const { world, topic } = await privateSession(t);
	const { telegram } = world;
	world.fake.queue({ cut: "Half an answer that" });
	await telegram.injectPrivate(topic.thread_id, "when the line drops");
	const answer = await eventually(
		async () => (await telegram.privateMessages(topic.thread_id)).find((m) => m.plain_text.includes("echo: when the line drops")),
		60_000,
		"the answer after the cut",
	);
	assert.ok(!answer.plain_text.includes("Half an answer"), `the answer alone: ${JSON.stringify(answer.plain_text)}`);
	const [draft] = (await telegram.draftsIn(topic.thread_id)).filter((d) => d.replaced_by === answer.message_id);
	assert.ok(draft, "the answer took the draft's place");
	t.diagnostic(`the draft showed: ${JSON.stringify([...new Set(draft.texts)])}`);
	assert.ok(!draft.texts.at(-1).includes("Half an answer"), `the draft stopped showing the cut try: ${JSON.stringify(draft.texts)}`);
});
