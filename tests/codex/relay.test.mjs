// `agent-relay codex` with the real Codex TUI in a tmux pseudo-terminal (not a
// stand-in client): the TUI and the relay are two clients of the wrapper's
// private app-server, the fake Bot API is Telegram, the fake Responses API the
// model. Then plain `codex exec` with the hooks `agent-relay install codex` wrote.

import assert from "node:assert/strict";
import { existsSync, readdirSync, readFileSync, watch } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import { performance } from "node:perf_hooks";
import { join } from "node:path";
import { test } from "node:test";
import { CHAT_ID, CODEX, eventually, isOpen, isRunning, isSettled, processesOf, relaySendFile, SIDECAR, treeOf, USER_ID, World } from "./harness.mjs";

/** The approval message in `threadId` that mentions `text`. */
function asked(world, threadId, text) {
	return eventually(
		async () => (await world.telegram.messages(threadId)).find((m) => isOpen(m) && m.plain_text.includes(text)),
		30_000,
		`the approval message about ${text}`,
	);
}

function button(message, label) {
	const found = message.reply_markup.inline_keyboard.flat().find((b) => b.text.includes(label));
	assert.ok(found, `no ${label} in ${JSON.stringify(message.reply_markup)}`);
	return found.callback_data;
}

function settled(world, messageId) {
	return eventually(async () => {
		const m = await world.telegram.message(messageId);
		return isSettled(m) && m;
	}, 20_000, "the approval message to close");
}

/** What of the wrapper is still running, the app-server included. */
function leftOver(world, wrapperTree) {
	const stillThere = wrapperTree.filter(isRunning);
	const servers = processesOf(CODEX).filter((p) => p.cmdline.includes("app-server") && p.cmdline.includes(world.relayHome));
	return { stillThere, servers };
}

test("the TUI's thread gets a topic, a phone message starts a turn the TUI shows, the answer lands, and nothing outlives the TUI", async (t) => {
	const world = await World.create(t);
	const wrapper = await world.wrapper();
	const topic = await world.topic();
	assert.match(topic.name, /project/);
	const asked = performance.now();
	await world.telegram.injectMessage(topic.thread_id, "hello from the phone");
	await world.telegram.said(topic.thread_id, (text) => text.includes("echo: hello from the phone"), { what: "the answer" });
	t.diagnostic(`phone → answer: ${(performance.now() - asked).toFixed(0)} ms (the message injected into the fake Bot API → the answer sent to the topic)`);
	await world.shows(/hello from the phone/, 30_000, "the phone's message");
	await world.shows(/echo: hello from the phone[\s\S]*Worked for/, 30_000, "the answer in the TUI, the turn done");
	const tree = treeOf(wrapper);
	assert.ok(tree.length >= 3, `the wrapper, the TUI, the app-server: ${tree}`);
	// The TUI quits (Ctrl-C twice on an idle composer); the wrapper follows.
	await world.quit();
	assert.equal(await world.exited(), 0);
	await eventually(() => {
		const { stillThere, servers } = leftOver(world, tree);
		return stillThere.length === 0 && servers.length === 0;
	}, 15_000, "nothing of the wrapper to be running");
	// The wrapper's folder is `<runtime>/codex-<pid>`, the runtime dir `run` under AGENT_RELAY_HOME.
	assert.ok(existsSync(join(world.relayHome, "run")), "the runtime dir the wrapper used");
	assert.deepEqual(readdirSync(join(world.relayHome, "run")).filter((n) => n.startsWith("codex-")), [], "the private folder is gone");
});

test("a command asks on the phone: Allow runs it, Deny does not, and the terminal answering first closes the phone's message", async (t) => {
	const world = await World.create(t);
	await world.wrapper();
	const topic = await world.topic();
	const escalated = (cmd) => `[[exec ${JSON.stringify({ cmd, sandbox_permissions: "require_escalated", justification: "the test asks" })}]]`;

	await world.telegram.injectMessage(topic.thread_id, `make it ${escalated("touch allowed-by-phone")}`);
	const allow = await asked(world, topic.thread_id, "allowed-by-phone");
	assert.ok(!existsSync(join(world.project, "allowed-by-phone")), "nothing runs before the tap");
	// The command's file appearing, seen by inotify: the tap-to-run time.
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
	assert.ok(existsSync(join(world.project, "allowed-by-phone")));
	const allowed = await settled(world, allow.message_id);
	t.diagnostic(`the phone asked:\n${allow.plain_text}\nbuttons: ${allow.reply_markup.inline_keyboard.flat().map((b) => b.text).join(" | ")}\nand after the tap:\n${allowed.plain_text}`);
	assert.match(allowed.plain_text, /Allow/);
	await world.telegram.said(topic.thread_id, (text) => text.includes("tool exec_command returned"), { what: "the turn's answer" });

	await world.telegram.injectMessage(topic.thread_id, `now this ${escalated("touch denied-by-phone")}`);
	const deny = await asked(world, topic.thread_id, "denied-by-phone");
	await world.telegram.tap(topic.thread_id, deny.message_id, button(deny, "Deny"));
	assert.match((await settled(world, deny.message_id)).plain_text, /Deny/);
	const refused = await world.fake.next((r) => r.toolOutput && r.lastUserText.includes("now this"));
	t.diagnostic(`the model heard: ${JSON.stringify(refused.toolOutput.output)}`);
	assert.ok(!existsSync(join(world.project, "denied-by-phone")), "Deny blocked the command");

	await world.telegram.injectMessage(topic.thread_id, `and this ${escalated("touch allowed-at-terminal")}`);
	const third = await asked(world, topic.thread_id, "allowed-at-terminal");
	await world.shows(/allowed-at-terminal/, 30_000, "the TUI's own approval dialog");
	t.diagnostic(`the terminal showed:\n${await world.screen()}`);
	await world.keys("y");
	await eventually(() => existsSync(join(world.project, "allowed-at-terminal")), 20_000, "the command the terminal allowed");
	const closed = await settled(world, third.message_id);
	t.diagnostic(`the phone's message after the terminal answered:\n${closed.plain_text}`);
	assert.match(closed.plain_text, /terminal/i, "the phone's message says the terminal answered");
});

/** The open question in `threadId` that mentions `text`. */
function question(world, threadId, text) {
	return eventually(
		async () => (await world.telegram.messages(threadId)).find((m) => isOpen(m) && m.plain_text.includes(text)),
		30_000,
		`the question about ${text}`,
	);
}

test("Codex's question (request_user_input) reaches the phone: a tap answers it, and so does a reply", async (t) => {
	// Codex 0.171 offers the model request_user_input, but answers it "unavailable in
	// Default mode" unless this feature is on (or the turn is in Plan mode).
	const world = await World.create(t, { features: ["default_mode_request_user_input = true"] });
	await world.wrapper();
	const topic = await world.topic();
	const ask = (id, question) => ({
		call: {
			name: "request_user_input",
			arguments: { questions: [{ id, header: "Pick", question, options: [{ label: "Red", description: "warm" }, { label: "Blue", description: "cool" }] }] },
		},
	});

	world.fake.queue(ask("color", "Which color first?"));
	await world.telegram.injectMessage(topic.thread_id, "ask me");
	const first = await question(world, topic.thread_id, "Which color first?");
	t.diagnostic(`the phone asked:\n${first.plain_text}\nbuttons: ${first.reply_markup.inline_keyboard.flat().map((b) => b.text).join(" | ")}`);
	await world.telegram.tap(topic.thread_id, first.message_id, button(first, "Blue"));
	const tapped = await world.fake.next((r) => r.toolName === "request_user_input" && r.lastUserText === "ask me");
	assert.deepEqual(JSON.parse(tapped.toolOutput.output), { answers: { color: { answers: ["Blue"] } } }, "Codex got the tapped option");
	await world.telegram.said(topic.thread_id, (text) => text.includes("tool request_user_input returned") && text.includes("Blue"), { what: "the turn's answer" });

	world.fake.queue(ask("shade", "Which shade then?"));
	await world.telegram.injectMessage(topic.thread_id, "ask again");
	const second = await question(world, topic.thread_id, "Which shade then?");
	await world.telegram.control("POST", "inject_message", {
		chat_id: CHAT_ID,
		thread_id: topic.thread_id,
		user_id: USER_ID,
		text: "a deep green",
		reply_to_message_id: second.message_id,
	});
	const replied = await world.fake.next((r) => r.toolName === "request_user_input" && r.lastUserText === "ask again");
	assert.deepEqual(JSON.parse(replied.toolOutput.output), { answers: { shade: { answers: ["a deep green"] } } }, "Codex got the reply");
	await settled(world, second.message_id);
});

test("a file change (apply_patch) asks on the phone: Allow applies it, Deny does not", async (t) => {
	const world = await World.create(t);
	// In a read-only sandbox every patch asks (workspace-write lets one under the
	// project, and /tmp, through without a word).
	await world.wrapper(["--sandbox", "read-only"]);
	const topic = await world.topic();
	const patch = (name) => ({ custom: { name: "apply_patch", input: `*** Begin Patch\n*** Add File: ${name}\n+written from the phone\n*** End Patch\n` } });

	world.fake.queue(patch("allowed.txt"));
	await world.telegram.injectMessage(topic.thread_id, "patch it");
	const allow = await asked(world, topic.thread_id, "allowed.txt");
	t.diagnostic(`the phone asked:\n${allow.plain_text}\nbuttons: ${allow.reply_markup.inline_keyboard.flat().map((b) => b.text).join(" | ")}`);
	assert.ok(!existsSync(join(world.project, "allowed.txt")), "nothing is written before the tap");
	await world.telegram.tap(topic.thread_id, allow.message_id, button(allow, "Allow"));
	await world.telegram.said(topic.thread_id, (text) => text.includes("tool apply_patch returned") && text.includes("Success"), { what: "the patch's result" });
	assert.equal(readFileSync(join(world.project, "allowed.txt"), "utf8"), "written from the phone\n", "Allow applied it");

	world.fake.queue(patch("denied.txt"));
	await world.telegram.injectMessage(topic.thread_id, "patch that");
	const deny = await asked(world, topic.thread_id, "denied.txt");
	await world.telegram.tap(topic.thread_id, deny.message_id, button(deny, "Deny"));
	const refused = await world.fake.next((r) => r.toolName === "apply_patch" && r.lastUserText === "patch that");
	t.diagnostic(`the model heard: ${JSON.stringify(refused.toolOutput.output)}`);
	assert.match(String(refused.toolOutput.output), /rejected/);
	assert.ok(!existsSync(join(world.project, "denied.txt")), "Deny kept it unwritten");
});

test("/stop interrupts the running turn", async (t) => {
	const world = await World.create(t);
	await world.wrapper();
	const topic = await world.topic();
	let release;
	world.fake.queue({ hold: new Promise((done) => (release = done)), text: "too late" });
	t.after(() => release?.());
	await world.telegram.injectMessage(topic.thread_id, "a long one");
	await world.fake.next((r) => r.lastUserText.includes("a long one"));
	await world.telegram.injectMessage(topic.thread_id, "/stop");
	await world.shows(/[Ii]nterrupted|Conversation interrupted/, 30_000, "the TUI to show the interrupt");
	release();
	const messages = await world.telegram.messages(topic.thread_id);
	assert.ok(!messages.some((m) => m.plain_text.includes("too late")), "the interrupted turn's answer is not posted");
});

test("Codex's own retries: a stream cut it tries again is no answer; a turn whose every try fails is said once, with the error", async (t) => {
	// One more try of a request and of a stream (Codex's defaults are 4 and 5).
	const world = await World.create(t, { provider: ["request_max_retries = 1", "stream_max_retries = 1"] });
	await world.wrapper();
	const topic = await world.topic();
	const texts = async () => (await world.telegram.messages(topic.thread_id)).map((m) => m.plain_text);
	const before = (await texts()).length;

	world.fake.queue({ cut: "Half an answer that" }, { text: "the real answer" });
	await world.telegram.injectMessage(topic.thread_id, "hello");
	await world.telegram.said(topic.thread_id, (text) => text === "the real answer", { what: "the answer after Codex tried again" });

	const down = { error: { status: 503, message: "still down" } };
	// Two tries of the stream, each of two requests.
	world.fake.queue(down, down, down, down);
	await world.telegram.injectMessage(topic.thread_id, "and now?");
	const said = await world.telegram.said(topic.thread_id, (text) => text.startsWith("⚠️ The turn failed:"), { what: "the failure in the topic" });
	assert.equal(said.plain_text, `⚠️ The turn failed: unexpected status 503 Service Unavailable: still down, url: ${world.fake.url}/v1/responses. No answer came of it.`);
	assert.equal(world.fake.turns.length, 6, "two tries, then four");

	await world.telegram.injectMessage(topic.thread_id, "and again?");
	await world.telegram.said(topic.thread_id, (text) => text === "echo: and again?", { what: "the next turn's answer" });
	// The connected line may land after the topic is seen.
	const all = (await texts()).slice(before).filter((text) => !text.startsWith("🟢"));
	assert.deepEqual(all, ["the real answer", said.plain_text, "echo: and again?"], "the answer once, the failure once, nothing of the tries");
});

test("resume keeps the topic", async (t) => {
	const world = await World.create(t);
	await world.wrapper();
	const topic = await world.topic();
	await world.telegram.injectMessage(topic.thread_id, "first");
	await world.telegram.said(topic.thread_id, (text) => text.includes("echo: first"), { what: "the first answer" });
	// Quit once the TUI is idle too (Ctrl-C during a turn interrupts it).
	await world.shows(/Worked for/, 30_000, "the turn done in the TUI");
	await world.quit();
	assert.equal(await world.exited(), 0);
	await world.wrapper(["resume", "--last"]);
	await world.shows(/echo: first/, 30_000, "the resumed thread");
	await world.telegram.injectMessage(topic.thread_id, "second");
	await world.telegram.said(topic.thread_id, (text) => text.includes("echo: second"), { what: "the resumed session's answer" });
	assert.equal((await world.topic()).thread_id, topic.thread_id, "the same topic");
});

for (const signal of ["SIGINT", "SIGTERM"]) {
	test(`${signal} to the wrapper leaves nothing running`, async (t) => {
		const world = await World.create(t);
		const wrapper = await world.wrapper();
		await world.topic();
		const tree = treeOf(wrapper);
		process.kill(wrapper, signal);
		await world.exited();
		await eventually(() => {
			const { stillThere, servers } = leftOver(world, tree);
			return stillThere.length === 0 && servers.length === 0;
		}, 15_000, "nothing of the wrapper to be running");
	});
}

test("plain codex with the installed hooks: the session gets a topic and its answer", async (t) => {
	const world = await World.create(t);
	const install = await world.exec(SIDECAR, ["install", "codex"]);
	assert.equal(install.code, 0, install.stderr);
	assert.match(install.stdout, /trusts the relay's 3 hooks/);
	const again = await world.exec(SIDECAR, ["install", "codex"]);
	assert.match(again.stdout, /Nothing to change/, "install is idempotent");
	const out = await world.exec(CODEX, ["exec", "--skip-git-repo-check", "hello from the terminal"]);
	assert.equal(out.code, 0, out.stderr);
	const topic = await world.topic();
	await world.telegram.said(topic.thread_id, (text) => text.includes("echo: hello from the terminal"), { what: "the answer, by the Stop hook" });
});

test("a file comes back through the relay's send_file tool; a path outside the project is refused and nothing is sent", async (t) => {
	const world = await World.create(t);
	// The approval policy could ask the phone first about a path outside the project;
	// here the relay's own refusal is the subject.
	await mkdir(join(world.relayHome, "config"), { recursive: true, mode: 0o700 });
	await writeFile(join(world.relayHome, "config", "config.toml"), '[approvals]\nmode = "off"\n', { mode: 0o600 });
	await world.wrapper();
	const topic = await world.topic();
	const report = "line one\nline two\n";
	await writeFile(join(world.project, "report.txt"), report);
	const sendFile = (args) => relaySendFile(t, args);

	world.fake.queue(...sendFile({ path: "report.txt", caption: "the report" }));
	await world.telegram.injectMessage(topic.thread_id, "send me the report");
	const sent = await world.telegram.said(topic.thread_id, (plain) => plain === "the report", { what: "the file in the topic" });
	assert.equal(sent.media.kind, "document");
	assert.equal((await world.telegram.fileContent(sent.media.file_id)).toString("utf8"), report, "Telegram got the file byte for byte");
	const upload = (await world.telegram.calls()).find((c) => c.method === "sendDocument");
	assert.equal(upload.params.document.upload.file_name, "report.txt");
	assert.equal(upload.params.message_thread_id, String(topic.thread_id));
	const answered = await world.fake.next((r) => r.toolOutput && r.lastUserText === "send me the report");
	t.diagnostic(`the model heard: ${JSON.stringify(answered.toolOutput.output)}`);
	assert.match(JSON.stringify(answered.toolOutput.output), /Sent report\.txt to the Telegram topic as a document/);

	world.fake.queue(...sendFile({ path: "/etc/hostname" }));
	await world.telegram.injectMessage(topic.thread_id, "send me the hostname");
	const refused = await world.fake.next((r) => r.toolOutput && r.lastUserText === "send me the hostname");
	t.diagnostic(`the model heard: ${JSON.stringify(refused.toolOutput.output)}`);
	assert.match(JSON.stringify(refused.toolOutput.output), /Not sent: .*\/etc\/hostname is outside/);
	await world.telegram.said(topic.thread_id, (plain) => plain.includes("returned:") && plain.includes("is outside"), { what: "the model's answer naming the refusal" });
	const uploads = (await world.telegram.calls()).filter((c) => c.method === "sendDocument" || c.method === "sendPhoto");
	assert.equal(uploads.length, 1, "only the report was uploaded");
	assert.ok(!readFileSync(join(world.codexHome, "config.toml"), "utf8").includes("agent_relay"), "the server is named on Codex's command line, not in the user's config");
});
