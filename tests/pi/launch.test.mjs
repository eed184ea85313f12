// Sessions the relay launches (docs/DESIGN.md, *Launching*), with the real pi: `/new` in
// the control place starts pi under `agent-relay serve` in a folder under `[launch]
// roots`; its topic appears and the first prompt is answered there; a second message is
// a second turn; `/model` switches (the fake model sees the new name); `/end` closes the
// topic and `/resume` brings it back with its history, the topic saying so. A folder outside the roots, a
// link out of them and a stranger's `/new` start nothing. serve killed with two
// sessions comes back with both in their topics, and nothing typed meanwhile is lost.

import assert from "node:assert/strict";
import { readFileSync, statSync } from "node:fs";
import { mkdir, readdir, readFile, symlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { CHAT_ID, EXTENSION, REPO, USER_ID, World, eventually, isRunning, sidecarsOf } from "./harness.mjs";

const WAIT = 60_000;

/** The control place's message (General topic) whose text satisfies `test`. */
function general(world, test, what) {
	return world.bot.said(null, test, { ms: WAIT, what });
}

/** Telegram HTML as the phone shows it. */
function plain(html) {
	return String(html ?? "")
		.replace(/<[^>]+>/g, "")
		.replace(/&lt;/g, "<")
		.replace(/&gt;/g, ">")
		.replace(/&quot;/g, '"')
		.replace(/&amp;/g, "&");
}

/**
 * The phone's side, in order, as the fake recorded it: what the relay's calls showed
 * and did, with what the user did (`phone`: `{ at, text }`, `at` the number of calls
 * recorded before it) between them.
 */
function transcript(calls, phone) {
	const lines = [];
	let next = 0;
	const where = (p) => (p.message_thread_id ? "topic" : "control");
	calls.forEach((call, index) => {
		while (next < phone.length && phone[next].at <= index) lines.push(`  you: ${phone[next++].text}`);
		if (!call.ok) return;
		const p = call.params ?? {};
		const keys = (p.reply_markup?.inline_keyboard ?? []).flat().map((b) => b.text);
		const shown = keys.length ? ` [${keys.join(" | ")}]` : "";
		switch (call.method) {
			case "sendMessage":
				lines.push(`relay (${where(p)}): ${plain(p.text)}${shown}`);
				break;
			case "editMessageText":
				lines.push(`relay (edits its message ${p.message_id}): ${plain(p.text)}${shown}`);
				break;
			case "createForumTopic":
				lines.push(`relay: (topic “${p.name}” created)`);
				break;
			case "closeForumTopic":
				lines.push("relay: (topic closed)");
				break;
			case "reopenForumTopic":
				lines.push("relay: (topic reopened)");
				break;
			case "answerCallbackQuery":
				if (p.text) lines.push(`relay: (toast) ${p.text}`);
				break;
		}
	});
	while (next < phone.length) lines.push(`  you: ${phone[next++].text}`);
	return lines.join("\n");
}

/**
 * The first prompt to pi alone (no relay, no extension), from its spawn to its
 * answer, in ms: what of the time from `/new` to the first answer is pi's and the
 * model's.
 */
async function piAlone(world, name) {
	const asked = Date.now();
	const pi = await world.startPi(name, { extension: null });
	const turn = pi.mark();
	pi.send({ type: "prompt", message: "hello from the phone" });
	await pi.waitFor((e) => e.type === "agent_end", { ms: WAIT, from: turn, what: "pi's answer without the relay" });
	const ms = Date.now() - asked;
	await pi.close();
	return ms;
}

/** The buttons of a message, flattened: `[{text, callback_data}]`. */
function buttons(message) {
	return (message.reply_markup?.inline_keyboard ?? []).flat();
}

test("/new starts pi in its own topic; turns, /model, /end and /resume keep the topic and the history", async (t) => {
	const world = await World.create(t, { models: ["echo-2"] });
	await mkdir(join(world.work, "api"), { recursive: true });
	await world.serveConfig();
	const serve = await world.startServe();
	// pi alone before and after (the first warms the disk cache for both).
	const bareBefore = await piAlone(world, "bare-before");
	const phone = [];
	// Long polls aside: the transcript places each step among the relay's calls.
	const relayCalls = async () => (await world.bot.calls()).filter((c) => c.method !== "getUpdates");
	const you = async (text) => phone.push({ at: (await relayCalls()).length, text });

	await you("/new api hello from the phone");
	const completionsBefore = world.model.completions.length;
	const asked = Date.now();
	await world.bot.injectMessage(null, "/new api hello from the phone");
	const started = await general(world, (text) => text.includes("started"), "the /new answer");
	assert.match(started.plain_text, /▶ pi started: [A-Z] · api/);
	const topic = await eventually(() => world.topicOf("api"), WAIT, "the launched session's topic");
	const first = await world.bot.said(topic.thread_id, (text) => text === "echo: hello from the phone", {
		ms: WAIT,
		what: "the first prompt's answer in the topic",
	});
	const answered = Date.now();
	const firstCompletion = world.model.completions[completionsBefore].at;
	assert.ok(first);
	const opening = (await world.bot.messages(topic.thread_id))[0];
	assert.match(opening.plain_text, /started from the phone: “hello from the phone”/);
	assert.equal(serve.agents().length, 1, "pi is serve's child");

	await you("a second turn");
	await world.bot.injectMessage(topic.thread_id, "a second turn");
	await world.bot.said(topic.thread_id, (text) => text === "echo: a second turn", { ms: WAIT, what: "the second turn" });
	const second = world.model.completions.at(-1);
	assert.ok(
		second.body.messages.some((m) => JSON.stringify(m.content).includes("hello from the phone")),
		"the second turn carries the first",
	);

	await you("/model");
	await world.bot.injectMessage(topic.thread_id, "/model");
	const list = await world.bot.said(topic.thread_id, (text) => text.startsWith("🧠 Model of pi"), {
		ms: WAIT,
		what: "the model list",
	});
	const other = buttons(list).find((b) => b.text.includes("echo-2"));
	assert.ok(other, `a button for echo-2 among ${JSON.stringify(buttons(list))}`);
	await you(`taps “${other.text}”`);
	await world.bot.tap(topic.thread_id, list.message_id, other.callback_data);
	await world.bot.said(topic.thread_id, (text) => text.includes("Model: fake/echo-2"), { ms: WAIT, what: "the switch" });
	await you("on the other model");
	await world.bot.injectMessage(topic.thread_id, "on the other model");
	await world.bot.said(topic.thread_id, (text) => text === "echo: on the other model", { ms: WAIT, what: "a turn on echo-2" });
	assert.equal(world.model.completions.at(-1).body.model, "echo-2", "the fake model sees the new name");

	await you("/end");
	await world.bot.injectMessage(topic.thread_id, "/end");
	const ended = await world.bot.said(topic.thread_id, (text) => text.startsWith("⏹ Session ended"), {
		ms: WAIT,
		what: "the end in the topic",
	});
	await eventually(async () => (await world.topicOf("api"))?.closed, WAIT, "the topic closed");
	await eventually(() => serve.agents().length === 0, WAIT, "pi gone");

	const resume = buttons(ended).find((b) => b.text.includes("Resume"));
	assert.ok(resume, "the end offers to resume");
	await you(`taps “${resume.text}”`);
	await world.bot.tap(topic.thread_id, ended.message_id, resume.callback_data);
	await eventually(async () => (await world.topicOf("api"))?.closed === false, WAIT, "the topic open again");
	await world.bot.said(topic.thread_id, (text) => text.startsWith("▶ Resumed: pi started again"), {
		ms: WAIT,
		what: "the resume said in the topic",
	});
	await you("after the resume");
	await world.bot.injectMessage(topic.thread_id, "after the resume");
	await world.bot.said(topic.thread_id, (text) => text === "echo: after the resume", { ms: WAIT, what: "a turn after /resume" });
	const resumed = world.model.completions.at(-1);
	const history = JSON.stringify(resumed.body.messages);
	assert.ok(history.includes("hello from the phone") && history.includes("a second turn"), "the history came back");
	assert.equal((await world.bot.topics()).filter((t) => !t.deleted).length, 1, "still the one topic");

	t.diagnostic(`the phone's side:\n${transcript(await relayCalls(), phone)}`);

	const bareAfter = await piAlone(world, "bare-after");
	const bareMs = Math.round((bareBefore + bareAfter) / 2);
	const total = answered - asked;
	t.diagnostic(
		`from /new to the first answer: ${total} ms (to the model's first request ${firstCompletion - asked} ms); ` +
			`pi alone from its spawn to its answer: ${bareMs} ms (${bareBefore} before, ${bareAfter} after); the relay's share: ${total - bareMs} ms`,
	);
});

/** The environment of process `pid` (pi rewrites its command line, not this). */
function envOf(pid) {
	return Object.fromEntries(
		readFileSync(`/proc/${pid}/environ`, "utf8")
			.split("\0")
			.filter(Boolean)
			.map((line) => [line.slice(0, line.indexOf("=")), line.slice(line.indexOf("=") + 1)]),
	);
}

test("/new … pi works with no relay package in pi: serve brings its own extension, and never a second one when pi has the package", async (t) => {
	const world = await World.create(t);
	await mkdir(join(world.work, "api"), { recursive: true });
	await mkdir(join(world.work, "web"), { recursive: true });
	await mkdir(join(world.work, "ops", ".pi"), { recursive: true });
	await world.serveConfig();
	// pi as `npm i -g agent-relay` or `cargo install` leave it: no `-e`, no package
	// in pi's settings, and no AGENT_RELAY_BIN (serve names itself to its agent).
	const config = join(world.relayHome, "config", "config.toml");
	const plainPi = (await readFile(config, "utf8")).replace(`,"-e",${JSON.stringify(EXTENSION)}`, "");
	assert.ok(!plainPi.includes(EXTENSION));
	await world.relayConfig(plainPi);
	const serve = await world.startServe({ env: { AGENT_RELAY_BIN: undefined } });

	await world.bot.injectMessage(null, "/new api hello without the package");
	const api = await eventually(() => world.topicOf("api"), WAIT, "the topic of pi with the relay's own extension");
	await world.bot.said(api.thread_id, (text) => text === "echo: hello without the package", { ms: WAIT, what: "its answer" });
	const [first] = serve.agents();
	// serve brought its extension, and named itself as the binary the extension runs.
	assert.ok(envOf(first).AGENT_RELAY_BIN, "the sidecar is serve's own binary");
	const brought = join(world.relayHome, "state", "pi-extension", "scripts", "pi-extension.ts");
	assert.equal(statSync(brought).mode & 0o777, 0o600);
	assert.equal(statSync(join(world.relayHome, "state", "pi-extension")).mode & 0o777, 0o700);
	assert.equal(sidecarsOf(first).length, 1, "one sidecar");

	// A project's settings name the package, but pi (offline) has none installed and
	// loads nothing: serve sees it in pi's commands and starts it again with its own.
	await writeFile(join(world.work, "ops", ".pi", "settings.json"), JSON.stringify({ packages: ["npm:agent-relay"] }));
	await world.bot.injectMessage(null, "/new ops hello with a package missing");
	const ops = await eventually(() => world.topicOf("ops"), WAIT, "the topic of pi whose package is missing");
	await world.bot.said(ops.thread_id, (text) => text === "echo: hello with a package missing", { ms: WAIT, what: "its answer" });
	const third = serve.agents().find((pid) => pid !== first);
	assert.ok(envOf(third).AGENT_RELAY_BIN, "started again with the relay's own extension");
	const logs = join(world.relayHome, "state", "logs");
	const log = (await readdir(logs)).map((f) => readFileSync(join(logs, f), "utf8")).join("");
	assert.match(log, /loaded no copy of it: starting it again with the relay's own/);
	assert.equal(sidecarsOf(third).length, 1, "one sidecar");

	// With the package installed in pi, pi loads it and serve adds none.
	const installed = await world.piCommand(["install", REPO]);
	assert.equal(installed.code, 0, installed.stderr);
	await world.bot.injectMessage(null, "/new web hello with the package");
	const web = await eventually(() => world.topicOf("web"), WAIT, "the topic of pi with the package");
	await world.bot.said(web.thread_id, (text) => text === "echo: hello with the package", { ms: WAIT, what: "its answer" });
	const second = serve.agents().find((pid) => pid !== first && pid !== third);
	assert.equal(envOf(second).AGENT_RELAY_BIN, undefined, "serve brought nothing: pi has the package");
	await eventually(() => sidecarsOf(second).length === 1, WAIT, "its sidecar");
	await new Promise((done) => setTimeout(done, 1000));
	assert.equal(sidecarsOf(second).length, 1, "one sidecar, never two");
	assert.equal((await world.bot.topics()).filter((t) => !t.deleted).length, 3, "one topic each");
});

test("a folder outside the roots, a link out of them and a stranger's /new start nothing", async (t) => {
	const world = await World.create(t);
	const outside = join(world.root, "elsewhere");
	await mkdir(outside, { recursive: true });
	await mkdir(world.work, { recursive: true });
	await symlink(outside, join(world.work, "escape"));
	await world.serveConfig();
	const serve = await world.startServe();

	await world.bot.injectMessage(null, `/new ${outside} hi`);
	const refused = await general(world, (text) => text.includes("Not done"), "the refusal of a folder outside");
	assert.match(refused.plain_text, /outside \[launch\] roots .*roots in .*config\.toml/);

	await world.bot.injectMessage(null, "/new escape hi");
	await general(world, (text) => text.includes("leads through a link"), "the refusal of a link out of the roots");

	const stranger = USER_ID + 1;
	await world.bot.injectMessage(null, "/new . hi", stranger);
	// The allowed user's next command is answered after the stranger's was handled.
	await world.bot.injectMessage(null, "/sessions");
	await general(world, (text) => text.includes("No agent sessions yet"), "the list after the stranger");
	const all = await world.bot.messages(null);
	assert.ok(!all.some((m) => m.plain_text.includes("Starting")), "nothing started for the stranger");
	assert.equal(serve.agents().length, 0, "no agent runs");
	assert.equal((await world.bot.topics()).filter((t) => !t.deleted).length, 0, "no topic was made");
	assert.equal(world.model.completions.length, 0);
	void CHAT_ID;
});

test("serve killed with two launched sessions comes back with both, and nothing typed meanwhile is lost", async (t) => {
	const world = await World.create(t);
	await mkdir(join(world.work, "one"), { recursive: true });
	await mkdir(join(world.work, "two"), { recursive: true });
	await world.serveConfig();
	const serve = await world.startServe();
	await world.bot.injectMessage(null, "/new one first of one");
	await world.bot.injectMessage(null, "/new two first of two");
	const one = await eventually(() => world.topicOf("one"), WAIT, "topic one");
	const two = await eventually(() => world.topicOf("two"), WAIT, "topic two");
	await world.bot.said(one.thread_id, (text) => text === "echo: first of one", { ms: WAIT, what: "one answers" });
	await world.bot.said(two.thread_id, (text) => text === "echo: first of two", { ms: WAIT, what: "two answers" });
	const pids = serve.agents();
	assert.equal(pids.length, 2);

	serve.child.kill("SIGKILL");
	await serve.exited;
	await eventually(() => pids.every((pid) => !isRunning(pid)), WAIT, "the agents end with serve");
	await world.bot.injectMessage(one.thread_id, "typed while serve was down");

	const again = await world.startServe();
	const back = Date.now();
	await world.bot.said(one.thread_id, (text) => text === "echo: typed while serve was down", {
		ms: WAIT,
		what: "what was typed meanwhile, answered",
	});
	const waitingAnswered = Date.now();
	await world.bot.said(one.thread_id, (text) => text.includes("serve restarted"), { ms: WAIT, what: "topic one told" });
	await world.bot.said(two.thread_id, (text) => text.includes("serve restarted"), { ms: WAIT, what: "topic two told" });
	const bothBack = Date.now();
	await world.bot.injectMessage(two.thread_id, "two goes on");
	await world.bot.said(two.thread_id, (text) => text === "echo: two goes on", { ms: WAIT, what: "two goes on" });
	t.diagnostic(
		`serve back on the bus → the message typed while it was down answered: ${waitingAnswered - back} ms; ` +
			`both sessions back after ${bothBack - back} ms; then a message to its answer: ${Date.now() - bothBack} ms`,
	);
	assert.equal(again.agents().length, 2, "both run under the new serve");
	assert.equal((await world.bot.topics()).filter((t) => !t.deleted).length, 2, "in their own topics");
});

test("a leader failover while a launched session runs changes nothing for it", async (t) => {
	const world = await World.create(t);
	await mkdir(join(world.work, "api"), { recursive: true });
	await world.serveConfig();
	// A keyboard session first: its sidecar leads the bus, serve follows.
	const keyboard = await world.startPi("desk", { env: world.serveEnv() });
	await keyboard.bound();
	const serve = await world.startServe();
	await world.bot.injectMessage(null, "/new api before the failover");
	const topic = await eventually(() => world.topicOf("api"), WAIT, "the launched topic");
	await world.bot.said(topic.thread_id, (text) => text === "echo: before the failover", { ms: WAIT, what: "the first answer" });
	const [agent] = serve.agents();

	const leader = (status) => /leader pid (\d+)/.exec(status)?.[1];
	const before = leader(await world.relayStatus());
	assert.ok(keyboard.sidecars().map(String).includes(before), "the keyboard session's sidecar leads");
	await keyboard.close();
	// The next leader (serve, or the launched pi's sidecar) has every session back.
	await eventually(
		async () => {
			const now = await world.relayStatus();
			return leader(now) && leader(now) !== before && /[A-Z] · api\s+live/.test(now);
		},
		WAIT,
		"a new leader with the launched session live",
	);
	await world.bot.injectMessage(topic.thread_id, "after the failover");
	await world.bot.said(topic.thread_id, (text) => text === "echo: after the failover", { ms: WAIT, what: "an answer after the failover" });
	assert.deepEqual(serve.agents(), [agent], "the same pi, still serve's child");
	assert.ok(isRunning(agent));
	const notices = (await world.bot.messages(topic.thread_id)).filter((m) => /ended|stopped|restarted|Starting this session/.test(m.plain_text));
	assert.deepEqual(notices, [], "the launch was neither ended nor started again");
});

test("a scheduled prompt fires into its topic, and /schedules lists and cancels it", async (t) => {
	const world = await World.create(t);
	await mkdir(join(world.work, "api"), { recursive: true });
	await world.serveConfig();
	await world.startServe();
	await world.bot.injectMessage(null, "/new api set up");
	const topic = await eventually(() => world.topicOf("api"), WAIT, "the launched topic");
	await world.bot.said(topic.thread_id, (text) => text === "echo: set up", { ms: WAIT, what: "the first answer" });

	await world.bot.injectMessage(topic.thread_id, "/every 5s check the queue");
	await world.bot.said(topic.thread_id, (text) => text.startsWith("⏰ #1 scheduled"), { ms: WAIT, what: "the schedule made" });
	await world.bot.said(topic.thread_id, (text) => text === "echo: check the queue", { ms: WAIT, what: "the scheduled prompt answered" });
	await world.bot.injectMessage(topic.thread_id, "/schedules");
	const list = await world.bot.said(topic.thread_id, (text) => text.startsWith("Scheduled prompts"), { ms: WAIT, what: "the list" });
	assert.match(list.plain_text, /#1 every 5s — “check the queue”/);
	const cancel = buttons(list).find((b) => b.text === "✖ #1");
	await world.bot.tap(topic.thread_id, list.message_id, cancel.callback_data);
	await eventually(
		async () => (await world.bot.message(list.message_id)).plain_text?.startsWith("No prompts are scheduled"),
		WAIT,
		"the list shows it cancelled",
	);
	const fired = world.model.prompts.filter((p) => p === "check the queue").length;
	await new Promise((done) => setTimeout(done, 6_000));
	assert.equal(world.model.prompts.filter((p) => p === "check the queue").length, fired, "no firing after the cancel");
});

test("an idle session ends and the next message starts it again; a crash is told with a resume button", async (t) => {
	const world = await World.create(t);
	await mkdir(join(world.work, "api"), { recursive: true });
	// 0.001 h: 3.6 s without a turn.
	await world.serveConfig({ extra: "" });
	await world.relayConfig(
		(await import("node:fs")).readFileSync(join(world.relayHome, "config", "config.toml"), "utf8").replace("[launch]\n", "[launch]\nidle_end_hours = 0.001\n"),
	);
	const serve = await world.startServe();
	await world.bot.injectMessage(null, "/new api first");
	const topic = await eventually(() => world.topicOf("api"), WAIT, "the launched topic");
	await world.bot.said(topic.thread_id, (text) => text === "echo: first", { ms: WAIT, what: "the first answer" });
	await world.bot.said(topic.thread_id, (text) => text.startsWith("💤 Ended after"), { ms: WAIT, what: "the idle end" });
	await eventually(() => serve.agents().length === 0, WAIT, "pi ended");
	await world.bot.injectMessage(topic.thread_id, "wake up");
	await world.bot.said(topic.thread_id, (text) => text.startsWith("▶ Starting this session again"), { ms: WAIT, what: "the resume said" });
	await world.bot.said(topic.thread_id, (text) => text === "echo: wake up", { ms: WAIT, what: "the message answered after the resume" });

	const [agent] = serve.agents();
	process.kill(agent, "SIGKILL");
	const crashed = await world.bot.said(topic.thread_id, (text) => text.startsWith("⚠️ pi stopped by itself"), {
		ms: WAIT,
		what: "the crash told",
	});
	assert.match(crashed.plain_text, /signal 9/);
	assert.ok(buttons(crashed).some((b) => b.text.includes("Resume")), "with a resume button");
});

test("/stop in a launched session aborts the running turn, the topic says so, and the next message is a turn", async (t) => {
	const world = await World.create(t);
	await mkdir(join(world.work, "api"), { recursive: true });
	await world.serveConfig();
	const serve = await world.startServe();
	await world.bot.injectMessage(null, "/new api first");
	const topic = await eventually(() => world.topicOf("api"), WAIT, "the launched topic");
	await world.bot.said(topic.thread_id, (text) => text === "echo: first", { ms: WAIT, what: "the first answer" });
	const [agent] = serve.agents();

	// `[[hang]]`: the fake model streams a word and holds the turn open.
	await world.bot.injectMessage(topic.thread_id, "think it over [[hang]]");
	const held = await eventually(
		() => world.model.completions.find((r) => r.lastUserText.includes("[[hang]]")),
		WAIT,
		"the turn the model holds open",
	);
	await world.bot.injectMessage(topic.thread_id, "/stop");
	await world.bot.said(topic.thread_id, (text) => text === "⏹ Stopped.", { ms: WAIT, what: "the stop said in the topic" });
	await eventually(() => held.aborted, WAIT, "pi closed the model's stream");

	await world.bot.injectMessage(topic.thread_id, "after the stop");
	await world.bot.said(topic.thread_id, (text) => text === "echo: after the stop", { ms: WAIT, what: "a normal turn after /stop" });
	assert.deepEqual(serve.agents(), [agent], "the same pi: /stop ends the turn, not the session");
	const notices = (await world.bot.messages(topic.thread_id)).filter((m) => /Could not stop|ended|stopped by itself/.test(m.plain_text));
	assert.deepEqual(notices, [], "no failure or end said");
});
