// End-to-end whole turns: a message written into a session's topic in the fake
// Telegram reaches the real pi as a prompt, pi asks the fake model
// (fake-model.mjs), runs the tools it asks for, and the answer lands back in the
// topic through the real sidecar.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";
import { join } from "node:path";
import { EXTENSION, World } from "./harness.mjs";

const TEST_MS = 120_000;

/** A bound pi named `name` and its topic. */
async function boundPi(world, name) {
	const pi = await world.startPi(name);
	await pi.bound();
	const topic = await world.topicOf(name);
	assert.ok(topic, `pi ${name} has a topic`);
	return { pi, topic };
}

test("a message in the topic becomes a turn of pi on the fake model, and its answer lands in the topic", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const { pi, topic } = await boundPi(world, "alpha");

	const text = `hello from the phone ${randomUUID()}`;
	const from = pi.mark();
	await world.bot.injectMessage(topic.thread_id, text);

	const end = await pi.waitFor((e) => e.type === "agent_end", { ms: 30_000, from, what: "the end of the turn" });
	const answer = end.messages.findLast((m) => m.role === "assistant");
	assert.equal(answer.stopReason, "stop");
	assert.deepEqual(answer.content, [{ type: "text", text: `echo: ${text}` }]);

	const said = await world.bot.said(topic.thread_id, (plain) => plain.includes(`echo: ${text}`), {
		what: "the model's answer in the topic",
	});
	assert.ok(said.message_id);

	const [request] = world.model.completions;
	assert.equal(world.model.completions.length, 1, "one model call for a text answer");
	assert.equal(request.body.stream, true);
	assert.deepEqual(request.body.stream_options, { include_usage: true });
	assert.equal(request.body.model, "echo");
	assert.equal(request.lastUserText, text);
	assert.ok(request.tools.includes("bash"), `pi offers its bash tool: ${request.tools}`);
	assert.equal(request.body.messages[0].role, "system", "pi sends its system prompt first");
});

test("the fake model asks for bash; pi runs it and the answer with its output lands in the topic", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	// Approvals are tests/pi/approvals.test.mjs's subject; here bash just runs.
	await world.relayConfig('[approvals]\nmode = "off"\n');
	const { pi, topic } = await boundPi(world, "alpha");

	const from = pi.mark();
	await world.bot.injectMessage(topic.thread_id, 'please run [[tool:bash {"command":"echo hello"}]]');

	const started = await pi.waitFor((e) => e.type === "tool_execution_start", { ms: 30_000, from, what: "bash to start" });
	assert.equal(started.toolName, "bash");
	assert.deepEqual(started.args, { command: "echo hello" });
	const ended = await pi.waitFor((e) => e.type === "tool_execution_end", { ms: 30_000, from, what: "bash to end" });
	assert.equal(ended.isError, false);
	assert.match(ended.result.content[0].text, /^hello\n?$/);
	await pi.waitFor((e) => e.type === "agent_end", { ms: 30_000, from, what: "the end of the turn" });

	await world.bot.said(topic.thread_id, (plain) => plain.includes("tool bash returned: hello"), {
		what: "the final answer with bash's output in the topic",
	});

	// Two model calls: the prompt (answered with the tool call), then the tool result.
	const [first, second] = world.model.completions;
	assert.equal(world.model.completions.length, 2);
	assert.equal(first.toolResults.length, 0);
	assert.equal(second.toolResults.length, 1);
	assert.match(second.toolResults[0].content, /^hello\n?$/);
	const call = second.body.messages.findLast((m) => m.role === "assistant").tool_calls[0];
	assert.equal(call.id, second.toolResults[0].toolCallId, "the result answers the call");
	assert.deepEqual(JSON.parse(call.function.arguments), { command: "echo hello" });
	assert.deepEqual(world.model.prompts, [first.lastUserText], "a tool result is not a new prompt");
});

// A 1×1 transparent PNG.
const PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

test("an image in a prompt reaches the model as an image_url part", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const pi = await world.startPi("alpha");

	const from = pi.mark();
	// docs/rpc.md "prompt": images are ImageContent {type, data, mimeType}.
	const response = await pi.request({
		type: "prompt",
		message: "what is in this picture?",
		images: [{ type: "image", data: PNG, mimeType: "image/png" }],
	});
	assert.equal(response.success, true);
	await pi.waitFor((e) => e.type === "agent_end", { ms: 30_000, from, what: "the end of the turn" });

	const [request] = world.model.completions;
	assert.deepEqual(request.images, [{ role: "user", url: `data:image/png;base64,${PNG}` }]);
	assert.equal(request.lastUserText, "what is in this picture?");
});

test("aborting a turn while the model streams ends it as aborted", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const pi = await world.startPi("alpha");
	world.model.queue({ hang: true, text: "thinking about it" });

	const from = pi.mark();
	await pi.prompt("take your time");
	await pi.waitFor(
		(e) => e.type === "message_update" && e.assistantMessageEvent?.type === "text_delta",
		{ ms: 30_000, from, what: "the first streamed words" },
	);
	assert.equal((await pi.request({ type: "abort" })).success, true);

	const end = await pi.waitFor((e) => e.type === "agent_end", { ms: 30_000, from, what: "the aborted turn's end" });
	const answer = end.messages.findLast((m) => m.role === "assistant");
	assert.equal(answer.stopReason, "aborted");
	const [request] = world.model.completions;
	await new Promise((r) => setTimeout(r, 100));
	assert.equal(request.aborted, true, "pi closed the model's stream");
});

test("a model error ends the turn with stopReason error, asked once (retries are off)", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const pi = await world.startPi("alpha");
	world.model.queue({ error: { status: 500, message: "the fake model is down" } });

	const from = pi.mark();
	await pi.prompt("hello");
	const end = await pi.waitFor((e) => e.type === "agent_end", { ms: 30_000, from, what: "the failed turn's end" });
	const answer = end.messages.findLast((m) => m.role === "assistant");
	assert.equal(answer.stopReason, "error");
	assert.equal(answer.errorMessage, "500 the fake model is down");
	assert.equal(world.model.completions.length, 1);
});

test("pi -p exits right after its answer and the answer still lands, Telegram slow", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	// A session first, so the topic and the relay exist; then Telegram slows down.
	const { pi } = await boundPi(world, "gamma");
	await pi.close();
	await world.bot.control("POST", "fault", { method: "sendMessage", fault: { kind: "delay", ms: 1000 }, until_cleared: true });
	const text = `one shot ${randomUUID()}`;
	const started = Date.now();
	const out = await world.piCommand(
		["-p", text, "--no-session", "--offline", "--provider", "fake", "--model", "echo", "-e", EXTENSION],
		{ cwd: join(world.root, "gamma") },
	);
	const took = Date.now() - started;
	assert.equal(out.code, 0, out.stderr);
	assert.match(out.stdout, new RegExp(`echo: ${text}`));
	const topic = await world.topicOf("gamma");
	await world.bot.said(topic.thread_id, (plain) => plain.includes(`echo: ${text}`), {
		what: "the answer of a pi -p that exited while Telegram was slow",
	});
	await world.bot.control("POST", "clear_faults");
	t.diagnostic(`pi -p took ${took} ms with Telegram taking 1 s a message`);
});
