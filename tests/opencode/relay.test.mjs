// `agent-relay opencode` with the real OpenCode TUI in a tmux pseudo-terminal (not a
// stand-in client): the TUI (`opencode attach`) and the relay are two clients of the
// wrapper's private `opencode serve`, the fake Bot API is Telegram, the fake
// OpenAI-compatible API the model.

import assert from "node:assert/strict";
import { existsSync, readdirSync, readFileSync, watch } from "node:fs";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { test } from "node:test";
import { button, CHAT_ID, eventually, isRunning, treeOf, USER_ID, World } from "./harness.mjs";

/** A shell command the fake model runs through OpenCode's `bash` tool. */
const bash = (command) => `[[tool:bash ${JSON.stringify({ command, description: "the test asks" })}]]`;

/** Starts the wrapper and a session in it, typed at the terminal; the session's topic. */
async function session(world, args = []) {
	const wrapper = await world.wrapper(args);
	await world.type("hello from the terminal");
	const topic = await world.topic();
	await world.telegram.said(topic.thread_id, (text) => text.includes("echo: hello from the terminal"), { what: "the terminal's turn's answer" });
	return { wrapper, topic };
}

test("the TUI's session gets a topic, what is typed there is mirrored, a phone message is a turn the TUI shows, and nothing outlives the TUI", async (t) => {
	const world = await World.create(t);
	const { wrapper, topic } = await session(world);
	assert.match(topic.name, /project/);
	await world.telegram.said(topic.thread_id, (text) => text.includes("hello from the terminal") && !text.includes("echo"), { what: "the typed prompt, mirrored" });
	const asked = performance.now();
	await world.telegram.injectMessage(topic.thread_id, "hello from the phone");
	await world.telegram.said(topic.thread_id, (text) => text.includes("echo: hello from the phone"), { what: "the answer" });
	t.diagnostic(`phone → answer: ${(performance.now() - asked).toFixed(0)} ms (the message injected into the fake Bot API → the answer sent to the topic)`);
	await world.shows(/hello from the phone/, 30_000, "the phone's message");
	await world.shows(/echo: hello from the phone/, 30_000, "the answer in the TUI");
	const messages = await world.telegram.messages(topic.thread_id);
	assert.equal(messages.filter((m) => m.plain_text.includes("echo: hello from the phone")).length, 1, "one message for the turn");
	const tree = treeOf(wrapper);
	assert.ok(tree.length >= 3, `the wrapper, the TUI, the server: ${tree}`);
	await world.quit();
	assert.equal(await world.exited(), 0);
	await eventually(() => tree.every((pid) => !isRunning(pid)) && world.servers().length === 0, 15_000, "nothing of the wrapper to be running");
	assert.deepEqual(readdirSync(join(world.relayHome, "run")).filter((n) => n.startsWith("opencode-")), [], "the private folder is gone");
});

test("a permission ask reaches the phone: Allow runs the command, Deny does not and the model hears why, and the terminal answering first closes the phone's message", async (t) => {
	const world = await World.create(t);
	const { topic } = await session(world);

	await world.telegram.injectMessage(topic.thread_id, `make it ${bash("touch allowed-by-phone")}`);
	const allow = await world.asked(topic.thread_id, "allowed-by-phone");
	assert.ok(!existsSync(join(world.project, "allowed-by-phone")), "nothing runs before the tap");
	const ran = new Promise((done) => {
		const watcher = watch(world.project, (_, name) => {
			if (name === "allowed-by-phone") {
				done(performance.now());
				watcher.close();
			}
		});
		t.after(() => watcher.close());
	});
	const tapped = performance.now();
	await world.telegram.tap(topic.thread_id, allow.message_id, button(allow, "Allow"));
	const ranAt = await Promise.race([ran, new Promise((_, fail) => setTimeout(() => fail(new Error("the allowed command did not run")), 20_000))]);
	t.diagnostic(`tap → command ran: ${(ranAt - tapped).toFixed(0)} ms (the tap injected into the fake Bot API → the command's file created)`);
	const allowed = await world.settled(allow.message_id);
	t.diagnostic(`the phone asked:\n${allow.plain_text}\nbuttons: ${allow.reply_markup.inline_keyboard.flat().map((b) => b.text).join(" | ")}\nand after the tap:\n${allowed.plain_text}`);
	await world.telegram.said(topic.thread_id, (text) => text.includes("tool bash returned"), { what: "the turn's answer" });

	await world.telegram.injectMessage(topic.thread_id, `now this ${bash("touch denied-by-phone")}`);
	const deny = await world.asked(topic.thread_id, "denied-by-phone");
	await world.telegram.tap(topic.thread_id, deny.message_id, button(deny, "Deny"));
	await world.settled(deny.message_id);
	const refused = await world.fake.next((r) => r.toolResults.length > 0 && r.lastUserText.includes("now this"));
	t.diagnostic(`the model heard: ${JSON.stringify(refused.toolResults)}`);
	assert.match(refused.toolResults[0].content, /rejected/);
	assert.ok(!existsSync(join(world.project, "denied-by-phone")), "Deny blocked the command");

	await world.telegram.injectMessage(topic.thread_id, `and this ${bash("touch allowed-at-terminal")}`);
	const third = await world.asked(topic.thread_id, "allowed-at-terminal");
	await world.shows(/Permission required[\s\S]*allowed-at-terminal/, 30_000, "the TUI's own permission dialog");
	t.diagnostic(`the terminal showed:\n${await world.screen()}`);
	await world.keys("Enter");
	await eventually(() => existsSync(join(world.project, "allowed-at-terminal")), 20_000, "the command the terminal allowed");
	const closed = await world.settled(third.message_id);
	t.diagnostic(`the phone's message after the terminal answered:\n${closed.plain_text}`);
	assert.match(closed.plain_text, /terminal/i, "the phone's message says the terminal answered");
});

test("OpenCode's question reaches the phone: a tap answers it, a reply answers it, and the terminal answering first closes it", async (t) => {
	const world = await World.create(t);
	const { topic } = await session(world);
	const ask = (question) => ({
		toolCall: {
			name: "question",
			arguments: { questions: [{ question, header: "Pick", options: [{ label: "Red", description: "warm" }, { label: "Blue", description: "cool" }] }] },
		},
	});

	world.fake.queue(ask("Which color first?"));
	await world.telegram.injectMessage(topic.thread_id, "ask me");
	const first = await world.asked(topic.thread_id, "Which color first?");
	t.diagnostic(`the phone asked:\n${first.plain_text}\nbuttons: ${first.reply_markup.inline_keyboard.flat().map((b) => b.text).join(" | ")}`);
	await world.telegram.tap(topic.thread_id, first.message_id, button(first, "Blue"));
	const tapped = await world.fake.next((r) => r.toolResults.length > 0 && r.lastUserText === "ask me");
	assert.match(tapped.toolResults[0].content, /"Which color first\?"="Blue"/, "OpenCode got the tapped option");
	await world.telegram.said(topic.thread_id, (text) => text.includes("tool question returned") && text.includes("Blue"), { what: "the turn's answer" });

	world.fake.queue(ask("Which shade then?"));
	await world.telegram.injectMessage(topic.thread_id, "ask again");
	const second = await world.asked(topic.thread_id, "Which shade then?");
	await world.telegram.control("POST", "inject_message", {
		chat_id: CHAT_ID,
		thread_id: topic.thread_id,
		user_id: USER_ID,
		text: "a deep green",
		reply_to_message_id: second.message_id,
	});
	const replied = await world.fake.next((r) => r.toolResults.length > 0 && r.lastUserText === "ask again");
	assert.match(replied.toolResults[0].content, /"Which shade then\?"="a deep green"/, "OpenCode got the reply");
	await world.settled(second.message_id);

	world.fake.queue(ask("Which one at the keyboard?"));
	await world.telegram.injectMessage(topic.thread_id, "ask the keyboard");
	const third = await world.asked(topic.thread_id, "Which one at the keyboard?");
	await world.shows(/Which one at the keyboard\?[\s\S]*Red/, 30_000, "the TUI's own question");
	await world.keys("Enter");
	const answered = await world.fake.next((r) => r.toolResults.length > 0 && r.lastUserText === "ask the keyboard");
	assert.match(answered.toolResults[0].content, /="Red"/, "the terminal's answer");
	await world.settled(third.message_id);
});

test("/stop aborts the running turn", async (t) => {
	const world = await World.create(t);
	const { topic } = await session(world);
	await world.telegram.injectMessage(topic.thread_id, "a long one [[hang]]");
	const held = await world.fake.next((r) => r.lastUserText.includes("a long one"));
	await world.shows(/thinking…/, 30_000, "the turn under way in the TUI");
	await world.telegram.injectMessage(topic.thread_id, "/stop");
	await world.telegram.said(topic.thread_id, (text) => text === "⏹ Stopped.", { what: "the stop" });
	await eventually(() => held.aborted, 20_000, "the model's request given up");
	await world.shows(/interrupted/i, 30_000, "the TUI to show the interrupt");
	await world.telegram.injectMessage(topic.thread_id, "after the stop");
	await world.telegram.said(topic.thread_id, (text) => text === "echo: after the stop", { what: "a turn after /stop" });
});

test("OpenCode's own retries: a 503 and a stream cut it tries again are no failure and no answer; a turn whose every try fails is said once, with the error", async (t) => {
	const world = await World.create(t);
	const { topic } = await session(world);
	const texts = async () => (await world.telegram.messages(topic.thread_id)).map((m) => m.plain_text);
	const before = (await texts()).length;
	// OpenCode waits as long as the provider's `retry-after-ms` says (else 2 s, 4 s, …).
	const down = { error: { status: 503, message: "still down", retryAfterMs: 100 } };

	world.fake.queue(down);
	await world.telegram.injectMessage(topic.thread_id, "when it is busy");
	await world.telegram.said(topic.thread_id, (text) => text === "echo: when it is busy", { ms: 60_000, what: "the answer after the retry" });
	world.fake.queue({ cut: "Half an answer that" });
	await world.telegram.injectMessage(topic.thread_id, "when the line drops");
	await world.telegram.said(topic.thread_id, (text) => text === "echo: when the line drops", { ms: 60_000, what: "the answer after the cut" });

	// OpenCode tries five more times, then gives up.
	world.fake.queue(down, down, down, down, down, down);
	await world.telegram.injectMessage(topic.thread_id, "and now?");
	const said = await world.telegram.said(topic.thread_id, (text) => text.startsWith("⚠️ The turn failed:"), { ms: 60_000, what: "the failure in the topic" });
	assert.equal(said.plain_text, "⚠️ The turn failed: 503 still down. No answer came of it.");
	assert.equal(world.fake.steps.length, 0, "every try was made");

	await world.telegram.injectMessage(topic.thread_id, "and again?");
	await world.telegram.said(topic.thread_id, (text) => text === "echo: and again?", { what: "the next turn's answer" });
	const all = (await texts()).slice(before).filter((text) => !text.startsWith("🟢"));
	assert.deepEqual(
		all,
		["echo: when it is busy", "echo: when the line drops", said.plain_text, "echo: and again?"],
		"each answer once, the failure once, no broken text and nothing else of the tries",
	);
});

test("files both ways: a photo from the phone reaches the model as an image; the relay's send_file sends a project file, and refuses one outside it", async (t) => {
	const world = await World.create(t, { relayConfig: ["[approvals]", 'mode = "off"'] });
	const { topic } = await session(world);
	// A 1×1 PNG sent "as a photo".
	const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
	await world.telegram.injectMedia(topic.thread_id, "what is in the picture", { kind: "photo", data_base64: png });
	const seen = await world.fake.next((r) => r.lastUserText.includes("what is in the picture"));
	assert.equal(seen.images.length, 1, `the photo as an image part: ${JSON.stringify(seen.body.messages.at(-1))}`);
	assert.match(seen.images[0], /^data:image\//);

	const report = "line one\nline two\n";
	await writeFile(join(world.project, "report.txt"), report);
	world.fake.queue({ toolCall: { name: "agent_relay_send_file", arguments: { path: "report.txt", caption: "the report" } } });
	await world.telegram.injectMessage(topic.thread_id, "send me the report");
	const sent = await world.telegram.said(topic.thread_id, (plain) => plain === "the report", { what: "the file in the topic" });
	assert.equal(sent.media.kind, "document");
	assert.equal((await world.telegram.fileContent(sent.media.file_id)).toString("utf8"), report, "Telegram got the file byte for byte");
	const answered = await world.fake.next((r) => r.toolResults.length > 0 && r.lastUserText === "send me the report");
	assert.match(answered.toolResults[0].content, /Sent report\.txt to the Telegram topic as a document/);

	world.fake.queue({ toolCall: { name: "agent_relay_send_file", arguments: { path: "/etc/hostname" } } });
	await world.telegram.injectMessage(topic.thread_id, "send me the hostname");
	const refused = await world.fake.next((r) => r.toolResults.length > 0 && r.lastUserText === "send me the hostname");
	t.diagnostic(`the model heard: ${JSON.stringify(refused.toolResults)}`);
	assert.match(refused.toolResults[0].content, /Not sent: .*\/etc\/hostname is outside/);
	const uploads = (await world.telegram.calls()).filter((c) => c.method === "sendDocument" || c.method === "sendPhoto");
	assert.equal(uploads.length, 1, "only the report was uploaded");
	assert.ok(!readFileSync(world.opencodeConfig, "utf8").includes("agent_relay"), "the tool is added to the running server, not to the user's config");
});

test("resume keeps the topic", async (t) => {
	const world = await World.create(t);
	const { topic } = await session(world);
	await world.quit();
	assert.equal(await world.exited(), 0);
	await world.wrapper(["--continue"]);
	await world.shows(/echo: hello from the terminal/, 30_000, "the continued session");
	await world.type("again from the terminal");
	await world.telegram.said(topic.thread_id, (text) => text.includes("echo: again from the terminal"), { what: "the continued session's answer" });
	await world.telegram.injectMessage(topic.thread_id, "and from the phone");
	await world.telegram.said(topic.thread_id, (text) => text.includes("echo: and from the phone"), { what: "the phone's turn" });
	assert.equal((await world.topic()).thread_id, topic.thread_id, "the same topic");
});

for (const signal of ["SIGINT", "SIGTERM"]) {
	test(`${signal} to the wrapper leaves nothing running`, async (t) => {
		const world = await World.create(t);
		const { wrapper } = await session(world);
		const tree = treeOf(wrapper);
		process.kill(wrapper, signal);
		await world.exited();
		await eventually(() => tree.every((pid) => !isRunning(pid)) && world.servers().length === 0, 15_000, "nothing of the wrapper to be running");
	});
}
