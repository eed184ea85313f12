// Several people on one bot with the real pi (issue 38): receipts on each
// person's own message (taken at once, taken by the next turn), an approval
// that only its requester or an owner decides, and a viewer whose message
// reaches no agent. Prints the figures the issue asks for: reactions a turn,
// the refused ones, and the time from a message to its "taken" mark (as the
// test sees it, looking every 10 ms).

import assert from "node:assert/strict";
import { test } from "node:test";
import { button, CHAT_ID, question, tapAnswer, World } from "./harness.mjs";

const TEST_MS = 120_000;
const ANN = 501;
const BOB = 502;
const VERA = 503;

/** The bot's reaction calls on message `messageId`, as the fake recorded them. */
async function reactionsOn(world, messageId) {
	return (await world.bot.calls()).filter((c) => c.method === "setMessageReaction" && c.params.message_id === messageId);
}

/** Waits (looking every 10 ms) until message `messageId` carries `emoji` as the bot's reaction; the call that set it. */
async function marked(world, messageId, emoji) {
	const until = Date.now() + 30_000;
	for (;;) {
		const call = (await reactionsOn(world, messageId)).find((c) => c.status === 200 && JSON.stringify(c.params.reaction ?? "").includes(emoji));
		if (call) return call;
		if (Date.now() > until) throw new Error(`timed out waiting for ${emoji} on message ${messageId}`);
		await new Promise((r) => setTimeout(r, 10));
	}
}

test("two drivers and a viewer with the real pi: receipts, an approval only its requester or an owner decides, a viewer reaches no agent", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	await world.relayConfig(`[access]\ndrivers = [${ANN}, ${BOB}]\nviewers = [${VERA}]\n[approvals]\nby = "requester"\n`);
	const pi = await world.startPi("alpha");
	await pi.bound();
	const topic = await world.topicOf("alpha");
	const from = pi.mark();

	// Ann's message goes to an idle pi: taken at once.
	const written = Date.now();
	const anns = await world.bot.injectMessage(topic.thread_id, 'clean up [[tool:bash {"command":"echo team-run"}]]', ANN);
	await marked(world, anns.message_id, "👀");
	const toMark = Date.now() - written;

	// Its approval is Ann's: Bob's tap and Vera's change nothing.
	const asked = await question(world, topic.thread_id, "echo team-run");
	const byBob = await world.bot.tap(topic.thread_id, asked.message_id, button(asked, "Allow"), BOB);
	assert.match((await tapAnswer(world, byBob.callback_query_id)).text, /^Not yours/);
	const byVera = await world.bot.tap(topic.thread_id, asked.message_id, button(asked, "Allow"), VERA);
	assert.match((await tapAnswer(world, byVera.callback_query_id)).text, /viewer/);
	assert.equal(pi.events.slice(from).filter((e) => e.type === "tool_execution_end").length, 0, "nothing ran on their taps");

	// Mid-turn: Bob's message waits for the next turn, and is not marked yet; Vera's reaches no agent.
	const bobs = await world.bot.injectMessage(topic.thread_id, "and then the docs", BOB);
	const veras = await world.bot.injectMessage(topic.thread_id, "vera-was-here", VERA);
	await world.bot.said(topic.thread_id, (plain) => plain.includes("You are a viewer here"), { what: "the viewer told why" });
	assert.equal((await reactionsOn(world, bobs.message_id)).length, 0, "a queued message is not marked before a turn takes it");

	// Ann allows: the call runs, then the next turn takes Bob's message and marks it.
	await world.bot.tap(topic.thread_id, asked.message_id, button(asked, "Allow"), ANN);
	const ended = await pi.waitFor((e) => e.type === "tool_execution_end", { ms: 30_000, from, what: "bash to run" });
	assert.equal(ended.isError, false);
	await world.bot.said(topic.thread_id, (plain) => plain.includes("tool bash returned: team-run"), { what: "the answer of Ann's turn" });
	await marked(world, bobs.message_id, "👀");
	await world.bot.said(topic.thread_id, (plain) => plain.includes("echo: and then the docs"), { what: "the answer of Bob's message" });
	assert.ok(!world.model.prompts.some((p) => p.includes("vera-was-here")), "the viewer's message reached no model");
	assert.equal((await reactionsOn(world, veras.message_id)).length, 0, "nor was it marked as taken");

	const reactions = (await world.bot.calls()).filter((c) => c.method === "setMessageReaction");
	const refused = reactions.filter((c) => c.status !== 200);
	console.log(
		`receipts with the real pi: ${reactions.length} reactions for 2 turns (${reactions.length / 2} a turn), ${refused.length} refused (429 or other), message → 👀 ${toMark} ms`,
	);
	assert.equal(refused.length, 0);
	assert.ok(reactions.every((c) => c.params.chat_id === CHAT_ID));
});
