// Steering a running turn (issue 38) in the real pi: a message written in the topic
// while a turn runs waits in the relay for the next turn; the progress message offers
// ⚡ Steer now, and its tap puts the message into the turn that runs — pi takes it as
// `deliverAs: "steer"`, so the model's next request within that turn has it, before the
// turn ends — and it is given once. The turn is held open by a bash call that waits
// for a file the test writes once pi holds the steered message.

import assert from "node:assert/strict";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { World, eventually } from "./harness.mjs";

const TEST_MS = 120_000;

function steerButton(message) {
	return (message?.reply_markup?.inline_keyboard ?? []).flat().find((b) => b.callback_data === "steer");
}

/** The user texts of a model request's messages. */
function userTexts(request) {
	return request.body.messages
		.filter((m) => m.role === "user")
		.map((m) => (typeof m.content === "string" ? m.content : m.content.map((p) => p.text ?? "").join("")));
}

test("⚡ Steer now puts a message written mid-turn into the running turn, once", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	await world.relayConfig('[approvals]\nmode = "off"\n');
	const pi = await world.startPi("alpha");
	await pi.bound();
	const topic = await world.topicOf("alpha");
	const gate = join(world.root, "go");
	const wait = `while [ ! -e ${gate} ]; do sleep 0.1; done; echo released`;

	let from = pi.mark();
	await world.bot.injectMessage(topic.thread_id, `work [[tool:bash ${JSON.stringify({ command: wait })}]]`);
	await pi.waitFor((e) => e.type === "tool_execution_start", { ms: 30_000, from, what: "bash to start" });

	const steered = "also mention the weather";
	await world.bot.injectMessage(topic.thread_id, steered);
	const progress = await eventually(
		async () => (await world.bot.messages(topic.thread_id)).find((m) => steerButton(m)),
		30_000,
		"the progress message with ⚡ Steer now",
	);
	assert.match(progress.plain_text, /📨 1 message waits for the next turn/);
	assert.equal(
		world.model.completions.filter((r) => userTexts(r).includes(steered)).length,
		0,
		"it waits in the relay: pi has not got it",
	);

	await world.bot.tap(topic.thread_id, progress.message_id, "steer");
	await pi.waitFor((e) => e.type === "queue_update" && e.steering?.includes(steered), {
		ms: 30_000,
		from,
		what: "pi to hold the message as steering",
	});
	await writeFile(gate, "");
	const end = await pi.waitFor((e) => e.type === "agent_end", { ms: 30_000, from, what: "the end of the turn" });

	// One run: the prompt, then the request after bash with the steered text in it.
	const [first, second] = world.model.completions;
	assert.equal(world.model.completions.length, 2, "the steered text made no turn of its own");
	assert.ok(!userTexts(first).includes(steered));
	assert.ok(userTexts(second).includes(steered), `within the turn: ${JSON.stringify(userTexts(second))}`);
	assert.ok(end.messages.some((m) => m.role === "user" && JSON.stringify(m.content).includes(steered)));
	const tapped = await eventually(
		async () => (await world.bot.message(progress.message_id)),
		10_000,
		"the progress message",
	);
	assert.equal(steerButton(tapped), undefined, "the button goes once nothing waits");

	// Given once: the next message is a turn of its own, and the model's history holds
	// the steered text once.
	from = pi.mark();
	await world.bot.injectMessage(topic.thread_id, "and now?");
	await pi.waitFor((e) => e.type === "agent_end", { ms: 30_000, from, what: "the next turn's end" });
	const last = world.model.completions.at(-1);
	assert.deepEqual(
		userTexts(last).filter((text) => text.includes(steered)),
		[steered],
		"the steered message is in the history once",
	);
	const taps = await world.bot.callbackQueries();
	assert.ok(taps.every((q) => q.answer !== null), `every tap's spinner ended: ${JSON.stringify(taps)}`);
});

test("a message written mid-turn starts the next turn when nobody steers", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	await world.relayConfig('[approvals]\nmode = "off"\n');
	const pi = await world.startPi("alpha");
	await pi.bound();
	const topic = await world.topicOf("alpha");
	const gate = join(world.root, "go");
	const wait = `while [ ! -e ${gate} ]; do sleep 0.1; done; echo released`;

	const from = pi.mark();
	await world.bot.injectMessage(topic.thread_id, `work [[tool:bash ${JSON.stringify({ command: wait })}]]`);
	await pi.waitFor((e) => e.type === "tool_execution_start", { ms: 30_000, from, what: "bash to start" });
	await world.bot.injectMessage(topic.thread_id, "later, please");
	await eventually(
		async () => (await world.bot.messages(topic.thread_id)).find((m) => steerButton(m)),
		30_000,
		"the progress message with ⚡ Steer now",
	);
	await writeFile(gate, "");
	await pi.waitFor((e) => e.type === "agent_end", { ms: 30_000, from, what: "the first turn's end" });
	const next = await eventually(
		async () => world.model.completions.find((r) => r.lastUserText === "later, please"),
		30_000,
		"the next turn's request",
	);
	assert.equal(next.toolResults.length, 0, "a turn of its own");
	assert.equal(world.model.prompts.filter((p) => p === "later, please").length, 1);
});
