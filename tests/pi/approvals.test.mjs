// Control from the phone with the real pi: a tool call of a turn that came from
// Telegram waits for a tap in the session's topic, the agent's own question
// (ask_user) is answered from the phone, the terminal can answer first, and the
// progress message follows the turn within the pacing.

import assert from "node:assert/strict";
import { test } from "node:test";
import { button, eventually, isSettled, question, tapAnswer, World } from "./harness.mjs";

const TEST_MS = 120_000;

async function boundPi(world, name) {
	const pi = await world.startPi(name);
	await pi.bound();
	const topic = await world.topicOf(name);
	assert.ok(topic, `pi ${name} has a topic`);
	return { pi, topic };
}

/** The message once settled: its buttons gave way to one disabled button that says how. */
function settled(world, messageId) {
	return eventually(
		async () => {
			const m = await world.bot.message(messageId);
			return isSettled(m) ? m : undefined;
		},
		15_000,
		`message ${messageId} settled`,
	);
}

test("a tool call from a Telegram turn waits for Allow on the phone, then runs", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const { pi, topic } = await boundPi(world, "alpha");
	const from = pi.mark();
	await world.bot.injectMessage(topic.thread_id, 'clean up [[tool:bash {"command":"echo approved-run"}]]');

	const asked = await question(world, topic.thread_id, "echo approved-run");
	assert.match(asked.plain_text, /bash wants to run/);
	// The progress message shows the call waiting, not running.
	const waiting = await world.bot.said(topic.thread_id, (plain) => plain.includes("🔐 bash: $ echo approved-run — waits for your approval"), {
		what: "the progress message showing the call waiting",
	});
	assert.match(waiting.plain_text, /^⏸ Waiting · 0 tools · /);
	// The tool has not run: pi waits in its tool_call handler.
	assert.equal(pi.events.slice(from).filter((e) => e.type === "tool_execution_end").length, 0);

	// A stranger's tap changes nothing (and is answered).
	const stranger = await world.bot.tap(topic.thread_id, asked.message_id, button(asked, "Allow"), 4242);
	assert.match((await tapAnswer(world, stranger.callback_query_id)).text, /not allowed/);
	assert.equal(pi.events.slice(from).filter((e) => e.type === "tool_execution_end").length, 0);

	const tapped = Date.now();
	const allow = await world.bot.tap(topic.thread_id, asked.message_id, button(asked, "Allow"));
	const ended = await pi.waitFor((e) => e.type === "tool_execution_end", { ms: 30_000, from, what: "bash to run" });
	const tapToRun = Date.now() - tapped;
	console.log(`tap to tool run (echo), real pi: ${tapToRun} ms`);
	assert.equal(ended.isError, false);
	assert.match(ended.result.content[0].text, /approved-run/);
	assert.equal((await tapAnswer(world, allow.callback_query_id)).text, "✅ Allow");
	const shown = await settled(world, asked.message_id);
	assert.match(shown.plain_text, /✅ Allow — .*, \d\d:\d\d UTC/);

	// A second tap changes nothing.
	const again = await world.bot.tap(topic.thread_id, asked.message_id, button(asked, "Deny"));
	assert.equal((await tapAnswer(world, again.callback_query_id)).text, "Already answered.");
	await world.bot.said(topic.thread_id, (plain) => plain.includes("tool bash returned: approved-run"), {
		what: "the answer with the tool's output",
	});
	// The same message became the summary: the allowed call ran.
	await eventually(
		async () => /^✓ · 1 tool · \d+:\d\d$/.test((await world.bot.message(waiting.message_id)).plain_text),
		30_000,
		"the summary counting the call that ran",
	);
});

test("Deny blocks the call and pi sees why", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const { pi, topic } = await boundPi(world, "alpha");
	const from = pi.mark();
	await world.bot.injectMessage(topic.thread_id, 'go [[tool:bash {"command":"echo never-run"}]]');
	const asked = await question(world, topic.thread_id, "echo never-run");
	const waiting = await world.bot.said(topic.thread_id, (plain) => plain.includes("— waits for your approval"), {
		what: "the progress message showing the call waiting",
	});
	await world.bot.tap(topic.thread_id, asked.message_id, button(asked, "Deny"));
	const ended = await pi.waitFor((e) => e.type === "tool_execution_end", { ms: 30_000, from, what: "the blocked call" });
	assert.equal(ended.isError, true);
	assert.match(ended.result.content[0].text, /denied/);
	await world.bot.said(topic.thread_id, (plain) => plain.includes("tool bash returned: ") && plain.includes("denied this bash call on the phone"), {
		what: "the model's answer naming the denial",
	});
	// A denied call is not counted as a tool that ran.
	await eventually(
		async () => /^✓ · 0 tools · 1 denied · \d+:\d\d$/.test((await world.bot.message(waiting.message_id)).plain_text),
		30_000,
		"the summary counting the call as denied",
	);
});

test("no answer denies after the timeout, and the message says so", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	await world.relayConfig("[approvals]\ntimeout_s = 5\n");
	const { pi, topic } = await boundPi(world, "alpha");
	const from = pi.mark();
	await world.bot.injectMessage(topic.thread_id, 'go [[tool:bash {"command":"echo too-late"}]]');
	const asked = await question(world, topic.thread_id, "echo too-late");
	const ended = await pi.waitFor((e) => e.type === "tool_execution_end", { ms: 30_000, from, what: "the timed-out call" });
	assert.equal(ended.isError, true);
	assert.match(ended.result.content[0].text, /nobody answered in time/);
	const shown = await settled(world, asked.message_id);
	assert.match(shown.plain_text, /No answer within 5 s: denied/);
});

test("the terminal answering first closes the phone's question", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	await world.relayConfig('[approvals]\nmode = "both"\n');
	const { pi, topic } = await boundPi(world, "alpha");
	const from = pi.mark();
	await world.bot.injectMessage(topic.thread_id, 'go [[tool:bash {"command":"echo from-terminal"}]]');
	const select = await pi.uiRequest("select", (e) => e.title.includes("Allow bash?"), { ms: 30_000, from });
	assert.ok(select.options.includes("✅ Allow"), JSON.stringify(select.options));
	const asked = await question(world, topic.thread_id, "echo from-terminal");
	pi.send({ type: "extension_ui_response", id: select.id, value: "✅ Allow" });
	const ended = await pi.waitFor((e) => e.type === "tool_execution_end", { ms: 30_000, from, what: "bash to run" });
	assert.equal(ended.isError, false);
	const shown = await settled(world, asked.message_id);
	assert.match(shown.plain_text, /✅ Allow — at the terminal/);
});

test("the agent's question is answered from the phone", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const { pi, topic } = await boundPi(world, "alpha");
	const from = pi.mark();
	await world.bot.injectMessage(
		topic.thread_id,
		'decide [[tool:ask_user {"question":"Which database?","options":["staging","production"]}]]',
	);
	// The same question opens at the terminal (pi's select dialog)…
	await pi.uiRequest("select", (e) => e.title.includes("Which database?"), { ms: 30_000, from });
	// …and on the phone, where it is answered first.
	const asked = await question(world, topic.thread_id, "Which database?");
	await world.bot.tap(topic.thread_id, asked.message_id, button(asked, "staging"));
	const ended = await pi.waitFor((e) => e.type === "tool_execution_end" && e.toolName === "ask_user", {
		ms: 30_000,
		from,
		what: "ask_user to return",
	});
	assert.equal(ended.result.content[0].text, "The user answered on the phone: staging");
	await world.bot.said(topic.thread_id, (plain) => plain.includes("tool ask_user returned: The user answered on the phone: staging"), {
		what: "the model's answer with the user's choice",
	});
});

test("one progress message follows a turn with tools, edited within the pacing", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	await world.relayConfig("[approvals]\nmode = \"off\"\n");
	const { pi, topic } = await boundPi(world, "alpha");
	// Three tools, each sleeping long enough that the turn spans two edit windows.
	for (const n of [1, 2, 3]) {
		world.model.queue({ toolCall: { name: "bash", arguments: { command: `sleep 4; echo step-${n}` } } });
	}
	world.model.queue({ text: "all three steps done" });
	const from = pi.mark();
	await world.bot.injectMessage(topic.thread_id, "run the three steps");
	await pi.waitFor((e) => e.type === "agent_end", { ms: 60_000, from, what: "the end of the turn" });
	await world.bot.said(topic.thread_id, (plain) => plain.includes("all three steps done"), { what: "the answer" });
	const progress = (await world.bot.messages(topic.thread_id)).filter((m) => m.plain_text.includes("3 tools"));
	assert.equal(progress.length, 1, "one progress message, not one per tool");
	// The summary edit follows the answer on its own (it waits behind answers for
	// the chat's budget), so it is awaited, not read at once.
	const summary = /^✓ · 3 tools · \d+:\d\d$/;
	const full = await eventually(
		async () => {
			const message = await world.bot.message(progress[0].message_id);
			return summary.test(message.plain_text) && message;
		},
		15_000,
		"the progress message turned into the turn's summary",
	);
	const edits = full.history.map((v) => v.at_ms);
	for (let i = 2; i < edits.length; i++) {
		// Between two progress updates at least the group's 10 s (the final summary
		// may follow the last update at once).
		assert.ok(edits[i - 1] - edits[i - 2] >= 9_500, `edits ${JSON.stringify(edits)} keep the pace`);
	}
});
